//! Python binding of the device MoE FFN (`gpu::moe`): one `GpuMoeFfn` per layer, uploaded from
//! the layer's CPU `MoeFfn` (the same GGUF blocks, one upload each).

use std::sync::Arc;

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use pyo3::prelude::*;

use super::device::GpuDevice;
use super::tensor::{Dtype, GpuTensor};
use crate::gpu::moe::{GpuMoe, GpuRoutes};
use crate::gpu::Gpu;
use crate::py::common::value_error;
use crate::py::moe::MoeFfn;

/// A mixture-of-experts FFN whose weights live on a `GpuDevice`, computed as `MoeFfn` computes it.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuMoeFfn {
    gpu: Arc<Gpu>,
    moe: GpuMoe,
    #[pyo3(get)]
    n_expert: usize,
    #[pyo3(get)]
    n_used: usize,
    #[pyo3(get)]
    n_embd: usize,
}

/// Experts (int32) and weights (f32), rows × n_used.
type Routes<'py> = (Bound<'py, PyArray2<i32>>, Bound<'py, PyArray2<f32>>);

impl GpuMoeFfn {
    fn rows(&self, x: &GpuTensor, cols: usize) -> PyResult<usize> {
        if x.dtype != Dtype::F32 {
            return Err(value_error("the MoE FFN's input must be f32"));
        }
        let last = *x.shape.last().unwrap_or(&0);
        if last != cols || !x.size().is_multiple_of(cols.max(1)) {
            return Err(value_error(format!(
                "input {:?} is not rows of {cols}",
                x.shape
            )));
        }
        Ok(x.size() / cols.max(1))
    }

    fn read_routes<'py>(&self, py: Python<'py>, r: &GpuRoutes, n: usize) -> Routes<'py> {
        let k = self.n_used;
        let bytes = (n * k * 4) as u64;
        let gpu = &self.gpu;
        let (ids, w) = py.detach(|| {
            (
                gpu.read(r.ids.raw(), 0, bytes),
                gpu.read(r.weights.raw(), 0, bytes),
            )
        });
        let ids: Vec<i32> = bytemuck::pod_collect_to_vec(&ids);
        let w: Vec<f32> = bytemuck::pod_collect_to_vec(&w);
        (
            Array2::from_shape_vec((n, k), ids)
                .unwrap()
                .into_pyarray(py),
            Array2::from_shape_vec((n, k), w).unwrap().into_pyarray(py),
        )
    }
}

#[pymethods]
impl GpuMoeFfn {
    /// Uploads the weights of `ffn` (router, expert tensors in their block formats, shared expert).
    #[new]
    fn new(py: Python<'_>, device: PyRef<'_, GpuDevice>, ffn: PyRef<'_, MoeFfn>) -> PyResult<Self> {
        let gpu = device.gpu.clone();
        let moe = ffn.moe();
        let up = py
            .detach(|| GpuMoe::upload(&gpu, &moe))
            .map_err(value_error)?;
        Ok(Self {
            n_expert: up.n_expert,
            n_used: moe.routing.n_used,
            n_embd: up.n_embd,
            moe: up,
            gpu,
        })
    }

    /// Device bytes of the weights.
    #[getter]
    fn nbytes(&self) -> usize {
        self.moe.bytes()
    }

    /// The FFN output for `x` (rows × n_embd, on the device), recorded like every other op.
    fn __call__(&self, x: PyRef<'_, GpuTensor>) -> PyResult<GpuTensor> {
        let n = self.rows(&x, self.n_embd)?;
        let out = self.moe.forward(&self.gpu, &x.buf, n);
        Ok(GpuTensor::new(out, Dtype::F32, vec![n, self.n_embd]))
    }

    /// The routing of `x` (rows × n_embd), read back: experts in selection order and weights.
    fn route<'py>(&self, py: Python<'py>, x: PyRef<'py, GpuTensor>) -> PyResult<Routes<'py>> {
        let n = self.rows(&x, self.n_embd)?;
        let r = self.moe.route(&self.gpu, &x.buf, n);
        Ok(self.read_routes(py, &r, n))
    }

    /// The routing of router logits (rows × n_expert, on the device), read back.
    fn route_logits<'py>(
        &self,
        py: Python<'py>,
        logits: PyRef<'py, GpuTensor>,
    ) -> PyResult<Routes<'py>> {
        let n = self.rows(&logits, self.n_expert)?;
        let r = self.moe.route_logits(&self.gpu, &logits.buf, n);
        Ok(self.read_routes(py, &r, n))
    }

    fn __repr__(&self) -> String {
        format!(
            "GpuMoeFfn(n_expert={}, n_used={}, n_embd={}, n_ff={})",
            self.n_expert, self.n_used, self.moe.n_embd, self.moe.n_ff
        )
    }
}
