//! RMSNorm passes (norm.wgsl): over rows, over groups at the start of wider rows, with the
//! residual add before it, and then in the same pass (fast numerics) the quantization of its
//! result for the matmul it feeds, RoPE of the heads it normalised, or an output gate.

use bytemuck::bytes_of;

use super::device::{Access, Gpu, GpuBuffer, Kernel};
use super::ops::{
    groups_wrapped, QuantizedAct, Rope, ACTIVATIONS, MATH, QUANTIZE_FAST_CORE, ROPE_PAIR,
};
use super::quantize::OUTPUTS;
use super::Numerics;

use Access::{Read, ReadWrite, Uniform};

const NORM: &str = include_str!("shaders/norm.wgsl");
const NORM_IO: &str = include_str!("shaders/norm_io.wgsl");
const NORM_ADD_IO: &str = include_str!("shaders/norm_add_io.wgsl");
const NORM_END: &str = include_str!("shaders/norm_end.wgsl");
const NORM_QUANTIZE_END: &str = include_str!("shaders/norm_quantize_end.wgsl");
static RMS_NORM_ROPE: Kernel = Kernel {
    name: "rms_norm_rope",
    sources: &[
        MATH,
        NORM_IO,
        ROPE_PAIR,
        include_str!("shaders/norm_rope_end.wgsl"),
        NORM,
    ],
    entry: "main",
    bindings: &[
        (0, Read),
        (1, Read),
        (2, ReadWrite),
        (3, Uniform),
        (9, Read),
    ],
};
static RMS_NORM_GATE: Kernel = Kernel {
    name: "rms_norm_gate",
    sources: &[
        MATH,
        NORM_IO,
        ACTIVATIONS,
        include_str!("shaders/norm_gate_end.wgsl"),
        NORM,
    ],
    entry: "main",
    bindings: &[
        (0, Read),
        (1, Read),
        (2, ReadWrite),
        (3, Uniform),
        (4, Read), // activations.wgsl's GELU table: not read by SiLU
        (9, Read),
    ],
};
const NORM_GATED_IO: &str = include_str!("shaders/norm_gated_io.wgsl");
static GATED_RMS_NORM: Kernel = Kernel {
    name: "gated_rms_norm",
    sources: &[MATH, ACTIVATIONS, NORM_GATED_IO, NORM_END, NORM],
    entry: "main",
    bindings: &[
        (0, ReadWrite),
        (1, Read),
        (2, ReadWrite),
        (3, Uniform),
        (4, Read), // activations.wgsl's GELU table: not read by SiLU
        (9, Read),
    ],
};
static GATED_RMS_NORM_QUANTIZE: Kernel = Kernel {
    name: "gated_rms_norm_quantize",
    sources: &[
        MATH,
        ACTIVATIONS,
        NORM_GATED_IO,
        QUANTIZE_FAST_CORE,
        NORM_QUANTIZE_END,
        NORM,
    ],
    entry: "main",
    bindings: &[
        (0, ReadWrite),
        (1, Read),
        (2, ReadWrite),
        (3, Uniform),
        (4, Read),
        OUTPUTS[0],
        OUTPUTS[1],
        OUTPUTS[2],
        OUTPUTS[3],
        (9, Read),
    ],
};
static RMS_NORM: Kernel = Kernel {
    name: "rms_norm",
    sources: &[MATH, NORM_IO, NORM_END, NORM],
    entry: "main",
    bindings: &[(0, Read), (1, Read), (2, ReadWrite), (3, Uniform)],
};
static ADD_RMS_NORM: Kernel = Kernel {
    name: "add_rms_norm",
    sources: &[MATH, NORM_ADD_IO, NORM_END, NORM],
    entry: "main",
    bindings: &[
        (0, ReadWrite),
        (1, Read),
        (2, ReadWrite),
        (3, Uniform),
        (4, Read),
    ],
};
/// The norms that also quantize their rows for the matmul they feed (fast numerics).
static RMS_NORM_QUANTIZE: Kernel = Kernel {
    name: "rms_norm_quantize",
    sources: &[MATH, NORM_IO, QUANTIZE_FAST_CORE, NORM_QUANTIZE_END, NORM],
    entry: "main",
    bindings: &[
        (0, Read),
        (1, Read),
        (2, ReadWrite),
        (3, Uniform),
        OUTPUTS[0],
        OUTPUTS[1],
        OUTPUTS[2],
        OUTPUTS[3],
    ],
};
static ADD_RMS_NORM_QUANTIZE: Kernel = Kernel {
    name: "add_rms_norm_quantize",
    sources: &[
        MATH,
        NORM_ADD_IO,
        QUANTIZE_FAST_CORE,
        NORM_QUANTIZE_END,
        NORM,
    ],
    entry: "main",
    bindings: &[
        (0, ReadWrite),
        (1, Read),
        (2, ReadWrite),
        (3, Uniform),
        (4, Read),
        OUTPUTS[0],
        OUTPUTS[1],
        OUTPUTS[2],
        OUTPUTS[3],
    ],
};

/// The rows an RMSNorm normalises: `rows` rows of `n` values, `per_row` of them side by side at
/// the start of each input row of `x_stride` values (contiguous rows: 1 and `n`).
pub struct NormRows {
    pub rows: usize,
    pub n: usize,
    pub per_row: usize,
    pub x_stride: usize,
}

/// What a norm reads: x, or x + a (written back to x first: a residual stream and the norm after
/// it), or x · silu(gate) (written back to x first: Mamba2's gated norm, whose weight spans the
/// `weight_groups` consecutive groups of a row).
pub enum NormInput<'a> {
    Plain,
    Add(&'a GpuBuffer),
    Gated {
        gate: &'a GpuBuffer,
        weight_groups: usize,
    },
}

/// What a norm's pass does with the rows it has written, before it ends (each the bits of the
/// separate pass it spares).
pub enum AfterNorm<'a> {
    Nothing,
    /// quantize them for matmuls of this Q8 act kind (fast numerics, contiguous rows), as
    /// `matvec::matmul_many` would before its matmuls
    Quantize(u32),
    /// the rows are the heads of q or k: turn them by RoPE (`ops::rope`'s settings and table)
    Rope(&'a GpuBuffer, &'a Rope),
    /// multiply them by silu of this gate, as long as the result and indexed as it (contiguous
    /// rows): the bits of `ops::elementwise`'s `MulSilu` after the norm
    Gate(&'a GpuBuffer),
}

/// RMSNorm of `rows` rows of `n` elements of `input`, times `weight` (length n, or n times a gated
/// input's weight groups) when given; then `after` in the same pass. Returns the rows and, with
/// `AfterNorm::Quantize`, their quants.
pub fn rms_norm(
    gpu: &Gpu,
    x: &GpuBuffer,
    input: NormInput,
    rows: NormRows,
    weight: Option<&GpuBuffer>,
    eps: f32,
    after: AfterNorm,
) -> (GpuBuffer, Option<QuantizedAct>) {
    let out = gpu.alloc((rows.rows * rows.n * 4) as u64);
    let (gx, gy) = groups_wrapped(rows.rows);
    let mut p: [u32; 12] = [
        rows.n as u32,
        rows.rows as u32,
        eps.to_bits(),
        u32::from(weight.is_some()),
        gx,
        rows.per_row as u32,
        rows.x_stride as u32,
        1,
        0,
        0,
        0,
        0,
    ];
    let w = weight.map_or(&gpu.dummy, GpuBuffer::raw);
    let q = match after {
        AfterNorm::Quantize(kind) => {
            assert!(
                gpu.numerics() == Numerics::Fast && (3..=5).contains(&kind) && rows.per_row == 1,
                "a norm quantizes its contiguous rows for a Q8 act kind in fast numerics"
            );
            Some(QuantizedAct::alloc(gpu, rows.rows, rows.n, kind))
        }
        _ => None,
    };
    let mut buffers = vec![x.raw(), w, out.raw()];
    let (add, gate) = match input {
        NormInput::Plain => (None, None),
        NormInput::Add(a) => (Some(a), None),
        NormInput::Gated {
            gate,
            weight_groups,
        } => {
            assert!(
                rows.per_row == 1 && rows.x_stride == rows.n && weight_groups >= 1,
                "a gated norm reads contiguous groups"
            );
            p[7] = weight_groups as u32;
            (None, Some(gate))
        }
    };
    buffers.extend(add.map(GpuBuffer::raw));
    if gate.is_some() {
        buffers.push(&gpu.dummy); // binding 4: activations.wgsl's GELU table, not read by SiLU
    }
    let kernel = match (add.is_some(), gate, &after, &q) {
        (false, None, AfterNorm::Nothing, _) => &RMS_NORM,
        (true, None, AfterNorm::Nothing, _) => &ADD_RMS_NORM,
        (false, Some(gate), AfterNorm::Nothing, _) => {
            buffers.push(gate.raw());
            &GATED_RMS_NORM
        }
        (add, gate, AfterNorm::Quantize(_), Some(q)) => {
            buffers.extend(q.raw());
            match gate {
                Some(gate) => {
                    buffers.push(gate.raw());
                    &GATED_RMS_NORM_QUANTIZE
                }
                None if add => &ADD_RMS_NORM_QUANTIZE,
                None => &RMS_NORM_QUANTIZE,
            }
        }
        (false, None, AfterNorm::Rope(table, r), _) => {
            assert!(
                r.head_dim == rows.n && r.n_rot <= r.head_dim && rows.rows.is_multiple_of(r.n_head),
                "a norm turns whole heads by RoPE"
            );
            p[8..11].copy_from_slice(&[r.n_head as u32, r.n_rot as u32, u32::from(r.neox)]);
            buffers.push(table.raw());
            &RMS_NORM_ROPE
        }
        (false, None, AfterNorm::Gate(gate), _) => {
            assert!(
                rows.per_row == 1 && rows.x_stride == rows.n,
                "a norm gates contiguous rows"
            );
            buffers.extend([&gpu.dummy, gate.raw()]);
            &RMS_NORM_GATE
        }
        _ => unreachable!("only a plain norm is turned or gated after; quants come with Quantize"),
    };
    let act = q.as_ref().map(|q| ("ACT", q.kind));
    gpu.dispatch(kernel, act.as_slice(), &buffers, bytes_of(&p), [gx, gy, 1]);
    (out, q)
}
