//! Attention of query rows over a per-sequence f16 KV cache, causal with an optional sliding
//! window. One (row, head) is one pass over its keys, so results never depend on the batch.
//!
//! The arithmetic follows llama.cpp's CPU path for prompt batches (flash attention off, F16 KV
//! cache, tinyBLAS F16 products), so logits agree with it bit for bit where the rest agrees:
//! - Q is rounded to f16; a score is an 8-lane FMA sum over head dims, reduced by `hsum8`;
//! - softmax uses ggml's vectorised exp, summed per group of 8 keys (groups aligned to absolute
//!   key position 0) in f64, then scaled by `(f32)(1/sum)`;
//! - probabilities are rounded to f16; each output dim is an 8-lane sum over keys with lane
//!   `key % 8`, reduced by `hsum8`.
//!
//! Products of two f16 values are exact in f32, so a lane-emulating scalar loop gives the same bits
//! as the AVX2 loop: both paths produce identical results.

use half::f16;
use rayon::prelude::*;

/// Shapes: `q` = rows × n_head × head_dim (already scaled); `k`, `v` = cache_len × n_kv × head_dim
/// in f16 bits, cache index == token position. Row `i` sits at `positions[i]` and sees keys
/// `max(0, p - window + 1) ..= p` (`window == 0`: no window).
pub struct AttentionShape {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub window: usize,
    /// multiplies the scores before the softmax (ggml's `soft_max_ext` scale); 1.0 when Q is pre-scaled
    pub kq_scale: f32,
}

/// The 8-lane horizontal sum used by ggml/tinyBLAS on x86: ((x0+x4)+(x2+x6)) + ((x1+x5)+(x3+x7)).
#[inline(always)]
pub(crate) fn hsum8(x: &[f32; 8]) -> f32 {
    let t = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

#[inline(always)]
fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// ggml's AVX2 `ggml_v_expf` evaluated lane by lane (same constants, same fused operations).
#[inline(always)]
pub(crate) fn expf_ggml(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6) * b);
    if n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// Score of one key: 8 lanes over head dims (lane = dim % 8), then `hsum8`.
#[inline(always)]
fn score<const AVX: bool>(q: &[f32], k: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: AVX is only true inside the avx2 wrapper, which the caller enables after detection.
        return unsafe { avx2::score(q, k) };
    }
    let mut lanes = [0.0f32; 8];
    for (i, (&a, &b)) in q.iter().zip(k).enumerate() {
        lanes[i % 8] += a * f16_to_f32(b);
    }
    hsum8(&lanes)
}

/// `score` of N keys: on AVX2 their FMA chains interleave (one chain alone waits on the FMA
/// latency); each key's own order, hence its bits, is `score`'s.
#[inline(always)]
fn scores<const AVX: bool, const N: usize>(q: &[f32], ks: [&[u16]; N]) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: as in `score`.
        return unsafe { avx2::scores(q, ks) };
    }
    ks.map(|k| score::<AVX>(q, k))
}

/// `acc += p * v` (vectorised across head dims); `p·v` is exact, so both paths round identically.
#[inline(always)]
fn accumulate<const AVX: bool>(acc: &mut [f32], p: f32, v: &[u16]) {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: as in `score`.
        return unsafe { crate::quant::avx2::axpy_f16(acc, p, v) };
    }
    for (a, &x) in acc.iter_mut().zip(v) {
        *a += p * f16_to_f32(x);
    }
}

/// Where one head's keys are: cache rows `first..=last`, `kv_row` floats apart, at offset `kv_off`.
#[derive(Clone, Copy)]
struct Keys {
    kv_row: usize,
    kv_off: usize,
    first: usize,
    last: usize,
    kq_scale: f32,
}

/// One (row, head): scores, ggml softmax, f16 probabilities, weighted sum of values.
#[inline(always)]
fn head<const AVX: bool>(q: &[f32], k: &[u16], v: &[u16], keys: Keys, o: &mut [f32]) {
    let Keys {
        kv_row,
        kv_off,
        first,
        last,
        kq_scale,
    } = keys;
    let hd = q.len();
    let qh: Vec<f32> = q.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    let key = |j: usize| j * kv_row + kv_off;
    let key_row = |j: usize| &k[key(j)..key(j) + hd];
    let mut p: Vec<f32> = Vec::with_capacity(last + 1 - first);
    let mut j = first;
    while j + 4 <= last + 1 {
        let four = scores::<AVX, 4>(&qh, std::array::from_fn(|i| key_row(j + i)));
        p.extend(four.map(|x| x * kq_scale));
        j += 4;
    }
    p.extend((j..=last).map(|j| score::<AVX>(&qh, key_row(j)) * kq_scale));
    let max = p.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    for x in p.iter_mut() {
        *x = expf_ggml(*x - max);
    }
    let mut sum = 0.0f64;
    for group in (first / 8)..=(last / 8) {
        let mut lanes = [0.0f32; 8];
        for (l, lane) in lanes.iter_mut().enumerate() {
            let j = 8 * group + l;
            if (first..=last).contains(&j) {
                *lane = p[j - first];
            }
        }
        sum += hsum8(&lanes) as f64;
    }
    let scale = (1.0 / sum) as f32;
    for x in p.iter_mut() {
        *x = f16::from_f32(*x * scale).to_f32();
    }
    let mut lanes = vec![0.0f32; 8 * hd];
    for (j, &pj) in (first..=last).zip(&p) {
        accumulate::<AVX>(
            &mut lanes[(j % 8) * hd..(j % 8 + 1) * hd],
            pj,
            &v[key(j)..key(j) + hd],
        );
    }
    for (d, out) in o.iter_mut().enumerate() {
        *out = hsum8(&std::array::from_fn(|l| lanes[l * hd + d]));
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Keys;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn score(q: &[f32], k: &[u16]) -> f32 {
        scores::<1>(q, [k])[0]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scores<const N: usize>(q: &[f32], ks: [&[u16]; N]) -> [f32; N] {
        let n = q.len();
        let mut acc = [_mm256_setzero_ps(); N];
        for c in 0..n / 8 {
            let qv = _mm256_loadu_ps(q.as_ptr().add(8 * c));
            for (a, k) in acc.iter_mut().zip(ks) {
                let kv = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(8 * c) as *const __m128i));
                *a = _mm256_fmadd_ps(kv, qv, *a);
            }
        }
        std::array::from_fn(|key| {
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc[key]);
            let k = ks[key];
            for i in 8 * (n / 8)..n {
                lanes[i % 8] += q[i] * super::f16_to_f32(k[i]);
            }
            super::hsum8(&lanes)
        })
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn head(q: &[f32], k: &[u16], v: &[u16], keys: Keys, o: &mut [f32]) {
        super::head::<true>(q, k, v, keys, o)
    }
}

pub fn attention(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    positions: &[i32],
    s: &AttentionShape,
    out: &mut [f32],
) {
    let (hd, n_head) = (s.head_dim, s.n_head);
    let group = n_head / s.n_kv;
    let kv_row = s.n_kv * hd;
    let use_avx2 = crate::simd::use_avx2();
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (row, h) = (idx / n_head, idx % n_head);
        let last = positions[row] as usize;
        let first = if s.window > 0 {
            (last + 1).saturating_sub(s.window)
        } else {
            0
        };
        let qrow = &q[idx * hd..(idx + 1) * hd];
        let keys = Keys {
            kv_row,
            kv_off: (h / group) * hd,
            first,
            last,
            kq_scale: s.kq_scale,
        };
        #[cfg(target_arch = "x86_64")]
        if use_avx2 {
            // SAFETY: use_avx2 reports AVX2, FMA and F16C.
            unsafe { avx2::head(qrow, k, v, keys, o) };
            return;
        }
        let _ = use_avx2;
        head::<false>(qrow, k, v, keys, o);
    });
}

#[cfg(test)]
mod tests {
    use super::expf_ggml;

    #[test]
    fn exp_matches_libm_closely() {
        for i in -2000..=0 {
            let x = i as f32 * 0.05;
            let (got, want) = (expf_ggml(x), x.exp());
            assert!(
                (got - want).abs() <= want * 4e-7 + 1e-38,
                "exp({x}) = {got}, libm {want}"
            );
        }
    }
}
