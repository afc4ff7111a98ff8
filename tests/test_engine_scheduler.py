"""Scheduler policy, stop-string holdback, task lifecycle, and the engine loop over a fake model.

No model file is needed: the engine tests run a tiny deterministic fake architecture whose next
token depends on every token in the sequence's memory, so any mismatch between a slot's token list
and its memory (invariant I1) changes the output.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
from hyserve_kernels import CancelFlag

from hyserve.engine.engine import CancelOutcome, DuplicateTaskError, Engine, EngineConfig, SlotState
from hyserve.engine.generator import StopRule
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.scheduler import BatchItem, BoundedFifo, QueueFullError, SlotWork, compose_batch
from hyserve.engine.stop import StopStringFilter
from hyserve.engine.task import (
    AcceptedEvent,
    DeltaEvent,
    Event,
    FailedEvent,
    FinishedEvent,
    FinishReason,
    ReuseSource,
    Task,
    Timings,
    Usage,
)
from hyserve.model.architectures.base import Architecture, ForwardCancelled, Logits, Segment
from hyserve.model.memory import KVCache, SequenceMemory

# --- compose_batch ---------------------------------------------------------------------------------


def test_compose_batch_decodes_every_generating_slot_and_chunks_prompts() -> None:
    work = [
        SlotWork(0, decoding=True, admitted=1),
        SlotWork(1, decoding=False, prompt_remaining=500, admitted=3),
        SlotWork(2, decoding=True, admitted=2),
        SlotWork(3, decoding=False, prompt_remaining=40, admitted=2),
    ]
    items = compose_batch(work, token_budget=128)
    # decodes get one token each; the earlier admitted prompt (slot 3) is served first
    assert items == [
        BatchItem(0, 1, True),
        BatchItem(1, 128 - 2 - 40, False),
        BatchItem(2, 1, True),
        BatchItem(3, 40, False),
    ]
    assert sum(i.n_tokens for i in items) == 128


def test_compose_batch_prompt_processing_is_never_starved() -> None:
    work = [SlotWork(i, decoding=True) for i in range(20)] + [SlotWork(20, False, prompt_remaining=100)]
    items = compose_batch(work, token_budget=16)
    assert [i for i in items if not i.decode] == [BatchItem(20, 2, False)]  # max(1, 16 // 8)
    assert compose_batch([SlotWork(0, False, prompt_remaining=3)], token_budget=1) == [BatchItem(0, 1, False)]


def test_compose_batch_only_prompts_and_empty() -> None:
    assert compose_batch([SlotWork(0, False, prompt_remaining=10)], 128) == [BatchItem(0, 10, False)]
    assert compose_batch([], 128) == []
    with pytest.raises(ValueError):
        compose_batch([], 0)


# --- BoundedFifo -----------------------------------------------------------------------------------


def test_bounded_fifo() -> None:
    q: BoundedFifo[str] = BoundedFifo(2)
    q.push("a")
    q.push("b")
    with pytest.raises(QueueFullError):
        q.push("c")
    assert q.remove("a") and not q.remove("a")
    q.push("c")
    assert list(q) == ["b", "c"] and q.pop() == "b" and len(q) == 1
    assert q.drain() == ["c"] and len(q) == 0
    with pytest.raises(QueueFullError):
        BoundedFifo[int](0).push(1)


# --- StopStringFilter ------------------------------------------------------------------------------


def _run_filter(stops: Sequence[str], pieces: Sequence[str]) -> tuple[list[str], str | None, str]:
    f = StopStringFilter(stops)
    out, hit = [], None
    for piece in pieces:
        released, hit = f.push(piece)
        out.append(released)
        if hit is not None:
            break
    return out, hit, f.flush()


def test_stop_filter_passes_text_through_without_stop_strings() -> None:
    assert _run_filter([], ["ab", "c"]) == (["ab", "c"], None, "")


def test_stop_filter_holds_back_a_possible_start_and_matches_across_pieces() -> None:
    out, hit, rest = _run_filter(["END"], ["hello E", "N", "D more"])
    assert out == ["hello ", "", ""] and hit == "END" and rest == ""


def test_stop_filter_releases_a_false_start() -> None:
    out, hit, rest = _run_filter(["END"], ["a E", "Nx", "y"])
    assert out == ["a ", "ENx", "y"] and hit is None and rest == ""


def test_stop_filter_flush_releases_held_text() -> None:
    out, hit, rest = _run_filter(["\n\nuser:"], ["hi\n", "\n"])
    assert out == ["hi", ""] and hit is None and rest == "\n\n"


def test_stop_filter_earliest_match_wins() -> None:
    out, hit, _ = _run_filter(["cd", "b"], ["abcd"])
    assert out == ["a"] and hit == "b"
    out, hit, _ = _run_filter(["bc", "bcd"], ["abcde"])
    assert out == ["a"] and hit == "bcd"  # same start: the longer one


def test_stop_filter_done_after_match() -> None:
    f = StopStringFilter(["x"])
    assert f.push("ax") == ("a", "x")
    assert f.push("more") == ("", None) and f.flush() == ""


# --- Task lifecycle --------------------------------------------------------------------------------


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


# --- the engine over a fake model ------------------------------------------------------------------

VOCAB = 40
EOG = 1


class FakeMemory(SequenceMemory):
    """Attention-like memory: the evaluated token ids live in a real 1 x 1 KV cache (f16 holds
    them exactly), so truncation, export and load go through the production code."""

    def __init__(self, n_ctx: int) -> None:
        super().__init__(n_ctx, {0: KVCache(n_ctx, 1, 1)})

    @property
    def history(self) -> np.ndarray:
        return self.kv[0].k[:, 0, 0]


class FakeArch(Architecture):
    """Next token = a hash of the whole evaluated sequence; logits are one-hot-ish."""

    name = "fake"
    n_vocab = VOCAB
    n_ctx_train = 4096

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_next = False
        self.delay = 0.0  # seconds per forward call
        self.honor_cancel = False  # True: stop mid-forward on the task's flag, like the real model
        self.calls: list[list[tuple[int, int]]] = []

    def new_memory(self, n_ctx: int) -> SequenceMemory:
        return FakeMemory(n_ctx)

    @staticmethod
    def next_token(seq: Sequence[int]) -> int:
        h = 0
        for i, t in enumerate(seq):
            h = (h * 31 + (i + 1) * (int(t) + 7)) % 1_000_003
        return 2 + h % (VOCAB - 2)  # never EOG

    def _forward(self, segments: Sequence[Segment], cancel: CancelFlag | None = None) -> list[np.ndarray | None]:
        self.entered.set()
        self.gate.wait(10)
        time.sleep(self.delay)
        if self.honor_cancel and cancel is not None and cancel.is_set():
            raise ForwardCancelled  # as the real model does at its next layer boundary
        self.calls.append([(id(s.memory), len(s.tokens)) for s in segments])
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        for s in segments:
            s.memory.check_room(len(s.tokens))
        out: list[np.ndarray | None] = []
        for s in segments:
            mem = s.memory
            assert isinstance(mem, FakeMemory)
            n = mem.n_tokens
            mem.history[n : n + len(s.tokens)] = s.tokens
            rows = []
            for j in range(len(s.tokens)):
                logits = np.zeros(VOCAB, dtype=np.float32)
                logits[self.next_token(mem.history[: n + j + 1])] = 5.0
                rows.append(logits)
            if s.logits is Logits.ALL:
                out.append(np.stack(rows))
            elif s.logits is Logits.LAST:
                out.append(rows[-1])
            else:
                out.append(None)
        for s in segments:
            s.memory.n_tokens += len(s.tokens)
        return out


class FakeDecoder:
    def push(self, token_id: int) -> str:
        return chr(ord("a") + token_id % 26)

    def flush(self) -> str:
        return ""


class FakeTokenizer:
    vocab_size = VOCAB
    eog_ids = frozenset({EOG})

    def incremental_decoder(self, skip_special: bool = False) -> FakeDecoder:
        return FakeDecoder()

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids


def reference(prompt: Sequence[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(FakeArch.next_token(seq))
    return seq[len(prompt) :]


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


def submit(engine: Engine, task_id: str, prompt: Sequence[int], max_tokens: int = 5, **kw: object) -> Collector:
    sink = Collector()
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
    arch.delay = 0.01
    a = submit(engine, "a", PROMPT, max_tokens=50)
    b = submit(engine, "b", [5, 6, 7], max_tokens=3)
    a.wait_for(DeltaEvent)
    assert engine.cancel("a") is CancelOutcome.CANCELLED
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
    threading.Timer(0.2, arch.gate.set).start()
    engine.shutdown()
    assert finished_of(a.wait_end()).reason is FinishReason.CANCELLED
    assert finished_of(b.wait_end()).reason is FinishReason.CANCELLED
    with pytest.raises(Exception, match="shutting down"):
        submit(engine, "c", PROMPT)
