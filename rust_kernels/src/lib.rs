//! hyserve-kernels: SIMD CPU kernels for the hyserve service, exposed to Python with PyO3.
//!
//! Every entry point checks shapes, then releases the GIL for the computation. Weights stay in the
//! GGUF memory map: `QMatrix` keeps a reference to the numpy view and reads its bytes in place.

pub mod attention;
pub mod cancel;
pub mod gpu;
mod gpu_moe_py;
mod gpu_py;
mod gpu_recurrent_py;
mod gpu_timing_py;
pub mod matmul;
pub mod moe;
mod moe_py;
pub mod ops;
pub mod quant;
pub mod recurrent;
pub mod simd;
pub mod threads;
pub mod unary;
mod unary_py;

use matmul::Weight;
use numpy::ndarray::{Array1, Array2, Array3};
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArray3, PyReadonlyArray1, PyReadonlyArray2,
    PyReadonlyArray3, PyReadwriteArray2, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use quant::GgmlType;

pyo3::create_exception!(
    _native,
    Cancelled,
    PyException,
    "A kernel stopped early because its task's CancelFlag was set."
);

/// One task's cancel flag (an atomic). Set from any thread; kernels given it poll it and stop early.
#[pyclass(frozen, module = "hyserve_kernels")]
struct CancelFlag {
    flag: cancel::Flag,
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

fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}

fn contiguous<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a numpy::PyReadonlyArray<'_, T, D>,
    what: &str,
) -> PyResult<&'a [T]> {
    a.as_slice()
        .map_err(|_| value_error(format!("{what} must be a C-contiguous array")))
}

/// A weight matrix of `rows` rows × `cols` elements stored in a GGUF type, read in place.
#[pyclass(frozen, module = "hyserve_kernels")]
struct QMatrix {
    _owner: Py<PyAny>,
    ptr: usize,
    len: usize,
    t: GgmlType,
    #[pyo3(get)]
    rows: usize,
    #[pyo3(get)]
    cols: usize,
    #[pyo3(get)]
    ggml_type: u32,
}

impl QMatrix {
    fn weight(&self) -> Weight<'_> {
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

/// RMSNorm over the last axis of a 2-D array (rows × n), optionally times a weight of length n.
#[pyfunction]
#[pyo3(signature = (x, weight, eps))]
fn rms_norm<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    weight: Option<PyReadonlyArray1<'py, f32>>,
    eps: f32,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (rows, n) = (x.shape()[0], x.shape()[1]);
    let xs = contiguous(&x, "x")?;
    let ws = match &weight {
        Some(w) if w.len() != n => {
            return Err(value_error(format!(
                "norm weight has {} elements, rows have {n}",
                w.len()
            )))
        }
        Some(w) => Some(contiguous(w, "weight")?),
        None => None,
    };
    let out = py.detach(|| {
        let mut out = vec![0.0f32; rows * n];
        ops::rms_norm(xs, n, ws, eps, &mut out);
        out
    });
    Ok(Array2::from_shape_vec((rows, n), out)
        .unwrap()
        .into_pyarray(py))
}

/// RoPE in place on x (rows × n_head·head_dim); `neox` selects the pair layout.
#[pyfunction]
#[pyo3(signature = (x, n_head, positions, n_rot, base, freq_scale=1.0, neox=true))]
#[allow(clippy::too_many_arguments)]
fn rope(
    py: Python<'_>,
    mut x: PyReadwriteArray2<'_, f32>,
    n_head: usize,
    positions: PyReadonlyArray1<'_, i32>,
    n_rot: usize,
    base: f32,
    freq_scale: f32,
    neox: bool,
) -> PyResult<()> {
    let (rows, width) = (x.shape()[0], x.shape()[1]);
    if n_head == 0
        || !width.is_multiple_of(n_head)
        || n_rot > width / n_head
        || !n_rot.is_multiple_of(2)
    {
        return Err(value_error(format!(
            "bad rope shape: width {width}, {n_head} heads, n_rot {n_rot}"
        )));
    }
    if positions.len() != rows {
        return Err(value_error(format!(
            "{} positions for {rows} rows",
            positions.len()
        )));
    }
    let pos = contiguous(&positions, "positions")?;
    let xs = x
        .as_slice_mut()
        .map_err(|_| value_error("x must be C-contiguous"))?;
    let params = ops::Rope {
        n_rot,
        base,
        freq_scale,
        neox,
    };
    py.detach(|| ops::rope(xs, n_head, width / n_head, pos, params));
    Ok(())
}

fn gated_unit<'py>(
    py: Python<'py>,
    gate: PyReadonlyArray2<'py, f32>,
    up: PyReadonlyArray2<'py, f32>,
    kernel: fn(&[f32], &[f32], &mut [f32]),
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    if gate.shape() != up.shape() {
        return Err(value_error("gate and up must have the same shape"));
    }
    let (rows, n) = (gate.shape()[0], gate.shape()[1]);
    let (g, u) = (contiguous(&gate, "gate")?, contiguous(&up, "up")?);
    let out = py.detach(|| {
        let mut out = vec![0.0f32; rows * n];
        kernel(g, u, &mut out);
        out
    });
    Ok(Array2::from_shape_vec((rows, n), out)
        .unwrap()
        .into_pyarray(py))
}

/// `gelu(gate) * up` with ggml's fp16-table GELU (Gemma's GEGLU).
#[pyfunction]
fn geglu<'py>(
    py: Python<'py>,
    gate: PyReadonlyArray2<'py, f32>,
    up: PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    gated_unit(py, gate, up, ops::geglu)
}

/// `silu(gate) * up` (SwiGLU).
#[pyfunction]
fn swiglu<'py>(
    py: Python<'py>,
    gate: PyReadonlyArray2<'py, f32>,
    up: PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    if gate.shape() != up.shape() {
        return Err(value_error("gate and up must have the same shape"));
    }
    let (rows, n) = (gate.shape()[0], gate.shape()[1]);
    let (g, u) = (contiguous(&gate, "gate")?, contiguous(&up, "up")?);
    let out = py.detach(|| {
        let mut out = vec![0.0f32; rows * n];
        ops::swiglu(g, u, &mut out);
        out
    });
    Ok(Array2::from_shape_vec((rows, n), out)
        .unwrap()
        .into_pyarray(py))
}

/// Elementwise GELU (fp16 table) of a 1-D array; for tests.
#[pyfunction]
fn gelu<'py>(
    py: Python<'py>,
    x: PyReadonlyArray1<'py, f32>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let v: Vec<f32> = contiguous(&x, "x")?.iter().map(|&a| ops::gelu(a)).collect();
    Ok(Array1::from_vec(v).into_pyarray(py))
}

/// Elementwise SiLU of a 1-D array.
#[pyfunction]
fn silu<'py>(
    py: Python<'py>,
    x: PyReadonlyArray1<'py, f32>,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    let xs = contiguous(&x, "x")?;
    let mut v = vec![0.0f32; xs.len()];
    ops::silu_slice(xs, &mut v);
    Ok(Array1::from_vec(v).into_pyarray(py))
}

/// Attention of `q` (rows × n_head × head_dim, pre-scaled) over f16 caches `k`, `v`
/// (cache_len × n_kv × head_dim, as uint16 bits); row i at `positions[i]` sees keys up to it,
/// within `window` if nonzero.
#[pyfunction]
#[pyo3(name = "attention", signature = (q, k, v, positions, window=0, kq_scale=1.0))]
fn py_attention<'py>(
    py: Python<'py>,
    q: PyReadonlyArray3<'py, f32>,
    k: PyReadonlyArray3<'py, u16>,
    v: PyReadonlyArray3<'py, u16>,
    positions: PyReadonlyArray1<'py, i32>,
    window: usize,
    kq_scale: f32,
) -> PyResult<Bound<'py, PyArray3<f32>>> {
    let (rows, n_head, hd) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let (cache_len, n_kv) = (k.shape()[0], k.shape()[1]);
    if k.shape() != v.shape() || k.shape()[2] != hd || n_kv == 0 || n_head % n_kv != 0 {
        return Err(value_error(format!(
            "bad attention shapes q {:?} k {:?} v {:?}",
            q.shape(),
            k.shape(),
            v.shape()
        )));
    }
    let pos = contiguous(&positions, "positions")?;
    if pos.len() != rows || pos.iter().any(|&p| p < 0 || p as usize >= cache_len) {
        return Err(value_error(format!(
            "positions must be {rows} values in 0..{cache_len}"
        )));
    }
    let (qs, ks, vs) = (
        contiguous(&q, "q")?,
        contiguous(&k, "k")?,
        contiguous(&v, "v")?,
    );
    let shape = attention::AttentionShape {
        n_head,
        n_kv,
        head_dim: hd,
        window,
        kq_scale,
    };
    let out = py.detach(|| {
        let mut out = vec![0.0f32; rows * n_head * hd];
        threads::run(|| attention::attention(qs, ks, vs, pos, &shape, &mut out));
        out
    });
    Ok(Array3::from_shape_vec((rows, n_head, hd), out)
        .unwrap()
        .into_pyarray(py))
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

/// "avx2" or "scalar": the path the kernels take now.
#[pyfunction]
fn simd_path() -> &'static str {
    simd::path_name()
}

// ---- Recurrent layers (Gated DeltaNet, Mamba2): kernels and layouts in recurrent.rs ----------

fn check_shape(what: &str, got: &[usize], want: &[usize]) -> PyResult<()> {
    if got == want {
        return Ok(());
    }
    Err(value_error(format!(
        "{what} has shape {got:?}, expected {want:?}"
    )))
}

fn contiguous_mut<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a mut numpy::PyReadwriteArray<'_, T, D>,
    what: &str,
) -> PyResult<&'a mut [T]> {
    a.as_slice_mut()
        .map_err(|_| value_error(format!("{what} must be a C-contiguous array")))
}

/// Where a recurrent kernel reads its state and writes the new one: in place in `state`, or into
/// `new_state` (which must have `shape`), leaving `state` as it was.
fn state_io<'a, D: numpy::ndarray::Dimension>(
    state: &'a mut numpy::PyReadwriteArray<'_, f32, D>,
    new_state: &'a mut Option<numpy::PyReadwriteArray<'_, f32, D>>,
    shape: &[usize],
) -> PyResult<(Option<&'a [f32]>, &'a mut [f32])> {
    let st = contiguous_mut(state, "state")?;
    match new_state {
        Some(ns) => {
            check_shape("new_state", ns.shape(), shape)?;
            Ok((Some(&*st), contiguous_mut(ns, "new_state")?))
        }
        None => Ok((None, st)),
    }
}

fn optional<'a>(
    a: &'a Option<PyReadonlyArray1<'_, f32>>,
    what: &str,
    n: usize,
) -> PyResult<Option<&'a [f32]>> {
    match a {
        Some(a) => {
            check_shape(what, a.shape(), &[n])?;
            Ok(Some(contiguous(a, what)?))
        }
        None => Ok(None),
    }
}

/// Rows of a 2-D array scaled to unit L2 norm: `x / max(sqrt(Σx²), eps)` (ggml_l2_norm). Current
/// llama.cpp normalises Gated DeltaNet q/k differently: see `gated_delta_rule(..., l2_eps=)`.
#[pyfunction]
fn l2_norm<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    eps: f32,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (rows, n) = (x.shape()[0], x.shape()[1]);
    let xs = contiguous(&x, "x")?;
    let out = py.detach(|| {
        let mut out = vec![0.0f32; rows * n];
        if n > 0 {
            recurrent::l2_norm(xs, n, eps, &mut out);
        }
        out
    });
    Ok(Array2::from_shape_vec((rows, n), out)
        .unwrap()
        .into_pyarray(py))
}

/// Depthwise causal convolution of `x` (n_tokens × channels) with `weight` (channels × kernel, the
/// GGUF `ssm_conv1d`), continuing from `state` ((kernel-1) × channels: the last raw inputs, oldest
/// first), which is replaced in place by the new last raw inputs. `bias` is added and SiLU applied
/// after the sum when given / asked. With `new_state` (an array shaped like `state`), the new
/// state is written there instead and `state` is left as it was (same bits, no copy to make first).
#[pyfunction]
#[pyo3(signature = (x, weight, state, bias=None, silu=false, new_state=None))]
#[allow(clippy::too_many_arguments)]
fn conv1d_causal<'py>(
    py: Python<'py>,
    x: PyReadonlyArray2<'py, f32>,
    weight: PyReadonlyArray2<'py, f32>,
    mut state: numpy::PyReadwriteArray2<'py, f32>,
    bias: Option<PyReadonlyArray1<'py, f32>>,
    silu: bool,
    new_state: Option<numpy::PyReadwriteArray2<'py, f32>>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (n, ch, kernel) = (x.shape()[0], x.shape()[1], weight.shape()[1]);
    if kernel == 0 {
        return Err(value_error("conv weight has no taps (kernel 0)"));
    }
    check_shape("conv weight", weight.shape(), &[ch, kernel])?;
    check_shape("conv state", state.shape(), &[kernel - 1, ch])?;
    let bs = optional(&bias, "conv bias", ch)?;
    let (xs, ws) = (contiguous(&x, "x")?, contiguous(&weight, "weight")?);
    let mut new_state = new_state;
    let (src, st) = state_io(&mut state, &mut new_state, &[kernel - 1, ch])?;
    let out = py.detach(|| {
        let mut out = vec![0.0f32; n * ch];
        let mut conv = |out: &mut [f32]| match src {
            Some(src) => recurrent::conv1d_causal_from(xs, ws, bs, src, st, ch, kernel, silu, out),
            None => recurrent::conv1d_causal(xs, ws, bs, st, ch, kernel, silu, out),
        };
        if recurrent::conv_is_serial(n) {
            conv(&mut out); // too little work to hand to the pool (no rayon calls in this case)
        } else {
            threads::run(|| conv(&mut out));
        }
        out
    });
    Ok(Array2::from_shape_vec((n, ch), out)
        .unwrap()
        .into_pyarray(py))
}

/// Gated DeltaNet recurrence over `q`, `k` (n_tokens × n_k_heads × d_k), `v` (n_tokens × n_v_heads ×
/// d_v; v head h uses k head h % n_k_heads), `g` (log-decay) and `beta` (n_tokens × n_v_heads),
/// continuing from `state` (n_v_heads × d_v × d_k, `state[h, j, i] = S[i, j]`), updated in place.
/// With `l2_eps`, q and k are L2-normalised here as current llama.cpp does for qwen35
/// (`rms_norm(x, eps/d_k) · 1/sqrt(d_k)`); without, they must be already. Returns n_tokens ×
/// n_v_heads × d_v. With `new_state` (shaped like `state`), the new state is written there and
/// `state` is left as it was (the same bits as updating a copy of `state`, without the copy).
#[pyfunction]
#[pyo3(signature = (q, k, v, g, beta, state, l2_eps=None, new_state=None))]
#[allow(clippy::too_many_arguments)]
fn gated_delta_rule<'py>(
    py: Python<'py>,
    q: PyReadonlyArray3<'py, f32>,
    k: PyReadonlyArray3<'py, f32>,
    v: PyReadonlyArray3<'py, f32>,
    g: PyReadonlyArray2<'py, f32>,
    beta: PyReadonlyArray2<'py, f32>,
    mut state: numpy::PyReadwriteArray3<'py, f32>,
    l2_eps: Option<f32>,
    new_state: Option<numpy::PyReadwriteArray3<'py, f32>>,
) -> PyResult<Bound<'py, PyArray3<f32>>> {
    let (n, nk, dk) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let (nv, dv) = (v.shape()[1], v.shape()[2]);
    if nk == 0 || nv % nk != 0 || dk == 0 || dv == 0 {
        return Err(value_error(format!(
            "bad delta-net heads: q {:?}, v {:?} (v heads must be a multiple of k heads, sizes nonzero)",
            q.shape(),
            v.shape()
        )));
    }
    check_shape("k", k.shape(), &[n, nk, dk])?;
    check_shape("v", v.shape(), &[n, nv, dv])?;
    check_shape("g", g.shape(), &[n, nv])?;
    check_shape("beta", beta.shape(), &[n, nv])?;
    check_shape("state", state.shape(), &[nv, dv, dk])?;
    let (qs, ks, vs) = (
        contiguous(&q, "q")?,
        contiguous(&k, "k")?,
        contiguous(&v, "v")?,
    );
    let (gs, bs) = (contiguous(&g, "g")?, contiguous(&beta, "beta")?);
    let mut new_state = new_state;
    let (src, st) = state_io(&mut state, &mut new_state, &[nv, dv, dk])?;
    let shape = recurrent::GdnShape {
        n_tokens: n,
        n_k_heads: nk,
        n_v_heads: nv,
        d_k: dk,
        d_v: dv,
    };
    let out = py.detach(|| {
        let mut out = vec![0.0f32; n * nv * dv];
        threads::run(|| {
            recurrent::gated_delta_rule(qs, ks, vs, gs, bs, src, st, shape, l2_eps, &mut out)
        });
        out
    });
    Ok(Array3::from_shape_vec((n, nv, dv), out)
        .unwrap()
        .into_pyarray(py))
}

/// Mamba2 selective scan: `x` (n_tokens × H × P), raw `dt` (n_tokens × H; softplus inside, after
/// `+ dt_bias`), `a` (H, = −exp(A_log)), `b`, `c` (n_tokens × G × N), continuing from `state`
/// (H × P × N), updated in place; `+ d[h]·x` when `d` is given. Returns n_tokens × H × P. With
/// `new_state` (shaped like `state`), the new state is written there and `state` is left as it was.
#[pyfunction]
#[pyo3(signature = (x, dt, a, b, c, state, d=None, dt_bias=None, new_state=None))]
#[allow(clippy::too_many_arguments)]
fn mamba2_scan<'py>(
    py: Python<'py>,
    x: PyReadonlyArray3<'py, f32>,
    dt: PyReadonlyArray2<'py, f32>,
    a: PyReadonlyArray1<'py, f32>,
    b: PyReadonlyArray3<'py, f32>,
    c: PyReadonlyArray3<'py, f32>,
    mut state: numpy::PyReadwriteArray3<'py, f32>,
    d: Option<PyReadonlyArray1<'py, f32>>,
    dt_bias: Option<PyReadonlyArray1<'py, f32>>,
    new_state: Option<numpy::PyReadwriteArray3<'py, f32>>,
) -> PyResult<Bound<'py, PyArray3<f32>>> {
    let (n, nh, p) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let (ng, ns) = (b.shape()[1], b.shape()[2]);
    if ng == 0 || nh % ng != 0 || ns == 0 {
        return Err(value_error(format!(
            "bad mamba2 shapes: x {:?}, b {:?} (heads must be a multiple of groups, d_state nonzero)",
            x.shape(),
            b.shape()
        )));
    }
    check_shape("dt", dt.shape(), &[n, nh])?;
    check_shape("a", a.shape(), &[nh])?;
    check_shape("b", b.shape(), &[n, ng, ns])?;
    check_shape("c", c.shape(), &[n, ng, ns])?;
    check_shape("state", state.shape(), &[nh, p, ns])?;
    let (ds, biases) = (optional(&d, "d", nh)?, optional(&dt_bias, "dt_bias", nh)?);
    let (xs, dts, a_s) = (
        contiguous(&x, "x")?,
        contiguous(&dt, "dt")?,
        contiguous(&a, "a")?,
    );
    let (bs, cs) = (contiguous(&b, "b")?, contiguous(&c, "c")?);
    let mut new_state = new_state;
    let (src, st) = state_io(&mut state, &mut new_state, &[nh, p, ns])?;
    let shape = recurrent::Mamba2Shape {
        n_tokens: n,
        n_heads: nh,
        head_dim: p,
        n_groups: ng,
        d_state: ns,
    };
    let out = py.detach(|| {
        let mut out = vec![0.0f32; n * nh * p];
        threads::run(|| {
            recurrent::mamba2_scan(xs, dts, a_s, bs, cs, ds, biases, src, st, shape, &mut out)
        });
        out
    });
    Ok(Array3::from_shape_vec((n, nh, p), out)
        .unwrap()
        .into_pyarray(py))
}

// ---- end of recurrent layers ------------------------------------------------------------------

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<QMatrix>()?;
    m.add_class::<CancelFlag>()?;
    m.add("Cancelled", m.py().get_type::<Cancelled>())?;
    m.add_function(wrap_pyfunction!(py_matmul, m)?)?;
    m.add_function(wrap_pyfunction!(matmul_many, m)?)?;
    m.add_function(wrap_pyfunction!(get_rows, m)?)?;
    m.add_function(wrap_pyfunction!(rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(rope, m)?)?;
    m.add_function(wrap_pyfunction!(geglu, m)?)?;
    m.add_function(wrap_pyfunction!(swiglu, m)?)?;
    m.add_function(wrap_pyfunction!(gelu, m)?)?;
    m.add_function(wrap_pyfunction!(silu, m)?)?;
    m.add_function(wrap_pyfunction!(py_attention, m)?)?;
    m.add_function(wrap_pyfunction!(set_num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(num_threads, m)?)?;
    m.add_function(wrap_pyfunction!(set_force_scalar, m)?)?;
    m.add_function(wrap_pyfunction!(simd_path, m)?)?;
    // recurrent layers
    m.add_function(wrap_pyfunction!(l2_norm, m)?)?;
    m.add_function(wrap_pyfunction!(conv1d_causal, m)?)?;
    m.add_function(wrap_pyfunction!(gated_delta_rule, m)?)?;
    m.add_function(wrap_pyfunction!(mamba2_scan, m)?)?;
    // mixture of experts
    m.add_class::<moe_py::MoeFfn>()?;
    // the GPU path (wgpu)
    gpu_py::register(m)?;
    unary_py::register(m)?;
    gpu_recurrent_py::register(m)?;
    m.add_class::<gpu_moe_py::GpuMoeFfn>()?;
    m.add_class::<gpu_timing_py::GpuTimestamps>()?;
    Ok(())
}
