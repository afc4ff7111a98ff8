"""Each tool-call syntax as the stream parser uses it: where a call begins in content, and when
the text after that beginning forms complete calls.

``Syntax.find_start`` looks at undecided content; ``Syntax.body_scanner`` makes the scanner of one
call region, fed the growing text that follows the region's marker.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hyserve.chat.tool_calls.formats import ToolCallFormat
from hyserve.chat.tool_calls.scanning import JsonExtent, Scanned, marker_hold
from hyserve.chat.tool_calls.tools import ToolSpec, typed_value

__all__ = ["BodyScanner", "Start", "Syntax", "syntax_for"]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_MARKER = "[TOOL_CALLS]"

Calls = list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Start:
    """A call region begins at ``pos`` (content ends there); its body begins at ``body``."""

    pos: int
    body: int


class BodyScanner(Protocol):
    def scan(self, text: str, final: bool) -> Scanned | None:
        """The decision on the region once ``text`` settles it (always when ``final``), else None."""
        ...


@dataclass(frozen=True)
class Syntax:
    markers: tuple[str, ...]
    # bare JSON calls (Llama 3) may open the answer, or follow a call, with no marker at all
    bare_json: bool
    body_scanner: Callable[[], BodyScanner]

    def find_start(self, text: str, at_boundary: bool) -> tuple[Start | None, int, bool]:
        """``(start, hold, boundary_still_open)``: the first call region in ``text`` if one has
        begun; else None and the index from which text must be held back."""
        if self.bare_json and at_boundary:
            verdict, body = _bare_start(text)
            if verdict == "yes":
                return Start(0, body), 0, True
            if verdict == "maybe":
                return None, 0, True
        found = [(i, m) for m in self.markers if (i := text.find(m)) >= 0]
        if found:
            i, m = min(found)
            return Start(i, i + len(m)), i, False
        return None, marker_hold(text, self.markers), False


def _bare_start(text: str) -> tuple[str, int]:
    """Whether ``text`` opens with a bare JSON call, ``{"name"`` after separators: "yes" (and
    where the object starts), "maybe" (too short to tell) or "no"."""
    j = len(text) - len(text.lstrip(" \t\r\n;"))
    rest = text[j:]
    if not rest:
        return "maybe", j
    if rest[0] != "{":
        return "no", j
    key = rest[1:].lstrip()
    if key.startswith('"name"'):
        return "yes", j
    return ("maybe" if '"name"'.startswith(key) else "no"), j


def _arguments(obj: Any, keys: Sequence[str], optional: bool) -> dict[str, Any] | None:
    for key in keys:
        if key in obj:
            args = obj[key]
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    return None
            return args if isinstance(args, dict) else None
    return {} if optional else None


def _json_call(obj: Any, keys: Sequence[str], optional: bool) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = _arguments(obj, keys, optional)
    return None if args is None else (obj["name"], args)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(text: str) -> Any:
    """The JSON value of ``text``, or None; NaN and Infinity are refused, as strict JSON does."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:
        return None


class _Tagged:
    """A call between ``<tool_call>`` and ``</tool_call>``; the body parser decides its shape. At
    the end of the output a missing closing tag is forgiven when the body parses."""

    def __init__(self, parse: Callable[[str], Calls | None]) -> None:
        self._parse = parse
        self._searched = 0

    def scan(self, text: str, final: bool) -> Scanned | None:
        i = text.find(TOOL_CALL_CLOSE, self._searched)
        if i >= 0:
            return Scanned(i + len(TOOL_CALL_CLOSE), self._parse(text[:i]))
        self._searched = max(0, len(text) - len(TOOL_CALL_CLOSE) + 1)
        return Scanned(len(text), self._parse(text)) if final else None


def _hermes_body(body: str) -> Calls | None:
    call = _json_call(_loads(body.strip()), ("arguments", "parameters"), optional=True)
    return None if call is None else [call]


_XML_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_XML_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _xml_body(specs: dict[str, ToolSpec], body: str) -> Calls | None:
    m = _XML_FUNCTION.fullmatch(body)
    if m is None:
        return None
    name, inner = m.group(1).strip(), m.group(2)
    spec = specs.get(name)
    args: dict[str, Any] = {}
    pos = 0
    while (p := _XML_PARAMETER.match(inner, pos)) is not None:
        key, raw = p.group(1).strip(), p.group(2)
        # the value sits on its own lines: "<parameter=P>\nVALUE\n</parameter>"
        raw = raw[1:] if raw.startswith("\n") else raw
        raw = raw[:-1] if raw.endswith("\n") else raw
        args[key] = typed_value(raw, spec.property_schema(key) if spec else None)
        pos = p.end()
    if inner[pos:].strip():
        return None
    return [(name, args)]


class _JsonObjectCall:
    """One bare JSON call object (Llama 3): the region ends where the object closes."""

    def __init__(self) -> None:
        self._extent = JsonExtent()

    def scan(self, text: str, final: bool) -> Scanned | None:
        lead = len(text) - len(text.lstrip())
        if lead == len(text):
            return Scanned(len(text), None) if final else None
        if text[lead] != "{":
            return Scanned(lead, None)
        end = self._extent.end(text[lead:])
        if end is None:
            return Scanned(len(text), None) if final else None
        call = _json_call(_loads(text[lead : lead + end]), ("parameters", "arguments"), optional=False)
        return Scanned(lead + end, None if call is None else [call])


_MISTRAL_HEAD = re.compile(r"\s*([\w.\-]+)(?:\[CALL_ID\][\w\-]+)?\[ARGS\]")
_MISTRAL_HEAD_COMPLETIONS = tuple({s[k:] for s in ("[CALL_ID]x[ARGS]", "x[ARGS]") for k in range(len(s) + 1)})


class _Mistral:
    """After ``[TOOL_CALLS]``: a JSON array of calls, or ``NAME[ARGS]{...}``."""

    def __init__(self) -> None:
        self._extent = JsonExtent()

    def scan(self, text: str, final: bool) -> Scanned | None:
        lead = len(text) - len(text.lstrip())
        if lead == len(text):
            return Scanned(len(text), None) if final else None
        if text[lead] == "[" and not text.startswith("[CALL_ID]", lead):
            return self._array(text, lead, final)
        head = _MISTRAL_HEAD.match(text)
        if head is None:
            viable = not final and any(_MISTRAL_HEAD.match(text + s) for s in _MISTRAL_HEAD_COMPLETIONS)
            # a head that can no longer form: only the marker was not content
            return None if viable else Scanned(0, None)
        start = head.end()
        rest = text[start:]
        if not rest.strip() or rest.lstrip()[0] != "{":
            if rest.strip() or final:
                return Scanned(start, None)
            return None
        lead2 = len(rest) - len(rest.lstrip())
        end = self._extent.end(rest[lead2:])
        if end is None:
            return Scanned(len(text), None) if final else None
        args = _loads(rest[lead2 : lead2 + end])
        length = start + lead2 + end
        return Scanned(length, [(head.group(1), args)] if isinstance(args, dict) else None)

    def _array(self, text: str, lead: int, final: bool) -> Scanned | None:
        end = self._extent.end(text[lead:])
        if end is None:
            return Scanned(len(text), None) if final else None
        items = _loads(text[lead : lead + end])
        calls = [_json_call(item, ("arguments", "parameters"), optional=True) for item in items or ()]
        ok = isinstance(items, list) and bool(items) and all(c is not None for c in calls)
        return Scanned(lead + end, [c for c in calls if c is not None] if ok else None)


def syntax_for(fmt: ToolCallFormat, specs: Sequence[ToolSpec]) -> Syntax:
    by_name = {s.name: s for s in specs}
    if fmt in (ToolCallFormat.QWEN_XML, ToolCallFormat.HERMES):
        # models trained on one body shape inside <tool_call> tags sometimes write the other
        def tagged_body(body: str) -> Calls | None:
            return _hermes_body(body) if body.lstrip().startswith("{") else _xml_body(by_name, body)

        return Syntax((TOOL_CALL_OPEN,), False, lambda: _Tagged(tagged_body))
    if fmt is ToolCallFormat.LLAMA3_JSON:
        return Syntax((PYTHON_TAG,), True, _JsonObjectCall)
    return Syntax((MISTRAL_MARKER,), False, _Mistral)
