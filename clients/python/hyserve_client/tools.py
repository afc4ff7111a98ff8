"""Tools, tool calls and output constraints: the typed views and their request-side conversions.

`Tool` describes a function the model may call; `ToolCall` is a complete call (in `Finished.tool_calls`,
or in an assistant `Message` of an earlier turn); `ToolCallDelta` is a streamed piece of one (in
`Delta.tool_calls`). OpenAI-shaped mappings are accepted wherever a `Tool` or a `ToolCall` is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from hyserve_client._gen import hyserve_pb2 as pb

__all__ = [
    "CONSTRAINT_KINDS",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoiceSpec",
    "constraint_to_proto",
    "tool_call_to_proto",
    "tool_choice_to_proto",
    "tool_to_proto",
]

ToolChoiceSpec = Literal["auto", "none", "required"] | Mapping[str, Any]
"""A mode, or the one function the model must call: {"function": name} (OpenAI's
{"type": "function", "function": {"name": name}} works too)."""

CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "grammar")

_MODES = {
    "auto": pb.TOOL_CHOICE_MODE_AUTO,
    "none": pb.TOOL_CHOICE_MODE_NONE,
    "required": pb.TOOL_CHOICE_MODE_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call. `parameters`: its arguments' JSON Schema, as a mapping or JSON text."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One complete call the model made: its id ("call_..."), function name and arguments in JSON text."""

    id: str
    name: str
    arguments_json: str = ""

    def arguments(self) -> Any:
        """The arguments parsed from JSON ({} when empty)."""
        return json.loads(self.arguments_json) if self.arguments_json else {}

    @classmethod
    def from_proto(cls, m: pb.ToolCall) -> ToolCall:
        return cls(id=m.id, name=m.name, arguments_json=m.arguments_json)


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of the call number `index`: its first piece has the id and name, later ones fragments of
    its arguments JSON (which concatenate to `Finished.tool_calls[index].arguments_json`)."""

    index: int
    id: str = ""
    name: str = ""
    arguments_fragment: str = ""

    @classmethod
    def from_proto(cls, m: pb.ToolCallDelta) -> ToolCallDelta:
        return cls(index=m.index, id=m.id, name=m.name, arguments_fragment=m.arguments_fragment)


def _json_text(value: Mapping[str, Any] | str | None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _function_part(m: Mapping[str, Any], what: str) -> Mapping[str, Any]:
    """The function of an OpenAI-shaped {"type": "function", "function": {...}} mapping, or m itself."""
    if "function" not in m:
        return m
    if m.get("type", "function") != "function":
        raise ValueError(f"{what} of type {m['type']!r}: only function {what}s are supported")
    function = m["function"]
    if not isinstance(function, Mapping):
        raise ValueError(f"{what}: 'function' must be a mapping")
    return function


def tool_to_proto(tool: Tool | Mapping[str, Any]) -> pb.Tool:
    """A Tool, OpenAI's {"type": "function", "function": {"name", "description", "parameters"}}, or the
    inner {"name", "description", "parameters"} mapping alone."""
    if isinstance(tool, Tool):
        name, description, parameters = tool.name, tool.description, tool.parameters
    else:
        f = _function_part(tool, "tool")
        extra = f.keys() - {"name", "description", "parameters", "strict"}
        if extra or "name" not in f:
            raise ValueError(f"tool needs a name and may have description and parameters (got {sorted(f)})")
        name, description, parameters = f["name"], f.get("description") or "", f.get("parameters")
    return pb.Tool(name=name, description=description, parameters_json=_json_text(parameters))


def tool_call_to_proto(call: ToolCall | Mapping[str, Any]) -> pb.ToolCall:
    """A ToolCall, OpenAI's {"id", "type": "function", "function": {"name", "arguments"}}, or the flat
    {"id", "name", "arguments"} mapping; arguments as a mapping or JSON text."""
    if isinstance(call, ToolCall):
        return pb.ToolCall(id=call.id, name=call.name, arguments_json=call.arguments_json)
    f = _function_part(call, "tool call")
    if "name" not in f:
        raise ValueError(f"tool call has no function name (got {sorted(call)})")
    return pb.ToolCall(id=call.get("id") or "", name=f["name"], arguments_json=_json_text(f.get("arguments")))


def tool_choice_to_proto(choice: ToolChoiceSpec) -> pb.ToolChoice:
    """A mode ("auto", "none", "required"), or {"function": name} (or OpenAI's {"type": "function",
    "function": {"name": name}}): the model must call that function."""
    if isinstance(choice, str):
        if choice not in _MODES:
            raise ValueError(f"tool_choice must be 'auto', 'none', 'required' or {{'function': name}}, got {choice!r}")
        return pb.ToolChoice(mode=_MODES[choice])
    function = choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else function
    if not isinstance(name, str) or not name:
        raise ValueError(f"tool_choice mapping must name a function: {{'function': name}}, got {dict(choice)!r}")
    return pb.ToolChoice(function=name)


def constraint_to_proto(
    *,
    json_schema: Mapping[str, Any] | str | None = None,
    json_object: bool = False,
    regex: str | None = None,
    grammar: str | None = None,
) -> pb.Constraint | None:
    """The Constraint of at most one kind (None when none is given; ValueError for several)."""
    kinds = {"json_schema": json_schema, "json_object": json_object or None, "regex": regex, "grammar": grammar}
    given = [kind for kind, value in kinds.items() if value is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one constraint (got {', '.join(given)})")
    if not given:
        return None
    if json_schema is not None:
        return pb.Constraint(json_schema=_json_text(json_schema))
    if json_object:
        return pb.Constraint(json_object=True)
    return pb.Constraint(**{given[0]: kinds[given[0]]})
