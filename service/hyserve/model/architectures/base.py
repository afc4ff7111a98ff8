"""The interface every architecture implements, and the unit of a batched forward call."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

import hyserve_kernels as hk
import numpy as np
from hyserve_kernels import CancelFlag

from hyserve.model.backend.base import Backend
from hyserve.model.backend.cpu import CPU
from hyserve.model.memory import SequenceMemory

if TYPE_CHECKING:
    from hyserve.model.architectures.step_plans import StepPlans


class ForwardCancelled(Exception):
    """The forward call stopped early because its cancel flag was set. No memory advanced."""


class Logits(Enum):
    NONE = "none"
    LAST = "last"
    ALL = "all"
    # the last position's greedy token only (the first maximum of its logits, as numpy's argmax):
    # when every row of a call asks for it, the logits never leave the device
    ARGMAX = "argmax"


@dataclass
class Segment:
    """Tokens to append to one sequence's memory in a forward call, at positions n_tokens, n_tokens+1, ..."""

    memory: SequenceMemory
    tokens: np.ndarray  # int32
    logits: Logits = Logits.LAST
    # When a dict, the forward puts in it, per non-truncatable layer (recurrent, ring window), what
    # that layer's state update consumed for these tokens, one row per token (see `replay`).
    inputs: dict[int, tuple[np.ndarray, ...]] | None = None


class Architecture(ABC):
    name: str
    n_vocab: int
    n_ctx_train: int
    # where the forward pass runs; architectures without a GPU path keep the CPU
    ops: Backend = CPU
    has_gpu_path: ClassVar[bool] = False

    @abstractmethod
    def new_memory(self, n_ctx: int) -> SequenceMemory: ...

    def sliding_windows(self) -> dict[int, int]:
        """Sliding-window attention layers (layer -> window), which memory may keep as rings."""
        return {}

    def forward(self, segments: Sequence[Segment], cancel: CancelFlag | None = None) -> list[np.ndarray | None]:
        """Evaluate every segment in one batch. Returns per segment the logits requested
        (LAST: shape [n_vocab], ALL: [len(tokens), n_vocab], NONE: None) and advances each memory.
        A row's result is independent of the other rows in the batch (batch invariance).
        With `cancel` (a task's flag), it raises `ForwardCancelled` at the next layer boundary once
        the flag is set, advancing no memory. On a GPU, decode steps are captured once and
        replayed (`step_plans.py`): the same bits, recorded in one call."""
        plans = self.step_plans
        if plans is not None:
            replayed = plans.replay(segments)
            if replayed is not None:
                return replayed
        capture = plans.capture(segments) if plans is not None else None
        try:
            out = self._forward(segments, cancel)
        except hk.Cancelled:  # a kernel saw the flag mid-call
            self.ops.abort()
            raise ForwardCancelled from None
        except BaseException:
            self.ops.abort()  # nothing of a failed call may run later
            raise
        self.ops.flush()
        if plans is not None and capture is not None:
            plans.keep(capture, segments)
        return out

    @functools.cached_property
    def step_plans(self) -> StepPlans | None:
        """The captured decode steps where the backend can replay them (a GPU)."""
        from hyserve.model.architectures.step_plans import StepPlans  # it builds on this module
        from hyserve.model.backend.gpu import GpuBackend

        return StepPlans(self.ops) if isinstance(self.ops, GpuBackend) else None

    @abstractmethod
    def _forward(self, segments: Sequence[Segment], cancel: CancelFlag | None) -> list[np.ndarray | None]:
        """The architecture's forward pass (`forward` adds the cancel translation)."""

    def replay(self, memory: SequenceMemory, parts: Sequence[Mapping[int, tuple[np.ndarray, ...]]]) -> None:
        """Advance `memory` over tokens whose layer inputs earlier forward calls recorded
        (`Segment.inputs`, one dict per call, in token order): the recurrent layers' own kernels
        and the ring layers' writes alone, no matmul. Chunking does not change those kernels'
        results, so the memory ends bit for bit as the forward calls left it. Attention caches are
        not touched: the caller keeps their entries (a prefix of the same tokens)."""
        counts = [len(next(iter(p.values()))[0]) for p in parts if p]
        n = sum(counts)
        if n == 0:
            return
        memory.check_room(n)
        for il in parts[0]:
            if il in memory.recurrent:
                width = len(parts[0][il])
                rows = tuple(
                    self.ops.vector(np.ascontiguousarray(np.concatenate([p[il][j] for p in parts])))
                    for j in range(width)
                )
                st = memory.recurrent[il]
                new_conv, new_ssm = self.ops.empty(tuple(st.conv.shape)), self.ops.empty(tuple(st.ssm.shape))
                self._replay_recurrent(il, rows, (st.conv, st.ssm, new_conv, new_ssm))
                st.adopt(new_conv, new_ssm)
            else:  # a ring window layer: its keys and values, written where the forward wrote them
                at = memory.n_tokens
                for p, count in zip(parts, counts):
                    k, v = p[il]
                    memory.kv[il].write(at, k, v)
                    at += count
        self.ops.flush()
        memory.n_tokens += n
        memory.note_written(memory.n_tokens)

    def _replay_recurrent(self, il: int, inputs: tuple[np.ndarray, ...], state: tuple[np.ndarray, ...]) -> None:
        """Run recurrent layer `il`'s state update on recorded inputs; state = (conv, ssm, new_conv, new_ssm)."""
        raise NotImplementedError(f"{type(self).__name__} has no recurrent layers")


def check_cancel(cancel: CancelFlag | None) -> None:
    if cancel is not None and cancel.is_set():
        raise ForwardCancelled


def segment_rows(segments: Sequence[Segment]) -> tuple[np.ndarray, np.ndarray, list[slice]]:
    """Concatenated token ids, their positions, and each segment's row range."""
    spans, start = [], 0
    for seg in segments:
        seg.memory.check_room(len(seg.tokens))
        spans.append(slice(start, start + len(seg.tokens)))
        start += len(seg.tokens)
    tokens = np.concatenate([np.asarray(s.tokens, dtype=np.int32) for s in segments])
    positions = np.concatenate(
        [np.arange(s.memory.n_tokens, s.memory.n_tokens + len(s.tokens), dtype=np.int32) for s in segments]
    )
    return tokens, positions, spans


def logit_rows(segments: Sequence[Segment], spans: list[slice]) -> np.ndarray:
    """Row indices (into the concatenated batch) whose logits were asked for."""
    rows: list[int] = []
    for seg, span in zip(segments, spans):
        if seg.logits is Logits.ALL:
            rows.extend(range(span.start, span.stop))
        elif seg.logits in (Logits.LAST, Logits.ARGMAX) and span.stop > span.start:
            rows.append(span.stop - 1)
    return np.asarray(rows, dtype=np.int64)


def greedy_only(segments: Sequence[Segment]) -> bool:
    """Every segment that asks for logits asks for its greedy token alone (and one does)."""
    asking = [s.logits for s in segments if s.logits is not Logits.NONE and len(s.tokens)]
    return bool(asking) and all(mode is Logits.ARGMAX for mode in asking)


def split_logits(segments: Sequence[Segment], spans: list[slice], logits: np.ndarray) -> list[np.ndarray | None]:
    """Each segment's part of the logit rows: all its rows, its last, or (ARGMAX) its greedy token
    as a one-element int32 array; `logits` holds the rows, or one token id per row when every row
    asked for its greedy token (the device's argmax)."""
    out: list[np.ndarray | None] = []
    at = 0
    for seg, span in zip(segments, spans):
        n = span.stop - span.start
        if seg.logits is Logits.ALL:
            out.append(logits[at : at + n])
            at += n
        elif seg.logits is Logits.LAST and n:
            out.append(logits[at])
            at += 1
        elif seg.logits is Logits.ARGMAX and n:
            row = logits[at]
            out.append(np.array([int(row) if row.ndim == 0 else int(np.argmax(row))], dtype=np.int32))
            at += 1
        else:
            out.append(None)
    return out
