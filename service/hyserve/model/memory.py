"""Per-sequence model memory: an f16 KV cache per attention layer (index == token position).

Invariant kept by callers (ARCHITECTURE.md I1): `n_tokens` tokens have been evaluated and the
memory holds exactly their effect. Attention caches are truncatable: entries past `n_tokens` are
ignored and overwritten. Recurrent state (hybrid models) is added by those architectures.
"""

from __future__ import annotations

import numpy as np


class ContextFullError(ValueError):
    """The sequence would exceed the memory's context size."""


class KVCache:
    def __init__(self, n_ctx: int, n_kv_heads: int, head_dim: int) -> None:
        # np.zeros is lazily backed by the OS: untouched context costs no resident memory.
        self.k = np.zeros((n_ctx, n_kv_heads, head_dim), dtype=np.float16)
        self.v = np.zeros((n_ctx, n_kv_heads, head_dim), dtype=np.float16)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> None:
        end = start + len(k)
        self.k[start:end] = k
        self.v[start:end] = v

    def bits_until(self, end: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V for positions < end as uint16 views (what the attention kernel reads)."""
        return self.k[:end].view(np.uint16), self.v[:end].view(np.uint16)


class SequenceMemory:
    def __init__(self, n_ctx: int, kv: dict[int, KVCache]) -> None:
        self.n_ctx = n_ctx
        self.kv = kv
        self.n_tokens = 0

    def check_room(self, n_new: int) -> None:
        if self.n_tokens + n_new > self.n_ctx:
            raise ContextFullError(f"{self.n_tokens} + {n_new} tokens exceed the context size {self.n_ctx}")

    def truncate(self, n: int) -> None:
        """Forget every token from position n on (attention caches only need the count)."""
        if not 0 <= n <= self.n_tokens:
            raise ValueError(f"cannot truncate {self.n_tokens} tokens to {n}")
        self.n_tokens = n

    def clear(self) -> None:
        self.truncate(0)
