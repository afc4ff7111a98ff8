//! The classes a `GpuDevice` hands out: tensors in device memory, weight matrices in their GGUF
//! block formats and per-layer K/V caches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use numpy::PyArrayDyn;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::gpu::ops::QuantizedAct;
use crate::gpu::{Gpu, GpuBuffer, GpuWeight};
use crate::py::common::value_error;

/// f32 values, or i32 ids/positions (both 4 bytes a value).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Dtype {
    F32,
    I32,
}

/// A tensor in device memory (row-major). `reshape` shares the buffer, like a numpy view.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuTensor {
    pub(crate) buf: Arc<GpuBuffer>,
    pub(crate) dtype: Dtype,
    #[pyo3(get)]
    pub(crate) shape: Vec<usize>,
    /// positions uploaded by `ids`: their host values and the RoPE cos/sin tables built from them
    /// (every layer with the same RoPE settings reuses one)
    pub(crate) host_ids: Option<Arc<HostIds>>,
    /// the values quantized for a matmul by the pass that wrote them (see `FreshActs`)
    pub(crate) acts: Option<Arc<FreshActs>>,
}

/// A tensor's values quantized for a matmul by the pass that wrote them (a norm told what it
/// feeds). They describe the values only while the device has recorded nothing since that pass
/// (`Gpu::recorded` still `at`): no later command can have written the tensor in between.
pub(crate) struct FreshActs {
    pub(crate) at: u64,
    pub(crate) act: QuantizedAct,
}

impl FreshActs {
    /// The quants, if still valid on `gpu`.
    pub(crate) fn current(&self, gpu: &Gpu) -> Option<&QuantizedAct> {
        (gpu.recorded() == self.at).then_some(&self.act)
    }
}

pub(crate) struct HostIds {
    pub(super) values: Mutex<Vec<i32>>,
    pub(super) rope_tables: Mutex<HashMap<RopeKey, Arc<GpuBuffer>>>,
}

/// A RoPE table's settings: rotated dims, base and frequency scale (as f32 bits).
pub(crate) type RopeKey = (usize, u32, u32);

impl GpuTensor {
    pub(crate) fn size(&self) -> usize {
        self.shape.iter().product()
    }
    pub(super) fn rows_cols(&self) -> (usize, usize) {
        let cols = *self.shape.last().unwrap_or(&1);
        (self.size() / cols.max(1), cols)
    }
    pub(crate) fn new(buf: GpuBuffer, dtype: Dtype, shape: Vec<usize>) -> Self {
        Self {
            buf: Arc::new(buf),
            dtype,
            shape,
            host_ids: None,
            acts: None,
        }
    }
}

#[pymethods]
impl GpuTensor {
    /// The same values under another shape (one dimension may be -1): `t.reshape(2, -1)` or
    /// `t.reshape((2, -1))`.
    #[pyo3(signature = (*dims))]
    fn reshape(&self, dims: &Bound<'_, PyTuple>) -> PyResult<GpuTensor> {
        let dims: Vec<isize> = match dims.len() {
            1 if dims.get_item(0)?.extract::<isize>().is_err() => dims.get_item(0)?.extract()?,
            _ => dims.extract()?,
        };
        let size = self.size();
        let known: usize = dims
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .product();
        let shape: Vec<usize> = dims
            .iter()
            .map(|&d| {
                if d < 0 {
                    size / known.max(1)
                } else {
                    d as usize
                }
            })
            .collect();
        if shape.iter().product::<usize>() != size {
            return Err(value_error(format!(
                "cannot reshape {:?} to {shape:?}",
                self.shape
            )));
        }
        Ok(GpuTensor {
            buf: self.buf.clone(),
            dtype: self.dtype,
            shape,
            host_ids: self.host_ids.clone(),
            acts: self.acts.clone(),
        })
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.size() * 4
    }

    fn __len__(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    fn __repr__(&self) -> String {
        format!("GpuTensor({:?}, {:?})", self.shape, self.dtype)
    }
}

/// A weight matrix uploaded once in its GGUF block format.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuMatrix {
    pub(super) w: GpuWeight,
    #[pyo3(get)]
    pub(super) rows: usize,
    #[pyo3(get)]
    pub(super) cols: usize,
    #[pyo3(get)]
    pub(super) ggml_type: u32,
}

#[pymethods]
impl GpuMatrix {
    #[getter]
    fn nbytes(&self) -> usize {
        self.w.bytes()
    }

    #[getter]
    fn n_bindings(&self) -> usize {
        self.w.chunks.len()
    }
}

/// One layer's K and V cache: f16 pairs packed in u32 words, [n_ctx][n_kv][head_dim].
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuKvCache {
    pub(super) k: GpuBuffer,
    pub(super) v: GpuBuffer,
    #[pyo3(get)]
    pub(super) n_ctx: usize,
    #[pyo3(get)]
    pub(super) n_kv: usize,
    #[pyo3(get)]
    pub(super) head_dim: usize,
}

impl GpuKvCache {
    pub(super) fn row_bytes(&self) -> usize {
        self.n_kv * self.head_dim * 2
    }
}

#[pymethods]
impl GpuKvCache {
    #[getter]
    fn nbytes(&self) -> usize {
        2 * self.n_ctx * self.row_bytes()
    }
}

/// K and V f16 bits of a cache's first positions.
pub(super) type KvBits<'py> = (Bound<'py, PyArrayDyn<u16>>, Bound<'py, PyArrayDyn<u16>>);
