//! Dense matmuls: the activations quantized once per act kind, then one kernel per weight.
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

use bytemuck::bytes_of;

use super::device::{Access, Gpu, GpuBuffer, Kernel};
use super::ops::{self, groups_wrapped, QuantizedAct};
use super::quantize;
use super::weights::GpuWeight;
use super::Numerics;

use Access::{Read, ReadWrite, Uniform};

static MATMUL_FAST: Kernel = Kernel {
    name: "matmul_fast",
    sources: &[
        include_str!("shaders/quant.wgsl"),
        include_str!("shaders/matmul_fast.wgsl"),
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
    let mut out = Vec::with_capacity(ws.len());
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
        out.push(match (&acts[at].1, fast) {
            (Acts::Raw(x), _) => {
                matmul_fast(gpu, w, n, [x.raw(), &gpu.dummy, &gpu.dummy, &gpu.dummy])
            }
            (a, false) => ops::matmul(gpu, w, a.quantized()),
            (a, true) => matmul_fast(gpu, w, n, a.quantized().raw()),
        });
    }
    out
}

/// Fast numerics: the activations (quants, scales and sums per sub-block, as quantize_act writes
/// them) times the weight's rows: n × rows.
fn matmul_fast(gpu: &Gpu, w: &GpuWeight, n: usize, act: [&wgpu::Buffer; 4]) -> GpuBuffer {
    let out = gpu.alloc((n * w.rows * 4) as u64);
    let threads = threads(gpu);
    for (buf, row0, rows) in &w.chunks {
        let (gx, gy) = groups_wrapped(rows.div_ceil(64 / threads as usize));
        let p: [u32; 8] = [
            *rows as u32,
            w.cols as u32,
            w.row_bytes as u32,
            n as u32,
            *row0 as u32,
            w.rows as u32,
            gx,
            w.cols.div_ceil(32) as u32,
        ];
        gpu.dispatch(
            &MATMUL_FAST,
            &[("FMT", w.ggml_type), ("THREADS", threads)],
            &[buf.raw(), act[0], act[1], act[2], act[3], out.raw()],
            bytes_of(&p),
            [gx, gy, n.div_ceil(TILE) as u32],
        );
    }
    out
}
