//! The Gated DeltaNet recurrence as the fused CPU `GATED_DELTA_NET` op runs it.

use super::norm::gdn_l2_norm;
use super::sums::dot_lanes;
#[cfg(target_arch = "x86_64")]
use super::{avx2, avx512};
use rayon::prelude::*;

/// Delta rule, first half for one state row: `row = from · e` (the decay; `from` is the row's
/// previous value, `None` for `row` itself), then `dot(row, k)`.
#[inline(always)]
fn decay_dot<const AVX: bool>(from: Option<&[f32]>, row: &mut [f32], e: f32, k: &[f32]) -> f32 {
    let n = row.len();
    assert!(from.is_none_or(|f| f.len() == n) && k.len() == n);
    #[cfg(target_arch = "x86_64")]
    if AVX {
        let dst = row.as_mut_ptr();
        let src = from.map_or(dst as *const f32, <[f32]>::as_ptr);
        // SAFETY: AVX is only true inside the avx2 wrappers, entered after CPU detection; `src`
        // and `dst` hold n elements (asserted), `src` is `dst` itself or a distinct slice.
        return unsafe { avx2::decay_dot(src, dst, n, e, k) };
    }
    match from {
        Some(from) => {
            for (s, &x) in row.iter_mut().zip(from) {
                *s = x * e;
            }
        }
        None => {
            for s in row.iter_mut() {
                *s *= e;
            }
        }
    }
    dot_lanes(row, k)
}

/// Delta rule, second half for one state row: `row += k·d` (fused), then `dot(row, q)`.
#[inline(always)]
fn update_dot<const AVX: bool>(row: &mut [f32], k: &[f32], d: f32, q: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: AVX as in `decay_dot`; `row`, `k` and `q` are rows of the same d_k values
        // (sliced in `gdn_head`), which bounds the pointer loads and stores.
        return unsafe { avx2::update_dot(row, k, d, q) };
    }
    for (s, &kv) in row.iter_mut().zip(k) {
        *s = kv.mul_add(d, *s);
    }
    dot_lanes(row, q)
}

/// State rows per group on the AVX-512 path of the delta rule.
const WIDE_ROWS: usize = 4;

/// Sizes of one `gated_delta_rule` call.
#[derive(Clone, Copy, Debug)]
pub struct GdnShape {
    pub n_tokens: usize,
    /// q/k heads (`ssm.group_count`)
    pub n_k_heads: usize,
    /// v heads (`ssm.time_step_rank`); a multiple of `n_k_heads`; v head `h` uses k head `h % n_k_heads`
    pub n_v_heads: usize,
    pub d_k: usize,
    pub d_v: usize,
}

pub(crate) struct GdnArgs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: &'a [f32],
    s: GdnShape,
}

/// One v head over all tokens. `st` = d_v rows of d_k (`st[j*d_k + i] = S[i][j]`), `o` = n_tokens × d_v.
/// With `src`, the head's state is read from there and written to `st` (by the first token's decay).
/// `WIDE` (AVX-512, with `AVX`): rows in groups of `WIDE_ROWS` through `avx512`'s row-group steps.
#[inline(always)]
fn gdn_head<const AVX: bool, const WIDE: bool>(
    a: &GdnArgs,
    h: usize,
    src: Option<&[f32]>,
    st: &mut [f32],
    o: &mut [f32],
) {
    let GdnShape {
        n_tokens,
        n_k_heads: nk,
        n_v_heads: nv,
        d_k: dk,
        d_v: dv,
    } = a.s;
    let scale = 1.0f32 / (dk as f32).sqrt();
    let hk = h % nk;
    for t in 0..n_tokens {
        let q = &a.q[(t * nk + hk) * dk..(t * nk + hk + 1) * dk];
        let k = &a.k[(t * nk + hk) * dk..(t * nk + hk + 1) * dk];
        let v = &a.v[(t * nv + h) * dv..(t * nv + h + 1) * dv];
        let decay = a.g[t * nv + h].exp();
        let beta = a.beta[t * nv + h];
        let ot = &mut o[t * dv..(t + 1) * dv];
        // Rows are independent, so doing each row's four steps together gives the same bits as
        // ggml's four passes over the whole matrix.
        let from = src.filter(|_| t == 0); // after the first token the state is in `st`
        let mut wide = 0;
        #[cfg(target_arch = "x86_64")]
        if WIDE {
            const R: usize = WIDE_ROWS;
            while wide + R <= dv {
                let rows = st[wide * dk..(wide + R) * dk].as_mut_ptr();
                let from_rows = from.map_or(rows as *const f32, |f| f[wide * dk..].as_ptr());
                // SAFETY: WIDE is only true inside `gdn_head_avx512`, entered after CPU
                // detection; the R rows at `rows` (and at `from_rows`, the same layout) are in
                // bounds (sliced above), and `from` is `st` itself or a distinct buffer.
                let sk: [f32; R] = unsafe { avx512::decay_dot_rows(from_rows, rows, dk, decay, k) };
                let deltas = std::array::from_fn(|r| (v[wide + r] - sk[r]) * beta);
                // SAFETY: as above.
                let os: [f32; R] = unsafe { avx512::update_dot_rows(rows, dk, k, deltas, q) };
                for (r, x) in os.into_iter().enumerate() {
                    ot[wide + r] = x * scale;
                }
                wide += R;
            }
        }
        for (j, ((row, &vj), oj)) in st
            .chunks_exact_mut(dk)
            .zip(v)
            .zip(ot.iter_mut())
            .enumerate()
            .skip(wide)
        {
            let sk = decay_dot::<AVX>(from.map(|f| &f[j * dk..(j + 1) * dk]), row, decay, k);
            let delta = (vj - sk) * beta;
            *oj = update_dot::<AVX>(row, k, delta, q) * scale;
        }
    }
}

/// `gdn_head` compiled with AVX2 and FMA enabled.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gdn_head_avx2(a: &GdnArgs, h: usize, src: Option<&[f32]>, st: &mut [f32], o: &mut [f32]) {
    gdn_head::<true, false>(a, h, src, st, o)
}

/// `gdn_head` with AVX-512 F: the rows in groups of `WIDE_ROWS` through `avx512`'s row steps.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f")]
unsafe fn gdn_head_avx512(
    a: &GdnArgs,
    h: usize,
    src: Option<&[f32]>,
    st: &mut [f32],
    o: &mut [f32],
) {
    gdn_head::<true, true>(a, h, src, st, o)
}

/// The Gated DeltaNet recurrence (model reference §5.3 step 7), per v head `h` (k head `h % nk`,
/// the tiled order of qwen35 GGUFs), per token in order:
/// ```text
/// S ← exp(g)·S;  δ[j] = β·(v[j] − Σ_i S[i,j]·k[i]);  S[i,j] += k[i]·δ[j];
/// o[j] = (Σ_i S[i,j]·q[i]) · (1/sqrt(d_k))
/// ```
/// Layouts (C order): `q`, `k` = n_tokens × n_k_heads × d_k (L2-normalised by the caller unless
/// `l2_eps` is given, in which case they are normalised here with `gdn_l2_norm`, as current
/// llama.cpp does for qwen35 / qwen3next); `v` = n_tokens ×
/// n_v_heads × d_v; `g` (log-decay, ≤ 0) and `beta` = n_tokens × n_v_heads; `state` = n_v_heads ×
/// d_v × d_k with `state[h, j, i] = S[i, j]` (llama.cpp's layout: key index contiguous, i.e. HF's
/// per-head matrix transposed); `out` = n_tokens × n_v_heads × d_v. The recurrence continues from
/// `state_in` when given (left as it was; the first token's decay reads it and writes `state`, so
/// no copy is made), else from `state`, and the new state is written to `state` either way.
/// Use it inside `threads::run`.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_rule(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state_in: Option<&[f32]>,
    state: &mut [f32],
    s: GdnShape,
    l2_eps: Option<f32>,
    out: &mut [f32],
) {
    let (n, nv, dk, dv) = (s.n_tokens, s.n_v_heads, s.d_k, s.d_v);
    if n == 0 || nv == 0 || dk == 0 || dv == 0 {
        if let Some(src) = state_in {
            state.copy_from_slice(src);
        }
        return;
    }
    let normed = l2_eps.map(|eps| {
        let (mut qn, mut kn) = (vec![0.0f32; q.len()], vec![0.0f32; k.len()]);
        gdn_l2_norm(q, dk, eps, &mut qn);
        gdn_l2_norm(k, dk, eps, &mut kn);
        (qn, kn)
    });
    let (q, k) = match &normed {
        Some((qn, kn)) => (qn.as_slice(), kn.as_slice()),
        None => (q, k),
    };
    let a = GdnArgs {
        q,
        k,
        v,
        g,
        beta,
        s,
    };
    let use_avx2 = crate::simd::use_avx2();
    let use_avx512 = crate::simd::use_vnni();
    let head = |(h, (o, st)): (usize, (&mut [f32], &mut [f32]))| {
        let src = state_in.map(|s| &s[h * dv * dk..(h + 1) * dv * dk]);
        #[cfg(target_arch = "x86_64")]
        if use_avx512 {
            // SAFETY: use_vnni reports AVX-512 F (and the AVX2 set below it), detected at run time.
            unsafe { gdn_head_avx512(&a, h, src, st, o) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if use_avx2 {
            // SAFETY: use_avx2 reports AVX2 and FMA, detected at run time.
            unsafe { gdn_head_avx2(&a, h, src, st, o) };
            return;
        }
        let _ = use_avx2;
        gdn_head::<false, false>(&a, h, src, st, o);
    };
    if n == 1 {
        // one token: a head's outputs are already where `out` wants them
        out.par_chunks_mut(dv)
            .zip(state.par_chunks_mut(dv * dk))
            .enumerate()
            .for_each(head);
        return;
    }
    let mut by_head = vec![0.0f32; nv * n * dv];
    by_head
        .par_chunks_mut(n * dv)
        .zip(state.par_chunks_mut(dv * dk))
        .enumerate()
        .for_each(head);
    for (h, head) in by_head.chunks_exact(n * dv).enumerate() {
        for (t, row) in head.chunks_exact(dv).enumerate() {
            out[(t * nv + h) * dv..(t * nv + h + 1) * dv].copy_from_slice(row);
        }
    }
}
