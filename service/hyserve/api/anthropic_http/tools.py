"""Anthropic's `tools`, `tool_choice` and `thinking` -> their gRPC counterparts.

Pure functions over a decoded JSON body; they raise `AnthropicError` naming the body's field. The
deeper checks (names, schemas, call ids that answer a call) are the gRPC validation's.
"""

from __future__ import annotations

import json
from typing import Any

from hyserve.api.anthropic_http.errors import AnthropicError
from hyserve.api.gen import hyserve_pb2 as pb

__all__ = ["enable_thinking", "tool_choice", "tools"]

_CHOICES = {"auto": pb.TOOL_CHOICE_MODE_AUTO, "any": pb.TOOL_CHOICE_MODE_REQUIRED, "none": pb.TOOL_CHOICE_MODE_NONE}
_THINKING = {"enabled": True, "adaptive": True, "disabled": False}


def tools(body: dict[str, Any]) -> list[pb.Tool]:
    """Client tools (`name`, `description`, `input_schema`); server tools are refused."""
    raw = body.get("tools")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise AnthropicError("tools: must be an array")
    out = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise AnthropicError(f"{where}: must be an object with a name")
        if tool.get("type", "custom") not in ("custom", None):
            raise AnthropicError(f"{where}.type: {tool['type']!r} tools are not supported by this server")
        description = tool.get("description", "")
        if not isinstance(description, str):
            raise AnthropicError(f"{where}.description: must be a string")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise AnthropicError(f"{where}.input_schema: must be an object (a JSON Schema)")
        try:
            parameters = json.dumps(schema, ensure_ascii=False, allow_nan=False)
        except ValueError as exc:
            raise AnthropicError(f"{where}.input_schema: {exc}") from exc
        out.append(pb.Tool(name=tool["name"], description=description, parameters_json=parameters))
    return out


def tool_choice(body: dict[str, Any]) -> tuple[pb.ToolChoice | None, bool | None]:
    """(the choice, parallel_tool_calls) of `tool_choice`; None for what the body leaves unset."""
    raw = body.get("tool_choice")
    if raw is None:
        return None, None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in (*_CHOICES, "tool"):
        raise AnthropicError('tool_choice: must be {"type": "auto" | "any" | "none" | "tool"}')
    disable = raw.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise AnthropicError("tool_choice.disable_parallel_tool_use: must be a boolean")
    parallel = None if disable is None else not disable
    if kind == "tool":
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise AnthropicError('tool_choice.name: a {"type": "tool"} choice names the tool')
        return pb.ToolChoice(function=name), parallel
    return pb.ToolChoice(mode=_CHOICES[kind]), parallel


def enable_thinking(body: dict[str, Any]) -> bool | None:
    """`thinking` as the templates' `enable_thinking` (None: unset). The budget is not enforced."""
    raw = body.get("thinking")
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in _THINKING:
        raise AnthropicError('thinking: must be {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}')
    budget = raw.get("budget_tokens")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise AnthropicError("thinking.budget_tokens: must be a positive integer")
    return _THINKING[kind]
