"""A slot (one sequence memory and the bookkeeping that moves with it) and the run of the task on it.

Invariant I1 (ARCHITECTURE.md): a slot's token list `tokens` always equals what its memory holds.
Memory only changes in `forward` (which advances every memory of the call, or none when it raises)
and in the `Slot` methods that move bookkeeping with it (truncate, restore, load); `Slot.commit`
follows every successful forward, so both always change together.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from hyserve.engine.cache_plan import CachedView, CheckpointKind, MemoryKind, ResumePlan, SlotCandidate
from hyserve.engine.checkpoints import Checkpoint, CheckpointList
from hyserve.engine.guards import require
from hyserve.engine.input_log import InputLog
from hyserve.engine.prefix_store import StoredSequence
from hyserve.engine.stop import StopCheck
from hyserve.engine.task import Task, Timings, Usage
from hyserve.model.architectures.base import Architecture
from hyserve.model.memory import SequenceMemory

if TYPE_CHECKING:
    from hyserve.engine.constraints import TokenMatcher
    from hyserve.engine.spec_step import SpecRun

__all__ = ["Run", "Slot", "memory_kind"]


def memory_kind(memory: SequenceMemory) -> MemoryKind:
    if memory.recurrent:
        return MemoryKind.HYBRID if memory.has_attention else MemoryKind.RECURRENT
    return MemoryKind.SLIDING_WINDOW if memory.rings else MemoryKind.ATTENTION


class Slot:
    """A sequence memory, the tokens `tokens` (T) whose effect it holds, and its checkpoints."""

    def __init__(self, index: int, memory: SequenceMemory) -> None:
        self.index = index
        self.memory = memory
        self.kind = memory_kind(memory)
        self.tokens: list[int] = []
        self.checkpoints = CheckpointList()
        self.log = InputLog()  # kept per-token inputs (replays reach any position inside a run)
        self.run: Run | None = None
        self.last_used = 0
        self.last_prompt_len = 0  # the last task's prompt length: its generated tail starts there

    def truncate(self, n: int) -> None:
        """Keep the first n tokens (memory and bookkeeping together)."""
        self.memory.truncate(n)
        del self.tokens[n:]

    def restore(self, cp: Checkpoint) -> None:
        """Go back to checkpoint `cp` (a prefix of T: I2)."""
        self.memory.restore(cp.snapshot)
        del self.tokens[cp.position :]

    def load(self, entry: StoredSequence, n: int, cp: Checkpoint | None) -> None:
        """Become the first n tokens of a prefix-store entry (its state at n is its checkpoint `cp`,
        or its live end); the entry's checkpoints and kept inputs up to n come along."""
        self.memory.load(entry.image, n, cp.snapshot if cp is not None else None)
        self.tokens = list(entry.tokens[:n])
        self.checkpoints = CheckpointList(entry.checkpoints.up_to(n))
        self.log = entry.log.up_to(n)

    def load_for_replay(self, entry: StoredSequence, base: int, cp: Checkpoint | None, end: int) -> None:
        """Become the first `base` tokens of a prefix-store entry (its checkpoint `cp` at base, or
        the empty state), with the entry's attention entries, checkpoints and kept inputs up to
        `end`, ready for `replay(..., end)`."""
        if cp is None:
            self.memory.truncate(0)
        else:
            self.memory.load(entry.image, base, cp.snapshot)
        self.memory.load_entries(entry.image, base, end)
        self.tokens = list(entry.tokens[:base])
        self.checkpoints = CheckpointList(entry.checkpoints.up_to(end))
        self.log = entry.log.up_to(end)

    def replay(self, arch: Architecture, tokens: Sequence[int], end: int) -> int:
        """Advance from the current state (a restored checkpoint, or empty) to `end` tokens by
        replaying kept inputs; `tokens` are the slot's tokens before it was brought back (their
        first `end` are this state's). Returns the positions replayed."""
        start = len(self.tokens)
        arch.replay(self.memory, self.log.rows(start, end))
        self.tokens.extend(tokens[start:end])
        self.log.drop_after(end)
        return end - start

    def candidate(self) -> SlotCandidate:
        view = CachedView(self.tokens, self.memory.live_floor, self.checkpoints.views(), self.log.runs())
        return SlotCandidate(self.index, view, self.last_used, self.last_prompt_len, self.kind)

    def commit(self, evaluated: Sequence[int]) -> None:
        """Record tokens that a successful forward call has just added to the memory."""
        self.tokens.extend(int(t) for t in evaluated)
        require(
            len(self.tokens) == self.memory.n_tokens,
            f"slot {self.index}: {len(self.tokens)} tokens but memory holds {self.memory.n_tokens} (I1)",
        )

    def consistent(self) -> bool:
        return len(self.tokens) == self.memory.n_tokens


@dataclass(eq=False)
class Run:
    """A task's progress on its slot."""

    task: Task
    slot: Slot
    plan: ResumePlan
    seq: int  # admission order
    admitted_at: float
    stop: StopCheck  # the stop rules and the text held back for stop strings
    rng: np.random.Generator
    pos: int  # next prompt index to evaluate
    history: list[int]  # prompt + sampled tokens (for penalties)
    generated: list[int] = field(default_factory=list)
    next_token: int | None = None  # sampled, not yet evaluated
    schedule: deque[tuple[int, CheckpointKind]] = field(default_factory=deque)  # checkpoints still to take
    first_logits: np.ndarray | None = None  # a restored checkpoint's logits: sample before any forward
    matcher: TokenMatcher | None = None  # the task's grammar position, when its output is constrained
    spec: SpecRun | None = None  # the task's drafter and pending verification (speculative decoding)
    processed: int = 0  # prompt tokens evaluated for this task
    prompt_done_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.task.prompt

    @property
    def decoding(self) -> bool:
        return self.next_token is not None

    def prompt_step_limit(self) -> int:
        """Prompt tokens the next chunk may take: up to the next checkpoint position (a chunk edge)."""
        end = self.schedule[0][0] if self.schedule else len(self.prompt)
        return end - self.pos

    def usage(self) -> Usage:
        drafted, accepted = (self.spec.drafted, self.spec.accepted) if self.spec is not None else (0, 0)
        return Usage(len(self.prompt), self.plan.resume, self.processed, len(self.generated), drafted, accepted)

    def timings(self, now: float) -> Timings:
        received = self.task.received_at
        prompt_end = self.prompt_done_at if self.prompt_done_at is not None else now
        first, last = self.first_token_at, self.last_token_at
        return Timings(
            queue_ms=(self.admitted_at - received) * 1e3,
            prompt_ms=(prompt_end - self.admitted_at) * 1e3,
            generation_ms=((last - first) * 1e3) if first is not None and last is not None else 0.0,
            time_to_first_token_ms=((first - received) * 1e3) if first is not None else 0.0,
        )
