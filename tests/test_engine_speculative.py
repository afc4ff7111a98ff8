"""Speculative decoding in the engine (`EngineConfig.spec`, engine/spec_step.py): the same tokens
as plain decoding, greedy and seeded, on every fixture architecture and Gemma 3 270M, alone and
with four concurrent tasks sharing the batch (the prompt cache on), with n-gram drafts and with a
draft model, on a second turn that resumes from the prompt cache, after a cancel in the middle of a generation and
with a stop string inside an accepted run; the engine checks its cache invariants after every
step (`check_invariants`), and the draft counters prove that speculation ran."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fixtures import make_models

from hyserve.engine.constraints import ConstraintSpec
from hyserve.engine.draft_model import load_draft_model
from hyserve.engine.engine import Engine, EngineConfig, EngineCounters
from hyserve.engine.generator import StopRule, generate
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.speculative import SpecConfig
from hyserve.engine.task import AcceptedEvent, DeltaEvent, Event, FailedEvent, FinishedEvent, FinishReason, Task
from hyserve.model.loader import LoadedModel, load_model

# texts that repeat themselves, so prompt lookup has drafts to offer
COPIES = [
    f"def {name}(a, b):\n    return a {op} b\n\ndef sub(a, b):\n    return a - b\n\n" * 3 + f"def {name}(a, b):\n"
    for name, op in (("add", "+"), ("mul", "*"), ("div", "/"), ("mod", "%"))
]
SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=11)
# random-weight fixtures rarely repeat two tokens: unigram lookup drafts often and is often wrong,
# so the rollback (truncation, or restore and replay) runs
FIXTURE_SPEC = SpecConfig(max_draft=3, adaptive=False, ngram_min=1)


@dataclass
class Sink:
    events: list[Event] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    cancel_after: int | None = None  # raise the task's cancel flag when this many tokens came
    task: Task | None = None

    def __call__(self, event: Event) -> None:  # on the engine thread, under the task's lock
        self.events.append(event)
        if self.cancel_after is not None and self.task is not None and len(self.tokens) >= self.cancel_after:
            self.task.cancel_flag.set()
        if isinstance(event, FinishedEvent | FailedEvent):
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [t for e in self.events if isinstance(e, DeltaEvent) for t in e.token_ids]

    @property
    def finished(self) -> FinishedEvent:
        if not self.done.wait(600):
            raise TimeoutError("the task did not end")
        last = self.events[-1]
        assert isinstance(last, FinishedEvent), last
        return last

    @property
    def accepted(self) -> AcceptedEvent:
        first = self.events[0]
        assert isinstance(first, AcceptedEvent), first
        return first


@pytest.fixture
def engine_of() -> Iterator:
    engines: list[Engine] = []

    def make(model: LoadedModel, spec: SpecConfig, n_slots: int = 1, **kw: object) -> Engine:
        config = EngineConfig(n_slots=n_slots, n_ctx=1024, prompt_chunk=32, check_invariants=True, spec=spec, **kw)  # type: ignore[arg-type]
        engine = Engine(model.arch, model.tokenizer, config)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown()


def submit(engine: Engine, task_id: str, prompt: Sequence[int], params: SamplingParams, stop: StopRule, **kw) -> Sink:
    sink = Sink(**kw)
    task = Task(id=task_id, prompt=tuple(prompt), params=params, stop=stop, sink=sink)
    sink.task = task
    engine.submit(task)
    return sink


def reference(model: LoadedModel, prompt: Sequence[int], params: SamplingParams, stop: StopRule) -> list[int]:
    """Plain decoding in-process: no engine, no cache, no speculation."""
    return [g.token_id for g in generate(model, list(prompt), params, stop, n_ctx=1024)]


def counters(engine: Engine) -> EngineCounters:
    c = engine.stats().counters
    assert c.invariant_violations == 0, c
    return c


def speculated(engine: Engine, accepted: bool = True) -> EngineCounters:
    """The counters, with proof that drafts were verified (and some accepted)."""
    c = counters(engine)
    assert c.spec_drafts > 0 and c.spec_draft_tokens >= c.spec_drafts, c
    assert c.spec_accepted_tokens > 0 or not accepted, c
    return c


@pytest.fixture(scope="module", params=make_models.ARCHES)
def fixture_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    arch = request.param
    return load_model(make_models.write_model(tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch, qtype="q8_0"))


@pytest.mark.parametrize("params", [SamplingParams(), SEEDED], ids=["greedy", "seeded"])
def test_fixture_output_is_the_plain_output_alone_and_batched(fixture_model, engine_of, params) -> None:
    model = fixture_model
    stop = StopRule(max_tokens=40, ignore_eos=True)
    prompts = [model.tokenizer.encode(text) for text in COPIES]
    want = [reference(model, p, params, stop) for p in prompts]
    alone = engine_of(model, FIXTURE_SPEC)
    for i in (0, 1):  # the second one on the slot the first left
        got = submit(alone, f"alone{i}", prompts[i], params, stop)
        assert got.finished.usage.completion_tokens == 40
        assert got.tokens == want[i]
    # some fixtures' text rarely follows its own past: their drafts may all be rejected
    c = speculated(alone, accepted=False)
    assert c.spec_draft_tokens > c.spec_accepted_tokens  # rejections: the rollback ran
    batched = engine_of(model, FIXTURE_SPEC, n_slots=4)  # the prompt cache on (EngineConfig's defaults)
    assert batched.config.cache_memory > 0 and batched.config.checkpoint_memory > 0
    sinks = [submit(batched, f"t{i}", p, params, stop) for i, p in enumerate(prompts)]
    assert [s.tokens for s in sinks if s.finished] == want
    usage = [s.finished.usage for s in sinks]
    assert sum(u.draft_tokens for u in usage) == speculated(batched, accepted=False).spec_draft_tokens
    assert sum(u.accepted_draft_tokens for u in usage) == counters(batched).spec_accepted_tokens


def test_a_second_turn_resumes_from_the_cache_and_answers_as_a_fresh_run(fixture_model, engine_of) -> None:
    model = fixture_model
    stop = StopRule(max_tokens=24, ignore_eos=True)
    engine = engine_of(model, FIXTURE_SPEC)
    first_prompt = model.tokenizer.encode(COPIES[0])
    first = submit(engine, "turn1", first_prompt, SamplingParams(), stop)
    assert first.finished and first.tokens == reference(model, first_prompt, SamplingParams(), stop)
    second_prompt = first_prompt + first.tokens + model.tokenizer.encode(COPIES[2])
    second = submit(engine, "turn2", second_prompt, SamplingParams(), stop)
    assert second.finished and second.accepted.reused_tokens == len(first_prompt) + len(first.tokens) - 1
    assert second.tokens == reference(model, second_prompt, SamplingParams(), stop)
    speculated(engine, accepted=False)


def test_a_cancel_mid_generation_leaves_the_slot_consistent(fixture_model, engine_of) -> None:
    model = fixture_model
    stop = StopRule(max_tokens=40, ignore_eos=True)
    engine = engine_of(model, FIXTURE_SPEC)
    prompt = model.tokenizer.encode(COPIES[1])
    cancelled = submit(engine, "cancelled", prompt, SamplingParams(), stop, cancel_after=9)
    assert cancelled.finished.reason is FinishReason.CANCELLED
    emitted = cancelled.tokens
    assert 9 <= len(emitted) < 40 and emitted == reference(model, prompt, SamplingParams(), stop)[: len(emitted)]
    # the slot holds the prompt and every emitted token but the last (never evaluated)
    assert engine.stats().slots[0].cached_tokens == len(prompt) + len(emitted) - 1
    follow = prompt + emitted + model.tokenizer.encode(COPIES[3])
    retry = submit(engine, "retry", follow, SamplingParams(), stop)
    assert retry.finished and retry.accepted.reused_tokens == len(prompt) + len(emitted) - 1
    assert retry.tokens == reference(model, follow, SamplingParams(), stop)
    speculated(engine, accepted=False)


def test_constrained_tasks_are_not_drafted_for(fixture_model, engine_of) -> None:
    """A task with a grammar decodes one token per forward: its output repeats itself (drafts
    would be offered) and still no draft is verified."""
    model = fixture_model
    engine = engine_of(model, FIXTURE_SPEC)
    grammar = engine.grammars.compile(ConstraintSpec("regex", "[a-c]{30,40}", "sampling.constraint"))
    sink = Sink()
    prompt = tuple(model.tokenizer.encode(COPIES[0]))
    engine.submit(Task("g", prompt, SamplingParams(), StopRule(max_tokens=30), sink, grammar=grammar))
    assert sink.finished.usage.completion_tokens >= 10
    assert len(set(sink.tokens)) < len(sink.tokens)  # a repeated token: prompt lookup had a guess
    assert counters(engine).spec_drafts == 0


@pytest.mark.parametrize("params", [SamplingParams(), SEEDED], ids=["greedy", "seeded"])
def test_a_draft_model_gives_the_plain_output_alone_batched_and_resumed(fixture_model, engine_of, params) -> None:
    """`--spec draft` in the engine: the target as its own draft model (greedy drafts accepted,
    seeded ones in part) and a random draft model (rejected), four tasks at once, then second
    turns on the slots' draft memories; the prompt cache on."""
    model = fixture_model
    stop = StopRule(max_tokens=24, ignore_eos=True)
    prompts = [model.tokenizer.encode(text) for text in COPIES]
    want = [reference(model, p, params, stop) for p in prompts]
    for source, agrees in ((model.path, params.temperature == 0), (random_draft(model), False)):
        draft = load_draft_model(source, model.arch, model.tokenizer)
        engine = engine_of(model, SpecConfig(method="draft", max_draft=4, draft=draft), n_slots=4)
        sinks = [submit(engine, f"d{i}", p, params, stop) for i, p in enumerate(prompts)]
        assert [s.tokens for s in sinks if s.finished] == want
        follow = [p + w + model.tokenizer.encode(COPIES[(i + 1) % 4]) for i, (p, w) in enumerate(zip(prompts, want))]
        again = [submit(engine, f"e{i}", p, params, stop) for i, p in enumerate(follow)]
        assert [s.tokens for s in again if s.finished] == [reference(model, p, params, stop) for p in follow]
        c = speculated(engine, accepted=agrees)
        if agrees:
            assert c.spec_accepted_tokens >= c.spec_draft_tokens // 2, c
        else:
            assert c.spec_accepted_tokens < c.spec_draft_tokens, c


def random_draft(model: LoadedModel) -> Path:
    """A small random model with the fixtures' vocabulary: its drafts are rarely the target's."""
    path = model.path.with_name("draft-random.gguf")
    return path if path.exists() else make_models.write_model(path, "qwen35", qtype="q8_0", seed=9, layers=2)


def test_gemma_four_tasks_at_once_equal_plain_decoding(gemma_model, engine_of) -> None:
    model = gemma_model
    prompts = [model.tokenizer.encode(text) for text in COPIES]
    stop = StopRule(max_tokens=24)
    engine = engine_of(model, SpecConfig(), n_slots=4)  # the prompt cache on
    for params in (SamplingParams(), SEEDED):
        sinks = [submit(engine, f"g{i}-{params.seed}", p, params, stop) for i, p in enumerate(prompts)]
        assert [s.tokens for s in sinks if s.finished] == [reference(model, p, params, stop) for p in prompts]
    speculated(engine)


def test_gemma_greedy_and_seeded_equal_plain_decoding_with_stop_strings(gemma_model, engine_of) -> None:
    """The default model copies the code it was shown: most drafts are accepted whole; a stop
    string inside an accepted run ends the task there, as plain decoding does."""
    model = gemma_model
    prompt = model.tokenizer.encode(COPIES[0])
    engine = engine_of(model, SpecConfig())
    stop = StopRule(max_tokens=32)
    for params in (SamplingParams(), SEEDED):
        got = submit(engine, f"gemma-{params.seed}", prompt, params, stop)
        assert got.finished and got.tokens == reference(model, prompt, params, stop)
    c = speculated(engine)
    assert c.spec_accepted_tokens >= c.spec_draft_tokens // 2, c
    text = model.tokenizer.decode(reference(model, prompt, SamplingParams(), stop))
    cut = StopRule(max_tokens=32, stop_strings=(text[12:16],))
    stopped = submit(engine, "gemma-stop", prompt, SamplingParams(), cut)
    assert stopped.finished.reason is FinishReason.STOP_STRING
    assert stopped.tokens == reference(model, prompt, SamplingParams(), cut)
    # the slot holds the prompt and every emitted token but the last
    assert engine.stats().slots[0].cached_tokens == len(prompt) + len(stopped.tokens) - 1
    counters(engine)
