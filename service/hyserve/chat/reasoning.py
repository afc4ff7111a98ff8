"""Reasoning ("thinking") text split from the answer of a model that writes it between markers.

Models such as Qwen3 / Qwen3.5 and DeepSeek-R1 write ``<think>\\nREASONING\\n</think>\\n\\nANSWER``.
When the chat template already puts the open marker into the generation prompt (Qwen3.5 with
thinking on ends the prompt with ``<think>\\n``), the output starts inside the reasoning and only
the close marker appears. The whitespace next to the markers is layout, as the templates render it
(``'<think>\\n' + reasoning + '\\n</think>\\n\\n' + content``): it is trimmed from both parts.

An open marker counts only at the very start of the output (after whitespace): later it is part
of the answer. Output that ends inside the reasoning (cut off by a token limit) is all reasoning.
"""

from __future__ import annotations

from hyserve.chat.events import ContentDelta, ReasoningDelta
from hyserve.chat.tool_calls.scanning import marker_hold

__all__ = ["ReasoningSplitter", "prompt_opens_reasoning", "reasoning_markers"]

ReasoningEvent = ContentDelta | ReasoningDelta

# (open, close) pairs in the order they are looked for in a template
_KNOWN_MARKERS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"))


def reasoning_markers(template_source: str | None) -> tuple[str, str] | None:
    """The reasoning markers a chat template uses, or None when it shows none."""
    for open_marker, close_marker in _KNOWN_MARKERS:
        if template_source and open_marker in template_source and close_marker in template_source:
            return open_marker, close_marker
    return None


def prompt_opens_reasoning(prompt_text: str, markers: tuple[str, str] | None) -> bool:
    """Whether the rendered prompt ends with the open marker (whitespace after it allowed), so the
    model continues inside the reasoning."""
    if markers is None:
        return False
    i = prompt_text.rfind(markers[0])
    return i >= 0 and not prompt_text[i + len(markers[0]) :].strip()


class ReasoningSplitter:
    """``push(text)`` / ``finish()`` return ``ReasoningDelta`` and ``ContentDelta`` events; markers
    cut between pushes are recognised, and text that may begin one is held back until decided."""

    def __init__(
        self, open_marker: str = "<think>", close_marker: str = "</think>", *, starts_inside: bool = False
    ) -> None:
        if not open_marker or not close_marker:
            raise ValueError("reasoning markers must not be empty")
        self._open, self._close = open_marker, close_marker
        # "start": the output may still open the reasoning; "inside"; "content": the answer
        self._state = "inside" if starts_inside else "start"
        self._buf = ""
        self._trim_lead = True
        self._pending_ws = ""
        self._finished = False

    def push(self, text: str) -> list[ReasoningEvent]:
        if self._finished:
            raise RuntimeError("push() after finish()")
        self._buf += text
        return self._drain(final=False)

    def finish(self) -> list[ReasoningEvent]:
        if self._finished:
            return []
        self._finished = True
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[ReasoningEvent]:
        events: list[ReasoningEvent] = []
        if self._state == "start":
            stripped = self._buf.lstrip()
            if stripped.startswith(self._open):
                self._buf = stripped[len(self._open) :]
                self._state = "inside"
            elif self._open.startswith(stripped) and not final:
                return events
            else:
                self._state = "content"
                self._trim_lead = False
        if self._state == "inside":
            i = self._buf.find(self._close)
            if i < 0:
                cut = len(self._buf) if final else marker_hold(self._buf, (self._close,))
                self._reasoning(self._buf[:cut], events)
                self._buf = self._buf[cut:]
                return events
            self._reasoning(self._buf[:i], events)
            self._buf = self._buf[i + len(self._close) :]
            self._pending_ws = ""
            self._state = "content"
            self._trim_lead = True
        text, self._buf = self._buf, ""
        if self._trim_lead:
            text = text.lstrip()
        if text:
            self._trim_lead = False
            events.append(ContentDelta(text))
        return events

    def _reasoning(self, text: str, events: list[ReasoningEvent]) -> None:
        """Reasoning, with trailing whitespace held back: it is layout if the close marker follows."""
        whole = self._pending_ws + text
        if self._trim_lead:
            whole = whole.lstrip()
        body = whole.rstrip()
        self._pending_ws = whole[len(body) :]
        if body:
            self._trim_lead = False
            events.append(ReasoningDelta(body))
