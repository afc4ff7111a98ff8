"""Constrained generation end to end: Gemma 3 270M and the tiny hybrid fixture (qwen35: recurrent
and attention layers) through the engine and the in-process generator.

Hypothesis draws JSON Schemas (objects with string, integer, number, boolean, enum and array
properties, required lists, nested objects) whose instances are bounded, so a complete answer fits
the token budget: every answer must end with the model's end-of-generation token (not by
truncation), parse, and validate with `jsonschema`. Regex, Lark and json_object constraints; the
same request twice gives the same tokens; an unconstrained task batched with constrained ones
gets the tokens of its solo run; a constrained task that fails ends alone; and the cache stays
transparent (I4): the stored prompt-end logits are never masked.
"""

from __future__ import annotations

import json
import queue
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fixtures import make_models
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from hyserve.engine.constraints import CompiledGrammar, ConstraintSpec, GrammarCompiler
from hyserve.engine.engine import Engine, EngineConfig
from hyserve.engine.generator import SpecConfig, SpecStats, StopRule, generate
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.task import DeltaEvent, Event, FailedEvent, FinishedEvent, FinishReason, Task
from hyserve.model.loader import LoadedModel, load_model

GEMMA_PROMPT = "<start_of_turn>user\nDescribe one record as JSON.<end_of_turn>\n<start_of_turn>model\n"
OBJECT_PROMPT = "<start_of_turn>user\nGive a JSON object with a name and an age.<end_of_turn>\n<start_of_turn>model\n"
HYBRID_PROMPT = (17, 42, 99, 123, 7, 250, 31)  # plain tokens of the fixture vocabulary


@dataclass
class Outcome:
    reason: FinishReason | None
    tokens: list[int]
    text: str
    logprobs: list[float]
    failed: str = ""


@dataclass
class Request:
    prompt: Sequence[int]
    grammar: CompiledGrammar | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 64
    ignore_eos: bool = False
    cache: bool = True


_ids = count()


def run(engine: Engine, requests: Sequence[Request], timeout: float = 600.0) -> list[Outcome]:
    """Submit all requests at once (they share forward batches) and wait for every outcome."""
    sinks: list[queue.Queue[Event]] = []
    for r in requests:
        sink: queue.Queue[Event] = queue.Queue()
        sinks.append(sink)
        engine.submit(
            Task(
                id=f"c{next(_ids)}",
                prompt=tuple(r.prompt),
                params=r.params,
                stop=StopRule(max_tokens=r.max_tokens, ignore_eos=r.ignore_eos),
                sink=sink.put,
                logprobs=True,
                cache_prompt=r.cache,
                grammar=r.grammar,
            )
        )
    outcomes = []
    for sink in sinks:
        out = Outcome(None, [], "", [])
        while True:
            event = sink.get(timeout=timeout)
            if isinstance(event, DeltaEvent):
                out.tokens += event.token_ids
                out.text += event.text
                out.logprobs += [lp.logprob for lp in event.logprobs]
            elif isinstance(event, FinishedEvent):
                out.reason = event.reason
                break
            elif isinstance(event, FailedEvent):
                out.failed = event.message
                break
        outcomes.append(out)
    return outcomes


@dataclass
class Rig:
    model: LoadedModel
    engine: Engine  # 4 slots, prompt cache on
    reference: Engine  # 1 slot, nothing reused
    prompt: tuple[int, ...]
    max_tokens: int

    def compile(self, kind: str, source: str = "") -> CompiledGrammar:
        return self.engine.grammars.compile(ConstraintSpec(kind, source, "sampling.constraint"))  # type: ignore[arg-type]


def _rig(model: LoadedModel, prompt: Sequence[int], max_tokens: int) -> Iterator[Rig]:
    engine = Engine(model.arch, model.tokenizer, EngineConfig(n_slots=4, n_ctx=1024, prompt_chunk=64))
    reference = Engine(model.arch, model.tokenizer, EngineConfig(n_slots=1, n_ctx=1024, cache_memory=0))
    engine.start()
    reference.start()
    try:
        yield Rig(model, engine, reference, tuple(prompt), max_tokens)
    finally:
        engine.shutdown()
        reference.shutdown()


@pytest.fixture(scope="module")
def hybrid_model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_models.write_model(tmp_path_factory.mktemp("constrained") / "qwen35.gguf", "qwen35", qtype="q8_0")
    return load_model(Path(path))


@pytest.fixture(scope="module")
def hybrid(hybrid_model: LoadedModel) -> Iterator[Rig]:
    yield from _rig(hybrid_model, HYBRID_PROMPT, 400)


@pytest.fixture(scope="module")
def gemma(gemma_model: LoadedModel) -> Iterator[Rig]:
    yield from _rig(gemma_model, gemma_model.tokenizer.encode(GEMMA_PROMPT), 320)


# --- schemas --------------------------------------------------------------------------------------

names = st.from_regex(r"[a-z]{1,8}", fullmatch=True)
words = st.text(alphabet="abcdefghij", min_size=1, max_size=6)


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(
            lambda lo, hi: {"type": "string", "minLength": min(lo, hi), "maxLength": hi},
            st.integers(0, 3),
            st.integers(0, 8),
        ),
        st.builds(
            lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
            st.integers(-100, 100),
            st.integers(0, 1000),
        ),
        # multipleOf bounds the fraction digits (a model can write "0.000..." forever otherwise);
        # dyadic steps, so that jsonschema's float division checks them exactly
        st.builds(
            lambda lo, span, step: {"type": "number", "minimum": lo, "maximum": lo + span, "multipleOf": step},
            st.integers(-100, 100),
            st.integers(1, 1000),
            st.sampled_from([1, 0.5, 0.25, 0.125]),
        ),
        st.just({"type": "boolean"}),
        st.lists(words, min_size=1, max_size=4, unique=True).map(lambda values: {"enum": values}),
    )


def _array(items: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(
        lambda it, lo, hi: {"type": "array", "items": it, "minItems": min(lo, hi), "maxItems": hi},
        items,
        st.integers(0, 2),
        st.integers(0, 3),
    )


@st.composite
def _object(draw: st.DrawFn, values: st.SearchStrategy[dict[str, Any]], sizes: tuple[int, int]) -> dict[str, Any]:
    properties = draw(st.dictionaries(names, values, min_size=sizes[0], max_size=sizes[1]))
    every = sorted(properties)
    # mostly all required: optional properties let an answer be "{}"
    required = draw(st.one_of(st.just(every), st.lists(st.sampled_from(every), unique=True))) if every else []
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


simple = st.one_of(_leaf(), _array(_leaf()))
schemas = _object(st.one_of(simple, _object(simple, (0, 3))), (1, 4))
seeds = st.one_of(st.none(), st.integers(0, 2**16))  # None: greedy


def _params(seed: int | None) -> SamplingParams:
    return SamplingParams() if seed is None else SamplingParams(temperature=1.0, seed=seed)


def check_schemas(rig: Rig, cases: list[tuple[dict[str, Any], int | None]]) -> None:
    requests = [
        Request(rig.prompt, rig.compile("json_schema", json.dumps(schema)), _params(seed), rig.max_tokens)
        for schema, seed in cases
    ]
    for (schema, seed), out in zip(cases, run(rig.engine, requests)):
        where = f"schema {json.dumps(schema)}, seed {seed}: {out.text!r}"
        assert out.failed == "", where
        assert out.reason is FinishReason.EOS, where  # complete, not truncated
        assert rig.model.tokenizer.is_eog(out.tokens[-1]), where
        jsonschema.validate(json.loads(out.text), schema)


# 25 examples of 4 schemas each (batched together): 100 schemas per model
SCHEMA_SETTINGS = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    phases=[Phase.explicit, Phase.generate],  # a failing example is reported as drawn: shrinking costs minutes
)


@SCHEMA_SETTINGS
@given(st.lists(st.tuples(schemas, seeds), min_size=4, max_size=4))
def test_json_schema_answers_validate_on_the_hybrid_fixture(
    hybrid: Rig, cases: list[tuple[dict[str, Any], int | None]]
) -> None:
    check_schemas(hybrid, cases)


@SCHEMA_SETTINGS
@given(st.lists(st.tuples(schemas, seeds), min_size=4, max_size=4))
def test_json_schema_answers_validate_on_gemma(gemma: Rig, cases: list[tuple[dict[str, Any], int | None]]) -> None:
    check_schemas(gemma, cases)


# --- other constraints ----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [None, 5])
def test_regex_lark_and_json_object_on_gemma(gemma: Rig, seed: int | None) -> None:
    regex = r"[0-9]{3}-[a-z]{2,5}"
    lark = 'start: answer " because " reason\nanswer: "yes" | "no"\nreason: /[a-z ]{1,30}/ "."'
    requests = [
        Request(gemma.prompt, gemma.compile("regex", regex), _params(seed), 40),
        Request(gemma.prompt, gemma.compile("grammar", lark), _params(seed), 60),
        Request(gemma.model.tokenizer.encode(OBJECT_PROMPT), gemma.compile("json_object"), _params(seed), 200),
    ]
    by_regex, by_lark, obj = run(gemma.engine, requests)
    assert re.fullmatch(regex, by_regex.text) and by_regex.reason is FinishReason.EOS, by_regex
    assert re.fullmatch(r"(yes|no) because [a-z ]{1,30}\.", by_lark.text) and by_lark.reason is FinishReason.EOS, (
        by_lark
    )
    assert obj.reason is FinishReason.EOS, obj
    assert isinstance(json.loads(obj.text), dict)


def test_the_generator_gives_the_engine_tokens(gemma: Rig) -> None:
    grammar = gemma.compile(
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
                "required": ["n"],
                "additionalProperties": False,
            }
        ),
    )
    for seed in (None, 11):
        (engine_out,) = run(gemma.reference, [Request(gemma.prompt, grammar, _params(seed), 60)])
        offline = list(generate(gemma.model, gemma.prompt, _params(seed), StopRule(max_tokens=60), grammar=grammar))
        assert [g.token_id for g in offline] == engine_out.tokens
        assert offline[-1].finish_reason == "eos"


def test_a_complete_grammar_ends_even_with_ignore_eos(hybrid: Rig) -> None:
    grammar = hybrid.compile("grammar", 'start: "yes" | "no"')
    for seed in (None, 1, 2):
        (out,) = run(hybrid.engine, [Request(hybrid.prompt, grammar, _params(seed), 200, ignore_eos=True)])
        assert out.reason is FinishReason.EOS and out.text in ("yes", "no"), out
        assert hybrid.model.tokenizer.is_eog(out.tokens[-1]) and len(out.tokens) <= 4
        offline = list(
            generate(hybrid.model, hybrid.prompt, _params(seed), StopRule(200, ignore_eos=True), grammar=grammar)
        )
        assert [g.token_id for g in offline] == out.tokens and offline[-1].finish_reason == "eos"


# --- determinism, batching, failures, cache transparency ------------------------------------------


def test_the_same_request_gives_the_same_tokens(hybrid: Rig) -> None:
    grammar = hybrid.compile(
        "json_schema", json.dumps({"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 4})
    )
    request = Request(hybrid.prompt, grammar, _params(1234), 200)
    first, second = run(hybrid.engine, [request]), run(hybrid.engine, [request])
    fresh = run(hybrid.reference, [Request(hybrid.prompt, grammar, _params(1234), 200, cache=False)])
    assert first[0].tokens == second[0].tokens == fresh[0].tokens
    assert first[0].logprobs == second[0].logprobs == fresh[0].logprobs
    assert first[0].reason is FinishReason.EOS


@pytest.mark.parametrize("seed", [None, 77])
def test_an_unconstrained_task_batched_with_constrained_ones_keeps_its_tokens(hybrid: Rig, seed: int | None) -> None:
    free = Request((5, 6, 7, 8, 9), None, _params(seed), 40, ignore_eos=True)
    (solo,) = run(hybrid.reference, [free])
    constrained = [
        Request(hybrid.prompt, hybrid.compile("regex", "[a-z]{1,12}"), _params(seed), 40),
        Request(hybrid.prompt, hybrid.compile("json_object"), _params(seed), 300),
        Request(hybrid.prompt[:4], hybrid.compile("grammar", 'start: "a"+ "b"'), _params(seed), 40),
    ]
    outcomes = run(hybrid.engine, [constrained[0], free, *constrained[1:]])
    assert outcomes[1].tokens == solo.tokens and outcomes[1].logprobs == solo.logprobs
    assert all(o.failed == "" for o in outcomes)
    assert re.fullmatch("[a-z]{1,12}", outcomes[0].text) or outcomes[0].reason is FinishReason.MAX_TOKENS


def test_a_failing_constraint_fails_only_its_task(hybrid: Rig) -> None:
    model = hybrid.model
    # a grammar over the wrong vocabulary size: its matcher refuses these logits
    wrong = GrammarCompiler(model.tokenizer, model.arch.n_vocab + 32).compile(ConstraintSpec("regex", "[a-z]+"))
    free = Request((5, 6, 7, 8, 9), None, SamplingParams(), 20, ignore_eos=True)
    (solo,) = run(hybrid.reference, [free])
    bad, other = run(hybrid.engine, [Request(hybrid.prompt, wrong), free])
    assert bad.failed.startswith("constrained decoding failed: ") and bad.tokens == []
    assert other.tokens == solo.tokens and other.failed == ""


def test_the_cache_never_changes_a_constrained_or_later_answer(hybrid: Rig) -> None:
    """A resend resumes from the stored prompt-end logits: masking must not have touched them."""
    prompt = (*HYBRID_PROMPT, 300, 301, 302)
    grammar = hybrid.compile("regex", "[0-9]{2,6}")
    for request in (
        Request(prompt, grammar, SamplingParams(), 20),
        Request(prompt, None, SamplingParams(), 20, ignore_eos=True),  # same prompt: its logits from the cache
        Request(prompt, grammar, _params(3), 20),
        Request(prompt, None, _params(3), 20, ignore_eos=True),
    ):
        (cached,) = run(hybrid.engine, [request])
        fresh = Request(request.prompt, request.grammar, request.params, request.max_tokens, request.ignore_eos, False)
        (expected,) = run(hybrid.reference, [fresh])
        assert (cached.tokens, cached.logprobs, cached.reason) == (expected.tokens, expected.logprobs, expected.reason)


def test_speculative_decoding_keeps_a_constrained_answer(hybrid: Rig) -> None:
    """Drafted rows are sampled in order after their draft tokens were consumed: same tokens."""
    grammar = hybrid.compile(
        "json_schema", json.dumps({"type": "array", "items": {"enum": ["ab", "ab ab"]}, "minItems": 6, "maxItems": 10})
    )
    prompt = list(hybrid.prompt) * 3  # repeats, so n-gram drafts are proposed
    stats = SpecStats()
    for seed in (None, 9):
        plain = list(generate(hybrid.model, prompt, _params(seed), StopRule(120), grammar=grammar))
        spec = list(
            generate(
                hybrid.model, prompt, _params(seed), StopRule(120), spec=SpecConfig(), spec_stats=stats, grammar=grammar
            )
        )
        assert [g.token_id for g in spec] == [g.token_id for g in plain]
        assert "".join(g.text for g in plain).startswith("[")
    assert stats.drafts > 0
