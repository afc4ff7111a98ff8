//! hyserve-kernels: SIMD CPU kernels for the hyserve service, exposed to Python with PyO3.
//!
//! Every entry point checks shapes, then releases the GIL for the computation. Weights stay in the
//! GGUF memory map: `QMatrix` keeps a reference to the numpy view and reads its bytes in place.
//! The bindings live beside their kernels' domain: `matmul_py` (weights, matmul, row lookup),
//! `ops_py` (norms, RoPE, activations, attention), `recurrent_py`, `moe_py` and `gpu_py`; this
//! file holds what they share (the cancel flag, argument checks) and the module table.

pub mod attention;
pub mod cancel;
mod gguf_py;
pub mod gpu;
mod gpu_moe_py;
mod gpu_py;
mod gpu_recurrent_py;
mod gpu_timing_py;
pub mod matmul;
mod matmul_py;
pub mod moe;
mod moe_py;
pub mod ops;
mod ops_py;
pub mod quant;
pub mod recurrent;
mod recurrent_py;
pub mod simd;
pub mod spm;
mod spm_py;
pub mod threads;
pub mod token_table;
pub mod unary;
mod unary_py;

pub(crate) use matmul_py::QMatrix;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

pyo3::create_exception!(
    _native,
    Cancelled,
    PyException,
    "A kernel stopped early because its task's CancelFlag was set."
);

/// One task's cancel flag (an atomic). Set from any thread; kernels given it poll it and stop early.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct CancelFlag {
    pub(crate) flag: cancel::Flag,
}

#[pymethods]
impl CancelFlag {
    #[new]
    fn new() -> Self {
        Self {
            flag: cancel::Flag::default(),
        }
    }

    fn set(&self) {
        self.flag.set();
    }

    fn is_set(&self) -> bool {
        self.flag.is_set()
    }

    fn __bool__(&self) -> bool {
        self.flag.is_set()
    }
}

pub(crate) fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

pub(crate) fn contiguous<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a numpy::PyReadonlyArray<'_, T, D>,
    what: &str,
) -> PyResult<&'a [T]> {
    a.as_slice()
        .map_err(|_| value_error(format!("{what} must be a C-contiguous array")))
}

#[pyfunction]
fn set_num_threads(n: usize) -> PyResult<()> {
    if n == 0 {
        return Err(value_error("thread count must be at least 1"));
    }
    threads::set_num_threads(n);
    Ok(())
}

#[pyfunction]
fn num_threads() -> usize {
    threads::num_threads()
}

/// Force the portable scalar path (True) or use SIMD where the CPU has it (False).
#[pyfunction]
fn set_force_scalar(force: bool) {
    simd::set_force_scalar(force);
}

/// "avx512vnni", "avx2" or "scalar": the path the kernels take now.
#[pyfunction]
fn simd_path() -> &'static str {
    simd::path_name()
}

/// Cap the kernel path at "scalar", "avx2" or "avx512vnni" (process-wide; all give the same bits,
/// for tests and benchmarks); returns the path that runs now.
#[pyfunction]
fn set_simd_ceiling(ceiling: &str) -> PyResult<&'static str> {
    let path = simd::Path::from_name(ceiling).ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "unknown kernel path {ceiling:?}: expected scalar, avx2 or avx512vnni"
        ))
    })?;
    simd::set_ceiling(path);
    Ok(simd::path_name())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<CancelFlag>()?;
    m.add("Cancelled", m.py().get_type::<Cancelled>())?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(set_force_scalar, m)?)?;
    m.add_function(wrap_pyfunction!(simd_path, m)?)?;
    m.add_function(wrap_pyfunction!(set_simd_ceiling, m)?)?;
    matmul_py::register(m)?;
    ops_py::register(m)?;
    recurrent_py::register(m)?;
    m.add_class::<moe_py::MoeFfn>()?;
    gpu_py::register(m)?;
    unary_py::register(m)?;
    gpu_recurrent_py::register(m)?;
    m.add_class::<gpu_moe_py::GpuMoeFfn>()?;
    m.add_class::<gpu_timing_py::GpuTimestamps>()?;
    m.add_class::<spm_py::SpmVocab>()?;
    m.add_class::<spm_py::TokenIndex>()?;
    m.add_function(wrap_pyfunction!(gguf_py::gguf_string_array, m)?)?;
    Ok(())
}
