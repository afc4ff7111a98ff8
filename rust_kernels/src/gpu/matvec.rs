//! Dense matmuls: the activations quantized once per act kind, then one kernel per weight, or in
//! fast numerics one kernel per group of up to four weights that share a format, a row length
//! and their activations (Q/K/V, gate/up, a delta net's input projections): each output's bits
//! are those of its own dispatch, with fewer dispatches for the host to record and the GPU to run.
//!
//! Exact numerics run `matmul.wgsl`, the CPU kernels' eight float lanes. Fast numerics run
//! `matmul_fast.wgsl` for every dense weight format and every batch size: 16 lanes per weight row
//! over consecutive sub-blocks, the step's activations in workgroup memory, a fixed tree join. Each
//! output's order of operations depends on its row alone, so a row's bits never depend on the
//! batch, the chunking of a prompt or the adapter's thread layout (`Gpu::lanes`). F32 weights take
//! the activations as they are (act kind 0 is a plain copy), without a quantization pass; the
//! Q8 kinds are quantized by `quantize_fast.wgsl`, a workgroup per 256 values of a row, unless the
//! pass that made the activations quantized them already (`quantize.rs`).
//! Mixture-of-experts tensors stay on `matmul.wgsl` in both modes (`moe.rs`).

use super::device::{Access, Gpu, GpuBuffer, Kernel};
use super::ops::{self, groups_wrapped, QuantizedAct, QUANT, WEIGHT};
use super::quantize;
use super::weights::GpuWeight;
use super::Numerics;

use Access::{Read, ReadWrite, Uniform};

const MATMUL_FAST_WGSL: &str = include_str!("shaders/matmul_fast.wgsl");

static MATMUL_FAST: Kernel = Kernel {
    name: "matmul_fast",
    sources: &[
        WEIGHT,
        QUANT,
        MATMUL_FAST_WGSL,
        include_str!("shaders/matmul_fast_one.wgsl"),
    ],
    entry: "main",
    bindings: &[
        (0, Read),
        (1, Read),
        (2, Read),
        (3, Read),
        (4, Read),
        (5, ReadWrite),
        (6, Uniform),
    ],
};

static MATMUL_FAST_PARTS: Kernel = Kernel {
    name: "matmul_fast_parts",
    sources: &[
        QUANT,
        MATMUL_FAST_WGSL,
        include_str!("shaders/matmul_fast_parts.wgsl"),
    ],
    entry: "main",
    bindings: &[
        (0, Read),
        (1, Read),
        (2, Read),
        (3, Read),
        (4, Read),
        (5, ReadWrite),
        (6, Uniform),
        (7, Read),
        (8, Read),
        (9, Read),
        (10, ReadWrite),
        (11, ReadWrite),
        (12, ReadWrite),
    ],
};

/// Weights one matmul_fast_parts dispatch takes at most.
const MAX_PARTS: usize = 4;

/// Activation rows per workgroup of matmul_fast.wgsl (its T).
const TILE: usize = 8;

/// Threads per weight row in matmul_fast.wgsl: 16 lanes on GPUs, one thread running the 16 in turn
/// on software adapters (`Gpu::lanes` = 1). The same bits either way.
fn threads(gpu: &Gpu) -> u32 {
    if gpu.lanes() == 1 {
        1
    } else {
        16
    }
}

/// The activations one kernel reads: quantized for the weight's act kind (here, or by the pass
/// that made `x`), or (fast numerics, F32 weights, rows a whole number of sub-blocks long) the
/// input itself.
enum Acts<'a> {
    Quantized(Box<QuantizedAct>),
    Ready(&'a QuantizedAct),
    Raw(&'a GpuBuffer),
}

impl Acts<'_> {
    fn quantized(&self) -> &QuantizedAct {
        match self {
            Acts::Quantized(q) => q,
            Acts::Ready(q) => q,
            Acts::Raw(_) => unreachable!("raw activations are read as they are"),
        }
    }
}

/// `x` (n × cols) times each weight: n × rows each. The activations are quantized once per act
/// kind; `ready` holds x already quantized for one kind (by the norm that wrote x, say).
pub fn matmul_many(
    gpu: &Gpu,
    ws: &[&GpuWeight],
    x: &GpuBuffer,
    n: usize,
    cols: usize,
    ready: Option<&QuantizedAct>,
) -> Vec<GpuBuffer> {
    let fast = gpu.numerics() == Numerics::Fast;
    let mut acts: Vec<(u32, Acts)> = Vec::new();
    if let Some(q) = ready.filter(|q| q.n == n && q.cols == cols) {
        acts.push((q.kind, Acts::Ready(q)));
    }
    // each weight's activations, quantized in the order the weights first need them
    let mut act_of = Vec::with_capacity(ws.len());
    for w in ws {
        let kind = ops::act_kind(w.ggml_type);
        let at = match acts.iter().position(|(k, _)| *k == kind) {
            Some(i) => i,
            None => {
                let a = if fast && kind == 0 && cols.is_multiple_of(32) {
                    Acts::Raw(x)
                } else if fast && kind >= 3 {
                    Acts::Quantized(Box::new(quantize::quantize_fast(gpu, x, n, cols, kind)))
                } else {
                    Acts::Quantized(Box::new(ops::quantize_act(gpu, x, n, cols, kind)))
                };
                acts.push((kind, a));
                acts.len() - 1
            }
        };
        act_of.push(at);
    }
    if !fast {
        return ws
            .iter()
            .zip(&act_of)
            .map(|(w, &at)| ops::matmul(gpu, w, acts[at].1.quantized()))
            .collect();
    }
    let mut out: Vec<Option<GpuBuffer>> = ws.iter().map(|_| None).collect();
    for group in fused_groups(gpu, ws, &act_of) {
        let act = match &acts[act_of[group[0]]].1 {
            Acts::Raw(x) => [x.raw(), &gpu.dummy, &gpu.dummy, &gpu.dummy],
            a => a.quantized().raw(),
        };
        let parts: Vec<&GpuWeight> = group.iter().map(|&i| ws[i]).collect();
        for (i, y) in group.iter().zip(matmul_fast(gpu, &parts, n, act)) {
            out[*i] = Some(y);
        }
    }
    out.into_iter()
        .map(|y| y.expect("every weight in a group"))
        .collect()
}

/// The weights (indices, in order of first appearance) that share a matmul_fast dispatch: up to
/// MAX_PARTS of one format and activations, each in one binding; any other weight alone.
fn fused_groups(gpu: &Gpu, ws: &[&GpuWeight], act_of: &[usize]) -> Vec<Vec<usize>> {
    // matmul_fast_parts binds 12 storage buffers
    let fits = gpu.limits.max_storage_buffers_per_shader_stage >= 12;
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, w) in ws.iter().enumerate() {
        let joins = |g: &Vec<usize>| {
            let first = ws[g[0]];
            fits && g.len() < MAX_PARTS
                && act_of[g[0]] == act_of[i]
                && first.ggml_type == w.ggml_type
                && first.chunks.len() == 1
                && w.chunks.len() == 1
        };
        match groups.iter_mut().find(|g| joins(g)) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

/// Fast numerics: the activations (quants, scales and sums per sub-block, as quantize_act writes
/// them) times each weight's rows: n × rows per weight. One weight: a dispatch per binding of
/// it; several (each in one binding, one format): one dispatch for all.
fn matmul_fast(gpu: &Gpu, ws: &[&GpuWeight], n: usize, act: [&wgpu::Buffer; 4]) -> Vec<GpuBuffer> {
    let outs: Vec<GpuBuffer> = ws
        .iter()
        .map(|w| gpu.alloc((n * w.rows * 4) as u64))
        .collect();
    if let [w] = ws {
        for (buf, row0, rows) in &w.chunks {
            let part = [(buf.raw(), *rows, outs[0].raw(), w.rows)];
            dispatch_fast(gpu, &MATMUL_FAST, w, n, *row0, &part, act);
        }
        return outs;
    }
    let spare = gpu.spare_out.iter().map(|b| (&gpu.dummy, 0, b, 0));
    let parts: Vec<_> = ws
        .iter()
        .zip(&outs)
        .map(|(w, y)| (w.chunks[0].0.raw(), w.rows, y.raw(), w.rows))
        .chain(spare)
        .take(MAX_PARTS)
        .collect();
    dispatch_fast(gpu, &MATMUL_FAST_PARTS, ws[0], n, 0, &parts, act);
    outs
}

/// One matmul_fast dispatch over `parts` (weight binding, its rows, output, output row length;
/// parts without rows are unused), whose weights share `w`'s format and row length.
fn dispatch_fast(
    gpu: &Gpu,
    kernel: &Kernel,
    w: &GpuWeight,
    n: usize,
    row0: usize,
    parts: &[(&wgpu::Buffer, usize, &wgpu::Buffer, usize)],
    act: [&wgpu::Buffer; 4],
) {
    let threads = threads(gpu);
    let per_wg = 64 / threads as usize; // weight rows per workgroup
    let mut first_group = [u32::MAX; MAX_PARTS];
    let (mut rows, mut out_cols) = ([0u32; MAX_PARTS], [0u32; MAX_PARTS]);
    let mut groups = 0;
    for (k, &(_, r, _, c)) in parts.iter().enumerate().filter(|(_, p)| p.1 > 0) {
        first_group[k] = groups as u32;
        rows[k] = r as u32;
        out_cols[k] = c as u32;
        groups += r.div_ceil(per_wg);
    }
    let (gx, gy) = groups_wrapped(groups);
    let head = [
        w.cols as u32,
        w.row_bytes as u32,
        n as u32,
        row0 as u32,
        gx,
        w.cols.div_ceil(32) as u32,
        0,
        0,
    ];
    let p: Vec<u32> = [head.as_slice(), &first_group, &rows, &out_cols].concat();
    let mut buffers = vec![parts[0].0, act[0], act[1], act[2], act[3], parts[0].2];
    buffers.extend(parts[1..].iter().map(|p| p.0));
    buffers.extend(parts[1..].iter().map(|p| p.2));
    gpu.dispatch(
        kernel,
        &[("FMT", w.ggml_type), ("THREADS", threads)],
        &buffers,
        bytemuck::cast_slice(&p),
        [gx, gy, n.div_ceil(TILE) as u32],
    );
}
