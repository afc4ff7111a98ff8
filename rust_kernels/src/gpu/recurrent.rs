//! The recurrent architectures' operations (Qwen3.5 / Qwen3-Next Gated DeltaNet, Mamba2): causal
//! convolution with carried state, the gated delta rule, the Mamba2 scan, and the small steps
//! around them. Each records its dispatches and returns; shapes are checked by the callers.
//! States are never updated in place: a call reads `state_in` and writes `state_out`, so a forward
//! call that is dropped leaves the sequence's state as it was.

use bytemuck::bytes_of;

use super::device::{Access, Gpu, GpuBuffer, Kernel};
use super::Numerics;

use Access::{Read, ReadWrite, Uniform};

const MATH: &str = include_str!("shaders/math.wgsl");
const CONV: &str = include_str!("shaders/conv1d.wgsl");
const MISC: &str = include_str!("shaders/recurrent_misc.wgsl");
/// The recurrences' sizes and bindings, shared by their exact and fast kernels.
const DELTA_RULE_IO: &str = include_str!("shaders/delta_rule_io.wgsl");
const SCAN_IO: &str = include_str!("shaders/mamba2_scan_io.wgsl");

const CONV_BINDINGS: &[(u32, Access)] = &[
    (0, Read),
    (1, Read),
    (2, Read),
    (3, Read),
    (4, ReadWrite),
    (5, ReadWrite),
    (6, Uniform),
];
static CONV_OUT: Kernel = Kernel {
    name: "conv1d",
    sources: &[MATH, CONV],
    entry: "main",
    bindings: CONV_BINDINGS,
};
static CONV_STATE: Kernel = Kernel {
    name: "conv1d_state",
    sources: &[MATH, CONV],
    entry: "state",
    bindings: CONV_BINDINGS,
};
/// The Mamba2 scan's bindings: six inputs, the output and the new state, the sizes.
const SCAN_BINDINGS: &[(u32, Access)] = &[
    (0, Read),
    (1, Read),
    (2, Read),
    (3, Read),
    (4, Read),
    (5, Read),
    (6, ReadWrite),
    (7, ReadWrite),
    (8, Uniform),
];
const DELTA_RULE_BINDINGS: &[(u32, Access)] = &[
    (0, Read),
    (1, Read),
    (2, Read),
    (3, Read),
    (4, Read),
    (5, ReadWrite),
    (6, ReadWrite),
    (7, Uniform),
];
static DELTA_RULE: Kernel = Kernel {
    name: "delta_rule",
    sources: &[MATH, DELTA_RULE_IO, include_str!("shaders/delta_rule.wgsl")],
    entry: "main",
    bindings: DELTA_RULE_BINDINGS,
};
/// Fast numerics' delta rule: 32 lanes a state row, the row held in registers for the call.
static DELTA_RULE_FAST: Kernel = Kernel {
    name: "delta_rule_fast",
    sources: &[DELTA_RULE_IO, include_str!("shaders/delta_rule_fast.wgsl")],
    entry: "main",
    bindings: DELTA_RULE_BINDINGS,
};
static MAMBA2_SCAN: Kernel = Kernel {
    name: "mamba2_scan",
    sources: &[MATH, SCAN_IO, include_str!("shaders/mamba2_scan.wgsl")],
    entry: "main",
    bindings: SCAN_BINDINGS,
};
/// Fast numerics' Mamba2 scan: 32 lanes a state row, the row held in registers for the call.
static MAMBA2_SCAN_FAST: Kernel = Kernel {
    name: "mamba2_scan_fast",
    sources: &[SCAN_IO, include_str!("shaders/mamba2_scan_fast.wgsl")],
    entry: "main",
    bindings: SCAN_BINDINGS,
};
const MISC_BINDINGS: &[(u32, Access)] = &[
    (0, ReadWrite),
    (1, ReadWrite),
    (2, Read),
    (3, Read),
    (4, Read),
    (5, Read),
    (6, Uniform),
];
static GATES: Kernel = Kernel {
    name: "gdn_gates",
    sources: &[MATH, MISC],
    entry: "gates",
    bindings: MISC_BINDINGS,
};
static SIGMOID_MUL: Kernel = Kernel {
    name: "sigmoid_mul",
    sources: &[MATH, MISC],
    entry: "sigmoid_mul",
    bindings: MISC_BINDINGS,
};
static MUL_ROW: Kernel = Kernel {
    name: "mul_row",
    sources: &[MATH, MISC],
    entry: "mul_row",
    bindings: MISC_BINDINGS,
};
static L2_NORM: Kernel = Kernel {
    name: "l2_norm",
    sources: &[MATH, MISC],
    entry: "l2_norm",
    bindings: MISC_BINDINGS,
};

const MAX_GROUPS: u32 = 65535;

/// Workgroups for `n` invocations of 64: (x, y) with x * y * 64 >= n, x within the dispatch limit.
fn groups_1d(n: usize) -> (u32, u32) {
    let g = n.div_ceil(64) as u32;
    let x = g.clamp(1, MAX_GROUPS);
    (x, g.div_ceil(x))
}

/// A recurrence's kernel for a state row of `width` values (keys, or Mamba2 states): in fast
/// numerics 32 invocations a row with at most 8 values each, held in registers (wider rows, which
/// no published model has, take the one-invocation kernel); in exact numerics one invocation a
/// row (the CPU's order of its sums). Returns the kernel, its invocations per row and whether it
/// is the fast one.
fn recurrence_kernel(
    gpu: &Gpu,
    width: usize,
    exact: &'static Kernel,
    fast: &'static Kernel,
) -> (&'static Kernel, usize, bool) {
    if gpu.numerics() == Numerics::Fast && width <= 256 {
        (fast, 32, true)
    } else {
        (exact, 1, false)
    }
}

/// The token ranges a recurrence over `n` tokens is dispatched in: all at once on hardware. llvmpipe
/// ends a loop after 65,535 iterations of one invocation, so on a software adapter the tokens go
/// in runs short enough for that (`per_token`: the iterations an invocation makes per token), each
/// continuing from the state the last one wrote (the same operations in the same order: the same
/// bits).
fn token_runs(gpu: &Gpu, n: usize, per_token: usize) -> impl Iterator<Item = (usize, usize)> {
    let run = if gpu.is_software() {
        32_768 / per_token
    } else {
        n
    }
    .max(1);
    (0..n).step_by(run).map(move |t0| (t0, (t0 + run).min(n)))
}

/// Where the CPU kernel switches from rounded products to fused multiply-adds for `n` terms.
fn fused_from(n: usize) -> usize {
    let n8 = n & !7;
    if n - n8 >= 4 {
        n8 + 4
    } else {
        n8
    }
}

/// A convolution call's sizes and options.
pub struct Conv {
    pub n: usize,
    pub channels: usize,
    pub kernel: usize,
    pub silu: bool,
}

/// Causal depthwise convolution of `x` (n × channels) continuing from `state_in`
/// ((kernel-1) × channels); returns n × channels outputs and writes the new state to `state_out`
/// (one pass; with no tokens a copy of the state).
pub fn conv1d(
    gpu: &Gpu,
    x: &GpuBuffer,
    weight: &GpuBuffer,
    bias: Option<&GpuBuffer>,
    state_in: &GpuBuffer,
    state_out: &GpuBuffer,
    c: &Conv,
) -> GpuBuffer {
    let out = gpu.alloc((c.n * c.channels * 4) as u64);
    let bias_buf = bias.map_or(&gpu.dummy, GpuBuffer::raw);
    let params = |total: usize, gx: u32| {
        [
            c.n as u32,
            c.channels as u32,
            c.kernel as u32,
            u32::from(bias.is_some()),
            u32::from(c.silu),
            fused_from(c.kernel) as u32,
            total as u32,
            gx,
        ]
    };
    let buffers = [
        x.raw(),
        weight.raw(),
        bias_buf,
        state_in.raw(),
        out.raw(),
        state_out.raw(),
    ];
    if c.n == 0 {
        // no token to carry it: the state entry copies the state over
        let state_len = (c.kernel - 1) * c.channels;
        let (gx, gy) = groups_1d(state_len);
        gpu.dispatch(
            &CONV_STATE,
            &[],
            &buffers,
            bytes_of(&params(state_len, gx)),
            [gx, gy, 1],
        );
        return out;
    }
    // the outputs, and the new state by the last token's invocations
    let (gx, gy) = groups_1d(c.n * c.channels);
    gpu.dispatch(
        &CONV_OUT,
        &[],
        &buffers,
        bytes_of(&params(c.n * c.channels, gx)),
        [gx, gy, 1],
    );
    out
}

/// Sizes of a gated delta rule call (see delta_rule.wgsl).
pub struct DeltaRule {
    pub n: usize,
    pub nk: usize,
    pub nv: usize,
    pub dk: usize,
    pub dv: usize,
    pub grouped: bool,
    /// values per token row of the qk input (its q then k heads at the start)
    pub qk_stride: usize,
    /// fast numerics: L2-normalise q and k in the kernel as `rms_norm(x, eps) * weight` would
    /// (eps, weight), instead of reading them normalised
    pub l2: Option<(f32, f32)>,
}

/// Where the gated delta rule reads v: `stride` values per token row, v at `offset` in it.
pub struct VColumns {
    pub stride: usize,
    pub offset: usize,
}

/// The gated delta rule over `n` tokens; `qk` holds each token's q then k heads at the start of
/// rows of `s.qk_stride`, `v` its v heads at `v_at`. Returns n × nv × dv, writes the new state to
/// `state_out`.
#[allow(clippy::too_many_arguments)]
pub fn delta_rule(
    gpu: &Gpu,
    qk: &GpuBuffer,
    v: &GpuBuffer,
    v_at: &VColumns,
    g: &GpuBuffer,
    beta: &GpuBuffer,
    state_in: &GpuBuffer,
    state_out: &GpuBuffer,
    s: &DeltaRule,
) -> GpuBuffer {
    let out = gpu.alloc((s.n * s.nv * s.dv * 4) as u64);
    let (kernel, lanes, fast) = recurrence_kernel(gpu, s.dk, &DELTA_RULE, &DELTA_RULE_FAST);
    let (gx, gy) = groups_1d(s.nv * s.dv * lanes);
    let scale = 1.0f32 / (s.dk as f32).sqrt();
    assert!(
        s.l2.is_none() || gpu.numerics() == Numerics::Fast,
        "the delta rule normalises q and k itself in fast numerics only"
    );
    let buffers = [
        qk.raw(),
        v.raw(),
        g.raw(),
        beta.raw(),
        state_in.raw(),
        state_out.raw(),
        out.raw(),
    ];
    // an exact-mode invocation loops over its whole row per token, a fast one over 8 keys at a time
    for (t0, t1) in token_runs(gpu, s.n, if fast { 64 } else { 4 * s.dk + 64 }) {
        let p = [
            t1 as u32,
            s.nk as u32,
            s.nv as u32,
            s.dk as u32,
            s.dv as u32,
            u32::from(s.grouped),
            scale.to_bits(),
            gx,
            v_at.stride as u32,
            v_at.offset as u32,
            s.qk_stride as u32,
            u32::from(s.l2.is_some()),
            s.l2.map_or(0, |(eps, _)| eps.to_bits()),
            s.l2.map_or(0, |(_, w)| w.to_bits()),
            t0 as u32,
            0,
        ];
        gpu.dispatch(kernel, &[], &buffers, bytes_of(&p), [gx, gy, 1]);
    }
    out
}

/// Sizes of a Mamba2 scan call (see mamba2_scan.wgsl).
pub struct Mamba2 {
    pub n: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub n_groups: usize,
    pub d_state: usize,
}

/// The Mamba2 scan with D skip over `n` tokens; `heads` holds A, D and dt_bias (3 × H). Returns
/// n × H × P, writes the new state to `state_out`.
#[allow(clippy::too_many_arguments)]
pub fn mamba2_scan(
    gpu: &Gpu,
    x: &GpuBuffer,
    dt: &GpuBuffer,
    b: &GpuBuffer,
    c: &GpuBuffer,
    heads: &GpuBuffer,
    state_in: &GpuBuffer,
    state_out: &GpuBuffer,
    s: &Mamba2,
) -> GpuBuffer {
    let out = gpu.alloc((s.n * s.n_heads * s.head_dim * 4) as u64);
    let (kernel, lanes, fast) = recurrence_kernel(gpu, s.d_state, &MAMBA2_SCAN, &MAMBA2_SCAN_FAST);
    let (gx, gy) = groups_1d(s.n_heads * s.head_dim * lanes);
    let buffers = [
        x.raw(),
        dt.raw(),
        b.raw(),
        c.raw(),
        heads.raw(),
        state_in.raw(),
        state_out.raw(),
        out.raw(),
    ];
    for (t0, t1) in token_runs(gpu, s.n, if fast { 64 } else { 2 * s.d_state + 64 }) {
        let p = [
            t1 as u32,
            s.n_heads as u32,
            s.head_dim as u32,
            s.n_groups as u32,
            s.d_state as u32,
            gx,
            t0 as u32,
            0,
        ];
        gpu.dispatch(kernel, &[], &buffers, bytes_of(&p), [gx, gy, 1]);
    }
    out
}

/// Where sigmoid_mul reads `a` for dst's rows of m: `stride` values from one row to the next,
/// starting at column `offset` (the gated attention's gate, the second half of each head).
pub struct RowsOfA {
    pub stride: usize,
    pub offset: usize,
}

impl RowsOfA {
    /// a laid out as dst (with m = 1)
    pub const WHOLE: RowsOfA = RowsOfA {
        stride: 1,
        offset: 0,
    };
}

/// One dispatch of a recurrent_misc.wgsl entry over `n` invocations.
#[allow(clippy::too_many_arguments)]
fn misc(
    gpu: &Gpu,
    k: &Kernel,
    dst: &GpuBuffer,
    dst2: Option<&GpuBuffer>,
    inputs: [Option<&GpuBuffer>; 4],
    n: usize,
    m: usize,
    eps: f32,
    a_rows: RowsOfA,
) {
    let (gx, gy) = groups_1d(n);
    let p: [u32; 8] = [
        n as u32,
        m as u32,
        eps.to_bits(),
        gx,
        a_rows.stride as u32,
        a_rows.offset as u32,
        0,
        0,
    ];
    // an unused writable slot may not alias the read-only dummy
    let spare = gpu.alloc(16);
    let dst2 = dst2.unwrap_or(&spare);
    let [a, b, c, d] = inputs.map(|t| t.map_or(&gpu.dummy, GpuBuffer::raw));
    gpu.dispatch(
        k,
        &[],
        &[dst.raw(), dst2.raw(), a, b, c, d],
        bytes_of(&p),
        [gx, gy, 1],
    );
}

/// The Gated DeltaNet gates of n × m values: g = softplus(a + dt_bias) · A, beta = sigmoid(b).
pub fn gdn_gates(
    gpu: &Gpu,
    b: &GpuBuffer,
    a: &GpuBuffer,
    dt_bias: &GpuBuffer,
    neg_a: &GpuBuffer,
    n: usize,
    m: usize,
) -> (GpuBuffer, GpuBuffer) {
    let g = gpu.alloc((n * 4) as u64);
    let beta = gpu.alloc((n * 4) as u64);
    misc(
        gpu,
        &GATES,
        &g,
        Some(&beta),
        [Some(a), Some(b), Some(dt_bias), Some(neg_a)],
        n,
        m,
        0.0,
        RowsOfA::WHOLE,
    );
    (g, beta)
}

/// dst *= sigmoid(gate) over n values in rows of m, the gate's rows read as `gate_rows` says
/// (columns of a wider tensor read in place; `m` = 1 and `RowsOfA::WHOLE`: element-wise).
pub fn sigmoid_mul(
    gpu: &Gpu,
    dst: &GpuBuffer,
    gate: &GpuBuffer,
    n: usize,
    m: usize,
    gate_rows: RowsOfA,
) {
    misc(
        gpu,
        &SIGMOID_MUL,
        dst,
        None,
        [Some(gate), None, None, None],
        n,
        m,
        0.0,
        gate_rows,
    );
}

/// dst[i] *= w[i % m] over n values.
pub fn mul_row(gpu: &Gpu, dst: &GpuBuffer, w: &GpuBuffer, n: usize, m: usize) {
    misc(
        gpu,
        &MUL_ROW,
        dst,
        None,
        [Some(w), None, None, None],
        n,
        m,
        0.0,
        RowsOfA::WHOLE,
    );
}

/// x / max(|x|, eps) for each of `rows` rows of `m`: a new buffer.
pub fn l2_norm(gpu: &Gpu, x: &GpuBuffer, rows: usize, m: usize, eps: f32) -> GpuBuffer {
    let out = gpu.alloc((rows * m * 4) as u64);
    misc(
        gpu,
        &L2_NORM,
        &out,
        None,
        [Some(x), None, None, None],
        rows,
        m,
        eps,
        RowsOfA::WHOLE,
    );
    out
}
