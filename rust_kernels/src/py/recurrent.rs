//! Python binding of the recurrent layers (Gated DeltaNet, Mamba2): kernels and layouts in
//! `recurrent/`.

use super::common::{contiguous, value_error};
use crate::{recurrent, threads};
use numpy::ndarray::{Array2, Array3};
use numpy::{
    IntoPyArray, PyArray2, PyArray3, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;

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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(l2_norm, m)?)?;
    m.add_function(wrap_pyfunction!(conv1d_causal, m)?)?;
    m.add_function(wrap_pyfunction!(gated_delta_rule, m)?)?;
    m.add_function(wrap_pyfunction!(mamba2_scan, m)?)?;
    Ok(())
}
