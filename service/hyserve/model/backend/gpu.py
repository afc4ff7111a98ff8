"""The GPU backend: the WGSL compute shaders of `hyserve_kernels` through wgpu. Weights are uploaded
once in their GGUF block formats; KV caches live on the device; a forward call records its work
into one command encoder, submitted when the logits are read back."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import hyserve_kernels as hk
import numpy as np

from hyserve.model.backend.base import AttentionSpan
from hyserve.model.backend.gpu_capture import CaptureLog
from hyserve.model.backend.recurrent_gpu import GpuRecurrentOps
from hyserve.model.backend.rotary import Rotary


class GpuKVCache:
    """One attention layer's K/V cache on the device (f16, index == token position). Host copies
    (the prefix store) go through `host_copy` / `write` like the CPU cache's."""

    on_device = True

    def __init__(self, device: hk.GpuDevice, n_ctx: int, n_kv: int, head_dim: int) -> None:
        self.device = device
        self.cache = device.kv_cache(n_ctx, n_kv, head_dim)
        self.n_ctx, self.n_kv, self.head_dim = n_ctx, n_kv, head_dim

    @property
    def nbytes(self) -> int:
        return int(self.cache.nbytes)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Host K/V rows (any float dtype) at positions start.."""
        bits = [np.ascontiguousarray(a, dtype=np.float16).view(np.uint16) for a in (k, v)]
        self.device.kv_write(self.cache, start, bits[0], bits[1])

    def host_copy(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions 0..n as f16 host arrays (n x n_kv x head_dim)."""
        k, v = self.device.kv_read(self.cache, n)
        return k.view(np.float16), v.view(np.float16)


class GpuBackend(GpuRecurrentOps):
    name = "gpu"

    def __init__(self, device: hk.GpuDevice) -> None:
        self.device = device
        self.description = device.name
        self.numerics = device.numerics
        self._matrices: dict[int, tuple[hk.QMatrix, hk.GpuMatrix]] = {}
        # decode steps are captured once and replayed (architectures/step_plans.py); off: every
        # step records its operations one by one
        self.replay_steps = True
        self._capture = threading.local()  # the calling thread's CaptureLog while it captures

    def matrix(self, m: hk.QMatrix) -> hk.GpuMatrix:
        # a tied embedding / LM head is one upload
        got = self._matrices.get(id(m))
        if got is None or got[0] is not m:
            got = (m, self.device.matrix(m))
            self._matrices[id(m)] = got
        return got[1]

    def vector(self, v: np.ndarray) -> hk.GpuTensor:
        return self.device.tensor(np.ascontiguousarray(v, dtype=np.float32))

    def kv_cache(self, n_ctx: int, n_kv: int, head_dim: int) -> GpuKVCache:
        return GpuKVCache(self.device, n_ctx, n_kv, head_dim)

    def ids(self, a: np.ndarray, step_input: str = "") -> hk.GpuTensor:
        t = self.device.ids(np.ascontiguousarray(a, dtype=np.int32))
        log = self._capture_log()
        if log is not None and step_input:
            log.inputs[step_input] = t
        return t

    # -- captured forwards
    def _capture_log(self) -> CaptureLog | None:
        return getattr(self._capture, "log", None)

    def begin_capture(self, log: CaptureLog) -> bool:
        """Capture this thread's next forward into `log`; False (and `log.why`) when the device
        cannot now (another thread capturing, profiling)."""
        try:
            self.device.begin_capture()
        except ValueError as e:
            log.why = str(e)
            return False
        self._capture.log = log
        return True

    def end_capture(self) -> None:
        """End this thread's capture, if one is under way: its plan, or why none, go to its log."""
        log = self._capture_log()
        if log is None:
            return
        self._capture.log = None
        try:
            log.plan = self.device.end_capture()
        except ValueError as e:
            log.why = str(e)

    def embed(self, m: hk.GpuMatrix, tokens: hk.GpuTensor) -> hk.GpuTensor:
        return self.device.get_rows(m, tokens)

    def matmul(self, w: hk.GpuMatrix, x: hk.GpuTensor, cancel: hk.CancelFlag | None = None) -> hk.GpuTensor:
        # `cancel` is not polled here: recording a dispatch returns at once and the device runs the
        # work only at the forward's submit, so there is no long call to stop between row chunks.
        # The model polls the flag between layers, before recording more (ForwardCancelled).
        return self.device.matmul(w, x)

    def matmul_many(
        self, ws: Sequence[hk.GpuMatrix], x: hk.GpuTensor, cancel: hk.CancelFlag | None = None
    ) -> list[hk.GpuTensor]:
        return self.device.matmul_many(list(ws), x)

    def rms_norm(
        self,
        x: hk.GpuTensor,
        weight: hk.GpuTensor,
        eps: float,
        feeds: Sequence[hk.GpuMatrix] = (),
        rope: Rotary | None = None,
        gate: hk.GpuTensor | None = None,
    ) -> hk.GpuTensor:
        if gate is not None:  # the one pass has no quantizing end: the matmul quantizes
            return self.device.rms_norm(x, weight, eps, gate=gate)
        return self.device.rms_norm(x, weight, eps, feeds=list(feeds), rope=rope)

    def rope(
        self, x: hk.GpuTensor, n_head: int, positions: hk.GpuTensor, n_rot: int, base: float, scale: float, neox: bool
    ) -> hk.GpuTensor:
        self.device.rope(x, n_head, positions, n_rot, base, scale, neox)
        return x

    def add_(self, dst: hk.GpuTensor, a: hk.GpuTensor) -> None:
        self.device.add(dst, a)

    def add_rms_norm(
        self, h: hk.GpuTensor, a: hk.GpuTensor, weight: hk.GpuTensor, eps: float, feeds: Sequence[hk.GpuMatrix] = ()
    ) -> hk.GpuTensor:
        return self.device.add_rms_norm(h, a, weight, eps, feeds=list(feeds))

    def scale_(self, dst: hk.GpuTensor, s: float | np.float32) -> None:
        self.device.scale(dst, float(s))

    def add_row(self, x: hk.GpuTensor, bias: hk.GpuTensor) -> hk.GpuTensor:
        out = self.device.columns(x, 0, x.shape[-1])  # a copy
        self.device.add_row(out, bias)
        return out.reshape(*x.shape)

    def geglu(self, gate: hk.GpuTensor, up: hk.GpuTensor, feeds: Sequence[hk.GpuMatrix] = ()) -> hk.GpuTensor:
        return self.device.geglu(gate, up, feeds=list(feeds))

    def swiglu(self, gate: hk.GpuTensor, up: hk.GpuTensor, feeds: Sequence[hk.GpuMatrix] = ()) -> hk.GpuTensor:
        return self.device.swiglu(gate, up, feeds=list(feeds))

    def softcap(self, x: hk.GpuTensor, cap: float) -> hk.GpuTensor:
        self.device.softcap(x, cap)
        return x

    def empty(self, shape: tuple[int, ...]) -> hk.GpuTensor:
        return self.device.empty(list(shape))

    def take_rows(self, x: hk.GpuTensor, rows: np.ndarray) -> hk.GpuTensor:
        return self.device.take_rows(x, self.ids(rows))

    def argmax_rows(self, x: hk.GpuTensor) -> hk.GpuTensor:
        return self.device.argmax_rows(x)

    def attention(
        self,
        spans: Sequence[AttentionSpan],
        q: hk.GpuTensor,
        k: hk.GpuTensor,
        v: hk.GpuTensor,
        positions: hk.GpuTensor,
        window: int,
        kq_scale: float,
        out: hk.GpuTensor,
    ) -> None:
        if not spans:
            return
        n_head = q.nbytes // 4 // positions.shape[0] // spans[0].cache.head_dim  # one layer: one shape
        for cache, start, rows in spans:
            n_rows = rows.stop - rows.start
            self.device.attention(
                cache.cache, q, k, v, positions, out, rows.start, n_rows, start, n_head, window, kq_scale
            )

    def moe(self, ffn: hk.MoeFfn) -> hk.GpuMoeFfn:
        # the expert tensors in their block formats, one upload each (a fused gate_up once)
        return hk.GpuMoeFfn(self.device, ffn)

    def moe_ffn(self, moe: hk.GpuMoeFfn, x: hk.GpuTensor, cancel: hk.CancelFlag | None = None) -> hk.GpuTensor:
        return moe(x)

    def to_host(self, x: hk.GpuTensor) -> np.ndarray:
        return self.device.to_host(x)

    def to_host_many(self, xs: Sequence[hk.GpuTensor | np.ndarray]) -> list[np.ndarray]:
        on_device = [i for i, x in enumerate(xs) if not isinstance(x, np.ndarray)]
        log = self._capture_log()
        if log is not None:  # a captured forward ends with its read-back: a replay reads the same
            log.outputs = list(xs) if len(on_device) == len(xs) else []
            self.end_capture()
        out = list(xs)
        for i, host in zip(on_device, self.device.to_host_many([xs[i] for i in on_device])):
            out[i] = host
        return out

    def flush(self) -> None:
        self.device.flush()

    def abort(self) -> None:
        # Submitted, not dropped: the device has one pending encoder, and another thread (another
        # engine on this device) may have recorded work into it too. A cancelled call's work changes
        # no memory: it writes only KV positions past each memory's token count and spare state buffers.
        self.end_capture()  # the log keeps no plan of a failed forward (step_plans drops it)
        self.device.flush()
