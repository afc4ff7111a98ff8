//! Recurrent-layer kernels: f64 references from the model reference's formulas (§5.3, §6),
//! batch invariance (one call == uneven chunks == token by token, bit for bit), the same bits on
//! the AVX2 and scalar paths, and the same bits for any thread count.

use _native::recurrent::{
    conv1d_causal, gated_delta_rule, gdn_l2_norm, l2_norm, mamba2_scan, GdnShape, Mamba2Shape,
};
use _native::simd;
use rand::{Rng, SeedableRng};
use std::sync::Mutex;

/// Tests that switch the process-wide scalar flag hold this lock.
static PATH: Mutex<()> = Mutex::new(());

fn with_path<R>(scalar: bool, f: impl FnOnce() -> R) -> R {
    simd::set_force_scalar(scalar);
    let r = f();
    simd::set_force_scalar(false);
    r
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn random(n: usize, lo: f32, hi: f32, rng: &mut impl Rng) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

/// Splits of 23 tokens used for the batch-invariance checks.
fn splits() -> Vec<Vec<usize>> {
    vec![vec![23], vec![5, 1, 17], vec![1; 23]]
}

// ---- convolution ---------------------------------------------------------------------------

struct Conv {
    x: Vec<f32>,
    w: Vec<f32>,
    bias: Option<Vec<f32>>,
    state: Vec<f32>,
    ch: usize,
    kernel: usize,
    silu: bool,
}

fn conv_case(ch: usize, kernel: usize, bias: bool, silu: bool, rng: &mut impl Rng) -> Conv {
    Conv {
        x: random(23 * ch, -2.0, 2.0, rng),
        w: random(ch * kernel, -1.0, 1.0, rng),
        bias: bias.then(|| random(ch, -0.5, 0.5, rng)),
        state: random((kernel - 1) * ch, -2.0, 2.0, rng),
        ch,
        kernel,
        silu,
    }
}

/// Runs the convolution over the given token chunks; returns (outputs, final state).
fn run_conv(c: &Conv, chunks: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let mut state = c.state.clone();
    let mut out = Vec::new();
    let mut t0 = 0;
    for &n in chunks {
        let mut o = vec![0.0f32; n * c.ch];
        conv1d_causal(
            &c.x[t0 * c.ch..(t0 + n) * c.ch],
            &c.w,
            c.bias.as_deref(),
            &mut state,
            c.ch,
            c.kernel,
            c.silu,
            &mut o,
        );
        out.extend(o);
        t0 += n;
    }
    (out, state)
}

fn conv_reference(c: &Conv) -> (Vec<f64>, Vec<f64>) {
    let ch = c.ch;
    let seq: Vec<f64> = c.state.iter().chain(&c.x).map(|&v| v as f64).collect();
    let n = c.x.len() / ch;
    let mut out = vec![0.0f64; n * ch];
    for t in 0..n {
        for j in 0..ch {
            let mut y: f64 = (0..c.kernel)
                .map(|k| c.w[j * c.kernel + k] as f64 * seq[(t + k) * ch + j])
                .sum();
            if let Some(b) = &c.bias {
                y += b[j] as f64;
            }
            if c.silu {
                y /= 1.0 + (-y).exp();
            }
            out[t * ch + j] = y;
        }
    }
    (out, seq[n * ch..].to_vec())
}

#[test]
fn conv_matches_reference_and_is_batch_invariant() {
    let _guard = PATH.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for (ch, kernel, bias, silu) in [
        (37, 4, false, false),
        (37, 4, true, true),
        (16, 2, false, true),
        (9, 1, true, false),
        (13, 6, true, true),
        (11, 9, false, false),
    ] {
        let c = conv_case(ch, kernel, bias, silu, &mut rng);
        let (want, want_state) = conv_reference(&c);
        let mut results = vec![];
        for scalar in [false, true] {
            for split in splits() {
                results.push(with_path(scalar, || run_conv(&c, &split)));
            }
        }
        assert_close(&results[0].0, &want, 1e-5, "conv out");
        assert_close(&results[0].1, &want_state, 0.0, "conv state");
        for (i, r) in results.iter().enumerate() {
            assert_eq!(bits(&r.0), bits(&results[0].0), "conv out, run {i}");
            assert_eq!(bits(&r.1), bits(&results[0].1), "conv state, run {i}");
        }
    }
}

// ---- Gated DeltaNet --------------------------------------------------------------------------

struct Gdn {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    state: Vec<f32>,
    nk: usize,
    nv: usize,
    dk: usize,
    dv: usize,
}

fn gdn_case(nk: usize, nv: usize, dk: usize, dv: usize, rng: &mut impl Rng) -> Gdn {
    let n = 23;
    Gdn {
        q: random(n * nk * dk, -1.0, 1.0, rng),
        k: random(n * nk * dk, -1.0, 1.0, rng),
        v: random(n * nv * dv, -1.0, 1.0, rng),
        g: random(n * nv, -1.5, 0.0, rng),
        beta: random(n * nv, 0.05, 0.95, rng),
        state: random(nv * dv * dk, -0.5, 0.5, rng),
        nk,
        nv,
        dk,
        dv,
    }
}

/// The recurrence over `chunks` of tokens, each chunk one call. `apart`: every call reads the
/// state from one buffer and writes a fresh one (`state_in`, as the model's decode steps do), else
/// it updates the state in place.
fn run_gdn(c: &Gdn, chunks: &[usize], l2_eps: Option<f32>, apart: bool) -> (Vec<f32>, Vec<f32>) {
    let (nk, nv, dk, dv) = (c.nk, c.nv, c.dk, c.dv);
    let mut state = c.state.clone();
    let mut out = Vec::new();
    let mut t0 = 0;
    for &n in chunks {
        let mut o = vec![0.0f32; n * nv * dv];
        let qk = |a: &[f32]| a[t0 * nk * dk..(t0 + n) * nk * dk].to_vec();
        let previous = apart.then(|| std::mem::replace(&mut state, vec![f32::NAN; c.state.len()]));
        gated_delta_rule(
            &qk(&c.q),
            &qk(&c.k),
            &c.v[t0 * nv * dv..(t0 + n) * nv * dv],
            &c.g[t0 * nv..(t0 + n) * nv],
            &c.beta[t0 * nv..(t0 + n) * nv],
            previous.as_deref(),
            &mut state,
            GdnShape {
                n_tokens: n,
                n_k_heads: nk,
                n_v_heads: nv,
                d_k: dk,
                d_v: dv,
            },
            l2_eps,
            &mut o,
        );
        out.extend(o);
        t0 += n;
    }
    (out, state)
}

/// §5.3 step 5 and 7 in f64, with HF's per-head S[i][j] (d_k × d_v); state in the kernel's layout.
#[allow(clippy::needless_range_loop)] // index loops read like the formulas
fn gdn_reference(c: &Gdn, eps: f64) -> (Vec<f64>, Vec<f64>) {
    let (nk, nv, dk, dv) = (c.nk, c.nv, c.dk, c.dv);
    let n = c.g.len() / nv;
    // the q/k normalisation of current llama.cpp (build_gdn_l2_norm): x / sqrt(Σx² + eps)
    let norm = |x: &[f32]| -> Vec<f64> {
        let s = (x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() + eps).sqrt();
        x.iter().map(|&v| v as f64 / s).collect()
    };
    let mut out = vec![0.0f64; n * nv * dv];
    let mut final_state = vec![0.0f64; nv * dv * dk];
    for h in 0..nv {
        let hk = h % nk;
        let mut s = vec![vec![0.0f64; dv]; dk];
        for i in 0..dk {
            for j in 0..dv {
                s[i][j] = c.state[(h * dv + j) * dk + i] as f64;
            }
        }
        for t in 0..n {
            let q = norm(&c.q[(t * nk + hk) * dk..(t * nk + hk + 1) * dk]);
            let k = norm(&c.k[(t * nk + hk) * dk..(t * nk + hk + 1) * dk]);
            let decay = (c.g[t * nv + h] as f64).exp();
            let beta = c.beta[t * nv + h] as f64;
            for row in s.iter_mut() {
                for e in row.iter_mut() {
                    *e *= decay;
                }
            }
            for j in 0..dv {
                let r: f64 = (0..dk).map(|i| s[i][j] * k[i]).sum();
                let delta = beta * (c.v[(t * nv + h) * dv + j] as f64 - r);
                for i in 0..dk {
                    s[i][j] += k[i] * delta;
                }
            }
            for j in 0..dv {
                let o: f64 = (0..dk).map(|i| s[i][j] * q[i]).sum();
                out[(t * nv + h) * dv + j] = o / (dk as f64).sqrt();
            }
        }
        for i in 0..dk {
            for j in 0..dv {
                final_state[(h * dv + j) * dk + i] = s[i][j];
            }
        }
    }
    (out, final_state)
}

#[test]
fn gated_delta_rule_matches_reference_and_is_batch_invariant() {
    let _guard = PATH.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    for (nk, nv, dk, dv) in [(2, 4, 16, 24), (1, 2, 40, 33), (2, 2, 64, 64)] {
        let c = gdn_case(nk, nv, dk, dv, &mut rng);
        let (want, want_state) = gdn_reference(&c, 1e-6);
        let mut results = vec![];
        for scalar in [false, true] {
            for split in splits() {
                for apart in [false, true] {
                    results.push(with_path(scalar, || run_gdn(&c, &split, Some(1e-6), apart)));
                }
            }
        }
        let what = format!("nk {nk} nv {nv} dk {dk} dv {dv}");
        assert_close(&results[0].0, &want, 1e-5, &format!("{what} out"));
        assert_close(&results[0].1, &want_state, 1e-5, &format!("{what} state"));
        for (i, r) in results.iter().enumerate() {
            assert_eq!(bits(&r.0), bits(&results[0].0), "{what} out, run {i}");
            assert_eq!(bits(&r.1), bits(&results[0].1), "{what} state, run {i}");
        }
        // normalising q and k outside with gdn_l2_norm is the same as asking the kernel to
        let (mut qn, mut kn) = (vec![0.0f32; c.q.len()], vec![0.0f32; c.k.len()]);
        gdn_l2_norm(&c.q, dk, 1e-6, &mut qn);
        gdn_l2_norm(&c.k, dk, 1e-6, &mut kn);
        let pre = Gdn {
            q: qn,
            k: kn,
            v: c.v.clone(),
            g: c.g.clone(),
            beta: c.beta.clone(),
            state: c.state.clone(),
            ..c
        };
        let r = run_gdn(&pre, &[23], None, false);
        assert_eq!(bits(&r.0), bits(&results[0].0), "{what}: l2 outside");
        assert_eq!(bits(&r.1), bits(&results[0].1), "{what}: l2 outside, state");
    }
}

#[test]
fn gated_delta_rule_does_not_depend_on_thread_count() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let c = gdn_case(2, 6, 32, 32, &mut rng);
    let runs: Vec<_> = [1, 2, 5]
        .iter()
        .map(|&n| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .unwrap();
            pool.install(|| run_gdn(&c, &[23], Some(1e-6), false))
        })
        .collect();
    for r in &runs[1..] {
        assert_eq!(bits(&r.0), bits(&runs[0].0));
        assert_eq!(bits(&r.1), bits(&runs[0].1));
    }
}

#[test]
fn gdn_l2_norm_puts_eps_under_the_root() {
    let x = [3.0f32, 4.0, 0.0, 0.0];
    let mut out = [0.0f32; 4];
    gdn_l2_norm(&x, 2, 1e-6, &mut out);
    assert!((out[0] - 0.6).abs() < 1e-7 && (out[1] - 0.8).abs() < 1e-7);
    assert_eq!(&out[2..], &[0.0, 0.0]);
}

#[test]
fn l2_norm_floors_the_norm_at_eps() {
    let x = [3.0f32, 4.0, 0.0, 0.0, 1e-8, 0.0];
    let mut out = [0.0f32; 6];
    l2_norm(&x, 2, 1e-6, &mut out);
    assert_eq!(&out[..2], &[0.6, 0.8]);
    assert_eq!(&out[2..4], &[0.0, 0.0]);
    assert_eq!(out[4], 1e-8 * (1.0 / 1e-6f32));
}

// ---- Mamba2 ----------------------------------------------------------------------------------

struct Mamba {
    x: Vec<f32>,
    dt: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
    d: Option<Vec<f32>>,
    dt_bias: Option<Vec<f32>>,
    state: Vec<f32>,
    s: Mamba2Shape,
}

fn mamba_case(
    nh: usize,
    p: usize,
    ng: usize,
    ns: usize,
    extras: bool,
    rng: &mut impl Rng,
) -> Mamba {
    let n = 23;
    let mut dt = random(n * nh, -3.0, 3.0, rng);
    dt[3] = 25.0; // the softplus pass-through branch
    Mamba {
        x: random(n * nh * p, -2.0, 2.0, rng),
        dt,
        a: random(nh, -2.0, -0.1, rng),
        b: random(n * ng * ns, -1.0, 1.0, rng),
        c: random(n * ng * ns, -1.0, 1.0, rng),
        d: extras.then(|| random(nh, -1.0, 1.0, rng)),
        dt_bias: extras.then(|| random(nh, -1.0, 1.0, rng)),
        state: random(nh * p * ns, -1.0, 1.0, rng),
        s: Mamba2Shape {
            n_tokens: n,
            n_heads: nh,
            head_dim: p,
            n_groups: ng,
            d_state: ns,
        },
    }
}

fn run_mamba(m: &Mamba, chunks: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let Mamba2Shape {
        n_heads: nh,
        head_dim: p,
        n_groups: ng,
        d_state: ns,
        ..
    } = m.s;
    let mut state = m.state.clone();
    let mut out = Vec::new();
    let mut t0 = 0;
    for &n in chunks {
        let mut o = vec![0.0f32; n * nh * p];
        mamba2_scan(
            &m.x[t0 * nh * p..(t0 + n) * nh * p],
            &m.dt[t0 * nh..(t0 + n) * nh],
            &m.a,
            &m.b[t0 * ng * ns..(t0 + n) * ng * ns],
            &m.c[t0 * ng * ns..(t0 + n) * ng * ns],
            m.d.as_deref(),
            m.dt_bias.as_deref(),
            None,
            &mut state,
            Mamba2Shape { n_tokens: n, ..m.s },
            &mut o,
        );
        out.extend(o);
        t0 += n;
    }
    (out, state)
}

/// §6 step 3-4 in f64.
fn mamba_reference(m: &Mamba) -> (Vec<f64>, Vec<f64>) {
    let Mamba2Shape {
        n_tokens: n,
        n_heads: nh,
        head_dim: p,
        n_groups: ng,
        d_state: ns,
    } = m.s;
    let mut s: Vec<f64> = m.state.iter().map(|&v| v as f64).collect();
    let mut y = vec![0.0f64; n * nh * p];
    for t in 0..n {
        for h in 0..nh {
            let g = h / (nh / ng);
            let mut dt = m.dt[t * nh + h] as f64;
            if let Some(b) = &m.dt_bias {
                dt += b[h] as f64;
            }
            let dt = if dt > 20.0 { dt } else { dt.exp().ln_1p() };
            let da = (dt * m.a[h] as f64).exp();
            for pi in 0..p {
                let x = m.x[(t * nh + h) * p + pi] as f64;
                let mut acc = 0.0;
                for k in 0..ns {
                    let si = &mut s[(h * p + pi) * ns + k];
                    *si = *si * da + m.b[(t * ng + g) * ns + k] as f64 * x * dt;
                    acc += *si * m.c[(t * ng + g) * ns + k] as f64;
                }
                if let Some(d) = &m.d {
                    acc += d[h] as f64 * x;
                }
                y[(t * nh + h) * p + pi] = acc;
            }
        }
    }
    (y, s)
}

#[test]
fn mamba2_scan_matches_reference_and_is_batch_invariant() {
    let _guard = PATH.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    for (nh, p, ng, ns, extras) in [
        (4, 6, 2, 16, true),
        (3, 5, 1, 40, false),
        (2, 4, 2, 64, true),
    ] {
        let m = mamba_case(nh, p, ng, ns, extras, &mut rng);
        let (want, want_state) = mamba_reference(&m);
        let mut results = vec![];
        for scalar in [false, true] {
            for split in splits() {
                results.push(with_path(scalar, || run_mamba(&m, &split)));
            }
        }
        let what = format!("H {nh} P {p} G {ng} N {ns}");
        assert_close(&results[0].0, &want, 2e-5, &format!("{what} out"));
        assert_close(&results[0].1, &want_state, 2e-5, &format!("{what} state"));
        for (i, r) in results.iter().enumerate() {
            assert_eq!(bits(&r.0), bits(&results[0].0), "{what} out, run {i}");
            assert_eq!(bits(&r.1), bits(&results[0].1), "{what} state, run {i}");
        }
    }
}
