//! Rust-side matmul tests: rows are batch-invariant (every output row equals the same row
//! multiplied alone), and the register blocks and weight-row runs equal the one-row dot, bit for bit.

mod common;

use _native::matmul::{matmul_many, Weight};
use _native::quant::{
    has_row_runs, vec_dot, vec_dot_act_rows, vec_dot_act_rows_run, vec_dot_scalar, Activations,
    GgmlType,
};
use _native::simd;
use common::{cols_for, random_row, RandomBatch, FORCE, TYPES};
use rand::{Rng, SeedableRng};

#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let _guard = FORCE.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for t in TYPES {
        assert_rows_match_one_row_results(t, 45, cols_for(t), 6, &mut rng);
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
