//! What the kernel test files share: random weights of every GGUF type, the lock around the
//! process-wide SIMD path, and a random weight with a batch of activation rows.

use _native::matmul::{matmul_many, Weight};
use _native::quant::GgmlType;
use rand::Rng;
use std::sync::Mutex;

/// Tests that force the scalar path (process-wide) hold this; tests reading `use_avx2` take it too.
pub static FORCE: Mutex<()> = Mutex::new(());

pub const TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Random weight bytes with sane f16 scales where each format keeps them.
pub fn random_row(t: GgmlType, cols: usize, rng: &mut impl Rng) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..t.row_bytes(cols)).map(|_| rng.gen()).collect();
    let small = |rng: &mut dyn rand::RngCore| {
        half::f16::from_f32(rng.gen_range(0.001f32..0.02)).to_le_bytes()
    };
    match t {
        GgmlType::F32 => {
            for c in bytes.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.gen_range(-1.0f32..1.0).to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for c in bytes.chunks_exact_mut(2) {
                c.copy_from_slice(&half::f16::from_f32(rng.gen_range(-1.0f32..1.0)).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for c in bytes.chunks_exact_mut(2) {
                c.copy_from_slice(&half::bf16::from_f32(rng.gen_range(-1.0f32..1.0)).to_le_bytes());
            }
        }
        GgmlType::Q6K => {
            for b in bytes.chunks_exact_mut(210) {
                b[208..210].copy_from_slice(&small(rng));
            }
        }
        _ => {
            let (bb, two_scales) = (
                t.block_bytes(),
                !matches!(t, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0),
            );
            for b in bytes.chunks_exact_mut(bb) {
                b[0..2].copy_from_slice(&small(rng));
                if two_scales {
                    b[2..4].copy_from_slice(&small(rng));
                }
            }
        }
    }
    bytes
}

pub fn cols_for(t: GgmlType) -> usize {
    match t.block_len() {
        1 => 77,
        32 => 160,
        _ => 768,
    }
}

/// A random `rows x cols` weight of type `t` and `m` random activation rows.
pub struct RandomBatch {
    pub t: GgmlType,
    pub data: Vec<u8>,
    pub x: Vec<f32>,
    pub rows: usize,
    pub cols: usize,
    pub m: usize,
}

impl RandomBatch {
    pub fn new(t: GgmlType, rows: usize, cols: usize, m: usize, rng: &mut impl Rng) -> Self {
        let data = (0..rows).flat_map(|_| random_row(t, cols, rng)).collect();
        let x = (0..m * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        Self {
            t,
            data,
            x,
            rows,
            cols,
            m,
        }
    }

    pub fn weight(&self) -> Weight<'_> {
        Weight {
            t: self.t,
            data: &self.data,
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// `matmul_many` of all `m` rows in one call (m x rows outputs).
    pub fn product(&self) -> Vec<f32> {
        let mut all = vec![0.0f32; self.m * self.rows];
        matmul_many(&[self.weight()], &self.x, self.m, &mut [&mut all], None);
        all
    }
}
