//! Python binding of the weight matrices (`QMatrix`, read in place from the GGUF map) and of the
//! kernels that read them whole: `matmul`, `matmul_many` (`matmul.rs`) and `get_rows` (`ops.rs`).

use super::common::{contiguous, value_error, CancelFlag, Cancelled};
use crate::matmul::{self, Weight};
use crate::quant::GgmlType;
use crate::{ops, threads};
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// A weight matrix of `rows` rows × `cols` elements stored in a GGUF type, read in place.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct QMatrix {
    _owner: Py<PyAny>,
    ptr: usize,
    len: usize,
    pub(crate) t: GgmlType,
    #[pyo3(get)]
    pub(crate) rows: usize,
    #[pyo3(get)]
    pub(crate) cols: usize,
    #[pyo3(get)]
    pub(crate) ggml_type: u32,
}

impl QMatrix {
    pub(crate) fn weight(&self) -> Weight<'_> {
        // SAFETY: `_owner` keeps the read-only buffer alive and unmoved for self's lifetime.
        let data = unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) };
        Weight {
            t: self.t,
            data,
            rows: self.rows,
            cols: self.cols,
        }
    }
}

#[pymethods]
impl QMatrix {
    #[new]
    fn new(
        data: PyReadonlyArray1<'_, u8>,
        ggml_type: u32,
        rows: usize,
        cols: usize,
    ) -> PyResult<Self> {
        let t = GgmlType::from_id(ggml_type)
            .ok_or_else(|| value_error(format!("unsupported ggml type id {ggml_type}")))?;
        if cols == 0 || !cols.is_multiple_of(t.block_len()) {
            return Err(value_error(format!(
                "row length {cols} is not a multiple of {:?}'s block of {}",
                t,
                t.block_len()
            )));
        }
        let bytes = contiguous(&data, "weight data")?;
        let expected = rows * t.row_bytes(cols);
        if bytes.len() != expected {
            return Err(value_error(format!(
                "{rows}x{cols} {t:?} needs {expected} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(Self {
            ptr: bytes.as_ptr() as usize,
            len: bytes.len(),
            _owner: data.as_any().clone().unbind(),
            t,
            rows,
            cols,
            ggml_type,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "QMatrix({:?}, rows={}, cols={})",
            self.t, self.rows, self.cols
        )
    }
}

/// `y[m, n] = x[m, :] · W[n, :]` for each weight; activations are converted once per format.
/// With `cancel`, the work stops early once the flag is set and `Cancelled` is raised.
#[pyfunction]
#[pyo3(signature = (weights, x, cancel=None))]
fn matmul_many<'py>(
    py: Python<'py>,
    weights: Vec<PyRef<'py, QMatrix>>,
    x: PyReadonlyArray2<'py, f32>,
    cancel: Option<PyRef<'py, CancelFlag>>,
) -> PyResult<Vec<Bound<'py, PyArray2<f32>>>> {
    let (m, cols) = (x.shape()[0], x.shape()[1]);
    if weights.is_empty() {
        return Ok(vec![]);
    }
    for w in &weights {
        if w.cols != cols {
            return Err(value_error(format!(
                "input has {cols} columns, weight expects {}",
                w.cols
            )));
        }
    }
    let xs = contiguous(&x, "x")?;
    let ws: Vec<Weight> = weights.iter().map(|w| w.weight()).collect();
    let flag = cancel.map(|c| c.flag.clone());
    let results = py.detach(|| {
        let mut bufs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0.0; m * w.rows]).collect();
        threads::run(|| {
            let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            matmul::matmul_many(&ws, xs, m, &mut outs, flag.as_ref());
        });
        bufs
    });
    if flag.as_ref().is_some_and(|f| f.is_set()) {
        return Err(Cancelled::new_err("cancelled"));
    }
    Ok(results
        .into_iter()
        .zip(&ws)
        .map(|(b, w)| {
            Array2::from_shape_vec((m, w.rows), b)
                .unwrap()
                .into_pyarray(py)
        })
        .collect())
}

#[pyfunction]
#[pyo3(name = "matmul", signature = (weight, x, cancel=None))]
fn py_matmul<'py>(
    py: Python<'py>,
    weight: PyRef<'py, QMatrix>,
    x: PyReadonlyArray2<'py, f32>,
    cancel: Option<PyRef<'py, CancelFlag>>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    Ok(matmul_many(py, vec![weight], x, cancel)?.pop().unwrap())
}

/// Dequantize the given rows of a weight (all rows when `ids` is None) to f32.
#[pyfunction]
#[pyo3(signature = (weight, ids=None))]
fn get_rows<'py>(
    py: Python<'py>,
    weight: PyRef<'py, QMatrix>,
    ids: Option<PyReadonlyArray1<'py, i32>>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let w = weight.weight();
    let ids: Vec<i32> = match &ids {
        Some(a) => contiguous(a, "ids")?.to_vec(),
        None => (0..w.rows as i32).collect(),
    };
    if let Some(bad) = ids.iter().find(|&&i| i < 0 || i as usize >= w.rows) {
        return Err(value_error(format!(
            "row id {bad} out of range 0..{}",
            w.rows
        )));
    }
    let out = py.detach(|| {
        let mut out = vec![0.0f32; ids.len() * w.cols];
        ops::get_rows(w.t, w.data, w.cols, &ids, &mut out);
        out
    });
    Ok(Array2::from_shape_vec((ids.len(), w.cols), out)
        .unwrap()
        .into_pyarray(py))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<QMatrix>()?;
    m.add_function(wrap_pyfunction!(py_matmul, m)?)?;
    m.add_function(wrap_pyfunction!(matmul_many, m)?)?;
    m.add_function(wrap_pyfunction!(get_rows, m)?)?;
    Ok(())
}
