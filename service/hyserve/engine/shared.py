"""What the API threads and the engine thread share, all guarded by one lock.

The queue, the live and recently ended tasks, the closing flags, the counters and the last
published snapshots. Methods ending in `_locked` expect the caller to hold `lock`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from hyserve.engine.cache_plan import ResumeCosts
from hyserve.engine.config import EngineConfig
from hyserve.engine.scheduler import BoundedFifo
from hyserve.engine.stats import EngineCounters, MemoryUsage, SlotSnapshot, StoreSnapshot
from hyserve.engine.task import Task

__all__ = ["Shared"]


class Shared:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.wake = threading.Condition(self.lock)
        self.queue: BoundedFifo[Task] = BoundedFifo(config.queue_size)
        self.live: dict[str, Task] = {}
        self.ended: OrderedDict[str, float] = OrderedDict()
        self.closed = False
        self.stopping = False
        # the engine thread waits for work (set under the lock as it parks): nothing of its
        # last iteration (commits, evictions, publishing) is still running
        self.parked = True
        self.counters = EngineCounters()
        self.snapshot: tuple[SlotSnapshot, ...] = ()
        self.store_snapshot = StoreSnapshot()
        self.memory_usage = MemoryUsage()
        self.resume_costs: ResumeCosts | None = None

    def count(self, **deltas: int) -> None:
        with self.lock:
            for name, n in deltas.items():
                setattr(self.counters, name, getattr(self.counters, name) + n)

    def count_tier(self, tier: str, **deltas: float) -> None:
        with self.lock:
            counters = self.counters.tiers[tier]
            for name, n in deltas.items():
                setattr(counters, name, getattr(counters, name) + n)

    def waiting_prompts(self) -> list[tuple[int, ...]]:
        with self.lock:
            return [task.prompt for task in list(self.queue)]

    def record_end_locked(self, task: Task) -> None:
        if self.live.get(task.id) is task:
            del self.live[task.id]
        now = time.monotonic()
        self.ended[task.id] = now
        self.ended.move_to_end(task.id)
        self.prune_ended_locked(now)

    def prune_ended_locked(self, now: float) -> None:
        horizon = now - self.config.ended_task_retention_s
        while self.ended:
            task_id, at = next(iter(self.ended.items()))
            if at >= horizon and len(self.ended) <= self.config.ended_task_max:
                break
            del self.ended[task_id]
