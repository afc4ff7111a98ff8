"""Drafts for speculative decoding: tokens a sequence is likely to continue with, proposed cheaply
and verified by the target model in one batched forward (speculative.py). A wrong draft costs
time, never an answer: only tokens the target itself picks are kept.

`Drafter` is the protocol every source of drafts follows (n-gram lookup here; a draft model or the
model's own multi-token heads plug in the same way). `NgramDrafter` is prompt lookup: the longest
recent suffix of the sequence that occurred before, in the prompt or in the generated text,
continued as it went on then. Its index is updated per token (one dict update per n-gram length),
not rebuilt or scanned per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["Drafter", "NgramDrafter"]


class Drafter(Protocol):
    def extend(self, tokens: Sequence[int]) -> None:
        """The sequence grew by `tokens` (prompt tokens, then each accepted or sampled token)."""
        ...

    def propose(self, k: int) -> list[int]:
        """Up to `k` tokens likely to follow the sequence so far ([] when there is no guess)."""
        ...


class NgramDrafter:
    """Prompt lookup over n-grams of `min_n`..`max_n` tokens: the longest one that ends the sequence
    and also ended earlier proposes the tokens that followed its latest earlier occurrence."""

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram lengths must satisfy 1 <= min_n <= max_n (got {min_n}, {max_n})")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        # n-gram -> the position right after its latest occurrence that is not the sequence's end
        self._after: dict[tuple[int, ...], int] = {}
        # the n-grams ending the sequence now, entered into the index once the next token arrives
        # (so that an n-gram never points at the end of the sequence itself)
        self._pending: list[tuple[int, ...]] = []

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            end = len(self.tokens)
            for gram in self._pending:
                self._after[gram] = end
            self.tokens.append(int(t))
            n_max = min(self.max_n, len(self.tokens))
            self._pending = [tuple(self.tokens[-n:]) for n in range(self.min_n, n_max + 1)]

    def propose(self, k: int) -> list[int]:
        if k <= 0:
            return []
        for gram in reversed(self._pending):  # longest first
            at = self._after.get(gram)
            if at is not None:
                return self.tokens[at : at + k]
        return []
