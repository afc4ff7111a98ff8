//! F32, F16 and BF16 weights (scalar reference path). Activations meet F16/BF16 weights already
//! rounded to that type, as in llama.cpp. Sums are accumulated in f64 like ggml's scalar code.

use super::{Activations, GgmlType};
use half::{bf16, f16};

#[inline]
fn weight_at(t: GgmlType, w: &[u8], i: usize) -> f32 {
    match t {
        GgmlType::F32 => f32::from_le_bytes([w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]]),
        GgmlType::F16 => f16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32(),
        GgmlType::BF16 => bf16::from_bits(u16::from_le_bytes([w[2 * i], w[2 * i + 1]])).to_f32(),
        _ => unreachable!(),
    }
}

pub fn dequantize(t: GgmlType, row: &[u8], out: &mut [f32]) {
    for (i, x) in out.iter_mut().enumerate() {
        *x = weight_at(t, row, i);
    }
}

pub fn vec_dot(t: GgmlType, w: &[u8], acts: &Activations, r: usize) -> f32 {
    let mut sum = 0.0f64;
    match acts {
        Activations::F32 { data, n } => {
            for (i, &a) in data[r * n..(r + 1) * n].iter().enumerate() {
                sum += (weight_at(t, w, i) * a) as f64;
            }
        }
        Activations::F16 { data, n } => {
            for (i, &a) in data[r * n..(r + 1) * n].iter().enumerate() {
                sum += (weight_at(t, w, i) * f16::from_bits(a).to_f32()) as f64;
            }
        }
        Activations::BF16 { data, n } => {
            for (i, &a) in data[r * n..(r + 1) * n].iter().enumerate() {
                sum += (weight_at(t, w, i) * bf16::from_bits(a).to_f32()) as f64;
            }
        }
        _ => panic!("activation format does not match weight type {t:?}"),
    }
    sum as f32
}
