"""A task: one Generate request as the engine sees it, and the events it sends back.

A task is created by the API side with its prompt tokens, sampling parameters and stop rule, its
own cancel flag and an event sink (a thread-safe callable; the servicer's sink hands each event to
the asyncio loop). It ends exactly once: finished (any FinishReason, CANCELLED included) or failed.
Ending is guarded by the task's lock, so a Cancel racing with a natural finish has one outcome:
a cancel that was registered before the end turns the end into FINISH_REASON_CANCELLED, and a
cancel that comes after it answers "already finished".

The stop rules (FinishReason, StopRule and how tokens end a generation) are in stop.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

import structlog

from hyserve.engine.cache_plan import ReuseSource
from hyserve.engine.cancel import CancelFlag
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.stop import FinishReason, StopRule

if TYPE_CHECKING:  # the API side compiles grammars; a task only carries one
    from hyserve.engine.constraints import CompiledGrammar

log = structlog.get_logger(__name__)

__all__ = [
    "AcceptedEvent",
    "DeltaEvent",
    "Event",
    "FailedEvent",
    "FinishReason",
    "FinishedEvent",
    "ReuseSource",
    "StopRule",
    "Task",
    "TaskState",
    "Timings",
    "TokenLogprob",
    "Usage",
    "new_task_id",
]


class TaskState(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"


# --- events (engine -> API) ----------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptedEvent:
    task_id: str
    slot_index: int
    prompt_tokens: int
    reused_tokens: int
    reuse_source: ReuseSource
    matched_tokens: int
    reprocess_reason: str = ""  # why matched tokens are evaluated again (cache_plan's reason)
    store_tier: str = ""  # with reuse_source PREFIX_STORE: memory, disk or shared (stats.STORE_TIERS)


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass(frozen=True)
class DeltaEvent:
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    processed_prompt_tokens: int = 0
    completion_tokens: int = 0
    draft_tokens: int = 0  # tokens speculative decoding drafted for this task
    accepted_draft_tokens: int = 0  # drafted tokens the model's own sampling agreed with (emitted)


@dataclass(frozen=True)
class Timings:
    queue_ms: float = 0.0
    prompt_ms: float = 0.0
    generation_ms: float = 0.0
    time_to_first_token_ms: float = 0.0


@dataclass(frozen=True)
class FinishedEvent:
    reason: FinishReason
    usage: Usage
    timings: Timings
    stop_string: str = ""
    stop_token_id: int | None = None


@dataclass(frozen=True)
class FailedEvent:
    """The task could not be completed (a model evaluation failed): the API answers INTERNAL."""

    message: str


Event = AcceptedEvent | DeltaEvent | FinishedEvent | FailedEvent
EventSink = Callable[[Event], None]


def new_task_id() -> str:
    return str(uuid.uuid4())


# --- the task ------------------------------------------------------------------------------------


@dataclass(eq=False)
class Task:
    """One request. Identity (not the id string) is what the engine tracks: `eq=False`."""

    id: str
    prompt: tuple[int, ...]
    params: SamplingParams
    stop: StopRule
    sink: EventSink
    logprobs: bool = False
    top_logprobs: int = 0
    cache_prompt: bool = True
    # token index where each chat message starts (for checkpoints; empty for text/token input)
    message_boundaries: tuple[int, ...] = ()
    checkpoint_offsets: tuple[int, ...] = ()
    # the output must match this (GrammarCompiler.compile, done before the task is submitted)
    grammar: CompiledGrammar | None = None
    # speculative decoding for this task: None takes the server's setting; max draft 0: the server's
    speculative: bool | None = None
    spec_max_draft: int = 0
    received_at: float = field(default_factory=time.perf_counter)
    cancel_flag: CancelFlag = field(default_factory=CancelFlag)
    state: TaskState = TaskState.QUEUED
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    log: Any = field(init=False, repr=False)  # structlog logger bound to task_id

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("a task needs at least one prompt token")
        self.log = log.bind(task_id=self.id)

    @property
    def ended(self) -> bool:
        return self.state is TaskState.ENDED

    @property
    def cancelled(self) -> bool:
        return self.cancel_flag.is_set()

    def request_cancel(self) -> bool:
        """Raise the cancel flag. False when the task has already ended (nothing changes)."""
        with self._lock:
            if self.state is TaskState.ENDED:
                return False
            self.cancel_flag.set()
            return True

    def emit(self, event: AcceptedEvent | DeltaEvent) -> None:
        """Send a non-final event (dropped once the task has ended)."""
        with self._lock:  # sending under the lock keeps events ordered and none after the end
            if self.state is not TaskState.ENDED:
                self._send(event)

    def end(self, event: FinishedEvent | FailedEvent) -> bool:
        """Send the final event; exactly once. Returns False (and sends nothing) if already ended.

        A finish that races with a registered cancel is reported as CANCELLED."""
        with self._lock:
            if self.state is TaskState.ENDED:
                return False
            self.state = TaskState.ENDED
            if (
                isinstance(event, FinishedEvent)
                and self.cancel_flag.is_set()
                and event.reason is not FinishReason.CANCELLED
            ):
                event = FinishedEvent(FinishReason.CANCELLED, event.usage, event.timings)
            self._send(event)
        return True

    def _send(self, event: Event) -> None:
        # the sink must not block (the servicer's hands the event to its asyncio loop)
        try:
            self.sink(event)
        except Exception:  # the receiving side is gone (e.g. its event loop closed): nothing to tell
            self.log.warning("event_dropped", event=type(event).__name__, exc_info=True)
