//! Depthwise causal short convolution with carried state (`ggml_ssm_conv`), optional bias and
//! SiLU, as Qwen3.5 Gated DeltaNet and Mamba2 use it.

use super::sums::fused_from;
use rayon::prelude::*;

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
/// inside `conv_row_avx2` LLVM vectorises these channel loops with the same operations per element.
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

/// `conv_row` compiled with AVX2 and FMA enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn conv_row_avx2(a: &ConvArgs, t: usize, o: &mut [f32]) {
    conv_row::<true>(a, t, o)
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
            // SAFETY: use_avx2 reports AVX2 and FMA, detected at run time; `conv_row` itself only
            // indexes slices (checked).
            unsafe { conv_row_avx2(&a, t, o) };
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
