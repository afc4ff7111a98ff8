"""Checkpoints: saved copies of a sequence's non-truncatable memory at exact token positions.

A checkpoint is immutable once made (restoring copies out of it), so a slot and a prefix-store
entry may share one. `CheckpointList` keeps one slot's (or entry's) checkpoints by position.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from hyserve.engine.cache_plan import CheckpointKind, CheckpointView
from hyserve.model.memory import Snapshot

__all__ = ["Checkpoint", "CheckpointList"]


@dataclass(frozen=True, eq=False)
class Checkpoint:
    position: int
    kind: CheckpointKind
    snapshot: Snapshot  # the memory's recurrent state after exactly `position` tokens
    logits: np.ndarray | None  # the logits after token position-1 (prompt ends), else None
    turn: int  # admission number of the task that made it (for eviction: newer turns stay)

    @property
    def nbytes(self) -> int:
        return self.snapshot.nbytes + (self.logits.nbytes if self.logits is not None else 0)

    def with_snapshot(self, snapshot: Snapshot) -> Checkpoint:
        """This checkpoint with another copy of the same state (itself when it is the same)."""
        return self if snapshot is self.snapshot else replace(self, snapshot=snapshot)

    def view(self) -> CheckpointView:
        return CheckpointView(self.position, self.logits is not None)


class CheckpointList:
    """At most one checkpoint per position, ascending."""

    def __init__(self, items: list[Checkpoint] | None = None) -> None:
        self._items: list[Checkpoint] = sorted(items or [], key=lambda c: c.position)

    def add(self, cp: Checkpoint) -> None:
        """Insert (replacing one at the same position: the newer describes the same state)."""
        self.remove(cp.position)
        bisect.insort(self._items, cp, key=lambda c: c.position)

    def get(self, position: int) -> Checkpoint | None:
        i = bisect.bisect_left(self._items, position, key=lambda c: c.position)
        if i < len(self._items) and self._items[i].position == position:
            return self._items[i]
        return None

    def remove(self, position: int) -> Checkpoint | None:
        cp = self.get(position)
        if cp is not None:
            self._items.remove(cp)
        return cp

    def drop_after(self, position: int) -> list[Checkpoint]:
        """Remove and return every checkpoint past `position`."""
        i = bisect.bisect_right(self._items, position, key=lambda c: c.position)
        dropped, self._items = self._items[i:], self._items[:i]
        return dropped

    def up_to(self, position: int) -> list[Checkpoint]:
        return [c for c in self._items if c.position <= position]

    def views(self) -> tuple[CheckpointView, ...]:
        return tuple(c.view() for c in self._items)

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self._items)

    @property
    def device_nbytes(self) -> int:
        """The part of `nbytes` on a GPU device."""
        return sum(c.snapshot.device_nbytes for c in self._items)

    def clear(self) -> list[Checkpoint]:
        dropped, self._items = self._items, []
        return dropped

    def __iter__(self) -> Iterator[Checkpoint]:
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)
