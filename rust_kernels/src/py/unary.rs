//! Python bindings of the libm-rounded element-wise ops (`unary.rs`).

use numpy::ndarray::ArrayD;
use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::unary;

/// Applies `op` to a copy of `x` (any shape, any strides) with the GIL released.
fn map<'py>(
    py: Python<'py>,
    x: PyReadonlyArrayDyn<'py, f32>,
    op: fn(&mut [f32]),
) -> Bound<'py, PyArrayDyn<f32>> {
    let shape = x.shape().to_vec();
    let mut v: Vec<f32> = match x.as_slice() {
        Ok(s) => s.to_vec(),
        Err(_) => x.as_array().iter().copied().collect(),
    };
    py.detach(|| crate::threads::run_rows(&mut v, 1, |_, o| op(o)));
    ArrayD::from_shape_vec(shape, v).unwrap().into_pyarray(py)
}

/// Element-wise `1 / (1 + expf(-x))` with libm's `expf`, as ggml's sigmoid (a new array).
#[pyfunction]
fn sigmoid<'py>(py: Python<'py>, x: PyReadonlyArrayDyn<'py, f32>) -> Bound<'py, PyArrayDyn<f32>> {
    map(py, x, unary::sigmoid_inplace)
}

/// Element-wise `x > 20 ? x : logf(1 + expf(x))` with libm's functions, as ggml's softplus.
#[pyfunction]
fn softplus<'py>(py: Python<'py>, x: PyReadonlyArrayDyn<'py, f32>) -> Bound<'py, PyArrayDyn<f32>> {
    map(py, x, unary::softplus_inplace)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sigmoid, m)?)?;
    m.add_function(wrap_pyfunction!(softplus, m)?)?;
    Ok(())
}
