//! Python bindings of the GPU path: a device, tensors and weights that live on it, and its ops.
//! The Python side (`hyserve.model.backend.gpu`) wraps these in the same interface as the CPU ops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use numpy::ndarray::{ArrayD, IxDyn};
use numpy::{IntoPyArray, PyArrayDyn, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::gpu::ops::{self, AttentionSpec, CopySpec, Elementwise, Rope};
use crate::gpu::{adapter, AdapterChoice, Gpu, GpuBuffer, GpuWeight, Numerics};
use crate::{value_error, QMatrix};

/// f32 values, or i32 ids/positions (both 4 bytes a value).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Dtype {
    F32,
    I32,
}

/// A tensor in device memory (row-major). `reshape` shares the buffer, like a numpy view.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuTensor {
    pub(crate) buf: Arc<GpuBuffer>,
    pub(crate) dtype: Dtype,
    #[pyo3(get)]
    pub(crate) shape: Vec<usize>,
    /// positions uploaded by `ids`: their host values and the RoPE cos/sin tables built from them
    /// (every layer with the same RoPE settings reuses one)
    pub(crate) host_ids: Option<Arc<HostIds>>,
}

pub(crate) struct HostIds {
    values: Vec<i32>,
    rope_tables: Mutex<HashMap<(usize, u32, u32), Arc<GpuBuffer>>>,
}

impl GpuTensor {
    pub(crate) fn size(&self) -> usize {
        self.shape.iter().product()
    }
    fn rows_cols(&self) -> (usize, usize) {
        let cols = *self.shape.last().unwrap_or(&1);
        (self.size() / cols.max(1), cols)
    }
    pub(crate) fn new(buf: GpuBuffer, dtype: Dtype, shape: Vec<usize>) -> Self {
        Self {
            buf: Arc::new(buf),
            dtype,
            shape,
            host_ids: None,
        }
    }
}

#[pymethods]
impl GpuTensor {
    /// The same values under another shape (one dimension may be -1): `t.reshape(2, -1)` or
    /// `t.reshape((2, -1))`.
    #[pyo3(signature = (*dims))]
    fn reshape(&self, dims: &Bound<'_, PyTuple>) -> PyResult<GpuTensor> {
        let dims: Vec<isize> = match dims.len() {
            1 if dims.get_item(0)?.extract::<isize>().is_err() => dims.get_item(0)?.extract()?,
            _ => dims.extract()?,
        };
        let size = self.size();
        let known: usize = dims
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .product();
        let shape: Vec<usize> = dims
            .iter()
            .map(|&d| {
                if d < 0 {
                    size / known.max(1)
                } else {
                    d as usize
                }
            })
            .collect();
        if shape.iter().product::<usize>() != size {
            return Err(value_error(format!(
                "cannot reshape {:?} to {shape:?}",
                self.shape
            )));
        }
        Ok(GpuTensor {
            buf: self.buf.clone(),
            dtype: self.dtype,
            shape,
            host_ids: self.host_ids.clone(),
        })
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.size() * 4
    }

    fn __len__(&self) -> usize {
        self.shape.first().copied().unwrap_or(0)
    }

    fn __repr__(&self) -> String {
        format!("GpuTensor({:?}, {:?})", self.shape, self.dtype)
    }
}

/// A weight matrix uploaded once in its GGUF block format.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuMatrix {
    w: GpuWeight,
    #[pyo3(get)]
    rows: usize,
    #[pyo3(get)]
    cols: usize,
    #[pyo3(get)]
    ggml_type: u32,
}

#[pymethods]
impl GpuMatrix {
    #[getter]
    fn nbytes(&self) -> usize {
        self.w.bytes()
    }

    #[getter]
    fn n_bindings(&self) -> usize {
        self.w.chunks.len()
    }
}

/// One layer's K and V cache: f16 pairs packed in u32 words, [n_ctx][n_kv][head_dim].
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuKvCache {
    k: GpuBuffer,
    v: GpuBuffer,
    #[pyo3(get)]
    n_ctx: usize,
    #[pyo3(get)]
    n_kv: usize,
    #[pyo3(get)]
    head_dim: usize,
}

impl GpuKvCache {
    fn row_bytes(&self) -> usize {
        self.n_kv * self.head_dim * 2
    }
}

#[pymethods]
impl GpuKvCache {
    #[getter]
    fn nbytes(&self) -> usize {
        2 * self.n_ctx * self.row_bytes()
    }
}

/// K and V f16 bits of a cache's first positions.
type KvBits<'py> = (Bound<'py, PyArrayDyn<u16>>, Bound<'py, PyArrayDyn<u16>>);

/// A wgpu device with the model's kernels.
#[pyclass(frozen, module = "hyserve_kernels")]
pub struct GpuDevice {
    pub(crate) gpu: Arc<Gpu>,
}

fn f32_bytes(a: &PyReadonlyArrayDyn<'_, f32>) -> PyResult<Vec<u8>> {
    let s = a
        .as_slice()
        .map_err(|_| value_error("array must be C-contiguous"))?;
    Ok(bytemuck::cast_slice(s).to_vec())
}

impl GpuDevice {
    fn tensor_of(&self, buf: GpuBuffer, shape: Vec<usize>) -> GpuTensor {
        GpuTensor::new(buf, Dtype::F32, shape)
    }
    /// cos/sin of every rotated pair at every position, computed on the host by the CPU kernel's
    /// own function (a shader's sin/cos differ from libm's in the last bits; the angles are few,
    /// the rotations many). One table per RoPE setting, kept with the positions.
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
            let mut table: Vec<f32> = Vec::with_capacity(ids.values.len() * n_rot);
            for &p in &ids.values {
                for (c, s) in crate::ops::rope_angles(p as f32, n_rot, base, freq_scale) {
                    table.extend([c, s]);
                }
            }
            Arc::new(self.gpu.upload(bytemuck::cast_slice(&table)))
        });
        Ok(table.clone())
    }

    fn check(&self, t: &GpuTensor, dtype: Dtype, what: &str) -> PyResult<()> {
        if t.dtype != dtype {
            return Err(value_error(format!(
                "{what} must be {dtype:?}, got {:?}",
                t.dtype
            )));
        }
        Ok(())
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
    fn gated(&self, op: Elementwise, gate: &GpuTensor, up: &GpuTensor) -> PyResult<GpuTensor> {
        if gate.shape != up.shape {
            return Err(value_error(format!(
                "{op:?}: shapes {:?} and {:?} differ",
                gate.shape, up.shape
            )));
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
    /// Opens the best adapter: `backend` "vulkan" | "metal" | "dx12" (None: any), `adapter` a
    /// substring of its name, software adapters only with `allow_software`.
    /// `max_binding` lowers the bytes bound at once (tests split small tensors with it); `lanes`
    /// (1 or 8) sets the threads per weight row of the matmul (default: 1 on software adapters);
    /// `features` names the optional adapter features to use where the adapter has them and they
    /// pass their probes ("subgroups", "f16"; None: all; [] none); the results are the same bits.
    /// `numerics` "fast" (the adapter's float operations) or "exact" (the CPU kernels' bits).
    #[new]
    #[pyo3(signature = (backend=None, adapter=None, allow_software=false, max_binding=None, lanes=None, features=None, numerics="fast"))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        backend: Option<String>,
        adapter: Option<String>,
        allow_software: bool,
        max_binding: Option<u64>,
        lanes: Option<u32>,
        features: Option<Vec<String>>,
        numerics: &str,
    ) -> PyResult<Self> {
        if lanes.is_some_and(|l| l != 1 && l != 8) {
            return Err(value_error("lanes must be 1 or 8"));
        }
        let numerics = Numerics::parse(numerics).map_err(value_error)?;
        let choice = AdapterChoice {
            backend,
            name: adapter,
            allow_software,
            max_binding,
            lanes,
            features,
            numerics,
        };
        let gpu = py.detach(|| Gpu::open(&choice)).map_err(value_error)?;
        Ok(Self { gpu: Arc::new(gpu) })
    }

    /// Every adapter found: (description, is software).
    #[staticmethod]
    #[pyo3(signature = (backend=None))]
    fn adapters(py: Python<'_>, backend: Option<String>) -> PyResult<Vec<(String, bool)>> {
        py.detach(|| adapter::list_adapters(backend.as_deref()))
            .map_err(value_error)
    }

    /// "name (backend, device type)"
    #[getter]
    fn name(&self) -> String {
        self.gpu.describe()
    }

    #[getter]
    fn is_software(&self) -> bool {
        self.gpu.is_software()
    }

    #[getter]
    fn max_binding(&self) -> u64 {
        self.gpu.max_binding()
    }

    /// The optional adapter features the shaders use ("subgroups", "f16").
    #[getter]
    fn features(&self) -> Vec<&'static str> {
        self.gpu.features().names()
    }

    /// "fast" or "exact": the shaders' float operations.
    #[getter]
    fn numerics(&self) -> &'static str {
        self.gpu.numerics().name()
    }

    /// Whether the adapter's `fma` rounds once; where not, the shaders compute it in integers.
    #[getter]
    fn fused_fma(&self) -> bool {
        self.gpu.fused_fma()
    }

    /// Uploads a weight matrix in its block format.
    fn matrix(&self, py: Python<'_>, m: PyRef<'_, QMatrix>) -> PyResult<GpuMatrix> {
        let w = m.weight();
        let (t, rows, cols) = (m.ggml_type, m.rows, m.cols);
        let gpu = &self.gpu;
        let w = py
            .detach(|| GpuWeight::upload(gpu, t, w.data, rows, cols))
            .map_err(value_error)?;
        Ok(GpuMatrix {
            w,
            rows,
            cols,
            ggml_type: t,
        })
    }

    /// Uploads an f32 array.
    fn tensor(&self, a: PyReadonlyArrayDyn<'_, f32>) -> PyResult<GpuTensor> {
        let shape = a.shape().to_vec();
        Ok(self.tensor_of(self.gpu.upload(&f32_bytes(&a)?), shape))
    }

    /// Uploads an i32 array (token ids, positions).
    fn ids(&self, a: PyReadonlyArrayDyn<'_, i32>) -> PyResult<GpuTensor> {
        let s = a
            .as_slice()
            .map_err(|_| value_error("ids must be C-contiguous"))?;
        let mut t = GpuTensor::new(
            self.gpu.upload(bytemuck::cast_slice(s)),
            Dtype::I32,
            a.shape().to_vec(),
        );
        t.host_ids = Some(Arc::new(HostIds {
            values: s.to_vec(),
            rope_tables: Mutex::new(HashMap::new()),
        }));
        Ok(t)
    }

    /// A tensor of the given shape with undefined values (every op that fills one writes it all).
    fn empty(&self, shape: Vec<usize>) -> GpuTensor {
        let n: usize = shape.iter().product();
        self.tensor_of(self.gpu.alloc((n * 4) as u64), shape)
    }

    /// Runs the recorded work and copies the tensor to the host (f32).
    fn to_host<'py>(
        &self,
        py: Python<'py>,
        t: PyRef<'py, GpuTensor>,
    ) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        self.check(&t, Dtype::F32, "to_host's tensor")?;
        let (buf, bytes) = (t.buf.clone(), (t.size() * 4) as u64);
        let gpu = &self.gpu;
        let data = py.detach(|| gpu.read(buf.raw(), 0, bytes));
        let values: Vec<f32> = bytemuck::pod_collect_to_vec(&data);
        Ok(ArrayD::from_shape_vec(IxDyn(&t.shape), values)
            .unwrap()
            .into_pyarray(py))
    }

    /// Submits the recorded work without waiting.
    fn flush(&self) {
        self.gpu.flush();
    }

    /// Drops the recorded work unrun.
    fn discard(&self) {
        self.gpu.discard();
    }

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
        let mut quantized: Vec<ops::QuantizedAct> = Vec::new();
        let mut out = Vec::with_capacity(ws.len());
        for w in &ws {
            if cols != w.cols {
                return Err(value_error(format!(
                    "matmul: input rows of {cols}, weight rows of {}",
                    w.cols
                )));
            }
            let kind = ops::act_kind(w.ggml_type);
            let at = match quantized.iter().position(|q| q.kind == kind) {
                Some(i) => i,
                None => {
                    quantized.push(ops::quantize_act(&self.gpu, &x.buf, n, cols, kind));
                    quantized.len() - 1
                }
            };
            out.push(self.tensor_of(
                ops::matmul(&self.gpu, &w.w, &quantized[at]),
                vec![n, w.rows],
            ));
        }
        Ok(out)
    }

    /// Dequantized rows `ids` of the weight: n × cols.
    fn get_rows(&self, w: PyRef<'_, GpuMatrix>, ids: PyRef<'_, GpuTensor>) -> PyResult<GpuTensor> {
        self.check(&ids, Dtype::I32, "get_rows' ids")?;
        let n = ids.size();
        Ok(self.tensor_of(ops::get_rows(&self.gpu, &w.w, &ids.buf, n), vec![n, w.cols]))
    }

    /// RMSNorm over groups of `n` consecutive values (n = the weight's length when given).
    #[pyo3(signature = (x, weight, eps, n=None))]
    fn rms_norm(
        &self,
        x: PyRef<'_, GpuTensor>,
        weight: Option<PyRef<'_, GpuTensor>>,
        eps: f32,
        n: Option<usize>,
    ) -> PyResult<GpuTensor> {
        let n = n
            .or(weight.as_ref().map(|w| w.size()))
            .unwrap_or(*x.shape.last().unwrap_or(&1));
        if n == 0 || !x.size().is_multiple_of(n) {
            return Err(value_error(format!(
                "rms_norm: {:?} is not rows of {n}",
                x.shape
            )));
        }
        if n >= 1 << 16 {
            // norm.wgsl divides the exact sum by n in 16-bit steps
            return Err(value_error(format!(
                "rms_norm: rows of {n} elements (at most 65535 on the GPU)"
            )));
        }
        let out = ops::rms_norm(
            &self.gpu,
            &x.buf,
            x.size() / n,
            n,
            weight.as_ref().map(|w| &*w.buf),
            eps,
        );
        Ok(self.tensor_of(out, x.shape.clone()))
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
        self.check(&positions, Dtype::I32, "rope's positions")?;
        let rows = positions.size();
        if rows == 0 || !x.size().is_multiple_of(rows * n_head) {
            return Err(value_error(format!(
                "rope: {:?} is not {rows} rows of {n_head} heads",
                x.shape
            )));
        }
        let head_dim = x.size() / rows / n_head;
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(value_error(format!(
                "rope: n_rot {n_rot} must be even and <= head_dim {head_dim}"
            )));
        }
        let r = Rope {
            n_head,
            head_dim,
            n_rot,
            neox,
        };
        let table = self.rope_table(&positions, n_rot, base, freq_scale)?;
        ops::rope(&self.gpu, &x.buf, rows, &table, &r);
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

    /// gelu(gate) · up
    fn geglu(&self, gate: PyRef<'_, GpuTensor>, up: PyRef<'_, GpuTensor>) -> PyResult<GpuTensor> {
        self.gated(Elementwise::Geglu, &gate, &up)
    }

    /// silu(gate) · up
    fn swiglu(&self, gate: PyRef<'_, GpuTensor>, up: PyRef<'_, GpuTensor>) -> PyResult<GpuTensor> {
        self.gated(Elementwise::Swiglu, &gate, &up)
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

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<GpuDevice>()?;
    m.add_class::<GpuTensor>()?;
    m.add_class::<GpuMatrix>()?;
    m.add_class::<GpuKvCache>()?;
    Ok(())
}
