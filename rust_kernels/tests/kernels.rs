//! Rust-side kernel tests: the AVX2 (and AVX-512 VNNI) paths agree with the scalar reference for
//! every weight type, and the activation quantizers keep llama.cpp's invariants.

mod common;

use _native::quant::act::{quantize_q8_0, quantize_q8_0_scalar, quantize_q8k, quantize_q8k_scalar};
use _native::quant::{dequantize_row, vec_dot, vec_dot_scalar, Activations, GgmlType};
use _native::simd;
use common::{cols_for, random_row, RandomBatch, FORCE, TYPES};
use rand::{Rng, SeedableRng};

#[test]
fn simd_path_agrees_with_scalar_reference() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
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
            if t.block_len() == 256 {
                // K-quants: the scalar reference emulates llama.cpp's AVX2 lanes and FMA order.
                assert_eq!(
                    fast.to_bits(),
                    slow.to_bits(),
                    "{t:?} trial {trial}: avx2 {fast} vs scalar {slow}"
                );
            }
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

/// K-quant dots: AVX2 and scalar agree bit for bit on activations at very different scales with
/// heavy tails (large integer lanes, float lanes of mixed signs) and on long rows.
#[test]
fn kquant_simd_and_scalar_are_bit_identical() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    if !simd::use_avx2() {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for t in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        for trial in 0..60 {
            let cols = 256 * rng.gen_range(1..=12);
            let w = random_row(t, cols, &mut rng);
            let scale = [1e-3f32, 1.0, 50.0][trial % 3];
            let x: Vec<f32> = (0..cols)
                .map(|_| scale * rng.gen_range(-1.0f32..1.0).powi(5))
                .collect();
            let acts = Activations::quantize(t.act_format(), &x, cols);
            let (fast, slow) = (vec_dot(t, &w, &acts, 0), vec_dot_scalar(t, &w, &acts, 0));
            assert_eq!(
                fast.to_bits(),
                slow.to_bits(),
                "{t:?} trial {trial}: {fast} vs {slow}"
            );
        }
    }
}

#[test]
fn q8_0_quantizer_rounds_half_to_even_and_stores_f16_scale() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
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
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
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

/// The AVX-512 VNNI form of the integer-quant kernels gives the AVX2 form's bits: every integer
/// format, 1-16 activation rows per step and 64-row prompts, activations with heavy tails (large
/// integer lanes of both signs) and random weight bytes (Q8_0 quants of -128 included).
#[test]
fn vnni_path_equals_avx2_bit_for_bit() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    if !simd::use_vnni() {
        eprintln!(
            "no AVX-512 VNNI on this CPU: only the AVX2 form runs (path {})",
            simd::path_name()
        );
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    for t in TYPES.into_iter().filter(|t| t.block_len() > 1) {
        for m in [1, 2, 3, 4, 5, 8, 11, 16, 64] {
            let cols = cols_for(t) * rng.gen_range(1..=3);
            let mut b = RandomBatch::new(t, 7, cols, m, &mut rng);
            let scale = [1e-3f32, 1.0, 50.0][m % 3];
            b.x.iter_mut().for_each(|v| *v = scale * (*v / 2.0).powi(5));
            let vnni = b.product();
            simd::set_ceiling(simd::Path::Avx2);
            let avx2 = b.product();
            simd::set_ceiling(simd::Path::Vnni);
            for (i, (a, v)) in avx2.iter().zip(&vnni).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    v.to_bits(),
                    "{t:?} m={m} cols={cols} output {i}: avx2 {a} vs vnni {v}"
                );
            }
        }
    }
}

/// The AVX2 activation quantizers equal the scalar ones bit for bit, including ties, zeros,
/// sign of the maximum, equal |max| of both signs, and non-finite inputs (scalar fallback).
#[test]
fn simd_quantizers_match_scalar() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mut inputs: Vec<Vec<f32>> = Vec::new();
    for _ in 0..200 {
        let scale = 10f32.powi(rng.gen_range(-6..4));
        inputs.push(
            (0..256)
                .map(|_| rng.gen_range(-1.0f32..1.0) * scale)
                .collect(),
        );
    }
    // Exact ties after scaling: integers and halves with max 127.
    inputs.push(
        (0..256)
            .map(|i| ((i % 255) as f32 - 127.0) / 2.0 + 0.0)
            .collect(),
    );
    inputs.push((0..256).map(|i| (i as f32 - 128.0) * 0.5).collect());
    let mut both = vec![0.25f32; 256];
    both[7] = -3.0;
    both[100] = 3.0;
    inputs.push(both.clone());
    both[7] = 3.0;
    both[100] = -3.0;
    inputs.push(both);
    inputs.push(vec![0.0; 256]);
    inputs.push(vec![-0.0; 256]);
    let mut special = vec![0.5f32; 256];
    special[3] = f32::NAN;
    inputs.push(special.clone());
    special[3] = f32::INFINITY;
    inputs.push(special.clone());
    special[3] = 1e-40; // subnormal
    inputs.push(special);
    for x in &inputs {
        let (a, b) = (quantize_q8k(x), quantize_q8k_scalar(x));
        assert_eq!(a.d.to_bits(), b.d.to_bits());
        assert_eq!(a.qs, b.qs);
        assert_eq!(a.bsums, b.bsums);
        for c in x.chunks_exact(32) {
            let (a, b) = (quantize_q8_0(c), quantize_q8_0_scalar(c));
            assert_eq!(a.d.to_bits(), b.d.to_bits());
            assert_eq!(a.qs, b.qs);
        }
    }
}
