//! Python binding of the per-dispatch timestamp queries (`gpu::profile`), for bench/gpu_bench.py.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::prelude::*;

use super::device::GpuDevice;
use crate::gpu::Gpu;
use crate::py::common::value_error;

/// Times every dispatch of a device with timestamp queries while started (each submission then
/// waits for its timestamps: for profiling only, not for serving).
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuTimestamps {
    gpu: Arc<Gpu>,
}

#[pymethods]
impl GpuTimestamps {
    #[new]
    fn new(device: PyRef<'_, GpuDevice>) -> Self {
        Self {
            gpu: device.gpu.clone(),
        }
    }

    /// Whether the adapter has timestamp queries (wgpu's TIMESTAMP_QUERY).
    #[getter]
    fn supported(&self) -> bool {
        self.gpu.has_timestamps()
    }

    fn start(&self) -> PyResult<()> {
        self.gpu.set_profiling(true).map_err(value_error)
    }

    fn stop(&self) -> PyResult<()> {
        self.gpu.set_profiling(false).map_err(value_error)
    }

    /// {kernel name: (seconds, passes)} since the last call, and the passes left untimed.
    fn take(&self, py: Python<'_>) -> (HashMap<String, (f64, u64)>, u64) {
        let gpu = &self.gpu;
        let (totals, untimed) = py.detach(|| gpu.take_profile());
        (
            totals
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            untimed,
        )
    }
}
