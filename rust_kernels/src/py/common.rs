//! What the bindings share: the cancel flag and its exception, and the argument checks.

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

use crate::cancel;

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
