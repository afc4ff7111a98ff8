"""One task's position in its grammar: the next-token mask and the tokens consumed so far.

With `background`, the mask for the next token is computed off the engine thread (`start_mask`,
on a small shared pool; llguidance drops the GIL while it walks the vocabulary), right after the
previous token is consumed, so it overlaps the forward that produces the logits it masks; `apply`
waits for it. Without, `apply` computes it. `background_masks` decides which pays: overlapping
only helps when the forward leaves a CPU idle. The mask depends only on the tokens consumed: the
same tokens give the same masks either way.

Not thread-safe: one owner (the engine thread, or the in-process generator) calls every method;
the pool only ever runs the one mask computation this object started.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from hyserve.engine.constraints.compiler import CompiledGrammar

__all__ = ["ConstraintViolation", "TokenMatcher", "background_masks", "mask_logits"]

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _mask_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = max(1, min(4, os.cpu_count() or 1))
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hyserve-mask")
        return _pool


def background_masks(mode: str, device: str, kernel_threads: int, cpus: int) -> bool:
    """Whether masks are computed while the forward runs (`mode` "auto": when the forward leaves
    a CPU idle, i.e. on a GPU or with fewer kernel threads than CPUs). A mask thread that takes a
    core from the CPU kernels delays every matmul, whose threads wait for each other: on a 2-vCPU
    VM, 8 constrained rows of the realistic qwen35 took +36% per decode step with background masks
    against +8% inline in one interleaved run (bench/constraint_bench.py measures both)."""
    if mode != "auto":
        return mode == "background"
    return device != "cpu" or kernel_threads < cpus


class ConstraintViolation(RuntimeError):
    """The grammar cannot go on: a token it does not allow, or a matcher over its limits."""


def mask_logits(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """A copy of `logits` (same dtype, so the allowed values are bit for bit the same) with every
    token not `allowed` at -inf."""
    out = np.full(logits.shape, -np.inf, dtype=logits.dtype)
    np.copyto(out, logits, where=allowed)
    return out


class TokenMatcher:
    """A task's llguidance matcher and its next-token mask."""

    def __init__(self, grammar: CompiledGrammar, background: bool = True) -> None:
        self._matcher = grammar.new_matcher()
        self.background = background
        self.n_vocab = grammar.n_vocab
        self._bits = np.zeros((self.n_vocab + 31) // 32, dtype=np.int32)
        self._pending: Future[np.ndarray] | None = None
        self._allowed: np.ndarray | None = None
        self.consumed = 0

    # --- the mask ---------------------------------------------------------------------------

    def _compute(self) -> np.ndarray:
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        bits = np.unpackbits(self._bits.view(np.uint8), count=self.n_vocab, bitorder="little")
        return bits.view(np.bool_)

    def start_mask(self) -> None:
        """Begin computing the mask for the next token in the background (idempotent; nothing
        without `background`: `allowed` computes it)."""
        if self.background and self._pending is None and self._allowed is None:
            self._pending = _mask_pool().submit(self._compute)

    def allowed(self) -> np.ndarray:
        """The tokens the grammar allows next (bool per token). Raises ConstraintViolation when
        the matcher is in error or allows nothing."""
        if self._allowed is None:
            if self._pending is None:
                self._allowed = self._compute()
            else:
                pending, self._pending = self._pending, None
                self._allowed = pending.result()
        self._check()
        if not self._allowed.any():
            raise ConstraintViolation("the grammar allows no token here")
        return self._allowed

    def allowed_ids(self, n_logits: int) -> np.ndarray:
        """The ids the grammar allows next, ascending, for a row of `n_logits` logits."""
        if n_logits != self.n_vocab:
            raise ConstraintViolation(f"{n_logits} logits for a grammar over {self.n_vocab} tokens")
        return np.flatnonzero(self.allowed())

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """A copy of `logits` with the tokens the grammar does not allow at -inf (the input is
        untouched: stored prompt-end logits stay unmasked)."""
        if len(logits) != self.n_vocab:
            raise ConstraintViolation(f"{len(logits)} logits for a grammar over {self.n_vocab} tokens")
        return mask_logits(logits, self.allowed())

    # --- advancing --------------------------------------------------------------------------

    def _settle(self) -> None:
        """Wait for a mask still being computed: the matcher is not to change under it."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()
        self._allowed = None

    def consume(self, token: int) -> None:
        """Advance past a sampled token. Raises ConstraintViolation if the grammar refuses it."""
        self._settle()
        if not self._matcher.consume_token(token):
            raise ConstraintViolation(self._matcher.get_error() or f"token {token} does not match the grammar")
        self.consumed += 1

    def rollback(self, n: int) -> None:
        """Undo the last `n` consumed tokens (drafted tokens a verification rejected)."""
        if not 0 <= n <= self.consumed:
            raise ValueError(f"cannot roll back {n} of {self.consumed} consumed tokens")
        self._settle()
        if n and not self._matcher.rollback(n):
            raise ConstraintViolation(self._matcher.get_error() or f"rolling back {n} tokens failed")
        self.consumed -= n

    # --- state ------------------------------------------------------------------------------

    @property
    def is_stopped(self) -> bool:
        """The grammar is complete (or in error): only end-of-generation tokens can follow."""
        return bool(self._matcher.is_stopped())

    @property
    def is_accepting(self) -> bool:
        return bool(self._matcher.is_accepting())

    @property
    def error(self) -> str | None:
        return (self._matcher.get_error() or "matcher error") if self._matcher.is_error() else None

    def _check(self) -> None:
        error = self.error
        if error is not None:
            raise ConstraintViolation(error)
