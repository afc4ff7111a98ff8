//! Rust-side kernel tests: the AVX2 path agrees with the scalar reference for every weight type,
//! activation quantizers keep llama.cpp's invariants, and matmul rows are batch-invariant.

use _native::matmul::{matmul_many, Weight};
use _native::quant::act::{quantize_q8_0, quantize_q8_0_scalar, quantize_q8k, quantize_q8k_scalar};
use _native::quant::{
    dequantize_row, has_row_runs, vec_dot, vec_dot_act_rows, vec_dot_act_rows_run, vec_dot_scalar,
    Activations, GgmlType,
};
use _native::simd;
use rand::{Rng, SeedableRng};
use std::sync::Mutex;

/// Tests that force the scalar path (process-wide) hold this; tests reading `use_avx2` take it too.
static FORCE: Mutex<()> = Mutex::new(());

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

#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for t in TYPES {
        assert_rows_match_one_row_results(t, 45, cols_for(t), 6, &mut rng);
    }
}

/// A random `rows x cols` weight of type `t` and `m` random activation rows.
struct RandomBatch {
    t: GgmlType,
    data: Vec<u8>,
    x: Vec<f32>,
    rows: usize,
    cols: usize,
    m: usize,
}

impl RandomBatch {
    fn new(t: GgmlType, rows: usize, cols: usize, m: usize, rng: &mut impl Rng) -> Self {
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

    fn weight(&self) -> Weight<'_> {
        Weight {
            t: self.t,
            data: &self.data,
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// `matmul_many` of all `m` rows in one call (m x rows outputs).
    fn product(&self) -> Vec<f32> {
        let mut all = vec![0.0f32; self.m * self.rows];
        matmul_many(&[self.weight()], &self.x, self.m, &mut [&mut all], None);
        all
    }
}

/// `matmul_many` of `m` random activation rows against a random `rows x cols` weight: every
/// output row equals the same row multiplied alone.
fn assert_rows_match_one_row_results(
    t: GgmlType,
    rows: usize,
    cols: usize,
    m: usize,
    rng: &mut impl Rng,
) {
    let b = RandomBatch::new(t, rows, cols, m, rng);
    let all = b.product();
    for r in 0..m {
        let mut one = vec![0.0f32; rows];
        let x = &b.x[r * cols..(r + 1) * cols];
        matmul_many(&[b.weight()], x, 1, &mut [&mut one], None);
        assert_eq!(
            one.as_slice(),
            &all[r * rows..(r + 1) * rows],
            "{t:?} row {r}"
        );
    }
}

/// Every output of one weight row against activation rows `r0 .. r0+R` (`vec_dot_act_rows`, the
/// register blocks `matmul_many` takes) equals the one-row `vec_dot`, bit for bit.
fn check_rows<const R: usize>(t: GgmlType, rng: &mut impl Rng) {
    let cols = cols_for(t);
    let row = random_row(t, cols, rng);
    let m = R + 2;
    let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
    let acts = Activations::quantize(t.act_format(), &x, cols);
    for r0 in [0, 2] {
        let out = vec_dot_act_rows::<R>(t, &row, &acts.rows::<R>(r0));
        for (i, v) in out.iter().enumerate() {
            let one = vec_dot(t, &row, &acts, r0 + i);
            assert_eq!(
                v.to_bits(),
                one.to_bits(),
                "{t:?} {R} rows: act row {}",
                r0 + i
            );
        }
    }
}

/// `vec_dot_act_rows_run` over runs of weight rows (whole, partial, one row; with and without
/// prefetching): it takes a run exactly where `has_row_runs` says so, and then every output equals
/// the one-row `vec_dot`, bit for bit.
fn check_runs<const R: usize>(t: GgmlType, rng: &mut impl Rng) {
    let cols = cols_for(t);
    let rb = t.row_bytes(cols);
    let data: Vec<u8> = (0..9).flat_map(|_| random_row(t, cols, rng)).collect();
    let x: Vec<f32> = (0..R * cols).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
    let acts = Activations::quantize(t.act_format(), &x, cols);
    for (n0, len, ahead) in [(0, 9, None), (1, 7, Some(4096)), (8, 1, Some(64))] {
        let mut out = vec![[f32::NAN; R]; len];
        let taken = vec_dot_act_rows_run(t, &data, rb, n0, ahead, &acts.rows::<R>(0), &mut out);
        assert_eq!(taken, has_row_runs(t, R), "{t:?} {R} rows");
        if !taken {
            assert!(
                out.iter().flatten().all(|v| v.is_nan()),
                "{t:?}: a declined run wrote"
            );
            continue;
        }
        for (j, vs) in out.iter().enumerate() {
            let row = &data[(n0 + j) * rb..(n0 + j + 1) * rb];
            for (i, v) in vs.iter().enumerate() {
                let one = vec_dot(t, row, &acts, i);
                assert_eq!(
                    v.to_bits(),
                    one.to_bits(),
                    "{t:?} {R} rows: weight row {}",
                    n0 + j
                );
            }
        }
    }
}

#[test]
fn row_blocks_are_bit_identical_to_one_row_dot() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    for t in TYPES {
        for _ in 0..4 {
            check_rows::<1>(t, &mut rng);
            check_rows::<2>(t, &mut rng);
            check_rows::<3>(t, &mut rng);
            check_rows::<4>(t, &mut rng);
            check_rows::<8>(t, &mut rng);
            check_runs::<1>(t, &mut rng);
            check_runs::<3>(t, &mut rng);
            check_runs::<4>(t, &mut rng);
            check_runs::<8>(t, &mut rng);
        }
    }
}

/// Activations at the ends of the i8 range (|q| = 127 everywhere): the largest 16-bit
/// intermediate sums, still equal to the one-row results.
#[test]
fn row_blocks_match_one_row_dot_on_extreme_activations() {
    fn check<const R: usize>(t: GgmlType, rows: &[Vec<u8>], acts: &Activations) {
        for row in rows {
            let out = vec_dot_act_rows::<R>(t, row, &acts.rows::<R>(0));
            for (r, v) in out.iter().enumerate() {
                assert_eq!(
                    v.to_bits(),
                    vec_dot(t, row, acts, r).to_bits(),
                    "{t:?} {R} rows: act row {r}"
                );
            }
        }
    }
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    for t in TYPES {
        let cols = cols_for(t);
        let rows: Vec<Vec<u8>> = (0..4).map(|_| random_row(t, cols, &mut rng)).collect();
        // One huge value per block: every other quant is small; all-equal rows hit 127 everywhere.
        let mut x: Vec<f32> = (0..8 * cols)
            .map(|i| if i % 3 == 0 { -9.0 } else { 9.0 })
            .collect();
        x[..cols].fill(1.0);
        let acts = Activations::quantize(t.act_format(), &x, cols);
        check::<4>(t, &rows, &acts);
        check::<8>(t, &rows, &acts);
    }
}

/// Odd shapes through `matmul_many`: row counts that leave partial tasks of weight rows and
/// partial register blocks of activation rows, every batch size of a decode step (1..=16) and two
/// prompt sizes, several weights in one call, every row equal to its one-row result.
#[test]
fn matmul_odd_shapes_match_one_row_results() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    for t in TYPES {
        let cols = cols_for(t);
        let shapes = [1usize, 3, 4, 5, 67, 130];
        let datas: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&rows| {
                (0..rows)
                    .flat_map(|_| random_row(t, cols, &mut rng))
                    .collect()
            })
            .collect();
        let ws: Vec<Weight> = shapes
            .iter()
            .zip(&datas)
            .map(|(&rows, data)| Weight {
                t,
                data,
                rows,
                cols,
            })
            .collect();
        // 1..=16: the streaming (decode) path's register blocks and remainders; 17, 21: several
        // 16-row windows, as prompts take.
        for m in (1usize..=17).chain([21]) {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let mut bufs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; m * w.rows]).collect();
            let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            matmul_many(&ws, &x, m, &mut outs, None);
            let acts = Activations::quantize(t.act_format(), &x, cols);
            for (w, buf) in ws.iter().zip(&bufs) {
                for r in 0..m {
                    for n in 0..w.rows {
                        let one = vec_dot(t, w.row(n), &acts, r);
                        assert_eq!(
                            buf[r * w.rows + n].to_bits(),
                            one.to_bits(),
                            "{t:?} {}x{cols} m={m} row {r} out {n}",
                            w.rows
                        );
                    }
                }
            }
        }
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

/// The scalar path (forced) keeps batch invariance too.
#[test]
fn scalar_path_matmul_rows_do_not_depend_on_the_batch() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    simd::set_force_scalar(true);
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for t in TYPES {
        let (rows, cols, m) = (9, cols_for(t), 6);
        let b = RandomBatch::new(t, rows, cols, m, &mut rng);
        let all = b.product();
        let acts = Activations::quantize(t.act_format(), &b.x, cols);
        for r in 0..m {
            for n in 0..rows {
                let one = vec_dot_scalar(t, b.weight().row(n), &acts, r);
                assert_eq!(all[r * rows + n].to_bits(), one.to_bits(), "{t:?} row {r}");
            }
        }
    }
    simd::set_force_scalar(false);
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

/// A prompt wide enough that its activation rows come in several L2-sized groups (`matmul.rs`,
/// `act_group_rows`: 16 rows per group at 16384 columns), including a short last group: every
/// row equal to its one-row result.
#[test]
fn matmul_prompt_groups_match_one_row_results() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for t in [GgmlType::Q8_0, GgmlType::Q4K] {
        // 72 rows of 16384 columns: ~1.3 MB of activations, past GROUP_MIN_BYTES
        assert_rows_match_one_row_results(t, 5, 16384, 72, &mut rng);
    }
}
