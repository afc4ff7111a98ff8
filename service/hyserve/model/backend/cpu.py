"""The CPU backend: the SIMD kernels of `hyserve_kernels` on numpy arrays, exactly as llama.cpp's
CPU path computes them (the kernels' bit-identity contract)."""

from __future__ import annotations

from collections.abc import Sequence

import hyserve_kernels as hk
import numpy as np

from hyserve.model.backend.base import AttentionSpan
from hyserve.model.backend.recurrent_cpu import CpuRecurrentOps
from hyserve.model.backend.rotary import Rotary
from hyserve.model.memory import KVCache


class CpuBackend(CpuRecurrentOps):
    name = "cpu"
    numerics = ""  # the CPU kernels are the reference bits

    @property
    def description(self) -> str:
        return f"CPU ({hk.simd_path()}, {hk.num_threads()} threads)"

    def matrix(self, m: hk.QMatrix) -> hk.QMatrix:
        return m

    def vector(self, v: np.ndarray) -> np.ndarray:
        return v

    def kv_cache(self, n_ctx: int, n_kv: int, head_dim: int) -> KVCache:
        return KVCache(n_ctx, n_kv, head_dim)

    def ids(self, a: np.ndarray, step_input: str = "") -> np.ndarray:
        return a

    def embed(self, m: hk.QMatrix, tokens: np.ndarray) -> np.ndarray:
        return hk.get_rows(m, tokens)

    def matmul(self, w: hk.QMatrix, x: np.ndarray, cancel: hk.CancelFlag | None = None) -> np.ndarray:
        return hk.matmul(w, np.ascontiguousarray(x), cancel)

    def matmul_many(
        self, ws: Sequence[hk.QMatrix], x: np.ndarray, cancel: hk.CancelFlag | None = None
    ) -> list[np.ndarray]:
        return hk.matmul_many(list(ws), np.ascontiguousarray(x), cancel)

    def rms_norm(
        self,
        x: np.ndarray,
        weight: np.ndarray,
        eps: float,
        feeds: Sequence[hk.QMatrix] = (),
        rope: Rotary | None = None,
        gate: np.ndarray | None = None,
    ) -> np.ndarray:
        n = len(weight)
        out = hk.rms_norm(np.ascontiguousarray(x).reshape(-1, n), weight, eps).reshape(x.shape)
        if gate is not None:
            self.mul_silu_(out, gate.reshape(out.shape))
        return out if rope is None else self.rope(out, *rope)

    def rope(
        self, x: np.ndarray, n_head: int, positions: np.ndarray, n_rot: int, base: float, scale: float, neox: bool
    ) -> np.ndarray:
        x = np.ascontiguousarray(x)
        hk.rope(x, n_head, positions, n_rot, base, scale, neox)
        return x

    def add_(self, dst: np.ndarray, a: np.ndarray) -> None:
        dst += a

    def add_rms_norm(
        self, h: np.ndarray, a: np.ndarray, weight: np.ndarray, eps: float, feeds: Sequence[hk.QMatrix] = ()
    ) -> np.ndarray:
        self.add_(h, a)
        return self.rms_norm(h, weight, eps)

    def scale_(self, dst: np.ndarray, s: float | np.float32) -> None:
        dst *= s

    def add_row(self, x: np.ndarray, bias: np.ndarray) -> np.ndarray:
        return x + bias

    def geglu(self, gate: np.ndarray, up: np.ndarray, feeds: Sequence[hk.QMatrix] = ()) -> np.ndarray:
        return hk.geglu(gate, up)

    def swiglu(self, gate: np.ndarray, up: np.ndarray, feeds: Sequence[hk.QMatrix] = ()) -> np.ndarray:
        return hk.swiglu(gate, up)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return (cap * np.tanh(x / cap)).astype(np.float32)

    def empty(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.empty(shape, dtype=np.float32)

    def take_rows(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x[rows])

    def argmax_rows(self, x: np.ndarray) -> np.ndarray:
        return np.argmax(x, axis=-1).astype(np.float32)

    def attention(
        self,
        spans: Sequence[AttentionSpan],
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        positions: np.ndarray,
        window: int,
        kq_scale: float,
        out: np.ndarray,
    ) -> None:
        if not spans:
            return
        hd = spans[0].cache.k.shape[2]
        q, k, v = (t.reshape(len(t), -1, hd) for t in (q, k, v))
        jobs = []
        for cache, start, rows in spans:
            end = start + (rows.stop - rows.start)
            cache.write(start, k[rows], v[rows])
            # a ring-buffer window cache hands over its keys from `base` on: positions shift with them
            k_bits, v_bits, base = cache.attention_view(start, end, window)
            pos = positions[rows] if base == 0 else positions[rows] - base
            jobs.append((rows.start, rows.stop, k_bits, v_bits, np.ascontiguousarray(pos, np.int32)))
        hk.attention_spans(q, jobs, out, window, kq_scale)

    def moe(self, ffn: hk.MoeFfn) -> hk.MoeFfn:
        return ffn

    def moe_ffn(self, moe: hk.MoeFfn, x: np.ndarray, cancel: hk.CancelFlag | None = None) -> np.ndarray:
        return moe(np.ascontiguousarray(x), cancel)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def to_host_many(self, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return list(xs)

    def flush(self) -> None:
        pass

    def abort(self) -> None:
        pass


CPU = CpuBackend()
