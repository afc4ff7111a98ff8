//! Python binding of the per-row kernels: RMSNorm, RoPE, activations (`ops.rs`) and attention over
//! the f16 KV caches (`attention.rs`).

use super::common::{contiguous, value_error};
use crate::{attention, ops, threads};
use numpy::ndarray::{Array1, Array2, Array3};
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArray3, PyReadonlyArray1, PyReadonlyArray2,
    PyReadonlyArray3, PyReadonlyArrayDyn, PyReadwriteArray2, PyReadwriteArrayDyn,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;

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
        threads::run_rows(&mut out, n, |r0, o| {
            ops::rms_norm(&xs[r0 * n..r0 * n + o.len()], n, ws, eps, o)
        });
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
        threads::run_rows(&mut out, n, |r0, o| {
            let at = r0 * n..r0 * n + o.len();
            kernel(&g[at.clone()], &u[at], o)
        });
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
    gated_unit(py, gate, up, ops::swiglu)
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
    py.detach(|| threads::run_rows(&mut v, 1, |i, o| ops::silu_slice(&xs[i..i + o.len()], o)));
    Ok(Array1::from_vec(v).into_pyarray(py))
}

/// One sequence's f16 cache checked against `q`'s head shape: (cache_len, n_kv).
fn cache_shape(
    q_shape: &[usize],
    k: &PyReadonlyArray3<'_, u16>,
    v: &PyReadonlyArray3<'_, u16>,
) -> PyResult<(usize, usize)> {
    let (n_head, hd) = (q_shape[1], q_shape[2]);
    let (cache_len, n_kv) = (k.shape()[0], k.shape()[1]);
    if k.shape() != v.shape() || k.shape()[2] != hd || n_kv == 0 || n_head % n_kv != 0 {
        return Err(value_error(format!(
            "bad attention shapes q {q_shape:?} k {:?} v {:?}",
            k.shape(),
            v.shape()
        )));
    }
    Ok((cache_len, n_kv))
}

/// `positions` as a slice of `rows` cache positions, each inside a cache of `cache_len`.
fn positions_in<'a>(
    positions: &'a PyReadonlyArray1<'_, i32>,
    rows: usize,
    cache_len: usize,
) -> PyResult<&'a [i32]> {
    let pos = contiguous(positions, "positions")?;
    if pos.len() != rows || pos.iter().any(|&p| p < 0 || p as usize >= cache_len) {
        return Err(value_error(format!(
            "positions must be {rows} values in 0..{cache_len}"
        )));
    }
    Ok(pos)
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
    let (cache_len, n_kv) = cache_shape(q.shape(), &k, &v)?;
    let pos = positions_in(&positions, rows, cache_len)?;
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

/// One sequence's part of `attention_spans`: (first row, end row, K bits, V bits, positions).
type PySpan<'py> = (
    usize,
    usize,
    PyReadonlyArray3<'py, u16>,
    PyReadonlyArray3<'py, u16>,
    PyReadonlyArray1<'py, i32>,
);

/// Several sequences' rows of one batch in one call: for each span (row0, row1, k, v, positions),
/// rows row0..row1 of `q` (rows × n_head × head_dim) attend over that sequence's own cache as
/// `attention` does, written into the same rows of `out` (rows × n_head*head_dim); rows outside
/// every span are left as they are. Spans must not overlap.
#[pyfunction]
#[pyo3(signature = (q, spans, out, window=0, kq_scale=1.0))]
fn attention_spans<'py>(
    py: Python<'py>,
    q: PyReadonlyArray3<'py, f32>,
    spans: Vec<PySpan<'py>>,
    mut out: PyReadwriteArray2<'py, f32>,
    window: usize,
    kq_scale: f32,
) -> PyResult<()> {
    let (rows, n_head, hd) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    if out.shape() != [rows, n_head * hd] {
        return Err(value_error(format!(
            "out must be {rows} x {} floats, got {:?}",
            n_head * hd,
            out.shape()
        )));
    }
    let mut n_kv = None;
    let mut covered = vec![false; rows];
    let mut parts = Vec::with_capacity(spans.len());
    for (r0, r1, k, v, positions) in &spans {
        let (cache_len, kv) = cache_shape(q.shape(), k, v)?;
        if *n_kv.get_or_insert(kv) != kv {
            return Err(value_error(
                "every span's cache must have the same KV heads",
            ));
        }
        if r0 > r1 || *r1 > rows || covered[*r0..*r1].iter().any(|&c| c) {
            return Err(value_error(format!(
                "span rows {r0}..{r1} must lie in 0..{rows} and not overlap another span"
            )));
        }
        covered[*r0..*r1].fill(true);
        parts.push(attention::Span {
            rows: *r0..*r1,
            k: contiguous(k, "k")?,
            v: contiguous(v, "v")?,
            positions: positions_in(positions, r1 - r0, cache_len)?,
        });
    }
    let shape = attention::AttentionShape {
        n_head,
        n_kv: n_kv.unwrap_or(1),
        head_dim: hd,
        window,
        kq_scale,
    };
    let qs = contiguous(&q, "q")?;
    let os = out
        .as_slice_mut()
        .map_err(|_| value_error("out must be a C-contiguous array"))?;
    py.detach(|| threads::run(|| attention::attention_spans(qs, &parts, &shape, os)));
    Ok(())
}

/// `src` (float32, any shape) rounded to f16 bits into `dst` (uint16, as many elements, e.g. a
/// `float16` cache slice viewed as uint16): what `dst[...] = src` does in numpy, without its slow
/// per-element cast.
#[pyfunction]
fn store_f16(
    py: Python<'_>,
    src: PyReadonlyArrayDyn<'_, f32>,
    mut dst: PyReadwriteArrayDyn<'_, u16>,
) -> PyResult<()> {
    let s = contiguous(&src, "src")?;
    let d = dst
        .as_slice_mut()
        .map_err(|_| value_error("dst must be a C-contiguous array"))?;
    if s.len() != d.len() {
        return Err(value_error(format!(
            "src has {} values, dst {}",
            s.len(),
            d.len()
        )));
    }
    py.detach(|| ops::store_f16(s, d));
    Ok(())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(rope, m)?)?;
    m.add_function(wrap_pyfunction!(geglu, m)?)?;
    m.add_function(wrap_pyfunction!(swiglu, m)?)?;
    m.add_function(wrap_pyfunction!(gelu, m)?)?;
    m.add_function(wrap_pyfunction!(silu, m)?)?;
    m.add_function(wrap_pyfunction!(py_attention, m)?)?;
    m.add_function(wrap_pyfunction!(attention_spans, m)?)?;
    m.add_function(wrap_pyfunction!(store_f16, m)?)?;
    Ok(())
}
