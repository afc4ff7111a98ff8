"""Sampling without sorting the vocabulary: the same candidates, order and draws as a full stable sort."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

from hyserve.engine.sampling import SamplingParams, _nucleus, sample, top_candidates

N_VOCAB = 262144  # Gemma 3's vocabulary


def sorted_reference(logits: np.ndarray, p: SamplingParams, rng: np.random.Generator) -> int:
    """The textbook chain in llama.cpp's order: stable descending sort of the whole row, top-k,
    softmax, top-p, min-p, then temperature over the tokens kept."""
    x = logits.astype(np.float64)
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
    t = np.exp((x[order[:keep]] - x[order[0]]) / p.temperature)
    return int(order[:keep][rng.choice(keep, p=t / t.sum())])


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
    """Without top-k the kept tokens are the same descending prefix as with a full sort, with the
    probabilities before temperature (which llama.cpp applies after the cuts)."""
    p = SamplingParams(**{"temperature": 1.0, **params})
    logits = peaky_logits(np.random.default_rng(7))
    order, probs = _nucleus(logits, p)
    assert len(order) < len(logits)  # only candidates were sorted
    x = logits.astype(np.float64)
    ref = np.argsort(-x, kind="stable")
    ref_p = np.exp(x[ref] - x[ref[0]])
    ref_p /= ref_p.sum()
    np.testing.assert_array_equal(order, ref[: len(order)])
    np.testing.assert_allclose(probs, ref_p[: len(order)], rtol=1e-9)


def test_greedy_takes_the_first_maximum() -> None:
    logits = np.zeros(N_VOCAB, np.float32)
    logits[[70000, 9, 200000]] = 5.0
    assert sample(logits, [], SamplingParams(), np.random.default_rng(0)) == 9


# --- the distribution itself: chi-square over seeds against the definitions -----------------------


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for a chi-square variable with `df` degrees of freedom (series of the lower
    regularized gamma function; plenty for the statistics here)."""
    a, z = df / 2.0, float(x) / 2.0
    if z <= 0:
        return 1.0
    if z > a + 40.0 * math.sqrt(a) + 40.0:  # far in the tail (< 1e-15), where the series overflows
        return 0.0
    term = total = 1.0 / a
    n = 0
    while term > total * 1e-15:
        n += 1
        term *= z / (a + n)
        total += term
    lower = math.exp(a * math.log(z) - z - math.lgamma(a)) * total
    return max(0.0, 1.0 - lower)


def defined_distribution(
    logits: np.ndarray, history: list[int], p: SamplingParams, temperature_first: bool = False
) -> np.ndarray:
    """The proto's definitions in llama.cpp's default chain order, one token at a time: penalties
    over the last `penalty_last_n` tokens (repetition divides a positive logit and multiplies a
    negative one, then count x frequency and presence are subtracted); then in descending order
    top-k, top-p (the smallest prefix whose probability reaches top_p) and min-p (at least min_p
    times the most likely token's probability), on the probabilities before temperature; then
    temperature and softmax over the tokens kept. `temperature_first` is the other order."""
    x = [float(v) for v in logits]
    recent = history[-p.penalty_last_n :] if p.penalty_last_n > 0 else []
    for tok in set(recent):
        count = recent.count(tok)
        v = x[tok]
        v = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
        x[tok] = v - count * p.frequency_penalty - p.presence_penalty
    if temperature_first:
        x = [v / p.temperature for v in x]

    def softmax(ids: list[int], t: float) -> dict[int, float]:
        top = max(x[i] for i in ids)
        w = {i: math.exp((x[i] - top) / t) for i in ids}
        total = sum(w.values())
        return {i: v / total for i, v in w.items()}

    order = sorted(range(len(x)), key=lambda i: (-x[i], i))
    if p.top_k > 0:
        order = order[: p.top_k]
    probs = softmax(order, 1.0)
    if p.top_p < 1.0:
        cum, cut = 0.0, len(order)
        for n, i in enumerate(order):
            cum += probs[i]
            if cum >= p.top_p:
                cut = n + 1
                break
        order = order[:cut]
    if p.min_p > 0.0:
        best = probs[order[0]]
        order = [i for i in order if probs[i] >= p.min_p * best]
    out = np.zeros(len(x))
    for i, q in softmax(order, 1.0 if temperature_first else p.temperature).items():
        out[i] = q
    return out


HISTORY = [3, 3, 3, 7, 11, 11, 42, 5, 3, 200, 7]
N_DRAWS = 20_000
PARAMS = [
    dict(temperature=0.7, top_p=0.8),
    dict(temperature=1.3, min_p=0.1),
    dict(temperature=1.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2, penalty_last_n=8),
    dict(temperature=0.9, top_k=12, top_p=0.9, min_p=0.05, repetition_penalty=1.1),
    dict(temperature=1.0),
    # where the order of temperature and the cuts changes which tokens are kept
    dict(temperature=0.4, top_p=0.9),
    dict(temperature=2.5, min_p=0.2),
    dict(temperature=0.5, top_k=30, top_p=0.95, min_p=0.02, frequency_penalty=0.3, penalty_last_n=16),
]


def sample_logits() -> np.ndarray:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(300) * 1.5).astype(np.float32)
    logits[[3, 7, 11, 42, 5]] = [4.0, 3.6, 3.5, 3.0, -2.0]  # strong candidates, some in the history
    return logits


def chi_square_p(counts: np.ndarray, want: np.ndarray) -> float:
    """P-value of `counts` drawn from `want` (bins expecting < 5 draws pooled into one)."""
    n = counts.sum()
    expected = want * n
    big = expected >= 5
    obs = [*counts[big], counts[~big].sum()]
    exp = [*expected[big], expected[~big].sum()]
    if exp[-1] < 5:
        obs, exp = [*obs[:-2], obs[-2] + obs[-1]], [*exp[:-2], exp[-2] + exp[-1]]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    return chi2_sf(stat, len(obs) - 1)


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_sampled_distribution_matches_the_definitions(params: dict) -> None:
    """20,000 draws (one per seed) land on exactly the tokens the definitions keep, in proportions
    a chi-square test cannot tell from the defined probabilities."""
    logits = sample_logits()
    p = SamplingParams(**params)
    want = defined_distribution(logits, HISTORY, p)
    draws = [sample(logits, HISTORY, p, np.random.default_rng(seed)) for seed in range(N_DRAWS)]
    counts = np.bincount(draws, minlength=len(logits))
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(want)), "drew a token the definitions drop"
    assert chi_square_p(counts, want) > 1e-3


def llama_cpp_draws(logits: np.ndarray, history: list[int], p: SamplingParams, n: int) -> np.ndarray:
    """`n` tokens drawn by llama.cpp's own sampler chain in llama-cpp-python's default order
    (penalties, top-k, top-p, min-p, temperature, dist; `Llama._init_sampler`), seeded."""
    lc = pytest.importorskip("llama_cpp")
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    for sampler in (
        lc.llama_sampler_init_penalties(len(logits), p.penalty_last_n, p.repetition_penalty, p.frequency_penalty,
                                        p.presence_penalty),
        lc.llama_sampler_init_top_k(p.top_k),
        lc.llama_sampler_init_top_p(p.top_p, 1),
        lc.llama_sampler_init_min_p(p.min_p, 1),
        lc.llama_sampler_init_temp(p.temperature),
        lc.llama_sampler_init_dist(1234),
    ):  # fmt: skip
        lc.llama_sampler_chain_add(chain, sampler)  # the chain owns (and frees) its samplers
    for tok in history:
        lc.llama_sampler_accept(chain, tok)
    fresh = (lc.llama_token_data * len(logits))(*[lc.llama_token_data(i, float(v), 0.0) for i, v in enumerate(logits)])
    data = (lc.llama_token_data * len(logits))()
    out = np.empty(n, np.int64)
    try:
        for k in range(n):
            ctypes.memmove(data, fresh, ctypes.sizeof(fresh))
            cur = lc.llama_token_data_array(data, len(logits), -1, False)
            lc.llama_sampler_apply(chain, ctypes.byref(cur))
            out[k] = data[cur.selected].id
    finally:
        lc.llama_sampler_free(chain)
    return out


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_llama_cpp_sampler_chain_draws_the_defined_distribution(params: dict) -> None:
    """llama.cpp's sampler chain, the oracle for the definitions above: its 20,000 seeded draws
    keep the same tokens, in proportions a chi-square test cannot tell from the definitions (which
    `sample` is held to by the test above), so hyserve samples what llama.cpp samples."""
    logits = sample_logits()
    p = SamplingParams(**params)
    want = defined_distribution(logits, HISTORY, p)
    counts = np.bincount(llama_cpp_draws(logits, HISTORY, p, N_DRAWS), minlength=len(logits))
    assert set(np.flatnonzero(counts)) <= set(np.flatnonzero(want)), "llama.cpp drew a token the definitions drop"
    assert chi_square_p(counts, want) > 1e-3


def test_temperature_order_matters_for_the_cases_above() -> None:
    """The order-sensitive cases keep other tokens with temperature applied first (hyserve's old
    order), so the two tests above tell the orders apart."""
    logits = sample_logits()
    for params in PARAMS[-3:]:
        p = SamplingParams(**params)
        last, first = defined_distribution(logits, HISTORY, p), defined_distribution(logits, HISTORY, p, True)
        assert set(np.flatnonzero(last)) != set(np.flatnonzero(first)), params


def test_the_chi_square_check_can_fail() -> None:
    """The check above rejects a sampler that ignores the penalties."""
    logits = np.linspace(3.0, 0.0, 20).astype(np.float32)
    with_penalty = SamplingParams(temperature=1.0, repetition_penalty=2.0, penalty_last_n=8)
    want = defined_distribution(logits, [0, 0, 1], with_penalty)
    wrong = defined_distribution(logits, [0, 0, 1], SamplingParams(temperature=1.0))
    n = 5000
    stat = sum((n * w - n * g) ** 2 / (n * g) for w, g in zip(wrong, want) if g > 0)
    assert chi2_sf(stat, len(logits) - 1) < 1e-6
    assert abs(chi2_sf(3.84, 1) - 0.05) < 1e-3 and abs(chi2_sf(18.31, 10) - 0.05) < 1e-3
