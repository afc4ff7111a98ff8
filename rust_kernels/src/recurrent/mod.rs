//! Recurrent-layer kernels with llama.cpp's CPU numerics (model reference §3.4, §5.3–5.4, §6):
//! - `conv1d_causal`: depthwise causal short convolution with carried state (`ggml_ssm_conv`), as
//!   Qwen3.5 Gated DeltaNet and Mamba2 use it; optional bias (Mamba2) and SiLU;
//! - `l2_norm`: `x / max(sqrt(Σx²), eps)` per row (`ggml_l2_norm`), and `gdn_l2_norm`, the form
//!   current llama.cpp's qwen35 graph uses for q and k (`build_gdn_l2_norm`: RMSNorm with
//!   `eps / n`, then times `1/sqrt(n)`, i.e. `x / sqrt(Σx² + eps)`);
//! - `gated_delta_rule`: the Gated DeltaNet recurrence as the fused CPU `GATED_DELTA_NET` op runs it;
//! - `mamba2_scan`: the Mamba2 selective scan (`ggml_ssm_scan`, scalar decay per head) plus D skip.
//!
//! Batch invariance: tokens are processed strictly in order, one at a time, each with a fixed
//! reduction order, and the state lives in f32 exactly as it is stored between calls. A token's
//! output and the final state are therefore the same bits whether a sequence comes in one call, in
//! uneven chunks or token by token, and whatever the thread count: work is only split across heads
//! (or, for the convolution, across output tokens, which are independent).
//!
//! Both paths give the same bits, and the bits of llama.cpp's x86 AVX2+FMA build (GCC, which
//! contracts `a*b + c` into FMAs, also across vector intrinsics, and vectorises in-order scalar
//! sums), checked op by op against the ggml that llama-cpp-python 0.3.36 ships
//! (tests/test_recurrent_kernels.py). Sums over a head dimension follow ggml's AVX2
//! `ggml_vec_dot_f32`: 4×8 FMA lanes over the
//! first `n & !31` elements, lane `i % 32`, reduced by `GGML_F32x8_REDUCE` (v0+v2, v1+v3, their
//! sum, the 128-bit halves, two `hadd`s), then the rest in order as `ordered_sum` describes. The
//! scalar path emulates those lanes; elementwise steps are the same single operations (mul, add,
//! fused multiply-add) on both paths.

use rayon::prelude::*;

/// `GGML_F32x8_REDUCE` over four 8-lane accumulators stored as 32 lanes (`lanes[8 * v + l]`).
#[inline(always)]
fn reduce32(lanes: &[f32; 32]) -> f32 {
    let x: [f32; 8] =
        std::array::from_fn(|l| (lanes[l] + lanes[16 + l]) + (lanes[8 + l] + lanes[24 + l]));
    let t = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `sum + Σ x[i]·y[i]`, added in index order, as GCC compiles ggml's scalar loops of the form
/// `sum += x[i]*y[i]` for AVX2+FMA: the products of the first `8·⌊n/8⌋` elements, and of one more
/// block of 4 when 4 to 7 remain, are rounded before they are added (vectorised products, in-order
/// adds); the last `n mod 8` (fewer than 4) or `n mod 4` are fused multiply-adds.
#[inline(always)]
fn ordered_sum(mut sum: f32, x: &[f32], y: &[f32]) -> f32 {
    let split = fused_from(x.len());
    for (&a, &b) in x[..split].iter().zip(&y[..split]) {
        sum += a * b;
    }
    for (&a, &b) in x[split..].iter().zip(&y[split..]) {
        sum = a.mul_add(b, sum);
    }
    sum
}

/// Where `ordered_sum` switches from rounded products to FMAs for `n` terms (and the convolution
/// for `n` taps): after `8·⌊n/8⌋`, plus 4 when 4 to 7 remain.
#[inline(always)]
fn fused_from(n: usize) -> usize {
    let n8 = n & !7;
    if n - n8 >= 4 {
        n8 + 4
    } else {
        n8
    }
}

/// `Σ x[i]·y[i]` in the order of ggml's AVX2 `ggml_vec_dot_f32` (see the module notes).
#[inline(always)]
fn dot_lanes(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let np = n & !31;
    let mut lanes = [0.0f32; 32];
    for (xc, yc) in x[..np].chunks_exact(32).zip(y[..np].chunks_exact(32)) {
        for l in 0..32 {
            lanes[l] = xc[l].mul_add(yc[l], lanes[l]);
        }
    }
    ordered_sum(reduce32(&lanes), &x[np..], &y[np..])
}

/// Delta rule, first half for one state row: `row = from · e` (the decay; `from` is the row's
/// previous value, `None` for `row` itself), then `dot(row, k)`.
#[inline(always)]
fn decay_dot<const AVX: bool>(from: Option<&[f32]>, row: &mut [f32], e: f32, k: &[f32]) -> f32 {
    let n = row.len();
    assert!(from.is_none_or(|f| f.len() == n) && k.len() == n);
    #[cfg(target_arch = "x86_64")]
    if AVX {
        let dst = row.as_mut_ptr();
        let src = from.map_or(dst as *const f32, <[f32]>::as_ptr);
        // SAFETY: AVX is only true inside the avx2 wrappers, entered after CPU detection; `src`
        // and `dst` hold n elements (asserted), `src` is `dst` itself or a distinct slice.
        return unsafe { avx2::decay_dot(src, dst, n, e, k) };
    }
    match from {
        Some(from) => {
            for (s, &x) in row.iter_mut().zip(from) {
                *s = x * e;
            }
        }
        None => {
            for s in row.iter_mut() {
                *s *= e;
            }
        }
    }
    dot_lanes(row, k)
}

/// Delta rule, second half for one state row: `row += k·d` (fused), then `dot(row, q)`.
#[inline(always)]
fn update_dot<const AVX: bool>(row: &mut [f32], k: &[f32], d: f32, q: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: as in `decay_dot`.
        return unsafe { avx2::update_dot(row, k, d, q) };
    }
    for (s, &kv) in row.iter_mut().zip(k) {
        *s = kv.mul_add(d, *s);
    }
    dot_lanes(row, q)
}

/// Mamba2 scan of one state row (one head channel): `s = fma(s, dA, B·x_dt)` (ggml's
/// `s·dA + B·x_dt` as GCC contracts it, in the SIMD loop and in the scalar tail alike), and returns
/// `Σ s·C`: 32 FMA lanes as `ggml_vec_dot_f32`, then the tail past `n & !31` as sequential FMAs.
#[inline(always)]
fn scan_row<const AVX: bool>(row: &mut [f32], da: f32, b: &[f32], x_dt: f32, c: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: as in `decay_dot`.
        return unsafe { avx2::scan_row(row, da, b, x_dt, c) };
    }
    let n = row.len();
    let np = n & !31;
    let mut lanes = [0.0f32; 32];
    for i in (0..np).step_by(32) {
        for l in 0..32 {
            let s = row[i + l].mul_add(da, b[i + l] * x_dt);
            row[i + l] = s;
            lanes[l] = s.mul_add(c[i + l], lanes[l]);
        }
    }
    let mut sum = reduce32(&lanes);
    for i in np..n {
        let s = row[i].mul_add(da, b[i] * x_dt);
        row[i] = s;
        sum = s.mul_add(c[i], sum);
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod avx512;

/// State rows per group on the AVX-512 path of the delta rule.
const WIDE_ROWS: usize = 4;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// `GGML_F32x8_REDUCE`: (v0+v2) + (v1+v3), low + high 128 bits, two horizontal adds.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn reduce(acc: [__m256; 4]) -> f32 {
        let x = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
        let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }

    /// `dst = src · e` (`n` elements; `src` may be `dst`), then `dot(dst, k)` in ggml's order.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn decay_dot(src: *const f32, dst: *mut f32, n: usize, e: f32, k: &[f32]) -> f32 {
        let np = n & !31;
        let kp = k.as_ptr();
        let ve = _mm256_set1_ps(e);
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..np).step_by(32) {
            for (j, a) in acc.iter_mut().enumerate() {
                let s = _mm256_mul_ps(_mm256_loadu_ps(src.add(i + 8 * j)), ve);
                _mm256_storeu_ps(dst.add(i + 8 * j), s);
                *a = _mm256_fmadd_ps(s, _mm256_loadu_ps(kp.add(i + 8 * j)), *a);
            }
        }
        for i in np..n {
            *dst.add(i) = *src.add(i) * e;
        }
        let tail = std::slice::from_raw_parts(dst.add(np), n - np);
        super::ordered_sum(reduce(acc), tail, &k[np..n])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn update_dot(row: &mut [f32], k: &[f32], d: f32, q: &[f32]) -> f32 {
        let n = row.len();
        let np = n & !31;
        let (rp, kp, qp) = (row.as_mut_ptr(), k.as_ptr(), q.as_ptr());
        let vd = _mm256_set1_ps(d);
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..np).step_by(32) {
            for (j, a) in acc.iter_mut().enumerate() {
                let p = rp.add(i + 8 * j);
                let s = _mm256_fmadd_ps(_mm256_loadu_ps(kp.add(i + 8 * j)), vd, _mm256_loadu_ps(p));
                _mm256_storeu_ps(p, s);
                *a = _mm256_fmadd_ps(s, _mm256_loadu_ps(qp.add(i + 8 * j)), *a);
            }
        }
        for (s, &kv) in row[np..].iter_mut().zip(&k[np..]) {
            *s = kv.mul_add(d, *s);
        }
        super::ordered_sum(reduce(acc), &row[np..], &q[np..])
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scan_row(row: &mut [f32], da: f32, b: &[f32], x_dt: f32, c: &[f32]) -> f32 {
        let n = row.len();
        let np = n & !31;
        let (rp, bp, cp) = (row.as_mut_ptr(), b.as_ptr(), c.as_ptr());
        let (vda, vxdt) = (_mm256_set1_ps(da), _mm256_set1_ps(x_dt));
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..np).step_by(32) {
            for (j, a) in acc.iter_mut().enumerate() {
                let p = rp.add(i + 8 * j);
                let s = _mm256_fmadd_ps(
                    _mm256_loadu_ps(p),
                    vda,
                    _mm256_mul_ps(_mm256_loadu_ps(bp.add(i + 8 * j)), vxdt),
                );
                _mm256_storeu_ps(p, s);
                *a = _mm256_fmadd_ps(s, _mm256_loadu_ps(cp.add(i + 8 * j)), *a);
            }
        }
        let mut sum = reduce(acc);
        for i in np..n {
            let s = row[i].mul_add(da, b[i] * x_dt);
            row[i] = s;
            sum = s.mul_add(c[i], sum);
        }
        sum
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gdn_head(
        a: &super::GdnArgs,
        h: usize,
        src: Option<&[f32]>,
        st: &mut [f32],
        o: &mut [f32],
    ) {
        super::gdn_head::<true, false>(a, h, src, st, o)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mamba2_head(a: &super::Mamba2Args, h: usize, st: &mut [f32], o: &mut [f32]) {
        super::mamba2_head::<true>(a, h, st, o)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn conv_row(a: &super::ConvArgs, t: usize, o: &mut [f32]) {
        super::conv_row::<true>(a, t, o)
    }
}

// ---------------------------------------------------------------------------------------------
// L2 norm

/// `out = x / max(sqrt(Σx²), eps)` per row of `n` (`ggml_l2_norm`): squares in f32 summed in f64,
/// the sum rounded to f32 before `sqrtf`, then one multiply by the f32 reciprocal.
pub fn l2_norm(x: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum = row.iter().fold(0.0f64, |s, &v| s + (v * v) as f64);
        let scale = 1.0 / (sum as f32).sqrt().max(eps);
        for (y, &v) in o.iter_mut().zip(row) {
            *y = v * scale;
        }
    }
}

/// q/k normalisation of current llama.cpp's Gated DeltaNet graphs (`build_gdn_l2_norm` in
/// src/models/models.h): `ggml_scale(ggml_rms_norm(x, eps / n), 1 / sqrtf(n))` per row of `n`, i.e.
/// `x / sqrt(Σx² + eps)` with RMSNorm's rounding (`ops::rms_norm`) and one more multiply.
/// (The model reference §3.4 describes the older `ggml_l2_norm` form, `l2_norm` here.)
/// Rows are split across the current rayon pool (the rule runs inside `threads::run`).
pub fn gdn_l2_norm(x: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    let nf = n as f32;
    let s = 1.0 / nf.sqrt();
    crate::threads::par_rows(out, n, |r0, o| {
        crate::ops::rms_norm(&x[r0 * n..r0 * n + o.len()], n, None, eps / nf, o);
        for y in o.iter_mut() {
            *y *= s;
        }
    });
}

// ---------------------------------------------------------------------------------------------
// Depthwise causal convolution

/// What one convolution call reads. `wt` is the weight transposed to `[kernel, channels]` for
/// kernels of more than 4 taps (empty otherwise: those read `weight` in place).
pub(crate) struct ConvArgs<'a> {
    x: &'a [f32],
    state: &'a [f32],
    weight: &'a [f32],
    wt: Vec<f32>,
    bias: Option<&'a [f32]>,
    channels: usize,
    kernel: usize,
    silu: bool,
}

impl ConvArgs<'_> {
    /// Row `r` of the input sequence preceded by the state: the K-1 carried inputs, then `x`.
    #[inline(always)]
    fn input(&self, r: usize) -> &[f32] {
        let (c, km1) = (self.channels, self.kernel - 1);
        if r < km1 {
            &self.state[r * c..(r + 1) * c]
        } else {
            &self.x[(r - km1) * c..(r - km1 + 1) * c]
        }
    }
}

/// `conv_row`'s sum for a small kernel known at compile time, reading `weight` (channels × K) in
/// place: the same operations in the same order as the transposed loop.
#[inline(always)]
fn conv_taps<const K: usize>(a: &ConvArgs, t: usize, o: &mut [f32]) {
    let c = o.len();
    let rows: [&[f32]; K] = std::array::from_fn(|k| &a.input(t + k)[..c]);
    let unfused = fused_from(K);
    for (j, (y, taps)) in o.iter_mut().zip(a.weight.chunks_exact(K)).enumerate() {
        let mut s = 0.0f32;
        for k in 0..K {
            s = if k < unfused {
                s + rows[k][j] * taps[k]
            } else {
                rows[k][j].mul_add(taps[k], s)
            };
        }
        *y = s;
    }
}

/// Output token `t`: `Σ_k w[c,k]·in[t+k][c]` from 0, tap 0 first, each tap added as
/// `ordered_sum` adds its elements (`ggml_ssm_conv`'s loop over taps, as GCC compiles it: for
/// kernel 4 four rounded products added in order), then `+ bias[c]` (a separate add, as
/// `ggml_add`), then SiLU as `ggml_silu` computes a row. `AVX` only picks the compilation context:
/// inside the avx2 wrapper LLVM vectorises these channel loops with the same operations per element.
#[inline(always)]
fn conv_row<const AVX: bool>(a: &ConvArgs, t: usize, o: &mut [f32]) {
    let (c, kernel) = (a.channels, a.kernel);
    match kernel {
        1 => conv_taps::<1>(a, t, o),
        2 => conv_taps::<2>(a, t, o),
        3 => conv_taps::<3>(a, t, o),
        4 => conv_taps::<4>(a, t, o),
        _ => {
            o.fill(0.0);
            for k in 0..kernel {
                let (x, w) = (a.input(t + k), &a.wt[k * c..(k + 1) * c]);
                if k < fused_from(kernel) {
                    for ((y, &xv), &wv) in o.iter_mut().zip(x).zip(w) {
                        *y += xv * wv;
                    }
                } else {
                    for ((y, &xv), &wv) in o.iter_mut().zip(x).zip(w) {
                        *y = xv.mul_add(wv, *y);
                    }
                }
            }
        }
    }
    if let Some(b) = a.bias {
        for (y, &bv) in o.iter_mut().zip(b) {
            *y += bv;
        }
    }
    if a.silu {
        // ggml_vec_silu_f32 on a row: 8 lanes of its vectorised SiLU while 8 elements remain
        // (`ops::silu`), then `x / (1 + expf(-x))` with libm's expf for the last `channels % 8`.
        let n8 = c & !7;
        crate::ops::silu_in_place(&mut o[..n8]);
        for y in &mut o[n8..] {
            *y /= 1.0 + (-*y).exp();
        }
    }
}

/// Depthwise causal convolution over `x` = n_tokens × channels with `weight` = channels × kernel
/// (GGUF `ssm_conv1d`, ggml {kernel, channels}) and `state` = (kernel-1) × channels, the last
/// kernel-1 raw inputs before `x` (oldest first; zeros at sequence start). Writes
/// `out[t, c] = Σ_k weight[c, k] · input[t - (kernel-1) + k, c] (+ bias[c]) (then SiLU)` and
/// replaces `state` by the last kernel-1 raw inputs. Use it inside `threads::run` (unless
/// `conv_is_serial`).
#[allow(clippy::too_many_arguments)]
pub fn conv1d_causal(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    state: &mut [f32],
    channels: usize,
    kernel: usize,
    silu: bool,
    out: &mut [f32],
) {
    let prev = state.to_vec();
    conv1d_causal_from(x, weight, bias, &prev, state, channels, kernel, silu, out);
}

/// At most this many tokens are convolved on the calling thread: less work than handing it to the
/// pool costs.
pub const CONV_SERIAL_TOKENS: usize = 2;

/// Whether `conv1d_causal_from` runs on the calling thread (no rayon calls) for `n_tokens`.
pub fn conv_is_serial(n_tokens: usize) -> bool {
    n_tokens <= CONV_SERIAL_TOKENS
}

/// `conv1d_causal` continuing from `state_in` and writing the new state to `state_out` (same
/// shape; `state_in` is left as it was): the same bits as `conv1d_causal` on a copy of `state_in`.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_causal_from(
    x: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    state_in: &[f32],
    state_out: &mut [f32],
    channels: usize,
    kernel: usize,
    silu: bool,
    out: &mut [f32],
) {
    assert!(kernel > 0, "the convolution needs at least one tap");
    let c = channels;
    if c == 0 {
        return;
    }
    let n_tokens = x.len() / c;
    let mut wt = vec![0.0f32; if kernel > 4 { kernel * c } else { 0 }];
    for (k, row) in wt.chunks_exact_mut(c).enumerate() {
        for (w, taps) in row.iter_mut().zip(weight.chunks_exact(kernel)) {
            *w = taps[k];
        }
    }
    let a = ConvArgs {
        x,
        state: state_in,
        weight,
        wt,
        bias,
        channels: c,
        kernel,
        silu,
    };
    let use_avx2 = crate::simd::use_avx2();
    let row = |(t, o): (usize, &mut [f32])| {
        #[cfg(target_arch = "x86_64")]
        if use_avx2 {
            // SAFETY: use_avx2 reports AVX2 and FMA.
            unsafe { avx2::conv_row(&a, t, o) };
            return;
        }
        let _ = use_avx2;
        conv_row::<false>(&a, t, o);
    };
    if conv_is_serial(n_tokens) {
        out.chunks_mut(c).enumerate().for_each(row);
    } else {
        out.par_chunks_mut(c).enumerate().for_each(row);
    }
    for (i, row) in state_out.chunks_exact_mut(c).enumerate() {
        row.copy_from_slice(a.input(n_tokens + i));
    }
}

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet

/// Sizes of one `gated_delta_rule` call.
#[derive(Clone, Copy, Debug)]
pub struct GdnShape {
    pub n_tokens: usize,
    /// q/k heads (`ssm.group_count`)
    pub n_k_heads: usize,
    /// v heads (`ssm.time_step_rank`); a multiple of `n_k_heads`; v head `h` uses k head `h % n_k_heads`
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
}

pub(crate) struct GdnArgs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    s: GdnShape,
}

/// One v head over all tokens. `st` = d_v rows of d_k (`st[j*d_k + i] = S[i][j]`), `o` = n_tokens × d_v.
/// With `src`, the head's state is read from there and written to `st` (by the first token's decay).
/// `WIDE` (AVX-512, with `AVX`): rows in groups of `WIDE_ROWS` through `avx512`'s row-group steps.
#[inline(always)]
fn gdn_head<const AVX: bool, const WIDE: bool>(
    a: &GdnArgs,
    h: usize,
    src: Option<&[f32]>,
    st: &mut [f32],
    o: &mut [f32],
) {
    let GdnShape {
        n_tokens,
        n_k_heads: nk,
        n_v_heads: nv,
        d_k: dk,
        d_v: dv,
    } = a.s;
    let scale = 1.0f32 / (dk as f32).sqrt();
    let hk = h % nk;
    for t in 0..n_tokens {
        let q = &a.q[(t * nk + hk) * dk..(t * nk + hk + 1) * dk];
        let k = &a.k[(t * nk + hk) * dk..(t * nk + hk + 1) * dk];
        let v = &a.v[(t * nv + h) * dv..(t * nv + h + 1) * dv];
        let decay = a.g[t * nv + h].exp();
        let beta = a.beta[t * nv + h];
        let ot = &mut o[t * dv..(t + 1) * dv];
        // Rows are independent, so doing each row's four steps together gives the same bits as
        // ggml's four passes over the whole matrix.
        let from = src.filter(|_| t == 0); // after the first token the state is in `st`
        let mut wide = 0;
        #[cfg(target_arch = "x86_64")]
        if WIDE {
            const R: usize = WIDE_ROWS;
            while wide + R <= dv {
                let rows = st[wide * dk..(wide + R) * dk].as_mut_ptr();
                let from_rows = from.map_or(rows as *const f32, |f| f[wide * dk..].as_ptr());
                // SAFETY: WIDE is only true inside `avx512::gdn_head`, entered after CPU
                // detection; the R rows at `rows` (and at `from_rows`, the same layout) are in
                // bounds (sliced above), and `from` is `st` itself or a distinct buffer.
                let sk: [f32; R] = unsafe { avx512::decay_dot_rows(from_rows, rows, dk, decay, k) };
                let deltas = std::array::from_fn(|r| (v[wide + r] - sk[r]) * beta);
                // SAFETY: as above.
                let os: [f32; R] = unsafe { avx512::update_dot_rows(rows, dk, k, deltas, q) };
                for (r, x) in os.into_iter().enumerate() {
                    ot[wide + r] = x * scale;
                }
                wide += R;
            }
        }
        for (j, ((row, &vj), oj)) in st
            .chunks_exact_mut(dk)
            .zip(v)
            .zip(ot.iter_mut())
            .enumerate()
            .skip(wide)
        {
            let sk = decay_dot::<AVX>(from.map(|f| &f[j * dk..(j + 1) * dk]), row, decay, k);
            let delta = (vj - sk) * beta;
            *oj = update_dot::<AVX>(row, k, delta, q) * scale;
        }
    }
}

/// The Gated DeltaNet recurrence (model reference §5.3 step 7), per v head `h` (k head `h % nk`,
/// the tiled order of qwen35 GGUFs), per token in order:
/// ```text
/// S ← exp(g)·S;  δ[j] = β·(v[j] − Σ_i S[i,j]·k[i]);  S[i,j] += k[i]·δ[j];
/// o[j] = (Σ_i S[i,j]·q[i]) · (1/sqrt(d_k))
/// ```
/// Layouts (C order): `q`, `k` = n_tokens × n_k_heads × d_k (L2-normalised by the caller unless
/// `l2_eps` is given, in which case they are normalised here with `gdn_l2_norm`, as current
/// llama.cpp does for qwen35 / qwen3next); `v` = n_tokens ×
/// n_v_heads × d_v; `g` (log-decay, ≤ 0) and `beta` = n_tokens × n_v_heads; `state` = n_v_heads ×
/// d_v × d_k with `state[h, j, i] = S[i, j]` (llama.cpp's layout: key index contiguous, i.e. HF's
/// per-head matrix transposed); `out` = n_tokens × n_v_heads × d_v. The recurrence continues from
/// `state_in` when given (left as it was; the first token's decay reads it and writes `state`, so
/// no copy is made), else from `state`, and the new state is written to `state` either way.
/// Use it inside `threads::run`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state_in: Option<&[f32]>,
    state: &mut [f32],
    s: GdnShape,
    l2_eps: Option<f32>,
    out: &mut [f32],
) {
    let (n, nv, dk, dv) = (s.n_tokens, s.n_v_heads, s.d_k, s.d_v);
    if n == 0 || nv == 0 || dk == 0 || dv == 0 {
        if let Some(src) = state_in {
            state.copy_from_slice(src);
        }
        return;
    }
    let normed = l2_eps.map(|eps| {
        let (mut qn, mut kn) = (vec![0.0f32; q.len()], vec![0.0f32; k.len()]);
        gdn_l2_norm(q, dk, eps, &mut qn);
        gdn_l2_norm(k, dk, eps, &mut kn);
        (qn, kn)
    });
    let (q, k) = match &normed {
        Some((qn, kn)) => (qn.as_slice(), kn.as_slice()),
        None => (q, k),
    };
    let a = GdnArgs {
        q,
        k,
        v,
        g,
        beta,
        s,
    };
    let use_avx2 = crate::simd::use_avx2();
    let use_avx512 = crate::simd::use_vnni();
    let head = |(h, (o, st)): (usize, (&mut [f32], &mut [f32]))| {
        let src = state_in.map(|s| &s[h * dv * dk..(h + 1) * dv * dk]);
        #[cfg(target_arch = "x86_64")]
        if use_avx512 {
            // SAFETY: use_vnni reports AVX-512 F (and the AVX2 set below it).
            unsafe { avx512::gdn_head(&a, h, src, st, o) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if use_avx2 {
            // SAFETY: use_avx2 reports AVX2 and FMA.
            unsafe { avx2::gdn_head(&a, h, src, st, o) };
            return;
        }
        let _ = use_avx2;
        gdn_head::<false, false>(&a, h, src, st, o);
    };
    if n == 1 {
        // one token: a head's outputs are already where `out` wants them
        out.par_chunks_mut(dv)
            .zip(state.par_chunks_mut(dv * dk))
            .enumerate()
            .for_each(head);
        return;
    }
    let mut by_head = vec![0.0f32; nv * n * dv];
    by_head
        .par_chunks_mut(n * dv)
        .zip(state.par_chunks_mut(dv * dk))
        .enumerate()
        .for_each(head);
    for (h, head) in by_head.chunks_exact(n * dv).enumerate() {
        for (t, row) in head.chunks_exact(dv).enumerate() {
            out[(t * nv + h) * dv..(t * nv + h + 1) * dv].copy_from_slice(row);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Mamba2

/// Sizes of one `mamba2_scan` call.
#[derive(Clone, Copy, Debug)]
pub struct Mamba2Shape {
    pub n_tokens: usize,
    /// H (`ssm.time_step_rank`)
    pub n_heads: usize,
    /// P = d_inner / H
    pub head_dim: usize,
    /// G (`ssm.group_count`); head `h` uses group `h / (H / G)`
    pub n_groups: usize,
    /// N (`ssm.state_size`)
    pub d_state: usize,
}

pub(crate) struct Mamba2Args<'a> {
    x: &'a [f32],
    dt: &'a [f32],
    a: &'a [f32],
    b: &'a [f32],
    c: &'a [f32],
    d: Option<&'a [f32]>,
    dt_bias: Option<&'a [f32]>,
    s: Mamba2Shape,
}

/// `x > 20 ? x : logf(1 + expf(x))` (ggml_compute_softplus_f32).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// One head over all tokens. `st` = head_dim rows of d_state, `o` = n_tokens × head_dim.
#[inline(always)]
fn mamba2_head<const AVX: bool>(a: &Mamba2Args, h: usize, st: &mut [f32], o: &mut [f32]) {
    let Mamba2Shape {
        n_tokens,
        n_heads: nh,
        head_dim: p,
        n_groups: ng,
        d_state: ns,
    } = a.s;
    let grp = h / (nh / ng);
    for t in 0..n_tokens {
        let dt = match a.dt_bias {
            Some(bias) => a.dt[t * nh + h] + bias[h],
            None => a.dt[t * nh + h],
        };
        let dt_sp = softplus(dt);
        let da = (dt_sp * a.a[h]).exp();
        let b = &a.b[(t * ng + grp) * ns..(t * ng + grp + 1) * ns];
        let c = &a.c[(t * ng + grp) * ns..(t * ng + grp + 1) * ns];
        let x = &a.x[(t * nh + h) * p..(t * nh + h + 1) * p];
        let ot = &mut o[t * p..(t + 1) * p];
        for ((row, &xv), y) in st.chunks_exact_mut(ns).zip(x).zip(ot.iter_mut()) {
            let sum = scan_row::<AVX>(row, da, b, xv * dt_sp, c);
            // `y + x·D` as two graph ops (ggml_mul, then ggml_add): two roundings.
            *y = match a.d {
                Some(d) => sum + xv * d[h],
                None => sum,
            };
        }
    }
}

/// The Mamba2 selective scan (model reference §6 step 3–4, `ggml_ssm_scan` with a scalar A per
/// head), per head `h` (group `h / (H/G)`), per token in order:
/// ```text
/// Δ = softplus(dt[h] (+ dt_bias[h]));  dA = exp(Δ·A[h]);
/// s[h,p,n] ← s[h,p,n]·dA + B[g,n]·(x[h,p]·Δ);  y[h,p] = Σ_n s[h,p,n]·C[g,n]  (+ D[h]·x[h,p])
/// ```
/// Layouts (C order): `x` = n_tokens × H × P; `dt` = n_tokens × H (raw, before softplus); `a` = H
/// (GGUF `ssm_a`, already −exp(A_log)); `b`, `c` = n_tokens × G × N; `d`, `dt_bias` = H;
/// `state` = H × P × N (llama.cpp's layout); `out` = n_tokens × H × P. The scan continues from
/// `state_in` when given (left as it was), else from `state`, and the new state is written to
/// `state` either way. Use it inside `threads::run`.
#[allow(clippy::too_many_arguments)]
pub fn mamba2_scan(
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: Option<&[f32]>,
    dt_bias: Option<&[f32]>,
    state_in: Option<&[f32]>,
    state: &mut [f32],
    s: Mamba2Shape,
    out: &mut [f32],
) {
    let (n, nh, p, ns) = (s.n_tokens, s.n_heads, s.head_dim, s.d_state);
    assert!(ns > 0 && s.n_groups > 0 && nh % s.n_groups == 0);
    if n == 0 || nh == 0 || p == 0 {
        if let Some(src) = state_in {
            state.copy_from_slice(src);
        }
        return;
    }
    let args = Mamba2Args {
        x,
        dt,
        a,
        b,
        c,
        d,
        dt_bias,
        s,
    };
    let mut by_head = vec![0.0f32; nh * n * p];
    let use_avx2 = crate::simd::use_avx2();
    by_head
        .par_chunks_mut(n * p)
        .zip(state.par_chunks_mut(p * ns))
        .enumerate()
        .for_each(|(h, (o, st))| {
            if let Some(src) = state_in {
                st.copy_from_slice(&src[h * p * ns..(h + 1) * p * ns]);
            }
            #[cfg(target_arch = "x86_64")]
            if use_avx2 {
                // SAFETY: use_avx2 reports AVX2 and FMA.
                unsafe { avx2::mamba2_head(&args, h, st, o) };
                return;
            }
            let _ = use_avx2;
            mamba2_head::<false>(&args, h, st, o);
        });
    for (h, head) in by_head.chunks_exact(n * p).enumerate() {
        for (t, row) in head.chunks_exact(p).enumerate() {
            out[(t * nh + h) * p..(t * nh + h + 1) * p].copy_from_slice(row);
        }
    }
}
