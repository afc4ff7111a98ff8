"""What a request's answer must match and how its text is split: the constraint the sampler applies
(a request's own, or the grammar that forces a tool call) and the `OutputSpec` its `ChatOutput`
follows. Pure functions of the request, the rendered prompt and the chat template's traits.

A prompt that opens the model's reasoning (Qwen3.5's generation prompt ends in ``<think>``) gets
its constraint after the reasoning: the grammar first accepts free text up to the first close
marker, so a constraint never forbids the model to think. A request's own Lark grammar is taken as
it is (it describes the whole output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import llguidance

from hyserve.api.chat_input import ChatRequest
from hyserve.api.chat_output import OutputSpec
from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.chat import (
    ToolCallFormat,
    auto_grammar,
    call_grammar,
    detect_tool_call_format,
    prompt_opens_reasoning,
    reasoning_markers,
)
from hyserve.engine.constraints import ConstraintSpec
from hyserve.engine.constraints.compiler import MAX_SCHEMA_DEPTH, schema_depth, with_json_options

__all__ = ["NO_TRAITS", "AnswerFormatError", "TemplateTraits", "answer_format", "template_traits"]

_FIELD = "sampling.constraint"


class AnswerFormatError(ValueError):
    """The request's constraint or tool choice cannot be honoured; the message names the field."""


@dataclass(frozen=True)
class TemplateTraits:
    tool_format: ToolCallFormat | None
    reasoning_markers: tuple[str, str] | None


NO_TRAITS = TemplateTraits(None, None)  # text and token input: no template is involved


@lru_cache(maxsize=8)
def template_traits(source: str) -> TemplateTraits:
    return TemplateTraits(detect_tool_call_format(source), reasoning_markers(source))


def _request_constraint(sampling: pb.SamplingParams) -> ConstraintSpec | None:
    if not sampling.HasField("constraint"):
        return None
    kind = sampling.constraint.WhichOneof("kind")
    if kind is None:
        raise AnswerFormatError(f"{_FIELD}: set one of json_schema, json_object, regex or grammar")
    if kind == "json_object":
        if not sampling.constraint.json_object:
            raise AnswerFormatError(f"{_FIELD}.json_object: must be true when set")
        return ConstraintSpec("json_object", "", f"{_FIELD}.json_object")
    source = getattr(sampling.constraint, kind)
    if not source:
        raise AnswerFormatError(f"{_FIELD}.{kind}: must not be empty")
    return ConstraintSpec(kind, source, f"{_FIELD}.{kind}")


def _lark_answer(spec: ConstraintSpec) -> str | None:
    """The constraint as a Lark rule `answer`, to follow the reasoning; None for a request's own
    grammar, which stays whole."""
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.source)
        except (ValueError, RecursionError) as exc:  # nesting past the decoder's stack: refused too
            raise AnswerFormatError(f"{spec.field}: not valid JSON: {type(exc).__name__}: {exc}") from exc
        if not isinstance(schema, dict):
            raise AnswerFormatError(f"{spec.field}: a JSON Schema is an object")
        if schema_depth(schema) > MAX_SCHEMA_DEPTH:  # llguidance's schema compiler recurses
            raise AnswerFormatError(f"{spec.field}: nested deeper than {MAX_SCHEMA_DEPTH} levels")
        return f"answer: %json {json.dumps(with_json_options(schema))}\n"
    if spec.kind == "json_object":
        return f"answer: %json {json.dumps(with_json_options({'type': 'object'}))}\n"
    if spec.kind == "regex":
        return f"answer: {llguidance.regex_to_lark(spec.source)}\n"
    return None


def _after_reasoning(spec: ConstraintSpec, close: str, answer: str | None) -> ConstraintSpec:
    """`spec` preceded by free reasoning text that ends at its first `close` marker; `answer`: the
    grammar of the answer with its top rule named `answer` (None: made from `spec`)."""
    if answer is None:
        answer = _lark_answer(spec)
        if answer is None:
            return spec
    marker = "".join(f"\\x{b:02x}" for b in close.encode())
    head = (
        "start: REASONING answer\n"
        # any text that ends with the first close marker, then the blank lines templates put there
        f"REASONING: /(?s:.*){marker}[ \\t\\n]*/ & ~/(?s:.*){marker}(?s:.*){marker}(?s:.*)/\n"
    )
    return ConstraintSpec("grammar", head + answer, spec.field)


def answer_format(
    sampling: pb.SamplingParams, chat: ChatRequest | None, prompt_text: str, traits: TemplateTraits
) -> tuple[ConstraintSpec | None, OutputSpec | None]:
    """(the constraint to apply, how to split the answer) for one request."""
    constraint = _request_constraint(sampling)
    if chat is None or not chat.parse_output:
        return constraint, None
    markers = traits.reasoning_markers
    inside = markers is not None and prompt_opens_reasoning(prompt_text, markers)
    tools = tuple(chat.tools or ())
    choice = chat.choice
    calls_allowed = bool(tools) and choice.mode != "none" and traits.tool_format is not None
    output = OutputSpec(traits.tool_format if calls_allowed else None, tools, markers, inside)
    # a tool grammar that follows the reasoning is built with its top rule named `answer`
    top = "answer" if inside else "start"
    tool_grammar: str | None = None
    if choice.mode in ("required", "function"):
        if traits.tool_format is None:
            raise AnswerFormatError(
                "chat.tool_choice: the chat template writes tool calls in no format this server knows, "
                "so a required call cannot be enforced"
            )
        if constraint is not None:
            raise AnswerFormatError(f"{_FIELD}: cannot be combined with a required tool call (chat.tool_choice)")
        name = choice.function if choice.mode == "function" else "required"
        tool_grammar = call_grammar(traits.tool_format, list(tools), name, parallel=choice.parallel, start=top)
        constraint = ConstraintSpec("grammar", tool_grammar, "chat.tool_choice")
    elif calls_allowed and constraint is None:
        # auto: free text, but a call once begun is held to the tools' schemas
        tool_grammar = auto_grammar(traits.tool_format, list(tools), parallel=choice.parallel, start=top)
        constraint = ConstraintSpec("grammar", tool_grammar, "chat.tools")
    if constraint is not None and inside and markers is not None:
        constraint = _after_reasoning(constraint, markers[1], tool_grammar)
    return constraint, output
