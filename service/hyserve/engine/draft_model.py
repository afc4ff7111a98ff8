"""Drafts from a second, smaller model with the target's vocabulary (`--spec draft`): the draft
model runs greedily k tokens ahead of the sequence in its own memory, and the target verifies
them as it verifies any draft (speculative.py). Whatever the draft model says, the output is the
target's: a wrong draft costs time only.

The draft memory follows the sequence the drafter is told about (`extend`): before each proposal
it is rolled back to the longest prefix it shares with that sequence, the way the target's memory
is (attention truncated; recurrent and ring state restored from the snapshot taken before the
drafted tokens, then advanced by replaying the inputs their forwards recorded, bit for bit), and
the tokens it has not evaluated yet are evaluated in one forward. A drafter can start a new
sequence on the memory it has (`start`), so a slot's next request reuses what its draft memory
shares with the new prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hyserve.model.architectures.base import Architecture, Logits, Segment
from hyserve.model.memory import SequenceMemory, Snapshot

if TYPE_CHECKING:
    from hyserve.model.backend.select import DeviceRequest
    from hyserve.model.tokenizer import Tokenizer

__all__ = ["DraftModelDrafter", "DraftVocabularyError", "check_vocabulary", "confident_token", "load_draft_model"]

CATCH_UP_CHUNK = 256  # tokens per forward when the draft memory catches up with a long prompt


class DraftVocabularyError(ValueError):
    """The draft model's vocabulary is not the target's: its token ids would mean other text."""


def check_vocabulary(target: Tokenizer, target_vocab: int, draft: Tokenizer, draft_vocab: int) -> None:
    """Raise DraftVocabularyError unless both models have the same tokens, special tokens and
    logits width: a drafted id must be the token the target would have sampled."""
    if (target.vocab_size, target_vocab) != (draft.vocab_size, draft_vocab):
        raise DraftVocabularyError(
            f"the draft model's vocabulary has {draft.vocab_size} tokens ({draft_vocab} logits), "
            f"the target's {target.vocab_size} ({target_vocab} logits)"
        )
    for name in ("bos_id", "eos_id", "eot_id"):
        if getattr(target, name) != getattr(draft, name):
            raise DraftVocabularyError(f"the draft model's {name} differs from the target's")
    for i in range(target.vocab_size):
        if target.token_text(i) != draft.token_text(i):
            raise DraftVocabularyError(
                f"token {i} is {draft.token_text(i)!r} in the draft model, {target.token_text(i)!r} in the target"
            )


def load_draft_model(
    path: str | Path, target: Architecture, tokenizer: Tokenizer, device: DeviceRequest | None = None
) -> Architecture:
    """The draft model at `path`, checked against the target's vocabulary (DraftVocabularyError)."""
    from hyserve.model.loader import load_model

    draft = load_model(path, device=device)
    check_vocabulary(tokenizer, target.n_vocab, draft.tokenizer, draft.arch.n_vocab)
    return draft.arch


def confident_token(logits: np.ndarray, p_min: float) -> tuple[int, bool]:
    """The greedy token of `logits` and whether its probability is at least `p_min`."""
    token = int(np.argmax(logits))
    if p_min <= 0.0:
        return token, True
    shifted = logits.astype(np.float64) - float(logits[token])
    return token, 1.0 / float(np.exp(shifted).sum()) >= p_min


def _shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftModelDrafter:
    """Greedy drafts of `arch` (the `Drafter` protocol), in a memory of `n_ctx` tokens; a draft
    ends before the first token the draft model gives less than `p_min` probability."""

    def __init__(self, arch: Architecture, n_ctx: int, p_min: float = 0.0) -> None:
        self.arch = arch
        self.n_ctx = n_ctx
        self.p_min = p_min  # a draft ends before a token the draft model gives less probability
        self.memory: SequenceMemory = arch.new_memory(n_ctx)
        self.tokens: list[int] = []  # the sequence so far
        self.held: list[int] = []  # the tokens the memory holds (a prefix of tokens + a draft)
        # the state before the last draft's tokens and what their forwards consumed (non-truncatable
        # memory only): a rollback inside the draft restores it and replays
        self._snapshot: Snapshot | None = None
        self._parts: list[dict[int, tuple[np.ndarray, ...]]] = []

    def start(self) -> None:
        """A new sequence: the memory stays, and keeps what it shares with the next one."""
        self.tokens = []

    def extend(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(int(t) for t in tokens)

    def propose(self, k: int) -> list[int]:
        k = min(k, self.n_ctx - len(self.tokens))
        if k <= 0 or not self.tokens:
            return []
        logits = self._catch_up()
        draft: list[int] = []
        recording = not self.memory.truncatable
        self._snapshot = self.memory.snapshot() if recording else None
        self._parts = []
        while True:
            token, sure = confident_token(logits, self.p_min)
            if not sure:
                break  # an unsure draft token is likely rejected: verifying it costs more than it gains
            draft.append(token)
            if len(draft) == k:
                break
            inputs: dict[int, tuple[np.ndarray, ...]] | None = {} if recording else None
            step = np.asarray([token], np.int32)
            logits = self.arch.forward([Segment(self.memory, step, Logits.LAST, inputs)])[0]
            self.held.append(token)
            if inputs is not None:
                self._parts.append(inputs)
        return draft

    def _catch_up(self) -> np.ndarray:
        """Roll the memory back to what it shares with the sequence, evaluate the rest; the logits
        after the sequence's last token."""
        keep = min(_shared_prefix(self.held, self.tokens), len(self.tokens) - 1)  # >= 1 token to evaluate
        if keep < len(self.held):
            self._roll_back(keep)
        logits = None
        for at in range(len(self.held), len(self.tokens), CATCH_UP_CHUNK):
            part = self.tokens[at : at + CATCH_UP_CHUNK]
            logits = self.arch.forward([Segment(self.memory, np.asarray(part, np.int32), Logits.LAST)])[0]
            self.held.extend(part)
        if logits is None:
            raise ValueError("no token to evaluate")
        return logits

    def _roll_back(self, keep: int) -> None:
        memory = self.memory
        start = memory.n_tokens - len(self._parts)  # where the snapshot was taken
        if memory.truncatable:
            memory.truncate(keep)
        elif self._snapshot is not None and start <= keep:
            memory.restore(self._snapshot)
            if keep > start:
                self.arch.replay(memory, self._parts[: keep - start])
        else:  # recurrent state before the last draft: start over
            self.memory = memory = self.arch.new_memory(self.n_ctx)
            keep = 0
        self.held = self.held[:keep]
        self._snapshot, self._parts = None, []
