"""The stop rules of one generation, shared by the engine and the in-process loop (generator.py).

`StopCheck.push(token)` takes each sampled token in order and answers with the text that can be
released now and, on the last token, why generation ends. In order of precedence:
- a token in `stop_token_ids`: STOP_TOKEN (no text);
- an end-of-generation token of the vocabulary: EOS, or, with `ignore_eos`, nothing (no text either);
- the decoded text contains a stop string: STOP_STRING; the text is cut right before it;
- `max_tokens` tokens generated: MAX_TOKENS;
- prompt + completion fill the context (`len(prompt) + len(completion) >= n_ctx`): CONTEXT_FULL
  (the last token is never evaluated, so this is the longest completion whose tokens all fit).
Text that may be the start of a stop string is held back until it cannot be (`StopStringFilter`);
when generation ends otherwise, or is cancelled (`finish`), what is held back is released. UTF-8
safety comes from the tokenizer's incremental decoder, which never returns part of a character.

No model, no threads: the tokenizer is passed in (anything with `is_eog` and `incremental_decoder`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

__all__ = ["FinishReason", "StopCheck", "StopDecision", "StopRule", "StopStringFilter"]


class FinishReason(Enum):
    EOS = "eos"
    STOP_STRING = "stop_string"
    STOP_TOKEN = "stop_token"
    MAX_TOKENS = "max_tokens"
    CONTEXT_FULL = "context_full"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class StopRule:
    max_tokens: int = 128
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False


class _Decoder(Protocol):
    def push(self, token_id: int) -> str: ...
    def flush(self) -> str: ...


class _Vocabulary(Protocol):
    def is_eog(self, token_id: int) -> bool: ...
    def incremental_decoder(self) -> _Decoder: ...


class StopStringFilter:
    """Turns decoded text deltas into releasable text, holding back possible stop-string starts.

    `push(text)` returns `(released, match)`: `released` is text that can be sent now; `match` is
    the stop string found (then `released` ends right before it and the filter is done).
    `flush()` releases whatever is still held back (call it when generation ends otherwise).
    """

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self._stops = tuple(s for s in stop_strings if s)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.done = False

    def push(self, text: str) -> tuple[str, str | None]:
        if self.done:
            return "", None
        if not self._stops:
            return text, None
        buf = self._held + text
        hit_at, hit = -1, None
        for s in self._stops:
            at = buf.find(s)
            if at >= 0 and (hit is None or at < hit_at or (at == hit_at and len(s) > len(hit))):
                hit_at, hit = at, s
        if hit is not None:
            self.done = True
            self._held = ""
            return buf[:hit_at], hit
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :]
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.done else held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        for k in range(min(len(buf), self._longest - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0


@dataclass(frozen=True)
class StopDecision:
    text: str  # text released with this token (held-back text included when generation ends)
    reason: FinishReason | None = None  # set on the last token
    stop_string: str = ""
    stop_token_id: int | None = None


class StopCheck:
    """The stop rules applied to one generation's sampled tokens, in order (see the module doc)."""

    def __init__(self, rule: StopRule, vocabulary: _Vocabulary, prompt_len: int, n_ctx: int) -> None:
        self.rule = rule
        self._vocabulary = vocabulary
        self._decoder = vocabulary.incremental_decoder()
        self._filter = StopStringFilter(rule.stop_strings)
        self._room = n_ctx - prompt_len  # completion tokens that fit in the context
        self.generated = 0

    def push(self, token: int) -> StopDecision:
        rule = self.rule
        self.generated += 1
        reason: FinishReason | None = None
        stop_string, stop_token, text = "", None, ""
        if token in rule.stop_token_ids:
            reason, stop_token = FinishReason.STOP_TOKEN, token
        elif self._vocabulary.is_eog(token):
            if not rule.ignore_eos:
                reason, stop_token = FinishReason.EOS, token
            # an ignored end-of-generation token contributes no text either
        else:
            text, hit = self._filter.push(self._decoder.push(token))
            if hit is not None:
                reason, stop_string = FinishReason.STOP_STRING, hit
        if reason is None:
            if self.generated >= rule.max_tokens:
                reason = FinishReason.MAX_TOKENS
            elif self.generated >= self._room:
                reason = FinishReason.CONTEXT_FULL
        if reason is not None and reason is not FinishReason.STOP_STRING:
            text += self.finish()
        return StopDecision(text, reason, stop_string, stop_token)

    def finish(self) -> str:
        """Everything still held back (generation ended without a stop string, or was cancelled)."""
        released, hit = self._filter.push(self._decoder.flush())
        return released if hit is not None else released + self._filter.flush()
