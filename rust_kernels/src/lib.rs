//! hyserve-kernels: SIMD CPU kernels for the hyserve service, exposed to Python with PyO3.
//!
//! The kernels live in their domain modules below; the Python bindings in `py/` (see its module
//! notes). This file is the module table and the Python module's registration.

pub mod attention;
pub mod cancel;
pub mod gpu;
pub mod matmul;
pub mod moe;
pub mod ops;
mod py;
pub mod quant;
pub mod recurrent;
pub mod simd;
pub mod simd_math;
pub mod spm;
pub mod threads;
pub mod token_table;
pub mod unary;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<py::common::CancelFlag>()?;
    m.add("Cancelled", m.py().get_type::<py::common::Cancelled>())?;
    py::runtime::register(m)?;
    py::matmul::register(m)?;
    py::ops::register(m)?;
    py::recurrent::register(m)?;
    m.add_class::<py::moe::MoeFfn>()?;
    py::gpu::register(m)?;
    py::unary::register(m)?;
    py::gpu::recurrent::register(m)?;
    py::gpu::rows::register(m)?;
    m.add_class::<py::gpu::moe::GpuMoeFfn>()?;
    m.add_class::<py::gpu::timing::GpuTimestamps>()?;
    m.add_class::<py::spm::SpmVocab>()?;
    m.add_class::<py::spm::TokenIndex>()?;
    m.add_function(wrap_pyfunction!(py::gguf::gguf_string_array, m)?)?;
    Ok(())
}
