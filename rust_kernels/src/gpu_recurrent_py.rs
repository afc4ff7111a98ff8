//! Python bindings of the recurrent architectures' GPU operations (`gpu::recurrent`) and of the
//! device-to-device copies that keep recurrent states on the device. Functions of a `GpuDevice`
//! (`gpu_*`), used by `hyserve.model.backend.recurrent_gpu`.

use std::sync::Arc;

use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::gpu::ops::{self, CopySpec};
use crate::gpu::recurrent::{self, Conv, DeltaRule, Mamba2};
use crate::gpu_py::{Dtype, GpuDevice, GpuTensor};
use crate::value_error;

fn f32_tensor(buf: crate::gpu::GpuBuffer, shape: Vec<usize>) -> GpuTensor {
    GpuTensor::new(buf, Dtype::F32, shape)
}

fn check_f32(ts: &[&GpuTensor], what: &str) -> PyResult<()> {
    if ts.iter().any(|t| t.dtype != Dtype::F32) {
        return Err(value_error(format!("{what}: tensors must be f32")));
    }
    Ok(())
}

fn same_buffer(a: &GpuTensor, b: &GpuTensor) -> bool {
    Arc::ptr_eq(&a.buf, &b.buf)
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
    if channels == 0 || !weight.size().is_multiple_of(channels) {
        return Err(value_error(format!(
            "conv1d: weight {:?} for rows of {channels}",
            weight.shape
        )));
    }
    let kernel = weight.size() / channels;
    let n = x.size() / channels;
    if kernel == 0
        || state_in.size() != (kernel - 1) * channels
        || state_out.size() != state_in.size()
    {
        return Err(value_error(format!(
            "conv1d: states must be {} x {channels}",
            kernel.saturating_sub(1)
        )));
    }
    if bias.as_ref().is_some_and(|b| b.size() != channels) {
        return Err(value_error("conv1d: bias must have one value per channel"));
    }
    if same_buffer(&state_in, &state_out) {
        return Err(value_error(
            "conv1d: state_in and state_out must be different tensors",
        ));
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

/// The gated delta rule: q, k (n × nk·dk, L2-normalised), v (n × nv·dv), g, beta (n × nv),
/// states nv × dv × dk. Returns n × nv × dv; the new state goes to state_out.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_delta_rule(
    dev: PyRef<'_, GpuDevice>,
    q: PyRef<'_, GpuTensor>,
    k: PyRef<'_, GpuTensor>,
    v: PyRef<'_, GpuTensor>,
    g: PyRef<'_, GpuTensor>,
    beta: PyRef<'_, GpuTensor>,
    state_in: PyRef<'_, GpuTensor>,
    state_out: PyRef<'_, GpuTensor>,
    nk: usize,
    nv: usize,
    grouped: bool,
) -> PyResult<GpuTensor> {
    check_f32(
        &[&q, &k, &v, &g, &beta, &state_in, &state_out],
        "delta_rule",
    )?;
    if nk == 0 || nv == 0 || !nv.is_multiple_of(nk) || !g.size().is_multiple_of(nv) {
        return Err(value_error(format!(
            "delta_rule: {nv} v heads over {nk} k heads, g {:?}",
            g.shape
        )));
    }
    let n = g.size() / nv;
    if n == 0 {
        ops_copy(&dev, &state_in, &state_out);
        return Ok(f32_tensor(dev.gpu.alloc(0), vec![0, nv, 0]));
    }
    let (dk, dv) = (q.size() / (n * nk), v.size() / (n * nv));
    let ok = q.size() == n * nk * dk
        && k.size() == q.size()
        && v.size() == n * nv * dv
        && beta.size() == n * nv
        && state_in.size() == nv * dv * dk
        && state_out.size() == state_in.size()
        && dk > 0
        && dv > 0;
    if !ok || same_buffer(&state_in, &state_out) {
        return Err(value_error(
            "delta_rule: shapes do not match (or state_in is state_out)",
        ));
    }
    let s = DeltaRule {
        n,
        nk,
        nv,
        dk,
        dv,
        grouped,
    };
    let out = recurrent::delta_rule(
        &dev.gpu,
        &q.buf,
        &k.buf,
        &v.buf,
        &g.buf,
        &beta.buf,
        &state_in.buf,
        &state_out.buf,
        &s,
    );
    Ok(f32_tensor(out, vec![n, nv, dv]))
}

/// The Mamba2 scan with D skip: x (n × H·P), dt (n × H), a, d, dt_bias (H), b, c (n × G·N),
/// states H × P × N. Returns n × H × P; the new state goes to state_out.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn gpu_mamba2_scan(
    dev: PyRef<'_, GpuDevice>,
    x: PyRef<'_, GpuTensor>,
    dt: PyRef<'_, GpuTensor>,
    a: PyRef<'_, GpuTensor>,
    b: PyRef<'_, GpuTensor>,
    c: PyRef<'_, GpuTensor>,
    d: PyRef<'_, GpuTensor>,
    dt_bias: PyRef<'_, GpuTensor>,
    state_in: PyRef<'_, GpuTensor>,
    state_out: PyRef<'_, GpuTensor>,
    n_groups: usize,
) -> PyResult<GpuTensor> {
    check_f32(
        &[&x, &dt, &a, &b, &c, &d, &dt_bias, &state_in, &state_out],
        "mamba2_scan",
    )?;
    let nh = a.size();
    if nh == 0
        || n_groups == 0
        || !nh.is_multiple_of(n_groups)
        || d.size() != nh
        || dt_bias.size() != nh
    {
        return Err(value_error(
            "mamba2_scan: A, D, dt_bias must have one value per head (a multiple of groups)",
        ));
    }
    let n = dt.size() / nh;
    if n == 0 {
        ops_copy(&dev, &state_in, &state_out);
        return Ok(f32_tensor(dev.gpu.alloc(0), vec![0, nh, 0]));
    }
    let (p, ns) = (x.size() / (n * nh), b.size() / (n * n_groups));
    let ok = dt.size() == n * nh
        && x.size() == n * nh * p
        && b.size() == n * n_groups * ns
        && c.size() == b.size()
        && state_in.size() == nh * p * ns
        && state_out.size() == state_in.size()
        && p > 0
        && ns > 0;
    if !ok || same_buffer(&state_in, &state_out) {
        return Err(value_error(
            "mamba2_scan: shapes do not match (or state_in is state_out)",
        ));
    }
    // the per-head values in one binding (A, D, dt_bias): the kernel's eight storage bindings
    let gpu = &dev.gpu;
    let heads = gpu.alloc((3 * nh * 4) as u64);
    for (i, t) in [&a, &d, &dt_bias].iter().enumerate() {
        gpu.copy(
            t.buf.raw(),
            0,
            heads.raw(),
            (i * nh * 4) as u64,
            (nh * 4) as u64,
        );
    }
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
        &heads,
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
    if m == 0 || neg_a.size() != m || a.size() != b.size() || !a.size().is_multiple_of(m) {
        return Err(value_error(
            "gdn_gates: a and b must be rows of len(dt_bias) == len(A)",
        ));
    }
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
    if dst.size() != gate.size() {
        return Err(value_error(format!(
            "sigmoid_mul: {:?} and {:?}",
            dst.shape, gate.shape
        )));
    }
    recurrent::sigmoid_mul(&dev.gpu, &dst.buf, &gate.buf, dst.size());
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
    if m == 0 || !dst.size().is_multiple_of(m) {
        return Err(value_error(format!(
            "mul_row: {:?} is not rows of {m}",
            dst.shape
        )));
    }
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
    if n == 0 || !x.size().is_multiple_of(n) {
        return Err(value_error(format!(
            "l2_norm: {:?} is not rows of {n}",
            x.shape
        )));
    }
    let out = recurrent::l2_norm(&dev.gpu, &x.buf, x.size() / n, n, eps);
    Ok(f32_tensor(out, x.shape.clone()))
}

fn ops_copy(dev: &GpuDevice, src: &GpuTensor, dst: &GpuTensor) {
    dev.gpu
        .copy(src.buf.raw(), 0, dst.buf.raw(), 0, (src.size() * 4) as u64);
}

/// Rows start..stop of a tensor (along its first dimension), as a new tensor.
#[pyfunction]
fn gpu_rows(
    dev: PyRef<'_, GpuDevice>,
    x: PyRef<'_, GpuTensor>,
    start: usize,
    stop: usize,
) -> PyResult<GpuTensor> {
    let rows = x.shape.first().copied().unwrap_or(0);
    if start > stop || stop > rows {
        return Err(value_error(format!("rows {start}..{stop} of {rows}")));
    }
    let per = x.size() / rows.max(1);
    let out = dev.gpu.alloc(((stop - start) * per * 4) as u64);
    dev.gpu.copy(
        x.buf.raw(),
        (start * per * 4) as u64,
        out.raw(),
        0,
        ((stop - start) * per * 4) as u64,
    );
    let mut shape = x.shape.clone();
    if let Some(first) = shape.first_mut() {
        *first = stop - start;
    }
    Ok(GpuTensor::new(out, x.dtype, shape))
}

/// dst[start:start+len(src)] = src (rows along the first dimension; same row length).
#[pyfunction]
fn gpu_put_rows(
    dev: PyRef<'_, GpuDevice>,
    dst: PyRef<'_, GpuTensor>,
    start: usize,
    src: PyRef<'_, GpuTensor>,
) -> PyResult<()> {
    let rows = dst.shape.first().copied().unwrap_or(0);
    let per = dst.size() / rows.max(1);
    if per == 0 || !src.size().is_multiple_of(per) || start + src.size() / per > rows {
        return Err(value_error(format!(
            "put_rows: {:?} at row {start} of {:?}",
            src.shape, dst.shape
        )));
    }
    dev.gpu.copy(
        src.buf.raw(),
        0,
        dst.buf.raw(),
        (start * per * 4) as u64,
        (src.size() * 4) as u64,
    );
    Ok(())
}

/// A copy of a tensor (device to device).
#[pyfunction]
fn gpu_clone(dev: PyRef<'_, GpuDevice>, x: PyRef<'_, GpuTensor>) -> GpuTensor {
    let out = dev.gpu.alloc((x.size() * 4) as u64);
    dev.gpu
        .copy(x.buf.raw(), 0, out.raw(), 0, (x.size() * 4) as u64);
    let mut t = GpuTensor::new(out, x.dtype, x.shape.clone());
    t.host_ids = x.host_ids.clone();
    t
}

/// dst = src (same size; device to device), submitted at once: a later forward call that is
/// dropped cannot take the copy with it.
#[pyfunction]
fn gpu_copy_into(
    dev: PyRef<'_, GpuDevice>,
    src: PyRef<'_, GpuTensor>,
    dst: PyRef<'_, GpuTensor>,
) -> PyResult<()> {
    if src.size() != dst.size() {
        return Err(value_error(format!(
            "copy_into: {:?} into {:?}",
            src.shape, dst.shape
        )));
    }
    ops_copy(&dev, &src, &dst);
    dev.gpu.flush();
    Ok(())
}

/// Writes host f32 values into a tensor (after all work recorded so far).
#[pyfunction]
fn gpu_write(
    dev: PyRef<'_, GpuDevice>,
    dst: PyRef<'_, GpuTensor>,
    a: PyReadonlyArrayDyn<'_, f32>,
) -> PyResult<()> {
    let s = a
        .as_slice()
        .map_err(|_| value_error("array must be C-contiguous"))?;
    if s.len() != dst.size() || a.shape().iter().product::<usize>() != dst.size() {
        return Err(value_error(format!(
            "write: {:?} into {:?}",
            a.shape(),
            dst.shape
        )));
    }
    dev.gpu.write(dst.buf.raw(), 0, bytemuck::cast_slice(s));
    Ok(())
}

/// The 2-D tensors side by side (same row count): rows × sum of their widths.
#[pyfunction]
fn gpu_concat_columns(
    dev: PyRef<'_, GpuDevice>,
    parts: Vec<PyRef<'_, GpuTensor>>,
) -> PyResult<GpuTensor> {
    let rows = parts
        .first()
        .map_or(0, |t| t.shape.first().copied().unwrap_or(0));
    let widths: Vec<usize> = parts.iter().map(|t| t.size() / rows.max(1)).collect();
    if parts
        .iter()
        .zip(&widths)
        .any(|(t, &w)| t.size() != rows * w || t.dtype != Dtype::F32)
    {
        return Err(value_error(
            "concat_columns: f32 parts of the same row count",
        ));
    }
    let total: usize = widths.iter().sum();
    let out = dev.gpu.alloc((rows * total * 4) as u64);
    let mut col0 = 0;
    for (t, &w) in parts.iter().zip(&widths) {
        let spec = CopySpec {
            rows,
            cols: w,
            src_stride: w,
            src_col0: 0,
            dst_stride: total,
            dst_col0: col0,
        };
        ops::copy(&dev.gpu, &t.buf, None, &out, &spec);
        col0 += w;
    }
    Ok(f32_tensor(out, vec![rows, total]))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gpu_conv1d, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_delta_rule, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_mamba2_scan, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_gdn_gates, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_sigmoid_mul, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_mul_row, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_l2_norm, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_rows, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_put_rows, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_clone, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_copy_into, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_write, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_concat_columns, m)?)?;
    Ok(())
}
