//! `GpuDevice`'s ops: matmul, row lookup, RMSNorm, RoPE, element-wise and gated units, row and
//! column copies.

use std::sync::Arc;

use pyo3::prelude::*;

use super::device::GpuDevice;
use super::tensor::{Dtype, GpuMatrix, GpuTensor, RopeKey};
use crate::gpu::ops::{self, CopySpec, Elementwise, Rope};
use crate::gpu::{matvec, quantize, GpuBuffer, GpuWeight};
use crate::py::common::value_error;

/// A RoPE table's values: (cos, sin) of every rotated pair at each position.
pub(super) fn rope_table_values(positions: &[i32], (n_rot, base, freq_scale): RopeKey) -> Vec<f32> {
    let (base, freq_scale) = (f32::from_bits(base), f32::from_bits(freq_scale));
    let mut table: Vec<f32> = Vec::with_capacity(positions.len() * n_rot);
    for &p in positions {
        for (c, s) in crate::ops::rope_angles(p as f32, n_rot, base, freq_scale) {
            table.extend([c, s]);
        }
    }
    table
}

/// RoPE's arguments as Python passes them: heads per row, positions (one per row, from `ids`),
/// rotated dims, frequency base and scale, NEOX pairs.
#[derive(FromPyObject)]
pub(super) struct RopeArgs<'py> {
    #[pyo3(item(0))]
    n_head: usize,
    #[pyo3(item(1))]
    positions: PyRef<'py, GpuTensor>,
    #[pyo3(item(2))]
    n_rot: usize,
    #[pyo3(item(3))]
    base: f32,
    #[pyo3(item(4))]
    freq_scale: f32,
    #[pyo3(item(5))]
    neox: bool,
}

impl GpuDevice {
    /// cos/sin of every rotated pair at every position, computed on the host by the CPU kernel's
    /// own function (a shader's sin/cos differ from libm's in the last bits; the angles are few,
    /// the rotations many). One table per RoPE setting, kept with the positions (and rewritten
    /// with them, `rewrite_ids`).
    fn rope_table(
        &self,
        positions: &GpuTensor,
        n_rot: usize,
        base: f32,
        freq_scale: f32,
    ) -> PyResult<Arc<GpuBuffer>> {
        let Some(ids) = &positions.host_ids else {
            return Err(value_error(
                "rope's positions must be a tensor made by ids()",
            ));
        };
        let key = (n_rot, base.to_bits(), freq_scale.to_bits());
        let mut tables = ids.rope_tables.lock().unwrap();
        let table = tables.entry(key).or_insert_with(|| {
            let table = rope_table_values(&ids.values.lock().unwrap(), key);
            Arc::new(self.gpu.upload(bytemuck::cast_slice(&table)))
        });
        Ok(table.clone())
    }

    /// RoPE's settings for `x` (rows × n_head·head_dim, a row per position) and its table, or why
    /// they do not fit.
    pub(super) fn rope_settings(
        &self,
        shape: &[usize],
        args: &RopeArgs,
    ) -> PyResult<(Rope, Arc<GpuBuffer>)> {
        let (n_head, n_rot, positions) = (args.n_head, args.n_rot, &args.positions);
        self.check(positions, Dtype::I32, "rope's positions")?;
        let rows = positions.size();
        let size: usize = shape.iter().product();
        if rows == 0 || n_head == 0 || !size.is_multiple_of(rows * n_head) {
            return Err(value_error(format!(
                "rope: {shape:?} is not {rows} rows of {n_head} heads"
            )));
        }
        let head_dim = size / rows / n_head;
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(value_error(format!(
                "rope: n_rot {n_rot} must be even and <= head_dim {head_dim}"
            )));
        }
        let r = Rope {
            n_head,
            head_dim,
            n_rot,
            neox: args.neox,
        };
        let table = self.rope_table(positions, n_rot, args.base, args.freq_scale)?;
        Ok((r, table))
    }

    fn elementwise(
        &self,
        op: Elementwise,
        dst: &GpuTensor,
        a: Option<&GpuTensor>,
        m: usize,
        s: f32,
    ) -> PyResult<()> {
        if let Some(a) = a {
            let need = if matches!(op, Elementwise::AddRow) {
                m
            } else {
                dst.size()
            };
            if a.size() != need {
                return Err(value_error(format!(
                    "{op:?}: shapes {:?} and {:?} do not match",
                    dst.shape, a.shape
                )));
            }
        }
        ops::elementwise(
            &self.gpu,
            op,
            &dst.buf,
            a.map(|t| &*t.buf),
            None,
            dst.size(),
            m,
            s,
        );
        Ok(())
    }
    /// A gated unit; told the matrices it feeds (`feeds`), it may quantize its result for them in
    /// the same pass (fast numerics), as a norm does (`norms`): the same values either way.
    fn gated(
        &self,
        op: Elementwise,
        gate: &GpuTensor,
        up: &GpuTensor,
        feeds: Option<Vec<PyRef<'_, GpuMatrix>>>,
    ) -> PyResult<GpuTensor> {
        if gate.shape != up.shape {
            return Err(value_error(format!(
                "{op:?}: shapes {:?} and {:?} differ",
                gate.shape, up.shape
            )));
        }
        let (n, cols) = gate.rows_cols();
        if let Some(kind) = self.q8_kind_feeding(&feeds, cols) {
            let (out, q) =
                quantize::gated_quantize(&self.gpu, op, &gate.buf, &up.buf, n, cols, kind);
            return Ok(self.with_acts(self.tensor_of(out, gate.shape.clone()), Some(q)));
        }
        let out = self.gpu.alloc((gate.size() * 4) as u64);
        ops::elementwise(
            &self.gpu,
            op,
            &out,
            Some(&gate.buf),
            Some(&up.buf),
            gate.size(),
            0,
            0.0,
        );
        Ok(self.tensor_of(out, gate.shape.clone()))
    }
}

#[pymethods]
impl GpuDevice {
    /// `x` (n × cols, or any shape whose last dim is cols) times the weight: n × rows.
    fn matmul(&self, w: PyRef<'_, GpuMatrix>, x: PyRef<'_, GpuTensor>) -> PyResult<GpuTensor> {
        Ok(self.matmul_many(vec![w], x)?.pop().unwrap())
    }

    /// `x` times each weight; the activations are quantized once per weight format family.
    fn matmul_many(
        &self,
        ws: Vec<PyRef<'_, GpuMatrix>>,
        x: PyRef<'_, GpuTensor>,
    ) -> PyResult<Vec<GpuTensor>> {
        self.check(&x, Dtype::F32, "matmul's input")?;
        let (n, cols) = x.rows_cols();
        if let Some(w) = ws.iter().find(|w| w.cols != cols) {
            return Err(value_error(format!(
                "matmul: input rows of {cols}, weight rows of {}",
                w.cols
            )));
        }
        let weights: Vec<&GpuWeight> = ws.iter().map(|w| &w.w).collect();
        let ready = x.acts.as_ref().and_then(|a| a.current(&self.gpu));
        Ok(
            matvec::matmul_many(&self.gpu, &weights, &x.buf, n, cols, ready)
                .into_iter()
                .zip(&ws)
                .map(|(out, w)| self.tensor_of(out, vec![n, w.rows]))
                .collect(),
        )
    }

    /// Dequantized rows `ids` of the weight: n × cols.
    fn get_rows(&self, w: PyRef<'_, GpuMatrix>, ids: PyRef<'_, GpuTensor>) -> PyResult<GpuTensor> {
        self.check(&ids, Dtype::I32, "get_rows' ids")?;
        let n = ids.size();
        Ok(self.tensor_of(ops::get_rows(&self.gpu, &w.w, &ids.buf, n), vec![n, w.cols]))
    }

    /// RoPE in place; x is rows × (n_head·head_dim), positions one i32 per row.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, n_head, positions, n_rot, base, freq_scale, neox))]
    fn rope(
        &self,
        x: PyRef<'_, GpuTensor>,
        n_head: usize,
        positions: PyRef<'_, GpuTensor>,
        n_rot: usize,
        base: f32,
        freq_scale: f32,
        neox: bool,
    ) -> PyResult<()> {
        let args = RopeArgs {
            n_head,
            positions,
            n_rot,
            base,
            freq_scale,
            neox,
        };
        let (r, table) = self.rope_settings(&x.shape, &args)?;
        ops::rope(&self.gpu, &x.buf, args.positions.size(), &table, &r);
        Ok(())
    }

    /// dst += a
    fn add(&self, dst: PyRef<'_, GpuTensor>, a: PyRef<'_, GpuTensor>) -> PyResult<()> {
        self.elementwise(Elementwise::Add, &dst, Some(&a), 0, 0.0)
    }

    /// dst *= a
    fn mul(&self, dst: PyRef<'_, GpuTensor>, a: PyRef<'_, GpuTensor>) -> PyResult<()> {
        self.elementwise(Elementwise::Mul, &dst, Some(&a), 0, 0.0)
    }

    /// dst *= s
    fn scale(&self, dst: PyRef<'_, GpuTensor>, s: f32) -> PyResult<()> {
        self.elementwise(Elementwise::Scale, &dst, None, 0, s)
    }

    /// dst[r, :] += a for every row r (a bias)
    fn add_row(&self, dst: PyRef<'_, GpuTensor>, a: PyRef<'_, GpuTensor>) -> PyResult<()> {
        let m = a.size();
        if m == 0 || !dst.size().is_multiple_of(m) {
            return Err(value_error(format!(
                "add_row: {:?} is not rows of {m}",
                dst.shape
            )));
        }
        self.elementwise(Elementwise::AddRow, &dst, Some(&a), m, 0.0)
    }

    /// dst = s · tanh(dst / s)
    fn softcap(&self, dst: PyRef<'_, GpuTensor>, s: f32) -> PyResult<()> {
        self.elementwise(Elementwise::Softcap, &dst, None, 0, s)
    }

    /// dst = silu(dst)
    fn silu(&self, dst: PyRef<'_, GpuTensor>) -> PyResult<()> {
        self.elementwise(Elementwise::Silu, &dst, None, 0, 0.0)
    }

    /// dst *= silu(gate), in one pass (no copy of silu(gate))
    fn mul_silu(&self, dst: PyRef<'_, GpuTensor>, gate: PyRef<'_, GpuTensor>) -> PyResult<()> {
        self.elementwise(Elementwise::MulSilu, &dst, Some(&gate), 0, 0.0)
    }

    /// gelu(gate) · up
    #[pyo3(signature = (gate, up, feeds=None))]
    fn geglu(
        &self,
        gate: PyRef<'_, GpuTensor>,
        up: PyRef<'_, GpuTensor>,
        feeds: Option<Vec<PyRef<'_, GpuMatrix>>>,
    ) -> PyResult<GpuTensor> {
        self.gated(Elementwise::Geglu, &gate, &up, feeds)
    }

    /// silu(gate) · up
    #[pyo3(signature = (gate, up, feeds=None))]
    fn swiglu(
        &self,
        gate: PyRef<'_, GpuTensor>,
        up: PyRef<'_, GpuTensor>,
        feeds: Option<Vec<PyRef<'_, GpuMatrix>>>,
    ) -> PyResult<GpuTensor> {
        self.gated(Elementwise::Swiglu, &gate, &up, feeds)
    }

    /// Rows `ids` (i32, one per output row) of a 2-D tensor.
    fn take_rows(&self, x: PyRef<'_, GpuTensor>, ids: PyRef<'_, GpuTensor>) -> PyResult<GpuTensor> {
        self.check(&ids, Dtype::I32, "take_rows' ids")?;
        let (_, cols) = x.rows_cols();
        let n = ids.size();
        let out = self.gpu.alloc((n * cols * 4) as u64);
        let spec = CopySpec {
            rows: n,
            cols,
            src_stride: cols,
            src_col0: 0,
            dst_stride: cols,
            dst_col0: 0,
        };
        ops::copy(&self.gpu, &x.buf, Some(&ids.buf), &out, &spec);
        Ok(self.tensor_of(out, vec![n, cols]))
    }

    /// The first column of each row's largest value (numpy's argmax), one f32 per row (exact:
    /// rows are shorter than 2^24): the greedy tokens without reading the logits back.
    fn argmax_rows(&self, x: PyRef<'_, GpuTensor>) -> PyResult<GpuTensor> {
        self.check(&x, Dtype::F32, "argmax_rows' tensor")?;
        let (rows, cols) = x.rows_cols();
        if cols == 0 || cols >= 1 << 24 {
            return Err(value_error(format!("argmax_rows: rows of {cols} values")));
        }
        let out = self.gpu.alloc((rows.max(1) * 4) as u64);
        ops::argmax_rows(&self.gpu, &x.buf, &out, rows, cols);
        Ok(self.tensor_of(out, vec![rows]))
    }

    /// Columns start..start+width of every row of a 2-D tensor, as a new tensor.
    fn columns(&self, x: PyRef<'_, GpuTensor>, start: usize, width: usize) -> PyResult<GpuTensor> {
        let (rows, cols) = x.rows_cols();
        if start + width > cols {
            return Err(value_error(format!(
                "columns {start}..{} of rows of {cols}",
                start + width
            )));
        }
        let out = self.gpu.alloc((rows * width * 4) as u64);
        let spec = CopySpec {
            rows,
            cols: width,
            src_stride: cols,
            src_col0: start,
            dst_stride: width,
            dst_col0: 0,
        };
        ops::copy(&self.gpu, &x.buf, None, &out, &spec);
        Ok(self.tensor_of(out, vec![rows, width]))
    }
}
