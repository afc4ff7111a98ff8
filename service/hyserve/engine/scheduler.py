"""Scheduling policy as plain functions of state: no model, no threads, no clocks.

- `BoundedFifo`: the waiting queue (admission in arrival order; full -> the API answers
  RESOURCE_EXHAUSTED).
- (which slot a queued prompt goes to and where it resumes: the prompt cache's decisions, in
  cache_plan/)
- `compose_batch`: what one forward call evaluates: one token for every generating slot plus
  prompt chunks, oldest admission first, within a token budget.

The engine (engine.py) owns the state and applies these decisions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "BatchItem",
    "BoundedFifo",
    "QueueFullError",
    "SlotWork",
    "compose_batch",
    "queued_tokens_error",
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


# --- batch composition ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotWork:
    """A busy slot as the batch planner sees it."""

    index: int
    decoding: bool  # True: evaluate its last sampled token; False: it is processing its prompt
    prompt_remaining: int = 0  # prompt tokens the next chunk may take (to the prompt end or next checkpoint)
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


# --- queued work ---------------------------------------------------------------------------------


def queued_tokens_error(queued_tokens: int, prompt_tokens: int, limit: int) -> str | None:
    """Why a prompt may not join the queue: the queued prompt tokens would pass `limit` (0: no limit).

    A prompt is always accepted into an empty queue, so the limit never refuses a request outright."""
    if limit <= 0 or queued_tokens == 0 or queued_tokens + prompt_tokens <= limit:
        return None
    return (
        f"the queue already holds {queued_tokens} prompt tokens; {prompt_tokens} more would pass the limit "
        f"of {limit} queued prompt tokens"
    )
