"""A chat answer's text split, as it streams, into content, reasoning and tool calls: the one
place every front (gRPC, OpenAI, Anthropic) gets the structured answer from.

`ChatOutput` is per task: `push(text)` takes each piece of generated text (any size) and returns
what is now decided; `finish()` flushes what was held back and returns the complete calls. Text
that may still be the start of a marker is held back, so a marker never leaks into content.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    tool_format: object | None = None  # the template's call format; None: no tool parsing
    tools: tuple[dict, ...] = ()
    reasoning_markers: tuple[str, str] | None = None
    starts_in_reasoning: bool = False  # the prompt already opened the reasoning block


class ChatOutput:
    """Per task; not thread-safe (one task's events arrive in order on one coroutine)."""

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec

    def push(self, text: str) -> ChatPiece:
        return ChatPiece(content=text)

    def finish(self) -> tuple[ChatPiece, tuple[ParsedCall, ...]]:
        return ChatPiece(), ()
