"""Constraint sources -> compiled grammars, once per loaded model, cached by content.

`GrammarCompiler.compile(spec)` checks a `ConstraintSpec` and compiles it with llguidance: the
source is turned into an llguidance grammar (`grammar_from_json_schema`, `grammar_from_regex`,
`grammar_from_lark`), then into a matcher over the model's vocabulary, which is where llguidance
reports errors (unknown rule names, bad regexes, unsupported schema keywords) and enforces
`LLParserLimits`. The result keeps that matcher as a template: each task gets a copy
(`new_matcher`, about a microsecond), never a recompilation on the engine thread.

Work is bounded before and during compilation, so a source crafted to explode is refused in
bounded time: a size limit on the source, a nesting limit on JSON schemas (the schema compiler
recurses), and llguidance's fuel and size limits. Outcomes (grammars and errors) are cached by a
hash of kind and source in a bounded LRU, so a resent schema costs a dictionary lookup.

Thread-safe: the API's request-preparation threads call `compile` concurrently; llguidance drops
the GIL while it builds the vocabulary and the matcher.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import llguidance

from hyserve.engine.constraints.spec import MAX_SOURCE_BYTES, ConstraintError, ConstraintSpec
from hyserve.engine.constraints.vocabulary import build_lltokenizer

if TYPE_CHECKING:
    from hyserve.model.tokenizer import Tokenizer

__all__ = [
    "JSON_OPTIONS",
    "MAX_SCHEMA_DEPTH",
    "CompiledGrammar",
    "GrammarCompiler",
    "parser_limits",
    "schema_depth",
    "with_json_options",
]

# JSON as `json.dumps` writes it: one space after ':' and ','; no other whitespace, so a model
# cannot pad an answer with whitespace forever. A schema's own "x-guidance" options override these.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_SCHEMA_DEPTH = 64  # nested arrays/objects in the schema's JSON text
CACHE_ENTRIES = 256


def parser_limits() -> llguidance.LLParserLimits:
    """llguidance's bounds on grammar size, lexer construction and per-token work (its defaults,
    fewer lexer states: each costs 1-2 kB), without the grammar and parser state in messages."""
    return llguidance.LLParserLimits(max_lexer_states=50_000, verbose_errors=False)


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A checked, compiled constraint. Immutable: tasks share it and copy its matcher."""

    kind: str
    key: str  # content hash of kind and source
    grammar: str  # llguidance's grammar text
    n_vocab: int
    _template: llguidance.LLMatcher = field(repr=False)

    def new_matcher(self) -> llguidance.LLMatcher:
        """A fresh matcher at the start of the grammar (the template itself is never advanced)."""
        return self._template.deep_copy()


def with_json_options(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with JSON_OPTIONS as its "x-guidance" defaults (its own options win): for a schema
    embedded in a Lark grammar with `%json`, which the compiler's defaults do not reach."""
    return {**schema, "x-guidance": {**JSON_OPTIONS, **schema.get("x-guidance", {})}}


def schema_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (0 for a scalar), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            deepest = max(deepest, depth + 1)
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
            deepest = max(deepest, depth + 1)
    return deepest


def _grammar_text(spec: ConstraintSpec) -> str:
    """llguidance's grammar for a spec. Raises ConstraintError for what is refused before compiling."""
    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if not spec.source:
        raise ConstraintError(spec.field, f"an empty {spec.kind.replace('_', ' ')}")
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.source)
        except (ValueError, RecursionError) as exc:
            raise ConstraintError(spec.field, f"not valid JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise ConstraintError(spec.field, "a JSON Schema is an object (or true/false)")
        if schema_depth(schema) > MAX_SCHEMA_DEPTH:
            raise ConstraintError(spec.field, f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(spec.source, defaults=JSON_OPTIONS)
        except ValueError as exc:
            raise ConstraintError(spec.field, str(exc)) from None
    if spec.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec.source)
    return llguidance.LLMatcher.grammar_from_lark(spec.source)


class GrammarCompiler:
    """Compiles constraints for one model. The vocabulary is built on the first compile."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int, cache_entries: int = CACHE_ENTRIES) -> None:
        self._tokenizer = tokenizer
        self.n_vocab = n_vocab
        self._cache_entries = cache_entries
        self._lltokenizer: llguidance.LLTokenizer | None = None
        self._build_lock = threading.Lock()
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, CompiledGrammar | str] = OrderedDict()  # key -> grammar or error
        self.hits = 0
        self.misses = 0

    def lltokenizer(self) -> llguidance.LLTokenizer:
        """The model's vocabulary for llguidance, built once (the first caller waits for it)."""
        if self._lltokenizer is None:
            with self._build_lock:
                if self._lltokenizer is None:
                    self._lltokenizer = build_lltokenizer(self._tokenizer, self.n_vocab)
        return self._lltokenizer

    def compile(self, spec: ConstraintSpec) -> CompiledGrammar:
        """The compiled grammar for `spec`, from the cache when the same kind and source were
        compiled before. Raises ConstraintError naming `spec.field` with llguidance's message."""
        size = len(spec.source.encode("utf-8"))
        if size > MAX_SOURCE_BYTES:
            raise ConstraintError(spec.field, f"{size} bytes, more than the {MAX_SOURCE_BYTES} allowed")
        key = hashlib.sha256(f"{spec.kind}\0{spec.source}".encode()).hexdigest()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
        if cached is None:
            cached = self._compile(spec, key)
            with self._lock:
                self.misses += 1
                self._cache[key] = cached
                self._cache.move_to_end(key)
                while len(self._cache) > self._cache_entries:
                    self._cache.popitem(last=False)
        if isinstance(cached, str):
            raise ConstraintError(spec.field, cached)
        return cached

    def _compile(self, spec: ConstraintSpec, key: str) -> CompiledGrammar | str:
        """The grammar, or llguidance's error message (cached like a grammar)."""
        try:
            grammar = _grammar_text(spec)
        except ConstraintError as exc:
            return exc.detail
        matcher = llguidance.LLMatcher(self.lltokenizer(), grammar, log_level=0, limits=parser_limits())
        if matcher.is_error():
            return matcher.get_error().strip() or "the constraint could not be compiled"
        return CompiledGrammar(spec.kind, key, grammar, self.n_vocab, matcher)

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)
