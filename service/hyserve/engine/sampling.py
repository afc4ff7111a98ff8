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
    # Extreme (finite) penalties overflow float32: each step saturates instead, so no inf - inf makes
    # a NaN; ordinary values pass the clips unchanged (same float32 arithmetic as llama.cpp).
    with np.errstate(over="ignore"):
        vals = _saturate(np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty))
        # one subtraction of count * frequency + presence, grouped as llama.cpp's penalties sampler
        out[ids] = _saturate(vals - _saturate(counts * p.frequency_penalty + p.presence_penalty))
    return out


_F32_MAX = float(np.finfo(np.float32).max)
# Logits divided by a tiny temperature saturate here: differences of two such values stay finite.
_SCALED_MAX = 1e300


def _saturate(x: np.ndarray) -> np.ndarray:
    return np.clip(x, -_F32_MAX, _F32_MAX)


def _scaled(logits: np.ndarray, temperature: float) -> np.ndarray:
    """logits / temperature in float64, saturated so that the result is finite."""
    with np.errstate(over="ignore"):
        x = logits.astype(np.float64) / temperature
    return np.clip(x, -_SCALED_MAX, _SCALED_MAX, out=x)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def top_candidates(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values of `x`, by descending value then ascending index (the order
    of a stable descending sort), without sorting or copying the whole row: a threshold from a
    strided sample of the row is lowered until at least k values reach it, which makes the
    candidates a superset of the top k; only the candidates are sorted."""
    n = len(x)
    k = min(k, n)
    stride = max(1, n // 4096)
    sample = x[::stride]
    q = min(len(sample), k * len(sample) // n + 8)  # sample rank expected to cover k with margin
    while True:
        if q >= len(sample):
            cand = np.arange(n)
            break
        thr = np.partition(sample, len(sample) - q)[len(sample) - q]
        cand = np.flatnonzero(x >= thr)
        if len(cand) >= k:
            break
        q *= 4
    order = cand[np.lexsort((cand, -x[cand]))]
    return order[:k]


def sample(logits: np.ndarray, history: Sequence[int], p: SamplingParams, rng: np.random.Generator) -> int:
    """Greedy: the first maximum. Otherwise llama.cpp's default chain (common_params_sampling's
    and llama-cpp-python's order): penalties, top-k, top-p, min-p on the untempered distribution,
    then temperature over the tokens kept and a draw; only candidates are sorted."""
    logits = apply_penalties(logits, history, p)
    if p.greedy:
        return int(np.argmax(logits))
    if p.top_k > 0:
        order = top_candidates(logits, p.top_k)
        x = logits[order].astype(np.float64)
        probs = np.exp(x - x[0])
        probs /= probs.sum()
    else:
        order, probs = _nucleus(logits, p)
    keep = kept_prefix(probs, p.top_p, p.min_p)
    return int(order[_draw(_tempered(logits[order[:keep]], p.temperature), rng)])


def kept_prefix(probs: np.ndarray, top_p: float, min_p: float) -> int:
    """How many of the candidates (descending `probs`, before temperature) top-p and min-p keep:
    top-p the smallest prefix whose sum reaches top_p, min-p those at least min_p times the first."""
    keep = len(probs)
    if top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), top_p) + 1))
    if min_p > 0.0:
        keep = min(keep, max(1, int(np.sum(probs >= min_p * probs[0]))))
    return keep


def _tempered(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / temperature), unnormalised (the draw normalises)."""
    x = _scaled(logits, temperature)
    return np.exp(x - x.max())


def _draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn with weights `probs`: `rng.choice(len(probs), p=probs / probs.sum())`'s
    inverse-CDF draw (same random number, same result) without its validation passes."""
    cdf = np.cumsum(probs / probs.sum())
    cdf /= cdf[-1]
    return min(int(np.searchsorted(cdf, rng.random(), side="right")), len(cdf) - 1)


def _nucleus(logits: np.ndarray, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Without top-k: the smallest descending prefix of the vocabulary that contains the top-p and
    min-p cut points, with untempered probabilities normalised over the whole vocabulary. With
    neither cut, the whole vocabulary in index order (sampling needs no order)."""
    x = logits.astype(np.float64)
    e = np.exp(x - x.max())
    total = e.sum()
    if p.top_p >= 1.0 and p.min_p <= 0.0:
        return np.arange(len(x)), e / total
    c = 64
    while True:
        order = top_candidates(x, c)
        probs = e[order] / total
        if c >= len(x) or (p.top_p < 1.0 and probs.sum() >= p.top_p) or probs[-1] < p.min_p * probs[0]:
            return order, probs
        c *= 8
