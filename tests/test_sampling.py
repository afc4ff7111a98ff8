"""Sampling without sorting the vocabulary: the same candidates, order and draws as a full stable sort."""

from __future__ import annotations

import numpy as np
import pytest

from hyserve.engine.sampling import SamplingParams, _nucleus, sample, top_candidates

N_VOCAB = 262144  # Gemma 3's vocabulary


def sorted_reference(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """The textbook chain: stable descending sort of the whole row, top-k, softmax, top-p, min-p."""
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
    return int(order[:keep][rng.choice(keep, p=probs[:keep] / probs[:keep].sum())])


def peaky_logits(rng: np.random.Generator, n: int = N_VOCAB) -> np.ndarray:
    """Language-model-like logits: a long flat tail, a few strong candidates, exact ties at the top."""
    x = rng.standard_normal(n).astype(np.float32) * 2
    top = rng.choice(n, 30, replace=False)
    x[top] = 12 + rng.standard_normal(30).astype(np.float32)
    x[top[:3]] = x[top].max()
    return x


@pytest.mark.parametrize("k", [1, 3, 40, 1000, N_VOCAB])
def test_top_candidates_equal_a_stable_sort(k: int) -> None:
    rng = np.random.default_rng(k)
    for logits in (peaky_logits(rng), rng.standard_normal(N_VOCAB).astype(np.float32), np.zeros(N_VOCAB, np.float32)):
        want = np.argsort(-logits, kind="stable")[:k]
        np.testing.assert_array_equal(top_candidates(logits, k), want)


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.8, top_k=40),
        dict(temperature=0.8, top_k=40, top_p=0.9),
        dict(temperature=1.2, top_k=5, min_p=0.05),
    ],
    ids=str,
)
def test_top_k_sampling_draws_what_a_full_sort_draws(params: dict) -> None:
    """With top-k the candidates, their probabilities and the seeded draw equal the sorted chain's."""
    p = SamplingParams(**params)
    for seed in range(40):
        logits = peaky_logits(np.random.default_rng(seed))
        got = sample(logits, [], p, np.random.default_rng(seed))
        assert got == sorted_reference(logits, p, np.random.default_rng(seed)), seed


@pytest.mark.parametrize(
    "params", [dict(temperature=0.8, top_p=0.9), dict(temperature=1.0, min_p=0.05), dict(top_p=0.5, min_p=0.2)], ids=str
)
def test_nucleus_without_top_k_keeps_the_sorted_prefix(params: dict) -> None:
    """Without top-k the kept tokens are the same descending prefix as with a full sort."""
    p = SamplingParams(**{"temperature": 1.0, **params})
    logits = peaky_logits(np.random.default_rng(7))
    order, probs = _nucleus(logits, p)
    assert len(order) < len(logits)  # only candidates were sorted
    x = logits.astype(np.float64) / p.temperature
    ref = np.argsort(-x, kind="stable")
    ref_p = np.exp(x[ref] - x[ref[0]])
    ref_p /= ref_p.sum()
    np.testing.assert_array_equal(order, ref[: len(order)])
    np.testing.assert_allclose(probs, ref_p[: len(order)], rtol=1e-9)


def test_greedy_takes_the_first_maximum() -> None:
    logits = np.zeros(N_VOCAB, np.float32)
    logits[[70000, 9, 200000]] = 5.0
    assert sample(logits, [], SamplingParams(), np.random.default_rng(0)) == 9
