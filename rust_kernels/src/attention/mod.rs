//! Attention of query rows over a per-sequence f16 KV cache, causal with an optional sliding
//! window. Each (row, head) result sums its keys in one fixed order (a prompt's rows may share
//! chunks of keys in blocks; a row's adds continue in key order across them), so results never
//! depend on the batch.
//!
//! The arithmetic follows llama.cpp's CPU path for prompt batches (flash attention off, F16 KV
//! cache, tinyBLAS F16 products), so logits agree with it bit for bit where the rest agrees:
//! - Q is rounded to f16; a score is an 8-lane FMA sum over head dims, reduced by `hsum8`;
//! - softmax uses ggml's vectorised exp, summed per group of 8 keys (groups aligned to absolute
//!   key position 0) in f64, then scaled by `(f32)(1/sum)`;
//! - probabilities are rounded to f16; each output dim is an 8-lane sum over keys with lane
//!   `key % 8`, reduced by `hsum8`.
//!
//! Products of two f16 values are exact in f32, so a lane-emulating scalar loop gives the same bits
//! as the AVX2 loop: both paths produce identical results.

use crate::simd_math::{expf_ggml, hsum8};
use half::f16;
use rayon::prelude::*;

/// Shapes: `q` = rows × n_head × head_dim (already scaled); `k`, `v` = cache_len × n_kv × head_dim
/// in f16 bits, cache index == token position. Row `i` sits at `positions[i]` and sees keys
/// `max(0, p - window + 1) ..= p` (`window == 0`: no window).
pub struct AttentionShape {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub window: usize,
    /// multiplies the scores before the softmax (ggml's `soft_max_ext` scale); 1.0 when Q is pre-scaled
    pub kq_scale: f32,
}

#[inline(always)]
fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// Scores of N keys for G query heads: `out[g][n]` sums `qs[g]·ks[n]` in 8 lanes over head dims
/// (lane = dim % 8), then `hsum8`. On AVX2 the G·N FMA chains interleave (one chain alone waits on
/// the FMA latency) and each key's f16 conversion serves all G heads; every score's own order,
/// hence its bits, is the same for any G and N.
#[inline(always)]
fn scores<const AVX: bool, const G: usize, const N: usize>(
    qs: [&[f32]; G],
    ks: [&[u16]; N],
) -> [[f32; N]; G] {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: AVX is only true inside `avx2::heads`, entered after run-time detection of AVX2,
        // FMA and F16C; every q and k row holds head_dim values (`add_scores` slices the key rows
        // to the query's length), which bounds the unaligned 8-lane loads.
        return unsafe { avx2::scores(qs, ks) };
    }
    qs.map(|q| {
        ks.map(|k| {
            let mut lanes = [0.0f32; 8];
            for (i, (&a, &b)) in q.iter().zip(k).enumerate() {
                lanes[i % 8] += a * f16_to_f32(b);
            }
            hsum8(&lanes)
        })
    })
}

/// Where one KV head's keys are: cache rows `first..=last`, `kv_row` floats apart, at `kv_off`.
#[derive(Clone, Copy)]
struct Keys {
    kv_row: usize,
    kv_off: usize,
    first: usize,
    last: usize,
    kq_scale: f32,
}

impl Keys {
    /// Offset of key `j`'s row in the K (or V) cache.
    fn at(&self, j: usize) -> usize {
        j * self.kv_row + self.kv_off
    }
}

/// ggml's softmax of one head's scores (keys `first..=last`): vectorised exp, sums per group of 8
/// keys aligned to key 0 in f64, scaled by `(f32)(1/sum)`, then rounded to f16 as llama.cpp
/// multiplies V by f16 probabilities. The AVX2 path does the same per element, 8 at a time.
#[inline(always)]
fn softmax<const AVX: bool>(p: &mut [f32], first: usize, last: usize) {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: features as in `scores`; the 8-lane loads and stores stop at `p.len() & !7`.
        unsafe { avx2::softmax(p, first, last) };
        return;
    }
    let max = p.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    for x in p.iter_mut() {
        *x = expf_ggml(*x - max);
    }
    let scale = (1.0 / group_sum(p, first, last)) as f32;
    for x in p.iter_mut() {
        *x = f16::from_f32(*x * scale).to_f32();
    }
}

/// The softmax denominator: `hsum8` of each group of 8 keys aligned to key 0 (keys outside
/// `first..=last` count as 0), the groups added in f64.
#[inline(always)]
fn group_sum(p: &[f32], first: usize, last: usize) -> f64 {
    let mut sum = 0.0f64;
    for group in (first / 8)..=(last / 8) {
        let (lo, hi) = ((8 * group).max(first), (8 * group + 7).min(last));
        let mut lanes = [0.0f32; 8];
        lanes[lo - 8 * group..=hi - 8 * group].copy_from_slice(&p[lo - first..=hi - first]);
        sum += hsum8(&lanes) as f64;
    }
    sum
}

/// Adds keys `a..=b` to the weighted sums of values of G heads over the same keys, as llama.cpp
/// sums them: 8 lanes by key position (lane = j % 8, keys ascending within a lane), kept in
/// `lanes[(g * 8 + l) * hd + d]` (head g's lane l at dim d). Calls over ascending, adjoining ranges
/// continue each lane's chain of adds exactly as one call over their union would.
#[inline(always)]
fn add_lanes<const AVX: bool, const G: usize>(
    ps: [&[f32]; G],
    v: &[u16],
    keys: Keys,
    (a, b): (usize, usize),
    lanes: &mut [f32],
) {
    let hd = lanes.len() / (G * 8);
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: features as in `scores`; `avx2::lanes` asserts the lengths of `lanes`, `v` and
        // `ps` that its pointer loads rely on.
        unsafe { avx2::lanes(ps, v, keys, (a, b), hd, lanes) };
        return;
    }
    for j in a..=b {
        let vj = &v[keys.at(j)..keys.at(j) + hd];
        for (g, p) in ps.iter().enumerate() {
            let lane = &mut lanes[(g * 8 + j % 8) * hd..][..hd];
            for (acc, &x) in lane.iter_mut().zip(vj) {
                *acc += p[j - keys.first] * f16_to_f32(x);
            }
        }
    }
}

/// Each head's output dims: `hsum8` over its 8 lanes (`os` holds the G heads one after another).
#[inline(always)]
fn reduce_lanes<const G: usize>(lanes: &[f32], hd: usize, os: &mut [f32]) {
    for (g, o) in os.chunks_exact_mut(hd).enumerate() {
        for (d, out) in o.iter_mut().enumerate() {
            *out = hsum8(&std::array::from_fn(|l| lanes[(g * 8 + l) * hd + d]));
        }
    }
}

/// Query rows per work item of a prompt: a block's rows read each chunk of keys and values from
/// memory once and from L1 for the other rows. A row at a time re-read the cache for every row (a
/// 4096-token prompt's attention streamed ~17 GB per layer and was bound by it).
const ROW_BLOCK: usize = 8;
/// Bytes of one KV head's keys (or values) per chunk: they stay in L1 while the block's rows pass.
const CHUNK_BYTES: usize = 32 << 10;

/// One query row of a block: its G heads' queries (already scaled), the keys it sees and where its
/// G heads' outputs go.
struct BlockRow<'a, const G: usize> {
    qs: [&'a [f32]; G],
    keys: Keys,
    out: &'a mut [f32],
}

/// G query heads that share one KV head (grouped-query attention), for a block of query rows of
/// one sequence, each (row, head) exactly as it would be alone: scores (N keys at a time),
/// softmax, f16 probabilities, weighted sum of values. The rows share the loads of each chunk of
/// keys and values, the heads the loads and f16 conversions; no result's bits depend on G, N, the
/// block or the chunks (each score is its own dot; each lane's adds stay in key order).
#[inline(always)]
fn heads<const AVX: bool, const G: usize, const N: usize>(
    rows: &mut [BlockRow<G>],
    k: &[u16],
    v: &[u16],
) {
    let hd = rows[0].qs[0].len();
    let lo = rows.iter().map(|r| r.keys.first).min().unwrap_or(0);
    let hi = rows.iter().map(|r| r.keys.last).max().unwrap_or(0);
    // A lone row (a decode step) takes its keys in one chunk: there is nothing to share, and each
    // chunk costs a pass over the lane sums.
    let chunk = if rows.len() == 1 {
        hi + 1 - lo
    } else {
        (CHUNK_BYTES / (2 * hd)).max(8)
    };
    let chunks = || {
        (lo..=hi)
            .step_by(chunk)
            .map(move |c| (c, (c + chunk - 1).min(hi)))
    };
    // the part of chunk (c0, c1) that row r sees, if any
    let part = |keys: &Keys, (c0, c1): (usize, usize)| {
        let (a, b) = (c0.max(keys.first), c1.min(keys.last));
        (a <= b).then_some((a, b))
    };
    let qh: Vec<[Vec<f32>; G]> = rows
        .iter()
        .map(|r| {
            r.qs.map(|q| q.iter().map(|&x| f16::from_f32(x).to_f32()).collect())
        })
        .collect();
    let mut ps: Vec<[Vec<f32>; G]> = rows
        .iter()
        .map(|r| std::array::from_fn(|_| Vec::with_capacity(r.keys.last + 1 - r.keys.first)))
        .collect();
    for c in chunks() {
        for ((row, q), p) in rows.iter().zip(&qh).zip(ps.iter_mut()) {
            if let Some(range) = part(&row.keys, c) {
                let q: [&[f32]; G] = std::array::from_fn(|g| q[g].as_slice());
                add_scores::<AVX, G, N>(q, k, row.keys, range, p);
            }
        }
    }
    for (row, p) in rows.iter().zip(ps.iter_mut()) {
        for p in p.iter_mut() {
            softmax::<AVX>(p, row.keys.first, row.keys.last);
        }
    }
    let mut lanes: Vec<Vec<f32>> = rows.iter().map(|_| vec![0.0f32; G * 8 * hd]).collect();
    for c in chunks() {
        for ((row, p), l) in rows.iter().zip(&ps).zip(lanes.iter_mut()) {
            if let Some(range) = part(&row.keys, c) {
                let p: [&[f32]; G] = std::array::from_fn(|g| p[g].as_slice());
                add_lanes::<AVX, G>(p, v, row.keys, range, l);
            }
        }
    }
    for (row, l) in rows.iter_mut().zip(&lanes) {
        reduce_lanes::<G>(l, hd, row.out);
    }
}

/// Appends the scaled scores of keys `a..=b` (N at a time) to each head's `ps`.
#[inline(always)]
fn add_scores<const AVX: bool, const G: usize, const N: usize>(
    qh: [&[f32]; G],
    k: &[u16],
    keys: Keys,
    (a, b): (usize, usize),
    ps: &mut [Vec<f32>; G],
) {
    let hd = qh[0].len();
    let key_row = |j: usize| &k[keys.at(j)..keys.at(j) + hd];
    let mut j = a;
    while j <= b {
        if j + N <= b + 1 {
            let grid = scores::<AVX, G, N>(qh, std::array::from_fn(|i| key_row(j + i)));
            for (p, row) in ps.iter_mut().zip(grid) {
                p.extend(row.map(|x| x * keys.kq_scale));
            }
            j += N;
        } else {
            let grid = scores::<AVX, G, 1>(qh, [key_row(j)]);
            for (p, [x]) in ps.iter_mut().zip(grid) {
                p.push(x * keys.kq_scale);
            }
            j += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Query heads per work item: the largest of 4, 2, 1 that divides the heads per KV head and
/// still leaves each thread several items (`blocks`: the row blocks of the call; a decode row
/// alone keeps one head per item).
fn heads_per_item(blocks: usize, n_head: usize, group: usize) -> usize {
    let items_wanted = 4 * rayon::current_num_threads();
    [4, 2]
        .into_iter()
        .find(|&g| group.is_multiple_of(g) && blocks * n_head / g >= items_wanted)
        .unwrap_or(1)
}

/// One sequence's rows of a batch: rows `rows` of `q` (and of the output) attend over that
/// sequence's cache `k`, `v` (cache_len × n_kv × head_dim f16 bits), row `rows.start + i` sitting at
/// cache position `positions[i]`.
pub struct Span<'a> {
    pub rows: std::ops::Range<usize>,
    pub k: &'a [u16],
    pub v: &'a [u16],
    pub positions: &'a [i32],
}

/// `attention_spans` for one sequence holding every row of `q`.
pub fn attention(
    q: &[f32],
    k: &[u16],
    v: &[u16],
    positions: &[i32],
    s: &AttentionShape,
    out: &mut [f32],
) {
    let rows = 0..positions.len();
    attention_spans(
        q,
        &[Span {
            rows,
            k,
            v,
            positions,
        }],
        s,
        out,
    );
}

/// A work item: a block of up to `ROW_BLOCK` rows of one span, for the query heads `h0..` of one
/// KV head, with each row's outputs for those heads.
struct Item<'a, 's> {
    span: &'s Span<'a>,
    r0: usize,
    h0: usize,
    outs: Vec<&'s mut [f32]>,
}

/// Every span's rows of `q` over its own cache, in one parallel pass (a decode step of k
/// sequences is one dispatch, not k). Spans must be disjoint; rows outside every span are left
/// as they were in `out`. Each (row, head) result is the same as in a batch of its own.
pub fn attention_spans(q: &[f32], spans: &[Span], s: &AttentionShape, out: &mut [f32]) {
    let (hd, n_head) = (s.head_dim, s.n_head);
    let group = n_head / s.n_kv;
    let blocks: usize = spans
        .iter()
        .map(|sp| sp.rows.len().div_ceil(ROW_BLOCK))
        .sum();
    let per_item = heads_per_item(blocks, n_head, group);
    let items_per_row = n_head / per_item;
    // every row's outputs cut into its head groups, each taken by the one item that writes it
    let mut parts: Vec<Option<&mut [f32]>> = out.chunks_mut(per_item * hd).map(Some).collect();
    let mut items = Vec::with_capacity(blocks * items_per_row);
    for span in spans {
        debug_assert_eq!(span.rows.len(), span.positions.len());
        for r0 in span.rows.clone().step_by(ROW_BLOCK) {
            let r1 = (r0 + ROW_BLOCK).min(span.rows.end);
            for h in 0..items_per_row {
                let outs = (r0..r1)
                    .map(|r| parts[r * items_per_row + h].take().expect("spans overlap"))
                    .collect();
                items.push(Item {
                    span,
                    r0,
                    h0: h * per_item,
                    outs,
                });
            }
        }
    }
    let use_avx2 = crate::simd::use_avx2();
    items.into_par_iter().for_each(|item| match per_item {
        4 => run::<4, 2>(use_avx2, q, s, item),
        2 => run::<2, 4>(use_avx2, q, s, item),
        _ => run::<1, 4>(use_avx2, q, s, item),
    });
}

/// One item's block of rows through `heads`, on the AVX2 path when the CPU has it, else on the
/// portable one.
fn run<const G: usize, const N: usize>(use_avx2: bool, q: &[f32], s: &AttentionShape, item: Item) {
    let (hd, n_head) = (s.head_dim, s.n_head);
    let Item { span, r0, h0, outs } = item;
    let mut rows: Vec<BlockRow<G>> = outs
        .into_iter()
        .enumerate()
        .map(|(i, out)| {
            let row = r0 + i;
            let last = span.positions[row - span.rows.start] as usize;
            let first = if s.window > 0 {
                (last + 1).saturating_sub(s.window)
            } else {
                0
            };
            BlockRow {
                qs: std::array::from_fn(|g| &q[(row * n_head + h0 + g) * hd..][..hd]),
                keys: Keys {
                    kv_row: s.n_kv * hd,
                    kv_off: (h0 / (n_head / s.n_kv)) * hd,
                    first,
                    last,
                    kq_scale: s.kq_scale,
                },
                out,
            }
        })
        .collect();
    let (k, v) = (span.k, span.v);
    #[cfg(target_arch = "x86_64")]
    if use_avx2 {
        // SAFETY: use_avx2 reports AVX2, FMA and F16C, detected at run time.
        unsafe { avx2::heads::<G, N>(&mut rows, k, v) };
        return;
    }
    let _ = use_avx2;
    heads::<false, G, N>(&mut rows, k, v);
}
