//! `GpuDevice`'s K/V caches and attention: one cache per attention layer and sequence, attention
//! over it, and its host and device-to-device copies.

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyReadonlyArrayDyn};
use pyo3::prelude::*;

use super::device::GpuDevice;
use super::tensor::{GpuKvCache, GpuTensor, KvBits};
use crate::gpu::attention::{self as ops, AttentionSpec};
use crate::py::common::value_error;

#[pymethods]
impl GpuDevice {
    /// A K/V cache for one attention layer of one sequence.
    fn kv_cache(&self, n_ctx: usize, n_kv: usize, head_dim: usize) -> PyResult<GpuKvCache> {
        if !head_dim.is_multiple_of(2) {
            return Err(value_error(format!("head_dim {head_dim} must be even")));
        }
        let bytes = (n_ctx * n_kv * head_dim * 2) as u64;
        Ok(GpuKvCache {
            k: self.gpu.alloc(bytes),
            v: self.gpu.alloc(bytes),
            n_ctx,
            n_kv,
            head_dim,
        })
    }

    /// Appends rows row0..row0+n_rows of k, v (rows × n_kv·head_dim) to the cache at position
    /// `start`, then attends those rows of q (rows × n_head·head_dim) over the cache's positions
    /// 0..start+n_rows, writing the same rows of `out`.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (cache, q, k, v, positions, out, row0, n_rows, start, n_head, window, kq_scale))]
    fn attention(
        &self,
        cache: PyRef<'_, GpuKvCache>,
        q: PyRef<'_, GpuTensor>,
        k: PyRef<'_, GpuTensor>,
        v: PyRef<'_, GpuTensor>,
        positions: PyRef<'_, GpuTensor>,
        out: PyRef<'_, GpuTensor>,
        row0: usize,
        n_rows: usize,
        start: usize,
        n_head: usize,
        window: usize,
        kq_scale: f32,
    ) -> PyResult<()> {
        let (hd, n_kv) = (cache.head_dim, cache.n_kv);
        let rows = positions.size();
        if start + n_rows > cache.n_ctx || row0 + n_rows > rows {
            return Err(value_error(format!(
                "attention: rows {row0}..{} at position {start} do not fit (batch {rows}, context {})",
                row0 + n_rows,
                cache.n_ctx
            )));
        }
        if q.size() != rows * n_head * hd
            || k.size() != rows * n_kv * hd
            || v.size() != k.size()
            || out.size() != q.size()
        {
            return Err(value_error(
                "attention: q, k, v, out do not match the cache's heads",
            ));
        }
        if n_kv == 0 || !n_head.is_multiple_of(n_kv) {
            return Err(value_error(format!(
                "attention: {n_head} heads over {n_kv} KV heads"
            )));
        }
        let spec = AttentionSpec {
            n_rows,
            row0,
            n_head,
            n_kv,
            head_dim: hd,
            window,
            start,
            n_ctx: cache.n_ctx,
            kq_scale,
        };
        ops::attention(
            &self.gpu,
            &q.buf,
            &k.buf,
            &v.buf,
            &positions.buf,
            &cache.k,
            &cache.v,
            &out.buf,
            &spec,
        );
        Ok(())
    }

    /// K and V of positions 0..n as f16 bits (n × n_kv × head_dim uint16 arrays), for host copies.
    fn kv_read<'py>(
        &self,
        py: Python<'py>,
        cache: PyRef<'py, GpuKvCache>,
        n: usize,
    ) -> PyResult<KvBits<'py>> {
        if n > cache.n_ctx {
            return Err(value_error(format!(
                "kv_read: {n} positions of {}",
                cache.n_ctx
            )));
        }
        let bytes = (n * cache.row_bytes()) as u64;
        let (gpu, c) = (&self.gpu, &*cache);
        let (k, v) = py.detach(|| (gpu.read(c.k.raw(), 0, bytes), gpu.read(c.v.raw(), 0, bytes)));
        let shape = IxDyn(&[n, cache.n_kv, cache.head_dim]);
        let arr = |b: Vec<u8>| {
            ArrayD::from_shape_vec(shape.clone(), bytemuck::pod_collect_to_vec(&b)).unwrap()
        };
        Ok((arr(k).into_pyarray(py), arr(v).into_pyarray(py)))
    }

    /// Writes K and V f16 bits (n × n_kv × head_dim uint16) at positions start.. of the cache.
    fn kv_write(
        &self,
        cache: PyRef<'_, GpuKvCache>,
        start: usize,
        k: PyReadonlyArrayDyn<'_, u16>,
        v: PyReadonlyArrayDyn<'_, u16>,
    ) -> PyResult<()> {
        let (ks, vs) = (
            k.as_slice()
                .map_err(|_| value_error("k must be C-contiguous"))?,
            v.as_slice()
                .map_err(|_| value_error("v must be C-contiguous"))?,
        );
        let row = cache.n_kv * cache.head_dim;
        if ks.len() != vs.len() || ks.len() % row != 0 || start + ks.len() / row > cache.n_ctx {
            return Err(value_error(
                "kv_write: k and v must be the same whole rows within the context",
            ));
        }
        let offset = (start * cache.row_bytes()) as u64;
        self.gpu
            .write(cache.k.raw(), offset, bytemuck::cast_slice(ks));
        self.gpu
            .write(cache.v.raw(), offset, bytemuck::cast_slice(vs));
        Ok(())
    }

    /// Copies positions 0..n of one cache into another (device to device).
    fn kv_copy(
        &self,
        src: PyRef<'_, GpuKvCache>,
        dst: PyRef<'_, GpuKvCache>,
        n: usize,
    ) -> PyResult<()> {
        if src.row_bytes() != dst.row_bytes() || n > src.n_ctx.min(dst.n_ctx) {
            return Err(value_error(
                "kv_copy: caches of different shapes or too few positions",
            ));
        }
        let bytes = (n * src.row_bytes()) as u64;
        self.gpu.copy(src.k.raw(), 0, dst.k.raw(), 0, bytes);
        self.gpu.copy(src.v.raw(), 0, dst.v.raw(), 0, bytes);
        Ok(())
    }
}
