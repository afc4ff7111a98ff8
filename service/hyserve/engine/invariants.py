"""A test hook that checks the prompt cache's invariants I1-I3 (ARCHITECTURE.md) after engine steps.

Off by default (`hyserve serve --check-invariants`): it doubles the model work. For every slot it
keeps a *reference memory* that evaluates the slot's tokens T itself, token rows in its own chunks
(batch invariance makes that bit-identical to however the engine got there), and compares:

- I1: the slot's memory holds exactly `len(T)` tokens and its KV entries and recurrent states equal
  the reference's bit for bit. The reference follows T incrementally (new tokens only) and is
  rebuilt from scratch when T changed other than by growing, so a check costs what the engine's
  own step cost.
- I3: a checkpoint seen for the first time must describe a fully computed state: its snapshot
  equals the reference state at its position (compared when it is made, at the slot's end; a
  checkpoint first seen elsewhere is compared with a from-scratch evaluation).
- I2: every checkpoint of a slot or a prefix-store entry describes a prefix of that sequence's
  tokens: its position is within them and the tokens before it are the ones it was made for
  (a fingerprint taken when it was first verified).

Memories that live on a GPU device get the structural checks only (no host copies per step).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hyserve.engine.checkpoints import Checkpoint
from hyserve.engine.guards import require
from hyserve.model.architectures.base import Architecture, Logits, Segment
from hyserve.model.memory import KVCache, SequenceMemory, Snapshot, WindowCache

__all__ = ["InvariantChecker", "InvariantReport"]

_CHUNK = 64  # reference evaluation chunk (any size gives the same bits)


@dataclass
class InvariantReport:
    checks: int = 0  # slot or entry checks run
    violations: int = 0
    messages: list[str] = field(default_factory=list)  # the first few, for the log


def _fingerprint(tokens: Sequence[int], n: int) -> int:
    return hash(tuple(tokens[:n]))


def snapshot_mismatch(snap: Snapshot, reference: SequenceMemory) -> str | None:
    """Where a checkpoint's snapshot differs from `reference` (a full-cache memory holding exactly
    the snapshot's tokens), or None."""
    if snap.n_tokens != reference.n_tokens:
        return f"snapshot of {snap.n_tokens} tokens, reference of {reference.n_tokens}"
    if snap.states.keys() != reference.recurrent.keys():
        return "recurrent layers differ"
    for il, (conv, ssm) in snap.states.items():
        ref = reference.recurrent[il]
        if not (_bits_equal(conv, ref.conv) and _bits_equal(ssm, ref.ssm)):
            return f"recurrent layer {il}: state differs from a fresh evaluation"
    n = snap.n_tokens
    for il, (base, k, v) in snap.windows.items():
        cache = reference.kv[il]
        require(isinstance(cache, KVCache), f"window layer {il}: the reference is not a full cache")
        if not (_bits_equal(k, cache.k[base:n]) and _bits_equal(v, cache.v[base:n])):
            return f"window layer {il}: keys/values differ from a fresh evaluation"
    return None


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def memory_mismatch(memory: SequenceMemory, reference: SequenceMemory) -> str | None:
    """Where `memory` differs from `reference` (a full-cache memory of the same tokens), or None."""
    n = memory.n_tokens
    if reference.n_tokens != n:
        return f"reference holds {reference.n_tokens} tokens, memory {n}"
    for il, cache in memory.kv.items():
        ref = reference.kv[il]
        require(isinstance(ref, KVCache), f"layer {il}: the reference is not a full cache")
        if isinstance(cache, WindowCache):
            start = max(memory.ring_valid_from, n - cache.capacity, 0)
            k, v = cache.read(start, n)
        else:
            start, k, v = 0, cache.k[:n], cache.v[:n]
        if not (_bits_equal(k, ref.k[start:n]) and _bits_equal(v, ref.v[start:n])):
            return f"attention layer {il}: KV entries differ from a fresh evaluation"
    for il, state in memory.recurrent.items():
        ref_state = reference.recurrent[il]
        if not (_bits_equal(state.conv, ref_state.conv) and _bits_equal(state.ssm, ref_state.ssm)):
            return f"recurrent layer {il}: state differs from a fresh evaluation"
    return None


class _Reference:
    """A memory that holds exactly `tokens`, evaluated from scratch by the checker."""

    def __init__(self, arch: Architecture, n_ctx: int) -> None:
        self.arch = arch
        self.memory = arch.new_memory(n_ctx)  # full caches, never rings
        self.tokens: list[int] = []

    def follow(self, tokens: Sequence[int]) -> None:
        """Become the memory of `tokens`, evaluating as few tokens as possible."""
        keep = 0
        limit = min(len(self.tokens), len(tokens))
        while keep < limit and self.tokens[keep] == tokens[keep]:
            keep += 1
        if keep < len(self.tokens):
            if not self.memory.truncatable:
                keep = 0
            self.memory.truncate(keep)
            del self.tokens[keep:]
        evaluate(self.arch, self.memory, tokens[keep:])
        self.tokens.extend(int(t) for t in tokens[keep:])


def evaluate(arch: Architecture, memory: SequenceMemory, tokens: Sequence[int]) -> None:
    for start in range(0, len(tokens), _CHUNK):
        part = np.asarray(tokens[start : start + _CHUNK], dtype=np.int32)
        arch.forward([Segment(memory, part, Logits.NONE)])


def _on_host(memory: SequenceMemory) -> bool:
    return not any(cache.on_device for cache in memory.kv.values())


class InvariantChecker:
    """Runs on the engine thread between iterations; never changes what it inspects."""

    MAX_MESSAGES = 20

    def __init__(self, arch: Architecture, n_ctx: int) -> None:
        self.arch = arch
        self.n_ctx = n_ctx
        self._refs: dict[int, _Reference] = {}
        # checkpoint -> fingerprint of the tokens it was verified for (I2); weak: evicted ones go
        self._verified: weakref.WeakKeyDictionary[Checkpoint, int] = weakref.WeakKeyDictionary()
        self.report = InvariantReport()

    def _violation(self, message: str) -> None:
        self.report.violations += 1
        if len(self.report.messages) < self.MAX_MESSAGES:
            self.report.messages.append(message)

    def check_slot(
        self, index: int, tokens: Sequence[int], memory: SequenceMemory, checkpoints: Iterable[Checkpoint]
    ) -> int:
        """I1, then I2/I3 for each checkpoint of one slot. Returns the violations found."""
        before = self.report.violations
        self.report.checks += 1
        where = f"slot {index}"
        if len(tokens) != memory.n_tokens:
            self._violation(f"I1 {where}: {len(tokens)} tokens but memory holds {memory.n_tokens}")
            return self.report.violations - before
        deep = _on_host(memory)
        ref = None
        if deep:
            ref = self._refs.get(index)
            if ref is None:
                ref = self._refs[index] = _Reference(self.arch, self.n_ctx)
            ref.follow(tokens)
            problem = memory_mismatch(memory, ref.memory)
            if problem is not None:
                self._violation(f"I1 {where} at {len(tokens)} tokens: {problem}")
        for cp in checkpoints:
            self._check_checkpoint(cp, tokens, where, ref if deep else None)
        return self.report.violations - before

    def check_entry(self, key: int, tokens: Sequence[int], checkpoints: Iterable[Checkpoint]) -> int:
        """I2 for a prefix-store entry's checkpoints."""
        before = self.report.violations
        self.report.checks += 1
        for cp in checkpoints:
            self._check_checkpoint(cp, tokens, f"store entry {key}", None)
        return self.report.violations - before

    def _check_checkpoint(self, cp: Checkpoint, tokens: Sequence[int], where: str, ref: _Reference | None) -> None:
        p = cp.position
        if p > len(tokens) or cp.snapshot.n_tokens != p:
            self._violation(f"I2 {where}: checkpoint at {p} (state of {cp.snapshot.n_tokens}) past {len(tokens)}")
            return
        known = self._verified.get(cp)
        if known is not None:
            if known != _fingerprint(tokens, p):
                self._violation(f"I2 {where}: checkpoint at {p} describes other tokens than the first {p}")
            return
        if ref is not None:  # first sight on a host slot: I3, its state is complete and exact
            problem = snapshot_mismatch(cp.snapshot, self._memory_at(ref, tokens, p))
            if problem is not None:
                self._violation(f"I3 {where}: checkpoint at {p}: {problem}")
                return
        self._verified[cp] = _fingerprint(tokens, p)

    def _memory_at(self, ref: _Reference, tokens: Sequence[int], p: int) -> SequenceMemory:
        """A reference memory of the first p tokens (the slot's own reference when p is its end)."""
        if p == ref.memory.n_tokens:
            return ref.memory
        scratch = _Reference(self.arch, self.n_ctx)
        scratch.follow(tokens[:p])
        return scratch.memory
