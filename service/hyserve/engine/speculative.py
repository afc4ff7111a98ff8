"""Speculative decoding's two model steps: verify a draft in one forward, and keep only what the
target accepted.

Why the output is the plain decoder's, token for token: the verifying forward evaluates the last
sampled token and the k drafted ones in one call, and its logits rows are bit for bit those that k+1
single-token steps would give (the kernels are batch- and chunk-invariant, ARCHITECTURE.md). The
caller samples each row in order with the request's own random stream, exactly as plain decoding
would, and stops at the first sample that differs from the draft: that sample is plain decoding's
token there. So speculation changes how many forwards run, never which tokens come out, greedy or
seeded.

Rollback to the accepted length: attention memory is truncated; recurrent (and ring window) memory
is restored from a snapshot taken before the verifying forward, then advanced over the accepted
tokens by replaying the layer inputs that forward recorded (`Architecture.replay`: the recurrent
kernels alone, no matmul, the same bits as the forward). A replay costs the recurrent kernels of
the accepted tokens; keeping a state per drafted position instead would cost k state copies per
layer on every step, accepted or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hyserve.engine.draft_model import DraftModelDrafter
from hyserve.engine.drafting import Drafter, NgramDrafter
from hyserve.engine.guards import require
from hyserve.model.architectures.base import Architecture, Logits, Segment
from hyserve.model.memory import SequenceMemory, Snapshot

__all__ = ["DraftLength", "SpecConfig", "SpecStats", "Verified", "keep_accepted", "new_drafter", "verify"]

METHODS = ("ngram", "draft", "off")


@dataclass(frozen=True)
class SpecConfig:
    """`method`: "ngram" (prompt lookup), "draft" (the draft model `draft`, loaded by
    draft_model.load_draft_model) or "off"; `max_draft`: tokens per draft at most; `adaptive`:
    draft fewer after rejections, more after full acceptances; `ngram_min` / `ngram_max`: the
    n-gram lengths prompt lookup matches; `draft_p_min`: a draft model's least probability for a
    drafted token (0: draft `max_draft` tokens whatever it thinks)."""

    method: str = "ngram"
    max_draft: int = 8
    adaptive: bool = True
    ngram_min: int = 2
    ngram_max: int = 4
    draft: Architecture | None = field(default=None, compare=False, repr=False)
    draft_p_min: float = 0.0  # a draft model's draft ends before a token it gives less probability

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown speculation method {self.method!r} ({', '.join(METHODS)})")
        if self.max_draft < 1:
            raise ValueError(f"max_draft must be >= 1 (got {self.max_draft})")
        if (self.method == "draft") != (self.draft is not None):
            raise ValueError("the draft method and a draft model go together")
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise ValueError(f"draft_p_min must be in [0, 1] (got {self.draft_p_min})")


def new_drafter(config: SpecConfig, n_ctx: int) -> Drafter | None:
    """The drafter `config` names for one sequence of up to `n_ctx` tokens (None: "off")."""
    if config.method == "ngram":
        return NgramDrafter(config.ngram_min, config.ngram_max)
    if config.method == "draft" and config.draft is not None:
        return DraftModelDrafter(config.draft, n_ctx, config.draft_p_min)
    return None


@dataclass
class SpecStats:
    """What speculation did for one sequence (drafts proposed, tokens drafted and accepted)."""

    drafts: int = 0
    drafted: int = 0
    accepted: int = 0


class DraftLength:
    """How many tokens to draft next: the longest accepted run plus one after a rejection, twice as
    many after a draft that was accepted whole (bounded by `max_draft`); fixed when not adaptive."""

    def __init__(self, config: SpecConfig) -> None:
        self.config = config
        self.k = config.max_draft

    def update(self, drafted: int, accepted: int) -> None:
        if not self.config.adaptive or drafted == 0:
            return
        self.k = min(self.config.max_draft, 2 * self.k if accepted == drafted else accepted + 1)


@dataclass(frozen=True)
class Verified:
    """A verifying forward's result: one logits row per evaluated token (row i: after token i), and
    what `keep_accepted` needs to roll the memory back."""

    rows: np.ndarray
    start: int  # the memory's token count before the forward
    snapshot: Snapshot | None  # None: attention-only memory, truncated instead
    inputs: dict[int, tuple[np.ndarray, ...]] | None


def verify(arch: Architecture, memory: SequenceMemory, tokens: Sequence[int]) -> Verified:
    """Evaluate `tokens` (the last sampled token, then the draft) in one forward, every row's logits
    kept, with what a rollback needs."""
    start = memory.n_tokens
    snapshot = None if memory.truncatable else memory.snapshot()
    inputs: dict[int, tuple[np.ndarray, ...]] | None = None if snapshot is None else {}
    rows = arch.forward([Segment(memory, np.asarray(tokens, np.int32), Logits.ALL, inputs)])[0]
    return Verified(rows, start, snapshot, inputs)


def keep_accepted(arch: Architecture, memory: SequenceMemory, verified: Verified, n: int) -> None:
    """Leave `memory` holding only the first `n` tokens the verifying forward evaluated."""
    target = verified.start + n
    if memory.n_tokens == target:
        return
    if verified.snapshot is None:
        memory.truncate(target)
        return
    memory.restore(verified.snapshot)
    if n and verified.inputs:
        arch.replay(memory, [{il: tuple(a[:n] for a in rows) for il, rows in verified.inputs.items()}])
    require(memory.n_tokens == target, f"rollback reached {memory.n_tokens} tokens instead of {target}")
