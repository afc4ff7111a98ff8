//! Mixture-of-experts FFN as llama.cpp's `build_moe_ffn` computes it on CPU for softmax-gated
//! models (qwen35moe, qwen3next), plus the sigmoid-gated shared expert those models add.
//!
//! Per token row:
//! 1. router logits `W_router · x`, ggml's CPU softmax over them;
//! 2. the experts sorted by probability with libstdc++'s `std::sort` (ggml's argsort), so equal
//!    probabilities come out in the same order as in llama.cpp; the first `n_used` are taken;
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

// ---- ggml's argsort: libstdc++'s std::sort (introsort), reproduced step for step ---------------
// std::sort is not stable; matching its exact algorithm is what makes ties between equal
// probabilities pick the same experts as llama.cpp (rows of at most 16 experts behave like a
// stable sort; longer rows depend on the partitioning).

const INSERTION_THRESHOLD: usize = 16;

/// Indices of `v` sorted by descending value, in the order libstdc++'s `std::sort` with
/// `v[a] > v[b]` leaves them.
pub fn argsort_desc(v: &[f32]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..v.len() as u32).collect();
    let gt = |a: u32, b: u32| v[a as usize] > v[b as usize];
    let n = idx.len();
    if n > 1 {
        let depth = 2 * (usize::BITS - 1 - n.leading_zeros()) as usize;
        introsort_loop(&mut idx, 0, n, depth, &gt);
        final_insertion_sort(&mut idx, 0, n, &gt);
    }
    idx
}

fn introsort_loop(
    a: &mut [u32],
    first: usize,
    mut last: usize,
    mut depth: usize,
    comp: &impl Fn(u32, u32) -> bool,
) {
    while last - first > INSERTION_THRESHOLD {
        if depth == 0 {
            heap_sort(a, first, last, comp);
            return;
        }
        depth -= 1;
        let mid = first + (last - first) / 2;
        move_median_to_first(a, first, first + 1, mid, last - 1, comp);
        let cut = unguarded_partition(a, first + 1, last, first, comp);
        introsort_loop(a, cut, last, depth, comp);
        last = cut;
    }
}

fn move_median_to_first(
    a: &mut [u32],
    result: usize,
    x: usize,
    y: usize,
    z: usize,
    comp: &impl Fn(u32, u32) -> bool,
) {
    let (vx, vy, vz) = (a[x], a[y], a[z]);
    let median = if comp(vx, vy) {
        if comp(vy, vz) {
            y
        } else if comp(vx, vz) {
            z
        } else {
            x
        }
    } else if comp(vx, vz) {
        x
    } else if comp(vy, vz) {
        z
    } else {
        y
    };
    a.swap(result, median);
}

fn unguarded_partition(
    a: &mut [u32],
    mut first: usize,
    mut last: usize,
    pivot: usize,
    comp: &impl Fn(u32, u32) -> bool,
) -> usize {
    loop {
        while comp(a[first], a[pivot]) {
            first += 1;
        }
        last -= 1;
        while comp(a[pivot], a[last]) {
            last -= 1;
        }
        if first >= last {
            return first;
        }
        a.swap(first, last);
        first += 1;
    }
}

fn final_insertion_sort(
    a: &mut [u32],
    first: usize,
    last: usize,
    comp: &impl Fn(u32, u32) -> bool,
) {
    if last - first > INSERTION_THRESHOLD {
        insertion_sort(a, first, first + INSERTION_THRESHOLD, comp);
        for i in first + INSERTION_THRESHOLD..last {
            linear_insert(a, i, comp);
        }
    } else {
        insertion_sort(a, first, last, comp);
    }
}

fn insertion_sort(a: &mut [u32], first: usize, last: usize, comp: &impl Fn(u32, u32) -> bool) {
    for i in first + 1..last {
        if comp(a[i], a[first]) {
            let v = a[i];
            a.copy_within(first..i, first + 1);
            a[first] = v;
        } else {
            linear_insert(a, i, comp);
        }
    }
}

/// libstdc++'s unguarded linear insert; the `pos > 0` guard never fires where it is used.
fn linear_insert(a: &mut [u32], mut pos: usize, comp: &impl Fn(u32, u32) -> bool) {
    let v = a[pos];
    while pos > 0 && comp(v, a[pos - 1]) {
        a[pos] = a[pos - 1];
        pos -= 1;
    }
    a[pos] = v;
}

/// `std::partial_sort(first, last, last)`: make_heap, then sort_heap (introsort's depth fallback).
fn heap_sort(a: &mut [u32], first: usize, last: usize, comp: &impl Fn(u32, u32) -> bool) {
    let len = last - first;
    if len >= 2 {
        let mut parent = (len - 2) / 2;
        loop {
            let v = a[first + parent];
            adjust_heap(a, first, parent, len, v, comp);
            if parent == 0 {
                break;
            }
            parent -= 1;
        }
    }
    let mut end = last;
    while end - first > 1 {
        end -= 1;
        let v = a[end];
        a[end] = a[first];
        adjust_heap(a, first, 0, end - first, v, comp);
    }
}

fn adjust_heap(
    a: &mut [u32],
    first: usize,
    mut hole: usize,
    len: usize,
    value: u32,
    comp: &impl Fn(u32, u32) -> bool,
) {
    let top = hole;
    let mut child = hole;
    while child < (len - 1) / 2 {
        child = 2 * (child + 1);
        if comp(a[first + child], a[first + child - 1]) {
            child -= 1;
        }
        a[first + hole] = a[first + child];
        hole = child;
    }
    if len.is_multiple_of(2) && child == (len - 2) / 2 {
        child = 2 * (child + 1);
        a[first + hole] = a[first + child - 1];
        hole = child - 1;
    }
    // push_heap
    while hole > top {
        let parent = (hole - 1) / 2;
        if !comp(a[first + parent], value) {
            break;
        }
        a[first + hole] = a[first + parent];
        hole = parent;
    }
    a[first + hole] = value;
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
    fn short_rows_sort_stably() {
        let v = [0.5f32, 1.0, 0.5, 1.0, 0.25, 1.0];
        assert_eq!(argsort_desc(&v), vec![1, 3, 5, 0, 2, 4]);
    }

    /// Values with many ties, made by the same LCG as the C++ program that produced the goldens.
    fn tie_values(n: usize, levels: u64) -> Vec<f32> {
        let mut s = n as u64 * 1_000_003 + levels;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((s >> 33) % levels) as f32
            })
            .collect()
    }

    fn fnv(idx: &[u32]) -> u64 {
        idx.iter().fold(0xcbf2_9ce4_8422_2325, |h, &i| {
            (h ^ i as u64).wrapping_mul(0x100_0000_01b3)
        })
    }

    // FNV-1a hashes of the permutations g++ 12's libstdc++ gives for
    //   std::sort(idx.begin(), idx.end(), [&](int a, int b) { return v[a] > v[b]; })
    // (and std::partial_sort(idx.begin(), idx.end(), idx.end(), same) for the heap fallback).
    const SORT_GOLDEN: [(usize, u64, u64); 36] = [
        (5, 2, 0xfa1b_7603_a769_11e3),
        (5, 3, 0xe22d_2cc0_0ef0_80f5),
        (5, 7, 0x0f66_e1bf_4f6b_8607),
        (5, 1_000_000, 0xf57e_322e_1aee_4a5b),
        (16, 2, 0xb947_9b7c_7649_5873),
        (16, 3, 0xe68b_fe0f_1f11_4d17),
        (16, 7, 0xcfe5_75cb_2e6a_2b0b),
        (16, 1_000_000, 0x0d5f_715d_1053_2de3),
        (17, 2, 0xe552_8752_2f27_528d),
        (17, 3, 0x2660_80d2_416b_02d7),
        (17, 7, 0x979d_05d4_55a0_7f6b),
        (17, 1_000_000, 0x0ce4_e814_f59b_a703),
        (33, 2, 0x0335_4282_0037_dfab),
        (33, 3, 0x16a2_26a7_3bce_e0bb),
        (33, 7, 0x6434_41c0_9350_cdf3),
        (33, 1_000_000, 0x6783_d650_8688_1fc3),
        (64, 2, 0xa5c8_b40d_86a1_ca25),
        (64, 3, 0x3342_324d_af88_7c6f),
        (64, 7, 0x8eaa_239f_7b62_5e77),
        (64, 1_000_000, 0xcbbc_4fb7_6f9f_161b),
        (100, 2, 0xeca7_4a97_e325_00eb),
        (100, 3, 0xa71c_1954_ca63_db0b),
        (100, 7, 0x36ed_3d17_6035_a51b),
        (100, 1_000_000, 0x9252_9bfb_81a1_0a43),
        (128, 2, 0xa96b_3c62_5d2d_ddcd),
        (128, 3, 0x0654_ca7a_b12b_45b9),
        (128, 7, 0x292d_66ed_ce7b_5269),
        (128, 1_000_000, 0x9f5f_a7ab_f3be_c237),
        (257, 2, 0x501d_6ea0_00ce_8689),
        (257, 3, 0x10e5_6a6b_dd98_1f87),
        (257, 7, 0xd1ea_1e43_7a1d_b4bf),
        (257, 1_000_000, 0xa150_a707_585d_8575),
        (512, 2, 0x0760_0a4e_08b2_fe51),
        (512, 3, 0xc2ef_f96d_533e_b51d),
        (512, 7, 0x30df_5b93_97ea_0449),
        (512, 1_000_000, 0xa9d8_2512_1882_4e8f),
    ];
    const HEAP_GOLDEN: [(usize, u64, u64); 20] = [
        (2, 2, 0x082f_2207_b4e8_8cc4),
        (2, 3, 0x0832_8707_b4eb_6e3a),
        (2, 7, 0x0832_8707_b4eb_6e3a),
        (2, 1_000_000, 0x082f_2207_b4e8_8cc4),
        (3, 2, 0xd0a3_9918_6727_3472),
        (3, 3, 0xd0aa_6318_672c_f75e),
        (3, 7, 0xd949_aa18_6c0c_4928),
        (3, 1_000_000, 0xd949_aa18_6c0c_4928),
        (17, 2, 0x4902_a161_1020_9ef7),
        (17, 3, 0x8bba_bcd5_5229_9e2f),
        (17, 7, 0x5ee2_2098_d67b_8849),
        (17, 1_000_000, 0x0ce4_e814_f59b_a703),
        (100, 2, 0xefb8_7548_af8c_6119),
        (100, 3, 0x864b_a105_5ac1_788f),
        (100, 7, 0xed80_3e1a_801c_0329),
        (100, 1_000_000, 0x9252_9bfb_81a1_0a43),
        (257, 2, 0xcf3b_b019_3b16_472f),
        (257, 3, 0x7979_e5c9_933e_e275),
        (257, 7, 0xdfee_c6c0_76d9_c23f),
        (257, 1_000_000, 0xa150_a707_585d_8575),
    ];

    #[test]
    fn argsort_ties_match_libstdcpp() {
        for (n, levels, want) in SORT_GOLDEN {
            assert_eq!(
                fnv(&argsort_desc(&tie_values(n, levels))),
                want,
                "n={n} levels={levels}"
            );
        }
        for (n, levels, want) in HEAP_GOLDEN {
            let v = tie_values(n, levels);
            let mut idx: Vec<u32> = (0..n as u32).collect();
            heap_sort(&mut idx, 0, n, &|a: u32, b: u32| {
                v[a as usize] > v[b as usize]
            });
            assert_eq!(fnv(&idx), want, "heap n={n} levels={levels}");
        }
    }

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
