//! Mixture-of-experts FFN as llama.cpp's `build_moe_ffn` computes it on CPU for softmax-gated
//! models (qwen35moe, qwen3next), plus the sigmoid-gated shared expert those models add.
//!
//! Per token row:
//! 1. router logits `W_router · x`, ggml's CPU softmax over them;
//! 2. the experts sorted by probability with libstdc++'s `std::sort` (ggml's argsort), so equal
//!    probabilities come out in the same order as in llama.cpp (`moe/stdsort.rs`); the first `n_used`
//!    are taken;
//! 3. their probabilities, optionally divided by their sum (f64 sum, clamped) and scaled;
//! 4. each selected expert's SwiGLU FFN on the quantized 3-D expert tensors (the ordinary
//!    `matmul_many` on one expert's rows), weighted, summed in selection order;
//! 5. `+ sigmoid(w_gate_shexp · x) · SwiGLU_shexp(x)` when a shared expert is given.
//!
//! Every product is one full-row dot of one activation row, and the sums run in a fixed per-row
//! order, so a row's result never depends on the other rows in the batch.

use crate::cancel::Flag;
use crate::matmul::{matmul_many, Weight};
use crate::ops::swiglu;
use crate::simd_math::{expf_ggml, hsum8};
use rayon::prelude::*;

mod stdsort;
pub use stdsort::argsort_desc;

/// One view into a 3-D expert tensor stored as `n_expert` blocks of `stride` rows: rows
/// `offset .. offset + rows` of each block (a fused gate_up tensor is viewed twice).
#[derive(Clone, Copy)]
pub struct Experts<'a> {
    pub all: Weight<'a>,
    pub n_expert: usize,
    pub offset: usize,
    pub rows: usize,
}

impl<'a> Experts<'a> {
    /// The whole tensor, one block of `all.rows / n_expert` rows per expert.
    pub fn whole(all: Weight<'a>, n_expert: usize) -> Self {
        Self {
            all,
            n_expert,
            offset: 0,
            rows: all.rows / n_expert,
        }
    }

    pub fn expert(&self, e: usize) -> Weight<'a> {
        let stride = self.all.rows / self.n_expert;
        let rb = self.all.t.row_bytes(self.all.cols);
        let start = (e * stride + self.offset) * rb;
        Weight {
            t: self.all.t,
            data: &self.all.data[start..start + self.rows * rb],
            rows: self.rows,
            cols: self.all.cols,
        }
    }
}

/// How the router's probabilities become expert weights.
#[derive(Clone, Copy, Debug)]
pub struct Routing {
    pub n_used: usize,
    /// divide the selected probabilities by their sum
    pub norm: bool,
    /// multiply the weights by this unless it is 0 or 1 (llama.cpp's `expert_weights_scale`)
    pub scale: f32,
}

/// An always-on expert whose output is scaled by `sigmoid(gate_inp · x)` (ungated without it).
#[derive(Clone, Copy)]
pub struct SharedExpert<'a> {
    pub gate: Weight<'a>,
    pub up: Weight<'a>,
    pub down: Weight<'a>,
    pub gate_inp: Option<Weight<'a>>,
}

#[derive(Clone, Copy)]
pub struct Moe<'a> {
    pub router: Weight<'a>,
    pub gate: Experts<'a>,
    pub up: Experts<'a>,
    pub down: Experts<'a>,
    pub routing: Routing,
    pub shared: Option<SharedExpert<'a>>,
}

impl Moe<'_> {
    pub fn n_embd(&self) -> usize {
        self.router.cols
    }
    pub fn n_expert(&self) -> usize {
        self.router.rows
    }
}

/// ggml's CPU `soft_max` of one row (AVX2 build): ggml's vectorised exp on groups of 8 whose
/// horizontal sums go into an f64, libm `expf` on the tail, then times `(f32)(1/sum)`.
pub fn softmax_ggml(x: &[f32], out: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0f64;
    let full = x.len() / 8 * 8;
    for (xs, os) in x[..full]
        .chunks_exact(8)
        .zip(out[..full].chunks_exact_mut(8))
    {
        let mut lanes = [0.0f32; 8];
        for ((l, o), &v) in lanes.iter_mut().zip(os.iter_mut()).zip(xs) {
            *l = expf_ggml(v - max);
            *o = *l;
        }
        sum += hsum8(&lanes) as f64;
    }
    for (o, &v) in out[full..].iter_mut().zip(&x[full..]) {
        *o = (v - max).exp();
        sum += *o as f64;
    }
    let inv = (1.0 / sum) as f32;
    for o in out.iter_mut() {
        *o *= inv;
    }
}

/// The top `k` experts of one row and their weights, exactly as llama.cpp derives them from the
/// router logits (softmax, descending argsort, get_rows, optional normalisation and scale).
pub fn route(logits: &[f32], r: Routing) -> (Vec<u32>, Vec<f32>) {
    let mut probs = vec![0.0f32; logits.len()];
    softmax_ggml(logits, &mut probs);
    let mut ids = argsort_desc(&probs);
    ids.truncate(r.n_used);
    let mut w: Vec<f32> = ids.iter().map(|&e| probs[e as usize]).collect();
    if r.norm {
        let sum = w.iter().map(|&v| v as f64).sum::<f64>() as f32;
        // ggml clamps the sum to the smallest normal f16 to avoid dividing by zero
        let sum = sum.max(6.103_515_6e-5);
        for v in w.iter_mut() {
            *v /= sum;
        }
    }
    if r.scale != 0.0 && r.scale != 1.0 {
        for v in w.iter_mut() {
            *v *= r.scale;
        }
    }
    (ids, w)
}

// ---- the forward pass --------------------------------------------------------------------------

/// Routing of `m` rows: for each row its `n_used` experts and weights (row-major `m × n_used`).
pub struct Routes {
    pub ids: Vec<u32>,
    pub weights: Vec<f32>,
}

/// Route every row of `logits` (`m × n_expert`).
pub fn route_rows(logits: &[f32], n_expert: usize, r: Routing) -> Routes {
    let mut routes = Routes {
        ids: Vec::with_capacity(logits.len() / n_expert * r.n_used),
        weights: Vec::with_capacity(logits.len() / n_expert * r.n_used),
    };
    for row in logits.chunks_exact(n_expert) {
        let (ids, w) = route(row, r);
        routes.ids.extend(ids);
        routes.weights.extend(w);
    }
    routes
}

/// `out` (`m × n_embd`) = the MoE FFN of `x` (`m × n_embd`). Returns the routing it used. A set
/// `cancel` flag makes the remaining work return early (outputs then undefined).
pub fn moe_forward(
    moe: &Moe,
    x: &[f32],
    m: usize,
    out: &mut [f32],
    cancel: Option<&Flag>,
) -> Routes {
    let (n_embd, n_expert, k) = (moe.n_embd(), moe.n_expert(), moe.routing.n_used);
    assert!(x.len() == m * n_embd && out.len() == m * n_embd);

    // Everything that reads x directly, in one pass: router, shared gate/up, shared gate scalar.
    let mut ws = vec![moe.router];
    if let Some(s) = &moe.shared {
        ws.extend([s.gate, s.up]);
        ws.extend(s.gate_inp);
    }
    let mut bufs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; m * w.rows]).collect();
    {
        let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        matmul_many(&ws, x, m, &mut outs, cancel);
    }
    let routes = route_rows(&bufs[0], n_expert, moe.routing);

    // (row, slot) pairs per expert, in row order.
    let mut assigned: Vec<Vec<usize>> = vec![Vec::new(); n_expert];
    for (i, &e) in routes.ids.iter().enumerate() {
        assigned[e as usize].push(i);
    }
    let active: Vec<usize> = (0..n_expert).filter(|&e| !assigned[e].is_empty()).collect();
    let results: Vec<Vec<f32>> = active
        .par_iter()
        .map(|&e| expert_ffn(moe, e, &assigned[e], x, k, cancel))
        .collect();
    let mut per_slot = vec![0.0f32; m * k * n_embd]; // expert output of (row, slot)
    for (&e, res) in active.iter().zip(&results) {
        for (&i, y) in assigned[e].iter().zip(res.chunks_exact(n_embd)) {
            per_slot[i * n_embd..(i + 1) * n_embd].copy_from_slice(y);
        }
    }

    // Weighted sum in selection order, as ggml adds the expert views one after another.
    for r in 0..m {
        let o = &mut out[r * n_embd..(r + 1) * n_embd];
        for s in 0..k {
            let i = r * k + s;
            let (y, w) = (&per_slot[i * n_embd..(i + 1) * n_embd], routes.weights[i]);
            if s == 0 {
                for (o, &v) in o.iter_mut().zip(y) {
                    *o = v * w;
                }
            } else {
                for (o, &v) in o.iter_mut().zip(y) {
                    *o += v * w;
                }
            }
        }
    }

    if let Some(s) = &moe.shared {
        if cancel.is_some_and(|c| c.is_set()) {
            return routes;
        }
        let n_ff = s.gate.rows;
        let mut h = vec![0.0f32; m * n_ff];
        swiglu(&bufs[1], &bufs[2], &mut h);
        let mut y = vec![0.0f32; m * n_embd];
        matmul_many(&[s.down], &h, m, &mut [y.as_mut_slice()], cancel);
        for r in 0..m {
            // ggml_sigmoid: 1 / (1 + expf(-x)) with libm's expf
            let g = s.gate_inp.map(|_| 1.0 / (1.0 + (-bufs[3][r]).exp()));
            let (o, y) = (
                &mut out[r * n_embd..(r + 1) * n_embd],
                &y[r * n_embd..(r + 1) * n_embd],
            );
            for (o, &v) in o.iter_mut().zip(y) {
                *o += g.map_or(v, |g| v * g);
            }
        }
    }
    routes
}

/// One expert's SwiGLU FFN on the rows routed to it (`items` index `row * k + slot`); returns
/// `items.len() × n_embd`, in `items` order.
fn expert_ffn(
    moe: &Moe,
    e: usize,
    items: &[usize],
    x: &[f32],
    k: usize,
    cancel: Option<&Flag>,
) -> Vec<f32> {
    let n_embd = moe.n_embd();
    let me = items.len();
    if cancel.is_some_and(|c| c.is_set()) {
        return vec![0.0; me * n_embd];
    }
    let mut xe = Vec::with_capacity(me * n_embd);
    for &i in items {
        let r = i / k;
        xe.extend_from_slice(&x[r * n_embd..(r + 1) * n_embd]);
    }
    let (gate, up, down) = (moe.gate.expert(e), moe.up.expert(e), moe.down.expert(e));
    let n_ff = gate.rows;
    let mut g = vec![0.0f32; me * n_ff];
    let mut u = vec![0.0f32; me * n_ff];
    matmul_many(
        &[gate, up],
        &xe,
        me,
        &mut [g.as_mut_slice(), u.as_mut_slice()],
        cancel,
    );
    let mut h = vec![0.0f32; me * n_ff];
    swiglu(&g, &u, &mut h);
    let mut y = vec![0.0f32; me * n_embd];
    matmul_many(&[down], &h, me, &mut [y.as_mut_slice()], cancel);
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one() {
        let x: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let mut p = vec![0.0; x.len()];
        softmax_ggml(&x, &mut p);
        let s: f32 = p.iter().sum();
        assert!((s - 1.0).abs() < 1e-5);
        let (ids, w) = route(
            &x,
            Routing {
                n_used: 4,
                norm: true,
                scale: 0.0,
            },
        );
        assert_eq!(ids.len(), 4);
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(w.windows(2).all(|p| p[0] >= p[1]));
    }
}
