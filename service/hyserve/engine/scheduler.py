"""Scheduling policy as plain functions of state: no model, no threads, no clocks.

- `BoundedFifo`: the waiting queue (admission in arrival order; full -> the API answers
  RESOURCE_EXHAUSTED).
- `choose_slot` / `plan_admissions`: which free slot a queued prompt goes to (longest common
  prefix with the slot's cached tokens first).
- `plan_reuse`: where prompt processing resumes on that slot (attention-only memory for now: the
  KV cache can be truncated anywhere, so the resume point is the longest common prefix, keeping at
  least one prompt token to evaluate because the logits after the prompt are not stored).
- `compose_batch`: what one forward call evaluates: one token for every generating slot plus
  prompt chunks, oldest admission first, within a token budget.

The engine (engine.py) owns the state and applies these decisions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from hyserve.engine.task import ReuseSource

__all__ = [
    "BatchItem",
    "BoundedFifo",
    "QueueFullError",
    "ReusePlan",
    "SlotView",
    "SlotWork",
    "choose_slot",
    "common_prefix_len",
    "compose_batch",
    "plan_admissions",
    "plan_reuse",
]

T = TypeVar("T")


# --- the waiting queue ---------------------------------------------------------------------------


class QueueFullError(RuntimeError):
    """The waiting queue holds its maximum number of tasks."""


class BoundedFifo(Generic[T]):
    """First in, first out, at most `capacity` items; items can also leave from the middle (cancel)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._items: deque[T] = deque()

    def push(self, item: T) -> None:
        if len(self._items) >= self.capacity:
            raise QueueFullError(f"the queue is full ({self.capacity} waiting tasks)")
        self._items.append(item)

    def pop(self) -> T:
        return self._items.popleft()

    def remove(self, item: T) -> bool:
        """Remove `item` (by identity); False when it is not queued."""
        for i, queued in enumerate(self._items):
            if queued is item:
                del self._items[i]
                return True
        return False

    def drain(self) -> list[T]:
        items = list(self._items)
        self._items.clear()
        return items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items))

    def __getitem__(self, i: int) -> T:
        return self._items[i]


# --- slot choice ---------------------------------------------------------------------------------


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if n < 64:
        for i in range(n):
            if a[i] != b[i]:
                return i
        return n
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if len(diff) else n


@dataclass(frozen=True)
class SlotView:
    """What slot choice needs to know about a free slot."""

    index: int
    tokens: Sequence[int]  # T: the tokens whose state the slot's memory holds
    last_used: int  # larger = used more recently


def choose_slot(free: Sequence[SlotView], prompt: Sequence[int]) -> tuple[int, int]:
    """(slot index, common prefix length) of the best free slot for `prompt`.

    Longest common prefix wins; among equals an empty slot (nothing to overwrite), then the least
    recently used one (its conversation is the least likely to come back), then the lowest index.
    """
    if not free:
        raise ValueError("no free slot")
    best: tuple[int, int, int, int] | None = None
    best_lcp = 0
    for view in free:
        lcp = common_prefix_len(view.tokens, prompt)
        key = (lcp, 1 if not view.tokens else 0, -view.last_used, -view.index)
        if best is None or key > best:
            best, best_lcp = key, lcp
    assert best is not None
    return -best[3], best_lcp


def plan_admissions(queued: Sequence[Sequence[int]], free: Sequence[SlotView]) -> list[tuple[int, int, int]]:
    """Admit queued prompts in FIFO order while free slots remain.

    Returns (queue position, slot index, common prefix length) for each admitted prompt, in order.
    """
    remaining = list(free)
    plan: list[tuple[int, int, int]] = []
    for pos, prompt in enumerate(queued):
        if not remaining:
            break
        index, lcp = choose_slot(remaining, prompt)
        plan.append((pos, index, lcp))
        remaining = [v for v in remaining if v.index != index]
    return plan


# --- resume point --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReusePlan:
    matched: int  # longest common prefix of the slot's tokens and the prompt
    reuse: int  # resume position r: prompt[:r] is kept, prompt[r:] is evaluated
    source: ReuseSource
    miss_reason: str | None = None  # why nothing was reused (reuse == 0), for the counters


def plan_reuse(
    cached: Sequence[int], prompt: Sequence[int], cache_prompt: bool = True, truncatable: bool = True
) -> ReusePlan:
    """Resume point for `prompt` on a slot holding `cached`.

    r = min(L, len(prompt) - 1): at least one prompt token is evaluated, because the logits after
    the prompt are needed to sample the first token and are not stored. Memory with recurrent state
    (`truncatable=False`) can only resume at its live end (a pure extension) or start over; resuming
    in between needs a checkpoint (the prompt-cache work).
    """
    if not prompt:
        raise ValueError("empty prompt")
    matched = common_prefix_len(cached, prompt)
    if not cache_prompt:
        return ReusePlan(matched, 0, ReuseSource.NONE, "cache_prompt_disabled")
    reuse = min(matched, len(prompt) - 1)
    if not truncatable and reuse < len(cached):
        reason = "cold_slot" if not cached else "recurrent_state_not_at_resume_point"
        return ReusePlan(matched, 0, ReuseSource.NONE, reason)
    if reuse > 0:
        return ReusePlan(matched, reuse, ReuseSource.SLOT_LIVE)
    if not cached:
        reason = "cold_slot"
    elif matched == 0:
        reason = "no_common_prefix"
    else:
        reason = "single_token_prompt"
    return ReusePlan(matched, 0, ReuseSource.NONE, reason)


# --- batch composition ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotWork:
    """A busy slot as the batch planner sees it."""

    index: int
    decoding: bool  # True: evaluate its last sampled token; False: it is processing its prompt
    prompt_remaining: int = 0  # prompt tokens still to evaluate (when not decoding)
    admitted: int = 0  # admission order (smaller = earlier)


@dataclass(frozen=True)
class BatchItem:
    index: int
    n_tokens: int
    decode: bool


def compose_batch(work: Sequence[SlotWork], token_budget: int) -> list[BatchItem]:
    """One forward call: every generating slot gets its one token (decode never waits for prompts),
    prompt-processing slots share the rest of the budget, earliest admitted first.

    Prompt processing always gets at least `max(1, token_budget // 8)` tokens so that many
    generating slots cannot starve it. Items are returned in slot order.
    """
    if token_budget < 1:
        raise ValueError("token_budget must be >= 1")
    items: list[BatchItem] = [BatchItem(w.index, 1, True) for w in work if w.decoding]
    budget = max(token_budget - len(items), max(1, token_budget // 8))
    for w in sorted((w for w in work if not w.decoding and w.prompt_remaining > 0), key=lambda w: w.admitted):
        if budget <= 0:
            break
        n = min(w.prompt_remaining, budget)
        items.append(BatchItem(w.index, n, False))
        budget -= n
    return sorted(items, key=lambda item: item.index)
