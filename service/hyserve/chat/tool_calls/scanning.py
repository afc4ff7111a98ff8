"""Text scanning shared by the tool-call syntaxes: markers that may be cut off at the end of what
has arrived so far, and where a JSON value that is still being generated ends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JsonExtent", "Scanned", "marker_hold"]


@dataclass(frozen=True)
class Scanned:
    """A decided call region: ``length`` characters of the body were used; ``calls`` holds
    ``(name, arguments object)`` pairs, or is None when the region is not a well-formed call (its
    raw text is then content)."""

    length: int
    calls: list[tuple[str, dict[str, Any]]] | None


def marker_hold(text: str, markers: Sequence[str]) -> int:
    """The first index from which ``text`` ends in a proper prefix of one of the markers, i.e.
    what must be held back because the next characters may complete a marker; ``len(text)`` when
    nothing needs holding."""
    longest = max((len(m) for m in markers), default=0)
    for i in range(max(0, len(text) - longest + 1), len(text)):
        tail = text[i:]
        if any(len(tail) < len(m) and m.startswith(tail) for m in markers):
            return i
    return len(text)


@dataclass
class JsonExtent:
    """Where the JSON object or array at the start of a text ends. The text may grow between
    calls (it must keep its beginning); scanning resumes where the previous call stopped."""

    _pos: int = 0
    _in_string: bool = False
    _escaped: bool = False
    _brackets: list[str] = field(default_factory=list)

    def end(self, text: str) -> int | None:
        """The index just past the value, or None while it is still open. A mismatched closing
        bracket ends the value there too, so that the caller's parse rejects it."""
        i = self._pos
        n = len(text)
        while i < n:
            c = text[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._brackets.append(c)
            elif c in "}]":
                if not self._brackets or self._brackets.pop() != ("{" if c == "}" else "["):
                    self._pos = i + 1
                    return i + 1
                if not self._brackets:
                    self._pos = i + 1
                    return i + 1
            elif not self._brackets and not c.isspace():
                # not an object or array at all
                self._pos = i + 1
                return i + 1
            i += 1
        self._pos = n
        return None
