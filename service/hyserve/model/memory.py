"""Per-sequence model memory: an f16 KV cache per attention layer (index == token position).

Invariant kept by callers (ARCHITECTURE.md I1): `n_tokens` tokens have been evaluated and the
memory holds exactly their effect. Attention caches are truncatable: entries past `n_tokens` are
ignored and overwritten. Recurrent state (conv + SSM/delta state per recurrent layer) is not: it
describes exactly `n_tokens` tokens, so it can only be reset, or replaced by a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

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


class RecurrentState:
    """One recurrent layer's state: the last K-1 raw conv inputs and the SSM/delta state (f32)."""

    def __init__(self, conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...]) -> None:
        self.conv = np.zeros(conv_shape, dtype=np.float32)
        self.ssm = np.zeros(ssm_shape, dtype=np.float32)

    def reset(self) -> None:
        self.conv.fill(0.0)
        self.ssm.fill(0.0)

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes


@dataclass(frozen=True)
class Snapshot:
    """A copy of the non-truncatable part of a memory after exactly `n_tokens` tokens."""

    n_tokens: int
    states: dict[int, tuple[np.ndarray, np.ndarray]]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes + s.nbytes for c, s in self.states.values())


@dataclass(frozen=True)
class MemoryImage:
    """A full copy of a memory after `n_tokens` tokens (for the host-memory prefix store)."""

    n_tokens: int
    kv: dict[int, tuple[np.ndarray, np.ndarray]]
    live: Snapshot

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv.values()) + self.live.nbytes


class SequenceMemory:
    def __init__(self, n_ctx: int, kv: dict[int, KVCache], recurrent: dict[int, RecurrentState] | None = None) -> None:
        self.n_ctx = n_ctx
        self.kv = kv
        self.recurrent = recurrent or {}
        self.n_tokens = 0

    @property
    def truncatable(self) -> bool:
        """True when any prefix can be resumed by truncation (no recurrent state)."""
        return not self.recurrent

    @property
    def live_floor(self) -> int:
        """The smallest n that `truncate(n)` reaches exactly (besides 0, a reset)."""
        return 0 if not self.recurrent else self.n_tokens

    @property
    def has_attention(self) -> bool:
        return bool(self.kv)

    def export(self) -> MemoryImage:
        """A copy of everything this memory holds (KV entries up to n_tokens + the recurrent state)."""
        n = self.n_tokens
        kv = {il: (c.k[:n].copy(), c.v[:n].copy()) for il, c in self.kv.items()}
        return MemoryImage(n, kv, self.snapshot())

    def load(self, image: MemoryImage, n: int, snap: Snapshot | None = None) -> None:
        """Become the memory after the first n tokens of `image`: its KV entries up to n, and the
        recurrent state `snap` (a checkpoint at n), or the image's own when n is its length."""
        if not 0 <= n <= min(image.n_tokens, self.n_ctx):
            raise ValueError(f"cannot load {n} tokens from an image of {image.n_tokens} (context {self.n_ctx})")
        state = snap if snap is not None else image.live
        if self.recurrent and state.n_tokens != n:
            raise ValueError(f"recurrent state of {state.n_tokens} tokens cannot resume at {n}")
        for il, (k, v) in image.kv.items():
            self.kv[il].write(0, k[:n], v[:n])
        self._put_states(state)
        self.n_tokens = n

    def snapshot(self) -> Snapshot:
        return Snapshot(self.n_tokens, {il: (st.conv.copy(), st.ssm.copy()) for il, st in self.recurrent.items()})

    def restore(self, snap: Snapshot) -> None:
        """Put back the recurrent state after `snap.n_tokens` tokens; the KV cache is truncated to it
        (its entries up to that position must still be those of the same tokens: the caller's prefix)."""
        if snap.n_tokens > self.n_tokens:
            raise ValueError(f"snapshot of {snap.n_tokens} tokens is ahead of the memory ({self.n_tokens})")
        self._put_states(snap)
        self.n_tokens = snap.n_tokens

    def _put_states(self, snap: Snapshot) -> None:
        for il, (conv, ssm) in snap.states.items():
            self.recurrent[il].conv[...] = conv
            self.recurrent[il].ssm[...] = ssm

    def check_room(self, n_new: int) -> None:
        if self.n_tokens + n_new > self.n_ctx:
            raise ContextFullError(f"{self.n_tokens} + {n_new} tokens exceed the context size {self.n_ctx}")

    def truncate(self, n: int) -> None:
        """Forget every token from position n on (attention caches only need the count). Recurrent
        memory can only be truncated to its full length or to 0 (a reset)."""
        if not 0 <= n <= self.n_tokens:
            raise ValueError(f"cannot truncate {self.n_tokens} tokens to {n}")
        if self.recurrent and 0 < n < self.n_tokens:
            raise ValueError(f"recurrent state cannot go back from {self.n_tokens} to {n} tokens without a snapshot")
        if n == 0:
            for state in self.recurrent.values():
                state.reset()
        self.n_tokens = n

    def clear(self) -> None:
        self.truncate(0)
