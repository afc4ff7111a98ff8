"""Per-sequence model memory: an f16 KV cache per attention layer (index == token position).

Invariant kept by callers (ARCHITECTURE.md I1): `n_tokens` tokens have been evaluated and the
memory holds exactly their effect. Attention caches are truncatable: entries past `n_tokens` are
ignored and overwritten. Recurrent state (conv + SSM/delta state per recurrent layer) is not: it
describes exactly `n_tokens` tokens, so it can only be reset, or replaced by a snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hyserve_kernels as hk
import numpy as np


class ContextFullError(ValueError):
    """The sequence would exceed the memory's context size."""


def store_rows(dst: np.ndarray, src: np.ndarray) -> None:
    """`dst[...] = src` for an f16 cache slice: float32 rows rounded to f16 in the kernel wheel
    (numpy's own cast takes ~8 ns per value: a 4096-row layer write 3.6 ms instead of 0.15 ms; a
    one-row decode write costs the call either way); other dtypes (already f16) are copied as
    they are."""
    if src.dtype == np.float32 and dst.flags.c_contiguous and src.size == dst.size:
        if src.size:
            hk.store_f16(np.ascontiguousarray(src), dst.view(np.uint16))
    else:
        dst[...] = src


def as_f16(x: np.ndarray) -> np.ndarray:
    """`x.astype(np.float16)` for float32 input, rounded in the kernel wheel (same bits)."""
    out = np.empty(x.shape, np.float16)
    store_rows(out, x)
    return out


class KVCache:
    on_device = False  # host memory (GpuKVCache: device memory)

    def __init__(self, n_ctx: int, n_kv_heads: int, head_dim: int) -> None:
        # np.zeros is lazily backed by the OS: untouched context costs no resident memory.
        self.k = np.zeros((n_ctx, n_kv_heads, head_dim), dtype=np.float16)
        self.v = np.zeros((n_ctx, n_kv_heads, head_dim), dtype=np.float16)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> None:
        end = start + len(k)
        store_rows(self.k[start:end], k)
        store_rows(self.v[start:end], v)

    def host_copy(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions 0..n (copies, for the host prefix store)."""
        return self.k[:n].copy(), self.v[:n].copy()

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def bits_until(self, end: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V for positions < end as uint16 views (what the attention kernel reads)."""
        return self.k[:end].view(np.uint16), self.v[:end].view(np.uint16)

    def attention_view(self, start: int, end: int, window: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(K bits, V bits, position of index 0) for queries at positions start..end-1."""
        k, v = self.bits_until(end)
        return k, v, 0


def window_base(n: int, window: int) -> int:
    """First cache position a query at position n can see, rounded down to a multiple of 8: the
    attention kernel groups keys by 8 from position 0, so a view must start on a group edge to
    give the same bits as the full cache."""
    return max(0, n - window + 1) // 8 * 8


class WindowCache:
    """A sliding-window layer's K/V as a ring of `capacity` positions (position p at p % capacity).

    Holds the last `capacity` positions written; a forward of up to `capacity - window - 8` tokens
    finds every key it needs. Resuming further back needs a window checkpoint (`window_copy`).
    """

    on_device = False

    def __init__(self, capacity: int, window: int, n_kv_heads: int, head_dim: int) -> None:
        if capacity % 8 or capacity < window + 16:
            raise ValueError(f"ring capacity {capacity} must be a multiple of 8 and >= window + 16")
        self.capacity, self.window = capacity, window
        self.k = np.zeros((capacity, n_kv_heads, head_dim), dtype=np.float16)
        self.v = np.zeros((capacity, n_kv_heads, head_dim), dtype=np.float16)

    def write(self, start: int, k: np.ndarray, v: np.ndarray) -> None:
        if len(k) > self.capacity:
            raise ValueError(f"{len(k)} positions do not fit a ring of {self.capacity}")
        # the positions wrap at most once: two contiguous pieces of the ring
        s = start % self.capacity
        first = min(len(k), self.capacity - s)
        for dst, src in ((self.k, k), (self.v, v)):
            store_rows(dst[s : s + first], src[:first])
            store_rows(dst[: len(k) - first], src[first:])

    def read(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """K and V of positions start..end-1, in order (a view when they do not wrap)."""
        s = start % self.capacity
        if s + (end - start) <= self.capacity:
            return self.k[s : s + end - start], self.v[s : s + end - start]
        idx = np.arange(start, end) % self.capacity
        return self.k[idx], self.v[idx]

    def attention_view(self, start: int, end: int, window: int) -> tuple[np.ndarray, np.ndarray, int]:
        base = window_base(start, window)
        k, v = self.read(base, end)
        return k.view(np.uint16), v.view(np.uint16), base

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def window_copy(self, n: int) -> tuple[int, np.ndarray, np.ndarray]:
        """(first position, K, V) of what a query at position n needs: the state to resume at n."""
        base = window_base(n, self.window)
        k, v = self.read(base, n)
        return base, k.copy(), v.copy()


class RecurrentState:
    """One recurrent layer's state: the last K-1 raw conv inputs and the SSM/delta state (f32), in
    host memory (`GpuRecurrentState`: the same on a GPU device)."""

    on_device = False

    def __init__(self, conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...]) -> None:
        self.conv = np.zeros(conv_shape, dtype=np.float32)
        self.ssm = np.zeros(ssm_shape, dtype=np.float32)

    def reset(self) -> None:
        self.conv.fill(0.0)
        self.ssm.fill(0.0)

    @property
    def nbytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes

    def copies(self) -> tuple[np.ndarray, np.ndarray]:
        return self.conv.copy(), self.ssm.copy()

    def host_copies(self) -> tuple[np.ndarray, np.ndarray]:
        return self.copies()

    def put(self, conv: np.ndarray, ssm: np.ndarray) -> None:
        self.conv[...] = conv
        self.ssm[...] = ssm

    def adopt(self, conv: np.ndarray, ssm: np.ndarray) -> None:
        self.conv, self.ssm = conv, ssm  # no copy: the arrays become this state's

    def to_host(self, conv: np.ndarray, ssm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return conv, ssm


@dataclass(frozen=True)
class Snapshot:
    """A copy of the non-truncatable part of a memory after exactly `n_tokens` tokens: recurrent
    states, and for ring-buffer window layers the keys/values a next token can see."""

    n_tokens: int
    states: dict[int, tuple[Any, Any]]  # numpy arrays, or device tensors of a GPU memory
    windows: dict[int, tuple[int, np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes + s.nbytes for c, s in self.states.values()) + sum(
            k.nbytes + v.nbytes for _, k, v in self.windows.values()
        )

    @property
    def device_nbytes(self) -> int:
        """The part of `nbytes` on a GPU device (the states of a GPU memory's checkpoints)."""
        return sum(c.nbytes + s.nbytes for c, s in self.states.values() if not isinstance(c, np.ndarray))


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
    def __init__(
        self, n_ctx: int, kv: dict[int, KVCache | WindowCache], recurrent: dict[int, RecurrentState] | None = None
    ) -> None:
        self.n_ctx = n_ctx
        self.kv = kv
        self.recurrent: dict[int, Any] = recurrent or {}  # RecurrentState or GpuRecurrentState
        self.n_tokens = 0
        self.ring_valid_from = 0  # ring layers hold correct entries for positions >= this (up to n_tokens)

    @property
    def rings(self) -> dict[int, WindowCache]:
        return {il: c for il, c in self.kv.items() if isinstance(c, WindowCache)}

    def use_window_rings(self, windows: dict[int, int], max_batch: int) -> None:
        """Keep the given sliding-window layers (layer -> window) as rings instead of full caches,
        sized for forwards of up to `max_batch` tokens."""
        for il, window in windows.items():
            old = self.kv[il]
            if not isinstance(old, KVCache):
                raise ValueError("ring-buffer window caches exist on the CPU only (use --swa-cache full)")
            capacity = -(-(window + max_batch + 8) // 8) * 8
            if window <= 0 or capacity >= self.n_ctx:
                continue  # a ring would not be smaller
            self.kv[il] = WindowCache(capacity, window, old.k.shape[1], old.k.shape[2])

    @property
    def truncatable(self) -> bool:
        """True when any prefix can be resumed by truncation (no recurrent state, no ring)."""
        return not self.recurrent and not self.rings

    @property
    def live_floor(self) -> int:
        """The smallest n that `truncate(n)` reaches exactly (besides 0, a reset)."""
        if self.recurrent:
            return self.n_tokens
        rings = self.rings
        if not rings or self.ring_valid_from == 0:
            return 0
        window = max(r.window for r in rings.values())
        first = -(-self.ring_valid_from // 8) * 8  # window_base(n) >= valid_from
        return min(self.n_tokens, first + window - 1)

    def note_written(self, end: int) -> None:
        """After a forward wrote positions up to `end`: older ring entries were overwritten."""
        rings = self.rings
        if rings:
            capacity = min(r.capacity for r in rings.values())
            self.ring_valid_from = max(self.ring_valid_from, end - capacity)

    @property
    def device_bytes(self) -> int:
        """Bytes of this memory allocated on a GPU device."""
        kv = sum(c.nbytes for c in self.kv.values() if c.on_device)
        return kv + sum(st.nbytes for st in self.recurrent.values() if st.on_device)

    @property
    def host_bytes(self) -> int:
        """Bytes of this memory allocated in host memory (KV caches on the CPU, recurrent states)."""
        kv = sum(c.nbytes for c in self.kv.values() if not c.on_device)
        return kv + sum(st.nbytes for st in self.recurrent.values() if not st.on_device)

    @property
    def has_attention(self) -> bool:
        return bool(self.kv)

    def export(self) -> MemoryImage:
        """A copy of everything this memory holds (KV entries up to n_tokens + the recurrent state)."""
        n = self.n_tokens
        kv = {il: c.host_copy(n) for il, c in self.kv.items() if not isinstance(c, WindowCache)}
        return MemoryImage(n, kv, self.snapshot(host=True))

    def load(self, image: MemoryImage, n: int, snap: Snapshot | None = None) -> None:
        """Become the memory after the first n tokens of `image`: its KV entries up to n, and the
        recurrent state `snap` (a checkpoint at n), or the image's own when n is its length."""
        if not 0 <= n <= min(image.n_tokens, self.n_ctx):
            raise ValueError(f"cannot load {n} tokens from an image of {image.n_tokens} (context {self.n_ctx})")
        state = snap if snap is not None else image.live
        if not self.truncatable and state.n_tokens != n:
            raise ValueError(f"a state of {state.n_tokens} tokens cannot resume at {n}")
        for il, (k, v) in image.kv.items():
            self.kv[il].write(0, k[:n], v[:n])
        self._put_states(state)
        self.n_tokens = n

    def load_entries(self, image: MemoryImage, start: int, end: int) -> None:
        """Copy the image's attention entries for positions start..end-1 (where a replay of kept
        inputs then brings the rest of the memory); the token count is the caller's."""
        if not 0 <= start <= end <= min(image.n_tokens, self.n_ctx):
            raise ValueError(f"cannot load positions {start}..{end} from an image of {image.n_tokens}")
        for il, (k, v) in image.kv.items():
            self.kv[il].write(start, k[start:end], v[start:end])

    def snapshot(self, host: bool = False) -> Snapshot:
        """The recurrent states (copies where they live: device-to-device for a GPU memory, or
        host copies with `host`) and the ring windows."""
        n = self.n_tokens
        states = {il: st.host_copies() if host else st.copies() for il, st in self.recurrent.items()}
        return Snapshot(n, states, {il: ring.window_copy(n) for il, ring in self.rings.items()})

    def host_snapshot(self, snap: Snapshot) -> Snapshot:
        """`snap` with its states in host memory (for the prefix store); `snap` itself if they are."""
        if not snap.device_nbytes:
            return snap
        states = {il: self.recurrent[il].to_host(c, s) for il, (c, s) in snap.states.items()}
        return Snapshot(snap.n_tokens, states, snap.windows)

    def restore(self, snap: Snapshot) -> None:
        """Put back the recurrent state after `snap.n_tokens` tokens; the KV cache is truncated to it
        (its entries up to that position must still be those of the same tokens: the caller's prefix)."""
        if snap.n_tokens > self.n_tokens:
            raise ValueError(f"snapshot of {snap.n_tokens} tokens is ahead of the memory ({self.n_tokens})")
        self._put_states(snap)
        self.n_tokens = snap.n_tokens

    def _put_states(self, snap: Snapshot) -> None:
        for il, (conv, ssm) in snap.states.items():
            self.recurrent[il].put(conv, ssm)
        rings = self.rings
        for il, (base, k, v) in snap.windows.items():
            rings[il].write(base, k, v)
        if snap.windows:
            self.ring_valid_from = min(base for base, _, _ in snap.windows.values())

    def check_room(self, n_new: int) -> None:
        if self.n_tokens + n_new > self.n_ctx:
            raise ContextFullError(f"{self.n_tokens} + {n_new} tokens exceed the context size {self.n_ctx}")

    def truncate(self, n: int) -> None:
        """Forget every token from position n on (attention caches only need the count). Recurrent
        memory can only be truncated to its full length or to 0 (a reset); ring-buffer window
        layers to `live_floor` at the lowest."""
        if not 0 <= n <= self.n_tokens:
            raise ValueError(f"cannot truncate {self.n_tokens} tokens to {n}")
        if 0 < n < self.live_floor:
            raise ValueError(f"cannot go back from {self.n_tokens} to {n} tokens without a snapshot")
        if n == 0:
            for state in self.recurrent.values():
                state.reset()
            self.ring_valid_from = 0
        self.n_tokens = n

    def clear(self) -> None:
        self.truncate(0)
