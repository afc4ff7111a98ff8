//! Row-wise operations with llama.cpp's CPU numerics: RMSNorm, RoPE, GELU (fp16 table), SiLU,
//! gated units, softmax and embedding lookup. All are per row, so batch-invariant.

use crate::quant::{dequantize_row, GgmlType};
use half::f16;
use std::sync::OnceLock;

/// `out = x / sqrt(mean(x²) + eps) [* w]` per row of `n`, with ggml's rounding steps.
pub fn rms_norm(x: &[f32], n: usize, w: Option<&[f32]>, eps: f32, out: &mut [f32]) {
    for (row, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        // ggml squares in f32, then accumulates in f64.
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
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

/// The angle per rotated pair for one position: `p * freq_scale * base^(-2i/n_rot)`, built by
/// repeated multiplication in f32 exactly like ggml's rope cache.
fn rope_angles(pos: f32, n_rot: usize, base: f32, freq_scale: f32) -> Vec<(f32, f32)> {
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
    let (half, neox) = (r.n_rot / 2, r.neox);
    for (row, &p) in x.chunks_exact_mut(n_head * head_dim).zip(positions) {
        let angles = rope_angles(p as f32, r.n_rot, r.base, r.freq_scale);
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
fn gelu_table() -> &'static [f32] {
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
    x / (1.0 + crate::attention::expf_ggml(-x))
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

// ggml's exp uses fused multiply-adds; compiled with FMA enabled they are single instructions
// instead of libm `fmaf` calls (same results, ~10x faster).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_fma(gate: &[f32], up: &[f32], out: &mut [f32]) {
    swiglu_body(gate, up, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_fma(x: &[f32], out: &mut [f32]) {
    silu_body(x, out)
}

/// `out = silu(gate) * up` (SwiGLU).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: use_avx2() reports AVX2 and FMA.
        return unsafe { swiglu_fma(gate, up, out) };
    }
    swiglu_body(gate, up, out)
}

/// `out = silu(x)` elementwise.
pub fn silu_slice(x: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: as above.
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

/// Softmax over each row of `n`, in place (max-subtracted; the sum in f64 as ggml does).
pub fn softmax(x: &mut [f32], n: usize) {
    for row in x.chunks_exact_mut(n) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0.0f64;
        for v in row.iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
        let inv = (1.0 / sum) as f32;
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
}

/// Dequantize rows `ids` of an embedding table whose rows have `n` elements.
pub fn get_rows(t: GgmlType, data: &[u8], n: usize, ids: &[i32], out: &mut [f32]) {
    let rb = t.row_bytes(n);
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(n)) {
        let id = id as usize;
        dequantize_row(t, &data[id * rb..(id + 1) * rb], o);
    }
}
