//! One function per operation: each records its dispatches into the pending encoder and returns.
//! Tensors are f32 (or i32 ids/positions) in row-major order; shapes are checked by the callers.

use std::sync::Arc;

use bytemuck::{bytes_of, Pod, Zeroable};

use super::device::{Access, Gpu, GpuBuffer, Kernel};
use super::weights::GpuWeight;

pub(crate) const QUANT: &str = include_str!("shaders/quant.wgsl");
/// The one weight binding that QUANT reads (matmul_fast_parts.wgsl has its own).
pub(crate) const WEIGHT: &str = include_str!("shaders/weight.wgsl");

use Access::{Read, ReadWrite, Uniform};

static QUANTIZE_ACT: Kernel = Kernel {
    name: "quantize_act",
    sources: &[MATH, include_str!("shaders/quantize_act.wgsl")],
    entry: "main",
    bindings: &[
        (0, Read),
        (1, ReadWrite),
        (2, ReadWrite),
        (3, ReadWrite),
        (4, ReadWrite),
        (5, Uniform),
    ],
};
pub(crate) static MATMUL: Kernel = Kernel {
    name: "matmul",
    sources: &[WEIGHT, QUANT, MATH, include_str!("shaders/matmul.wgsl")],
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
    ],
};
static GET_ROWS: Kernel = Kernel {
    name: "get_rows",
    sources: &[WEIGHT, QUANT, include_str!("shaders/get_rows.wgsl")],
    entry: "main",
    bindings: &[(0, Read), (1, Read), (2, ReadWrite), (3, Uniform)],
};
pub(crate) const ACTIVATIONS: &str = include_str!("shaders/activations.wgsl");
pub(crate) const QUANTIZE_FAST_CORE: &str = include_str!("shaders/quantize_fast_core.wgsl");
pub(crate) const MATH: &str = include_str!("shaders/math.wgsl");
pub(crate) const ROPE_PAIR: &str = include_str!("shaders/rope_pair.wgsl");
static ROPE: Kernel = Kernel {
    name: "rope",
    sources: &[MATH, ROPE_PAIR, include_str!("shaders/rope.wgsl")],
    entry: "main",
    bindings: &[(0, ReadWrite), (1, Read), (2, Uniform)],
};
static ELEMENTWISE: Kernel = Kernel {
    name: "elementwise",
    sources: &[MATH, ACTIVATIONS, include_str!("shaders/elementwise.wgsl")],
    entry: "main",
    bindings: &[
        (0, ReadWrite),
        (1, Read),
        (2, Read),
        (3, Uniform),
        (4, Read),
    ],
};
static ARGMAX: Kernel = Kernel {
    name: "argmax",
    sources: &[include_str!("shaders/argmax.wgsl")],
    entry: "main",
    bindings: &[(0, Read), (1, ReadWrite), (2, Uniform)],
};
static COPY: Kernel = Kernel {
    name: "copy",
    sources: &[include_str!("shaders/copy.wgsl")],
    entry: "main",
    bindings: &[(0, Read), (1, Read), (2, ReadWrite), (3, Uniform)],
};
/// Integer f64 emulation (the CPU kernels' f64 sums) and correctly rounded division and sqrt,
/// shared by attention, MoE, norms, activation quantization and SiLU.
pub(crate) const F64: &str = include_str!("shaders/f64.wgsl");
pub(crate) const MAX_GROUPS: u32 = 65535;

/// Workgroups for `n` invocations of 64: (x, y) with x * y * 64 >= n, x within the dispatch limit.
pub(crate) fn groups_1d(n: usize) -> (u32, u32) {
    let g = n.div_ceil(64) as u32;
    let x = g.clamp(1, MAX_GROUPS);
    (x, g.div_ceil(x))
}

/// Workgroups for `n` items of one workgroup each, wrapped onto y.
pub(crate) fn groups_wrapped(n: usize) -> (u32, u32) {
    let x = (n as u32).clamp(1, MAX_GROUPS);
    (x, (n as u32).div_ceil(x))
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct Params8 {
    v: [u32; 8],
}

pub(crate) fn params8(v: [u32; 8]) -> Params8 {
    Params8 { v }
}

/// How a weight format's dot product takes its activations (quantize_act.wgsl's ACT), as the CPU
/// kernels do: f32, f16- or bf16-rounded, Q8_0, Q8_1 or Q8_K.
pub fn act_kind(ggml_type: u32) -> u32 {
    match ggml_type {
        0 => 0,
        1 => 1,
        30 => 2,
        3 | 7 => 4,
        12..=14 => 5,
        _ => 3,
    }
}

/// Activations quantized for one act kind: quants, per-sub-block scales and sums.
pub struct QuantizedAct {
    pub kind: u32,
    pub n: usize,
    pub cols: usize,
    pub(crate) xq: GpuBuffer,
    pub(crate) xd: GpuBuffer,
    pub(crate) xs: GpuBuffer,
    pub(crate) xh: GpuBuffer,
}

impl QuantizedAct {
    /// Room for `x` (n × cols) quantized for act kind `kind`.
    pub(crate) fn alloc(gpu: &Gpu, n: usize, cols: usize, kind: u32) -> Self {
        let n_sub = cols.div_ceil(32);
        QuantizedAct {
            kind,
            n,
            cols,
            xq: gpu.alloc((n * n_sub * 32 * 4) as u64),
            xd: gpu.alloc((n * n_sub * 4) as u64),
            xs: gpu.alloc((n * n_sub * 4) as u64),
            xh: gpu.alloc((n * n_sub * 4) as u64),
        }
    }

    pub(crate) fn raw(&self) -> [&wgpu::Buffer; 4] {
        [self.xq.raw(), self.xd.raw(), self.xs.raw(), self.xh.raw()]
    }
}

/// Quantizes `x` (n × cols) for weights whose act kind is `kind`.
pub fn quantize_act(gpu: &Gpu, x: &GpuBuffer, n: usize, cols: usize, kind: u32) -> QuantizedAct {
    let n_sub = cols.div_ceil(32);
    let per = if kind == 5 { 8 } else { 1 };
    let (gx, gy) = groups_1d(n * n_sub.div_ceil(per));
    let q = QuantizedAct::alloc(gpu, n, cols, kind);
    let p = [n as u32, cols as u32, n_sub as u32, gx];
    let [xq, xd, xs, xh] = q.raw();
    gpu.dispatch(
        &QUANTIZE_ACT,
        &[("ACT", kind)],
        &[x.raw(), xq, xd, xs, xh],
        bytes_of(&p),
        [gx, gy, 1],
    );
    q
}

/// The quantized activations (n × cols) times the weight's rows: n × rows.
pub fn matmul(gpu: &Gpu, w: &GpuWeight, x: &QuantizedAct) -> GpuBuffer {
    debug_assert_eq!(x.kind, act_kind(w.ggml_type));
    let n = x.n;
    let out = gpu.alloc((n * w.rows * 4) as u64);
    let lanes = gpu.lanes();
    for (buf, row0, rows) in &w.chunks {
        // the CPU's eight float lanes of a row on `lanes` threads, 64 threads a workgroup
        let (gx, gy) = groups_wrapped(rows.div_ceil(64 / lanes as usize));
        let mut p = [0u32; 16];
        p[..8].copy_from_slice(&[
            *rows as u32,
            w.cols as u32,
            w.row_bytes as u32,
            n as u32,
            *row0 as u32,
            w.rows as u32,
            gx,
            w.cols.div_ceil(32) as u32,
        ]);
        gpu.dispatch(
            &MATMUL,
            &[("FMT", w.ggml_type), ("LANES", lanes)],
            &[
                buf.raw(),
                x.xq.raw(),
                x.xd.raw(),
                x.xs.raw(),
                x.xh.raw(),
                out.raw(),
                &gpu.dummy,
            ],
            bytes_of(&p),
            [gx, gy, n.div_ceil(8) as u32],
        );
    }
    out
}

/// Rows `ids` (n i32 values) of the weight, dequantized: n × cols.
pub fn get_rows(gpu: &Gpu, w: &GpuWeight, ids: &GpuBuffer, n: usize) -> GpuBuffer {
    let out = gpu.alloc((n * w.cols * 4) as u64);
    let sub_groups = w.cols.div_ceil(32).div_ceil(64) as u32;
    let (gy, gz) = (
        (n as u32).clamp(1, MAX_GROUPS),
        (n as u32).div_ceil(MAX_GROUPS),
    );
    for (buf, row0, rows) in &w.chunks {
        let p = params8([
            *rows as u32,
            w.cols as u32,
            w.row_bytes as u32,
            n as u32,
            *row0 as u32,
            0,
            0,
            0,
        ]);
        gpu.dispatch(
            &GET_ROWS,
            &[("FMT", w.ggml_type)],
            &[buf.raw(), ids.raw(), out.raw()],
            bytes_of(&p),
            [sub_groups, gy, gz],
        );
    }
    out
}

/// Rotary embedding settings (see rope.wgsl).
pub struct Rope {
    pub n_head: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub neox: bool,
}

/// RoPE in place on `rows` rows of n_head × head_dim; `table` holds each row's (cos, sin) per
/// rotated pair.
pub fn rope(gpu: &Gpu, x: &GpuBuffer, rows: usize, table: &GpuBuffer, r: &Rope) {
    let total = rows * r.n_head * (r.n_rot / 2);
    let (gx, gy) = groups_1d(total);
    let p = params8([
        r.n_head as u32,
        r.head_dim as u32,
        r.n_rot as u32,
        u32::from(r.neox),
        0,
        0,
        total as u32,
        gx,
    ]);
    gpu.dispatch(
        &ROPE,
        &[],
        &[x.raw(), table.raw()],
        bytes_of(&p),
        [gx, gy, 1],
    );
}

/// The element-wise operations of elementwise.wgsl.
#[derive(Clone, Copy, Debug)]
pub enum Elementwise {
    Add = 0,
    Mul = 1,
    Scale = 2,
    AddRow = 3,
    Geglu = 4,
    Swiglu = 5,
    Softcap = 6,
    Silu = 7,
    MulSilu = 8,
}

#[allow(clippy::too_many_arguments)]
/// `dst[i] = op(...)` for i < n; `m` is the row length of AddRow, `s` the scalar of Scale/Softcap.
pub fn elementwise(
    gpu: &Gpu,
    op: Elementwise,
    dst: &GpuBuffer,
    a: Option<&GpuBuffer>,
    b: Option<&GpuBuffer>,
    n: usize,
    m: usize,
    s: f32,
) {
    let (gx, gy) = groups_1d(n);
    let p = [n as u32, m as u32, s.to_bits(), gx];
    let (a, b) = (
        a.map_or(&gpu.dummy, GpuBuffer::raw),
        b.map_or(&gpu.dummy, GpuBuffer::raw),
    );
    let table = match op {
        Elementwise::Geglu => Some(gelu_table(gpu)),
        _ => None,
    };
    let table_raw = table.as_deref().map_or(&gpu.dummy, GpuBuffer::raw);
    gpu.dispatch(
        &ELEMENTWISE,
        &[("OP", op as u32)],
        &[dst.raw(), a, b, table_raw],
        bytes_of(&p),
        [gx, gy, 1],
    );
}

/// ggml's GELU table (activations.wgsl), uploaded once per device.
pub(crate) fn gelu_table(gpu: &Gpu) -> Arc<GpuBuffer> {
    gpu.constant("gelu_table", || {
        bytemuck::cast_slice(crate::ops::gelu_table()).to_vec()
    })
}

/// Where `copy` reads and writes: rows `ids` (or 0..rows) of `src`, columns src_col0.., into
/// columns dst_col0.. of `dst`.
pub struct CopySpec {
    pub rows: usize,
    pub cols: usize,
    pub src_stride: usize,
    pub src_col0: usize,
    pub dst_stride: usize,
    pub dst_col0: usize,
}

pub fn copy(gpu: &Gpu, src: &GpuBuffer, ids: Option<&GpuBuffer>, dst: &GpuBuffer, c: &CopySpec) {
    let (gx, gy) = groups_1d(c.rows * c.cols);
    let p = params8([
        c.rows as u32,
        c.cols as u32,
        c.src_stride as u32,
        c.src_col0 as u32,
        c.dst_stride as u32,
        c.dst_col0 as u32,
        u32::from(ids.is_some()),
        gx,
    ]);
    let ids = ids.map_or(&gpu.dummy, GpuBuffer::raw);
    gpu.dispatch(
        &COPY,
        &[],
        &[src.raw(), ids, dst.raw()],
        bytes_of(&p),
        [gx, gy, 1],
    );
}

/// `dst[r]` = the first column of row r's largest value in `src` (`rows` x `cols`), as an f32.
pub fn argmax_rows(gpu: &Gpu, src: &GpuBuffer, dst: &GpuBuffer, rows: usize, cols: usize) {
    let (gx, gy) = groups_wrapped(rows);
    let p = [rows as u32, cols as u32, gx, 0];
    gpu.dispatch(
        &ARGMAX,
        &[],
        &[src.raw(), dst.raw()],
        bytes_of(&p),
        [gx, gy, 1],
    );
}
