//! The Mamba2 selective scan (`ggml_ssm_scan`, scalar decay per head) plus the D skip.

#[cfg(target_arch = "x86_64")]
use super::avx2;
use super::sums::reduce32;
use rayon::prelude::*;

/// Mamba2 scan of one state row (one head channel): `s = fma(s, dA, B·x_dt)` (ggml's
/// `s·dA + B·x_dt` as GCC contracts it, in the SIMD loop and in the scalar tail alike), and returns
/// `Σ s·C`: 32 FMA lanes as `ggml_vec_dot_f32`, then the tail past `n & !31` as sequential FMAs.
#[inline(always)]
fn scan_row<const AVX: bool>(row: &mut [f32], da: f32, b: &[f32], x_dt: f32, c: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: AVX is only true inside `mamba2_head_avx2`, entered after run-time detection of
        // AVX2 and FMA; `row`, `b` and `c` hold d_state values each (sliced in `mamba2_head`).
        return unsafe { avx2::scan_row(row, da, b, x_dt, c) };
    }
    let n = row.len();
    let np = n & !31;
    let mut lanes = [0.0f32; 32];
    for i in (0..np).step_by(32) {
        for l in 0..32 {
            let s = row[i + l].mul_add(da, b[i + l] * x_dt);
            row[i + l] = s;
            lanes[l] = s.mul_add(c[i + l], lanes[l]);
        }
    }
    let mut sum = reduce32(&lanes);
    for i in np..n {
        let s = row[i].mul_add(da, b[i] * x_dt);
        row[i] = s;
        sum = s.mul_add(c[i], sum);
    }
    sum
}

/// Sizes of one `mamba2_scan` call.
#[derive(Clone, Copy, Debug)]
pub struct Mamba2Shape {
    pub n_tokens: usize,
    /// H (`ssm.time_step_rank`)
    pub n_heads: usize,
    /// P = d_inner / H
    pub head_dim: usize,
    /// G (`ssm.group_count`); head `h` uses group `h / (H / G)`
    pub n_groups: usize,
    /// N (`ssm.state_size`)
    pub d_state: usize,
}

pub(crate) struct Mamba2Args<'a> {
    x: &'a [f32],
    dt: &'a [f32],
    a: &'a [f32],
    b: &'a [f32],
    c: &'a [f32],
    d: Option<&'a [f32]>,
    dt_bias: Option<&'a [f32]>,
    s: Mamba2Shape,
}

/// `x > 20 ? x : logf(1 + expf(x))` (ggml_compute_softplus_f32).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// One head over all tokens. `st` = head_dim rows of d_state, `o` = n_tokens × head_dim.
#[inline(always)]
fn mamba2_head<const AVX: bool>(a: &Mamba2Args, h: usize, st: &mut [f32], o: &mut [f32]) {
    let Mamba2Shape {
        n_tokens,
        n_heads: nh,
        head_dim: p,
        n_groups: ng,
        d_state: ns,
    } = a.s;
    let grp = h / (nh / ng);
    for t in 0..n_tokens {
        let dt = match a.dt_bias {
            Some(bias) => a.dt[t * nh + h] + bias[h],
            None => a.dt[t * nh + h],
        };
        let dt_sp = softplus(dt);
        let da = (dt_sp * a.a[h]).exp();
        let b = &a.b[(t * ng + grp) * ns..(t * ng + grp + 1) * ns];
        let c = &a.c[(t * ng + grp) * ns..(t * ng + grp + 1) * ns];
        let x = &a.x[(t * nh + h) * p..(t * nh + h + 1) * p];
        let ot = &mut o[t * p..(t + 1) * p];
        for ((row, &xv), y) in st.chunks_exact_mut(ns).zip(x).zip(ot.iter_mut()) {
            let sum = scan_row::<AVX>(row, da, b, xv * dt_sp, c);
            // `y + x·D` as two graph ops (ggml_mul, then ggml_add): two roundings.
            *y = match a.d {
                Some(d) => sum + xv * d[h],
                None => sum,
            };
        }
    }
}

/// `mamba2_head` compiled with AVX2 and FMA enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn mamba2_head_avx2(a: &Mamba2Args, h: usize, st: &mut [f32], o: &mut [f32]) {
    mamba2_head::<true>(a, h, st, o)
}

/// The Mamba2 selective scan (model reference §6 step 3–4, `ggml_ssm_scan` with a scalar A per
/// head), per head `h` (group `h / (H/G)`), per token in order:
/// ```text
/// Δ = softplus(dt[h] (+ dt_bias[h]));  dA = exp(Δ·A[h]);
/// s[h,p,n] ← s[h,p,n]·dA + B[g,n]·(x[h,p]·Δ);  y[h,p] = Σ_n s[h,p,n]·C[g,n]  (+ D[h]·x[h,p])
/// ```
/// Layouts (C order): `x` = n_tokens × H × P; `dt` = n_tokens × H (raw, before softplus); `a` = H
/// (GGUF `ssm_a`, already −exp(A_log)); `b`, `c` = n_tokens × G × N; `d`, `dt_bias` = H;
/// `state` = H × P × N (llama.cpp's layout); `out` = n_tokens × H × P. The scan continues from
/// `state_in` when given (left as it was), else from `state`, and the new state is written to
/// `state` either way. Use it inside `threads::run`.
#[allow(clippy::too_many_arguments)]
pub fn mamba2_scan(
    x: &[f32],
    dt: &[f32],
    a: &[f32],
    b: &[f32],
    c: &[f32],
    d: Option<&[f32]>,
    dt_bias: Option<&[f32]>,
    state_in: Option<&[f32]>,
    state: &mut [f32],
    s: Mamba2Shape,
    out: &mut [f32],
) {
    let (n, nh, p, ns) = (s.n_tokens, s.n_heads, s.head_dim, s.d_state);
    assert!(ns > 0 && s.n_groups > 0 && nh % s.n_groups == 0);
    if n == 0 || nh == 0 || p == 0 {
        if let Some(src) = state_in {
            state.copy_from_slice(src);
        }
        return;
    }
    let args = Mamba2Args {
        x,
        dt,
        a,
        b,
        c,
        d,
        dt_bias,
        s,
    };
    let mut by_head = vec![0.0f32; nh * n * p];
    let use_avx2 = crate::simd::use_avx2();
    by_head
        .par_chunks_mut(n * p)
        .zip(state.par_chunks_mut(p * ns))
        .enumerate()
        .for_each(|(h, (o, st))| {
            if let Some(src) = state_in {
                st.copy_from_slice(&src[h * p * ns..(h + 1) * p * ns]);
            }
            #[cfg(target_arch = "x86_64")]
            if use_avx2 {
                // SAFETY: use_avx2 reports AVX2 and FMA, detected at run time.
                unsafe { mamba2_head_avx2(&args, h, st, o) };
                return;
            }
            let _ = use_avx2;
            mamba2_head::<false>(&args, h, st, o);
        });
    for (h, head) in by_head.chunks_exact(n * p).enumerate() {
        for (t, row) in head.chunks_exact(p).enumerate() {
            out[(t * nh + h) * p..(t * nh + h + 1) * p].copy_from_slice(row);
        }
    }
}
