"""Taking queued tasks for admission: the plan, the tasks it takes off the queue, and the store
entries it restores from, held before any slot is touched.

A task taken off the queue is in no slot until `EngineLoop._start` runs; if anything fails
before that (a tier read, a replan), the tasks taken here end with an error instead of being
lost: nothing else would ever send them an event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import structlog

from hyserve.engine.cache_plan import Admission, QueuedPrompt, plan_admissions
from hyserve.engine.prefix_store import StoredSequence
from hyserve.engine.shared import Shared
from hyserve.engine.slot import Slot
from hyserve.engine.stash import StateStash
from hyserve.engine.task import FailedEvent, Task, TaskState

__all__ = ["Taken", "take_admissions"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Taken:
    task: Task
    admission: Admission
    entry: StoredSequence | None  # the planned store entry, read and held


def take_admissions(shared: Shared, stash: StateStash, slots: Sequence[Slot], checkpoint_interval: int) -> list[Taken]:
    """Plan the queued prompts onto the free slots and take the planned tasks off the queue."""
    free = [slot for slot in slots if slot.run is None]
    if not free:
        return []
    stash.lookup(shared.waiting_prompts(), list(slots))  # network: outside the lock
    with shared.lock:
        queued = list(shared.queue)
        prompts = [QueuedPrompt(t.prompt, t.cache_prompt, t.message_boundaries, t.checkpoint_offsets) for t in queued]
        plan = plan_admissions(
            prompts,
            [s.candidate() for s in free],
            stash.candidates(),
            store_enabled=stash.enabled,
            checkpoint_interval=checkpoint_interval,
            costs=stash.rates.costs(),
        )
        tasks = [shared.queue.pop() for _ in plan]
        for task in tasks:
            task.state = TaskState.RUNNING
    try:
        entries = _hold_entries(stash, slots, plan, prompts, checkpoint_interval)
    except Exception as exc:  # a bug reading the store: these tasks are in no slot yet
        log.exception("admission_entries_failed", tasks=[t.id for t in tasks])
        for task in tasks:
            with shared.lock:
                shared.record_end_locked(task)
            task.end(FailedEvent(f"internal engine error while reading the prompt cache: {exc}"))
        return []
    return [
        Taken(task, a, entries.get(a.store_key) if a.store_key is not None else None)
        for task, a in zip(tasks, plan, strict=True)
    ]


def _hold_entries(
    stash: StateStash,
    slots: Sequence[Slot],
    plan: list[Admission],
    prompts: list[QueuedPrompt],
    checkpoint_interval: int,
) -> dict[int, StoredSequence]:
    """Read every planned store entry before any slot is touched (stashing a slot for one
    admission may evict an entry planned for another). An entry a tier no longer holds as it
    offered it (gone, unreadable, rewritten since) is planned again without the store; `plan` is
    updated in place."""
    entries: dict[int, StoredSequence] = {}
    for i, a in enumerate(plan):
        if a.store_key is None:
            continue
        entry = stash.get(a.store_key)
        if entry is None:
            again = plan_admissions(
                [prompts[a.queue_pos]],
                [slots[a.slot].candidate()],
                store_enabled=stash.enabled,
                checkpoint_interval=checkpoint_interval,
            )
            plan[i] = replace(again[0], queue_pos=a.queue_pos)
        else:
            entries[a.store_key] = entry
    return entries
