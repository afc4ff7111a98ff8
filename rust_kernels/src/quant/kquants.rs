//! K-quants (256-element super-blocks): Q4_K, Q5_K, Q6_K (scalar reference path).

use super::act::BlockQ8K;
use super::{f16_at, GgmlType};

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

/// K-quant weight row against Q8_K activations. Integer sums are exact; one float update per
/// super-block, in block order.
pub fn vec_dot(t: GgmlType, w: &[u8], y: &[BlockQ8K]) -> f32 {
    let mut sum = 0.0f32;
    for (b, yb) in w.chunks_exact(t.block_bytes()).zip(y) {
        if t == GgmlType::Q6K {
            let q = q6_values(b);
            let mut isum = 0i32;
            for k in 0..16 {
                let s: i32 = (16 * k..16 * k + 16)
                    .map(|e| (q[e] as i32 - 32) * yb.qs[e] as i32)
                    .sum();
                isum += (b[192 + k] as i8 as i32) * s;
            }
            sum += f16_at(b, 208) * yb.d * isum as f32;
        } else {
            let (sc, m) = scales_mins(&b[4..16]);
            let q = q45_values(t, b);
            let mut isum = 0i32;
            let mut imins = 0i32;
            for s in 0..8 {
                let part: i32 = (32 * s..32 * s + 32)
                    .map(|e| q[e] as i32 * yb.qs[e] as i32)
                    .sum();
                isum += sc[s] as i32 * part;
                imins += m[s] as i32 * (yb.bsums[2 * s] as i32 + yb.bsums[2 * s + 1] as i32);
            }
            sum += f16_at(b, 0) * yb.d * isum as f32 - f16_at(b, 2) * yb.d * imins as f32;
        }
    }
    sum
}
