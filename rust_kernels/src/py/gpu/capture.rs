//! `GpuDevice`'s captured forwards (`gpu::capture`): capture a forward once, then per step write
//! its inputs in place and replay it in one call.

use numpy::PyReadonlyArrayDyn;
use pyo3::prelude::*;

use super::device::GpuDevice;
use super::ops::rope_table_values;
use super::tensor::{Dtype, GpuTensor};
use crate::gpu::capture::Plan;
use crate::py::common::value_error;

/// A captured forward (the device's commands, its parameters and intermediates).
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuPlan {
    plan: Plan,
}

#[pymethods]
impl GpuPlan {
    /// Compute dispatches one replay records.
    #[getter]
    fn dispatches(&self) -> usize {
        self.plan.counts().0
    }

    /// Buffer copies one replay records.
    #[getter]
    fn copies(&self) -> usize {
        self.plan.counts().1
    }
}

#[pymethods]
impl GpuDevice {
    /// Starts capturing this thread's work (it is still recorded and runs as usual).
    fn begin_capture(&self) -> PyResult<()> {
        self.gpu.begin_capture().map_err(value_error)
    }

    /// Ends this thread's capture: its plan, or a ValueError saying why it cannot be replayed (the
    /// captured work itself runs correctly either way).
    fn end_capture(&self) -> PyResult<GpuPlan> {
        let plan = self.gpu.end_capture().map_err(value_error)?;
        Ok(GpuPlan { plan })
    }

    /// Whether this thread is capturing.
    #[getter]
    fn capturing(&self) -> bool {
        self.gpu.capturing_here()
    }

    /// Records a plan's work into the pending encoder (one call, no Python per operation), after
    /// writing each `(tensor, values)` of `writes` as `rewrite_ids` does: a decode step's token
    /// ids and positions, in the same call.
    #[pyo3(signature = (plan, writes = Vec::new()))]
    fn replay(
        &self,
        plan: PyRef<'_, GpuPlan>,
        writes: Vec<(PyRef<'_, GpuTensor>, Vec<i32>)>,
    ) -> PyResult<()> {
        for (t, values) in &writes {
            self.write_ids(t, values)?;
        }
        self.gpu.replay(&plan.plan);
        Ok(())
    }

    /// Writes new values into a tensor made by `ids()` (same length), after all work recorded so
    /// far, and rebuilds the RoPE tables made from it in place: a plan that binds them reads
    /// the new step's.
    fn rewrite_ids(
        &self,
        t: PyRef<'_, GpuTensor>,
        values: PyReadonlyArrayDyn<'_, i32>,
    ) -> PyResult<()> {
        let new = values
            .as_slice()
            .map_err(|_| value_error("rewrite_ids needs C-contiguous values"))?;
        self.write_ids(&t, new)
    }
}

impl GpuDevice {
    fn write_ids(&self, t: &GpuTensor, new: &[i32]) -> PyResult<()> {
        self.check(t, Dtype::I32, "rewrite_ids' tensor")?;
        let Some(ids) = &t.host_ids else {
            return Err(value_error("rewrite_ids needs a tensor made by ids()"));
        };
        if new.len() != t.size() {
            return Err(value_error(format!(
                "rewrite_ids: {} values for a tensor of {}",
                new.len(),
                t.size()
            )));
        }
        // one lock at a time: `rope_table` takes the tables' lock, then the values'
        ids.values.lock().unwrap().copy_from_slice(new);
        self.gpu.write(t.buf.raw(), 0, bytemuck::cast_slice(new));
        for (&key, table) in ids.rope_tables.lock().unwrap().iter() {
            let bytes = rope_table_values(new, key);
            self.gpu.write(table.raw(), 0, bytemuck::cast_slice(&bytes));
        }
        Ok(())
    }
}
