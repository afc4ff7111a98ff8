//! Python bindings of the process-wide kernel settings: the thread count (`threads.rs`) and the
//! SIMD path (`simd.rs`).

use pyo3::prelude::*;

use super::common::value_error;
use crate::{simd, threads};

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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(set_force_scalar, m)?)?;
    m.add_function(wrap_pyfunction!(simd_path, m)?)?;
    m.add_function(wrap_pyfunction!(set_simd_ceiling, m)?)?;
    Ok(())
}
