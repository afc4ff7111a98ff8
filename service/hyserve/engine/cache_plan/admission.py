"""Which free slot and which prefix-store entry each queued prompt gets (`plan_admissions`), and
every decision the engine then carries out, as plain data on `Admission`: the resume plan, whether
the slot's state is stashed in the store first, whether the store entry is consumed, the
checkpoint positions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hyserve.engine.cache_plan.costs import ResumeCosts
from hyserve.engine.cache_plan.kinds import CheckpointKind, MemoryKind
from hyserve.engine.cache_plan.placement import checkpoint_schedule
from hyserve.engine.cache_plan.resume import CachedView, ResumePlan, common_prefix_len, plan_resume

__all__ = ["Admission", "QueuedPrompt", "SlotCandidate", "StoreCandidate", "plan_admissions"]


@dataclass(frozen=True)
class SlotCandidate:
    index: int
    view: CachedView
    last_used: int  # larger = used more recently
    last_prompt_len: int = 0  # the last task's prompt length: what it generated starts there
    kind: MemoryKind | None = None  # the slot memory's kind (None: attention only)


@dataclass(frozen=True)
class StoreCandidate:
    key: int
    view: CachedView
    tier: str = "memory"  # the prefix-store tier that holds it (stats.STORE_TIERS)
    nbytes: int = 0  # what reading it moves: the whole entry, wherever the prompt resumes in it


@dataclass(frozen=True)
class QueuedPrompt:
    tokens: Sequence[int]
    cache_prompt: bool = True
    message_boundaries: Sequence[int] = ()  # chat positions worth a checkpoint (chat_checkpoint_positions)
    checkpoint_offsets: Sequence[int] = ()  # client-requested checkpoint positions


@dataclass(frozen=True)
class Admission:
    """Where a queued prompt goes and everything the engine does to prepare it, in this order:
    stash the slot's state in the prefix store (`stash`), bring the slot to `plan.resume` (from
    the store entry `store_key` if set, dropping that entry when `discard_entry`), count a store
    miss (`store_miss`), then process the prompt taking checkpoints at `checkpoints`."""

    queue_pos: int
    slot: int
    plan: ResumePlan
    store_key: int | None = None  # restore this prefix-store entry into the slot first
    stash: bool = False  # the slot holds state nothing else reaches: copy it to the store first
    discard_entry: bool = False  # the slot takes all of the store entry: the entry is redundant
    store_miss: bool = False  # a store lookup found nothing better than the slot
    checkpoints: tuple[tuple[int, CheckpointKind], ...] = ()  # (position, kind) while processing the prompt
    passed_over: str | None = None  # the tier of an entry that resumes further but costs more to read


def _slot_order(c: SlotCandidate) -> tuple[int, int, int]:
    """Which slot to overwrite when nothing in it is reused: an empty one, then the least recently used."""
    return (1 if not c.view.tokens else 0, -c.last_used, -c.index)


def _choose(
    free: Sequence[SlotCandidate],
    store: Sequence[StoreCandidate],
    prompt: Sequence[int],
    cache_prompt: bool,
    costs: ResumeCosts | None,
) -> Admission:
    best_slot, best_plan = None, None
    for c in free:
        plan = plan_resume(c.view, prompt, cache_prompt)
        key = (plan.resume, plan.matched, *_slot_order(c))
        if best_slot is None or key > best_slot[0]:
            best_slot, best_plan = (key, c), plan
    if best_slot is None or best_plan is None:
        raise ValueError("no free slot to choose from")
    if best_plan.resume == 0:  # nothing of a slot is reused: don't destroy a useful one
        target = max(free, key=_slot_order)
        best_slot, best_plan = ((0,), target), plan_resume(target.view, prompt, cache_prompt)
    if not cache_prompt:
        return Admission(-1, best_slot[1].index, best_plan)
    further = [
        (entry, plan)
        for entry in store
        if (plan := plan_resume(entry.view, prompt, True, from_store=True)).resume > best_plan.resume
    ]
    if not further:
        return Admission(-1, best_slot[1].index, best_plan)
    # the furthest entry, or with costs the cheapest (ties: the furthest, then the nearer tier)
    if costs is None:
        entry, plan = max(further, key=lambda ep: ep[1].resume)  # max keeps the first of equals
    else:
        entry, plan = min(
            further, key=lambda ep: (costs.seconds(len(prompt), ep[1].resume, ep[0].tier, ep[0].nbytes), -ep[1].resume)
        )
        slot_cost = costs.seconds(len(prompt), best_plan.resume)
        if costs.seconds(len(prompt), plan.resume, entry.tier, entry.nbytes) >= slot_cost:
            return Admission(-1, best_slot[1].index, best_plan, passed_over=entry.tier)
    return Admission(-1, max(free, key=_slot_order).index, plan, entry.key)


def plan_admissions(
    queued: Sequence[QueuedPrompt | tuple[Sequence[int], bool]],
    free: Sequence[SlotCandidate],
    store: Sequence[StoreCandidate] = (),
    *,
    store_enabled: bool = False,
    checkpoint_interval: int = 0,
    costs: ResumeCosts | None = None,
) -> list[Admission]:
    """Admit queued prompts in FIFO order while free slots remain.

    Each prompt gets the free slot where it resumes furthest, or a prefix-store entry restored
    into the emptiest / least recently used free slot when that resumes further still; with
    `costs`, the entry only when reading it costs less than evaluating the tokens it saves (of
    the entries that resume further, the cheapest; `passed_over` names the tier of one that
    resumed further and cost more). A slot or
    entry given to one prompt is not offered to the next. With `store_enabled`, a slot about to
    lose state that no store entry and no new prompt keeps (more than its last generation) is
    stashed first; an entry whose tokens the slot takes whole is discarded.
    """
    sizes = {e.key: len(e.view.tokens) for e in store}
    remaining, entries = list(free), list(store)
    out: list[Admission] = []
    for pos, item in enumerate(queued):
        if not remaining:
            break
        q = item if isinstance(item, QueuedPrompt) else QueuedPrompt(item[0], item[1])
        a = _choose(remaining, entries, q.tokens, q.cache_prompt, costs)
        slot = next(c for c in remaining if c.index == a.slot)
        out.append(_decide(pos, a, slot, q, store_enabled, checkpoint_interval, sizes))
        remaining = [c for c in remaining if c.index != a.slot]
        entries = [e for e in entries if e.key != a.store_key]
    return out


def _decide(
    pos: int,
    a: Admission,
    slot: SlotCandidate,
    q: QueuedPrompt,
    store_enabled: bool,
    interval: int,
    sizes: Mapping[int, int],
) -> Admission:
    """The stash/discard/miss decisions and the checkpoint positions of one admission."""
    plan, held = a.plan, slot.view.tokens
    stash = discard = miss = False
    if store_enabled and held:
        if a.store_key is not None:
            # the slot is overwritten by the entry: keep it unless the prompt keeps what it generated
            stash = common_prefix_len(held, q.tokens) < slot.last_prompt_len
        elif q.cache_prompt:
            # the slot loses more than its last generation: keep that state for later
            stash = plan.resume < len(held) and plan.matched < slot.last_prompt_len
    if a.store_key is not None:
        discard = plan.resume == sizes.get(a.store_key, -1)
    elif store_enabled and q.cache_prompt:
        miss = bool(plan.reprocessed) or plan.resume == 0  # the store had nothing better either
    checkpoints: tuple[tuple[int, CheckpointKind], ...] = ()
    if q.cache_prompt:
        kind = slot.kind or MemoryKind.ATTENTION
        checkpoints = tuple(
            checkpoint_schedule(plan.resume, len(q.tokens), kind, q.message_boundaries, q.checkpoint_offsets, interval)
        )
    return Admission(pos, a.slot, plan, a.store_key, stash, discard, miss, checkpoints, a.passed_over)
