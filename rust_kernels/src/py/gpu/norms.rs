//! `GpuDevice`'s RMSNorms: over rows, over groups within rows, over the leading columns of wider
//! rows, and the residual add with the norm after it. A norm told which matrices its result feeds
//! (`feeds`) may quantize the result for them in the same pass (fast numerics); the matmul that
//! follows then reads those quants instead of quantizing again. The values are the same either way.

use std::sync::Arc;

use pyo3::prelude::*;

use super::device::GpuDevice;
use super::ops::RopeArgs;
use super::tensor::{GpuMatrix, GpuTensor};
use crate::gpu::norm::{self, AfterNorm, NormInput, NormRows};
use crate::py::common::value_error;

#[pymethods]
impl GpuDevice {
    /// RMSNorm over groups of `n` consecutive values (n = the weight's length when given). With
    /// `width`, only the first `width` columns of each row of a 2-D `x` (groups of n side by side)
    /// are normalised, into a rows × width tensor: no copy of those columns first. `feeds`: the
    /// matrices the result goes into next (a hint; see the module). `rope`: (n_head, positions,
    /// n_rot, base, freq_scale, neox) when the groups are heads that RoPE turns next, in the same
    /// pass (the bits of `rope` after the norm). `gate`: a tensor of as many values, the result
    /// multiplied by silu(gate) in the same pass (the bits of `mul_silu` after the norm; whole
    /// groups only, with neither `rope` nor `feeds`).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, weight, eps, n=None, width=None, feeds=None, rope=None, gate=None))]
    fn rms_norm(
        &self,
        x: PyRef<'_, GpuTensor>,
        weight: Option<PyRef<'_, GpuTensor>>,
        eps: f32,
        n: Option<usize>,
        width: Option<usize>,
        feeds: Option<Vec<PyRef<'_, GpuMatrix>>>,
        rope: Option<RopeArgs<'_>>,
        gate: Option<PyRef<'_, GpuTensor>>,
    ) -> PyResult<GpuTensor> {
        let n = n
            .or(weight.as_ref().map(|w| w.size()))
            .unwrap_or(*x.shape.last().unwrap_or(&1));
        let (rows, shape) = match width {
            None => (whole_rows(&x, n, "rms_norm")?, x.shape.clone()),
            Some(width) => {
                group_size(n, "rms_norm")?;
                let (x_rows, cols) = x.rows_cols();
                if x.shape.len() != 2 || width == 0 || width > cols || !width.is_multiple_of(n) {
                    return Err(value_error(format!(
                        "rms_norm: the first {width} columns of {:?} in groups of {n}",
                        x.shape
                    )));
                }
                let per_row = width / n;
                let rows = NormRows {
                    rows: x_rows * per_row,
                    n,
                    per_row,
                    x_stride: cols,
                };
                (rows, vec![x_rows, width])
            }
        };
        if let Some(w) = &weight {
            if w.size() != n {
                return Err(value_error(format!(
                    "rms_norm: a weight of {} values for groups of {n}",
                    w.size()
                )));
            }
        }
        let weight = weight.as_ref().map(|w| &*w.buf);
        // RoPE's settings only where they are used: a gate refuses `rope` first
        let turned = match (&rope, &gate) {
            (Some(args), None) => Some(self.rope_settings(&shape, args)?),
            _ => None,
        };
        let after = match (&gate, &turned) {
            (Some(gate), _) => {
                if width.is_some() || rope.is_some() || feeds.is_some() || gate.size() != x.size() {
                    return Err(value_error(format!(
                        "rms_norm: a gate of {:?} for {:?} (whole groups, no rope or feeds)",
                        gate.shape, x.shape
                    )));
                }
                AfterNorm::Gate(&gate.buf)
            }
            (None, Some((r, table))) => {
                if r.head_dim != n {
                    return Err(value_error(format!(
                        "rms_norm: groups of {n} turned by RoPE as heads of {}",
                        r.head_dim
                    )));
                }
                AfterNorm::Rope(table, r)
            }
            (None, None) => self.quantize_for(&feeds, &rows, &shape),
        };
        let (out, q) = norm::rms_norm(
            &self.gpu,
            &x.buf,
            NormInput::Plain,
            rows,
            weight,
            eps,
            after,
        );
        Ok(self.with_acts(self.tensor_of(out, shape), q))
    }

    /// x += a, then the RMSNorm of each row of x times `weight` (the row length), in one pass: a
    /// residual add and the norm after it, the bits of `add` then `rms_norm`. `feeds` as there.
    #[pyo3(signature = (x, a, weight, eps, feeds=None))]
    fn add_rms_norm(
        &self,
        x: PyRef<'_, GpuTensor>,
        a: PyRef<'_, GpuTensor>,
        weight: PyRef<'_, GpuTensor>,
        eps: f32,
        feeds: Option<Vec<PyRef<'_, GpuMatrix>>>,
    ) -> PyResult<GpuTensor> {
        let rows = whole_rows(&x, weight.size(), "add_rms_norm")?;
        if a.size() != x.size() {
            return Err(value_error(format!(
                "add_rms_norm: {:?} + {:?}",
                x.shape, a.shape
            )));
        }
        if Arc::ptr_eq(&x.buf, &a.buf) {
            return Err(value_error("add_rms_norm: x and a are the same tensor"));
        }
        let after = self.quantize_for(&feeds, &rows, &x.shape);
        let (out, q) = norm::rms_norm(
            &self.gpu,
            &x.buf,
            NormInput::Add(&a.buf),
            rows,
            Some(&weight.buf),
            eps,
            after,
        );
        Ok(self.with_acts(self.tensor_of(out, x.shape.clone()), q))
    }

    /// x *= silu(gate) in place, then the RMSNorm of each group of `n` consecutive values of x,
    /// times `weight`, which spans a whole row of x (its length is the row's, a multiple of n:
    /// Mamba2's gated norm over groups, then its per-channel weight), in one pass: the bits of
    /// `mul_silu`, `rms_norm` over groups and `mul_row`. `feeds` as in `rms_norm`.
    #[pyo3(signature = (x, gate, weight, n, eps, feeds=None))]
    fn gated_rms_norm(
        &self,
        x: PyRef<'_, GpuTensor>,
        gate: PyRef<'_, GpuTensor>,
        weight: PyRef<'_, GpuTensor>,
        n: usize,
        eps: f32,
        feeds: Option<Vec<PyRef<'_, GpuMatrix>>>,
    ) -> PyResult<GpuTensor> {
        let rows = whole_rows(&x, n, "gated_rms_norm")?;
        let row = *x.shape.last().unwrap_or(&0);
        if gate.size() != x.size() || weight.size() != row || !row.is_multiple_of(n) {
            return Err(value_error(format!(
                "gated_rms_norm: x {:?}, gate {:?}, a weight of {} values, groups of {n}",
                x.shape,
                gate.shape,
                weight.size()
            )));
        }
        if Arc::ptr_eq(&x.buf, &gate.buf) {
            return Err(value_error(
                "gated_rms_norm: x and gate are the same tensor",
            ));
        }
        let after = self.quantize_for(&feeds, &rows, &x.shape);
        let input = NormInput::Gated {
            gate: &gate.buf,
            weight_groups: row / n,
        };
        let (out, q) = norm::rms_norm(
            &self.gpu,
            &x.buf,
            input,
            rows,
            Some(&weight.buf),
            eps,
            after,
        );
        Ok(self.with_acts(self.tensor_of(out, x.shape.clone()), q))
    }
}

impl GpuDevice {
    /// Whether a norm's pass quantizes its result, and for which act kind: that of the matrices
    /// it feeds, when its rows are the matmul's input rows (whole rows of the last dim).
    fn quantize_for(
        &self,
        feeds: &Option<Vec<PyRef<'_, GpuMatrix>>>,
        rows: &NormRows,
        shape: &[usize],
    ) -> AfterNorm<'static> {
        let kind = (rows.per_row == 1 && shape.last() == Some(&rows.n))
            .then(|| self.q8_kind_feeding(feeds, rows.n))
            .flatten();
        kind.map_or(AfterNorm::Nothing, AfterNorm::Quantize)
    }
}

/// Checks a norm's group size: norm.wgsl divides the exact sum by n in 16-bit steps.
fn group_size(n: usize, what: &str) -> PyResult<()> {
    if n == 0 || n >= 1 << 16 {
        return Err(value_error(format!(
            "{what}: groups of {n} elements (1 to 65535 on the GPU)"
        )));
    }
    Ok(())
}

/// The rows of a norm over consecutive groups of `n` values of `x`, or why there are none.
fn whole_rows(x: &GpuTensor, n: usize, what: &str) -> PyResult<NormRows> {
    group_size(n, what)?;
    if !x.size().is_multiple_of(n) {
        return Err(value_error(format!(
            "{what}: {:?} is not rows of {n}",
            x.shape
        )));
    }
    Ok(NormRows {
        rows: x.size() / n,
        n,
        per_row: 1,
        x_stride: n,
    })
}
