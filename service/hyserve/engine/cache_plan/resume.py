"""Where a prompt resumes on one cached sequence (`plan_resume`): the largest position up to the
common prefix that the live memory, a checkpoint or a replay of kept inputs reaches exactly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hyserve.engine.cache_plan.kinds import ReuseSource

__all__ = ["CachedView", "CheckpointView", "ResumePlan", "common_prefix_len", "plan_resume", "replay_reach"]


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
class CheckpointView:
    position: int
    has_logits: bool = False


@dataclass(frozen=True)
class CachedView:
    """What resume planning needs to know about one cached sequence."""

    tokens: Sequence[int]
    live_floor: int  # truncating the live memory to any n in [live_floor, len(tokens)] is exact
    checkpoints: Sequence[CheckpointView] = ()
    logged: Sequence[tuple[int, int]] = ()  # maximal runs [start, end) of positions whose inputs are kept


def same_view(a: CachedView, b: CachedView) -> bool:
    """The two views describe the same cached sequence (whatever sequence types they hold)."""
    return (
        tuple(a.tokens) == tuple(b.tokens)
        and a.live_floor == b.live_floor
        and tuple(a.checkpoints) == tuple(b.checkpoints)
        and tuple(map(tuple, a.logged)) == tuple(map(tuple, b.logged))
    )


def replay_reach(view: CachedView) -> list[tuple[int, int, int]]:
    """(base, first, last): every position in [first, last] is reached by replaying kept inputs from
    `base` (a checkpoint position, or 0: the empty state) on; base == first, the nearest base for the
    positions up to the next one. Positions reached by a checkpoint alone are included."""
    cps = sorted(cp.position for cp in view.checkpoints)
    out: list[tuple[int, int, int]] = []
    for start, end in view.logged:
        bases = ([0] if start == 0 else []) + [c for c in cps if start <= c <= end]
        for i, b in enumerate(bases):
            last = bases[i + 1] - 1 if i + 1 < len(bases) else end
            if last >= b:
                out.append((b, b, last))
    return out


@dataclass(frozen=True)
class ResumePlan:
    matched: int  # L: longest common prefix of the cached tokens and the prompt
    resume: int  # r: prompt[:r] is kept, prompt[r:] is evaluated
    source: ReuseSource
    restore: int | None = None  # position of the checkpoint to restore (None: keep/truncate the live memory)
    replay_from: int | None = None  # replay kept inputs from this position (the restored checkpoint, or 0: empty)
    from_logits: bool = False  # r == len(prompt): the first token is sampled from the checkpoint's logits
    invalidate: tuple[int, ...] = ()  # checkpoint positions past r: no longer prefixes of T once T = prompt[:r]
    reason: str | None = None  # why matched tokens are evaluated again (matched > resume), or why r == 0

    @property
    def reprocessed(self) -> int:
        """Tokens whose state was cached but that are evaluated again."""
        return self.matched - min(self.matched, self.resume)


def plan_resume(
    cached: CachedView, prompt: Sequence[int], cache_prompt: bool = True, from_store: bool = False
) -> ResumePlan:
    """The resume point r for `prompt` on `cached`: the largest position <= L reachable exactly.

    Reachable: any n in [live_floor, len(T)] by truncating the live memory; any checkpoint
    position; any position inside a run of kept inputs that starts at a checkpoint or at 0 (by a
    replay from there). At least one prompt token is evaluated unless a checkpoint at len(prompt)
    holds the logits to sample from. Ties go to the live memory (nothing to copy), then to a plain
    checkpoint (nothing to replay).
    """
    if not prompt:
        raise ValueError("empty prompt")
    n = len(prompt)
    matched = common_prefix_len(cached.tokens, prompt)
    every = tuple(sorted(cp.position for cp in cached.checkpoints))
    if not cache_prompt:
        return ResumePlan(matched, 0, ReuseSource.NONE, invalidate=every, reason="cache_prompt_disabled")
    live_source = ReuseSource.PREFIX_STORE if from_store else ReuseSource.SLOT_LIVE
    cp_source = ReuseSource.PREFIX_STORE if from_store else ReuseSource.CHECKPOINT

    resume, source, restore, from_logits = 0, ReuseSource.NONE, None, False
    live_max = min(matched, n - 1)
    if cached.live_floor <= live_max and live_max > 0:
        resume, source = live_max, live_source
    for cp in cached.checkpoints:
        usable = cp.position <= matched and (cp.position < n or cp.has_logits)
        if usable and cp.position > resume:
            resume, source, restore, from_logits = cp.position, cp_source, cp.position, cp.position == n
    replay_from: int | None = None
    for base, first, last in replay_reach(cached):
        target = min(last, matched, n - 1)  # a replay gives no logits: the last prompt token is evaluated
        if first <= target and target > resume:
            resume, source, from_logits, replay_from = target, cp_source, False, base
            restore = base if base > 0 else None
    invalidate = tuple(p for p in every if p > resume)

    reason: str | None = None
    if resume == 0:
        if not cached.tokens:
            reason = "cold_slot"
        elif matched == 0:
            reason = "no_common_prefix"
        elif n == 1:
            reason = "single_token_prompt"
        else:
            reason = "no_checkpoint"
    elif resume < matched:
        live_blocked = cached.live_floor > live_max
        if not (live_blocked and matched < n):
            reason = "no_stored_logits"
        else:  # neither a checkpoint nor kept inputs reach the divergence
            reason = "inputs_not_kept" if cached.logged else "no_checkpoint_at_divergence"
    return ResumePlan(matched, resume, source, restore, replay_from, from_logits, invalidate, reason)
