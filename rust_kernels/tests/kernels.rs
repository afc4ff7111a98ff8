//! Rust-side kernel tests: the AVX2 path agrees with the scalar reference for every weight type,
//! activation quantizers keep llama.cpp's invariants, and matmul rows are batch-invariant.

use _native::matmul::{matmul_many, Weight};
use _native::quant::act::{quantize_q8_0, quantize_q8k};
use _native::quant::{dequantize_row, vec_dot, vec_dot_scalar, Activations, GgmlType};
use _native::simd;
use rand::{Rng, SeedableRng};

const TYPES: [GgmlType; 11] = [
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
fn random_row(t: GgmlType, cols: usize, rng: &mut impl Rng) -> Vec<u8> {
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

fn cols_for(t: GgmlType) -> usize {
    match t.block_len() {
        1 => 77,
        32 => 160,
        _ => 768,
    }
}

#[test]
fn simd_path_agrees_with_scalar_reference() {
    if !simd::use_avx2() {
        eprintln!("no AVX2 on this CPU: only the scalar path exists");
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for t in TYPES {
        let cols = cols_for(t);
        for trial in 0..20 {
            let w = random_row(t, cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            let acts = Activations::quantize(t.act_format(), &x, cols);
            let (fast, slow) = (vec_dot(t, &w, &acts, 0), vec_dot_scalar(t, &w, &acts, 0));
            let mut deq = vec![0.0f32; cols];
            dequantize_row(t, &w, &mut deq);
            let scale: f32 = deq.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum::<f32>() + 1e-6;
            assert!(
                (fast - slow).abs() / scale < 1e-5,
                "{t:?} trial {trial}: avx2 {fast} vs scalar {slow}"
            );
        }
    }
}

#[test]
fn q8_0_quantizer_rounds_half_to_even_and_stores_f16_scale() {
    let mut x = [0.0f32; 32];
    x[0] = 127.0; // amax -> id = 1
    x[1] = 2.5; // tie -> 2
    x[2] = 3.5; // tie -> 4
    x[3] = -2.5; // tie -> -2
    let b = quantize_q8_0(&x);
    assert_eq!(&b.qs[..4], &[127, 2, 4, -2]);
    assert_eq!(b.d, 1.0);
    let zero = quantize_q8_0(&[0.0; 32]);
    assert!(zero.qs.iter().all(|&q| q == 0) && zero.d == 0.0);
}

#[test]
fn q8k_quantizer_keeps_sign_of_max_and_block_sums() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let x: Vec<f32> = (0..256).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    let b = quantize_q8k(&x);
    for k in 0..16 {
        let s: i16 = b.qs[16 * k..16 * k + 16].iter().map(|&q| q as i16).sum();
        assert_eq!(s, b.bsums[k]);
    }
    let imax = (0..256)
        .max_by(|&i, &j| x[i].abs().total_cmp(&x[j].abs()))
        .unwrap();
    assert_eq!(b.qs[imax].unsigned_abs(), 127);
    for (q, v) in b.qs.iter().zip(&x) {
        assert!((*q as f32 * b.d - v).abs() <= b.d.abs() * 0.5 + 1e-6);
    }
}

#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for t in TYPES {
        let (rows, cols, m) = (45, cols_for(t), 6);
        let data: Vec<u8> = (0..rows)
            .flat_map(|_| random_row(t, cols, &mut rng))
            .collect();
        let w = Weight {
            t,
            data: &data,
            rows,
            cols,
        };
        let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
        let mut all = vec![0.0f32; m * rows];
        matmul_many(&[w], &x, m, &mut [&mut all], None);
        for r in 0..m {
            let mut one = vec![0.0f32; rows];
            matmul_many(&[w], &x[r * cols..(r + 1) * cols], 1, &mut [&mut one], None);
            assert_eq!(
                one.as_slice(),
                &all[r * rows..(r + 1) * rows],
                "{t:?} row {r}"
            );
        }
    }
}
