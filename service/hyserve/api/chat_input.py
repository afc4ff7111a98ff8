"""A gRPC `ChatInput` -> what the chat template renders (messages, tools) and what the answer is
held to (tool choice), with the field named in every `ValidationError`.

Pure functions: they read the message and change nothing. Tool-call arguments travel as JSON text
and reach the template as mappings, as Hugging Face transformers and llama.cpp pass them, so a
template's `arguments|items` works.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.engine.constraints.compiler import MAX_SCHEMA_DEPTH, schema_depth

__all__ = ["ChatRequest", "ChatValidationError", "ToolChoiceSpec", "chat_request"]

MAX_TOOLS = 128
MAX_TOOL_CALLS_PER_MESSAGE = 64
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class ChatValidationError(ValueError):
    """The chat part of a request is malformed; the message starts with the field."""


@dataclass(frozen=True)
class ToolChoiceSpec:
    mode: Literal["auto", "none", "required", "function"]
    function: str = ""  # mode == "function": the one function the answer must call
    parallel: bool = True


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # OpenAI's shape, as templates expect: {"type", "function"}
    choice: ToolChoiceSpec
    parse_output: bool


def _json_object(text: str, where: str, *, empty_ok: bool) -> dict[str, Any]:
    if not text and empty_ok:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # nesting past the decoder's stack: refused too
        raise ChatValidationError(f"{where}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ChatValidationError(f"{where}: must be a JSON object")
    return value


def _tools(chat: pb.ChatInput) -> list[dict[str, Any]] | None:
    if not chat.tools:
        return None
    if len(chat.tools) > MAX_TOOLS:
        raise ChatValidationError(f"chat.tools: at most {MAX_TOOLS} (got {len(chat.tools)})")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(chat.tools):
        where = f"chat.tools[{i}]"
        if not _TOOL_NAME.fullmatch(tool.name):
            raise ChatValidationError(f"{where}.name: 1-64 characters from [A-Za-z0-9_.-] (got {tool.name!r})")
        if tool.name in seen:
            raise ChatValidationError(f"{where}.name: {tool.name!r} is given twice")
        seen.add(tool.name)
        parameters = _json_object(tool.parameters_json, f"{where}.parameters_json", empty_ok=True)
        if schema_depth(parameters) > MAX_SCHEMA_DEPTH:  # it becomes part of a grammar: the same bound
            raise ChatValidationError(f"{where}.parameters_json: nested deeper than {MAX_SCHEMA_DEPTH} levels")
        if parameters and parameters.get("type", "object") != "object":
            raise ChatValidationError(f'{where}.parameters_json: must be an object schema ("type": "object")')
        function: dict[str, Any] = {"name": tool.name, "description": tool.description}
        function["parameters"] = parameters or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(chat: pb.ChatInput, tools: list[dict[str, Any]] | None) -> ToolChoiceSpec:
    parallel = chat.parallel_tool_calls if chat.HasField("parallel_tool_calls") else True
    kind = chat.tool_choice.WhichOneof("choice") if chat.HasField("tool_choice") else None
    if kind == "function":
        names = {t["function"]["name"] for t in tools or ()}
        if chat.tool_choice.function not in names:
            raise ChatValidationError(
                f"chat.tool_choice.function: {chat.tool_choice.function!r} is not one of chat.tools"
            )
        return ToolChoiceSpec("function", chat.tool_choice.function, parallel)
    mode = chat.tool_choice.mode if kind == "mode" else pb.TOOL_CHOICE_MODE_UNSPECIFIED
    if mode == pb.TOOL_CHOICE_MODE_REQUIRED:
        if not tools:
            raise ChatValidationError("chat.tool_choice: required needs chat.tools")
        return ToolChoiceSpec("required", parallel=parallel)
    if mode == pb.TOOL_CHOICE_MODE_NONE:
        return ToolChoiceSpec("none", parallel=parallel)
    if mode not in (pb.TOOL_CHOICE_MODE_UNSPECIFIED, pb.TOOL_CHOICE_MODE_AUTO):
        raise ChatValidationError(f"chat.tool_choice.mode: unknown value {mode}")
    return ToolChoiceSpec("auto", parallel=parallel)


def _message(i: int, m: pb.ChatMessage, call_ids: set[str]) -> dict[str, Any]:
    where = f"chat.messages[{i}]"
    if not m.role:
        raise ChatValidationError(f"{where}.role: must not be empty")
    message: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.HasField("name"):
        message["name"] = m.name
    if m.HasField("reasoning_content"):
        message["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        if m.role != "assistant":
            raise ChatValidationError(f"{where}.tool_calls: only an assistant message makes tool calls")
        if len(m.tool_calls) > MAX_TOOL_CALLS_PER_MESSAGE:
            raise ChatValidationError(f"{where}.tool_calls: at most {MAX_TOOL_CALLS_PER_MESSAGE}")
        calls = []
        for j, call in enumerate(m.tool_calls):
            if not _TOOL_NAME.fullmatch(call.name):
                raise ChatValidationError(f"{where}.tool_calls[{j}].name: 1-64 characters from [A-Za-z0-9_.-]")
            if not call.id:
                raise ChatValidationError(f"{where}.tool_calls[{j}].id: must not be empty")
            arguments = _json_object(call.arguments_json, f"{where}.tool_calls[{j}].arguments_json", empty_ok=True)
            calls.append({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}})
            call_ids.add(call.id)
        message["tool_calls"] = calls
    if m.HasField("tool_call_id"):
        if m.role != "tool":
            raise ChatValidationError(f"{where}.tool_call_id: only a tool message answers a call")
        if m.tool_call_id not in call_ids:
            raise ChatValidationError(
                f"{where}.tool_call_id: {m.tool_call_id!r} answers no tool call of an earlier assistant message"
            )
        message["tool_call_id"] = m.tool_call_id
    return message


def chat_request(chat: pb.ChatInput, kwargs: dict[str, Any]) -> ChatRequest:
    """Validate a ChatInput. `kwargs` are its chat_template_kwargs (decoded); tools given there are
    the older way of passing tools and are taken when `chat.tools` is empty."""
    if not chat.messages:
        raise ChatValidationError("chat.messages: must not be empty")
    call_ids: set[str] = set()
    messages = [_message(i, m, call_ids) for i, m in enumerate(chat.messages)]
    tools = _tools(chat)
    if tools is not None and "tools" in kwargs:
        raise ChatValidationError("chat.chat_template_kwargs.tools: give tools in chat.tools or here, not both")
    if tools is None and "tools" in kwargs:
        raw = kwargs["tools"]
        if not isinstance(raw, list):
            raise ChatValidationError("chat.chat_template_kwargs.tools: must be a list")
        tools = raw
    choice = _tool_choice(chat, tools if chat.tools else None)
    parse_output = chat.parse_output if chat.HasField("parse_output") else True
    return ChatRequest(messages, tools, choice, parse_output)
