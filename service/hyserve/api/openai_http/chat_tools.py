"""OpenAI's tool and output-format fields -> their gRPC counterparts: `tools`, `tool_choice`,
`parallel_tool_calls`, an assistant message's `tool_calls`, a tool message's `tool_call_id`, and
`response_format` (text, json_object, json_schema).

Pure functions over a decoded JSON body; they raise `OpenAIError` naming the body's field. The
deeper checks (names, schemas that compile, call ids that answer a call) are the gRPC validation's,
shared by both fronts.
"""

from __future__ import annotations

import json
from typing import Any

from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.api.openai_http.errors import OpenAIError

__all__ = ["constraint", "message_tool_calls", "tool_choice", "tools"]

_MODES = {
    "auto": pb.TOOL_CHOICE_MODE_AUTO,
    "none": pb.TOOL_CHOICE_MODE_NONE,
    "required": pb.TOOL_CHOICE_MODE_REQUIRED,
}


def _json_text(value: Any, where: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        raise OpenAIError(f"{where}: {exc}", where) from exc


def tools(body: dict[str, Any]) -> list[pb.Tool]:
    raw = body.get("tools")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise OpenAIError("tools: must be an array", "tools")
    out = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise OpenAIError(f'{where}: must be an object with "type": "function"', where)
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise OpenAIError(f"{where}.function: must be an object with a name", f"{where}.function")
        description = function.get("description", "")
        if not isinstance(description, str):
            raise OpenAIError(f"{where}.function.description: must be a string", f"{where}.function.description")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise OpenAIError(f"{where}.function.parameters: must be an object", f"{where}.function.parameters")
        out.append(
            pb.Tool(
                name=function["name"],
                description=description,
                parameters_json=_json_text(parameters, f"{where}.function.parameters") if parameters else "",
            )
        )
    return out


def tool_choice(body: dict[str, Any]) -> pb.ToolChoice | None:
    raw = body.get("tool_choice")
    if raw is None:
        return None
    if isinstance(raw, str):
        if raw not in _MODES:
            raise OpenAIError(f"tool_choice: must be one of {sorted(_MODES)} or a function", "tool_choice")
        return pb.ToolChoice(mode=_MODES[raw])
    function = raw.get("function") if isinstance(raw, dict) and raw.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise OpenAIError(
            'tool_choice: must be a string or {"type": "function", "function": {"name": ...}}', "tool_choice"
        )
    return pb.ToolChoice(function=function["name"])


def message_tool_calls(message: dict[str, Any], where: str) -> list[pb.ToolCall]:
    raw = message.get("tool_calls")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise OpenAIError(f"{where}.tool_calls: must be an array", f"{where}.tool_calls")
    out = []
    for j, call in enumerate(raw):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise OpenAIError(f"{at}.function: must be an object with a name", f"{at}.function")
        if not isinstance(call.get("id"), str):
            raise OpenAIError(f"{at}.id: must be a string", f"{at}.id")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, dict):  # some clients send the mapping itself
            arguments = _json_text(arguments, f"{at}.function.arguments")
        if not isinstance(arguments, str):
            raise OpenAIError(f"{at}.function.arguments: must be a JSON string", f"{at}.function.arguments")
        out.append(pb.ToolCall(id=call["id"], name=function["name"], arguments_json=arguments))
    return out


def constraint(body: dict[str, Any]) -> pb.Constraint | None:
    """`response_format` as a gRPC Constraint; None for text (or absent)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return pb.Constraint(json_object=True)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise OpenAIError(
                'response_format.json_schema: must be an object with a "schema" object', "response_format"
            )
        # no schema: any JSON value, as OpenAI's non-strict mode reads it
        schema = spec.get("schema") or {}
        return pb.Constraint(json_schema=_json_text(schema, "response_format.json_schema.schema"))
    raise OpenAIError("response_format.type: must be text, json_object or json_schema", "response_format")
