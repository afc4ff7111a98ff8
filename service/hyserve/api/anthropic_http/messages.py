"""Anthropic's `system` and `messages` -> the gRPC `ChatMessage`s the chat template renders.

Pure functions over a decoded JSON body; they raise `AnthropicError` naming the body's field.

- `system` (a string or text blocks) becomes one system message, without the per-request billing
  line some clients put into it (`drop_billing_lines`): that line changes on every request, and a
  system prompt that differs each time would start every prompt anew instead of resuming it.
- A user message's `tool_result` blocks become "tool" messages answering their `tool_use_id`, in
  order; its text blocks follow as one user message.
- An assistant message's `text` blocks are its content, its `thinking` blocks its reasoning and its
  `tool_use` blocks its tool calls; `redacted_thinking` is dropped (its text is not readable).
"""

from __future__ import annotations

import json
import re
from typing import Any

from hyserve.api.anthropic_http.errors import AnthropicError
from hyserve.api.gen import hyserve_pb2 as pb

__all__ = ["chat_messages", "drop_billing_lines", "system_message"]

_BILLING_LINE = re.compile(r"^[ \t]*x-anthropic-billing-header[ \t]*:.*(?:\r?\n|$)", re.IGNORECASE | re.MULTILINE)
_UNSUPPORTED = {"image", "document", "search_result", "container_upload"}


def drop_billing_lines(text: str) -> str:
    """`text` without its `x-anthropic-billing-header: ...` lines (each line whole, with its newline)."""
    return _BILLING_LINE.sub("", text)


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise AnthropicError(f'{where}: must be an object with a "type"')
    kind: str = block["type"]
    if kind in _UNSUPPORTED:
        raise AnthropicError(f"{where}: {kind} blocks are not supported by this server (text only)")
    return kind


def _text(block: dict[str, Any], where: str, key: str = "text") -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise AnthropicError(f"{where}.{key}: must be a string")
    return value


def _text_blocks(content: Any, where: str) -> list[str]:
    """The texts of a string or an array of text blocks."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise AnthropicError(f"{where}: must be a string or an array of text blocks")
    texts = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        if _block_type(block, at) != "text":
            raise AnthropicError(f"{at}: only text blocks are allowed here")
        texts.append(_text(block, at))
    return texts


def system_message(system: Any) -> pb.ChatMessage | None:
    """The system prompt as one message (None when absent or empty), billing lines dropped."""
    if system is None:
        return None
    texts = [drop_billing_lines(t) for t in _text_blocks(system, "system")]
    kept = [t for t in texts if t.strip()]
    return pb.ChatMessage(role="system", content="\n".join(kept)) if kept else None


def _tool_result(block: dict[str, Any], where: str) -> pb.ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise AnthropicError(f"{where}.tool_use_id: must be a non-empty string")
    content = block.get("content", "")
    return pb.ChatMessage(
        role="tool", content="\n".join(_text_blocks(content, f"{where}.content")), tool_call_id=call_id
    )


def _user(content: list[Any], where: str) -> list[pb.ChatMessage]:
    results: list[pb.ChatMessage] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_result":
            results.append(_tool_result(block, at))
        else:
            raise AnthropicError(f"{at}: a user message holds text and tool_result blocks (got {kind!r})")
    if texts or not results:
        results.append(pb.ChatMessage(role="user", content="\n".join(texts)))
    return results


def _tool_call(block: dict[str, Any], where: str) -> pb.ToolCall:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id:
        raise AnthropicError(f"{where}.id: must be a non-empty string")
    if not isinstance(name, str):
        raise AnthropicError(f"{where}.name: must be a string")
    if not isinstance(arguments, dict):
        raise AnthropicError(f"{where}.input: must be an object")
    try:
        arguments_json = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        raise AnthropicError(f"{where}.input: {exc}") from exc
    return pb.ToolCall(id=call_id, name=name, arguments_json=arguments_json)


def _assistant(content: list[Any], where: str) -> pb.ChatMessage:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[pb.ToolCall] = []
    for j, block in enumerate(content):
        at = f"{where}[{j}]"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "thinking":
            thoughts.append(_text(block, at, "thinking"))
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        elif kind != "redacted_thinking":
            raise AnthropicError(f"{at}: an assistant message holds text, thinking and tool_use blocks (got {kind!r})")
    message = pb.ChatMessage(role="assistant", content="\n".join(texts), tool_calls=calls)
    if thoughts:
        message.reasoning_content = "\n".join(thoughts)
    return message


def chat_messages(messages: Any) -> list[pb.ChatMessage]:
    """The conversation's turns as ChatMessages, in order (one user turn may become several)."""
    if not isinstance(messages, list) or not messages:
        raise AnthropicError("messages: must be a non-empty array")
    out: list[pb.ChatMessage] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise AnthropicError(f"{where}: must be an object")
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise AnthropicError(f'{where}.role: must be "user" or "assistant" (the system prompt goes in "system")')
        if isinstance(content, str):
            out.append(pb.ChatMessage(role=role, content=content))
            continue
        if not isinstance(content, list):
            raise AnthropicError(f"{where}.content: must be a string or an array of content blocks")
        if role == "user":
            out.extend(_user(content, f"{where}.content"))
        else:
            out.append(_assistant(content, f"{where}.content"))
    return out
