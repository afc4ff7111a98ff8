//! The 32-element "legacy" blocks: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (scalar reference path).
//!
//! In the 4-bit layouts byte `qs[j]` holds element `j` in its low nibble and element `j+16` in its
//! high nibble; Q5 adds a u32 `qh` whose bit `i` is the 5th bit of element `i`.

use super::blocks::{BlockQ8_0, BlockQ8_1};
use super::{f16_at, GgmlType};

/// One block as (scale, min, quant values with the type's offset already applied).
/// `_0` types have min 0 and signed values; `_1` types have unsigned values plus a min.
pub fn unpack(t: GgmlType, b: &[u8]) -> (f32, f32, [i32; 32]) {
    let mut q = [0i32; 32];
    match t {
        GgmlType::Q8_0 => {
            for (i, v) in q.iter_mut().enumerate() {
                *v = b[2 + i] as i8 as i32;
            }
            (f16_at(b, 0), 0.0, q)
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let (qs, offset, m) = if t == GgmlType::Q4_0 {
                (&b[2..18], 8, 0.0)
            } else {
                (&b[4..20], 0, f16_at(b, 2))
            };
            for j in 0..16 {
                q[j] = (qs[j] & 15) as i32 - offset;
                q[j + 16] = (qs[j] >> 4) as i32 - offset;
            }
            (f16_at(b, 0), m, q)
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let (qh_at, qs_at, offset, m) = if t == GgmlType::Q5_0 {
                (2, 6, 16, 0.0)
            } else {
                (4, 8, 0, f16_at(b, 2))
            };
            let qh = u32::from_le_bytes([b[qh_at], b[qh_at + 1], b[qh_at + 2], b[qh_at + 3]]);
            let qs = &b[qs_at..qs_at + 16];
            for j in 0..16 {
                let lo = (qs[j] & 15) as u32 | ((qh >> j) & 1) << 4;
                let hi = (qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4;
                q[j] = lo as i32 - offset;
                q[j + 16] = hi as i32 - offset;
            }
            (f16_at(b, 0), m, q)
        }
        _ => unreachable!("not a legacy block type: {t:?}"),
    }
}

pub fn dequantize(t: GgmlType, row: &[u8], out: &mut [f32]) {
    for (b, o) in row
        .chunks_exact(t.block_bytes())
        .zip(out.chunks_exact_mut(32))
    {
        let (d, m, q) = unpack(t, b);
        for (x, &v) in o.iter_mut().zip(&q) {
            *x = d * v as f32 + m;
        }
    }
}

/// Q4_0 / Q5_0 / Q8_0 weights against Q8_0 activations: `sum dx*dy*sum(qx*qy)`.
pub fn vec_dot_q8_0(t: GgmlType, w: &[u8], y: &[BlockQ8_0]) -> f32 {
    let mut sum = 0.0f32;
    for (b, yb) in w.chunks_exact(t.block_bytes()).zip(y) {
        let (d, _, q) = unpack(t, b);
        let isum: i32 = q.iter().zip(&yb.qs).map(|(&a, &c)| a * c as i32).sum();
        sum += d * yb.d * isum as f32;
    }
    sum
}

/// Q4_1 / Q5_1 weights against Q8_1 activations: `sum dx*dy*sum(qx*qy) + mx*sy`.
pub fn vec_dot_q8_1(t: GgmlType, w: &[u8], y: &[BlockQ8_1]) -> f32 {
    let mut sum = 0.0f32;
    for (b, yb) in w.chunks_exact(t.block_bytes()).zip(y) {
        let (d, m, q) = unpack(t, b);
        let isum: i32 = q.iter().zip(&yb.qs).map(|(&a, &c)| a * c as i32).sum();
        sum += d * yb.d * isum as f32 + m * yb.s;
    }
    sum
}
