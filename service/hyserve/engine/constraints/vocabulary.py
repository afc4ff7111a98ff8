"""The model's vocabulary as llguidance sees it (an `LLTokenizer`), built from our `Tokenizer`.

llguidance computes masks from each token's bytes. What the model must never emit inside a
constrained answer is kept out of every mask:
- CONTROL and UNKNOWN tokens (`Tokenizer.is_special`) are passed as special tokens: llguidance
  never allows them inside a grammar's text (a `<start_of_turn>` would otherwise match as plain
  characters in a JSON string);
- logits rows past the tokenizer's vocabulary (a padded output head) and tokens that render as
  no bytes get an empty entry, which no mask ever allows;
- the end-of-generation tokens (`Tokenizer.eog_ids`) are the EOS tokens: allowed only where the
  grammar is complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import llguidance

if TYPE_CHECKING:
    from hyserve.model.tokenizer import Tokenizer


__all__ = ["build_lltokenizer"]


class _Vocabulary:
    """The attributes `llguidance.TokenizerWrapper` reads, over our tokenizer."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int) -> None:
        eog = sorted(tokenizer.eog_ids)
        eos = tokenizer.eos_id if tokenizer.eos_id is not None else (eog[0] if eog else None)
        if eos is None:
            raise ValueError("the vocabulary has no end-of-generation token: a constrained answer could never end")
        self.eos_token_id: int = eos
        self.bos_token_id: int | None = tokenizer.bos_id
        n = min(tokenizer.vocab_size, n_vocab)
        self.tokens: list[bytes] = [tokenizer.token_bytes(i) for i in range(n)] + [b""] * (n_vocab - n)
        self.special_token_ids: list[int] = [i for i in range(n) if tokenizer.is_special(i)]
        self._tokenizer = tokenizer

    def __call__(self, text: bytes) -> list[int]:
        # llguidance passes valid UTF-8 here (it tokenizes a trailing partial character greedily)
        return self._tokenizer.encode(text.decode("utf-8", errors="replace"), add_special=False, parse_special=False)


def eos_tokens(tokenizer: Tokenizer) -> list[int]:
    return sorted(tokenizer.eog_ids) or ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])


def build_lltokenizer(
    tokenizer: Tokenizer, n_vocab: int, slices: Sequence[str] | None = None
) -> llguidance.LLTokenizer:
    """The `LLTokenizer` for a model whose logits have `n_vocab` entries (seconds for Gemma 3's 262k
    tokens: build it once per model)."""
    wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer, n_vocab))
    return llguidance.LLTokenizer(
        wrapper, n_vocab=n_vocab, eos_token=eos_tokens(tokenizer), slices=list(slices) if slices is not None else None
    )
