"""A Task's lifecycle: it ends exactly once, a cancel registered before its end wins, and each task
has its own cancel flag."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from hyserve.engine.generator import StopRule
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.task import DeltaEvent, Event, FailedEvent, FinishedEvent, FinishReason, Task, Timings, Usage


def _task(task_id: str = "t", prompt: Sequence[int] = (1, 2, 3), **kw: object) -> tuple[Task, list[Event]]:
    events: list[Event] = []
    stop = kw.pop("stop", StopRule(max_tokens=4))
    params = kw.pop("params", SamplingParams())
    task = Task(id=task_id, prompt=tuple(prompt), params=params, stop=stop, sink=events.append, **kw)  # type: ignore[arg-type]
    return task, events


def _finished(reason: FinishReason = FinishReason.MAX_TOKENS) -> FinishedEvent:
    return FinishedEvent(reason, Usage(), Timings())


def test_task_ends_exactly_once_and_drops_later_events() -> None:
    task, events = _task()
    assert task.end(_finished())
    assert not task.end(_finished(FinishReason.EOS))
    assert not task.end(FailedEvent("late"))
    task.emit(DeltaEvent((1,), "x"))
    assert events == [_finished()]
    assert task.ended and not task.request_cancel()


def test_task_cancel_registered_before_the_end_wins() -> None:
    task, events = _task()
    assert task.request_cancel()
    task.end(_finished(FinishReason.MAX_TOKENS))
    assert isinstance(events[-1], FinishedEvent) and events[-1].reason is FinishReason.CANCELLED


def test_task_needs_a_prompt_and_has_its_own_flag() -> None:
    with pytest.raises(ValueError):
        _task(prompt=())
    a, _ = _task("a")
    b, _ = _task("b")
    a.request_cancel()
    assert a.cancelled and not b.cancelled
