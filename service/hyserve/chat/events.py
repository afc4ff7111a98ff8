"""The events a chat model's parsed output is made of.

A streaming parser turns generated text into a sequence of these. Concatenating the ``text`` of the
``ContentDelta`` events gives the answer's content, of the ``ReasoningDelta`` events its reasoning,
and of the ``ToolCallArguments`` fragments of one ``index`` that call's arguments JSON, which is
exactly how the OpenAI streaming API presents ``content``, ``reasoning_content`` and
``tool_calls[i].function.arguments``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ChatEvent",
    "ContentDelta",
    "ReasoningDelta",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallBegin",
    "ToolCallEnd",
    "ToolCallEvent",
]


@dataclass(frozen=True)
class ToolCall:
    """One complete tool call. ``arguments_json`` is a JSON object's text. ``known`` is False when
    tools were declared and none has this name (the call is still reported, the caller decides)."""

    id: str
    name: str
    arguments_json: str
    known: bool = True


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallBegin:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    index: int
    fragment: str


@dataclass(frozen=True)
class ToolCallEnd:
    index: int
    call: ToolCall


ToolCallEvent = ContentDelta | ToolCallBegin | ToolCallArguments | ToolCallEnd
ChatEvent = ContentDelta | ReasoningDelta | ToolCallBegin | ToolCallArguments | ToolCallEnd
