//! `y = x · Wᵀ` for a quantized weight matrix: each output is one full-row `vec_dot`, so a row's
//! result never depends on the other rows in the batch (batch invariance). Weight rows are split
//! into chunks across threads; a chunk stays in cache while every activation row passes over it.

use crate::cancel::Flag;
use crate::quant::{
    has_row_runs, vec_dot_act_rows, vec_dot_act_rows_run, ActRows, Activations, GgmlType,
};
use crate::simd::prefetch;
use rayon::prelude::*;
use std::ops::Range;

/// A weight matrix: `rows` rows of `cols` elements in GGUF bytes (`cols` along the blocks).
#[derive(Clone, Copy)]
pub struct Weight<'a> {
    pub t: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl Weight<'_> {
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.t.row_bytes(self.cols);
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// The middle register block of `RowBlocks` (after the blocks of 8 activation rows).
const MID_BLOCK: usize = 4;
/// How far ahead of the weight row being read the row-at-a-time path prefetches: the hardware
/// prefetchers stop at 4 KiB pages, which left a single weight stream far below the memory's rate.
const PREFETCH_AHEAD: usize = 4096;
/// Weight rows per call of the kernels that loop over runs of rows (`vec_dot_act_rows_run`): every
/// register block of the window passes over them while they sit in L1 (8 rows of 640-column Q8_0:
/// 5.4 KiB). A call and its dispatch per weight row cost more than the loop.
const RUN_ROWS: usize = 8;
/// Activation rows per window (a decode step of up to this many sequences is one window): each
/// weight row is prefetched ahead as in the one-row path and then dotted with every row of the
/// window, in register blocks of up to 8 rows (`RowBlocks`), while it sits in L1. A prompt's rows
/// pass in windows over a task's 16 cache-resident weight rows; this beat 4x4 (weight x activation)
/// tiles for every format (the tiles' 16 accumulators did not fit in registers).
const STREAM_MAX: usize = 16;

/// L2 budget for one group of a prompt's activation rows (half of a 512 KiB per-core L2, which the
/// weight rows and the outputs share).
const ACT_GROUP_BYTES: usize = 256 << 10;
/// A prompt's activations are grouped only past this many quantized bytes: below it the extra
/// passes over the weights cost more than the L2 misses they save.
const GROUP_MIN_BYTES: usize = 1 << 20;

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: every task writes a disjoint set of output elements.
unsafe impl Send for OutPtr {}
// SAFETY: as for Send: the tasks share the pointer, never an element, and nothing reads the
// outputs before every task is done.
unsafe impl Sync for OutPtr {}

/// Several weights applied to the same activations `x` (`m` rows of `cols`), in one parallel pass.
/// `outs[i]` receives `m × ws[i].rows` floats, row-major. Activations are converted once per format.
/// A set `cancel` flag makes the remaining row chunks return at once (outputs then undefined).
pub fn matmul_many(
    ws: &[Weight],
    x: &[f32],
    m: usize,
    outs: &mut [&mut [f32]],
    cancel: Option<&Flag>,
) {
    assert_eq!(ws.len(), outs.len());
    let cols = ws[0].cols;
    assert!(ws.iter().all(|w| w.cols == cols) && x.len() == m * cols);
    let mut formats = Vec::new();
    for w in ws {
        if !formats.contains(&w.t.act_format()) {
            formats.push(w.t.act_format());
        }
    }
    let acts: Vec<(_, Activations)> = formats
        .iter()
        .map(|&f| (f, Activations::quantize(f, x, cols)))
        .collect();
    let act_for = |t: GgmlType| &acts.iter().find(|(f, _)| *f == t.act_format()).unwrap().1;

    // Rows per task: enough work per task to hide scheduling; for prompts few enough that the
    // task's weight rows stay in L1 while the windows of activation rows pass over them.
    let chunk = if m <= STREAM_MAX { 64 } else { 16 };
    let group = act_group_rows(m, cols);
    // Group-major: rayon hands each thread a contiguous run of tasks, so a thread's consecutive
    // tasks share one L2-sized group of activation rows (the weights stream once per group).
    let tasks: Vec<(usize, usize, usize)> = (0..m)
        .step_by(group)
        .flat_map(|g0| {
            ws.iter().enumerate().flat_map(move |(wi, w)| {
                (0..w.rows.div_ceil(chunk)).map(move |c| (wi, c * chunk, g0))
            })
        })
        .collect();
    let ptrs: Vec<OutPtr> = outs.iter_mut().map(|o| OutPtr(o.as_mut_ptr())).collect();
    for (w, o) in ws.iter().zip(outs.iter()) {
        assert_eq!(o.len(), m * w.rows);
    }
    tasks.par_iter().for_each(|&(wi, start, g0)| {
        if cancel.is_some_and(|c| c.is_set()) {
            return; // the caller reports the cancel; these outputs are never used
        }
        let w = &ws[wi];
        let acts = act_for(w.t);
        let out = ptrs[wi];
        let end = (start + chunk).min(w.rows);
        // SAFETY: the (r, n) pairs written are disjoint across tasks and within bounds (asserted
        // above).
        let put = |r: usize, n: usize, v: f32| unsafe { *out.0.add(r * w.rows + n) = v };
        let rb = w.t.row_bytes(w.cols);
        if g0 == 0 {
            // The task's first rows: the stream below prefetches PREFETCH_AHEAD bytes ahead of the
            // row it reads, so without this a thread's first rows of a call wait on memory in turn.
            prefetch(w.data, start * rb, PREFETCH_AHEAD.min((end - start) * rb));
        }
        for r0 in (g0..(g0 + group).min(m)).step_by(STREAM_MAX) {
            let blocks = RowBlocks::new(acts, r0, STREAM_MAX.min(m - r0));
            // The first window reads the weight rows from memory (prefetched ahead as it goes),
            // later ones find them in L1.
            let first = r0 == g0;
            // Windows whose kernels loop over runs of weight rows themselves (the biased VNNI
            // ones: 3+ rows of Q8_0, Q4_0, Q5_0) take RUN_ROWS rows a call; the rest a row a call.
            if has_row_runs(w.t, STREAM_MAX.min(m - r0)) {
                blocks.dot_runs(w, start..end, first, &put);
            } else {
                for n in start..end {
                    if first {
                        prefetch(w.data, n * rb + PREFETCH_AHEAD, rb);
                    }
                    blocks.dot(w.t, w.row(n), |r, v| put(r, n, v));
                }
            }
        }
    });
}

/// Activation rows per group of a prompt's matmul: a multiple of the window that keeps a group's
/// quantized rows (~1.14 bytes per element for the Q8 formats) within `ACT_GROUP_BYTES`, so every
/// task of a group finds them in L2; all `m` rows for a decode step and for prompts whose rows
/// stay under `GROUP_MIN_BYTES`.
fn act_group_rows(m: usize, cols: usize) -> usize {
    let row_bytes = (cols + cols / 7).max(1);
    if m <= STREAM_MAX || m * row_bytes <= GROUP_MIN_BYTES {
        return m.max(1);
    }
    let fit = ACT_GROUP_BYTES / row_bytes;
    fit.max(STREAM_MAX) / STREAM_MAX * STREAM_MAX
}

/// One window of `m <= STREAM_MAX` activation rows (a decode step, or part of a prompt) in
/// register blocks of 8 rows, then 4, then one block of the 1-3 rows left, each resolved to slices
/// once per task (not per weight row: that cost a visible part of a decode step). Each block reads
/// the weight row once; it stays in L1 across blocks; 8 rows amortize a block's unpacking best
/// while the accumulators still fit in registers.
struct RowBlocks<'a> {
    eights: [Option<ActRows<'a, 8>>; STREAM_MAX / 8],
    four: Option<ActRows<'a, MID_BLOCK>>,
    three: Option<ActRows<'a, 3>>,
    two: Option<ActRows<'a, 2>>,
    one: Option<ActRows<'a, 1>>,
}

impl<'a> RowBlocks<'a> {
    fn new(acts: &'a Activations, r0: usize, m: usize) -> Self {
        debug_assert!(m <= STREAM_MAX);
        let at = |r: usize, len: usize| (r + len <= m).then_some(r0 + r);
        let n8 = m / 8 * 8;
        let n4 = n8 + (m - n8) / MID_BLOCK * MID_BLOCK;
        let rest = m - n4;
        Self {
            eights: std::array::from_fn(|i| at(8 * i, 8).map(|r| acts.rows::<8>(r))),
            four: at(n8, MID_BLOCK).map(|r| acts.rows::<MID_BLOCK>(r)),
            three: (rest == 3).then(|| acts.rows::<3>(r0 + n4)),
            two: (rest == 2).then(|| acts.rows::<2>(r0 + n4)),
            one: (rest == 1).then(|| acts.rows::<1>(r0 + n4)),
        }
    }

    /// `put(r, dot(weight row, activation row r))` for every activation row.
    #[inline]
    fn dot(&self, t: GgmlType, row: &[u8], mut put: impl FnMut(usize, f32)) {
        fn emit<const R: usize>(ys: &ActRows<R>, vs: [f32; R], put: &mut impl FnMut(usize, f32)) {
            for (i, v) in vs.into_iter().enumerate() {
                put(ys.r0 + i, v);
            }
        }
        for ys in self.eights.iter().flatten() {
            emit(ys, vec_dot_act_rows(t, row, ys), &mut put);
        }
        if let Some(ys) = &self.four {
            emit(ys, vec_dot_act_rows(t, row, ys), &mut put);
        }
        if let Some(ys) = &self.three {
            emit(ys, vec_dot_act_rows(t, row, ys), &mut put);
        }
        if let Some(ys) = &self.two {
            emit(ys, vec_dot_act_rows(t, row, ys), &mut put);
        }
        if let Some(ys) = &self.one {
            emit(ys, vec_dot_act_rows(t, row, ys), &mut put);
        }
    }

    /// `dot_run` over weight rows `rows`, `RUN_ROWS` at a time; `first`: the window that reads
    /// them from memory. Kept out of line, so the task's row-at-a-time loop beside it stays as
    /// small as it was.
    #[inline(never)]
    fn dot_runs(
        &self,
        w: &Weight,
        rows: Range<usize>,
        first: bool,
        put: &impl Fn(usize, usize, f32),
    ) {
        for n0 in rows.clone().step_by(RUN_ROWS) {
            let n1 = (n0 + RUN_ROWS).min(rows.end);
            let ahead = first.then_some(PREFETCH_AHEAD);
            self.dot_run(w, n0..n1, ahead, |r, j, v| put(r, n0 + j, v));
        }
    }

    /// `put(r, j, dot(weight row rows.start + j, activation row r))` for every activation row and
    /// each of the (up to `RUN_ROWS`) weight rows; `ahead`: prefetch that far past each row read.
    /// Blocks without a run kernel (fewer than 3 rows) take the rows one call each.
    #[inline]
    fn dot_run(
        &self,
        w: &Weight,
        rows: Range<usize>,
        ahead: Option<usize>,
        mut put: impl FnMut(usize, usize, f32),
    ) {
        fn block<const R: usize>(
            w: &Weight,
            rows: Range<usize>,
            ahead: Option<usize>,
            ys: &ActRows<R>,
            put: &mut impl FnMut(usize, usize, f32),
        ) {
            let rb = w.t.row_bytes(w.cols);
            let mut out = [[0.0f32; R]; RUN_ROWS];
            let out = &mut out[..rows.len()];
            if vec_dot_act_rows_run(w.t, w.data, rb, rows.start, ahead, ys, out) {
                for (j, vs) in out.iter().enumerate() {
                    for (i, &v) in vs.iter().enumerate() {
                        put(ys.r0 + i, j, v);
                    }
                }
                return;
            }
            for (j, n) in rows.enumerate() {
                if let Some(a) = ahead {
                    prefetch(w.data, n * rb + a, rb);
                }
                for (i, v) in vec_dot_act_rows(w.t, w.row(n), ys).into_iter().enumerate() {
                    put(ys.r0 + i, j, v);
                }
            }
        }
        // Only the first block of the window reads the rows from memory.
        let mut ahead = ahead;
        for ys in self.eights.iter().flatten() {
            block(w, rows.clone(), ahead.take(), ys, &mut put);
        }
        if let Some(ys) = &self.four {
            block(w, rows.clone(), ahead.take(), ys, &mut put);
        }
        if let Some(ys) = &self.three {
            block(w, rows.clone(), ahead.take(), ys, &mut put);
        }
        if let Some(ys) = &self.two {
            block(w, rows.clone(), ahead.take(), ys, &mut put);
        }
        if let Some(ys) = &self.one {
            block(w, rows.clone(), ahead.take(), ys, &mut put);
        }
    }
}
