"""Chat output: reasoning, content and tool calls parsed from a chat model's generated text as it
streams, and the grammars that force tool calls. No model, engine or kernel here."""

from __future__ import annotations

from hyserve.chat.events import (
    ChatEvent,
    ContentDelta,
    ReasoningDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallBegin,
    ToolCallEnd,
    ToolCallEvent,
)
from hyserve.chat.output import ChatOutputParser, FinishKind, ParsedChatOutput, parse_chat_output
from hyserve.chat.reasoning import ReasoningSplitter, prompt_opens_reasoning, reasoning_markers
from hyserve.chat.tool_calls import (
    ToolCallFormat,
    ToolCallStreamParser,
    auto_grammar,
    call_grammar,
    detect_tool_call_format,
    new_call_id,
)

__all__ = [
    "ChatEvent",
    "ChatOutputParser",
    "ContentDelta",
    "FinishKind",
    "ParsedChatOutput",
    "ReasoningDelta",
    "ReasoningSplitter",
    "ToolCall",
    "ToolCallArguments",
    "ToolCallBegin",
    "ToolCallEnd",
    "ToolCallEvent",
    "ToolCallFormat",
    "ToolCallStreamParser",
    "auto_grammar",
    "call_grammar",
    "detect_tool_call_format",
    "new_call_id",
    "parse_chat_output",
    "prompt_opens_reasoning",
    "reasoning_markers",
]
