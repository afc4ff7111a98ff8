"""Constraint compilation and token matching (engine/constraints/, engine/token_step.py) on the
tiny fixture vocabulary: errors that name the request field with llguidance's message, the
content cache, hostile sources refused or compiled in bounded time, masks that never allow
special tokens, determinism and rollback, and the grammar's end."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models

from hyserve.engine.constraints import (
    MAX_SOURCE_BYTES,
    ConstraintError,
    ConstraintSpec,
    ConstraintViolation,
    GrammarCompiler,
    TokenMatcher,
)
from hyserve.engine.constraints.compiler import MAX_SCHEMA_DEPTH, schema_depth, with_json_options
from hyserve.engine.constraints.matcher import background_masks
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.stop import FinishReason, StopDecision
from hyserve.engine.token_step import grammar_complete, token_logprobs
from hyserve.model.loader import LoadedModel, load_model

HANG_GUARD_S = 120.0  # a hang guard only: compiles here take milliseconds


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_models.write_model(tmp_path_factory.mktemp("constraints") / "qwen35.gguf", "qwen35", qtype="q8_0")
    return load_model(Path(path))


@pytest.fixture
def compiler(model: LoadedModel) -> GrammarCompiler:
    return GrammarCompiler(model.tokenizer, model.arch.n_vocab)


def encode(model: LoadedModel, text: str) -> list[int]:
    return model.tokenizer.encode(text, add_special=False, parse_special=False)


# --- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "source", "library_says"),
    [
        ("grammar", "start: foo", 'unknown name: "foo"'),
        ("grammar", "start: (", "start: ("),
        ("regex", "(a", "unclosed group"),
        ("json_schema", '{"type": "foo"}', "Invalid type: foo"),
        ("json_schema", '{"type": "object"', "not valid JSON"),
        ("json_schema", "[1, 2]", "a JSON Schema is an object"),
        ("regex", "", "an empty regex"),
    ],
)
def test_errors_name_the_field_and_carry_the_library_message(
    compiler: GrammarCompiler, kind: str, source: str, library_says: str
) -> None:
    with pytest.raises(ConstraintError) as info:
        compiler.compile(ConstraintSpec(kind, source, "response_format.json_schema"))  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("response_format.json_schema: "), message
    assert library_says in message, message
    assert info.value.field == "response_format.json_schema"


def test_unknown_kind_and_oversized_source_are_refused(compiler: GrammarCompiler) -> None:
    with pytest.raises(ConstraintError, match="sampling.constraint: unknown constraint kind"):
        ConstraintSpec("gbnf", "x", "sampling.constraint")  # type: ignore[arg-type]
    big = json.dumps({"enum": ["x" * 1000] * (MAX_SOURCE_BYTES // 1000)})
    with pytest.raises(ConstraintError, match=r"^f: \d+ bytes, more than"):
        compiler.compile(ConstraintSpec("json_schema", big, "f"))


# --- the cache ----------------------------------------------------------------------------------


def test_the_cache_hits_by_content_whatever_the_field(compiler: GrammarCompiler) -> None:
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    first = compiler.compile(ConstraintSpec("json_schema", schema, "a.field"))
    again = compiler.compile(ConstraintSpec("json_schema", schema, "another.field"))
    assert again is first
    assert (compiler.hits, compiler.misses) == (1, 1)
    other = compiler.compile(ConstraintSpec("json_schema", schema.replace(" ", ""), "a.field"))
    assert other is not first and other.key != first.key
    as_grammar = compiler.compile(ConstraintSpec("grammar", 'start: "a"'))
    assert compiler.compile(ConstraintSpec("regex", 'start: "a"')).key != as_grammar.key  # the kind is in the key
    # errors are cached too, and still name the field of the request at hand
    for field in ("one", "two"):
        with pytest.raises(ConstraintError, match=f"^{field}: "):
            compiler.compile(ConstraintSpec("grammar", "start: nope", field))
    assert compiler.misses == 5 and compiler.hits == 2


def test_the_cache_is_bounded_least_recently_used_first(model: LoadedModel) -> None:
    compiler = GrammarCompiler(model.tokenizer, model.arch.n_vocab, cache_entries=2)
    a = compiler.compile(ConstraintSpec("regex", "a+"))
    compiler.compile(ConstraintSpec("regex", "b+"))
    assert compiler.compile(ConstraintSpec("regex", "a+")) is a  # a is now the most recent
    compiler.compile(ConstraintSpec("regex", "c+"))  # evicts b
    assert len(compiler) == 2
    assert compiler.compile(ConstraintSpec("regex", "a+")) is a
    misses = compiler.misses
    compiler.compile(ConstraintSpec("regex", "b+"))
    assert compiler.misses == misses + 1


def test_concurrent_compiles_agree(compiler: GrammarCompiler) -> None:
    specs = [ConstraintSpec("json_schema", json.dumps({"type": "array", "maxItems": i})) for i in range(4)] * 4
    results: list[str] = [""] * len(specs)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = compiler.compile(specs[i]).grammar
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(specs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD_S)
    assert errors == []
    assert all(results[i] == results[i % 4] for i in range(len(specs)))
    assert len(compiler) == 4


# --- hostile sources ----------------------------------------------------------------------------


def _nested(depth: int) -> dict[str, object]:
    schema: dict[str, object] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _nested_text(depth: int) -> str:
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "string"}' + "}}" * depth


def _any_of_explosion() -> str:
    options = [[{"properties": {f"p{j}{i}": {"type": "integer"}}} for j in range(8)] for i in range(12)]
    return json.dumps({"allOf": [{"anyOf": o} for o in options]})


def _many_properties(n: int) -> str:
    names = [f"p{i}" for i in range(n)]
    return json.dumps({"type": "object", "required": names, "properties": {k: {"type": "string"} for k in names}})


HOSTILE: dict[str, tuple[str, str]] = {
    "deep schema": ("json_schema", _nested_text(500)),
    "deep JSON text": ("json_schema", "[" * 100_000 + "]" * 100_000),
    "huge enum": ("json_schema", json.dumps({"enum": [f"value-{i}" for i in range(15_000)]})),
    "anyOf explosion": ("json_schema", _any_of_explosion()),
    "ref fan-out": (
        "json_schema",
        json.dumps(
            {
                "$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(40)}
                | {"d40": {"type": "string"}},
                "$ref": "#/$defs/d0",
            }
        ),
    ),
    "many properties": (
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "required": [f"p{i}" for i in range(3000)],
                "properties": {f"p{i}": {"type": "string"} for i in range(3000)},
            }
        ),
    ),
    "nested repetitions": ("regex", "((a|aa)*b{1000}(c{1,1000}){1,1000})+"),
    "huge counted repetition": ("regex", "[a-z]{0,100000}x{5000}"),
    "deep Lark": ("grammar", "start: " + "(" * 3000 + '"a"' + ")" * 3000),
}


def _bounded(fn: Callable[[], object]) -> object:
    """Run fn on a thread; fail (rather than hang the suite) if it does not return."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(_outcome(fn)), daemon=True)
    thread.start()
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "did not return"
    return out[0]


def _outcome(fn: Callable[[], object]) -> object:
    try:
        return fn()
    except (ConstraintError, ConstraintViolation) as exc:
        return exc


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_sources_are_refused_or_compiled_in_bounded_time(compiler: GrammarCompiler, name: str) -> None:
    kind, source = HOSTILE[name]
    spec = ConstraintSpec(kind, source, "sampling.constraint")  # type: ignore[arg-type]
    result = _bounded(lambda: compiler.compile(spec))
    if isinstance(result, ConstraintError):
        assert str(result).startswith("sampling.constraint: ")
        return
    assert not isinstance(result, ConstraintViolation)
    matcher = TokenMatcher(result)  # type: ignore[arg-type]
    # per-token work is bounded too: a mask comes back, or the matcher reports its limit
    mask = _bounded(matcher.allowed)
    assert isinstance(mask, ConstraintViolation) or mask.any()  # type: ignore[union-attr]


def test_nesting_is_measured_without_recursion() -> None:
    assert schema_depth(_nested(3)) == 1 + 3 * 2  # each level: the object and its "properties"
    deep: object = []
    for _ in range(10_000):
        deep = [deep]
    assert schema_depth(deep) == 10_001
    assert MAX_SCHEMA_DEPTH < 10_001


# --- masks ----------------------------------------------------------------------------------------


def test_special_tokens_are_never_allowed_and_eos_only_at_the_end(
    model: LoadedModel, compiler: GrammarCompiler
) -> None:
    tok = model.tokenizer
    special = [i for i in range(tok.vocab_size) if tok.is_special(i)]
    eog = sorted(tok.eog_ids)
    assert special and eog
    matcher = TokenMatcher(compiler.compile(ConstraintSpec("json_schema", '{"type": "string", "maxLength": 40}')))
    matcher.consume(encode(model, '"')[0])
    inside = matcher.allowed()
    assert inside.sum() > 100  # most of the vocabulary can go inside a string
    assert not inside[special].any()  # a special token's text never stands for its characters
    assert not inside[eog].any()  # the string is not closed yet
    for token in encode(model, 'ab"'):
        matcher.consume(token)
    done = matcher.allowed()
    assert matcher.is_stopped and matcher.is_accepting
    assert sorted(np.flatnonzero(done).tolist()) == eog


def test_masks_depend_only_on_the_tokens_consumed_and_roll_back(model: LoadedModel, compiler: GrammarCompiler) -> None:
    grammar = compiler.compile(ConstraintSpec("json_schema", '{"type": "array", "items": {"type": "integer"}}'))
    text = encode(model, "[12, 345, 6]")
    a, b = TokenMatcher(grammar), TokenMatcher(grammar)
    masks = []
    for token in text:
        a.start_mask()  # in the background on one, inline on the other
        masks.append(a.allowed().copy())
        assert np.array_equal(masks[-1], b.allowed())
        assert masks[-1][token]
        a.consume(token)
        b.consume(token)
    a.rollback(3)
    assert a.consumed == len(text) - 3
    assert np.array_equal(a.allowed(), masks[len(text) - 3])
    with pytest.raises(ValueError):
        a.rollback(len(text))


def test_apply_masks_a_copy_and_a_refused_token_raises(model: LoadedModel, compiler: GrammarCompiler) -> None:
    matcher = TokenMatcher(compiler.compile(ConstraintSpec("regex", "[0-9]+")))
    logits = np.linspace(-1.0, 1.0, model.arch.n_vocab, dtype=np.float32)
    kept = logits.copy()
    masked = matcher.apply(logits)
    assert np.array_equal(logits, kept)
    allowed = matcher.allowed()
    assert np.array_equal(masked[allowed], logits[allowed])
    assert np.all(np.isneginf(masked[~allowed]))
    with pytest.raises(ConstraintViolation):
        matcher.consume(encode(model, "x")[0])
    assert matcher.error is not None
    with pytest.raises(ConstraintViolation):
        matcher.apply(logits[:-1])


def test_logprobs_are_those_of_the_masked_distribution(model: LoadedModel, compiler: GrammarCompiler) -> None:
    matcher = TokenMatcher(compiler.compile(ConstraintSpec("grammar", 'start: "yes" | "no"')))
    allowed = matcher.allowed()
    logits = np.random.default_rng(0).normal(size=model.arch.n_vocab).astype(np.float32)
    lp, top = token_logprobs(logits, [], SamplingParams(), 20, matcher)
    assert np.isclose(np.exp(lp[allowed]).sum(), 1.0)
    assert np.all(np.isneginf(lp[~allowed]))
    assert len(top) == int(allowed.sum()) < 20
    assert all(allowed[t] for t, _ in top)
    assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    unmasked, top5 = token_logprobs(logits, [], SamplingParams(), 5, None)
    assert len(top5) == 5 and np.all(np.isfinite(unmasked))


@pytest.mark.parametrize(
    ("reason", "eog", "stopped", "ends"),
    [
        (None, True, True, True),  # the closing EOS with ignore_eos: nothing else could follow
        (None, False, True, False),  # the grammar's last token: its EOS comes next
        (None, True, False, False),
        (FinishReason.EOS, True, True, False),  # the stop rules ended it already
        (FinishReason.MAX_TOKENS, False, True, False),
    ],
)
def test_a_complete_grammar_ends_on_its_eos(reason: FinishReason | None, eog: bool, stopped: bool, ends: bool) -> None:
    assert grammar_complete(StopDecision("", reason), eog, stopped) is ends


def _accepts(compiler: GrammarCompiler, model: LoadedModel, spec: ConstraintSpec, text: str) -> bool:
    matcher = TokenMatcher(compiler.compile(spec))
    try:
        for ch in text:
            for token in encode(model, ch):
                matcher.consume(token)
    except ConstraintViolation:
        return False
    return matcher.is_accepting


def test_json_is_written_as_json_dumps_writes_it(model: LoadedModel, compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    direct = ConstraintSpec("json_schema", json.dumps(schema))
    assert _accepts(compiler, model, direct, json.dumps({"a": 1, "b": 2}))
    assert not _accepts(compiler, model, direct, '{"a":1,"b":2}')
    assert not _accepts(compiler, model, direct, '{"a": 1,  "b": 2}')
    # embedded in Lark, a schema gets the same options only through its own "x-guidance"
    embedded = ConstraintSpec("grammar", f"start: %json {json.dumps(with_json_options(schema))}")
    assert _accepts(compiler, model, embedded, json.dumps({"a": 1, "b": 2}))
    assert not _accepts(compiler, model, embedded, '{"a":1,"b":2}')
    own = with_json_options({**schema, "x-guidance": {"whitespace_flexible": True}})
    assert own["x-guidance"]["whitespace_flexible"] is True


@pytest.mark.parametrize(
    ("mode", "device", "threads", "cpus", "background"),
    [
        ("auto", "cpu", 2, 2, False),  # the kernels use every CPU: a mask thread would slow them
        ("auto", "cpu", 8, 16, True),
        ("auto", "gpu", 16, 16, True),  # the forward runs on the device
        ("background", "cpu", 2, 2, True),
        ("inline", "gpu", 1, 16, False),
    ],
)
def test_where_masks_are_computed(mode: str, device: str, threads: int, cpus: int, background: bool) -> None:
    assert background_masks(mode, device, threads, cpus) is background
