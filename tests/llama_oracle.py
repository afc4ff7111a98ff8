"""llama.cpp (llama-cpp-python's low-level API) as the test oracle: per-position logits for a
token sequence, with the CPU settings pinned so the reference is reproducible:

- flash attention off (the F16 KV-cache path with tinyBLAS products);
- `repack`: llama.cpp's AVX2 weight repacking (on by default in llama.cpp) interleaves Q4_K/Q5_K/
  Q6_K rows into 8-row tiles whose kernels sum in a different float order than its plain
  `vec_dot` kernels. Off, llama.cpp's matmuls use the same order as hyserve's kernels;
- `GGML_CPU_TILED_MM=0`: this ggml (0.3.36) runs K-quant matmuls of >= 8 activation rows through a
  "tiled" GEMM whose float order differs from its `vec_dot` kernels, used below 8 rows, so its
  results depend on the batch size. hyserve is batch-invariant and follows `vec_dot` bit for bit;
  ggml reads the switch once per process, so it is set when this module is imported, before any
  oracle evaluates anything.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

os.environ.setdefault("GGML_CPU_TILED_MM", "0")

import numpy as np

llama_cpp = __import__("pytest").importorskip("llama_cpp", reason="llama-cpp-python (the oracle) is not installed")


@llama_cpp.llama_log_callback
def _quiet(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """llama.cpp logs every tensor at load; tests only need its errors, which surface as exceptions."""


class LlamaOracle:
    def __init__(self, path: Path, n_ctx: int = 2048, n_batch: int = 512, repack: bool = False, threads: int = 2):
        llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        mp.use_extra_bufts = repack
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = llama_cpp.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = llama_cpp.llama_init_from_model(self.model, cp)
        self.n_batch = n_batch
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))

    def logits(self, tokens: list[int]) -> np.ndarray:
        """Logits after every position (teacher-forced), evaluated in batches of n_batch."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        out = np.empty((len(tokens), self.n_vocab), dtype=np.float32)
        for start in range(0, len(tokens), self.n_batch):
            part = tokens[start : start + self.n_batch]
            batch = llama_cpp.llama_batch_init(len(part), 0, 1)
            try:
                for i, t in enumerate(part):
                    batch.token[i] = t
                    batch.pos[i] = start + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = 1
                batch.n_tokens = len(part)
                if llama_cpp.llama_decode(self.ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
                for i in range(len(part)):
                    ptr = llama_cpp.llama_get_logits_ith(self.ctx, i)
                    row = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))
                    out[start + i] = np.ctypeslib.as_array(row, shape=(self.n_vocab,))
            finally:
                llama_cpp.llama_batch_free(batch)
        return out

    def close(self) -> None:
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kl_per_position(reference: np.ndarray, ours: np.ndarray, rows: int = 32) -> np.ndarray:
    """KL(reference || ours) in nats at every position. Computed `rows` positions at a time: the
    same values (each row's sums are its own), without float64 copies of whole logit matrices
    (2 GB each for 1,000 positions of a 262k vocabulary)."""
    if reference.ndim == 1:
        return kl_per_position(reference[None], ours[None], rows)[0]
    out = np.empty(reference.shape[0], dtype=np.float64)
    for i in range(0, reference.shape[0], rows):
        lp, lq = log_softmax(reference[i : i + rows]), log_softmax(ours[i : i + rows])
        out[i : i + rows] = (np.exp(lp) * (lp - lq)).sum(-1)
    return out


def top1_agreement(reference: np.ndarray, ours: np.ndarray) -> float:
    """Share of positions where both pick the same most likely token."""
    return float((reference.argmax(-1) == ours.argmax(-1)).mean())


def top1_agreement_up_to_ties(reference: np.ndarray, ours: np.ndarray, tie: float = 0.01) -> float:
    """Share of positions where our most likely token is also the reference's, or scores within
    `tie` logits of the reference's best (a near-tie that float summation order decides)."""
    best = reference.max(-1)
    picked = np.take_along_axis(reference, ours.argmax(-1)[..., None], -1)[..., 0]
    return float((picked >= best - tie).mean())
