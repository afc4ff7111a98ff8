"""TaskRun's bounded event queue: a consumer that stops reading gets its task cancelled (the slot
goes to the next task) and a StreamStalledError; one that reads gets every event. The real engine
thread runs over the fake architecture of fake_model.py (no model file)."""

from __future__ import annotations

import asyncio
import time

from fake_model import FakeArch, FakeTokenizer

from hyserve.api.tasks import StreamStalledError, TaskRun
from hyserve.api.validation import PreparedRequest
from hyserve.engine.engine import Engine, EngineConfig
from hyserve.engine.generator import StopRule
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.task import DeltaEvent, FinishedEvent, FinishReason

MAX_PENDING = 8
N_TOKENS = 100


def _prepared(task_id: str) -> PreparedRequest:
    return PreparedRequest(
        task_id=task_id,
        prompt=(3, 4, 5),
        params=SamplingParams(),
        stop=StopRule(max_tokens=N_TOKENS),
        logprobs=False,
        top_logprobs=0,
        cache_prompt=True,
        message_boundaries=(),
        checkpoint_offsets=(),
    )


async def _scenario(engine: Engine) -> None:
    mute = TaskRun(engine, _prepared("mute"), max_pending=MAX_PENDING)
    mute.submit()
    for _ in range(1000):  # nobody reads: the queue fills and the task is cancelled
        if mute.task.ended:
            break
        await asyncio.sleep(0.01)
    assert mute.task.ended and mute.task.cancelled
    try:
        async for _ in mute.events():
            raise AssertionError("a stalled stream delivers no more events")
    except StreamStalledError as exc:
        assert f"{MAX_PENDING} events were waiting" in str(exc)
    else:
        raise AssertionError("no StreamStalledError")

    # the next task gets the freed slot; its consumer reads, so it never has 32 events (0.3 s) waiting
    engine.arch.delay = 0.01  # type: ignore[attr-defined]
    reader = TaskRun(engine, _prepared("reader"), max_pending=32)
    reader.submit()
    events = [event async for event in reader.events()]
    assert sum(len(e.token_ids) for e in events if isinstance(e, DeltaEvent)) == N_TOKENS
    assert isinstance(events[-1], FinishedEvent) and events[-1].reason is FinishReason.MAX_TOKENS


def test_a_consumer_that_stops_reading_is_cancelled_and_one_that_reads_is_not() -> None:
    arch = FakeArch()
    arch.delay = 0.002
    engine = Engine(arch, FakeTokenizer(), EngineConfig(n_slots=1, n_ctx=512))  # type: ignore[arg-type]
    engine.start()
    try:
        asyncio.run(_scenario(engine))
        for _ in range(500):  # the slot snapshot is published after the engine's iteration
            if engine.idle() and not any(s.task_id for s in engine.stats().slots):
                break
            time.sleep(0.01)
        assert engine.idle() and not any(s.task_id for s in engine.stats().slots)
    finally:
        engine.shutdown()
