//! `GpuDevice`: opening an adapter, what it reports, uploads, read-backs and the recorded work.
//! Its ops and its attention methods are in `ops.rs` and `attention.rs` (more `#[pymethods]`
//! blocks of the same class).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::tensor::{Dtype, FreshActs, GpuMatrix, GpuTensor, HostIds};
use crate::gpu::ops::QuantizedAct;
use crate::gpu::{adapter, quantize, AdapterChoice, Gpu, GpuBuffer, GpuWeight, Numerics};
use crate::py::common::value_error;
use crate::py::matmul::QMatrix;

/// A wgpu device with the model's kernels.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuDevice {
    pub(crate) gpu: Arc<Gpu>,
}

fn f32_bytes(a: &PyReadonlyArrayDyn<'_, f32>) -> PyResult<Vec<u8>> {
    let s = a
        .as_slice()
        .map_err(|_| value_error("array must be C-contiguous"))?;
    Ok(bytemuck::cast_slice(s).to_vec())
}

impl GpuDevice {
    pub(super) fn tensor_of(&self, buf: GpuBuffer, shape: Vec<usize>) -> GpuTensor {
        GpuTensor::new(buf, Dtype::F32, shape)
    }
    /// The Q8 act kind (fast numerics) that a pass making rows of `cols` values should quantize
    /// them for, given the matrices they feed (`feeds`, a hint); None when there is none to make.
    pub(super) fn q8_kind_feeding(
        &self,
        feeds: &Option<Vec<PyRef<'_, GpuMatrix>>>,
        cols: usize,
    ) -> Option<u32> {
        let feeds = feeds.as_ref()?;
        if feeds.iter().any(|w| w.cols != cols) {
            return None;
        }
        let types: Vec<u32> = feeds.iter().map(|w| w.w.ggml_type).collect();
        quantize::q8_kind_fed(&self.gpu, &types)
    }

    /// `t` with the quants the pass that wrote it made (valid until the device records anything
    /// else: `FreshActs`).
    pub(super) fn with_acts(&self, mut t: GpuTensor, q: Option<QuantizedAct>) -> GpuTensor {
        t.acts = q.map(|act| {
            Arc::new(FreshActs {
                at: self.gpu.recorded(),
                act,
            })
        });
        t
    }

    pub(super) fn check(&self, t: &GpuTensor, dtype: Dtype, what: &str) -> PyResult<()> {
        if t.dtype != dtype {
            return Err(value_error(format!(
                "{what} must be {dtype:?}, got {:?}",
                t.dtype
            )));
        }
        Ok(())
    }
}

#[pymethods]
impl GpuDevice {
    /// Opens the best adapter: `backend` "vulkan" | "metal" | "dx12" (None: any), `adapter` a
    /// substring of its name, software adapters only with `allow_software`.
    /// `max_binding` lowers the bytes bound at once (tests split small tensors with it); `lanes`
    /// (1 or 8) sets the threads per weight row of the matmul (default: 1 on software adapters);
    /// `features` names the optional adapter features to use where the adapter has them and they
    /// pass their probes ("subgroups", "f16"; None: all; [] none); the results are the same bits.
    /// `numerics` "fast" (the adapter's float operations) or "exact" (the CPU kernels' bits).
    #[new]
    #[pyo3(signature = (backend=None, adapter=None, allow_software=false, max_binding=None, lanes=None, features=None, numerics="fast"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        backend: Option<String>,
        adapter: Option<String>,
        allow_software: bool,
        max_binding: Option<u64>,
        lanes: Option<u32>,
        features: Option<Vec<String>>,
        numerics: &str,
    ) -> PyResult<Self> {
        if lanes.is_some_and(|l| l != 1 && l != 8) {
            return Err(value_error("lanes must be 1 or 8"));
        }
        let numerics = Numerics::parse(numerics).map_err(value_error)?;
        let choice = AdapterChoice {
            backend,
            name: adapter,
            allow_software,
            max_binding,
            lanes,
            features,
            numerics,
        };
        let gpu = py.detach(|| Gpu::open(&choice)).map_err(value_error)?;
        Ok(Self { gpu: Arc::new(gpu) })
    }

    /// Every adapter found: (description, is software).
    #[staticmethod]
    #[pyo3(signature = (backend=None))]
    fn adapters(py: Python<'_>, backend: Option<String>) -> PyResult<Vec<(String, bool)>> {
        py.detach(|| adapter::list_adapters(backend.as_deref()))
            .map_err(value_error)
    }

    /// "name (backend, device type)"
    #[getter]
    fn name(&self) -> String {
        self.gpu.describe()
    }

    #[getter]
    fn is_software(&self) -> bool {
        self.gpu.is_software()
    }

    #[getter]
    fn max_binding(&self) -> u64 {
        self.gpu.max_binding()
    }

    /// The optional adapter features the shaders use ("subgroups", "f16").
    #[getter]
    fn features(&self) -> Vec<&'static str> {
        self.gpu.features().names()
    }

    /// "fast" or "exact": the shaders' float operations.
    #[getter]
    fn numerics(&self) -> &'static str {
        self.gpu.numerics().name()
    }

    /// Whether the adapter's `fma` rounds once; where not, the shaders compute it in integers.
    #[getter]
    fn fused_fma(&self) -> bool {
        self.gpu.fused_fma()
    }

    /// Uploads a weight matrix in its block format.
    fn matrix(&self, py: Python<'_>, m: PyRef<'_, QMatrix>) -> PyResult<GpuMatrix> {
        let w = m.weight();
        let (t, rows, cols) = (m.ggml_type, m.rows, m.cols);
        let gpu = &self.gpu;
        let w = py
            .detach(|| GpuWeight::upload(gpu, t, w.data, rows, cols))
            .map_err(value_error)?;
        Ok(GpuMatrix {
            w,
            rows,
            cols,
            ggml_type: t,
        })
    }

    /// Uploads an f32 array.
    fn tensor(&self, a: PyReadonlyArrayDyn<'_, f32>) -> PyResult<GpuTensor> {
        let shape = a.shape().to_vec();
        Ok(self.tensor_of(self.gpu.upload(&f32_bytes(&a)?), shape))
    }

    /// Uploads an i32 array (token ids, positions).
    fn ids(&self, a: PyReadonlyArrayDyn<'_, i32>) -> PyResult<GpuTensor> {
        let s = a
            .as_slice()
            .map_err(|_| value_error("ids must be C-contiguous"))?;
        let mut t = GpuTensor::new(
            self.gpu.upload(bytemuck::cast_slice(s)),
            Dtype::I32,
            a.shape().to_vec(),
        );
        t.host_ids = Some(Arc::new(HostIds {
            values: Mutex::new(s.to_vec()),
            rope_tables: Mutex::new(HashMap::new()),
        }));
        Ok(t)
    }

    /// A tensor of the given shape with undefined values (every op that fills one writes it all).
    fn empty(&self, shape: Vec<usize>) -> GpuTensor {
        let n: usize = shape.iter().product();
        self.tensor_of(self.gpu.alloc((n * 4) as u64), shape)
    }

    /// Runs the recorded work and copies the tensor to the host (f32).
    fn to_host<'py>(
        &self,
        py: Python<'py>,
        t: PyRef<'py, GpuTensor>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        self.check(&t, Dtype::F32, "to_host's tensor")?;
        let (buf, bytes) = (t.buf.clone(), (t.size() * 4) as u64);
        let gpu = &self.gpu;
        let data = py.detach(|| gpu.read(buf.raw(), 0, bytes));
        let values: Vec<f32> = bytemuck::pod_collect_to_vec(&data);
        Ok(ArrayD::from_shape_vec(IxDyn(&t.shape), values)
            .unwrap()
            .into_pyarray(py))
    }

    /// Runs the recorded work and copies several f32 tensors to the host with one submission and
    /// one wait (a forward's logits and its kept inputs together).
    fn to_host_many<'py>(
        &self,
        py: Python<'py>,
        ts: Vec<PyRef<'py, GpuTensor>>,
    ) -> PyResult<Vec<Bound<'py, PyArrayDyn<f32>>>> {
        for t in &ts {
            self.check(t, Dtype::F32, "to_host_many's tensors")?;
        }
        let bufs: Vec<(Arc<GpuBuffer>, u64)> = ts
            .iter()
            .map(|t| (t.buf.clone(), (t.size() * 4) as u64))
            .collect();
        let gpu = &self.gpu;
        let data = py.detach(|| {
            let srcs: Vec<(&wgpu::Buffer, u64, u64)> =
                bufs.iter().map(|(b, bytes)| (b.raw(), 0, *bytes)).collect();
            gpu.read_many(&srcs)
        });
        Ok(ts
            .iter()
            .zip(data)
            .map(|(t, bytes)| {
                let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
                ArrayD::from_shape_vec(IxDyn(&t.shape), values)
                    .unwrap()
                    .into_pyarray(py)
            })
            .collect())
    }

    /// Queue submissions since the device opened (a decode step makes one).
    #[getter]
    fn submissions(&self) -> u64 {
        self.gpu.submissions()
    }

    /// Submits the recorded work without waiting.
    fn flush(&self) {
        self.gpu.flush();
    }

    /// Drops the recorded work unrun.
    fn discard(&self) {
        self.gpu.discard();
    }
}
