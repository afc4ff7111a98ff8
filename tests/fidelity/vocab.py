"""An independent byte-level BPE vocabulary for fuzz fixtures (GPT-2 byte alphabet, merges learned
by plain pair counting on seeded random text). A prefix of a BPE merge list is itself a valid
merge list, so one training run serves every vocabulary size."""

from __future__ import annotations

import functools
import itertools
import random
import re
from collections import Counter
from dataclasses import dataclass

from .texts import random_text

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MAX_MERGES = 700
_SPLIT = re.compile(r" ?[^\s\d\W]+| ?\d| ?[^\s\w]+|\s+", re.UNICODE)


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte value (index = byte)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + extra)
            extra += 1
    return [out[b] for b in range(256)]


@functools.lru_cache(maxsize=1)
def _merges() -> tuple[tuple[str, str], ...]:
    alpha = byte_alphabet()
    corpus = random_text(random.Random(12345), 30000)
    words = Counter(tuple(alpha[b] for b in w.encode()) for w in _SPLIT.findall(corpus))
    merges: list[tuple[str, str]] = []
    while len(merges) < MAX_MERGES:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, n in words.items():
            for a, b in itertools.pairwise(w):
                pairs[a, b] += n
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        new: Counter[tuple[str, ...]] = Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(joined)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += n
        words = new
    return tuple(merges)


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    types: list[int]  # 1 normal, 3 control
    merges: list[str]

    @property
    def eos(self) -> int:
        return self.tokens.index("<|im_end|>")

    @property
    def bos(self) -> int:
        return self.tokens.index("<|endoftext|>")


def make_vocab(n_merges: int) -> Vocab:
    """256 byte tokens, the first n_merges learned merges, then the special tokens."""
    merges = _merges()[:n_merges]
    tokens = byte_alphabet()
    seen = set(tokens)
    for a, b in merges:  # two merges may make the same string; the vocabulary lists it once
        if a + b not in seen:
            seen.add(a + b)
            tokens.append(a + b)
    types = [1] * len(tokens) + [3] * len(SPECIALS)
    return Vocab(tokens + list(SPECIALS), types, [f"{a} {b}" for a, b in merges])
