"""Kept inputs: what a sequence's non-truncatable layers consumed per token, for replays.

Each forward call can record, per recurrent layer, the rows its conv/scan kernels consumed (and per
ring window layer, the keys/values written); `Architecture.replay` runs those rows through the same
kernels to reach the state at any position inside a kept run from a checkpoint before it
(cache_plan decides where). An `InputLog` keeps one sequence's rows in blocks of consecutive
positions; blocks are immutable once made (trimming or merging makes new ones), so a slot and a
prefix-store entry may share them. Every block describes positions of the sequence's own tokens
(like a checkpoint, I2): whoever shortens the tokens drops the blocks past the new end.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from hyserve.engine.cache_plan import LogBlockView

__all__ = ["InputLog", "LayerRows", "LogBlock"]

LayerRows = Mapping[int, tuple[np.ndarray, ...]]  # layer -> arrays with one row per token
BLOCK_TOKENS = 64  # decode steps record one token each: merge them into blocks up to this size


def _count(part: LayerRows) -> int:
    return len(next(iter(part.values()))[0]) if part else 0


def _slice(part: LayerRows, lo: int, hi: int) -> dict[int, tuple[np.ndarray, ...]]:
    return {il: tuple(a[lo:hi].copy() for a in arrays) for il, arrays in part.items()}


@dataclass(frozen=True, eq=False)
class LogBlock:
    start: int
    parts: tuple[LayerRows, ...]  # one per forward call, in order
    turn: int  # admission number of the task that recorded it
    n: int = field(init=False)
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", sum(_count(p) for p in self.parts))
        nbytes = sum(a.nbytes for p in self.parts for arrays in p.values() for a in arrays)
        object.__setattr__(self, "nbytes", nbytes)

    @property
    def end(self) -> int:
        return self.start + self.n

    def head(self, end: int) -> LogBlock:
        """This block's positions before `end` (a copy of the kept rows)."""
        parts, at = [], self.start
        for p in self.parts:
            c = _count(p)
            if at + c <= end:
                parts.append(p)
            elif at < end:
                parts.append(_slice(p, 0, end - at))
            at += c
        return LogBlock(self.start, tuple(parts), self.turn)

    def rows(self, lo: int, hi: int) -> list[LayerRows]:
        """The parts for positions [lo, hi) inside this block (views)."""
        out, at = [], self.start
        for p in self.parts:
            c = _count(p)
            a, b = max(lo, at), min(hi, at + c)
            if (a, b) == (at, at + c):
                out.append(p)
            elif a < b:
                out.append({il: tuple(x[a - at : b - at] for x in arrays) for il, arrays in p.items()})
            at += c
        return out


class InputLog:
    """One sequence's kept inputs: non-overlapping blocks, ascending."""

    def __init__(self, blocks: list[LogBlock] | None = None) -> None:
        self._blocks: list[LogBlock] = sorted(blocks or [], key=lambda b: b.start)

    def record(self, start: int, part: LayerRows, turn: int) -> None:
        """Add the rows a forward recorded for positions start, start+1, ... (merged into the last
        block when they continue it, for the same task, and the block stays small)."""
        if not part or _count(part) == 0:
            return
        self.drop_after(start)
        last = self._blocks[-1] if self._blocks else None
        if last is not None and last.end == start and last.turn == turn and last.n + _count(part) <= BLOCK_TOKENS:
            self._blocks[-1] = LogBlock(last.start, (*last.parts, part), turn)
        else:
            self._blocks.append(LogBlock(start, (part,), turn))

    def drop_after(self, position: int) -> int:
        """Forget every position from `position` on; returns the blocks removed or trimmed."""
        i = bisect.bisect_left(self._blocks, position, key=lambda b: b.start)
        dropped = len(self._blocks) - i
        del self._blocks[i:]
        if self._blocks and self._blocks[-1].end > position:
            self._blocks[-1] = self._blocks[-1].head(position)
            dropped += 1
        return dropped

    def up_to(self, position: int) -> InputLog:
        """A log of this one's positions before `position` (shares the whole blocks)."""
        out = InputLog(list(self._blocks))
        out.drop_after(position)
        return out

    def remove(self, block: LogBlock) -> None:
        self._blocks = [b for b in self._blocks if b is not block]

    def clear(self) -> int:
        n, self._blocks = len(self._blocks), []
        return n

    def runs(self) -> tuple[tuple[int, int], ...]:
        """Maximal runs [start, end) of kept positions."""
        out: list[tuple[int, int]] = []
        for b in self._blocks:
            if out and out[-1][1] == b.start:
                out[-1] = (out[-1][0], b.end)
            else:
                out.append((b.start, b.end))
        return tuple(out)

    def rows(self, lo: int, hi: int) -> list[LayerRows]:
        """The recorded parts for positions [lo, hi), in order; raises if any position is missing."""
        out: list[LayerRows] = []
        at = lo
        for b in self._blocks:
            if b.end <= at or b.start >= hi:
                continue
            if b.start > at:
                break
            out += b.rows(at, hi)
            at = min(hi, b.end)
        if at < hi:
            raise ValueError(f"positions {at}..{hi} of the replay are not kept")
        return out

    def views(self, owner: int) -> list[LogBlockView]:
        return [LogBlockView(owner, b.start, b.end, b.nbytes, b.turn) for b in self._blocks]

    def find(self, start: int) -> LogBlock | None:
        return next((b for b in self._blocks if b.start == start), None)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._blocks)

    def __iter__(self) -> Iterator[LogBlock]:
        return iter(list(self._blocks))

    def __len__(self) -> int:
        return len(self._blocks)
