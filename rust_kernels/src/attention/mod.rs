//! Attention of query rows over a per-sequence f16 KV cache, causal with an optional sliding
//! window. One (row, head) is one pass over its keys, so results never depend on the batch.
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

/// The 8-lane horizontal sum used by ggml/tinyBLAS on x86: ((x0+x4)+(x2+x6)) + ((x1+x5)+(x3+x7)).
#[inline(always)]
pub(crate) fn hsum8(x: &[f32; 8]) -> f32 {
    let t = [x[0] + x[4], x[1] + x[5], x[2] + x[6], x[3] + x[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

#[inline(always)]
fn f16_to_f32(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// ggml's AVX2 `ggml_v_expf` evaluated lane by lane (same constants, same fused operations).
#[inline(always)]
pub(crate) fn expf_ggml(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6) * b);
    if n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
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
        // SAFETY: AVX is only true inside the avx2 wrapper, which the caller enables after detection.
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
        // SAFETY: as in `scores`.
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

/// The weighted sums of values of G heads over the same keys, as llama.cpp sums them: 8 lanes
/// by key position (lane = j % 8, keys ascending within a lane), then `hsum8` over the lanes per
/// dim. `os` holds the G heads' outputs one after another.
#[inline(always)]
fn weighted_sum<const AVX: bool, const G: usize>(
    ps: [&[f32]; G],
    v: &[u16],
    keys: Keys,
    hd: usize,
    os: &mut [f32],
) {
    // lanes[(g * 8 + l) * hd + d]: head g's lane l at dim d.
    let mut lanes = vec![0.0f32; G * 8 * hd];
    #[cfg(target_arch = "x86_64")]
    if AVX {
        // SAFETY: as in `scores`.
        unsafe { avx2::lanes(ps, v, keys, hd, &mut lanes) };
    }
    if !AVX {
        for j in keys.first..=keys.last {
            let vj = &v[keys.at(j)..keys.at(j) + hd];
            for (g, p) in ps.iter().enumerate() {
                let lane = &mut lanes[(g * 8 + j % 8) * hd..][..hd];
                for (a, &x) in lane.iter_mut().zip(vj) {
                    *a += p[j - keys.first] * f16_to_f32(x);
                }
            }
        }
    }
    for (g, o) in os.chunks_exact_mut(hd).enumerate() {
        for (d, out) in o.iter_mut().enumerate() {
            *out = hsum8(&std::array::from_fn(|l| lanes[(g * 8 + l) * hd + d]));
        }
    }
}

/// G query heads that share one KV head (grouped-query attention), each exactly as it would be
/// alone: scores (N keys at a time), softmax, f16 probabilities, weighted sum of values. Sharing
/// only saves loads and f16 conversions of keys and values; no head's bits depend on G or N.
#[inline(always)]
fn heads<const AVX: bool, const G: usize, const N: usize>(
    qs: [&[f32]; G],
    k: &[u16],
    v: &[u16],
    keys: Keys,
    os: &mut [f32],
) {
    let (first, last, hd) = (keys.first, keys.last, qs[0].len());
    let qh: [Vec<f32>; G] = qs.map(|q| q.iter().map(|&x| f16::from_f32(x).to_f32()).collect());
    let qh: [&[f32]; G] = std::array::from_fn(|g| qh[g].as_slice());
    let key_row = |j: usize| &k[keys.at(j)..keys.at(j) + hd];
    let mut ps: [Vec<f32>; G] = std::array::from_fn(|_| Vec::with_capacity(last + 1 - first));
    let mut j = first;
    while j <= last {
        if j + N <= last + 1 {
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
    for p in ps.iter_mut() {
        softmax::<AVX>(p, first, last);
    }
    weighted_sum::<AVX, G>(std::array::from_fn(|g| ps[g].as_slice()), v, keys, hd, os);
}

#[cfg(target_arch = "x86_64")]
mod avx2;

/// Query heads per work item: the largest of 4, 2, 1 that divides the heads per KV head and
/// still leaves each thread several items (a decode row alone keeps one head per item).
fn heads_per_item(rows: usize, n_head: usize, group: usize) -> usize {
    let items_wanted = 4 * rayon::current_num_threads();
    [4, 2]
        .into_iter()
        .find(|&g| group.is_multiple_of(g) && rows * n_head / g >= items_wanted)
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

/// Every span's rows of `q` over its own cache, in one parallel pass (a decode step of k
/// sequences is one dispatch, not k). Spans must be disjoint; rows outside every span are left
/// as they were in `out`. Each (row, head) result is the same as in a batch of its own.
pub fn attention_spans(q: &[f32], spans: &[Span], s: &AttentionShape, out: &mut [f32]) {
    let (hd, n_head) = (s.head_dim, s.n_head);
    let group = n_head / s.n_kv;
    let kv_row = s.n_kv * hd;
    let use_avx2 = crate::simd::use_avx2();
    let rows: usize = spans.iter().map(|sp| sp.rows.len()).sum();
    let per_item = heads_per_item(rows, n_head, group);
    let items_per_row = n_head / per_item;
    // the span of each output row, None for rows no span covers
    let mut span_of = vec![None; out.len() / (n_head * hd)];
    for (i, sp) in spans.iter().enumerate() {
        debug_assert_eq!(sp.rows.len(), sp.positions.len());
        for r in sp.rows.clone() {
            debug_assert!(span_of[r].is_none(), "spans overlap at row {r}");
            span_of[r] = Some(i);
        }
    }
    out.par_chunks_mut(per_item * hd)
        .enumerate()
        .for_each(|(idx, os)| {
            let (row, h0) = (idx / items_per_row, idx % items_per_row * per_item);
            let Some(sp) = span_of[row].map(|i| &spans[i]) else {
                return;
            };
            let last = sp.positions[row - sp.rows.start] as usize;
            let first = if s.window > 0 {
                (last + 1).saturating_sub(s.window)
            } else {
                0
            };
            let q_at = |g: usize| &q[(row * n_head + h0 + g) * hd..][..hd];
            let keys = Keys {
                kv_row,
                kv_off: (h0 / group) * hd,
                first,
                last,
                kq_scale: s.kq_scale,
            };
            let (k, v) = (sp.k, sp.v);
            match per_item {
                4 => run::<4, 2>(use_avx2, std::array::from_fn(q_at), k, v, keys, os),
                2 => run::<2, 4>(use_avx2, std::array::from_fn(q_at), k, v, keys, os),
                _ => run::<1, 4>(use_avx2, [q_at(0)], k, v, keys, os),
            }
        });
}

/// `heads` on the AVX2 path when the CPU has it, else on the portable one.
fn run<const G: usize, const N: usize>(
    use_avx2: bool,
    qs: [&[f32]; G],
    k: &[u16],
    v: &[u16],
    keys: Keys,
    os: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2 {
        // SAFETY: use_avx2 reports AVX2, FMA and F16C.
        unsafe { avx2::heads::<G, N>(qs, k, v, keys, os) };
        return;
    }
    let _ = use_avx2;
    heads::<false, G, N>(qs, k, v, keys, os);
}

#[cfg(test)]
mod tests {
    use super::expf_ggml;

    #[test]
    fn exp_matches_libm_closely() {
        for i in -2000..=0 {
            let x = i as f32 * 0.05;
            let (got, want) = (expf_ggml(x), x.exp());
            assert!(
                (got - want).abs() <= want * 4e-7 + 1e-38,
                "exp({x}) = {got}, libm {want}"
            );
        }
    }
}
