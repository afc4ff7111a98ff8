//! Fast numerics' activation quantization for the Q8 act kinds (Q8_0, Q8_1, Q8_K), in the layout
//! `ops::quantize_act` writes: alone (`quantize_fast`, before a matmul), or in the pass that makes
//! the activations, so that the matmul after it has one pass less to wait for: a gated unit
//! (`gated_quantize`, GEGLU/SwiGLU before a down projection) or an RMSNorm (`ops::rms_norm` with
//! `quantize`). Every form gives the bits of the separate passes it replaces.

use bytemuck::bytes_of;

use super::device::{Access, Gpu, GpuBuffer, Kernel};
use super::ops::{self, groups_wrapped, Elementwise, QuantizedAct};
use super::Numerics;

use Access::{Read, ReadWrite, Uniform};

const QUANTIZE_FAST_MAIN: &str = include_str!("shaders/quantize_fast.wgsl");
/// The bindings of the quants, scales and sums that quantize_fast_core.wgsl writes (xq, xd, xs,
/// xh), in every kernel that includes it.
pub(crate) const OUTPUTS: [(u32, Access); 4] = [
    (5, ReadWrite),
    (6, ReadWrite),
    (7, ReadWrite),
    (8, ReadWrite),
];

static QUANTIZE_FAST: Kernel = Kernel {
    name: "quantize_act_fast",
    sources: &[
        ops::MATH,
        include_str!("shaders/quantize_in.wgsl"),
        ops::QUANTIZE_FAST_CORE,
        QUANTIZE_FAST_MAIN,
    ],
    entry: "main",
    bindings: &[
        (0, Read),
        (1, Uniform),
        OUTPUTS[0],
        OUTPUTS[1],
        OUTPUTS[2],
        OUTPUTS[3],
    ],
};

static GATED_QUANTIZE: Kernel = Kernel {
    name: "gated_quantize",
    sources: &[
        ops::MATH,
        ops::ACTIVATIONS,
        include_str!("shaders/gated_in.wgsl"),
        ops::QUANTIZE_FAST_CORE,
        QUANTIZE_FAST_MAIN,
    ],
    entry: "main",
    bindings: &[
        (0, ReadWrite),
        (1, Uniform),
        (2, Read),
        (3, Read),
        (4, Read),
        OUTPUTS[0],
        OUTPUTS[1],
        OUTPUTS[2],
        OUTPUTS[3],
    ],
};

/// The Q8 act kind that the pass making a matmul's input should quantize it for, if any: in fast
/// numerics, the first Q8 kind among the weights the input feeds.
pub fn q8_kind_fed(gpu: &Gpu, ggml_types: &[u32]) -> Option<u32> {
    if gpu.numerics() != Numerics::Fast {
        return None;
    }
    ggml_types
        .iter()
        .map(|&t| ops::act_kind(t))
        .find(|k| (3..=5).contains(k))
}

/// `x` (n × cols) quantized for act kind 3, 4 or 5, a workgroup per 256 values of a row.
pub fn quantize_fast(gpu: &Gpu, x: &GpuBuffer, n: usize, cols: usize, kind: u32) -> QuantizedAct {
    let q = QuantizedAct::alloc(gpu, n, cols, kind);
    let [xq, xd, xs, xh] = q.raw();
    dispatch(
        gpu,
        &QUANTIZE_FAST,
        &[("ACT", kind)],
        &[x.raw(), xq, xd, xs, xh],
        n,
        cols,
    );
    q
}

/// GEGLU or SwiGLU of `gate` and `up` (n × cols each), and the result quantized for act kind
/// `kind` (3, 4 or 5) in the same pass: the bits of `ops::elementwise` then `quantize_fast`.
pub fn gated_quantize(
    gpu: &Gpu,
    op: Elementwise,
    gate: &GpuBuffer,
    up: &GpuBuffer,
    n: usize,
    cols: usize,
    kind: u32,
) -> (GpuBuffer, QuantizedAct) {
    assert!(
        matches!(op, Elementwise::Geglu | Elementwise::Swiglu),
        "a gated unit is GEGLU or SwiGLU"
    );
    let y = gpu.alloc((n * cols * 4) as u64);
    let q = QuantizedAct::alloc(gpu, n, cols, kind);
    let table = ops::gelu_table(gpu);
    let [xq, xd, xs, xh] = q.raw();
    dispatch(
        gpu,
        &GATED_QUANTIZE,
        &[("ACT", kind), ("GATE", op as u32)],
        &[y.raw(), gate.raw(), up.raw(), table.raw(), xq, xd, xs, xh],
        n,
        cols,
    );
    (y, q)
}

/// One quantize_fast.wgsl dispatch over n rows of `cols` values.
fn dispatch(
    gpu: &Gpu,
    kernel: &Kernel,
    constants: &[(&'static str, u32)],
    buffers: &[&wgpu::Buffer],
    n: usize,
    cols: usize,
) {
    let n_sub = cols.div_ceil(32);
    let (gx, gy) = groups_wrapped(n * n_sub.div_ceil(8));
    let p = [n as u32, cols as u32, n_sub as u32, gx];
    gpu.dispatch(kernel, constants, buffers, bytes_of(&p), [gx, gy, 1]);
}
