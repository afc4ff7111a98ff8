//! Python binding of the MoE FFN (`moe.rs`): one `MoeFfn` per layer holds its weight matrices.

use super::common::{contiguous, value_error, CancelFlag, Cancelled};
use super::matmul::QMatrix;
use crate::moe::{moe_forward, route_rows, Experts, Moe, Routing, SharedExpert};
use crate::threads;
use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

/// A mixture-of-experts SwiGLU FFN with softmax routing, as llama.cpp runs it on CPU.
///
/// `router`: n_expert × n_embd. `gate`, `up`: the 3-D expert tensors viewed as
/// (n_expert·n_ff) × n_embd; with `up=None`, `gate` is a fused gate_up tensor
/// (n_expert·2·n_ff) × n_embd whose blocks hold `[gate | up]`. `down`: (n_expert·n_embd) × n_ff.
/// The shared expert (`shared_gate`, `shared_up`: n_ff_sh × n_embd, `shared_down`: n_embd ×
/// n_ff_sh) is added times `sigmoid(shared_gate_inp · x)` (1 × n_embd) when given.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct MoeFfn {
    router: Py<QMatrix>,
    gate: Py<QMatrix>,
    up: Option<Py<QMatrix>>,
    down: Py<QMatrix>,
    shared: Option<[Py<QMatrix>; 3]>,
    shared_gate_inp: Option<Py<QMatrix>>,
    routing: Routing,
    #[pyo3(get)]
    n_expert: usize,
    #[pyo3(get)]
    n_used: usize,
    #[pyo3(get)]
    n_embd: usize,
    #[pyo3(get)]
    n_ff: usize,
}

fn need(ok: bool, msg: impl FnOnce() -> String) -> PyResult<()> {
    if ok {
        Ok(())
    } else {
        Err(value_error(msg()))
    }
}

impl MoeFfn {
    pub(crate) fn moe(&self) -> Moe<'_> {
        let n = self.n_expert;
        let gate = self.gate.get().weight();
        let (gate, up) = match &self.up {
            Some(up) => (
                Experts::whole(gate, n),
                Experts::whole(up.get().weight(), n),
            ),
            None => (
                Experts {
                    all: gate,
                    n_expert: n,
                    offset: 0,
                    rows: self.n_ff,
                },
                Experts {
                    all: gate,
                    n_expert: n,
                    offset: self.n_ff,
                    rows: self.n_ff,
                },
            ),
        };
        Moe {
            router: self.router.get().weight(),
            gate,
            up,
            down: Experts::whole(self.down.get().weight(), n),
            routing: self.routing,
            shared: self.shared.as_ref().map(|[g, u, d]| SharedExpert {
                gate: g.get().weight(),
                up: u.get().weight(),
                down: d.get().weight(),
                gate_inp: self.shared_gate_inp.as_ref().map(|w| w.get().weight()),
            }),
        }
    }

    fn input<'a>(&self, x: &'a PyReadonlyArray2<'_, f32>) -> PyResult<(&'a [f32], usize)> {
        let (m, cols) = (x.shape()[0], x.shape()[1]);
        need(cols == self.n_embd, || {
            format!(
                "input has {cols} columns, the MoE FFN expects {}",
                self.n_embd
            )
        })?;
        Ok((contiguous(x, "x")?, m))
    }
}

#[pymethods]
impl MoeFfn {
    #[new]
    #[pyo3(signature = (router, gate, up, down, n_used, norm_weights=true, weights_scale=0.0,
                        shared_gate=None, shared_up=None, shared_down=None, shared_gate_inp=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        router: Py<QMatrix>,
        gate: Py<QMatrix>,
        up: Option<Py<QMatrix>>,
        down: Py<QMatrix>,
        n_used: usize,
        norm_weights: bool,
        weights_scale: f32,
        shared_gate: Option<Py<QMatrix>>,
        shared_up: Option<Py<QMatrix>>,
        shared_down: Option<Py<QMatrix>>,
        shared_gate_inp: Option<Py<QMatrix>>,
    ) -> PyResult<Self> {
        let (r, g, d) = (router.get(), gate.get(), down.get());
        let (n_expert, n_embd, n_ff) = (r.rows, r.cols, d.cols);
        need(n_expert > 0 && (1..=n_expert).contains(&n_used), || {
            format!("{n_used} experts used out of {n_expert}")
        })?;
        need(d.rows == n_expert * n_embd, || {
            format!(
                "down experts have {} rows, expected {n_expert}·{n_embd}",
                d.rows
            )
        })?;
        let gate_rows = if up.is_some() {
            n_expert * n_ff
        } else {
            2 * n_expert * n_ff
        };
        need(g.cols == n_embd && g.rows == gate_rows, || {
            format!(
                "gate experts are {}×{}, expected {gate_rows}×{n_embd}",
                g.rows, g.cols
            )
        })?;
        if let Some(u) = &up {
            let u = u.get();
            need(u.cols == n_embd && u.rows == gate_rows, || {
                format!(
                    "up experts are {}×{}, expected {gate_rows}×{n_embd}",
                    u.rows, u.cols
                )
            })?;
        }
        let shared = match (shared_gate, shared_up, shared_down) {
            (Some(sg), Some(su), Some(sd)) => {
                let (a, b, c) = (sg.get(), su.get(), sd.get());
                need(
                    a.cols == n_embd
                        && b.cols == n_embd
                        && a.rows == b.rows
                        && c.rows == n_embd
                        && c.cols == a.rows,
                    || "shared expert shapes do not match n_embd / each other".into(),
                )?;
                Some([sg, su, sd])
            }
            (None, None, None) => None,
            _ => {
                return Err(value_error(
                    "give all of shared_gate, shared_up, shared_down or none",
                ))
            }
        };
        if let Some(w) = &shared_gate_inp {
            let w = w.get();
            need(shared.is_some() && w.rows == 1 && w.cols == n_embd, || {
                format!("shared_gate_inp must be 1×{n_embd} next to a shared expert")
            })?;
        }
        Ok(Self {
            router,
            gate,
            up,
            down,
            shared,
            shared_gate_inp,
            routing: Routing {
                n_used,
                norm: norm_weights,
                scale: weights_scale,
            },
            n_expert,
            n_used,
            n_embd,
            n_ff,
        })
    }

    /// The FFN output for `x` (rows × n_embd). With `cancel`, stops early once the flag is set
    /// and raises `Cancelled`.
    #[pyo3(signature = (x, cancel=None))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f32>,
        cancel: Option<PyRef<'py, CancelFlag>>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let (xs, m) = self.input(&x)?;
        let moe = self.moe();
        let flag = cancel.map(|c| c.flag.clone());
        let out = py.detach(|| {
            let mut out = vec![0.0f32; m * self.n_embd];
            threads::run(|| moe_forward(&moe, xs, m, &mut out, flag.as_ref()));
            out
        });
        if flag.as_ref().is_some_and(|f| f.is_set()) {
            return Err(Cancelled::new_err("cancelled"));
        }
        Ok(Array2::from_shape_vec((m, self.n_embd), out)
            .unwrap()
            .into_pyarray(py))
    }

    /// The routing of `x`: the selected experts (rows × n_used, int32, in selection order) and
    /// their weights (rows × n_used, f32).
    #[allow(clippy::type_complexity)]
    fn route<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f32>,
    ) -> PyResult<(Bound<'py, PyArray2<i32>>, Bound<'py, PyArray2<f32>>)> {
        let (xs, m) = self.input(&x)?;
        let router = self.router.get().weight();
        let (n, k, routing) = (self.n_expert, self.n_used, self.routing);
        let routes = py.detach(|| {
            let mut logits = vec![0.0f32; m * n];
            threads::run(|| {
                crate::matmul::matmul_many(&[router], xs, m, &mut [logits.as_mut_slice()], None)
            });
            route_rows(&logits, n, routing)
        });
        let ids: Vec<i32> = routes.ids.iter().map(|&e| e as i32).collect();
        Ok((
            Array2::from_shape_vec((m, k), ids)
                .unwrap()
                .into_pyarray(py),
            Array2::from_shape_vec((m, k), routes.weights)
                .unwrap()
                .into_pyarray(py),
        ))
    }

    fn __repr__(&self) -> String {
        format!(
            "MoeFfn(n_expert={}, n_used={}, n_embd={}, n_ff={}, shared={})",
            self.n_expert,
            self.n_used,
            self.n_embd,
            self.n_ff,
            self.shared.is_some()
        )
    }
}
