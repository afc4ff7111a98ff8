"""The engine: one dedicated thread that owns the slots and runs every forward pass.

This module is the API side: thread-safe calls only (`submit`, `cancel`, `stats`, `shutdown`);
the engine talks back through each task's event sink. The thread's work is in loop.py, a slot and
its task's run in slot.py, what is reported in stats.py, and what both sides share (under one
lock) in shared.py. The cache's decisions are plain functions in cache_plan/.
"""

from __future__ import annotations

import threading
import time
from enum import Enum

import structlog

from hyserve.engine.cancel import CancelSource
from hyserve.engine.config import EngineConfig
from hyserve.engine.constraints import GrammarCompiler
from hyserve.engine.loop import EngineLoop
from hyserve.engine.prefix_store import PrefixStore
from hyserve.engine.scheduler import QueueFullError, queued_tokens_error
from hyserve.engine.shared import Shared
from hyserve.engine.slot import Slot
from hyserve.engine.stats import (
    CheckpointInfo,
    EngineCounters,
    EngineStats,
    MemoryUsage,
    SlotSnapshot,
    SlotState,
    StoreSnapshot,
)
from hyserve.engine.task import FinishedEvent, FinishReason, Task, Timings, Usage
from hyserve.model.architectures.base import Architecture
from hyserve.model.tokenizer import Tokenizer

__all__ = [
    "CancelOutcome",
    "CheckpointInfo",
    "DuplicateTaskError",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineCounters",
    "EngineStats",
    "MemoryUsage",
    "QueueFullError",
    "SlotSnapshot",
    "SlotState",
    "StoreSnapshot",
]

log = structlog.get_logger(__name__)


class DuplicateTaskError(RuntimeError):
    """A task with this id is still queued or running."""


class EngineClosedError(RuntimeError):
    """The engine no longer accepts tasks (shutting down)."""


class CancelOutcome(Enum):
    CANCELLED = "cancelled"
    ALREADY_FINISHED = "already_finished"
    NOT_FOUND = "not_found"


class Engine:
    def __init__(self, arch: Architecture, tokenizer: Tokenizer, config: EngineConfig | None = None) -> None:
        self.arch = arch
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        # the model's constraint compiler: the API compiles each request's constraint with it
        # (off the engine thread) and hands the result over as Task.grammar
        self.grammars = GrammarCompiler(tokenizer, arch.n_vocab)
        self._shared = Shared(self.config)
        self._loop = EngineLoop(arch, tokenizer, self.config, self._shared)  # engine thread only
        self._thread: threading.Thread | None = None

    @property
    def slots(self) -> list[Slot]:
        """The slots (engine thread only, or once the engine is idle: tests and checks)."""
        return self._loop.slots

    @property
    def store(self) -> PrefixStore:
        """The host-memory prefix store (engine thread only, or once the engine is idle)."""
        return self._loop.store

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("engine already started")
        self._thread = threading.Thread(target=self._loop.run, name="hyserve-engine", daemon=True)
        self._thread.start()

    def submit(self, task: Task) -> None:
        """Queue a task. Raises EngineClosedError, DuplicateTaskError or QueueFullError."""
        s = self._shared
        with s.lock:
            if s.closed:
                raise EngineClosedError("the server is shutting down")
            if task.id in s.live:
                raise DuplicateTaskError(f"task {task.id!r} is still queued or running")
            queued = sum(len(t.prompt) for t in s.queue)
            refusal = queued_tokens_error(queued, len(task.prompt), self.config.max_queued_prompt_tokens)
            if refusal is not None:
                raise QueueFullError(refusal)
            s.queue.push(task)  # QueueFullError
            s.live[task.id] = task
            s.ended.pop(task.id, None)
            s.wake.notify()
            queued = len(s.queue)
        task.log.info("task_queued", prompt_tokens=len(task.prompt), queued=queued)

    def cancel(self, task_id: str, source: CancelSource = CancelSource.RPC) -> CancelOutcome:
        """Cancel by id (the Cancel RPC)."""
        s = self._shared
        with s.lock:
            task = s.live.get(task_id)
            if task is None:
                s.prune_ended_locked(time.monotonic())
                known = task_id in s.ended
                return CancelOutcome.ALREADY_FINISHED if known else CancelOutcome.NOT_FOUND
        return self.cancel_task(task, source)

    def cancel_task(self, task: Task, source: CancelSource) -> CancelOutcome:
        """Cancel this very task (its own caller went away, or by id). Touches nothing else.

        A queued task leaves the queue and ends at once; a running one stops at the next step."""
        s = self._shared
        with s.lock:
            was_queued = s.queue.remove(task)
            if was_queued:
                task.request_cancel()
                s.record_end_locked(task)
        if was_queued:
            now = time.perf_counter()
            usage = Usage(prompt_tokens=len(task.prompt))
            task.end(FinishedEvent(FinishReason.CANCELLED, usage, Timings(queue_ms=(now - task.received_at) * 1e3)))
            task.log.info("task_cancelled", where="queue", source=source.value)
            return CancelOutcome.CANCELLED
        if task.request_cancel():
            with s.lock:
                s.wake.notify()
            task.log.info("task_cancel_requested", source=source.value)
            return CancelOutcome.CANCELLED
        return CancelOutcome.ALREADY_FINISHED

    def stats(self) -> EngineStats:
        s = self._shared
        with s.lock:
            return EngineStats(
                s.snapshot, s.counters.copy(), len(s.queue), s.store_snapshot, s.memory_usage, s.resume_costs
            )

    def live_tasks(self) -> list[Task]:
        """Tasks still queued or running."""
        with self._shared.lock:
            return list(self._shared.live.values())

    def close(self) -> None:
        """Stop accepting tasks; queued and running ones go on (graceful drain)."""
        with self._shared.lock:
            self._shared.closed = True

    def accepting(self) -> bool:
        """Whether submit can still take a task (False once close has run)."""
        with self._shared.lock:
            return not self._shared.closed

    def idle(self) -> bool:
        """No task is queued or running and the engine thread has finished its last iteration."""
        with self._shared.lock:
            return not self._shared.live and self._shared.parked

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel everything still queued or running and stop the thread."""
        self.close()
        for task in self.live_tasks():
            self.cancel_task(task, CancelSource.SHUTDOWN)
        with self._shared.lock:
            self._shared.stopping = True
            self._shared.wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
