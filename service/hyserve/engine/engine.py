"""The engine: one dedicated thread that owns the slots and runs every forward pass.

Each iteration of the loop:
1. admit queued tasks to free slots (FIFO; cache_plan decides the slot, the resume point and
   whether a prefix-store entry or a checkpoint is restored), prepare the slot's memory and send
   Accepted;
2. end running tasks whose cancel flag is set (the slot keeps what it has evaluated so far);
3. run one `arch.forward` for all busy slots: one token per generating slot plus prompt chunks;
4. commit the evaluated tokens to each slot's token list, take the checkpoints that fall on the
   new position (prompt chunks are cut at checkpoint positions), sample where logits came back,
   apply the stop rules and send the events.

Invariant I1 (ARCHITECTURE.md): a slot's token list `tokens` always equals what its memory holds.
Memory only changes in `forward` (which advances every memory of the call, or none when it raises)
and in the `Slot` methods that move bookkeeping with it (truncate, restore, load); `Slot.commit`
follows every successful forward, so both always change together. I2: checkpoints and kept inputs
past a slot's new resume point are dropped before it is processed. I3: a checkpoint is made, and a
forward's kept inputs recorded, only after that forward has been committed.
A sampled token is only added to memory when it is evaluated in the next step: when a task stops on
it, the slot holds prompt + completion[:-1].

The API side talks to the engine through thread-safe calls only (`submit`, `cancel`, `stats`,
`shutdown`); the engine talks back through each task's event sink.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

import numpy as np
import structlog

from hyserve.engine.cache_plan import (
    Admission,
    CachedView,
    CheckpointKind,
    EvictionCandidate,
    LogBlockView,
    MemoryKind,
    ResumePlan,
    SlotCandidate,
    checkpoint_schedule,
    choose_evictions,
    choose_log_evictions,
    common_prefix_len,
    plan_admissions,
)
from hyserve.engine.cancel import CancelSource
from hyserve.engine.checkpoints import Checkpoint, CheckpointList
from hyserve.engine.input_log import InputLog
from hyserve.engine.invariants import InvariantChecker
from hyserve.engine.prefix_store import PrefixStore, StoredSequence
from hyserve.engine.sampling import apply_penalties, log_softmax, sample
from hyserve.engine.scheduler import BoundedFifo, QueueFullError, SlotWork, compose_batch, queued_tokens_error
from hyserve.engine.task import (
    AcceptedEvent,
    DeltaEvent,
    FailedEvent,
    FinishedEvent,
    FinishReason,
    StopStringFilter,
    Task,
    TaskState,
    Timings,
    TokenLogprob,
    Usage,
)
from hyserve.model.architectures.base import Architecture, ForwardCancelled, Logits, Segment
from hyserve.model.memory import SequenceMemory
from hyserve.model.tokenizer import IncrementalDecoder, Tokenizer

__all__ = [
    "CancelOutcome",
    "CheckpointInfo",
    "DuplicateTaskError",
    "Engine",
    "EngineClosedError",
    "EngineConfig",
    "EngineCounters",
    "EngineStats",
    "QueueFullError",
    "SlotSnapshot",
    "SlotState",
]

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    n_slots: int = 1
    n_ctx: int = 4096  # per slot
    queue_size: int = 64  # waiting tasks (running ones not counted)
    prompt_chunk: int = 128  # token budget of one forward call (prompt chunks + decode tokens)
    ended_task_retention_s: float = 600.0  # how long a late Cancel still answers ALREADY_FINISHED
    ended_task_max: int = 100_000
    checkpoint_memory: int = 1 << 30  # bytes for all slots' checkpoints
    checkpoint_interval: int = 1024  # also checkpoint every this many tokens of a long prompt (0: off)
    cache_memory: int = 2 << 30  # bytes of the host-memory prefix store (0: off)
    replay_memory: int = 1 << 30  # bytes of kept per-token inputs of all slots, for exact resumes (0: off)
    window_ring: bool = False  # sliding-window layers as ring buffers (with window checkpoints)
    max_queued_prompt_tokens: int = 0  # prompt tokens all waiting tasks may hold together (0: no limit)
    check_invariants: bool = False  # test hook: verify I1-I3 after every iteration (doubles the model work)

    def __post_init__(self) -> None:
        if self.n_slots < 1:
            raise ValueError("n_slots must be >= 1")
        if self.n_ctx < 2:
            raise ValueError("n_ctx must be >= 2")
        if self.queue_size < 0:
            raise ValueError("queue_size must be >= 0")
        if self.prompt_chunk < 1:
            raise ValueError("prompt_chunk must be >= 1")
        if min(self.checkpoint_memory, self.cache_memory, self.checkpoint_interval, self.replay_memory) < 0:
            raise ValueError("checkpoint_memory, cache_memory, checkpoint_interval and replay_memory must be >= 0")


class DuplicateTaskError(RuntimeError):
    """A task with this id is still queued or running."""


class EngineClosedError(RuntimeError):
    """The engine no longer accepts tasks (shutting down)."""


class CancelOutcome(Enum):
    CANCELLED = "cancelled"
    ALREADY_FINISHED = "already_finished"
    NOT_FOUND = "not_found"


class SlotState(Enum):
    IDLE = "idle"
    PROCESSING_PROMPT = "processing_prompt"
    GENERATING = "generating"


@dataclass(frozen=True)
class CheckpointInfo:
    position: int
    kind: CheckpointKind
    nbytes: int
    has_logits: bool


@dataclass(frozen=True)
class SlotSnapshot:
    index: int
    state: SlotState
    task_id: str
    cached_tokens: int
    checkpoints: tuple[CheckpointInfo, ...] = ()


@dataclass
class EngineCounters:
    prompt_tokens_received: int = 0
    prompt_tokens_reused: int = 0
    prompt_tokens_processed: int = 0
    full_reprocess_by_reason: dict[str, int] = field(default_factory=dict)
    reprocessed_tokens_by_reason: dict[str, int] = field(default_factory=dict)
    restores: int = 0
    checkpoints_created: int = 0
    checkpoints_evicted: int = 0
    checkpoints_invalidated: int = 0
    prefix_store_hits: int = 0
    prefix_store_misses: int = 0
    prefix_store_evicted: int = 0
    replays: int = 0  # resumes that replayed kept inputs
    replayed_tokens: int = 0  # positions advanced by those replays (no forward pass)
    input_blocks_evicted: int = 0  # blocks of kept inputs dropped for the byte budget
    invariant_checks: int = 0  # slot/entry checks of I1-I3 (EngineConfig.check_invariants)
    invariant_violations: int = 0

    def copy(self) -> EngineCounters:
        c = replace(self)
        c.full_reprocess_by_reason = dict(self.full_reprocess_by_reason)
        c.reprocessed_tokens_by_reason = dict(self.reprocessed_tokens_by_reason)
        return c


@dataclass(frozen=True)
class StoreSnapshot:
    entries: int = 0
    nbytes: int = 0
    budget: int = 0


@dataclass(frozen=True)
class MemoryUsage:
    """Bytes the slots and the prompt cache hold, by where they live."""

    device_bytes: int = 0
    host_bytes: int = 0


@dataclass(frozen=True)
class EngineStats:
    slots: tuple[SlotSnapshot, ...]
    counters: EngineCounters
    queued: int
    store: StoreSnapshot = StoreSnapshot()
    memory: MemoryUsage = MemoryUsage()


# --- slots and running tasks ---------------------------------------------------------------------


def memory_kind(memory: SequenceMemory) -> MemoryKind:
    if memory.recurrent:
        return MemoryKind.HYBRID if memory.has_attention else MemoryKind.RECURRENT
    return MemoryKind.SLIDING_WINDOW if memory.rings else MemoryKind.ATTENTION


class Slot:
    """A sequence memory, the tokens `tokens` (T) whose effect it holds, and its checkpoints."""

    def __init__(self, index: int, memory: SequenceMemory) -> None:
        self.index = index
        self.memory = memory
        self.kind = memory_kind(memory)
        self.tokens: list[int] = []
        self.checkpoints = CheckpointList()
        self.log = InputLog()  # kept per-token inputs (replays reach any position inside a run)
        self.run: _Run | None = None
        self.last_used = 0
        self.last_prompt_len = 0  # the last task's prompt length: its generated tail starts there

    def truncate(self, n: int) -> None:
        """Keep the first n tokens (memory and bookkeeping together)."""
        self.memory.truncate(n)
        del self.tokens[n:]

    def restore(self, cp: Checkpoint) -> None:
        """Go back to checkpoint `cp` (a prefix of T: I2)."""
        self.memory.restore(cp.snapshot)
        del self.tokens[cp.position :]

    def load(self, entry: StoredSequence, n: int, cp: Checkpoint | None) -> None:
        """Become the first n tokens of a prefix-store entry (its state at n is its checkpoint `cp`,
        or its live end); the entry's checkpoints and kept inputs up to n come along."""
        self.memory.load(entry.image, n, cp.snapshot if cp is not None else None)
        self.tokens = list(entry.tokens[:n])
        self.checkpoints = CheckpointList(entry.checkpoints.up_to(n))
        self.log = entry.log.up_to(n)

    def load_for_replay(self, entry: StoredSequence, base: int, cp: Checkpoint | None, end: int) -> None:
        """Become the first `base` tokens of a prefix-store entry (its checkpoint `cp` at base, or
        the empty state), with the entry's attention entries, checkpoints and kept inputs up to
        `end`, ready for `replay(..., end)`."""
        if cp is None:
            self.memory.truncate(0)
        else:
            self.memory.load(entry.image, base, cp.snapshot)
        self.memory.load_entries(entry.image, base, end)
        self.tokens = list(entry.tokens[:base])
        self.checkpoints = CheckpointList(entry.checkpoints.up_to(end))
        self.log = entry.log.up_to(end)

    def replay(self, arch: Architecture, tokens: Sequence[int], end: int) -> int:
        """Advance from the current state (a restored checkpoint, or empty) to `end` tokens by
        replaying kept inputs; `tokens` are the slot's tokens before it was brought back (their
        first `end` are this state's). Returns the positions replayed."""
        start = len(self.tokens)
        arch.replay(self.memory, self.log.rows(start, end))
        self.tokens.extend(tokens[start:end])
        self.log.drop_after(end)
        return end - start

    def candidate(self) -> SlotCandidate:
        view = CachedView(self.tokens, self.memory.live_floor, self.checkpoints.views(), self.log.runs())
        return SlotCandidate(self.index, view, self.last_used)

    def commit(self, evaluated: Sequence[int]) -> None:
        """Record tokens that a successful forward call has just added to the memory."""
        self.tokens.extend(int(t) for t in evaluated)
        if len(self.tokens) != self.memory.n_tokens:
            raise AssertionError(
                f"slot {self.index}: {len(self.tokens)} tokens but memory holds {self.memory.n_tokens}"
            )

    def consistent(self) -> bool:
        return len(self.tokens) == self.memory.n_tokens


class _StopText:
    """Decoded completion text with stop-string holdback (see task.StopStringFilter)."""

    def __init__(self, tokenizer: Tokenizer, stop_strings: Sequence[str]) -> None:
        self.decoder: IncrementalDecoder = tokenizer.incremental_decoder()
        self.filter = StopStringFilter(stop_strings)

    def push(self, token: int) -> tuple[str, str | None]:
        return self.filter.push(self.decoder.push(token))

    def finish(self) -> str:
        """Everything still held back (generation ended without a stop string)."""
        released, hit = self.filter.push(self.decoder.flush())
        return released if hit is not None else released + self.filter.flush()


@dataclass(eq=False)
class _Run:
    """A task's progress on its slot."""

    task: Task
    slot: Slot
    plan: ResumePlan
    seq: int  # admission order
    admitted_at: float
    text: _StopText
    rng: np.random.Generator
    pos: int  # next prompt index to evaluate
    history: list[int]  # prompt + sampled tokens (for penalties)
    generated: list[int] = field(default_factory=list)
    next_token: int | None = None  # sampled, not yet evaluated
    schedule: deque[tuple[int, CheckpointKind]] = field(default_factory=deque)  # checkpoints still to take
    first_logits: np.ndarray | None = None  # a restored checkpoint's logits: sample before any forward
    processed: int = 0  # prompt tokens evaluated for this task
    prompt_done_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.task.prompt

    @property
    def decoding(self) -> bool:
        return self.next_token is not None

    def prompt_step_limit(self) -> int:
        """Prompt tokens the next chunk may take: up to the next checkpoint position (a chunk edge)."""
        end = self.schedule[0][0] if self.schedule else len(self.prompt)
        return end - self.pos

    def usage(self) -> Usage:
        return Usage(len(self.prompt), self.plan.resume, self.processed, len(self.generated))

    def timings(self, now: float) -> Timings:
        received = self.task.received_at
        prompt_end = self.prompt_done_at if self.prompt_done_at is not None else now
        first, last = self.first_token_at, self.last_token_at
        return Timings(
            queue_ms=(self.admitted_at - received) * 1e3,
            prompt_ms=(prompt_end - self.admitted_at) * 1e3,
            generation_ms=((last - first) * 1e3) if first is not None and last is not None else 0.0,
            time_to_first_token_ms=((first - received) * 1e3) if first is not None else 0.0,
        )


# --- the engine ----------------------------------------------------------------------------------


class Engine:
    def __init__(self, arch: Architecture, tokenizer: Tokenizer, config: EngineConfig | None = None) -> None:
        self.arch = arch
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.slots = [Slot(i, self._new_memory()) for i in range(self.config.n_slots)]
        self.store = PrefixStore(self.config.cache_memory)  # engine thread only
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # guarded by _lock:
        self._queue: BoundedFifo[Task] = BoundedFifo(self.config.queue_size)
        self._live: dict[str, Task] = {}
        self._ended: OrderedDict[str, float] = OrderedDict()
        self._closed = False
        self._stopping = False
        self._counters = EngineCounters()
        self._snapshot: tuple[SlotSnapshot, ...] = self._take_snapshot()
        self._store_snapshot = StoreSnapshot(0, 0, self.store.budget)
        self._memory_usage = MemoryUsage()
        # engine thread only:
        self._admissions = 0
        self._thread: threading.Thread | None = None
        self._checker = InvariantChecker(arch, self.config.n_ctx) if self.config.check_invariants else None

    def _new_memory(self) -> SequenceMemory:
        memory = self.arch.new_memory(self.config.n_ctx)
        if self.config.window_ring:
            memory.use_window_rings(self.arch.sliding_windows(), self.config.prompt_chunk)
        return memory

    # --- API side (any thread) -------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("engine already started")
        self._thread = threading.Thread(target=self._loop, name="hyserve-engine", daemon=True)
        self._thread.start()

    def submit(self, task: Task) -> None:
        """Queue a task. Raises EngineClosedError, DuplicateTaskError or QueueFullError."""
        with self._lock:
            if self._closed:
                raise EngineClosedError("the server is shutting down")
            if task.id in self._live:
                raise DuplicateTaskError(f"task {task.id!r} is still queued or running")
            queued = sum(len(t.prompt) for t in self._queue)
            refusal = queued_tokens_error(queued, len(task.prompt), self.config.max_queued_prompt_tokens)
            if refusal is not None:
                raise QueueFullError(refusal)
            self._queue.push(task)  # QueueFullError
            self._live[task.id] = task
            self._ended.pop(task.id, None)
            self._wake.notify()
        task.log.info("task_queued", prompt_tokens=len(task.prompt), queued=len(self._queue))

    def cancel(self, task_id: str, source: CancelSource = CancelSource.RPC) -> CancelOutcome:
        """Cancel by id (the Cancel RPC)."""
        with self._lock:
            task = self._live.get(task_id)
            if task is None:
                self._prune_ended_locked(time.monotonic())
                known = task_id in self._ended
                return CancelOutcome.ALREADY_FINISHED if known else CancelOutcome.NOT_FOUND
        return self.cancel_task(task, source)

    def cancel_task(self, task: Task, source: CancelSource) -> CancelOutcome:
        """Cancel this very task (its own caller went away, or by id). Touches nothing else.

        A queued task leaves the queue and ends at once; a running one stops at the next step."""
        with self._lock:
            was_queued = self._queue.remove(task)
            if was_queued:
                task.request_cancel(source)
                self._record_end_locked(task)
        if was_queued:
            now = time.perf_counter()
            usage = Usage(prompt_tokens=len(task.prompt))
            task.end(FinishedEvent(FinishReason.CANCELLED, usage, Timings(queue_ms=(now - task.received_at) * 1e3)))
            task.log.info("task_cancelled", where="queue", source=source.value)
            return CancelOutcome.CANCELLED
        if task.request_cancel(source):
            with self._lock:
                self._wake.notify()
            task.log.info("task_cancel_requested", source=source.value)
            return CancelOutcome.CANCELLED
        return CancelOutcome.ALREADY_FINISHED

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                self._snapshot, self._counters.copy(), len(self._queue), self._store_snapshot, self._memory_usage
            )

    def close(self) -> None:
        """Stop accepting tasks; queued and running ones go on (graceful drain)."""
        with self._lock:
            self._closed = True

    def idle(self) -> bool:
        with self._lock:
            return not self._live

    def shutdown(self, timeout: float = 10.0) -> None:
        """Cancel everything still queued or running and stop the thread."""
        self.close()
        with self._lock:
            live = list(self._live.values())
        for task in live:
            self.cancel_task(task, CancelSource.SHUTDOWN)
        with self._lock:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the engine thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        log.info("engine_started", slots=self.config.n_slots, n_ctx=self.config.n_ctx)
        while True:
            with self._lock:
                while not self._stopping and not len(self._queue) and not self._busy():
                    self._wake.wait()
                if self._stopping:
                    break
            try:
                self._iteration()
            except Exception as exc:  # a bug in the engine itself: fail what runs, keep serving
                log.exception("engine_iteration_failed")
                self._recover(f"internal engine error: {exc}")
            if self._checker is not None:
                self._check_invariants(self._checker)
            self._publish()
        for slot in self.slots:
            if slot.run is not None:
                self._finish(slot.run, FinishReason.CANCELLED)
        self._publish()
        log.info("engine_stopped")

    def _check_invariants(self, checker: InvariantChecker) -> None:
        report = checker.report
        before = report.violations
        try:
            for slot in self.slots:
                checker.check_slot(slot.index, slot.tokens, slot.memory, slot.checkpoints)
            for entry in self.store.entries():
                checker.check_entry(entry.key, entry.tokens, entry.checkpoints)
        except Exception:  # a checker that cannot check counts as a failed check
            log.exception("invariant_check_failed")
            report.violations += 1
        if report.violations > before:
            log.error("invariant_violated", violations=report.violations, first=report.messages[:3])
        with self._lock:
            self._counters.invariant_checks = report.checks
            self._counters.invariant_violations = report.violations

    def _busy(self) -> bool:
        return any(slot.run is not None for slot in self.slots)

    def _iteration(self) -> None:
        admitted = self._admit()
        if admitted:
            self._publish()
        for run in admitted:
            run.task.emit(
                AcceptedEvent(
                    task_id=run.task.id,
                    slot_index=run.slot.index,
                    prompt_tokens=len(run.prompt),
                    reused_tokens=run.plan.resume,
                    reuse_source=run.plan.source,
                    matched_tokens=run.plan.matched,
                    reprocess_reason=run.plan.reason or "",
                )
            )
            if run.first_logits is not None and not run.task.cancelled:  # resumed at the prompt end: logits stored
                logits, run.first_logits = run.first_logits, None
                run.prompt_done_at = time.perf_counter()
                self._sample_or_fail(run, logits.copy(), run.prompt_done_at)
        for slot in self.slots:
            if slot.run is not None and slot.run.task.cancelled:
                self._end_cancelled(slot.run)
        if self._busy():
            self._step()

    def _admit(self) -> list[_Run]:
        free = [slot for slot in self.slots if slot.run is None]
        if not free:
            return []
        with self._lock:
            queued = list(self._queue)
            store = self.store.candidates() if self.store.enabled else []
            plan = plan_admissions([(t.prompt, t.cache_prompt) for t in queued], [s.candidate() for s in free], store)
            tasks = [self._queue.pop() for _ in plan]
            for task in tasks:
                task.state = TaskState.RUNNING
        now = time.perf_counter()
        # hold the planned store entries first: stashing a slot for one admission may evict them
        entries = {a.store_key: self.store.get(a.store_key) for a in plan if a.store_key is not None}
        admitted: list[_Run] = []
        for task, a in zip(tasks, plan):
            try:
                entry = entries.get(a.store_key) if a.store_key is not None else None
                admitted.append(self._start(task, self.slots[a.slot], a, entry, now))
            except Exception as exc:  # a bug preparing this slot: fail this task alone, reset the slot
                task.log.exception("admission_failed", slot=a.slot)
                self._reset_slot(self.slots[a.slot])
                with self._lock:
                    self._record_end_locked(task)
                task.end(FailedEvent(f"internal engine error while preparing the slot: {exc}"))
        for run in admitted:
            run.task.log.info(
                "task_admitted",
                slot=run.slot.index,
                prompt_tokens=len(run.prompt),
                matched=run.plan.matched,
                reused=run.plan.resume,
                source=run.plan.source.value,
                restored=run.plan.restore,
                reason=run.plan.reason,
                checkpoints_planned=len(run.schedule),
                queue_ms=round((run.admitted_at - run.task.received_at) * 1e3, 1),
            )
        return admitted

    def _start(self, task: Task, slot: Slot, admission: Admission, entry: StoredSequence | None, now: float) -> _Run:
        """Prepare the slot's memory for the task's resume point (from `entry`, the planned store
        entry, if any) and create its run."""
        plan = admission.plan
        if entry is not None:
            if common_prefix_len(slot.tokens, task.prompt) < slot.last_prompt_len:
                self._stash(slot)
            first_logits = self._load_from_store(slot, entry, plan)
        else:
            if self.store.enabled and task.cache_prompt:
                # the slot loses more than its last generation: keep that state for later
                if plan.resume < len(slot.tokens) and plan.matched < slot.last_prompt_len:
                    self._stash(slot)
                if plan.reprocessed or plan.resume == 0:  # the store had nothing better either
                    self._count(prefix_store_misses=1)
            first_logits = self._apply_plan(slot, plan)
        with self._lock:
            c = self._counters
            c.prompt_tokens_received += len(task.prompt)
            c.prompt_tokens_reused += plan.resume
            if plan.resume == 0 and plan.reason is not None:
                c.full_reprocess_by_reason[plan.reason] = c.full_reprocess_by_reason.get(plan.reason, 0) + 1
            if plan.reprocessed and plan.reason is not None:
                by = c.reprocessed_tokens_by_reason
                by[plan.reason] = by.get(plan.reason, 0) + plan.reprocessed
        assert slot.consistent() and len(slot.tokens) == plan.resume
        slot.last_prompt_len = len(task.prompt)
        self._admissions += 1
        schedule: list[tuple[int, CheckpointKind]] = []
        if task.cache_prompt:
            schedule = checkpoint_schedule(
                plan.resume,
                len(task.prompt),
                slot.kind,
                task.message_boundaries,
                task.checkpoint_offsets,
                self.config.checkpoint_interval,
            )
        run = _Run(
            task=task,
            slot=slot,
            plan=plan,
            seq=self._admissions,
            admitted_at=now,
            text=_StopText(self.tokenizer, task.stop.stop_strings),
            rng=np.random.default_rng(task.params.seed),
            pos=plan.resume,
            history=list(task.prompt),
            schedule=deque(schedule),
            first_logits=first_logits,
        )
        slot.run = run
        return run

    def _apply_plan(self, slot: Slot, plan: ResumePlan) -> np.ndarray | None:
        """Bring a slot to the plan's resume point (I2: checkpoints and kept inputs past it go).
        Returns the logits to sample from when the plan resumes at the prompt end."""
        dropped = slot.checkpoints.drop_after(plan.resume)
        slot.log.drop_after(plan.resume)
        self._count(checkpoints_invalidated=len(dropped))
        tokens = list(slot.tokens)
        if plan.restore is None:
            slot.truncate(plan.replay_from if plan.replay_from is not None else plan.resume)
            cp = None
        else:
            cp = slot.checkpoints.get(plan.restore)
            assert cp is not None, "the plan restores a checkpoint the slot has"
            slot.restore(cp)
            self._count(restores=1)
        if plan.replay_from is not None:
            self._count(replays=1, replayed_tokens=slot.replay(self.arch, tokens, plan.resume))
        return cp.logits if cp is not None and plan.from_logits else None

    def _load_from_store(self, slot: Slot, entry: StoredSequence, plan: ResumePlan) -> np.ndarray | None:
        cp = entry.checkpoints.get(plan.restore) if plan.restore is not None else None
        dropped = slot.checkpoints.clear()
        if plan.replay_from is None:
            slot.load(entry, plan.resume, cp)
        else:
            slot.load_for_replay(entry, plan.replay_from, cp, plan.resume)
            self._count(replays=1, replayed_tokens=slot.replay(self.arch, entry.tokens, plan.resume))
        if plan.resume == len(entry.tokens):  # the slot now holds all of it
            self.store.discard(entry.key)
        self._count(checkpoints_invalidated=len(dropped), restores=1, prefix_store_hits=1)
        return cp.logits if cp is not None and plan.from_logits else None

    def _stash(self, slot: Slot) -> None:
        """Copy a slot's whole state (memory + checkpoints) to the prefix store before it is overwritten."""
        if not self.store.enabled or not slot.tokens:
            return
        entry = StoredSequence(
            tuple(slot.tokens),
            slot.memory.export(),
            # host copies: a GPU slot's checkpoints hold device states
            CheckpointList([cp.with_snapshot(slot.memory.host_snapshot(cp.snapshot)) for cp in slot.checkpoints]),
            0 if slot.memory.truncatable else len(slot.tokens),  # the image keeps only the end's state
            slot.log.up_to(len(slot.tokens)),
        )
        stored, evicted = self.store.put(entry)
        self._count(prefix_store_evicted=evicted)
        log.info("slot_stashed", slot=slot.index, tokens=len(entry.tokens), bytes=entry.nbytes, stored=stored)

    def _take_checkpoint(self, run: _Run, kind: CheckpointKind, logits: np.ndarray | None) -> None:
        slot = run.slot
        keep = logits.copy() if logits is not None and kind is CheckpointKind.PROMPT_END else None
        slot.checkpoints.add(Checkpoint(run.pos, kind, slot.memory.snapshot(), keep, run.seq))
        with self._lock:
            self._counters.checkpoints_created += 1
            self._enforce_checkpoint_budget()

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, n in deltas.items():
                setattr(self._counters, name, getattr(self._counters, name) + n)

    def _enforce_checkpoint_budget(self) -> None:
        items = [
            EvictionCandidate(slot.index, cp.position, cp.kind, cp.nbytes, cp.turn)
            for slot in self.slots
            for cp in slot.checkpoints
        ]
        for victim in choose_evictions(items, self.config.checkpoint_memory):
            self.slots[victim.owner].checkpoints.remove(victim.position)
            self._counters.checkpoints_evicted += 1

    def _enforce_log_budget(self) -> None:
        blocks: list[LogBlockView] = [v for slot in self.slots for v in slot.log.views(slot.index)]
        if sum(b.nbytes for b in blocks) <= self.config.replay_memory:
            return
        checkpoints = {slot.index: [cp.position for cp in slot.checkpoints] for slot in self.slots}
        victims = choose_log_evictions(blocks, checkpoints, self.config.replay_memory)
        for victim in victims:
            kept = self.slots[victim.owner].log
            block = kept.find(victim.start)
            if block is not None:
                kept.remove(block)
        self._count(input_blocks_evicted=len(victims))

    def _step(self) -> None:
        busy = [slot for slot in self.slots if slot.run is not None]
        work = [
            SlotWork(s.index, s.run.decoding, s.run.prompt_step_limit(), s.run.seq) for s in busy if s.run is not None
        ]
        items = compose_batch(work, self.config.prompt_chunk)
        segments: list[Segment] = []
        for item in items:
            slot = self.slots[item.index]
            run = slot.run
            assert run is not None
            if item.decode:
                assert run.next_token is not None
                tokens = np.array([run.next_token], dtype=np.int32)
                want = Logits.LAST
            else:
                end = run.pos + item.n_tokens
                tokens = np.asarray(run.prompt[run.pos : end], dtype=np.int32)
                want = Logits.LAST if end == len(run.prompt) else Logits.NONE
            keep = self.config.replay_memory > 0 and slot.kind.needs_checkpoints and run.task.cache_prompt
            segments.append(Segment(slot.memory, tokens, want, {} if keep else None))
        # Only a batch of one task may stop mid-forward: other tasks' rows must go on untouched.
        only = self.slots[items[0].index].run if len(items) == 1 else None
        try:
            outputs = self.arch.forward(segments, only.task.cancel_flag.native if only else None)
        except ForwardCancelled:
            # nothing advanced: the slot still holds exactly its tokens; the next iteration ends the task
            log.info("forward_cancelled", slot=items[0].index)
            return
        except Exception as exc:
            # forward advances no memory when it raises: every slot still holds exactly its tokens
            log.exception("forward_failed", slots=[item.index for item in items])
            for item in items:
                run = self.slots[item.index].run
                if run is not None:
                    self._fail(run, f"model evaluation failed: {type(exc).__name__}: {exc}")
            return
        now = time.perf_counter()
        for item, segment, logits in zip(items, segments, outputs):
            slot = self.slots[item.index]
            run = slot.run
            assert run is not None
            if segment.inputs is not None:
                slot.log.record(slot.memory.n_tokens - len(segment.tokens), segment.inputs, run.seq)
            slot.commit(segment.tokens.tolist())
            if item.decode:
                run.next_token = None
            else:
                run.pos += item.n_tokens
                run.processed += item.n_tokens
                with self._lock:
                    self._counters.prompt_tokens_processed += item.n_tokens
                if run.pos == len(run.prompt):
                    run.prompt_done_at = now
                if run.schedule and run.schedule[0][0] == run.pos:  # committed: its state is complete (I3)
                    self._take_checkpoint(run, run.schedule.popleft()[1], logits)
            if logits is not None and not run.task.cancelled:  # a cancelled task samples nothing more
                self._sample_or_fail(run, logits, now)
        if any(segment.inputs for segment in segments):
            self._enforce_log_budget()

    def _sample_or_fail(self, run: _Run, logits: np.ndarray, now: float) -> None:
        try:
            self._on_logits(run, logits, now)
        except Exception as exc:  # sampling/decoding bug for this task: fail it alone
            run.task.log.exception("sampling_failed")
            self._fail(run, f"sampling failed: {type(exc).__name__}: {exc}")

    def _on_logits(self, run: _Run, logits: np.ndarray, now: float) -> None:
        task, stop = run.task, run.task.stop
        logprob = self._logprob(run, logits) if task.logprobs or task.top_logprobs else None
        token = sample(logits, run.history, task.params, run.rng)
        if logprob is not None:
            lp, top = logprob
            logprob_entry: tuple[TokenLogprob, ...] = (TokenLogprob(token, float(lp[token]), top),)
        else:
            logprob_entry = ()
        run.history.append(token)
        run.generated.append(token)
        if run.first_token_at is None:
            run.first_token_at = now
        run.last_token_at = now

        reason: FinishReason | None = None
        stop_string, stop_token, text = "", None, ""
        if token in stop.stop_token_ids:
            reason, stop_token = FinishReason.STOP_TOKEN, token
        elif self.tokenizer.is_eog(token):
            if not stop.ignore_eos:
                reason, stop_token = FinishReason.EOS, token
            # an ignored end-of-generation token contributes no text either
        else:
            text, hit = run.text.push(token)
            if hit is not None:
                reason, stop_string = FinishReason.STOP_STRING, hit
        if reason is None:
            if len(run.generated) >= stop.max_tokens:
                reason = FinishReason.MAX_TOKENS
            elif len(run.prompt) + len(run.generated) >= self.config.n_ctx:
                reason = FinishReason.CONTEXT_FULL  # prompt + completion must fit in the context
        if reason is not None and reason is not FinishReason.STOP_STRING:
            text += run.text.finish()
        task.emit(DeltaEvent((token,), text, logprob_entry))
        if reason is None:
            run.next_token = token
        else:
            self._finish(run, reason, stop_string=stop_string, stop_token_id=stop_token)

    def _logprob(self, run: _Run, logits: np.ndarray) -> tuple[np.ndarray, tuple[tuple[int, float], ...]]:
        """Log-probabilities after penalties, before temperature/top-k/top-p/min-p (see the proto)."""
        lp = log_softmax(apply_penalties(logits, run.history, run.task.params))
        k = min(run.task.top_logprobs, len(lp))
        if k <= 0:
            return lp, ()
        idx = np.argpartition(-lp, k - 1)[:k]
        idx = idx[np.lexsort((idx, -lp[idx]))]
        return lp, tuple((int(i), float(lp[i])) for i in idx)

    def _end_cancelled(self, run: _Run) -> None:
        tail = run.text.finish()
        if tail:
            run.task.emit(DeltaEvent((), tail))
        self._finish(run, FinishReason.CANCELLED)

    def _finish(self, run: _Run, reason: FinishReason, stop_string: str = "", stop_token_id: int | None = None) -> None:
        now = time.perf_counter()
        self._release(run)
        usage, timings = run.usage(), run.timings(now)
        event = FinishedEvent(reason, usage, timings, stop_string=stop_string, stop_token_id=stop_token_id)
        run.task.end(event)
        run.task.log.info(
            "task_finished",
            reason=reason.value,
            slot=run.slot.index,
            prompt_tokens=usage.prompt_tokens,
            reused=usage.cached_prompt_tokens,
            processed=usage.processed_prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=len(run.slot.tokens),
            prompt_ms=round(timings.prompt_ms, 1),
            generation_ms=round(timings.generation_ms, 1),
        )

    def _fail(self, run: _Run, message: str) -> None:
        self._release(run)
        run.task.end(FailedEvent(message))
        run.task.log.error("task_failed", message=message, slot=run.slot.index)

    def _release(self, run: _Run) -> None:
        """Free the slot (it keeps its memory and tokens) and move the task to the ended list."""
        slot = run.slot
        slot.run = None
        slot.last_used = self._admissions
        with self._lock:
            self._record_end_locked(run.task)

    def _recover(self, message: str) -> None:
        """After an unexpected engine error: fail every running task and reset any slot whose
        bookkeeping may have lost track of its memory."""
        for slot in self.slots:
            if slot.run is not None:
                self._fail(slot.run, message)
            if not slot.consistent():
                self._reset_slot(slot)

    def _reset_slot(self, slot: Slot) -> None:
        """Forget everything a slot holds (when its bookkeeping may have lost track of its memory)."""
        log.warning("slot_reset", slot=slot.index, tokens=len(slot.tokens), memory=slot.memory.n_tokens)
        slot.memory.truncate(0)
        slot.tokens.clear()
        slot.log.clear()
        self._count(checkpoints_invalidated=len(slot.checkpoints.clear()))

    # --- bookkeeping -----------------------------------------------------------------------------

    def _record_end_locked(self, task: Task) -> None:
        if self._live.get(task.id) is task:
            del self._live[task.id]
        now = time.monotonic()
        self._ended[task.id] = now
        self._ended.move_to_end(task.id)
        self._prune_ended_locked(now)

    def _prune_ended_locked(self, now: float) -> None:
        horizon = now - self.config.ended_task_retention_s
        while self._ended:
            task_id, at = next(iter(self._ended.items()))
            if at >= horizon and len(self._ended) <= self.config.ended_task_max:
                break
            del self._ended[task_id]

    def _take_snapshot(self) -> tuple[SlotSnapshot, ...]:
        out = []
        for slot in self.slots:
            run = slot.run
            if run is None:
                state, task_id = SlotState.IDLE, ""
            elif run.pos < len(run.prompt):
                state, task_id = SlotState.PROCESSING_PROMPT, run.task.id
            else:
                state, task_id = SlotState.GENERATING, run.task.id
            checkpoints = tuple(
                CheckpointInfo(cp.position, cp.kind, cp.nbytes, cp.logits is not None) for cp in slot.checkpoints
            )
            out.append(SlotSnapshot(slot.index, state, task_id, len(slot.tokens), checkpoints))
        return tuple(out)

    def _memory(self) -> MemoryUsage:
        host = self.store.bytes + sum(s.memory.host_bytes + s.checkpoints.nbytes + s.log.nbytes for s in self.slots)
        device = sum(s.memory.device_bytes + s.checkpoints.device_nbytes for s in self.slots)
        return MemoryUsage(device, host - sum(s.checkpoints.device_nbytes for s in self.slots))

    def _publish(self) -> None:
        snapshot = self._take_snapshot()
        store = StoreSnapshot(len(self.store), self.store.bytes, self.store.budget)
        memory = self._memory()
        with self._lock:
            self._snapshot = snapshot
            self._store_snapshot = store
            self._memory_usage = memory
