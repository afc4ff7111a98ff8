"""Where two runs part: llama.cpp's intermediate tensors through its eval callback (`cb_eval`),
hyserve's through a spy on the kernel functions its architectures call, and the first hyserve
kernel output that matches no llama.cpp tensor bit for bit."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import hyserve_kernels as hk
import llama_cpp
import numpy as np

from hyserve.model.architectures.base import Architecture, Logits, Segment
from llama_oracle import _quiet

_base = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
_base.ggml_get_name.restype = ctypes.c_char_p
_base.ggml_get_name.argtypes = [ctypes.c_void_p]
_base.ggml_nbytes.restype = ctypes.c_size_t
_base.ggml_nbytes.argtypes = [ctypes.c_void_p]
_base.ggml_is_contiguous.restype = ctypes.c_bool
_base.ggml_is_contiguous.argtypes = [ctypes.c_void_p]
_base.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
_GGML_TYPE_F32 = 0
_NE_OFFSET = 16  # struct ggml_tensor: enum type, (padding), buffer pointer, then int64 ne[4]

# kernels that return nothing worth comparing
_SKIP = {"set_num_threads", "num_threads", "set_force_scalar", "simd_path", "set_simd_ceiling"}


def llama_tensors(path: Path, tokens: list[int], n_batch: int, threads: int = 2) -> list[tuple[str, np.ndarray]]:
    """Every contiguous F32 tensor llama.cpp computes for `tokens` in batches of `n_batch`, in
    graph order (plain path: repacking and flash attention off, as `LlamaOracle`)."""
    found: list[tuple[str, np.ndarray]] = []

    @llama_cpp.ggml_backend_sched_eval_callback
    def callback(t: int, ask: bool, user_data: ctypes.c_void_p) -> bool:
        if ask:
            return True
        if ctypes.c_int32.from_address(t).value == _GGML_TYPE_F32 and _base.ggml_is_contiguous(t):
            n = _base.ggml_nbytes(t)
            buf = np.empty(n // 4, np.float32)
            _base.ggml_backend_tensor_get(t, buf.ctypes.data, 0, n)
            found.append((_base.ggml_get_name(t).decode(), buf))
        return True

    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = max(64, len(tokens)), n_batch, n_batch
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.cb_eval = callback
    ctx = llama_cpp.llama_init_from_model(model, cp)
    batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
    try:
        for start in range(0, len(tokens), n_batch):
            part = tokens[start : start + n_batch]
            for i, tok in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, start + i, 1, 1
                batch.seq_id[i][0] = 0
            batch.n_tokens = len(part)
            if llama_cpp.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return found


@contextlib.contextmanager
def spy_kernels() -> Iterator[list[tuple[str, np.ndarray]]]:
    """Records the F32 arrays every `hyserve_kernels` function returns (or, for in-place kernels
    that return nothing, their first argument after the call), in call order."""
    calls: list[tuple[str, np.ndarray]] = []
    names = [n for n in dir(hk) if n[:1].islower() and n not in _SKIP and callable(getattr(hk, n))]
    originals = {n: getattr(hk, n) for n in names}

    def wrap(name: str, fn: Callable) -> Callable:
        def spied(*args, **kwargs):
            out = fn(*args, **kwargs)
            outs = out if isinstance(out, (list, tuple)) else [out]
            if out is None and args:
                outs = [args[0]]
            for o in outs:
                if isinstance(o, np.ndarray) and o.dtype == np.float32:
                    calls.append((name, o.copy()))
            return out

        return spied

    for n, fn in originals.items():
        setattr(hk, n, wrap(n, fn))
    try:
        yield calls
    finally:
        for n, fn in originals.items():
            setattr(hk, n, fn)


@dataclass
class Divergence:
    kernel: str  # hyserve kernel and call number
    nearest: str  # llama.cpp tensor of the same size closest to it
    max_diff: float
    first_row: int  # first row (token position, for row-major activations) that differs

    def __str__(self) -> str:
        return (
            f"first differing tensor: hyserve {self.kernel} vs llama.cpp '{self.nearest}' "
            f"(max |diff| {self.max_diff:.3g}, first at row {self.first_row})"
        )


def first_divergence(arch: Architecture, path: Path, tokens: list[int], n_batch: int = 512) -> Divergence | None:
    """The first hyserve kernel output (in call order) that equals no llama.cpp tensor, both fed
    the same batches of `n_batch` tokens (llama.cpp's attention depends on its batch layout)."""
    theirs = llama_tensors(path, tokens, n_batch)
    by_size: dict[int, list[tuple[str, np.ndarray]]] = {}
    exact: set[bytes] = set()
    for name, a in theirs:
        by_size.setdefault(a.size, []).append((name, a))
        exact.add(a.tobytes())
    memory = arch.new_memory(len(tokens) + 8)
    with spy_kernels() as calls:
        for start in range(0, len(tokens), n_batch):
            arch.forward([Segment(memory, np.asarray(tokens[start : start + n_batch], np.int32), Logits.ALL)])
    for i, (kernel, out) in enumerate(calls):
        if out.size == 0 or out.tobytes() in exact or out.size not in by_size:
            continue
        flat = out.reshape(-1)
        name, ref = min(by_size[out.size], key=lambda c: float(np.nanmax(np.abs(c[1] - flat))))
        diff = np.abs(ref - flat)
        rows = out.shape[0] if out.ndim > 1 else 1
        first = int(np.flatnonzero(diff.reshape(rows, -1).max(-1))[0]) if diff.any() else 0
        return Divergence(f"hk.{kernel} (call {i})", name, float(np.nanmax(diff)), first)
    return None
