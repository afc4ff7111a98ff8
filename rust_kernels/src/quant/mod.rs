//! GGUF weight formats: block layouts, dequantization, activation quantizers and dot products.
//!
//! Each weight type has a `vec_dot` that takes one weight row (raw GGUF bytes) and one activation row
//! already converted to the type's activation format (as llama.cpp does: Q8_0 for Q4_0/Q5_0/Q8_0,
//! Q8_1 for Q4_1/Q5_1, Q8_K for K-quants, F16/BF16 rounding for half-float weights). The reduction
//! order of a row's dot product never depends on the batch, which keeps results batch-invariant.

pub mod act;
#[cfg(target_arch = "x86_64")]
mod act_avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
pub mod blocks;
pub mod float;
#[cfg(target_arch = "x86_64")]
mod int_dots;
#[cfg(target_arch = "x86_64")]
mod kquant_dots;
#[cfg(target_arch = "x86_64")]
mod kquant_wide;
pub mod kquants;
pub mod legacy;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::simd;
pub use act::{ActRows, Activations, RowSlices};

/// ggml type ids as stored in GGUF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    BF16,
}

/// The format activations are converted to before the dot product with a weight type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    F32,
    F16,
    BF16,
    Q8_0,
    Q8_1,
    Q8K,
}

impl GgmlType {
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::BF16,
            _ => return None,
        })
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }

    pub fn row_bytes(self, n: usize) -> usize {
        n / self.block_len() * self.block_bytes()
    }

    pub fn act_format(self) -> ActFormat {
        match self {
            Self::F32 => ActFormat::F32,
            Self::F16 => ActFormat::F16,
            Self::BF16 => ActFormat::BF16,
            Self::Q4_0 | Self::Q5_0 | Self::Q8_0 => ActFormat::Q8_0,
            Self::Q4_1 | Self::Q5_1 => ActFormat::Q8_1,
            Self::Q4K | Self::Q5K | Self::Q6K => ActFormat::Q8K,
        }
    }
}

#[inline]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Dequantize one row of `n` elements.
pub fn dequantize_row(t: GgmlType, row: &[u8], out: &mut [f32]) {
    match t {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => float::dequantize(t, row, out),
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
            legacy::dequantize(t, row, out)
        }
        GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => kquants::dequantize(t, row, out),
    }
}

/// Dot product of one weight row with activation row `r` of `acts` (already in `t.act_format()`).
#[inline]
pub fn vec_dot(t: GgmlType, w: &[u8], acts: &Activations, r: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::use_avx2() {
        return vec_dot_act_rows::<1>(t, w, &acts.rows::<1>(r))[0];
    }
    vec_dot_scalar(t, w, acts, r)
}

/// One weight row against activation rows resolved once (`Activations::rows`), for the many weight
/// rows that meet one window of activation rows (a decode step or part of a prompt); bit-identical
/// to R calls of `vec_dot`.
#[inline]
pub fn vec_dot_act_rows<const R: usize>(t: GgmlType, w: &[u8], ys: &ActRows<R>) -> [f32; R] {
    // One look at the path per weight row (this runs for every row of every matmul).
    #[cfg(target_arch = "x86_64")]
    match simd::path() {
        // SAFETY: the path is Vnni only when run-time detection found every feature the VNNI
        // form enables. The quantized kernels assert that `w` covers the activation rows' blocks;
        // the float ones read `w` for the activation row's length, which callers keep equal (a
        // weight row of `cols` values against activation rows of `cols`).
        simd::Path::Vnni => return unsafe { avx2::vec_dot_act_rows_vnni::<R>(t, w, &ys.rows) },
        // SAFETY: the path is Avx2 only when run-time detection found AVX2, FMA and F16C; lengths
        // as above.
        simd::Path::Avx2 => return unsafe { avx2::vec_dot_act_rows::<R>(t, w, &ys.rows) },
        simd::Path::Scalar => {}
    }
    std::array::from_fn(|i| vec_dot_scalar(t, w, ys.acts, ys.r0 + i))
}

/// `vec_dot_act_rows` for the `out.len()` weight rows from row `n0` of `data` (rows `rb` bytes
/// apart) in one call, where a kernel has a form for a run of rows (the biased VNNI ones, 3+
/// activation rows): `out[j]` = row `n0 + j`'s dots, same bits, and true. False, having done
/// nothing, elsewhere. With `ahead`, each row read also prefetches the bytes that far past it.
pub fn vec_dot_act_rows_run<const R: usize>(
    t: GgmlType,
    data: &[u8],
    rb: usize,
    n0: usize,
    ahead: Option<usize>,
    ys: &ActRows<R>,
    out: &mut [[f32; R]],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd::path() == simd::Path::Vnni {
        let rows = RowRun {
            data,
            rb,
            n0,
            ahead,
        };
        // SAFETY: as in `vec_dot_act_rows`; the run kernels read rows through `RowRun::row`
        // (checked slices).
        return unsafe { avx2::act_rows_run_vnni::<R>(t, &rows, &ys.rows, out) };
    }
    let _ = (t, data, rb, n0, ahead, ys, out);
    false
}

/// Whether `vec_dot_act_rows_run` has a kernel for weight type `t` against a window of `rows`
/// activation rows (its first register block then reads runs of weight rows).
pub fn has_row_runs(t: GgmlType, rows: usize) -> bool {
    simd::use_vnni()
        && rows >= act::BIASED_MIN_ROWS
        && matches!(t, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0)
}

/// Weight rows `n0..` of `data`, `rb` bytes apart, `ahead` bytes prefetched past each one read
/// (see `vec_dot_act_rows_run`).
pub(crate) struct RowRun<'a> {
    data: &'a [u8],
    rb: usize,
    n0: usize,
    ahead: Option<usize>,
}

impl RowRun<'_> {
    /// Row `n0 + j` (its `rb` bytes), after asking for the bytes `ahead` past it.
    #[inline(always)]
    pub(crate) fn row(&self, j: usize) -> &[u8] {
        let at = (self.n0 + j) * self.rb;
        if let Some(a) = self.ahead {
            simd::prefetch(self.data, at + a, self.rb);
        }
        &self.data[at..at + self.rb]
    }
}

/// The portable reference path (also the one used on CPUs without AVX2).
pub fn vec_dot_scalar(t: GgmlType, w: &[u8], acts: &Activations, r: usize) -> f32 {
    match (t, acts) {
        (GgmlType::F32 | GgmlType::F16 | GgmlType::BF16, _) => float::vec_dot(t, w, acts, r),
        (GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0, Activations::Q8_0 { .. }) => {
            legacy::vec_dot_q8_0(t, w, acts.q8_0_row(r))
        }
        (GgmlType::Q4_1 | GgmlType::Q5_1, Activations::Q8_1 { .. }) => {
            legacy::vec_dot_q8_1(t, w, acts.q8_1_row(r))
        }
        (GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K, Activations::Q8K { .. }) => {
            kquants::vec_dot(t, w, acts.q8k_row(r))
        }
        _ => panic!("activation format does not match weight type {t:?}"),
    }
}
