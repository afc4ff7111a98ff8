"""Tool calls in a chat model's output: which syntax the model uses (from its chat template), a
streaming parser from generated text to call events, and grammars that force calls."""

from __future__ import annotations

from hyserve.chat.tool_calls.formats import ToolCallFormat, detect_tool_call_format
from hyserve.chat.tool_calls.grammar import auto_grammar, call_grammar
from hyserve.chat.tool_calls.stream import ToolCallStreamParser
from hyserve.chat.tool_calls.tools import new_call_id

__all__ = [
    "ToolCallFormat",
    "ToolCallStreamParser",
    "auto_grammar",
    "call_grammar",
    "detect_tool_call_format",
    "new_call_id",
]
