"""Grammars (llguidance's Lark dialect) that make a model write tool calls in its own syntax.

``call_grammar`` accepts exactly the calls a ``tool_choice`` of "required" or a named function
asks for: one call, or several when parallel calls are allowed, with arguments valid for the
tool's ``parameters`` schema (embedded with ``%json``). ``auto_grammar`` accepts free text as well,
and constrains a call from the moment its start marker has been written.

In the Qwen XML syntax each parameter is checked on its own: a plain string parameter is raw text
that cannot contain ``</parameter>``; any other parameter is JSON valid for its sub-schema.
Required parameters come first, in schema order, then the optional ones, each optional.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hyserve.chat.tool_calls.formats import ToolCallFormat
from hyserve.chat.tool_calls.syntaxes import MISTRAL_MARKER, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from hyserve.chat.tool_calls.tools import ToolSpec, is_raw_string, tool_specs

__all__ = ["auto_grammar", "call_grammar"]

# a raw string value and its closing "\n</parameter>", which may occur nowhere inside it
_XML_STRING_TERMINAL = r"XML_STRING: /(?s:.*)\n<\/parameter>/ & ~/(?s:.*)<\/parameter>(?s:.*)<\/parameter>/"


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _json(schema: Mapping[str, Any]) -> str:
    return "%json " + json.dumps(schema, ensure_ascii=False)


def _selected(tools: Sequence[Mapping[str, Any]], choice: str) -> list[ToolSpec]:
    specs = tool_specs(tools)
    if not specs:
        raise ValueError("a tool call grammar needs at least one tool")
    if choice == "required":
        return specs
    chosen = [s for s in specs if s.name == choice]
    if not chosen:
        raise ValueError(f"tool_choice names {choice!r}, which is not among the tools")
    return chosen[:1]


def _call_object(name: str, args_key: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, args_key: parameters},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def _xml_rules(specs: Sequence[ToolSpec]) -> list[str]:
    """``call_body``: what follows ``<tool_call>`` in the Qwen XML syntax, up to ``</tool_call>``."""
    rules = ["call_body: " + " | ".join(f"f{i}" for i in range(len(specs)))]
    for i, spec in enumerate(specs):
        required = [p for p in spec.required if p in spec.properties]
        ordered = required + [p for p in spec.properties if p not in required]
        parts = []
        for j, param in enumerate(ordered):
            rule = f"f{i}_p{j}"
            parts.append(rule if param in required else rule + "?")
            schema = spec.property_schema(param) or {}
            head = _lit(f"<parameter={param}>\n")
            enum = schema.get("enum")
            if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
                choices = " | ".join(_lit(v) for v in enum)
                rules.append(f"{rule}: {head} ({choices}) {_lit(chr(10) + '</parameter>' + chr(10))}")
            elif is_raw_string(schema):
                rules.append(f'{rule}: {head} XML_STRING "\\n"')
            else:
                rules.append(f"{rule}: {head} {rule}_v {_lit(chr(10) + '</parameter>' + chr(10))}")
                rules.append(f"{rule}_v: {_json(schema)}")
        body = " ".join([_lit(f"\n<function={spec.name}>\n"), *parts, _lit("</function>\n" + TOOL_CALL_CLOSE)])
        rules.append(f"f{i}: {body}")
    rules.append(_XML_STRING_TERMINAL)
    return rules


def _call_rules(fmt: ToolCallFormat, specs: Sequence[ToolSpec]) -> tuple[str, str, list[str]]:
    """``(marker, separator, rules)``: a call is ``marker call_body``; parallel calls are joined by
    the separator."""
    if fmt is ToolCallFormat.QWEN_XML:
        return TOOL_CALL_OPEN, "\n", _xml_rules(specs)
    if fmt is ToolCallFormat.HERMES:
        schema = {"anyOf": [_call_object(s.name, "arguments", s.parameters) for s in specs]}
        return (
            TOOL_CALL_OPEN,
            "\n",
            [f'call_body: "\\n" call_json "\\n{TOOL_CALL_CLOSE}"', f"call_json: {_json(schema)}"],
        )
    if fmt is ToolCallFormat.LLAMA3_JSON:
        schema = {"anyOf": [_call_object(s.name, "parameters", s.parameters) for s in specs]}
        return "", "\n", [f"call_body: {_json(schema)}"]
    if fmt is ToolCallFormat.MISTRAL_ARGS:
        rules = ["call_body: " + " | ".join(f"f{i}" for i in range(len(specs)))]
        for i, spec in enumerate(specs):
            rules += [f"f{i}: {_lit(spec.name + '[ARGS]')} f{i}_args", f"f{i}_args: {_json(spec.parameters)}"]
        return MISTRAL_MARKER, "", rules
    schema = {"anyOf": [_call_object(s.name, "arguments", s.parameters) for s in specs]}
    return MISTRAL_MARKER, "", [f"call_body: {_json(schema)}"]


def _mistral_array(specs: Sequence[ToolSpec], parallel: bool) -> list[str]:
    # the JSON array form carries every call in one array after a single marker
    items = {"anyOf": [_call_object(s.name, "arguments", s.parameters) for s in specs]}
    array: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        array["maxItems"] = 1
    return [f"call_body: {_json(array)}"]


def _calls(marker: str, sep: str, parallel: bool) -> str:
    one = f"{_lit(marker)} call_body" if marker else "call_body"
    if not parallel:
        return f"calls: {one}"
    joiner = f"{_lit(sep)} " if sep else ""
    return f"calls: {one} ({joiner}{one})*"


def call_grammar(
    format: ToolCallFormat,
    tools: Sequence[Mapping[str, Any]],
    choice: str = "required",
    *,
    parallel: bool = True,
    start: str = "start",
) -> str:
    """A grammar accepting only tool calls: for ``choice="required"`` calls of any of the tools,
    otherwise of the function named ``choice``. ``start`` names its top rule (another grammar may
    embed it under another name). Raises ValueError for no tools or an unknown name."""
    specs = _selected(tools, choice)
    marker, sep, rules = _call_rules(format, specs)
    if format is ToolCallFormat.MISTRAL:
        rules, parallel = _mistral_array(specs, parallel), False
    return "\n".join([f"{start}: calls", _calls(marker, sep, parallel), *rules]) + "\n"


def _not_containing(marker: str) -> tuple[str, str]:
    """Terminals for text without the marker, and for text ending in its only occurrence."""
    m = re.escape(marker).replace("/", "\\/")
    return f"/(?s:.*)/ & ~/(?s:.*){m}(?s:.*)/", f"/(?s:.*){m}/ & ~/(?s:.*){m}(?s:.*){m}/"


def auto_grammar(
    format: ToolCallFormat, tools: Sequence[Mapping[str, Any]], *, parallel: bool = True, start: str = "start"
) -> str:
    """A grammar accepting free text or tool calls of any of the tools: text before, between and
    after calls is free, but once the syntax's start marker is written, a valid call must follow.
    For bare JSON calls (Llama 3) the answer is either text not starting with ``{`` or calls."""
    specs = _selected(tools, "required")
    marker, sep, rules = _call_rules(format, specs)
    if format is ToolCallFormat.MISTRAL:
        rules = _mistral_array(specs, parallel)
    if not marker:
        text = r"TEXT: /([^{\s](?s:.*))?/"
        return "\n".join([f"{start}: TEXT | calls", _calls(marker, sep, parallel), text, *rules]) + "\n"
    tail, upto = _not_containing(marker)
    calls = "(TEXT_TO_CALL call_body)* TAIL" if parallel else "TAIL | TEXT_TO_CALL call_body TAIL"
    lines = [f"{start}: {calls}", f"TEXT_TO_CALL: {upto}", f"TAIL: {tail}", *rules]
    return "\n".join(lines) + "\n"
