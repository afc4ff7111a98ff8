//! Activation rows converted to the format a weight type's dot product consumes (llama.cpp's
//! `vec_dot_type`). Scales are kept as f32 holding the exact value llama.cpp would use
//! (already rounded to f16 where llama.cpp stores an f16).

pub use super::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_0Biased, BlockQ8_1};
use super::ActFormat;
use half::{bf16, f16};
use rayon::prelude::*;

/// `rows` activation rows of `n` elements each, converted to one format.
pub enum Activations {
    F32 {
        data: Vec<f32>,
        n: usize,
    },
    F16 {
        data: Vec<u16>,
        n: usize,
    },
    BF16 {
        data: Vec<u16>,
        n: usize,
    },
    Q8_0 {
        blocks: Vec<BlockQ8_0>,
        per_row: usize,
        /// The blocks biased (`BlockQ8_0Biased`), for the integer kernels' VNNI form of
        /// `BIASED_MIN_ROWS` rows or more; empty where none will read them (fewer rows, or no
        /// AVX-512 VNNI).
        biased: Vec<BlockQ8_0Biased>,
    },
    Q8_1 {
        blocks: Vec<BlockQ8_1>,
        per_row: usize,
    },
    Q8K {
        blocks: Vec<BlockQ8K>,
        per_row: usize,
    },
}

/// Fewest activation rows for which the VNNI kernels read biased Q8_0 blocks: at two rows the
/// longer chain to each block's first integer sum (`int_dots::biased_sums_start`) cost more than
/// the sign flips it saves (`decode_matmul` Q8_0 8192 x 640, one thread, b/a: 2 rows 1.02-1.03,
/// 3 rows 0.95, 4 rows 0.97-1.00, 8 rows 0.91-0.93).
pub const BIASED_MIN_ROWS: usize = 3;

/// Activation rows `r0 .. r0+R` of one format as slices, resolved once and then dotted with many
/// weight rows (a decode step's weight stream, a prompt task's rows); `acts` / `r0` serve the
/// portable path.
pub struct ActRows<'a, const R: usize> {
    pub acts: &'a Activations,
    pub r0: usize,
    pub rows: RowSlices<'a, R>,
}

pub enum RowSlices<'a, const R: usize> {
    F32([&'a [f32]; R]),
    F16([&'a [u16]; R]),
    BF16([&'a [u16]; R]),
    /// The blocks, and their biased form where kept and R >= `BIASED_MIN_ROWS`.
    Q8_0([&'a [BlockQ8_0]; R], Option<[&'a [BlockQ8_0Biased]; R]>),
    Q8_1([&'a [BlockQ8_1]; R]),
    Q8K([&'a [BlockQ8K]; R]),
}

impl Activations {
    /// Rows `r0 .. r0+R` as slices (see `ActRows`).
    pub fn rows<const R: usize>(&self, r0: usize) -> ActRows<'_, R> {
        let rows = match self {
            Self::F32 { data, n } => {
                RowSlices::F32(std::array::from_fn(|i| row_of(data, *n, r0 + i)))
            }
            Self::F16 { data, n } => {
                RowSlices::F16(std::array::from_fn(|i| row_of(data, *n, r0 + i)))
            }
            Self::BF16 { data, n } => {
                RowSlices::BF16(std::array::from_fn(|i| row_of(data, *n, r0 + i)))
            }
            Self::Q8_0 {
                blocks,
                per_row,
                biased,
            } => RowSlices::Q8_0(
                std::array::from_fn(|i| row_of(blocks, *per_row, r0 + i)),
                (R >= BIASED_MIN_ROWS && !biased.is_empty())
                    .then(|| std::array::from_fn(|i| row_of(biased, *per_row, r0 + i))),
            ),
            Self::Q8_1 { blocks, per_row } => {
                RowSlices::Q8_1(std::array::from_fn(|i| row_of(blocks, *per_row, r0 + i)))
            }
            Self::Q8K { blocks, per_row } => {
                RowSlices::Q8K(std::array::from_fn(|i| row_of(blocks, *per_row, r0 + i)))
            }
        };
        ActRows {
            acts: self,
            r0,
            rows,
        }
    }

    pub fn q8_0_row(&self, r: usize) -> &[BlockQ8_0] {
        match self {
            Self::Q8_0 {
                blocks, per_row, ..
            } => row_of(blocks, *per_row, r),
            _ => unreachable!(),
        }
    }
    pub fn q8_1_row(&self, r: usize) -> &[BlockQ8_1] {
        match self {
            Self::Q8_1 { blocks, per_row } => row_of(blocks, *per_row, r),
            _ => unreachable!(),
        }
    }
    pub fn q8k_row(&self, r: usize) -> &[BlockQ8K] {
        match self {
            Self::Q8K { blocks, per_row } => row_of(blocks, *per_row, r),
            _ => unreachable!(),
        }
    }

    /// Convert `x` (rows of `n` floats, row-major) into `fmt`.
    pub fn quantize(fmt: ActFormat, x: &[f32], n: usize) -> Self {
        let rows = x.len() / n;
        // Rows are independent; parallel only when there is enough work to pay for the dispatch.
        let parallel = rows * n >= 1 << 16;
        match fmt {
            ActFormat::F32 => Self::F32 {
                data: x.to_vec(),
                n,
            },
            ActFormat::F16 => Self::F16 {
                data: x.iter().map(|&v| f16::from_f32(v).to_bits()).collect(),
                n,
            },
            ActFormat::BF16 => Self::BF16 {
                data: x.iter().map(|&v| bf16::from_f32(v).to_bits()).collect(),
                n,
            },
            ActFormat::Q8_0 => {
                let blocks = map_blocks(x, 32, parallel, quantize_q8_0);
                let biased = if rows >= BIASED_MIN_ROWS && crate::simd::use_vnni() {
                    blocks
                        .iter()
                        .map(|b| BlockQ8_0Biased {
                            d: b.d,
                            u: b.qs.map(|q| q as u8 ^ 0x80),
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                Self::Q8_0 {
                    blocks,
                    per_row: n / 32,
                    biased,
                }
            }
            ActFormat::Q8_1 => Self::Q8_1 {
                blocks: map_blocks(x, 32, parallel, quantize_q8_1),
                per_row: n / 32,
            },
            ActFormat::Q8K => Self::Q8K {
                blocks: map_blocks(x, 256, parallel, quantize_q8k),
                per_row: n / 256,
            },
        }
    }
}

fn map_blocks<B: Send>(x: &[f32], len: usize, parallel: bool, f: fn(&[f32]) -> B) -> Vec<B> {
    if parallel {
        x.par_chunks_exact(len).map(f).collect()
    } else {
        x.chunks_exact(len).map(f).collect()
    }
}

fn abs_max(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// `quantize_q8_0_scalar` on the AVX2 path where it applies (bit-identical).
pub fn quantize_q8_0(x: &[f32]) -> BlockQ8_0 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() && x.len() == 32 {
        // SAFETY: use_avx2() is true only when the CPU has AVX2, FMA and F16C (run-time
        // detection); `x` holds the 32 values the kernel loads (checked here, asserted there).
        if let Some(b) = unsafe { super::act_avx2::quantize_q8_0(x) } {
            return b;
        }
    }
    quantize_q8_0_scalar(x)
}

/// `quantize_q8k_scalar` on the AVX2 path where it applies (bit-identical).
pub fn quantize_q8k(x: &[f32]) -> BlockQ8K {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::use_avx2() && x.len() == 256 {
        // SAFETY: use_avx2() is true only when the CPU has AVX2, FMA and F16C (run-time
        // detection); `x` holds the 256 values the kernel loads (checked here, asserted there).
        if let Some(b) = unsafe { super::act_avx2::quantize_q8k(x) } {
            return b;
        }
    }
    quantize_q8k_scalar(x)
}

/// llama.cpp's x86 Q8_0 quantizer: `id = 127/amax`, round half to even, `d` rounded to f16.
pub fn quantize_q8_0_scalar(x: &[f32]) -> BlockQ8_0 {
    let amax = abs_max(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    BlockQ8_0 {
        d: f16::from_f32(d).to_f32(),
        qs,
    }
}

/// Q8_1: Q8_0 plus `s = f16(d * sum(q))` with the unrounded `d`.
pub fn quantize_q8_1(x: &[f32]) -> BlockQ8_1 {
    let amax = abs_max(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
        sum += *q as i32;
    }
    BlockQ8_1 {
        d: f16::from_f32(d).to_f32(),
        s: f16::from_f32(d * sum as f32).to_f32(),
        qs,
    }
}

/// llama.cpp's reference Q8_K quantizer: signed max, `iscale = -127/max`, `d = 1/iscale` (f32).
pub fn quantize_q8k_scalar(x: &[f32]) -> BlockQ8K {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let mut b = BlockQ8K {
        d: 0.0,
        qs: [0; 256],
        bsums: [0; 16],
        psums: [0; 8],
    };
    if amax == 0.0 {
        return b;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    for (k, s) in b.bsums.iter_mut().enumerate() {
        *s = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i16).sum();
    }
    b.psums = std::array::from_fn(|k| b.bsums[2 * k] + b.bsums[2 * k + 1]);
    b.d = 1.0 / iscale;
    b
}

fn row_of<T>(data: &[T], per_row: usize, r: usize) -> &[T] {
    &data[r * per_row..(r + 1) * per_row]
}
