//! MoE FFN kernel: agreement with a plain f64 reference on F32 weights, batch invariance on
//! quantized weights, and fused gate_up == separate gate and up.

use _native::matmul::Weight;
use _native::moe::{moe_forward, route, Experts, Moe, Routing, SharedExpert};
use _native::quant::GgmlType;
use rand::{Rng, SeedableRng};

const N_EMBD: usize = 64;
const N_FF: usize = 32;
const N_SH: usize = 64;
const N_EXPERT: usize = 6;
const N_USED: usize = 2;

/// Random rows of `cols` values: F32 in [-s, s], or Q8_0 blocks with small f16 scales.
fn random_weight(t: GgmlType, rows: usize, cols: usize, s: f32, rng: &mut impl Rng) -> Vec<u8> {
    match t {
        GgmlType::F32 => (0..rows * cols)
            .flat_map(|_| rng.gen_range(-s..s).to_le_bytes())
            .collect(),
        GgmlType::Q8_0 => {
            let mut out = Vec::new();
            for _ in 0..rows * cols / 32 {
                out.extend(
                    half::f16::from_f32(s / 127.0 * rng.gen_range(0.5f32..1.0)).to_le_bytes(),
                );
                out.extend((0..32).map(|_| rng.gen::<i8>() as u8));
            }
            out
        }
        _ => unreachable!(),
    }
}

struct Bytes {
    router: Vec<u8>,
    gate: Vec<u8>,
    up: Vec<u8>,
    gate_up: Vec<u8>,
    down: Vec<u8>,
    sh: [Vec<u8>; 4],
}

fn bytes(t: GgmlType, seed: u64) -> Bytes {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let s = 1.0 / (N_EMBD as f32).sqrt();
    let gate = random_weight(t, N_EXPERT * N_FF, N_EMBD, s, &mut rng);
    let up = random_weight(t, N_EXPERT * N_FF, N_EMBD, s, &mut rng);
    let rb = t.row_bytes(N_EMBD);
    let mut gate_up = Vec::new();
    for e in 0..N_EXPERT {
        gate_up.extend_from_slice(&gate[e * N_FF * rb..(e + 1) * N_FF * rb]);
        gate_up.extend_from_slice(&up[e * N_FF * rb..(e + 1) * N_FF * rb]);
    }
    Bytes {
        router: random_weight(GgmlType::F32, N_EXPERT, N_EMBD, 3.0 * s, &mut rng),
        gate,
        up,
        gate_up,
        down: random_weight(t, N_EXPERT * N_EMBD, N_FF, s, &mut rng),
        sh: [
            random_weight(t, N_SH, N_EMBD, s, &mut rng),
            random_weight(t, N_SH, N_EMBD, s, &mut rng),
            random_weight(t, N_EMBD, N_SH, s, &mut rng),
            random_weight(GgmlType::F32, 1, N_EMBD, s, &mut rng),
        ],
    }
}

fn w(t: GgmlType, data: &[u8], rows: usize, cols: usize) -> Weight<'_> {
    Weight {
        t,
        data,
        rows,
        cols,
    }
}

fn moe(t: GgmlType, b: &Bytes, fused: bool) -> Moe<'_> {
    let routing = Routing {
        n_used: N_USED,
        norm: true,
        scale: 0.0,
    };
    let (gate, up) = if fused {
        let all = w(t, &b.gate_up, 2 * N_EXPERT * N_FF, N_EMBD);
        (
            Experts {
                all,
                n_expert: N_EXPERT,
                offset: 0,
                rows: N_FF,
            },
            Experts {
                all,
                n_expert: N_EXPERT,
                offset: N_FF,
                rows: N_FF,
            },
        )
    } else {
        (
            Experts::whole(w(t, &b.gate, N_EXPERT * N_FF, N_EMBD), N_EXPERT),
            Experts::whole(w(t, &b.up, N_EXPERT * N_FF, N_EMBD), N_EXPERT),
        )
    };
    Moe {
        router: w(GgmlType::F32, &b.router, N_EXPERT, N_EMBD),
        gate,
        up,
        down: Experts::whole(w(t, &b.down, N_EXPERT * N_EMBD, N_FF), N_EXPERT),
        routing,
        shared: Some(SharedExpert {
            gate: w(t, &b.sh[0], N_SH, N_EMBD),
            up: w(t, &b.sh[1], N_SH, N_EMBD),
            down: w(t, &b.sh[2], N_EMBD, N_SH),
            gate_inp: Some(w(GgmlType::F32, &b.sh[3], 1, N_EMBD)),
        }),
    }
}

fn input(m: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..m * N_EMBD)
        .map(|_| rng.gen_range(-1.5f32..1.5))
        .collect()
}

fn run(moe: &Moe, x: &[f32]) -> Vec<f32> {
    let m = x.len() / N_EMBD;
    let mut out = vec![0.0; m * N_EMBD];
    moe_forward(moe, x, m, &mut out, None);
    out
}

fn f32s(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
        .collect()
}

fn matvec(w: &[f64], cols: usize, x: &[f64]) -> Vec<f64> {
    w.chunks_exact(cols)
        .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn swiglu(g: &[f64], u: &[f64]) -> Vec<f64> {
    g.iter()
        .zip(u)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

#[test]
fn f32_weights_match_f64_reference() {
    let b = bytes(GgmlType::F32, 1);
    let m = moe(GgmlType::F32, &b, false);
    let x = input(5, 2);
    let got = run(&m, &x);
    let (router, gate, up, down) = (f32s(&b.router), f32s(&b.gate), f32s(&b.up), f32s(&b.down));
    let sh: Vec<Vec<f64>> = b.sh.iter().map(|s| f32s(s)).collect();
    for (r, xr) in x.chunks_exact(N_EMBD).enumerate() {
        let xr: Vec<f64> = xr.iter().map(|&v| v as f64).collect();
        let logits: Vec<f32> = matvec(&router, N_EMBD, &xr)
            .iter()
            .map(|&v| v as f32)
            .collect();
        let (ids, weights) = route(&logits, m.routing);
        let mut want = vec![0.0f64; N_EMBD];
        for (&e, &wt) in ids.iter().zip(&weights) {
            let e = e as usize;
            let span = |t: &[f64], rows: usize, cols: usize| {
                t[e * rows * cols..(e + 1) * rows * cols].to_vec()
            };
            let g = matvec(&span(&gate, N_FF, N_EMBD), N_EMBD, &xr);
            let u = matvec(&span(&up, N_FF, N_EMBD), N_EMBD, &xr);
            let y = matvec(&span(&down, N_EMBD, N_FF), N_FF, &swiglu(&g, &u));
            for (o, v) in want.iter_mut().zip(y) {
                *o += wt as f64 * v;
            }
        }
        let gate_sh = 1.0 / (1.0 + (-matvec(&sh[3], N_EMBD, &xr)[0]).exp());
        let h = swiglu(&matvec(&sh[0], N_EMBD, &xr), &matvec(&sh[1], N_EMBD, &xr));
        for (o, v) in want.iter_mut().zip(matvec(&sh[2], N_SH, &h)) {
            *o += gate_sh * v;
        }
        for (d, (&g, &w)) in got[r * N_EMBD..(r + 1) * N_EMBD]
            .iter()
            .zip(&want)
            .enumerate()
        {
            assert!(
                (g as f64 - w).abs() < 1e-4 * (1.0 + w.abs()),
                "row {r} dim {d}: {g} vs {w}"
            );
        }
    }
}

#[test]
fn rows_are_batch_invariant_and_fused_gate_up_agrees() {
    for t in [GgmlType::F32, GgmlType::Q8_0] {
        let b = bytes(t, 3);
        let (m, fused) = (moe(t, &b, false), moe(t, &b, true));
        let x = input(13, 4);
        let batch = run(&m, &x);
        assert_eq!(batch, run(&fused, &x), "{t:?}: fused gate_up differs");
        for (r, row) in x.chunks_exact(N_EMBD).enumerate() {
            assert_eq!(
                &batch[r * N_EMBD..(r + 1) * N_EMBD],
                run(&m, row).as_slice(),
                "{t:?} row {r}"
            );
        }
        // a different batch around the same rows
        let mut mixed = input(3, 9);
        mixed.extend_from_slice(&x[5 * N_EMBD..8 * N_EMBD]);
        let out = run(&m, &mixed);
        assert_eq!(
            &out[3 * N_EMBD..],
            &batch[5 * N_EMBD..8 * N_EMBD],
            "{t:?}: mixed batch"
        );
    }
}
