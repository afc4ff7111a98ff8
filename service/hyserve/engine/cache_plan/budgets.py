"""Keeping the cache within its byte budgets: which checkpoints (`choose_evictions`) and which
blocks of kept inputs (`choose_log_evictions`) go first, and when a prefix-store entry is made
redundant by a newer one (`subsumes`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hyserve.engine.cache_plan.kinds import _KIND_RANK, CheckpointKind
from hyserve.engine.cache_plan.resume import CachedView, common_prefix_len, replay_reach

__all__ = ["EvictionCandidate", "LogBlockView", "choose_evictions", "choose_log_evictions", "subsumes"]


@dataclass(frozen=True)
class EvictionCandidate:
    owner: int  # slot index
    position: int
    kind: CheckpointKind
    nbytes: int
    turn: int  # admission number of the task that created it (larger = newer)


def choose_evictions(
    items: Sequence[EvictionCandidate], budget: int, keep_head: int = 3, keep_tail: int = 8
) -> list[EvictionCandidate]:
    """The checkpoints to drop so that the rest fit in `budget` bytes.

    Each slot's first `keep_head` positions (the end of a shared system prompt: every new
    conversation of the same agent resumes there) and last `keep_tail` positions (the newest
    messages: appends, edits of the last message, regenerates) are kept longest; the middle of a
    long history goes first. Within each of those two tiers older turns go first, interval
    checkpoints before message boundaries, client-requested ones and prompt ends, and earlier
    positions before later ones.
    """
    ends: set[tuple[int, int]] = set()
    for owner in {i.owner for i in items}:
        positions = sorted(i.position for i in items if i.owner == owner)
        ends.update((owner, p) for p in positions[:keep_head] + positions[len(positions) - keep_tail :])
    total = sum(i.nbytes for i in items)
    out: list[EvictionCandidate] = []
    order = sorted(items, key=lambda i: ((i.owner, i.position) in ends, i.turn, _KIND_RANK[i.kind], i.position))
    for item in order:
        if total <= budget:
            break
        out.append(item)
        total -= item.nbytes
    return out


@dataclass(frozen=True)
class LogBlockView:
    """A block of kept inputs: positions [start, end) of one slot's tokens."""

    owner: int  # slot index
    start: int
    end: int
    nbytes: int
    turn: int  # admission number of the task whose forward recorded it (larger = newer)


def choose_log_evictions(
    blocks: Sequence[LogBlockView],
    checkpoints: Mapping[int, Sequence[int]],
    budget: int,
    keep_head: int = 3,
    keep_tail: int = 8,
) -> list[LogBlockView]:
    """The blocks of kept inputs to drop so that the rest fit in `budget` bytes.

    A block serves the positions after the nearest base before it (a checkpoint of its slot, or
    0). The middle of a long history goes first; then blocks after one of the slot's last
    `keep_tail` checkpoints (the newest messages and the last answer: edits, regenerates); blocks
    after the empty state or one of the first `keep_head` checkpoints (a shared system prompt, where
    every new conversation of the same agent parts) go last. Within each tier older turns go first,
    then earlier positions.
    """
    tiers: dict[int, tuple[set[int], set[int]]] = {}
    for owner, positions in checkpoints.items():
        ordered = sorted(positions)
        tiers[owner] = ({0, *ordered[:keep_head]}, set(ordered[len(ordered) - keep_tail :]))

    def tier(b: LogBlockView) -> int:
        cps = checkpoints.get(b.owner, ())
        anchor = max((c for c in cps if c <= b.start), default=0)
        head, tail = tiers.get(b.owner, ({0}, set()))
        return 2 if anchor in head else 1 if anchor in tail else 0

    total = sum(b.nbytes for b in blocks)
    out: list[LogBlockView] = []
    for b in sorted(blocks, key=lambda b: (tier(b), b.turn, b.start)):
        if total <= budget:
            break
        out.append(b)
        total -= b.nbytes
    return out


def _covered(intervals: Iterable[tuple[int, int]], first: int, last: int) -> bool:
    """Whether the closed intervals cover every integer in [first, last]."""
    at = first
    for a, b in sorted(intervals):
        if a > at:
            break
        at = max(at, b + 1)
        if at > last:
            return True
    return at > last


def subsumes(new: CachedView, old: CachedView) -> bool:
    """Whether `new` reaches every state `old` offers: old's tokens are a prefix of new's, and each
    position old can resume at exactly (its live range, its checkpoints, its replays) is reachable
    in new too, with logits wherever old has them."""
    n_old = len(old.tokens)
    if n_old > len(new.tokens) or common_prefix_len(new.tokens, old.tokens) < n_old:
        return False
    new_cps = {cp.position: cp.has_logits for cp in new.checkpoints}
    new_reach = [(first, last) for _, first, last in replay_reach(new)] + [(new.live_floor, len(new.tokens))]

    def reachable(pos: int, with_logits: bool) -> bool:
        if with_logits:
            return new_cps.get(pos, False)
        return pos in new_cps or _covered(new_reach, pos, pos)

    if old.live_floor < n_old and new.live_floor > old.live_floor:
        return False
    if not reachable(n_old, False) and n_old > 0:
        return False
    if not all(reachable(cp.position, cp.has_logits) for cp in old.checkpoints):
        return False
    return all(_covered(new_reach, first, last) for _, first, last in replay_reach(old))
