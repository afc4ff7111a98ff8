//! Python bindings of the GPU path: a device, tensors and weights that live on it, and its ops.
//! The Python side (`hyserve.model.backend.gpu`) wraps these in the same interface as the CPU ops.
//!
//! `GpuDevice`'s methods come in one `#[pymethods]` block per domain (PyO3's `multiple-pymethods`):
//! `device` (opening, uploads, read-backs), `ops` (matmul, RoPE, element-wise, copies), `norms`
//! (RMSNorms), `attention` (K/V caches), `capture` (captured forwards and their replays); `tensor`
//! holds the classes the device hands out. `recurrent` has the
//! recurrent architectures' ops (functions of a device), `rows` the moves of rows and columns
//! between tensors, `moe` the MoE FFN, `timing` the
//! per-dispatch timestamp queries.

mod attention;
mod capture;
pub(crate) mod device;
pub(crate) mod moe;
mod norms;
mod ops;
pub(crate) mod recurrent;
pub(crate) mod rows;
pub(crate) mod tensor;
pub(crate) mod timing;

use pyo3::prelude::*;

use device::GpuDevice;
use tensor::{GpuKvCache, GpuMatrix, GpuTensor};

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GpuDevice>()?;
    m.add_class::<GpuTensor>()?;
    m.add_class::<GpuMatrix>()?;
    m.add_class::<GpuKvCache>()?;
    m.add_class::<capture::GpuPlan>()?;
    Ok(())
}
