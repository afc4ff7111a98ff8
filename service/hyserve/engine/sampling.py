"""Token sampling as pure functions of (logits, history, params, rng): greedy or seeded random."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def apply_penalties(logits: np.ndarray, history: Sequence[int], p: SamplingParams) -> np.ndarray:
    """llama.cpp-style penalties over the last `penalty_last_n` tokens (a copy; input untouched)."""
    if p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0:
        return logits
    recent = Counter(history[-p.penalty_last_n :] if p.penalty_last_n > 0 else [])
    if not recent:
        return logits
    out = logits.astype(np.float32, copy=True)
    ids = np.fromiter(recent.keys(), dtype=np.int64)
    counts = np.fromiter(recent.values(), dtype=np.float32)
    vals = out[ids]
    vals = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
    out[ids] = vals - counts * p.frequency_penalty - p.presence_penalty
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def sample(logits: np.ndarray, history: Sequence[int], p: SamplingParams, rng: np.random.Generator) -> int:
    logits = apply_penalties(logits, history, p)
    if p.greedy:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / p.temperature
    order = np.argsort(-x, kind="stable")
    if p.top_k > 0:
        order = order[: p.top_k]
    probs = np.exp(x[order] - x[order[0]])
    probs /= probs.sum()
    keep = len(order)
    if p.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p) + 1))
    if p.min_p > 0.0:
        keep = min(keep, max(1, int(np.sum(probs >= p.min_p * probs[0]))))
    order, probs = order[:keep], probs[:keep]
    return int(order[rng.choice(len(order), p=probs / probs.sum())])
