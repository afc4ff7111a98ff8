//! Row-wise operations with llama.cpp's CPU numerics: RMSNorm, RoPE, GELU (fp16 table), SiLU,
//! gated units, softmax and embedding lookup. All are per row, so batch-invariant.

use crate::quant::{dequantize_row, GgmlType};
use half::f16;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Rows whose sums of squares `rms_norm` runs together on the scalar path (and for the rows the
/// AVX2 path's groups of 8 leave over).
const NORM_ROWS: usize = 4;

/// ggml's sum of squares of each of `G` equal-length rows: squared in f32, summed in f64 one
/// element after another, a chain of dependent adds per row. The `G` chains advance together
/// (each in its own order, so the same sums), so that they overlap.
#[inline(always)]
fn sums_of_squares<const G: usize>(rows: [&[f32]; G]) -> [f64; G] {
    let n = rows[0].len();
    // equal lengths, stated: the loop below then indexes without checks
    assert!(rows.iter().all(|r| r.len() == n));
    let mut acc = [0.0f64; G];
    for i in 0..n {
        for (a, r) in acc.iter_mut().zip(&rows) {
            let v = r[i];
            *a += (v * v) as f64;
        }
    }
    acc
}

/// `out = x / sqrt(mean(x²) + eps) [* w]` per row of `n`, with ggml's rounding steps.
pub fn rms_norm(x: &[f32], n: usize, w: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    if n == 0 {
        return;
    }
    let mut sums = Vec::with_capacity(x.len() / n);
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        for g in x.chunks_exact(n * 8) {
            let rows = std::array::from_fn(|r| &g[r * n..(r + 1) * n]);
            // SAFETY: use_avx2() reports AVX2 (and FMA, F16C), detected at run time; the 8 rows
            // are n long each, as `sums_of_squares8` asserts before its pointer loads.
            sums.extend(unsafe { avx2::sums_of_squares8(rows) });
        }
    }
    let mut groups = x[sums.len() * n..].chunks_exact(n * NORM_ROWS);
    for g in &mut groups {
        sums.extend(sums_of_squares::<NORM_ROWS>(std::array::from_fn(|r| {
            &g[r * n..(r + 1) * n]
        })));
    }
    for row in groups.remainder().chunks_exact(n) {
        sums.extend(sums_of_squares([row]));
    }
    for ((row, o), &sum) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)).zip(&sums) {
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        match w {
            Some(w) => {
                for ((y, &v), &g) in o.iter_mut().zip(row).zip(w) {
                    *y = (v * scale) * g;
                }
            }
            None => {
                for (y, &v) in o.iter_mut().zip(row) {
                    *y = v * scale;
                }
            }
        }
    }
}

/// `rope_angles` remembered: a decode step rotates the same few positions with the same settings
/// in every layer (Gemma 3 270M: 36 calls a step), and the cosines and sines cost more than the
/// rotation. A small map, emptied when full.
fn rope_angles_cached(pos: f32, n_rot: usize, base: f32, freq_scale: f32) -> Arc<Vec<(f32, f32)>> {
    type Key = (u32, usize, u32, u32);
    type Angles = Arc<Vec<(f32, f32)>>;
    static CACHE: OnceLock<Mutex<HashMap<Key, Angles>>> = OnceLock::new();
    const MAX_ENTRIES: usize = 256;
    let key = (pos.to_bits(), n_rot, base.to_bits(), freq_scale.to_bits());
    let cache = CACHE.get_or_init(Default::default);
    if let Some(a) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return a.clone();
    }
    let angles = Arc::new(rope_angles(pos, n_rot, base, freq_scale));
    let mut map = cache.lock().unwrap_or_else(|e| e.into_inner());
    if map.len() >= MAX_ENTRIES {
        map.clear();
    }
    map.insert(key, angles.clone());
    angles
}

/// The angle per rotated pair for one position: `p * freq_scale * base^(-2i/n_rot)`, built by
/// repeated multiplication in f32 exactly like ggml's rope cache.
pub(crate) fn rope_angles(pos: f32, n_rot: usize, base: f32, freq_scale: f32) -> Vec<(f32, f32)> {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos;
    (0..n_rot / 2)
        .map(|_| {
            let t = freq_scale * theta;
            theta *= theta_scale;
            (t.cos(), t.sin())
        })
        .collect()
}

/// Rotary embedding settings of one layer.
#[derive(Clone, Copy, Debug)]
pub struct Rope {
    pub n_rot: usize,
    pub base: f32,
    pub freq_scale: f32,
    /// pairs `(i, i + n_rot/2)` (NEOX) instead of adjacent pairs `(2i, 2i+1)`
    pub neox: bool,
}

/// Rotary embedding in place on `x` = rows of `n_head * head_dim`, one position per row.
/// Dims past `n_rot` pass through.
pub fn rope(x: &mut [f32], n_head: usize, head_dim: usize, positions: &[i32], r: Rope) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: use_avx2() reports AVX2 and FMA, detected at run time; `rope_rows` itself only
        // indexes slices (checked).
        return unsafe { avx2::rope(x, n_head, head_dim, positions, r) };
    }
    rope_rows(x, n_head, head_dim, positions, r)
}

/// `rope`'s body. Its `mul_add`s are one instruction where the caller enables FMA (`avx2::rope`)
/// and a call to compiler-builtins' `fmaf` where not (the wheel targets baseline x86-64): the same
/// values in ~10x the time.
#[inline(always)]
fn rope_rows(x: &mut [f32], n_head: usize, head_dim: usize, positions: &[i32], r: Rope) {
    let (half, neox) = (r.n_rot / 2, r.neox);
    for (row, &p) in x.chunks_exact_mut(n_head * head_dim).zip(positions) {
        let angles = rope_angles_cached(p as f32, r.n_rot, r.base, r.freq_scale);
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in angles.iter().enumerate() {
                let (a, b) = if neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                // The fused forms GCC emits for ggml's `x0*cos - x1*sin` / `x0*sin + x1*cos`
                // (-ffp-contract=fast with FMA): matching them keeps K/V f16-identical to llama.cpp.
                head[a] = x0.mul_add(c, -(x1 * s));
                head[b] = x0.mul_add(s, x1 * c);
            }
        }
    }
}

fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    // `1 + A*x*x` fused as GCC compiles ggml's table initialiser (-ffp-contract=fast).
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// ggml's CPU GELU: a 65536-entry table of f16(gelu(f)) indexed by the input rounded to f16.
pub(crate) fn gelu_table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| f16::from_f32(gelu_tanh(f16::from_bits(b).to_f32())).to_f32())
            .collect()
    })
}

#[inline]
pub fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        gelu_table()[f16::from_f32(x).to_bits() as usize]
    }
}

/// SiLU as ggml's vectorised CPU path computes it: `x / (1 + exp(-x))` with ggml's exp.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + crate::simd_math::expf_ggml(-x))
}

#[inline(always)]
fn swiglu_body(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

#[inline(always)]
fn silu_body(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = silu(v);
    }
}

/// `silu` eight lanes at a time with `simd_math::expf8` (ggml's `ggml_v_expf` as AVX2 intrinsics),
/// the same operations per lane as the scalar function, so the same bits.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use crate::simd_math::expf8;
    use std::arch::x86_64::*;

    /// `sums_of_squares` of 8 equal-length rows with the same operations per row: squares of 4
    /// elements of each row (f32 products), transposed so that a 4-lane f64 register holds 4 rows'
    /// sums, each lane adding its row's squares in element order. (The scalar form kept its
    /// accumulators in memory: a store-to-load round trip in every chain step.)
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sums_of_squares8(rows: [&[f32]; 8]) -> [f64; 8] {
        let n = rows[0].len();
        assert!(rows.iter().all(|r| r.len() == n));
        let n4 = n & !3;
        let mut acc = [_mm256_setzero_pd(); 2];
        for i in (0..n4).step_by(4) {
            for (h, a) in acc.iter_mut().enumerate() {
                let sq = |r: usize| {
                    let v = _mm_loadu_ps(rows[4 * h + r].as_ptr().add(i));
                    _mm_mul_ps(v, v)
                };
                let (r0, r1, r2, r3) = (sq(0), sq(1), sq(2), sq(3));
                // 4x4 transpose: column c holds element i + c of the four rows
                let (t0, t1) = (_mm_unpacklo_ps(r0, r1), _mm_unpackhi_ps(r0, r1));
                let (t2, t3) = (_mm_unpacklo_ps(r2, r3), _mm_unpackhi_ps(r2, r3));
                let cols = [
                    _mm_movelh_ps(t0, t2),
                    _mm_movehl_ps(t2, t0),
                    _mm_movelh_ps(t1, t3),
                    _mm_movehl_ps(t3, t1),
                ];
                for c in cols {
                    *a = _mm256_add_pd(*a, _mm256_cvtps_pd(c));
                }
            }
        }
        let mut out = [0.0f64; 8];
        _mm256_storeu_pd(out.as_mut_ptr(), acc[0]);
        _mm256_storeu_pd(out.as_mut_ptr().add(4), acc[1]);
        for (o, r) in out.iter_mut().zip(&rows) {
            for &v in &r[n4..] {
                *o += (v * v) as f64;
            }
        }
        out
    }

    /// `ops::silu` per lane.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu8(x: __m256) -> __m256 {
        let neg = _mm256_xor_ps(x, _mm256_set1_ps(-0.0));
        _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), expf8(neg)))
    }

    /// `out = silu(x)`; `out` may be `x` itself (raw pointers, `n` elements each).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn silu_ptr(x: *const f32, out: *mut f32, n: usize) {
        let n8 = n & !7;
        for i in (0..n8).step_by(8) {
            _mm256_storeu_ps(out.add(i), silu8(_mm256_loadu_ps(x.add(i))));
        }
        for i in n8..n {
            *out.add(i) = super::silu(*x.add(i));
        }
    }

    /// `super::rope_rows` with FMA enabled.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rope(x: &mut [f32], n_head: usize, head_dim: usize, pos: &[i32], r: super::Rope) {
        super::rope_rows(x, n_head, head_dim, pos, r)
    }

    /// `gelu` per lane: the input rounded to f16 (F16C, to nearest even, as `half`) indexes the
    /// table; `x <= -10` gives 0 and `x >= 10` gives x.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn geglu(gate: &[f32], up: &[f32], out: &mut [f32], table: &[f32]) {
        assert_eq!(table.len(), 1 << 16);
        let n = out.len().min(gate.len()).min(up.len());
        let n8 = n & !7;
        let (g, u, o, t) = (gate.as_ptr(), up.as_ptr(), out.as_mut_ptr(), table.as_ptr());
        let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
        for i in (0..n8).step_by(8) {
            let x = _mm256_loadu_ps(g.add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            let idx = _mm256_cvtepu16_epi32(h);
            let v = _mm256_i32gather_ps::<4>(t, idx);
            let v = _mm256_blendv_ps(v, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
            let v = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), v);
            _mm256_storeu_ps(o.add(i), _mm256_mul_ps(v, _mm256_loadu_ps(u.add(i))));
        }
        super::gated(&gate[n8..n], &up[n8..n], super::gelu, &mut out[n8..n]);
    }

    /// `super::store_f16` 8 values at a time; returns how many it converted (a multiple of 8).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn store_f16(src: &[f32], dst: &mut [u16]) -> usize {
        let n8 = src.len().min(dst.len()) & !7;
        for i in (0..n8).step_by(8) {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
        }
        n8
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len().min(gate.len()).min(up.len());
        let n8 = n & !7;
        let (g, u, o) = (gate.as_ptr(), up.as_ptr(), out.as_mut_ptr());
        for i in (0..n8).step_by(8) {
            let s = silu8(_mm256_loadu_ps(g.add(i)));
            _mm256_storeu_ps(o.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.add(i))));
        }
        super::swiglu_body(&gate[n8..n], &up[n8..n], &mut out[n8..n]);
    }
}

/// `src` rounded to f16 (to nearest even, as llama.cpp's F16C conversion and numpy's `astype`)
/// into `dst` as bits: a KV cache write without numpy's per-element cast.
pub fn store_f16(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: use_avx2() is true only when the CPU has AVX2, FMA and F16C (run-time
        // detection); the 8-lane loads and stores stop at the shorter slice's `len & !7`.
        done = unsafe { avx2::store_f16(src, dst) };
    }
    for (d, &x) in dst[done..].iter_mut().zip(&src[done..]) {
        *d = half::f16::from_f32(x).to_bits();
    }
}

// ggml's exp uses fused multiply-adds; with FMA (and AVX2) they are single instructions instead
// of libm `fmaf` calls (same results, far faster).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_fma(gate: &[f32], up: &[f32], out: &mut [f32]) {
    avx2::swiglu(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_fma(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    avx2::silu_ptr(x.as_ptr(), out.as_mut_ptr(), n)
}

/// `x = silu(x)` in place.
pub fn silu_in_place(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        let p = x.as_mut_ptr();
        // SAFETY: use_avx2() reports AVX2 and FMA, detected at run time; input and output are the
        // same n elements, which bound the pointer loads and stores.
        return unsafe { avx2::silu_ptr(p, p, x.len()) };
    }
    for v in x.iter_mut() {
        *v = silu(*v);
    }
}

/// `out = silu(gate) * up` (SwiGLU).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: use_avx2() reports AVX2 and FMA, detected at run time; the pointer loads and
        // stores stop at the shortest slice's `len & !7`.
        return unsafe { swiglu_fma(gate, up, out) };
    }
    swiglu_body(gate, up, out)
}

/// `out = silu(x)` elementwise.
pub fn silu_slice(x: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: as in `swiglu`: AVX2 and FMA detected; `silu_fma` passes the shorter length.
        return unsafe { silu_fma(x, out) };
    }
    silu_body(x, out)
}

/// `out = act(gate) * up`, elementwise (GEGLU with `gelu`).
pub fn gated(gate: &[f32], up: &[f32], act: fn(f32) -> f32, out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = act(g) * u;
    }
}

/// `out = gelu(gate) * up` (GEGLU): `gated` with `gelu`, eight lanes at a time with AVX2/F16C.
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: use_avx2() reports AVX2, FMA and F16C, detected at run time; the loads stop at
        // the shortest slice's `len & !7`, and the table (asserted 2^16 long) has an entry for
        // every f16 bit pattern that indexes it.
        return unsafe { avx2::geglu(gate, up, out, gelu_table()) };
    }
    gated(gate, up, gelu, out)
}

/// Dequantize rows `ids` of an embedding table whose rows have `n` elements.
pub fn get_rows(t: GgmlType, data: &[u8], n: usize, ids: &[i32], out: &mut [f32]) {
    let rb = t.row_bytes(n);
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(n)) {
        let id = id as usize;
        dequantize_row(t, &data[id * rb..(id + 1) * rb], o);
    }
}
