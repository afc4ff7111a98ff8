//! Attention of query rows over a per-sequence f16 KV cache, causal with an optional sliding
//! window. One (row, head) is one sequential pass over its keys: batch-invariant by construction.

use half::f16;
use rayon::prelude::*;

/// Shapes: `q` = rows × n_head × head_dim (already scaled); `k`, `v` = cache_len × n_kv × head_dim
/// in f16 bits, cache index == token position. Row `i` sits at `positions[i]` and sees keys
/// `max(0, p - window + 1) ..= p` (`window == 0`: no window). Q is rounded to f16 like llama.cpp.
pub struct AttentionShape {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub window: usize,
}

fn dot(a: &[f32], b: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: AVX2/FMA/F16C checked by use_avx2; equal lengths by construction.
        return unsafe { crate::quant::avx2::dot_f32_f16(a, b) };
    }
    a.iter().zip(b).map(|(&x, &y)| x * f16::from_bits(y).to_f32()).sum()
}

fn axpy(y: &mut [f32], alpha: f32, x: &[u16]) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() {
        // SAFETY: as above.
        return unsafe { crate::quant::avx2::axpy_f16(y, alpha, x) };
    }
    for (o, &v) in y.iter_mut().zip(x) {
        *o += alpha * f16::from_bits(v).to_f32();
    }
}

pub fn attention(q: &[f32], k: &[u16], v: &[u16], positions: &[i32], s: &AttentionShape, out: &mut [f32]) {
    let (hd, n_head) = (s.head_dim, s.n_head);
    let group = n_head / s.n_kv;
    let kv_row = s.n_kv * hd;
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (row, h) = (idx / n_head, idx % n_head);
        let p = positions[row] as usize;
        let first = if s.window > 0 { (p + 1).saturating_sub(s.window) } else { 0 };
        let qh: Vec<f32> =
            q[idx * hd..(idx + 1) * hd].iter().map(|&x| f16::from_f32(x).to_f32()).collect();
        let kvh = (h / group) * hd;
        let mut scores: Vec<f32> = (first..=p).map(|j| dot(&qh, &k[j * kv_row + kvh..j * kv_row + kvh + hd])).collect();
        let n_keys = scores.len();
        crate::ops::softmax(&mut scores, n_keys);
        o.fill(0.0);
        for (j, &w) in (first..=p).zip(&scores) {
            axpy(o, w, &v[j * kv_row + kvh..j * kv_row + kvh + hd]);
        }
    });
}
