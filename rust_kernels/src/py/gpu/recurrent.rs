//! Python bindings of the recurrent architectures' GPU operations (`gpu::recurrent`); the
//! device-to-device copies that keep recurrent states on the device are in `rows`. Functions of a
//! `GpuDevice` (`gpu_*`), used by `hyserve.model.backend.recurrent_gpu`.

use std::sync::Arc;

use pyo3::prelude::*;

use super::device::GpuDevice;
use super::rows::ops_copy;
use super::tensor::{Dtype, GpuTensor};
use crate::gpu::recurrent::{self, Conv, DeltaRule, Mamba2, RowsOfA, VColumns};
use crate::gpu::Numerics;
use crate::py::common::value_error;

pub(super) fn f32_tensor(buf: crate::gpu::GpuBuffer, shape: Vec<usize>) -> GpuTensor {
    GpuTensor::new(buf, Dtype::F32, shape)
}

fn check_f32(ts: &[&GpuTensor], what: &str) -> PyResult<()> {
    if ts.iter().any(|t| t.dtype != Dtype::F32) {
        return Err(value_error(format!("{what}: tensors must be f32")));
    }
    Ok(())
}

/// `t` as rows of `m` values: the row count (an error naming `what` unless m > 0 divides its size).
pub(super) fn rows_of(t: &GpuTensor, m: usize, what: &str) -> PyResult<usize> {
    if m == 0 || !t.size().is_multiple_of(m) {
        return Err(value_error(format!(
            "{what}: {:?} is not rows of {m}",
            t.shape
        )));
    }
    Ok(t.size() / m)
}

/// `a` and `b` hold the same number of values.
pub(super) fn same_size(a: &GpuTensor, b: &GpuTensor, what: &str) -> PyResult<()> {
    if a.size() != b.size() {
        return Err(value_error(format!(
            "{what}: {:?} and {:?} differ in size",
            a.shape, b.shape
        )));
    }
    Ok(())
}

/// A recurrent state of `size` values and the tensor its update goes to: same size, another buffer
/// (a kernel reads the old state while it writes the new one).
fn state_pair(
    state_in: &GpuTensor,
    state_out: &GpuTensor,
    size: usize,
    what: &str,
) -> PyResult<()> {
    if state_in.size() != size || state_out.size() != size {
        return Err(value_error(format!(
            "{what}: states {:?}, {:?} must hold {size} values",
            state_in.shape, state_out.shape
        )));
    }
    if Arc::ptr_eq(&state_in.buf, &state_out.buf) {
        return Err(value_error(format!(
            "{what}: state_in and state_out must be different tensors"
        )));
    }
    Ok(())
}

/// Causal depthwise convolution of x (n × channels) with weight (channels × kernel) continuing
/// from state_in ((kernel-1) × channels); the new state goes to state_out. Returns n × channels.
#[pyfunction]
#[pyo3(signature = (dev, x, weight, state_in, state_out, bias=None, silu=false))]
#[allow(clippy::too_many_arguments)]
fn gpu_conv1d(
    dev: PyRef<'_, GpuDevice>,
    x: PyRef<'_, GpuTensor>,
    weight: PyRef<'_, GpuTensor>,
    state_in: PyRef<'_, GpuTensor>,
    state_out: PyRef<'_, GpuTensor>,
    bias: Option<PyRef<'_, GpuTensor>>,
    silu: bool,
) -> PyResult<GpuTensor> {
    check_f32(&[&x, &weight, &state_in, &state_out], "conv1d")?;
    let channels = *x.shape.last().unwrap_or(&0);
    let kernel = rows_of(&weight, channels, "conv1d (weight per channel)")?;
    let n = x.size() / channels;
    if kernel == 0 {
        return Err(value_error("conv1d: empty kernel"));
    }
    state_pair(&state_in, &state_out, (kernel - 1) * channels, "conv1d")?;
    if bias.as_ref().is_some_and(|b| b.size() != channels) {
        return Err(value_error("conv1d: bias must have one value per channel"));
    }
    let c = Conv {
        n,
        channels,
        kernel,
        silu,
    };
    let b = bias.as_ref().map(|b| &*b.buf);
    let out = recurrent::conv1d(
        &dev.gpu,
        &x.buf,
        &weight.buf,
        b,
        &state_in.buf,
        &state_out.buf,
        &c,
    );
    Ok(f32_tensor(out, vec![n, channels]))
}

/// The gated delta rule: qk (n × 2·nk·dk: each token's q heads then its k heads, L2-normalised;
/// or with `l2 = (eps, weight)`, fast numerics, any n rows that start with q and k as they are,
/// normalised in the kernel as `rms_norm(x, eps) * weight` per head would), v (n rows, its nv·dv
/// values from column `v_offset` on: the rest of a row is not read), g, beta (n × nv), states
/// nv × dv × dk. Returns n × nv × dv; the new state goes to state_out.
#[pyfunction]
#[pyo3(signature = (dev, qk, v, v_offset, g, beta, state_in, state_out, nk, nv, grouped, l2 = None))]
#[allow(clippy::too_many_arguments)]
fn gpu_delta_rule(
    dev: PyRef<'_, GpuDevice>,
    qk: PyRef<'_, GpuTensor>,
    v: PyRef<'_, GpuTensor>,
    v_offset: usize,
    g: PyRef<'_, GpuTensor>,
    beta: PyRef<'_, GpuTensor>,
    state_in: PyRef<'_, GpuTensor>,
    state_out: PyRef<'_, GpuTensor>,
    nk: usize,
    nv: usize,
    grouped: bool,
    l2: Option<(f32, f32)>,
) -> PyResult<GpuTensor> {
    check_f32(&[&qk, &v, &g, &beta, &state_in, &state_out], "delta_rule")?;
    if nk == 0 || !nv.is_multiple_of(nk) {
        return Err(value_error(format!(
            "delta_rule: {nv} v heads over {nk} k heads"
        )));
    }
    if l2.is_some() && dev.gpu.numerics() != Numerics::Fast {
        return Err(value_error(
            "delta_rule: q and k are normalised in the kernel in fast numerics only",
        ));
    }
    let n = rows_of(&g, nv, "delta_rule (g per v head)")?;
    if n == 0 {
        ops_copy(&dev, &state_in, &state_out);
        return Ok(f32_tensor(dev.gpu.alloc(0), vec![0, nv, 0]));
    }
    // unnormalised q and k are the first columns of wider rows (the convolution's q|k|v): the
    // state's last dimension says dk; normalised ones are rows of exactly q|k
    let qk_stride = qk.size() / n;
    let dk = match l2 {
        Some(_) => *state_in.shape.last().unwrap_or(&0),
        None => qk_stride / (2 * nk),
    };
    let dv = state_in.size() / (nv * dk.max(1));
    let v_stride = v.size() / n;
    let ok = qk.size() == n * qk_stride
        && 2 * nk * dk <= qk_stride
        && (l2.is_some() || qk_stride == 2 * nk * dk)
        && dk > 0
        && dv > 0
        && v.size() == n * v_stride
        && v_offset + nv * dv <= v_stride;
    if !ok {
        return Err(value_error(format!(
            "delta_rule: qk {:?}, v {:?} from column {v_offset} for {n} rows of {nv} v heads",
            qk.shape, v.shape
        )));
    }
    same_size(&beta, &g, "delta_rule (beta, g)")?;
    state_pair(&state_in, &state_out, nv * dv * dk, "delta_rule")?;
    let s = DeltaRule {
        n,
        nk,
        nv,
        dk,
        dv,
        grouped,
        qk_stride,
        l2,
    };
    let v_at = VColumns {
        stride: v_stride,
        offset: v_offset,
    };
    let out = recurrent::delta_rule(
        &dev.gpu,
        &qk.buf,
        &v.buf,
        &v_at,
        &g.buf,
        &beta.buf,
        &state_in.buf,
        &state_out.buf,
        &s,
    );
    Ok(f32_tensor(out, vec![n, nv, dv]))
}

/// The Mamba2 scan with D skip: x (n × H·P), dt (n × H), heads = [A | D | dt_bias] (3·H, the
/// per-head constants in one binding: the kernel has eight storage bindings; the caller packs
/// them once per layer), b, c (n × G·N), states H × P × N. Returns n × H × P; the new state goes
/// to state_out.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_mamba2_scan(
    dev: PyRef<'_, GpuDevice>,
    x: PyRef<'_, GpuTensor>,
    dt: PyRef<'_, GpuTensor>,
    heads: PyRef<'_, GpuTensor>,
    b: PyRef<'_, GpuTensor>,
    c: PyRef<'_, GpuTensor>,
    state_in: PyRef<'_, GpuTensor>,
    state_out: PyRef<'_, GpuTensor>,
    n_groups: usize,
) -> PyResult<GpuTensor> {
    check_f32(
        &[&x, &dt, &heads, &b, &c, &state_in, &state_out],
        "mamba2_scan",
    )?;
    let nh = heads.size() / 3;
    if n_groups == 0 || nh == 0 || heads.size() != 3 * nh || !nh.is_multiple_of(n_groups) {
        return Err(value_error(format!(
            "mamba2_scan: {} per-head values (A, D, dt_bias) in {n_groups} groups",
            heads.size()
        )));
    }
    let n = rows_of(&dt, nh, "mamba2_scan (dt per head)")?;
    if n == 0 {
        ops_copy(&dev, &state_in, &state_out);
        return Ok(f32_tensor(dev.gpu.alloc(0), vec![0, nh, 0]));
    }
    let (p, ns) = (x.size() / (n * nh), b.size() / (n * n_groups));
    if x.size() != n * nh * p || b.size() != n * n_groups * ns || p == 0 || ns == 0 {
        return Err(value_error(format!(
            "mamba2_scan: x {:?}, B {:?} for {n} rows",
            x.shape, b.shape
        )));
    }
    same_size(&c, &b, "mamba2_scan (C, B)")?;
    state_pair(&state_in, &state_out, nh * p * ns, "mamba2_scan")?;
    let gpu = &dev.gpu;
    let s = Mamba2 {
        n,
        n_heads: nh,
        head_dim: p,
        n_groups,
        d_state: ns,
    };
    let out = recurrent::mamba2_scan(
        gpu,
        &x.buf,
        &dt.buf,
        &b.buf,
        &c.buf,
        &heads.buf,
        &state_in.buf,
        &state_out.buf,
        &s,
    );
    Ok(f32_tensor(out, vec![n, nh, p]))
}

/// Gated DeltaNet gates: (g, beta) = (softplus(a + dt_bias) · neg_a, sigmoid(b)), rows × nv.
#[pyfunction]
fn gpu_gdn_gates(
    dev: PyRef<'_, GpuDevice>,
    b: PyRef<'_, GpuTensor>,
    a: PyRef<'_, GpuTensor>,
    dt_bias: PyRef<'_, GpuTensor>,
    neg_a: PyRef<'_, GpuTensor>,
) -> PyResult<(GpuTensor, GpuTensor)> {
    check_f32(&[&b, &a, &dt_bias, &neg_a], "gdn_gates")?;
    let m = dt_bias.size();
    same_size(&neg_a, &dt_bias, "gdn_gates (A, dt_bias)")?;
    same_size(&a, &b, "gdn_gates (a, b)")?;
    rows_of(&a, m, "gdn_gates (a per head)")?;
    let (g, beta) = recurrent::gdn_gates(
        &dev.gpu,
        &b.buf,
        &a.buf,
        &dt_bias.buf,
        &neg_a.buf,
        a.size(),
        m,
    );
    Ok((
        f32_tensor(g, a.shape.clone()),
        f32_tensor(beta, b.shape.clone()),
    ))
}

/// dst *= sigmoid(gate)
#[pyfunction]
fn gpu_sigmoid_mul(
    dev: PyRef<'_, GpuDevice>,
    dst: PyRef<'_, GpuTensor>,
    gate: PyRef<'_, GpuTensor>,
) -> PyResult<()> {
    check_f32(&[&dst, &gate], "sigmoid_mul")?;
    same_size(&dst, &gate, "sigmoid_mul")?;
    recurrent::sigmoid_mul(&dev.gpu, &dst.buf, &gate.buf, dst.size(), 1, RowsOfA::WHOLE);
    Ok(())
}

/// dst (rows × m) *= sigmoid(x[:, start:start + m]) for a 2-D x of as many rows: the gate read
/// in place from its columns (no copy of them first).
#[pyfunction]
fn gpu_sigmoid_mul_columns(
    dev: PyRef<'_, GpuDevice>,
    dst: PyRef<'_, GpuTensor>,
    x: PyRef<'_, GpuTensor>,
    start: usize,
) -> PyResult<()> {
    check_f32(&[&dst, &x], "sigmoid_mul_columns")?;
    let (rows, m) = dst.rows_cols();
    let (x_rows, x_cols) = x.rows_cols();
    if dst.shape.len() != 2 || x.shape.len() != 2 || x_rows != rows || start + m > x_cols {
        return Err(value_error(format!(
            "sigmoid_mul_columns: {:?} gated by columns {start}.. of {:?}",
            dst.shape, x.shape
        )));
    }
    let gate_rows = RowsOfA {
        stride: x_cols,
        offset: start,
    };
    recurrent::sigmoid_mul(&dev.gpu, &dst.buf, &x.buf, dst.size(), m, gate_rows);
    Ok(())
}

/// dst[r, :] *= w for every row r
#[pyfunction]
fn gpu_mul_row(
    dev: PyRef<'_, GpuDevice>,
    dst: PyRef<'_, GpuTensor>,
    w: PyRef<'_, GpuTensor>,
) -> PyResult<()> {
    check_f32(&[&dst, &w], "mul_row")?;
    let m = w.size();
    rows_of(&dst, m, "mul_row")?;
    recurrent::mul_row(&dev.gpu, &dst.buf, &w.buf, dst.size(), m);
    Ok(())
}

/// x / max(|x|, eps) over groups of n consecutive values (ggml_l2_norm); a new tensor.
#[pyfunction]
fn gpu_l2_norm(
    dev: PyRef<'_, GpuDevice>,
    x: PyRef<'_, GpuTensor>,
    n: usize,
    eps: f32,
) -> PyResult<GpuTensor> {
    check_f32(&[&x], "l2_norm")?;
    let rows = rows_of(&x, n, "l2_norm")?;
    let out = recurrent::l2_norm(&dev.gpu, &x.buf, rows, n, eps);
    Ok(f32_tensor(out, x.shape.clone()))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_conv1d, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_delta_rule, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_mamba2_scan, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_gdn_gates, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_sigmoid_mul, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_sigmoid_mul_columns, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_mul_row, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_l2_norm, m)?)?;
    Ok(())
}
