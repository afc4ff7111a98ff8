"""The engine loop over the fake model of fake_model.py: output equal to the reference, slot reuse,
cancels of queued and running tasks, batching, failures, stop rules, stats and shutdown."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

import pytest
from fake_model import FakeArch, FakeMemory, FakeTokenizer, reference

from hyserve.engine.engine import CancelOutcome, DuplicateTaskError, Engine, EngineConfig, SlotState
from hyserve.engine.generator import StopRule
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.scheduler import QueueFullError
from hyserve.engine.task import (
    AcceptedEvent,
    DeltaEvent,
    Event,
    FailedEvent,
    FinishedEvent,
    FinishReason,
    ReuseSource,
    Task,
    Usage,
)


class Collector:
    def __init__(self) -> None:
        self.q: queue.Queue[Event] = queue.Queue()
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.q.put(event)

    def wait_end(self, timeout: float = 10.0) -> list[Event]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.q.get(timeout=max(0.01, deadline - time.monotonic()))
            self.events.append(event)
            if isinstance(event, FinishedEvent | FailedEvent):
                return self.events

    def wait_for(self, kind: type, timeout: float = 10.0) -> Event:
        deadline = time.monotonic() + timeout
        while True:
            event = self.q.get(timeout=max(0.01, deadline - time.monotonic()))
            self.events.append(event)
            if isinstance(event, kind):
                return event


class PausingCollector(Collector):
    """Closes the fake model's gate as the engine thread sends the task's first token: the engine's
    next forward then waits there until the test opens it, however fast or slow the test is."""

    def __init__(self, arch: FakeArch) -> None:
        super().__init__()
        self.arch = arch
        self.paused = False

    def __call__(self, event: Event) -> None:
        if isinstance(event, DeltaEvent) and not self.paused:
            self.paused = True
            self.arch.gate.clear()
        super().__call__(event)


def tokens_of(events: Sequence[Event]) -> list[int]:
    return [t for e in events if isinstance(e, DeltaEvent) for t in e.token_ids]


def finished_of(events: Sequence[Event]) -> FinishedEvent:
    last = events[-1]
    assert isinstance(last, FinishedEvent), last
    return last


@pytest.fixture
def arch() -> FakeArch:
    return FakeArch()


@pytest.fixture
def make_engine(arch: FakeArch):  # -> Callable[..., Engine]
    engines: list[Engine] = []

    def make(tokenizer: FakeTokenizer | None = None, **kw: int) -> Engine:
        config = EngineConfig(**{"n_slots": 1, "n_ctx": 64, "queue_size": 4, "prompt_chunk": 4, **kw})
        engine = Engine(arch, tokenizer or FakeTokenizer(), config)  # type: ignore[arg-type]
        engine.start()
        engines.append(engine)
        return engine

    yield make
    arch.gate.set()
    for engine in engines:
        engine.shutdown()


def submit(
    engine: Engine,
    task_id: str,
    prompt: Sequence[int],
    max_tokens: int = 5,
    sink: Collector | None = None,
    **kw: object,
) -> Collector:
    sink = sink or Collector()
    stop = kw.pop("stop", StopRule(max_tokens=max_tokens))
    task = Task(id=task_id, prompt=tuple(prompt), params=SamplingParams(), stop=stop, sink=sink, **kw)  # type: ignore[arg-type]
    engine.submit(task)
    sink.task = task  # type: ignore[attr-defined]
    return sink


def slot_consistent(engine: Engine) -> None:
    for slot in engine.slots:
        assert len(slot.tokens) == slot.memory.n_tokens
        assert isinstance(slot.memory, FakeMemory)
        assert slot.memory.history[: slot.memory.n_tokens].tolist() == slot.tokens


PROMPT = list(range(3, 13))  # 10 tokens: three prompt chunks of 4


def test_engine_generates_like_the_reference_and_keeps_i1(make_engine) -> None:
    engine = make_engine()
    events = submit(engine, "a", PROMPT, max_tokens=6).wait_end()
    accepted = events[0]
    assert isinstance(accepted, AcceptedEvent) and accepted.reused_tokens == 0
    assert tokens_of(events) == reference(PROMPT, 6)
    fin = finished_of(events)
    assert fin.reason is FinishReason.MAX_TOKENS
    assert fin.usage == Usage(10, 0, 10, 6)
    assert "".join(e.text for e in events if isinstance(e, DeltaEvent)) == "".join(
        chr(ord("a") + t % 26) for t in reference(PROMPT, 6)
    )
    slot_consistent(engine)
    # the slot holds prompt + completion[:-1] (the last sampled token was never evaluated)
    assert engine.slots[0].tokens == PROMPT + reference(PROMPT, 6)[:-1]


def test_engine_reuses_the_slot_prefix_and_results_do_not_change(make_engine) -> None:
    engine = make_engine()
    submit(engine, "a", PROMPT, max_tokens=3).wait_end()
    follow = PROMPT + reference(PROMPT, 3) + [20, 21]
    events = submit(engine, "b", follow, max_tokens=4).wait_end()
    accepted = events[0]
    assert isinstance(accepted, AcceptedEvent)
    assert accepted.matched_tokens == 12 and accepted.reused_tokens == 12
    assert accepted.reuse_source is ReuseSource.SLOT_LIVE
    assert tokens_of(events) == reference(follow, 4)
    assert finished_of(events).usage == Usage(len(follow), 12, len(follow) - 12, 4)
    # an edit in the middle truncates to the common prefix
    edited = [*PROMPT[:5], 30, 31, 32]
    events = submit(engine, "c", edited, max_tokens=4).wait_end()
    assert events[0].reused_tokens == 5  # type: ignore[union-attr]
    assert tokens_of(events) == reference(edited, 4)
    slot_consistent(engine)
    stats = engine.stats()
    assert stats.counters.prompt_tokens_received == len(PROMPT) + len(follow) + len(edited)
    assert stats.counters.prompt_tokens_reused == 17
    assert stats.counters.full_reprocess_by_reason == {"cold_slot": 1}


def test_engine_cancel_of_a_queued_task_touches_nothing_else(make_engine, arch: FakeArch) -> None:
    engine = make_engine()
    arch.gate.clear()
    arch.entered.clear()
    a = submit(engine, "a", PROMPT, max_tokens=6)
    assert arch.entered.wait(5)
    b = submit(engine, "b", [5, 6, 7], max_tokens=6)
    assert engine.cancel("b") is CancelOutcome.CANCELLED
    b_events = b.wait_end()
    assert [type(e) for e in b_events] == [FinishedEvent]
    assert finished_of(b_events).reason is FinishReason.CANCELLED
    assert finished_of(b_events).usage == Usage(prompt_tokens=3)
    arch.gate.set()
    a_events = a.wait_end()
    assert tokens_of(a_events) == reference(PROMPT, 6)
    assert finished_of(a_events).reason is FinishReason.MAX_TOKENS
    assert engine.cancel("b") is CancelOutcome.ALREADY_FINISHED
    assert engine.cancel("a") is CancelOutcome.ALREADY_FINISHED
    assert engine.cancel("never") is CancelOutcome.NOT_FOUND


def test_engine_cancel_of_a_running_task_stops_it_and_the_slot_keeps_its_prefix(make_engine, arch: FakeArch) -> None:
    engine = make_engine()
    a = submit(engine, "a", PROMPT, max_tokens=50, sink=PausingCollector(arch))
    b = submit(engine, "b", [5, 6, 7], max_tokens=3)
    a.wait_for(DeltaEvent)
    assert engine.cancel("a") is CancelOutcome.CANCELLED
    arch.gate.set()  # the forward that waited commits its token; then the engine sees the cancel
    a_events = a.wait_end()
    fin = finished_of(a_events)
    assert fin.reason is FinishReason.CANCELLED and 1 <= fin.usage.completion_tokens < 50
    produced = tokens_of(a_events)
    assert produced == reference(PROMPT, len(produced))
    assert tokens_of(b.wait_end()) == reference([5, 6, 7], 3)
    slot_consistent(engine)
    # a retry of the cancelled prompt (after another task used the slot) and an idempotent cancel
    assert engine.cancel("a") is CancelOutcome.ALREADY_FINISHED
    assert tokens_of(submit(engine, "a", PROMPT, max_tokens=4).wait_end()) == reference(PROMPT, 4)


def test_engine_cancel_during_prompt_keeps_the_evaluated_chunks_for_a_retry(make_engine, arch: FakeArch) -> None:
    engine = make_engine()
    long_prompt = list(range(2, 30))
    arch.gate.clear()
    arch.entered.clear()
    a = submit(engine, "a", long_prompt, max_tokens=4)
    assert arch.entered.wait(5)
    engine.cancel("a")
    arch.gate.set()
    fin = finished_of(a.wait_end())
    assert fin.reason is FinishReason.CANCELLED and fin.usage.completion_tokens == 0
    assert fin.usage.processed_prompt_tokens == 4  # the chunk in flight was committed
    assert engine.slots[0].tokens == long_prompt[:4]
    slot_consistent(engine)
    events = submit(engine, "a2", long_prompt, max_tokens=4).wait_end()
    assert events[0].reused_tokens == 4  # type: ignore[union-attr]
    assert tokens_of(events) == reference(long_prompt, 4)


def test_engine_cancel_inside_a_forward_commits_nothing_of_that_chunk(make_engine, arch: FakeArch) -> None:
    """A batch of one task gets the task's flag: the forward stops early and no half-made chunk lands."""
    engine = make_engine()
    arch.honor_cancel = True
    long_prompt = list(range(2, 30))
    arch.gate.clear()
    arch.entered.clear()
    a = submit(engine, "a", long_prompt, max_tokens=4)
    assert arch.entered.wait(5)
    engine.cancel("a")
    arch.gate.set()
    fin = finished_of(a.wait_end())
    assert fin.reason is FinishReason.CANCELLED and fin.usage.processed_prompt_tokens == 0
    assert engine.slots[0].tokens == [] and engine.slots[0].memory.n_tokens == 0
    slot_consistent(engine)
    assert tokens_of(submit(engine, "b", long_prompt, max_tokens=4).wait_end()) == reference(long_prompt, 4)


def test_engine_two_slots_batch_and_give_the_same_results(make_engine, arch: FakeArch) -> None:
    engine = make_engine(n_slots=2, prompt_chunk=8)
    p1, p2 = PROMPT, [9, 8, 7, 6, 5, 4]
    arch.gate.clear()
    a = submit(engine, "a", p1, max_tokens=8)
    b = submit(engine, "b", p2, max_tokens=8)
    arch.gate.set()
    assert tokens_of(a.wait_end()) == reference(p1, 8)
    assert tokens_of(b.wait_end()) == reference(p2, 8)
    assert any(len(call) == 2 for call in arch.calls)  # both slots shared forward calls
    assert all(sum(n for _, n in call) <= 8 for call in arch.calls)
    slot_consistent(engine)


def test_engine_rejects_duplicates_and_overflow(make_engine, arch: FakeArch) -> None:
    engine = make_engine(queue_size=1)
    arch.gate.clear()
    arch.entered.clear()
    a = submit(engine, "a", PROMPT, max_tokens=3)
    assert arch.entered.wait(5)
    with pytest.raises(DuplicateTaskError):
        submit(engine, "a", PROMPT)
    b = submit(engine, "b", PROMPT)
    with pytest.raises(QueueFullError):
        submit(engine, "c", PROMPT)
    arch.gate.set()
    a.wait_end()
    b.wait_end()
    submit(engine, "a", PROMPT, max_tokens=1).wait_end()  # an ended id may be used again


def test_engine_forward_failure_fails_the_batch_and_keeps_serving(make_engine, arch: FakeArch) -> None:
    engine = make_engine()
    submit(engine, "warm", PROMPT, max_tokens=2).wait_end()
    before = list(engine.slots[0].tokens)
    arch.fail_next = True
    events = submit(engine, "a", [*PROMPT, 33, 34], max_tokens=3).wait_end()
    assert isinstance(events[-1], FailedEvent) and "boom" in events[-1].message
    assert engine.slots[0].tokens == before[: len(PROMPT)]  # truncated at admission, nothing added
    slot_consistent(engine)
    assert tokens_of(submit(engine, "b", PROMPT, max_tokens=3).wait_end()) == reference(PROMPT, 3)


def test_engine_stop_rules(make_engine) -> None:
    engine = make_engine(n_ctx=16)
    ref = reference(PROMPT, 6)
    # stop token: included in the tokens
    events = submit(engine, "st", PROMPT, stop=StopRule(max_tokens=6, stop_token_ids=frozenset({ref[2]}))).wait_end()
    assert tokens_of(events) == ref[:3]
    assert finished_of(events).reason is FinishReason.STOP_TOKEN and finished_of(events).stop_token_id == ref[2]
    # stop string: the text before it only
    text = "".join(chr(ord("a") + t % 26) for t in ref)
    events = submit(engine, "ss", PROMPT, stop=StopRule(max_tokens=6, stop_strings=(text[3:5],))).wait_end()
    assert finished_of(events).reason is FinishReason.STOP_STRING and finished_of(events).stop_string == text[3:5]
    assert "".join(e.text for e in events if isinstance(e, DeltaEvent)) == text[:3]
    # context full: prompt + completion never exceed n_ctx
    events = submit(engine, "cf", PROMPT, max_tokens=50).wait_end()
    assert finished_of(events).reason is FinishReason.CONTEXT_FULL
    assert len(tokens_of(events)) == 16 - len(PROMPT)
    slot_consistent(engine)


def test_engine_eos_and_ignore_eos(make_engine) -> None:
    tok = FakeTokenizer()
    first = reference(PROMPT, 1)[0]
    tok.eog_ids = frozenset({first})  # type: ignore[misc]
    engine = make_engine(tokenizer=tok)
    events = submit(engine, "e", PROMPT).wait_end()
    assert tokens_of(events) == [first] and finished_of(events).reason is FinishReason.EOS
    events = submit(engine, "i", PROMPT, stop=StopRule(max_tokens=3, ignore_eos=True)).wait_end()
    assert tokens_of(events) == reference(PROMPT, 3)


def test_engine_stats_snapshot(make_engine, arch: FakeArch) -> None:
    engine = make_engine()
    arch.gate.clear()
    arch.entered.clear()
    a = submit(engine, "a", PROMPT, max_tokens=2)
    assert arch.entered.wait(5)
    deadline = time.monotonic() + 5
    while engine.stats().slots[0].state is SlotState.IDLE and time.monotonic() < deadline:
        time.sleep(0.01)
    snap = engine.stats().slots[0]
    assert snap.state is SlotState.PROCESSING_PROMPT and snap.task_id == "a"
    arch.gate.set()
    a.wait_end()
    deadline = time.monotonic() + 5
    while engine.stats().slots[0].state is not SlotState.IDLE and time.monotonic() < deadline:
        time.sleep(0.01)
    snap = engine.stats().slots[0]
    assert snap.state is SlotState.IDLE and snap.task_id == "" and snap.cached_tokens == len(PROMPT) + 1


def test_engine_shutdown_cancels_everything(make_engine, arch: FakeArch) -> None:
    engine = make_engine()
    arch.gate.clear()
    arch.entered.clear()
    a = submit(engine, "a", PROMPT, max_tokens=50)
    assert arch.entered.wait(5)
    b = submit(engine, "b", PROMPT)
    stopping = threading.Thread(target=engine.shutdown)
    stopping.start()
    # the forward a waits in is let go only once the shutdown has flagged a
    deadline = time.monotonic() + 10
    while not a.task.cancelled:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the shutdown never cancelled the running task"
        time.sleep(0.01)
    arch.gate.set()
    stopping.join(30)
    assert not stopping.is_alive()
    assert finished_of(a.wait_end()).reason is FinishReason.CANCELLED
    assert finished_of(b.wait_end()).reason is FinishReason.CANCELLED
    with pytest.raises(Exception, match="shutting down"):
        submit(engine, "c", PROMPT)
