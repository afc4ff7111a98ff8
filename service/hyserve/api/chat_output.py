"""A chat answer's text split, as it streams, into content, reasoning and tool calls: the one
place every front (gRPC, OpenAI, Anthropic) gets the structured answer from.

`ChatOutput` is per task: `push(text)` takes each piece of generated text (any size) and returns
what is now decided; `finish()` flushes what was held back and returns the complete calls. Text
that may still be the start of a marker is held back, so a marker never leaks into content.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hyserve.chat import (
    ChatEvent,
    ChatOutputParser,
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallBegin,
    ToolCallEnd,
    ToolCallFormat,
)

__all__ = ["ChatOutput", "ChatPiece", "OutputSpec", "ParsedCall", "ToolCallPiece"]


@dataclass(frozen=True)
class ToolCallPiece:
    """A piece of one call in OpenAI's streaming shape: id and name on the first piece of a call,
    then fragments of its arguments JSON."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class ChatPiece:
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallPiece, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments_json: str


@dataclass(frozen=True)
class OutputSpec:
    """How a task's answer is split: decided at preparation from the chat template and request."""

    tool_format: ToolCallFormat | None = None  # the template's call format; None: no tool parsing
    tools: tuple[dict[str, Any], ...] = ()
    reasoning_markers: tuple[str, str] | None = None
    starts_in_reasoning: bool = False  # the prompt already opened the reasoning block


def _piece(events: Sequence[ChatEvent]) -> ChatPiece:
    content, reasoning, calls = [], [], []
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallBegin):
            calls.append(ToolCallPiece(event.index, event.id, event.name))
        elif isinstance(event, ToolCallArguments):
            calls.append(ToolCallPiece(event.index, arguments=event.fragment))
    return ChatPiece("".join(content), "".join(reasoning), tuple(calls))


class ChatOutput:
    """Per task; not thread-safe (one task's events arrive in order on one coroutine)."""

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec
        self._parser = ChatOutputParser(
            spec.tool_format, list(spec.tools) or None, spec.reasoning_markers, spec.starts_in_reasoning
        )
        self._calls: list[ParsedCall] = []

    def _take(self, events: Sequence[ChatEvent]) -> ChatPiece:
        for event in events:
            if isinstance(event, ToolCallEnd):
                self._calls.append(ParsedCall(event.call.id, event.call.name, event.call.arguments_json))
        return _piece(events)

    def push(self, text: str) -> ChatPiece:
        return self._take(self._parser.push(text)) if text else ChatPiece()

    def finish(self) -> tuple[ChatPiece, tuple[ParsedCall, ...]]:
        events, _ = self._parser.finish()
        tail = self._take(events)
        return tail, tuple(self._calls)
