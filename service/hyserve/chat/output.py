"""A chat model's output parsed into reasoning, content and tool calls, as it streams.

The reasoning is split off first; the tool-call parser then reads only the answer part, so a
``<tool_call>`` the model merely thinks about is never taken for a call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hyserve.chat.events import ChatEvent, ContentDelta, ReasoningDelta, ToolCall
from hyserve.chat.reasoning import ReasoningSplitter
from hyserve.chat.tool_calls.formats import ToolCallFormat
from hyserve.chat.tool_calls.stream import ToolCallStreamParser
from hyserve.chat.tool_calls.tools import new_call_id

__all__ = ["ChatOutputParser", "FinishKind", "ParsedChatOutput", "parse_chat_output"]

FinishKind = Literal["stop", "tool_calls"]


class ChatOutputParser:
    """``push(text) -> events``; ``finish() -> (events, finish_kind)``. ``finish_kind`` is
    "tool_calls" when at least one call was parsed (``ToolCall.known`` tells whether its name is
    among the tools), else "stop". Without a format all answer text is content; without markers
    there is no reasoning."""

    def __init__(
        self,
        tool_format: ToolCallFormat | None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        markers: tuple[str, str] | None = None,
        starts_inside: bool = False,
        *,
        make_id: Callable[[], str] = new_call_id,
    ) -> None:
        self._reasoning = ReasoningSplitter(*markers, starts_inside=starts_inside) if markers else None
        self._tools = ToolCallStreamParser(tool_format, tools, make_id=make_id)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return self._tools.calls

    def push(self, text: str) -> list[ChatEvent]:
        if self._reasoning is None:
            return list(self._tools.push(text))
        return self._route(self._reasoning.push(text))

    def finish(self) -> tuple[list[ChatEvent], FinishKind]:
        events = self._route(self._reasoning.finish()) if self._reasoning is not None else []
        events += self._tools.finish()
        return events, ("tool_calls" if self._tools.calls else "stop")

    def _route(self, parts: Sequence[ContentDelta | ReasoningDelta]) -> list[ChatEvent]:
        events: list[ChatEvent] = []
        for part in parts:
            if isinstance(part, ReasoningDelta):
                events.append(part)
            else:
                events += self._tools.push(part.text)
        return events


@dataclass(frozen=True)
class ParsedChatOutput:
    content: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_kind: FinishKind


def parse_chat_output(
    text: str,
    tool_format: ToolCallFormat | None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    markers: tuple[str, str] | None = None,
    starts_inside: bool = False,
    *,
    make_id: Callable[[], str] = new_call_id,
) -> ParsedChatOutput:
    """A whole (non-streamed) output at once."""
    parser = ChatOutputParser(tool_format, tools, markers, starts_inside, make_id=make_id)
    events = parser.push(text)
    tail, finish_kind = parser.finish()
    events += tail
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    return ParsedChatOutput(content, reasoning, tuple(parser.tool_calls), finish_kind)
