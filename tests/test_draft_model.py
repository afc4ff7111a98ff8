"""Speculative decoding with a draft model (`--spec draft`, engine/draft_model.py): the vocabulary
check at load, the draft memory kept in step with the sequence (its proposals equal a fresh draft
model's on the same tokens after any acceptance, so its rollback is exact on every architecture),
and the target's plain output, greedy and seeded, whatever the draft model says: the target itself
(drafts accepted) or another random model (drafts rejected, the rollback runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models

from hyserve.engine.draft_model import DraftModelDrafter, DraftVocabularyError, confident_token, load_draft_model
from hyserve.engine.generator import SpecConfig, SpecStats, StopRule, generate
from hyserve.engine.sampling import SamplingParams
from hyserve.model.architectures.base import Architecture
from hyserve.model.loader import LoadedModel, load_model

ARCHES = make_models.ARCHES
REPO = Path(__file__).resolve().parents[1]
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n" * 2
SEEDED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=11)


def write(tmp: Path, arch: str, **kw: object) -> Path:
    name = "-".join([arch, *(f"{k}{v}" for k, v in sorted(kw.items()))])
    return make_models.write_model(tmp / f"{name}.gguf", arch, qtype="q8_0", **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("draft")


@pytest.fixture(scope="module", params=ARCHES)
def target(request: pytest.FixtureRequest, models: Path) -> LoadedModel:
    return load_model(write(models, request.param))


def draft_of(target: LoadedModel, path: Path) -> Architecture:
    return load_draft_model(path, target.arch, target.tokenizer)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_draft_memory_follows_the_sequence_exactly(arch: str, models: Path) -> None:
    """After each verification (a random part of the draft accepted, then another token), the
    drafter proposes what a fresh draft model proposes on the same tokens: its memory was rolled
    back and advanced exactly (truncation, or restore and replay of the recurrent state)."""
    model = load_model(write(models, arch, seed=3, layers=2))
    rng = np.random.default_rng(0)
    drafter = DraftModelDrafter(model.arch, 256)
    sequence = [int(t) for t in rng.integers(10, 400, 12)]
    drafter.extend(sequence)
    rolled_back = 0
    for _ in range(14):
        draft = drafter.propose(int(rng.integers(1, 6)))
        fresh = DraftModelDrafter(model.arch, 256)
        fresh.extend(sequence)
        assert draft == fresh.propose(len(draft))
        kept = int(rng.integers(0, len(draft) + 1))
        rolled_back += kept < len(draft) - 1
        new = [*draft[:kept], int(rng.integers(10, 400))]
        sequence += new
        drafter.extend(new)
    assert rolled_back > 0
    drafter.start()  # a new sequence on the same memory: it keeps the shared prefix
    drafter.extend(sequence[:20])
    fresh = DraftModelDrafter(model.arch, 256)
    fresh.extend(sequence[:20])
    assert drafter.propose(4) == fresh.propose(4)


def run(model: LoadedModel, params: SamplingParams, spec: SpecConfig | None, n: int = 32):
    stats = SpecStats()
    prompt = model.tokenizer.encode(PROMPT)
    rule = StopRule(max_tokens=n, ignore_eos=True)
    out = [(g.token_id, g.text) for g in generate(model, prompt, params, rule, n_ctx=512, spec=spec, spec_stats=stats)]
    return out, stats


@pytest.mark.parametrize("params", [SamplingParams(), SEEDED], ids=["greedy", "seeded"])
def test_output_is_the_plain_output_whatever_the_draft_model(target: LoadedModel, models: Path, params) -> None:
    plain, _ = run(target, params, None)
    # the target as its own draft model agrees with it (greedy: always); a random qwen35 rarely
    for path, agrees in ((target.path, params.temperature == 0), (write(models, "qwen35", seed=7, layers=2), False)):
        spec = SpecConfig(method="draft", max_draft=4, draft=draft_of(target, path))
        got, stats = run(target, params, spec)
        assert got == plain, path
        assert stats.drafts > 0
        if agrees:
            assert stats.accepted >= stats.drafted - 4, stats  # only the last draft may be cut short
        else:
            assert stats.accepted < stats.drafted, stats  # rejections: both memories rolled back


def test_an_unsure_draft_model_drafts_less_and_changes_nothing(target: LoadedModel, models: Path) -> None:
    """`draft_p_min`: a draft ends before a token the draft model gives less probability; a random
    draft model is unsure of everything, so it drafts less, and the output stays the plain one."""
    assert confident_token(np.array([0.0, 0.0, 5.0]), 0.9) == (2, True)
    assert confident_token(np.array([0.0, 0.0, 5.0]), 0.999) == (2, False)
    assert confident_token(np.array([1.0, 3.0, 2.0]), 0.0) == (1, True)
    plain, _ = run(target, SamplingParams(), None)
    draft = draft_of(target, write(models, "qwen35", seed=7, layers=2))
    _, eager = run(target, SamplingParams(), SpecConfig(method="draft", max_draft=4, draft=draft))
    got, unsure = run(target, SamplingParams(), SpecConfig(method="draft", max_draft=4, draft=draft, draft_p_min=0.5))
    assert got == plain
    assert unsure.drafted < eager.drafted, (unsure, eager)


def test_a_draft_model_with_another_vocabulary_is_refused(models: Path) -> None:
    target = load_model(write(models, "llama"))
    with pytest.raises(DraftVocabularyError, match="600 tokens"):
        draft_of(target, write(models, "llama", vocab=600))


def test_the_draft_method_needs_its_model() -> None:
    with pytest.raises(ValueError, match="draft model"):
        SpecConfig(method="draft")
    with pytest.raises(ValueError, match="draft_p_min"):
        SpecConfig(draft_p_min=1.5)


def hyserve(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hyserve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ), cwd=REPO)


def test_the_command_line_runs_a_draft_model_and_names_a_wrong_one(models: Path) -> None:
    target = write(models, "qwen35")
    common = ["run", PROMPT, "--model", str(target), "--max-tokens", "12", "--threads", "1"]
    plain = hyserve(*common)
    drafted = hyserve(*common, "--spec", "draft", "--spec-draft-model", str(write(models, "llama", seed=5)))
    assert plain.returncode == 0 and drafted.returncode == 0, drafted.stderr
    assert drafted.stdout == plain.stdout and "drafted" in drafted.stderr
    for flags, needle in (
        (["--spec", "draft"], "--spec-draft-model"),
        (["--spec-draft-p-min", "2"], "--spec-draft-p-min"),
        (["--spec-draft-model", str(target)], "--spec draft"),
        (["--spec", "draft", "--spec-draft-model", str(models / "none.gguf")], "none.gguf"),
        (["--spec", "draft", "--spec-draft-model", str(write(models, "llama", vocab=600))], "vocabulary"),
    ):
        result = hyserve(*common, *flags)
        lines = [line for line in result.stderr.splitlines() if line.strip() and "[" not in line[:1]]
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert any(needle in line for line in lines), result.stderr
