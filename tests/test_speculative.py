"""Speculative decoding (engine/drafting.py, engine/speculative.py, `generate(spec=...)`): the same
tokens as plain decoding, greedy and seeded, on every architecture (attention memory truncated,
recurrent memory restored and replayed on a rejected draft), and the n-gram drafter's index against
a plain scan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models
from hypothesis import given, settings
from hypothesis import strategies as st

from hyserve.engine.drafting import NgramDrafter
from hyserve.engine.generator import SpecConfig, SpecStats, StopRule, generate
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.speculative import DraftLength
from hyserve.model.loader import LoadedModel, load_model

ARCHES = make_models.ARCHES
# a text that repeats itself, so prompt lookup has drafts to offer
COPY = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n" * 3 + "def add(a, b):\n"


def scan_proposal(tokens: list[int], k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    """What prompt lookup proposes, by scanning: the longest n-gram ending the sequence that also
    ended earlier, continued from its latest earlier occurrence."""
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        gram = tokens[-n:]
        for end in range(len(tokens) - 1, n - 1, -1):  # end: position after an earlier occurrence
            if tokens[end - n : end] == gram:
                return tokens[end : end + k]
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=60), st.integers(1, 8), st.integers(1, 6))
def test_the_incremental_index_proposes_what_a_scan_finds(tokens: list[int], k: int, split: int) -> None:
    drafter = NgramDrafter()
    for start in range(0, len(tokens), split):  # grown in pieces, as prompt then tokens
        drafter.extend(tokens[start : start + split])
        assert drafter.propose(k) == scan_proposal(tokens[: start + split], k)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown speculation method"):
        SpecConfig(method="eagle")
    with pytest.raises(ValueError, match="max_draft"):
        SpecConfig(max_draft=0)
    with pytest.raises(ValueError, match="n-gram lengths"):
        NgramDrafter(min_n=3, max_n=2)


def test_the_draft_length_adapts() -> None:
    length = DraftLength(SpecConfig(max_draft=8))
    length.update(drafted=8, accepted=2)
    assert length.k == 3
    length.update(drafted=3, accepted=3)
    assert length.k == 6
    length.update(drafted=6, accepted=6)
    assert length.k == 8
    fixed = DraftLength(SpecConfig(max_draft=5, adaptive=False))
    fixed.update(drafted=5, accepted=0)
    assert fixed.k == 5


def run(model: LoadedModel, prompt: list[int], params: SamplingParams, spec: SpecConfig | None, n: int):
    stats = SpecStats()
    out = [
        (g.token_id, g.text, g.finish_reason)
        for g in generate(model, prompt, params, StopRule(max_tokens=n), n_ctx=512, spec=spec, spec_stats=stats)
    ]
    return out, stats


@pytest.fixture(scope="module", params=ARCHES)
def fixture_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    arch = request.param
    return load_model(make_models.write_model(tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch, qtype="q8_0"))


def assert_same_tokens(model: LoadedModel, params: SamplingParams, n: int = 48) -> SpecStats:
    prompt = model.tokenizer.encode(COPY)
    plain, _ = run(model, prompt, params, None, n)
    total = SpecStats()
    # unigram lookup too: random-weight fixtures rarely repeat two tokens, and every draft checks
    for spec in (SpecConfig(max_draft=4), SpecConfig(max_draft=3, adaptive=False, ngram_min=1)):
        got, stats = run(model, prompt, params, spec, n)
        assert got == plain, spec
        total.drafts += stats.drafts
        total.drafted += stats.drafted
        total.accepted += stats.accepted
    return total


def test_greedy_output_is_the_plain_output(fixture_model: LoadedModel) -> None:
    stats = assert_same_tokens(fixture_model, SamplingParams())
    assert stats.drafts > 0  # speculation ran, the comparison means something


def test_seeded_sampling_is_the_plain_sampling(fixture_model: LoadedModel) -> None:
    assert_same_tokens(fixture_model, SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=11))


def test_rejected_drafts_roll_back_recurrent_memory(tmp_path: Path) -> None:
    """A hybrid model whose greedy text loops: drafts are accepted in part, so the rollback (restore
    and replay) runs, and the tokens stay the plain ones."""
    model = load_model(make_models.write_model(tmp_path / "qwen35.gguf", "qwen35", qtype="q8_0"))
    stats = assert_same_tokens(model, SamplingParams(), n=96)
    assert stats.drafted > stats.accepted


def test_the_default_model_copies_faster_in_forwards(gemma_model: LoadedModel) -> None:
    """Gemma 3 270M copies the code it was shown: most drafts are accepted, and the output is the
    plain greedy output."""
    stats = assert_same_tokens(gemma_model, SamplingParams(), n=40)
    assert stats.accepted >= stats.drafted // 2, stats
    assert np.isfinite(stats.accepted)
