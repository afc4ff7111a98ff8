//! K-quants (256-element super-blocks): Q4_K, Q5_K, Q6_K (scalar reference path).

use super::blocks::BlockQ8K;
use super::{f16_at, GgmlType};
use crate::simd_math::hsum8;

/// Unpack the 12-byte scales array of Q4_K/Q5_K into 8 six-bit scales and 8 six-bit mins.
pub fn scales_mins(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for b in 0..4 {
        sc[b] = q[b] & 63;
        m[b] = q[b + 4] & 63;
        sc[b + 4] = (q[b + 8] & 0x0F) | ((q[b] >> 6) << 4);
        m[b + 4] = (q[b + 8] >> 4) | ((q[b + 4] >> 6) << 4);
    }
    (sc, m)
}

/// The 256 unsigned quant values of a Q4_K/Q5_K block (0..15 or 0..31).
fn q45_values(t: GgmlType, b: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    let (qs, qh) = if t == GgmlType::Q4K {
        (&b[16..144], None)
    } else {
        (&b[48..176], Some(&b[16..48]))
    };
    for c in 0..4 {
        for l in 0..32 {
            let byte = qs[32 * c + l];
            let (mut lo, mut hi) = (byte & 15, byte >> 4);
            if let Some(qh) = qh {
                lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
            }
            q[64 * c + l] = lo;
            q[64 * c + 32 + l] = hi;
        }
    }
    q
}

/// The 256 unsigned 6-bit values of a Q6_K block (0..63; the weight is `q - 32`).
pub fn q6_values(b: &[u8]) -> [u8; 256] {
    let (ql, qh) = (&b[0..128], &b[128..192]);
    let mut q = [0u8; 256];
    for n in 0..2 {
        for l in 0..32 {
            let h = qh[32 * n + l];
            let (a, c) = (ql[64 * n + l], ql[64 * n + l + 32]);
            q[128 * n + l] = (a & 15) | (h & 3) << 4;
            q[128 * n + l + 32] = (c & 15) | ((h >> 2) & 3) << 4;
            q[128 * n + l + 64] = (a >> 4) | ((h >> 4) & 3) << 4;
            q[128 * n + l + 96] = (c >> 4) | ((h >> 6) & 3) << 4;
        }
    }
    q
}

pub fn dequantize(t: GgmlType, row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(t.block_bytes())
        .zip(out.chunks_exact_mut(256))
    {
        if t == GgmlType::Q6K {
            let d = f16_at(b, 208);
            let q = q6_values(b);
            for (e, x) in o.iter_mut().enumerate() {
                *x = d * (b[192 + e / 16] as i8 as f32) * (q[e] as i32 - 32) as f32;
            }
        } else {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (sc, m) = scales_mins(&b[4..16]);
            let q = q45_values(t, b);
            for (e, x) in o.iter_mut().enumerate() {
                *x = d * sc[e / 32] as f32 * q[e] as f32 - dmin * m[e / 32] as f32;
            }
        }
    }
}

/// `out[i] = sum(q[4i..4i+4] * y[4i..4i+4])`: the exact sums one i32 lane gathers per 32 elements.
#[inline]
fn quad_products(q: &[u8; 256], y: &[i8; 256]) -> [i32; 64] {
    let mut prod = [0i32; 256];
    for ((p, &a), &b) in prod.iter_mut().zip(q).zip(y) {
        *p = a as i32 * b as i32;
    }
    std::array::from_fn(|i| (prod[4 * i] + prod[4 * i + 1]) + (prod[4 * i + 2] + prod[4 * i + 3]))
}

/// K-quant weight row against Q8_K activations, in the operation order of llama.cpp's AVX2 kernels
/// (which the AVX2 path implements with the same instructions): per super-block, 8 exact i32 lanes
/// (lane k holds elements 4k..4k+4 of every 32-element chunk, times their scales) are converted
/// to f32 and fused-multiply-added into 8 float lanes, reduced by `hsum8` at the end. Q4_K adds
/// the mins term through 4 more float lanes (lane l: sub-blocks 2l, 2l+1), Q5_K through one fused
/// scalar sum; Q6_K subtracts its offset 32 per lane (lane k: sub-blocks 2k, 2k+1 of 16).
pub fn vec_dot(t: GgmlType, w: &[u8], y: &[BlockQ8K]) -> f32 {
    let mut acc = [0.0f32; 8];
    if t == GgmlType::Q6K {
        for (b, yb) in w.chunks_exact(210).zip(y) {
            let q = q6_values(b);
            let sc = |j: usize| b[192 + j] as i8 as i32;
            let mut lanes: [i32; 8] = std::array::from_fn(|k| {
                -32 * (yb.bsums[2 * k] as i32 * sc(2 * k)
                    + yb.bsums[2 * k + 1] as i32 * sc(2 * k + 1))
            });
            let p = quad_products(&q, &yb.qs);
            for c in 0..8 {
                for (k, lane) in lanes.iter_mut().enumerate() {
                    *lane += sc(2 * c + k / 4) * p[8 * c + k];
                }
            }
            let d = f16_at(b, 208) * yb.d;
            for (a, &l) in acc.iter_mut().zip(&lanes) {
                *a = d.mul_add(l as f32, *a);
            }
        }
        return hsum8(&acc);
    }
    let mut mins4 = [0.0f32; 4];
    let mut mins1 = 0.0f32;
    for (b, yb) in w.chunks_exact(t.block_bytes()).zip(y) {
        let (sc, m) = scales_mins(&b[4..16]);
        let q = q45_values(t, b);
        let mut lanes = [0i32; 8];
        let p = quad_products(&q, &yb.qs);
        for (c, &s) in sc.iter().enumerate() {
            for (k, lane) in lanes.iter_mut().enumerate() {
                *lane += s as i32 * p[8 * c + k];
            }
        }
        let d = f16_at(b, 0) * yb.d;
        for (a, &l) in acc.iter_mut().zip(&lanes) {
            *a = d.mul_add(l as f32, *a);
        }
        let dmin = -yb.d * f16_at(b, 2);
        let pair = |j: usize| m[j] as i32 * (yb.bsums[2 * j] as i32 + yb.bsums[2 * j + 1] as i32);
        let prod: [i32; 4] = std::array::from_fn(|l| pair(2 * l) + pair(2 * l + 1));
        if t == GgmlType::Q4K {
            for (a, &p) in mins4.iter_mut().zip(&prod) {
                *a = dmin.mul_add(p as f32, *a);
            }
        } else {
            let total = (prod[0] + prod[1]) + (prod[2] + prod[3]);
            mins1 = dmin.mul_add(total as f32, mins1);
        }
    }
    let mins = if t == GgmlType::Q4K {
        (mins4[0] + mins4[2]) + (mins4[1] + mins4[3])
    } else {
        mins1
    };
    hsum8(&acc) + mins
}
