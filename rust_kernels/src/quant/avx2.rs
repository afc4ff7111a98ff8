//! AVX2 + FMA + F16C dot products for every weight type: the float formats here, the integer
//! quants in `int_dots` and `kquant_dots` (also compiled for AVX-512 VNNI). Each output's
//! operation order depends only on the row length, never on the batch.

use super::act::RowSlices;
use super::int_dots as int;
use super::kquant_dots as kq;
use super::x86::hsum_ps;
use super::{GgmlType, RowRun};
use std::arch::x86_64::*;

/// One weight row against activation rows already resolved to slices (`Activations::rows`),
/// bit-identical to R calls of `vec_dot`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_act_rows<const R: usize>(
    t: GgmlType,
    w: &[u8],
    ys: &RowSlices<R>,
) -> [f32; R] {
    act_rows::<R, false>(t, w, ys)
}

/// `vec_dot_act_rows` with the integer kernels' AVX-512 VNNI form (same bits).
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C, AVX-512 F/BW/VL and AVX-512 VNNI (`simd::use_vnni`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn vec_dot_act_rows_vnni<const R: usize>(
    t: GgmlType,
    w: &[u8],
    ys: &RowSlices<R>,
) -> [f32; R] {
    act_rows::<R, true>(t, w, ys)
}

/// `vec_dot_act_rows_vnni` over a run of weight rows in one call, where a kernel has such a form
/// (the biased VNNI forms of Q8_0, Q4_0 and Q5_0, 3+ activation rows); returns false, having done
/// nothing, elsewhere.
///
/// # Safety
/// As `vec_dot_act_rows_vnni`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn act_rows_run_vnni<const R: usize>(
    t: GgmlType,
    rows: &RowRun,
    ys: &RowSlices<R>,
    out: &mut [[f32; R]],
) -> bool {
    match (t, ys) {
        (GgmlType::Q8_0, RowSlices::Q8_0(ys, Some(us))) => {
            int::q8_0_biased_run(rows, *ys, *us, out)
        }
        (GgmlType::Q4_0, RowSlices::Q8_0(ys, Some(us))) => {
            int::q4_0_biased_run(rows, *ys, *us, out)
        }
        (GgmlType::Q5_0, RowSlices::Q8_0(ys, Some(us))) => {
            int::q5_0_biased_run(rows, *ys, *us, out)
        }
        _ => return false,
    }
    true
}

#[inline(always)]
unsafe fn act_rows<const R: usize, const VNNI: bool>(
    t: GgmlType,
    w: &[u8],
    ys: &RowSlices<R>,
) -> [f32; R] {
    match (t, ys) {
        (GgmlType::F32, RowSlices::F32(a)) => a.map(|a| dot_f32(w, a)),
        (GgmlType::F16, RowSlices::F16(a)) => a.map(|a| dot_f16(w, a)),
        (GgmlType::BF16, RowSlices::BF16(a)) => a.map(|a| dot_bf16(w, a)),
        (GgmlType::Q8_0, RowSlices::Q8_0(ys, u)) if R == 1 => int::dot_q8_0::<R, VNNI>(w, *ys, *u),
        (GgmlType::Q8_0, RowSlices::Q8_0(ys, u)) => int::dot_q8_0_rows::<R, VNNI>(w, (*ys, *u)),
        (GgmlType::Q4_0, RowSlices::Q8_0(ys, u)) => int::dot_q4_0::<R, VNNI>(w, *ys, *u),
        (GgmlType::Q5_0, RowSlices::Q8_0(ys, u)) => int::dot_q5_0::<R, VNNI>(w, *ys, *u),
        (GgmlType::Q4_1, RowSlices::Q8_1(ys)) => int::dot_q4_1::<R, VNNI>(w, *ys),
        (GgmlType::Q5_1, RowSlices::Q8_1(ys)) => int::dot_q5_1::<R, VNNI>(w, *ys),
        (GgmlType::Q4K, RowSlices::Q8K(ys)) => kq::dot_q4k_rows::<R, VNNI>(w, *ys),
        (GgmlType::Q5K, RowSlices::Q8K(ys)) => kq::dot_q5k_rows::<R, VNNI>(w, *ys),
        (GgmlType::Q6K, RowSlices::Q8K(ys)) => kq::dot_q6k_rows::<R, VNNI>(w, *ys),
        _ => panic!("activation format does not match weight type {t:?}"),
    }
}

/// ggml's `GGML_F32x8_REDUCE` of four 8-lane accumulators: (a0+a2) + (a1+a3), then the two
/// 128-bit halves, then two `hadd`s: ((l0+l1) + (l2+l3)) with l = low + high half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reduce_f32x8x4(acc: [__m256; 4]) -> f32 {
    let x = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps::<1>(x));
    let t1 = _mm_hadd_ps(t0, t0);
    _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
}

/// Four 8-lane FMA accumulators over the 32-element steps of `ggml_vec_dot_f32`/`_f16` (AVX2),
/// reduced as ggml does; returns the sum and where the tail starts.
macro_rules! dot_float_body {
    ($wt:ty, $at:ty, $w:ident, $a:ident, |$p:ident| $load_w:expr, |$q:ident| $load_a:expr) => {{
        let n = $a.len();
        let wp = $w.as_ptr() as *const $wt;
        let mut acc = [_mm256_setzero_ps(); 4];
        let steps = n / 32;
        for s in 0..steps {
            for (k, accum) in acc.iter_mut().enumerate() {
                let off = 32 * s + 8 * k;
                let $p = wp.add(off);
                let $q = $a.as_ptr().add(off);
                *accum = _mm256_fmadd_ps($load_w, $load_a, *accum);
            }
        }
        (reduce_f32x8x4(acc), 32 * steps, wp)
    }};
}

/// F32 rows as ggml's `ggml_vec_dot_f32` (AVX2): the reduced sum is a float, and GCC compiles
/// its tail loop (`sumf += x[i]*y[i]`) as groups of four rounded products added in order, then
/// fused multiply-adds for the last `n % 4` elements.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f32(w: &[u8], a: &[f32]) -> f32 {
    let n = a.len();
    let (mut sum, tail, wp) =
        dot_float_body!(f32, f32, w, a, |p| _mm256_loadu_ps(p), |q| _mm256_loadu_ps(
            q
        ));
    let fused = tail + (n - tail) / 4 * 4;
    for (i, &av) in a.iter().enumerate().take(fused).skip(tail) {
        sum += std::ptr::read_unaligned(wp.add(i)) * av;
    }
    for (i, &av) in a.iter().enumerate().skip(fused) {
        sum = std::ptr::read_unaligned(wp.add(i)).mul_add(av, sum);
    }
    sum
}

/// F16 rows as ggml's `ggml_vec_dot_f16` (AVX2): the reduced sum and the tail's products
/// (exact in f32) accumulated in f64 (ggml_float).
macro_rules! dot_float {
    ($name:ident, $wt:ty, $at:ty, |$p:ident| $load_w:expr, |$q:ident| $load_a:expr, $scalar_w:expr, $scalar_a:expr) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(w: &[u8], a: &[$at]) -> f32 {
            let (reduced, tail, wp) = dot_float_body!($wt, $at, w, a, |$p| $load_w, |$q| $load_a);
            let mut sum = reduced as f64;
            for i in tail..a.len() {
                let wv: $wt = std::ptr::read_unaligned(wp.add(i));
                sum += ($scalar_w(wv) * $scalar_a(a[i])) as f64;
            }
            sum as f32
        }
    };
}

/// BF16 rows as ggml's `ggml_vec_dot_bf16` (AVX2): four 8-lane accumulators over 32-element
/// steps (its `add(mul(x, y), c)`, which GCC contracts to an FMA), (c1+c3) + (c2+c4), `hsum_ps`,
/// the tail's f32 products added in f64.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_bf16(w: &[u8], a: &[u16]) -> f32 {
    let n = a.len();
    let wp = w.as_ptr() as *const u16;
    let mut acc = [_mm256_setzero_ps(); 4];
    let steps = n / 32;
    for s in 0..steps {
        for (k, accum) in acc.iter_mut().enumerate() {
            let off = 32 * s + 8 * k;
            *accum = _mm256_fmadd_ps(
                load_bf16x8(wp.add(off)),
                load_bf16x8(a.as_ptr().add(off)),
                *accum,
            );
        }
    }
    let c = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let mut sum = hsum_ps(c) as f64;
    for (i, &av) in a.iter().enumerate().skip(32 * steps) {
        let wv: u16 = std::ptr::read_unaligned(wp.add(i));
        sum += (bf16_bits_to_f32(wv) * bf16_bits_to_f32(av)) as f64;
    }
    sum as f32
}

/// Eight f16 values at `p` as f32 lanes (F16C).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load_f16x8(p: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_bf16x8(p: *const u16) -> __m256 {
    let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
}

fn f16_bits_to_f32(v: u16) -> f32 {
    half::f16::from_bits(v).to_f32()
}

fn bf16_bits_to_f32(v: u16) -> f32 {
    half::bf16::from_bits(v).to_f32()
}

dot_float!(
    dot_f16,
    u16,
    u16,
    |p| load_f16x8(p),
    |q| load_f16x8(q),
    f16_bits_to_f32,
    f16_bits_to_f32
);
