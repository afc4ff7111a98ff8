"""Speculative decoding in the engine loop: a generating slot with a draft evaluates its sampled
token and the drafted ones as one multi-token row of the batched forward, beside the other slots'
rows; its rows are then sampled as plain decoding would sample them, and the memory keeps only
what was accepted.

- **Draft** (`segment`): each running task has its own drafter (`NgramDrafter` over the prompt and
  the tokens generated so far), or, with a draft model, its slot's draft memory, which keeps what
  it shares with the next request's prompt (`DraftModelDrafter`). A draft is at most
  `SpecConfig.max_draft` tokens (adaptive below it, `DraftLength`), never past the context, the
  tokens still to generate, or the forward's token budget (`--prompt-chunk`). Constrained tasks
  (`Task.grammar`) are not drafted for: they decode one token per forward as before.
- **Verify** (`verified`): the row's logits come back for every position, bit for bit what
  single-token steps would give (batch and chunk invariance). Each is sampled in order by
  `take_token`, the engine's one per-token path (the task's own random stream, one draw per
  emitted token, logprobs, stop rules, Delta events), and verification stops at the first sample
  that differs from the draft, or at a stop rule: that token is the plain decoder's token there.
- **Rollback** (`speculative.keep_accepted`): the memory keeps the sampled token and the accepted
  drafted tokens, and never the last emitted token (as plain decoding, which evaluates a token
  only in the next step): attention memory is truncated, recurrent and ring memory restored from
  the snapshot taken before the forward and advanced by replaying the inputs the forward
  recorded. Only then are the kept tokens committed to the slot and their inputs recorded in the
  slot's kept inputs, so checkpoints, the prefix store and the invariant checks see accepted
  tokens only. A cancel seen after the forward samples nothing and keeps the sampled token alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from hyserve.engine.config import EngineConfig
from hyserve.engine.draft_model import DraftModelDrafter
from hyserve.engine.drafting import Drafter, NgramDrafter
from hyserve.engine.shared import Shared
from hyserve.engine.slot import Run, Slot
from hyserve.engine.speculative import DraftLength, SpecConfig, Verified, keep_accepted
from hyserve.engine.stop import StopDecision
from hyserve.engine.task import Task
from hyserve.engine.token_step import take_token
from hyserve.model.architectures.base import Architecture, Logits, Segment
from hyserve.model.memory import Snapshot

__all__ = ["SpecRun", "SpecStep"]


@dataclass
class Pending:
    """A verifying row in flight: its draft and what a rollback needs."""

    draft: list[int]
    start: int  # the memory's token count before the forward
    snapshot: Snapshot | None  # None: attention-only memory, truncated instead
    inputs: dict[int, tuple[np.ndarray, ...]] | None
    keep_inputs: bool  # the accepted positions' inputs go to the slot's kept inputs


@dataclass(eq=False)
class SpecRun:
    """A task's speculation: its drafter, the next draft's length and what it has drafted."""

    drafter: Drafter
    length: DraftLength
    fed: int = 0  # tokens of the task's history the drafter has seen
    drafted: int = 0
    accepted: int = 0
    pending: Pending | None = field(default=None, repr=False)


class SpecStep:
    """Drafting and verification for the engine loop's generating slots (engine thread only).

    `after_token(run, token, decision)` schedules a sampled token or ends the task, `fail(run,
    exc)` fails a task whose sampling raised: the loop's own handling of a sampled token."""

    def __init__(
        self,
        arch: Architecture,
        engine: EngineConfig,
        shared: Shared,
        is_eog: Callable[[int], bool],
        after_token: Callable[[Run, int, StopDecision], None],
        fail: Callable[[Run, Exception], None],
    ) -> None:
        self.arch = arch
        self.config = engine.spec
        self.n_ctx = engine.n_ctx
        self.token_budget = engine.prompt_chunk  # a forward's tokens: the verifying row stays within it
        self.shared = shared
        self.is_eog = is_eog
        self.after_token = after_token
        self.fail = fail
        self._draft_memories: dict[int, DraftModelDrafter] = {}  # slot -> its draft model memory

    @property
    def enabled(self) -> bool:
        return self.config.method != "off"

    def task_config(self, task: Task) -> SpecConfig | None:
        """How this task speculates (its request's options over the server's), None: not at all."""
        enabled = task.speculative if task.speculative is not None else self.enabled
        if not enabled:
            return None
        base = self.config if self.enabled else SpecConfig()  # the server's, or prompt lookup's defaults
        return replace(base, max_draft=task.spec_max_draft or base.max_draft)

    def drafter(self, slot: Slot, config: SpecConfig) -> Drafter:
        """A new task's drafter: prompt lookup, or the slot's draft model memory on a new sequence
        (it keeps what it shares with the new prompt)."""
        if config.method == "draft" and config.draft is not None:
            drafter = self._draft_memories.get(slot.index)
            if drafter is None:
                drafter = self._draft_memories[slot.index] = DraftModelDrafter(config.draft, self.n_ctx)
            drafter.p_min = config.draft_p_min  # per request: the memory is the slot's, the threshold the task's
            drafter.start()
            return drafter
        return NgramDrafter(config.ngram_min, config.ngram_max)

    def segment(self, slot: Slot, run: Run, keep_inputs: bool) -> Segment | None:
        """The verifying row of a generating slot (its sampled token, then the draft), or None when
        the task decodes plainly this step (no draft, constrained, speculation off)."""
        if run.matcher is not None or run.next_token is None:
            return None
        state = run.spec
        if state is None:
            config = self.task_config(run.task)
            if config is None:
                return None
            state = run.spec = SpecRun(self.drafter(slot, config), DraftLength(config))
        state.pending = None
        state.drafter.extend(run.history[state.fed :])
        state.fed = len(run.history)
        room = min(
            self.n_ctx - slot.memory.n_tokens - 2,
            run.task.stop.max_tokens - run.stop.generated - 1,
            self.token_budget - 1,
        )
        draft = state.drafter.propose(min(state.length.k, room))
        if not draft:
            return None
        memory = slot.memory
        snapshot = None if memory.truncatable else memory.snapshot()
        inputs: dict[int, tuple[np.ndarray, ...]] | None = {} if snapshot is not None or keep_inputs else None
        state.pending = Pending(list(draft), memory.n_tokens, snapshot, inputs, keep_inputs)
        tokens = np.asarray([run.next_token, *draft], dtype=np.int32)
        return Segment(memory, tokens, Logits.ALL, inputs)

    def verifying(self, run: Run) -> bool:
        return run.spec is not None and run.spec.pending is not None

    def verified(self, slot: Slot, run: Run, segment: Segment, rows: np.ndarray, now: float) -> None:
        """After the forward: sample the rows in order while they agree with the draft, roll the
        memory back to what was accepted, commit it, then schedule the last token or end the task."""
        state = run.spec
        if state is None or state.pending is None:
            raise ValueError(f"slot {slot.index}: no verification pending")
        pending, state.pending = state.pending, None
        draft = pending.draft
        taken: list[tuple[int, StopDecision]] = []
        error: Exception | None = None
        if not run.task.cancelled:  # a cancelled task samples nothing more
            try:
                for i, row in enumerate(rows):
                    token, decision = take_token(run, row, now, self.is_eog)
                    taken.append((token, decision))
                    if decision.reason is not None or i >= len(draft) or token != draft[i]:
                        break
            except Exception as exc:  # handled after the memory is consistent again
                error = exc
        # the memory keeps the evaluated tokens that precede the last emitted one (at least the
        # sampled token the row started with: it was emitted in an earlier step)
        n = max(len(taken), 1)
        keep_accepted(self.arch, slot.memory, Verified(rows, pending.start, pending.snapshot, pending.inputs), n)
        if pending.keep_inputs and pending.inputs:
            kept = {il: tuple(a[:n] for a in parts) for il, parts in pending.inputs.items()}
            slot.log.record(pending.start, kept, run.seq)
        slot.commit(segment.tokens[:n].tolist())
        run.next_token = None
        accepted = sum(1 for i, (token, _) in enumerate(taken) if i < len(draft) and token == draft[i])
        state.drafted += len(draft)
        state.accepted += accepted
        state.length.update(len(draft), accepted)
        self.shared.count(spec_drafts=1, spec_draft_tokens=len(draft), spec_accepted_tokens=accepted)
        if error is not None:
            self.fail(run, error)
        elif taken:
            self.after_token(run, *taken[-1])
