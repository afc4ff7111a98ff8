"""A tiny deterministic fake architecture and tokenizer for the engine tests, no model file: the next
token depends on every token in the sequence's memory, so any mismatch between a slot's token list
and its memory (invariant I1) changes the output."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
from hyserve_kernels import CancelFlag

from hyserve.model.architectures.base import Architecture, ForwardCancelled, Logits, Segment
from hyserve.model.memory import KVCache, SequenceMemory

VOCAB = 40
EOG = 1


class FakeMemory(SequenceMemory):
    """Attention-like memory: the evaluated token ids live in a real 1 x 1 KV cache (f16 holds
    them exactly), so truncation, export and load go through the production code."""

    def __init__(self, n_ctx: int) -> None:
        super().__init__(n_ctx, {0: KVCache(n_ctx, 1, 1)})

    @property
    def history(self) -> np.ndarray:
        return self.kv[0].k[:, 0, 0]


class FakeArch(Architecture):
    """Next token = a hash of the whole evaluated sequence; logits are one-hot-ish."""

    name = "fake"
    n_vocab = VOCAB
    n_ctx_train = 4096

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_next = False
        self.delay = 0.0  # seconds per forward call
        self.honor_cancel = False  # True: stop mid-forward on the task's flag, like the real model
        self.calls: list[list[tuple[int, int]]] = []

    def new_memory(self, n_ctx: int) -> SequenceMemory:
        return FakeMemory(n_ctx)

    @staticmethod
    def next_token(seq: Sequence[int]) -> int:
        h = 0
        for i, t in enumerate(seq):
            h = (h * 31 + (i + 1) * (int(t) + 7)) % 1_000_003
        return 2 + h % (VOCAB - 2)  # never EOG

    def _forward(self, segments: Sequence[Segment], cancel: CancelFlag | None = None) -> list[np.ndarray | None]:
        self.entered.set()
        self.gate.wait(10)
        time.sleep(self.delay)
        if self.honor_cancel and cancel is not None and cancel.is_set():
            raise ForwardCancelled  # as the real model does at its next layer boundary
        self.calls.append([(id(s.memory), len(s.tokens)) for s in segments])
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        for s in segments:
            s.memory.check_room(len(s.tokens))
        out: list[np.ndarray | None] = []
        for s in segments:
            mem = s.memory
            assert isinstance(mem, FakeMemory)
            n = mem.n_tokens
            mem.history[n : n + len(s.tokens)] = s.tokens
            rows = []
            for j in range(len(s.tokens)):
                logits = np.zeros(VOCAB, dtype=np.float32)
                logits[self.next_token(mem.history[: n + j + 1])] = 5.0
                rows.append(logits)
            if s.logits is Logits.ALL:
                out.append(np.stack(rows))
            elif s.logits is Logits.LAST:
                out.append(rows[-1])
            elif s.logits is Logits.ARGMAX:  # the greedy token alone, as a one-element int32 array
                out.append(np.array([int(np.argmax(rows[-1]))], dtype=np.int32))
            else:
                out.append(None)
        for s in segments:
            s.memory.n_tokens += len(s.tokens)
        return out


class FakeDecoder:
    def push(self, token_id: int) -> str:
        return chr(ord("a") + token_id % 26)

    def flush(self) -> str:
        return ""


class FakeTokenizer:
    vocab_size = VOCAB
    eog_ids = frozenset({EOG})

    def incremental_decoder(self, skip_special: bool = False) -> FakeDecoder:
        return FakeDecoder()

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids


def reference(prompt: Sequence[int], n: int) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(FakeArch.next_token(seq))
    return seq[len(prompt) :]
