"""The streaming tool-call parser: generated text in, content and tool-call events out.

Text arrives in pieces of any size. Content is released as soon as it cannot be the beginning of a
call marker; a possible marker's first characters wait until the next piece decides them. Once a
marker has begun, the call region is collected until it is complete, then checked: a well-formed
call is reported with ``ToolCallBegin``, one ``ToolCallArguments`` carrying its whole arguments
JSON, and ``ToolCallEnd``, so a call that turns out malformed never half-appears; its raw text is
returned as content instead. The events depend only on the text, never on how it was cut.

Whitespace that only separates content from calls (the ``\\n\\n`` a template puts before the first
``<tool_call>``, the newline between parallel calls) is dropped; whitespace inside content is
kept.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hyserve.chat.events import ContentDelta, ToolCall, ToolCallArguments, ToolCallBegin, ToolCallEnd, ToolCallEvent
from hyserve.chat.tool_calls.formats import ToolCallFormat
from hyserve.chat.tool_calls.syntaxes import BodyScanner, syntax_for
from hyserve.chat.tool_calls.tools import new_call_id, tool_specs

__all__ = ["ToolCallStreamParser"]


class ToolCallStreamParser:
    """``push(text)`` and ``finish()`` return the events the text settles; ``calls`` lists the
    parsed calls in order (complete after ``finish``). With ``format=None`` all text is content."""

    def __init__(
        self,
        format: ToolCallFormat | None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        make_id: Callable[[], str] = new_call_id,
    ) -> None:
        specs = tool_specs(tools)
        self._known = {s.name for s in specs} if tools else None
        self._syntax = syntax_for(format, specs) if format is not None else None
        self._make_id = make_id
        self._buf = ""
        self._scanner: BodyScanner | None = None
        self._marker = ""
        self._at_boundary = True
        self._pending_ws = ""
        self._after_call = False
        self._finished = False
        self._calls: list[ToolCall] = []

    @property
    def calls(self) -> list[ToolCall]:
        return list(self._calls)

    def push(self, text: str) -> list[ToolCallEvent]:
        if self._finished:
            raise RuntimeError("push() after finish()")
        if self._syntax is None:
            return [ContentDelta(text)] if text else []
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[ToolCallEvent]:
        if self._finished:
            return []
        self._finished = True
        if self._syntax is None:
            return []
        events = self._drain(final=True)
        if self._pending_ws and not self._after_call:
            events.append(ContentDelta(self._pending_ws))
        self._pending_ws = ""
        return events

    def _drain(self, final: bool) -> list[ToolCallEvent]:
        syntax = self._syntax
        if syntax is None:
            return []
        events: list[ToolCallEvent] = []
        while True:
            if self._scanner is None:
                start, hold, self._at_boundary = syntax.find_start(self._buf, self._at_boundary)
                if start is None:
                    cut = len(self._buf) if final else hold
                    self._content(self._buf[:cut], events)
                    self._buf = self._buf[cut:]
                    return events
                self._content(self._buf[: start.pos], events)
                # the whitespace before a call is dropped with it, or given back if it is malformed
                self._marker = self._pending_ws + self._buf[start.pos : start.body]
                self._pending_ws = ""
                self._buf = self._buf[start.body :]
                self._scanner = syntax.body_scanner()
            scanned = self._scanner.scan(self._buf, final)
            if scanned is None:
                return events
            raw = self._marker + self._buf[: scanned.length]
            self._buf = self._buf[scanned.length :]
            self._scanner = None
            if scanned.calls is None:
                self._at_boundary = False
                self._content(raw, events)
            else:
                for name, arguments in scanned.calls:
                    self._emit_call(name, arguments, events)
                self._at_boundary = True
                self._after_call = True

    def _content(self, text: str, events: list[ToolCallEvent]) -> None:
        """Content, with trailing whitespace held back until it is known not to border a call."""
        if not text:
            return
        whole = self._pending_ws + text
        if self._after_call:
            # whitespace right after a call only separates it from what follows
            whole = whole.lstrip()
        body = whole.rstrip()
        self._pending_ws = whole[len(body) :]
        if body:
            self._after_call = False
            events.append(ContentDelta(body))

    def _emit_call(self, name: str, arguments: dict[str, Any], events: list[ToolCallEvent]) -> None:
        index = len(self._calls)
        call = ToolCall(
            id=self._make_id(),
            name=name,
            arguments_json=json.dumps(arguments, ensure_ascii=False),
            known=self._known is None or name in self._known,
        )
        self._calls.append(call)
        events += [
            ToolCallBegin(index, call.id, name),
            ToolCallArguments(index, call.arguments_json),
            ToolCallEnd(index, call),
        ]
