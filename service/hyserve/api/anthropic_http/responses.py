"""Anthropic response bodies and stream events, built from a task's structured answer.

`ContentBlocks` turns the `ChatPiece`s of `chat_output.ChatOutput` into content-block events
(`content_block_start` / `_delta` / `_stop`), one block open at a time: reasoning becomes
`thinking` blocks, content `text` blocks and each tool call a `tool_use` block, a new block
whenever the kind (or the call) changes. A streamed response sends these events; a non-streamed
one applies the same events to its `content` (`MessageContent`), so both carry the same blocks.
"""

from __future__ import annotations

import json
from typing import Any

from hyserve.api.chat_output import ChatPiece, ParsedCall, ToolCallPiece
from hyserve.engine.task import FinishReason, Usage

__all__ = [
    "ContentBlocks",
    "Event",
    "MessageContent",
    "final_usage",
    "message_json",
    "sse",
    "stop_reason",
    "usage_json",
]

Event = tuple[str, dict[str, Any]]  # (event name, data)

_STOP = {
    FinishReason.EOS: "end_turn",
    FinishReason.STOP_TOKEN: "end_turn",
    FinishReason.STOP_STRING: "stop_sequence",
    FinishReason.MAX_TOKENS: "max_tokens",
    FinishReason.CONTEXT_FULL: "max_tokens",
    FinishReason.CANCELLED: "cancelled",  # stopped by the gRPC Cancel RPC (Anthropic has no such reason)
}


def stop_reason(reason: FinishReason, made_calls: bool) -> str:
    """`tool_use` when the answer ended with complete calls; else the engine's reason in Anthropic's words."""
    if made_calls and reason in (FinishReason.EOS, FinishReason.STOP_TOKEN, FinishReason.STOP_STRING):
        return "tool_use"
    return _STOP[reason]


def usage_json(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    """Anthropic's usage: `input_tokens` are the prompt tokens evaluated, `cache_read_input_tokens`
    those resumed from the prompt cache (the prompt has their sum)."""
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": output_tokens,
    }


def final_usage(usage: Usage) -> dict[str, Any]:
    return usage_json(usage.prompt_tokens, usage.cached_prompt_tokens, usage.completion_tokens)


def message_json(
    id_: str,
    model: str,
    content: list[dict[str, Any]],
    stop: str | None,
    stop_sequence: str | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": id_,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


def sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


def _input(arguments_json: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments_json) if arguments_json.strip() else {}
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


class ContentBlocks:
    """ChatPieces -> content-block events, in order. Per response; not thread-safe."""

    def __init__(self) -> None:
        self.index = -1
        self._open: str | None = None  # "text", "thinking" or "tool_use"
        self._call = -1  # the open tool_use block's call index
        self._call_ids: set[str] = set()

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _start(self, block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self.index += 1
        self._open = block["type"]
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block})
        )
        return events

    def _delta(self, delta: dict[str, Any]) -> Event:
        return "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}

    def _text(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        events: list[Event] = []
        if self._open != kind:
            empty = (
                {"type": "thinking", "thinking": "", "signature": ""}
                if kind == "thinking"
                else {"type": "text", "text": ""}
            )
            events = self._start(empty)
        delta_key = "thinking" if kind == "thinking" else "text"
        events.append(self._delta({"type": f"{delta_key}_delta", delta_key: text}))
        return events

    def _call_piece(self, piece: ToolCallPiece) -> list[Event]:
        events: list[Event] = []
        if self._open != "tool_use" or piece.index != self._call or piece.id:
            call_id = piece.id or f"toolu_{piece.index}"
            self._call_ids.add(call_id)
            self._call = piece.index
            events = self._start({"type": "tool_use", "id": call_id, "name": piece.name, "input": {}})
        if piece.arguments:
            events.append(self._delta({"type": "input_json_delta", "partial_json": piece.arguments}))
        return events

    def push(self, piece: ChatPiece) -> list[Event]:
        events = self._text("thinking", piece.reasoning) + self._text("text", piece.content)
        for call in piece.tool_calls:
            events += self._call_piece(call)
        return events

    def finish(self, piece: ChatPiece, calls: tuple[ParsedCall, ...]) -> list[Event]:
        """The last piece, then any complete call no piece announced, then the last block's stop."""
        events = self.push(piece)
        for call in calls:
            if call.id not in self._call_ids:
                self._call_ids.add(call.id)
                events += self._start({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
                if call.arguments_json:
                    events.append(self._delta({"type": "input_json_delta", "partial_json": call.arguments_json}))
        return events + self._close()


class MessageContent:
    """A non-streamed message's `content`, built by applying the same events a stream sends."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._inputs: dict[int, str] = {}  # tool_use block index -> its input JSON so far

    def add(self, events: list[Event]) -> None:
        for name, data in events:
            if name == "content_block_start":
                self.blocks.append(dict(data["content_block"]))
            elif name == "content_block_delta":
                index, delta = data["index"], data["delta"]
                if delta["type"] == "text_delta":
                    self.blocks[index]["text"] += delta["text"]
                elif delta["type"] == "thinking_delta":
                    self.blocks[index]["thinking"] += delta["thinking"]
                elif delta["type"] == "input_json_delta":
                    self._inputs[index] = self._inputs.get(index, "") + delta["partial_json"]

    def result(self, calls: tuple[ParsedCall, ...]) -> list[dict[str, Any]]:
        """The blocks, each tool_use with its input: the complete call's arguments, else its fragments."""
        parsed = {c.id: c.arguments_json for c in calls}
        for index, block in enumerate(self.blocks):
            if block["type"] == "tool_use":
                block["input"] = _input(parsed.get(block["id"], self._inputs.get(index, "")))
        return self.blocks
