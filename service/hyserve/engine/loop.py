"""The engine thread: admission, forward steps, sampling and the end of each task.

Each iteration:
1. admit queued tasks to free slots (FIFO; cache_plan decides the slot, the resume point and
   whether a prefix-store entry or a checkpoint is restored), prepare the slot's memory and send
   Accepted;
2. end running tasks whose cancel flag is set (the slot keeps what it has evaluated so far);
3. run one `arch.forward` for all busy slots: one token per generating slot plus prompt chunks;
4. commit the evaluated tokens to each slot's token list, take the checkpoints that fall on the
   new position (prompt chunks are cut at checkpoint positions), sample where logits came back,
   apply the stop rules and send the events.

Invariants (ARCHITECTURE.md): I1 (slot.py) a slot's tokens equal what its memory holds. I2:
checkpoints and kept inputs past a slot's new resume point are dropped before it is processed.
I3: a checkpoint is made, and a forward's kept inputs recorded, only after that forward has been
committed. A sampled token is only added to memory when it is evaluated in the next step: when a
task stops on it, the slot holds prompt + completion[:-1].
"""

from __future__ import annotations

import os
import time
from collections import deque

import hyserve_kernels
import numpy as np
import structlog

from hyserve.engine.admission_take import take_admissions
from hyserve.engine.cache_plan import (
    Admission,
    CheckpointKind,
    EvictionCandidate,
    LogBlockView,
    ResumePlan,
    choose_evictions,
    choose_log_evictions,
)
from hyserve.engine.checkpoints import Checkpoint
from hyserve.engine.config import EngineConfig
from hyserve.engine.constraints import ConstraintViolation, TokenMatcher, background_masks
from hyserve.engine.guards import InvariantError, require
from hyserve.engine.invariants import InvariantChecker
from hyserve.engine.prefix_store import StoredSequence
from hyserve.engine.scheduler import SlotWork, compose_batch
from hyserve.engine.shared import Shared
from hyserve.engine.slot import Run, Slot
from hyserve.engine.spec_step import SpecStep
from hyserve.engine.stash import StateStash
from hyserve.engine.stats import StoreSnapshot, memory_usage, slot_snapshots
from hyserve.engine.stop import StopCheck, StopDecision
from hyserve.engine.task import (
    AcceptedEvent,
    DeltaEvent,
    FailedEvent,
    FinishedEvent,
    FinishReason,
    Task,
)
from hyserve.engine.token_step import greedy_token_suffices, take_token
from hyserve.model.architectures.base import Architecture, ForwardCancelled, Logits, Segment
from hyserve.model.memory import SequenceMemory
from hyserve.model.tokenizer import Tokenizer

__all__ = ["EngineLoop"]

log = structlog.get_logger(__name__)


class EngineLoop:
    """Owns the slots and the prefix store; only the engine thread calls into it."""

    def __init__(self, arch: Architecture, tokenizer: Tokenizer, config: EngineConfig, shared: Shared) -> None:
        self.arch = arch
        self.tokenizer = tokenizer
        self.config = config
        self.shared = shared
        self.slots = [Slot(i, self._new_memory()) for i in range(config.n_slots)]
        self.stash = StateStash(arch, config, shared)
        self.store = self.stash.store
        self._admissions = 0
        self._checker = InvariantChecker(arch, config.n_ctx) if config.check_invariants else None
        self._spec = SpecStep(arch, config, shared, tokenizer.is_eog, self._after_token, self._sampling_error)
        shared.snapshot = slot_snapshots(self.slots)
        shared.store_snapshot = StoreSnapshot(0, 0, self.store.budget)
        shared.resume_costs = self.stash.rates.costs()  # pinned rates price from the start

    def _new_memory(self) -> SequenceMemory:
        memory = self.arch.new_memory(self.config.n_ctx)
        if self.config.window_ring:
            memory.use_window_rings(self.arch.sliding_windows(), self.config.prompt_chunk)
        return memory

    def run(self) -> None:
        """The engine thread's body: iterate while there is work, until `shared.stopping`."""
        log.info("engine_started", slots=self.config.n_slots, n_ctx=self.config.n_ctx)
        while True:
            with self.shared.lock:
                while not self.shared.stopping and not len(self.shared.queue) and not self._busy():
                    self.shared.parked = True
                    self.shared.wake.wait()
                self.shared.parked = False
                if self.shared.stopping:
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
        self.stash.close(self.slots)
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
        with self.shared.lock:
            self.shared.counters.invariant_checks = report.checks
            self.shared.counters.invariant_violations = report.violations

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
                    store_tier=self.stash.tier_served(run.slot.index, run.plan.source),
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

    def _admit(self) -> list[Run]:
        taken = take_admissions(self.shared, self.stash, self.slots, self.config.checkpoint_interval)
        now = time.perf_counter()
        admitted: list[Run] = []
        for task, a, entry in ((t.task, t.admission, t.entry) for t in taken):
            try:
                admitted.append(self._start(task, self.slots[a.slot], a, entry, now))
            except Exception as exc:  # a bug preparing this slot: fail this task alone, reset the slot
                task.log.exception("admission_failed", slot=a.slot)
                self._reset_slot(self.slots[a.slot])
                with self.shared.lock:
                    self.shared.record_end_locked(task)
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

    def _start(self, task: Task, slot: Slot, admission: Admission, entry: StoredSequence | None, now: float) -> Run:
        """Prepare the slot's memory for the task's resume point (from `entry`, the planned store
        entry, if any) and create its run."""
        plan = admission.plan
        # first: a grammar that cannot start fails the task before the slot is touched
        matcher = TokenMatcher(task.grammar, self._background_masks()) if task.grammar is not None else None
        if admission.stash:
            self.stash.put(slot)
        if entry is not None:
            first_logits = self.stash.load(slot, entry, plan)
            if admission.discard_entry and entry.key >= 0:  # the slot now holds all of it (disk files stay)
                self.store.discard(entry.key)
        else:
            if admission.store_miss:
                self.shared.count(prefix_store_misses=1)
            if admission.passed_over is not None:
                self.shared.count_tier(admission.passed_over, passed_over=1)
            first_logits = self._apply_plan(slot, plan)
        with self.shared.lock:
            c = self.shared.counters
            c.prompt_tokens_received += len(task.prompt)
            c.prompt_tokens_reused += plan.resume
            if plan.resume == 0 and plan.reason is not None:
                c.full_reprocess_by_reason[plan.reason] = c.full_reprocess_by_reason.get(plan.reason, 0) + 1
            if plan.reprocessed and plan.reason is not None:
                by = c.reprocessed_tokens_by_reason
                by[plan.reason] = by.get(plan.reason, 0) + plan.reprocessed
        require(slot.consistent(), f"slot {slot.index}: tokens and memory disagree after admission (I1)")
        require(len(slot.tokens) == plan.resume, f"slot {slot.index}: {len(slot.tokens)} tokens, {plan.resume} planned")
        # a run with the whole prompt in memory samples from stored logits; without them it would wait forever
        require(
            plan.resume < len(task.prompt) or first_logits is not None,
            f"slot {slot.index}: no logits at the prompt end",
        )
        slot.last_prompt_len = len(task.prompt)
        self._admissions += 1
        run = Run(
            task=task,
            slot=slot,
            plan=plan,
            seq=self._admissions,
            admitted_at=now,
            stop=StopCheck(task.stop, self.tokenizer, len(task.prompt), self.config.n_ctx),
            rng=np.random.default_rng(task.params.seed),
            pos=plan.resume,
            history=list(task.prompt),
            schedule=deque(admission.checkpoints),
            first_logits=first_logits,
            matcher=matcher,
        )
        if matcher is not None:  # the first token's mask, computed while the prompt is evaluated
            matcher.start_mask()
        slot.run = run
        return run

    def _background_masks(self) -> bool:
        cpus = os.cpu_count() or 1
        return background_masks(self.config.constraint_masks, self.arch.ops.name, hyserve_kernels.num_threads(), cpus)

    def _apply_plan(self, slot: Slot, plan: ResumePlan) -> np.ndarray | None:
        """Bring a slot to the plan's resume point (I2: checkpoints and kept inputs past it go).
        Returns the logits to sample from when the plan resumes at the prompt end."""
        dropped = slot.checkpoints.drop_after(plan.resume)
        slot.log.drop_after(plan.resume)
        self.shared.count(checkpoints_invalidated=len(dropped))
        tokens = list(slot.tokens)
        if plan.restore is None:
            slot.truncate(plan.replay_from if plan.replay_from is not None else plan.resume)
            cp = None
        else:
            cp = slot.checkpoints.get(plan.restore)
            if cp is None:
                raise InvariantError(f"slot {slot.index}: the plan restores a checkpoint at {plan.restore} it lacks")
            slot.restore(cp)
            self.shared.count(restores=1)
        if plan.replay_from is not None:
            self.shared.count(replays=1, replayed_tokens=slot.replay(self.arch, tokens, plan.resume))
        return cp.logits if cp is not None and plan.from_logits else None

    def _take_checkpoint(self, run: Run, kind: CheckpointKind, logits: np.ndarray | None) -> None:
        slot = run.slot
        keep = logits.copy() if logits is not None and kind is CheckpointKind.PROMPT_END else None
        slot.checkpoints.add(Checkpoint(run.pos, kind, slot.memory.snapshot(), keep, run.seq))
        with self.shared.lock:
            self.shared.counters.checkpoints_created += 1
            self._enforce_checkpoint_budget()

    def _count(self, **deltas: int) -> None:
        with self.shared.lock:
            for name, n in deltas.items():
                setattr(self.shared.counters, name, getattr(self.shared.counters, name) + n)

    def _enforce_checkpoint_budget(self) -> None:
        items = [
            EvictionCandidate(slot.index, cp.position, cp.kind, cp.nbytes, cp.turn)
            for slot in self.slots
            for cp in slot.checkpoints
        ]
        for victim in choose_evictions(items, self.config.checkpoint_memory):
            self.slots[victim.owner].checkpoints.remove(victim.position)
            self.shared.counters.checkpoints_evicted += 1

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
        self.shared.count(input_blocks_evicted=len(victims))

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
            if run is None:
                raise InvariantError(f"slot {slot.index}: batched without a run")
            keep = self.config.replay_memory > 0 and slot.kind.needs_checkpoints and run.task.cache_prompt
            if item.decode:
                if run.next_token is None:
                    raise InvariantError(f"slot {slot.index}: batched to decode without a sampled token")
                verifying = self._spec.segment(slot, run, keep)  # its token and a draft (spec_step.py)
                if verifying is not None:
                    segments.append(verifying)
                    continue
                tokens = np.array([run.next_token], dtype=np.int32)
                want = Logits.ARGMAX if greedy_token_suffices(run) else Logits.LAST
            else:
                end = run.pos + item.n_tokens
                tokens = np.asarray(run.prompt[run.pos : end], dtype=np.int32)
                want = Logits.LAST if end == len(run.prompt) else Logits.NONE
            segments.append(Segment(slot.memory, tokens, want, {} if keep else None))
        # Only a batch of one task may stop mid-forward: other tasks' rows must go on untouched.
        only = self.slots[items[0].index].run if len(items) == 1 else None
        started = time.perf_counter()
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
        if not all(item.decode for item in items):  # what a prompt token costs: the plan prices resumes with it
            self.stash.rates.prompt_forward(sum(len(segment.tokens) for segment in segments), now - started)
        for item, segment, logits in zip(items, segments, outputs):
            slot = self.slots[item.index]
            run = slot.run
            if run is None:
                raise InvariantError(f"slot {slot.index}: its run ended during the forward")
            if item.decode and self._spec.verifying(run):  # keeps the accepted part alone
                self._spec.verified(slot, run, segment, logits, now)
                continue
            if segment.inputs is not None:
                slot.log.record(slot.memory.n_tokens - len(segment.tokens), segment.inputs, run.seq)
            slot.commit(segment.tokens.tolist())
            if item.decode:
                run.next_token = None
            else:
                run.pos += item.n_tokens
                run.processed += item.n_tokens
                with self.shared.lock:
                    self.shared.counters.prompt_tokens_processed += item.n_tokens
                if run.pos == len(run.prompt):
                    run.prompt_done_at = now
                if run.schedule and run.schedule[0][0] == run.pos:  # committed: its state is complete (I3)
                    self._take_checkpoint(run, run.schedule.popleft()[1], logits)
            # a row asked for and not returned would leave its task waiting for a token forever
            require(
                logits is not None or segment.logits is Logits.NONE, f"slot {slot.index}: no output from the forward"
            )
            if logits is not None and not run.task.cancelled:  # a cancelled task samples nothing more
                greedy = int(logits[0]) if segment.logits is Logits.ARGMAX else None
                self._sample_or_fail(run, logits, now, greedy)
        if any(segment.inputs for segment in segments):
            self._enforce_log_budget()

    def _sample_or_fail(self, run: Run, logits: np.ndarray, now: float, greedy: int | None = None) -> None:
        try:
            token, decision = take_token(run, logits, now, self.tokenizer.is_eog, greedy)
            self._after_token(run, token, decision)
        except Exception as exc:
            self._sampling_error(run, exc)

    def _sampling_error(self, run: Run, exc: Exception) -> None:
        if isinstance(exc, ConstraintViolation):  # the grammar cannot go on (or is over its limits)
            run.task.log.warning("constraint_failed", error=str(exc))
            self._fail(run, f"constrained decoding failed: {exc}")
        else:  # sampling/decoding bug for this task: fail it alone
            run.task.log.error("sampling_failed", exc_info=exc)
            self._fail(run, f"sampling failed: {type(exc).__name__}: {exc}")

    def _after_token(self, run: Run, token: int, decision: StopDecision) -> None:
        if decision.reason is None:
            run.next_token = token
        else:
            self._finish(run, decision.reason, decision.stop_string, decision.stop_token_id)

    def _end_cancelled(self, run: Run) -> None:
        tail = run.stop.finish()
        if tail:
            run.task.emit(DeltaEvent((), tail))
        self._finish(run, FinishReason.CANCELLED)

    def _finish(self, run: Run, reason: FinishReason, stop_string: str = "", stop_token_id: int | None = None) -> None:
        now = time.perf_counter()
        self._release(run)
        self.stash.finished(run.slot)
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

    def _fail(self, run: Run, message: str) -> None:
        self._release(run)
        run.task.end(FailedEvent(message))
        run.task.log.error("task_failed", message=message, slot=run.slot.index)

    def _release(self, run: Run) -> None:
        """Free the slot (it keeps its memory and tokens) and move the task to the ended list."""
        slot = run.slot
        slot.run = None
        slot.last_used = self._admissions
        with self.shared.lock:
            self.shared.record_end_locked(run.task)

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
        self.shared.count(checkpoints_invalidated=len(slot.checkpoints.clear()))

    def _publish(self) -> None:
        snapshot = slot_snapshots(self.slots)
        store = StoreSnapshot(len(self.store), self.store.bytes, self.store.budget)
        memory = memory_usage(self.slots, self.store)
        costs = self.stash.rates.costs()
        with self.shared.lock:
            self.shared.snapshot = snapshot
            self.shared.store_snapshot = store
            self.shared.memory_usage = memory
            self.shared.resume_costs = costs
