"""Ask an in-process engine for one answer and collect its events: what it accepted the prompt
with (reuse, tier), the tokens, how it finished."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

from hyserve.engine.engine import Engine
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.stop import StopRule
from hyserve.engine.task import AcceptedEvent, DeltaEvent, FailedEvent, FinishedEvent, Task

__all__ = ["Answer", "ask"]

GUARD_S = 120.0  # only against a hang

_ids = count()


@dataclass
class Answer:
    accepted: AcceptedEvent
    tokens: list[int]
    finished: FinishedEvent


def ask(engine: Engine, prompt: Sequence[int], n: int = 5) -> Answer:
    """Greedy `n` tokens for `prompt` (end of sequence ignored); a failed task fails the test."""
    events: queue.Queue[object] = queue.Queue()
    task = Task(
        id=f"ask{next(_ids)}",
        prompt=tuple(prompt),
        params=SamplingParams(),
        stop=StopRule(max_tokens=n, ignore_eos=True),
        sink=events.put,
    )
    engine.submit(task)
    accepted, tokens = None, []
    while True:
        event = events.get(timeout=GUARD_S)
        if isinstance(event, AcceptedEvent):
            accepted = event
        elif isinstance(event, DeltaEvent):
            tokens += event.token_ids
        elif isinstance(event, FailedEvent):
            raise AssertionError(f"task failed: {event.message}")
        elif isinstance(event, FinishedEvent):
            assert accepted is not None
            return Answer(accepted, tokens, event)
