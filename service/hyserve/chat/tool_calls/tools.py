"""Tool declarations as the parser and the grammars need them, and typed arguments from the text
values of the XML syntax.

Tools arrive as OpenAI declares them (``{"type": "function", "function": {"name", "parameters"}}``)
or as the bare function object (``{"name", "parameters"}``).
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ToolSpec", "new_call_id", "tool_specs", "typed_value"]

_ID_ALPHABET = string.ascii_letters + string.digits + "-_"


def new_call_id() -> str:
    """``call_`` and 24 random url-safe characters."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ToolSpec:
    name: str
    parameters: Mapping[str, Any]

    @property
    def properties(self) -> Mapping[str, Any]:
        props = self.parameters.get("properties")
        return props if isinstance(props, Mapping) else {}

    @property
    def required(self) -> list[str]:
        req = self.parameters.get("required")
        return [r for r in req if isinstance(r, str)] if isinstance(req, list) else []

    def property_schema(self, name: str) -> Mapping[str, Any] | None:
        """The sub-schema of one parameter; shared ``$defs`` are carried along so a ``$ref`` inside
        it still resolves on its own."""
        sub = self.properties.get(name)
        if not isinstance(sub, Mapping):
            return None
        shared = {k: self.parameters[k] for k in ("$defs", "definitions") if k in self.parameters}
        return {**shared, **sub} if shared else sub


def tool_specs(tools: Sequence[Mapping[str, Any]] | None) -> list[ToolSpec]:
    """Normalised declarations; entries without a usable name are skipped."""
    specs = []
    for tool in tools or ():
        fn = tool.get("function", tool)
        if not isinstance(fn, Mapping):
            continue
        name = fn.get("name")
        params = fn.get("parameters")
        if isinstance(name, str) and name:
            specs.append(ToolSpec(name, params if isinstance(params, Mapping) else {"type": "object"}))
    return specs


def _schema_types(schema: Mapping[str, Any]) -> set[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return {t for t in declared if isinstance(t, str)}
    types: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or ():
            if isinstance(branch, Mapping):
                types |= _schema_types(branch)
    values = schema.get("enum", [schema["const"]] if "const" in schema else [])
    for value in values if isinstance(values, list) else ():
        types.add(_json_type(value))
    return types


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def is_raw_string(schema: Mapping[str, Any] | None) -> bool:
    """Whether a parameter's value is written as raw text in the XML syntax (only plain strings;
    every other type is written as JSON)."""
    return schema is not None and _schema_types(schema) == {"string"}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def typed_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """The JSON value of one XML parameter: raw text for string parameters, the parsed JSON for
    other types (also Python's ``True`` / ``None`` spellings, which Jinja renders), and the text
    itself when it is not valid for any declared type. Without a schema: JSON if it parses."""
    types = _schema_types(schema) if schema is not None else set()
    if types == {"string"}:
        return raw
    text = raw.strip()
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError:
        value = {"True": True, "False": False, "None": None}.get(text, raw)
        if value is raw and "boolean" in types and text.lower() in ("true", "false"):
            value = text.lower() == "true"
    if value is raw or not types:
        return value
    kind = _json_type(value)
    if kind in types or (kind == "integer" and "number" in types):
        return value
    if kind == "number" and "integer" in types and float(value).is_integer():
        return int(value)
    return raw
