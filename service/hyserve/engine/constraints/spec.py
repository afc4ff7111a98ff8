"""What a request asks the output to match, and the error a bad constraint gives.

A `ConstraintSpec` is plain data built by the API layer from a request (gRPC `SamplingParams` or
OpenAI `response_format`); `GrammarCompiler.compile` turns it into a `CompiledGrammar`. Errors
name the request field, so the API answers INVALID_ARGUMENT (HTTP 400) with where the problem is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["MAX_SOURCE_BYTES", "ConstraintError", "ConstraintKind", "ConstraintSpec"]

ConstraintKind = Literal["json_schema", "json_object", "regex", "grammar"]
KINDS: tuple[ConstraintKind, ...] = ("json_schema", "json_object", "regex", "grammar")

# A larger source is refused before any parsing: compile time and memory grow with it.
MAX_SOURCE_BYTES = 256 * 1024


@dataclass(frozen=True)
class ConstraintSpec:
    """`source`: the JSON Schema as JSON text, the regular expression, or a Lark grammar in
    llguidance's dialect; empty for `json_object`. `field`: the request field to name in errors
    (e.g. "sampling.constraint.json_schema", "response_format.json_schema")."""

    kind: ConstraintKind
    source: str = ""
    field: str = "constraint"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(self.field, f"unknown constraint kind {self.kind!r} (one of {', '.join(KINDS)})")


class ConstraintError(ValueError):
    """A constraint that cannot be used: malformed, unsupported, or over the limits."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message
