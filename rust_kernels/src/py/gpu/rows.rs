//! Python bindings of the device-to-device moves of rows and columns between tensors (row
//! ranges, clones, host writes, column concatenation) that keep recurrent states and kept inputs
//! on the device. Functions of a `GpuDevice` (`gpu_*`), used by
//! `hyserve.model.backend.recurrent_gpu`.

use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::device::GpuDevice;
use super::recurrent::{f32_tensor, rows_of, same_size};
use super::tensor::{Dtype, GpuTensor};
use crate::gpu::ops::{self, CopySpec};
use crate::py::common::value_error;

pub(super) fn ops_copy(dev: &GpuDevice, src: &GpuTensor, dst: &GpuTensor) {
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
    if start + rows_of(&src, per, "put_rows")? > rows {
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

/// dst = src (same size; device to device), submitted at once (a later forward call that is
/// dropped cannot take the copy with it), or with `submit=False` recorded into the pending
/// work (a forward's own state update).
#[pyfunction]
#[pyo3(signature = (dev, src, dst, submit=true))]
fn gpu_copy_into(
    dev: PyRef<'_, GpuDevice>,
    src: PyRef<'_, GpuTensor>,
    dst: PyRef<'_, GpuTensor>,
    submit: bool,
) -> PyResult<()> {
    same_size(&src, &dst, "copy_into")?;
    ops_copy(&dev, &src, &dst);
    if submit {
        dev.gpu.flush();
    }
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
    m.add_function(wrap_pyfunction!(gpu_rows, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_put_rows, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_clone, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_copy_into, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_write, m)?)?;
    m.add_function(wrap_pyfunction!(gpu_concat_columns, m)?)?;
    Ok(())
}
