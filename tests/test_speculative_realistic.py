"""Speculative decoding on the realistic qwen35 (Qwen3.5-0.8B shape, random weights, Q4_K_M: 18
gated delta net and 6 attention layers, a 248k vocabulary), in process and in the engine with four
tasks at once and the prompt cache on: greedy and seeded output equal plain decoding with n-gram
drafts, with the target as its own draft model (its drafts are the target's greedy continuation:
accepted) and with a small random draft model of the same vocabulary (rejected: rollbacks).

The model file is made by tests/fixtures/make_models.py `realistic_qwen35` (about 80 s, 524 MB)
at ~/.cache/hyserve/models/realistic_qwen35_q4km.gguf; these tests skip where it was not made."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures import make_models
from test_engine_speculative import SEEDED, engine_of, reference, speculated, submit

from hyserve.engine.draft_model import load_draft_model
from hyserve.engine.generator import SpecConfig, SpecStats, StopRule, generate
from hyserve.engine.sampling import SamplingParams
from hyserve.model.loader import LoadedModel, load_model

__all__ = ["engine_of"]  # the engine fixture, shared with the engine tests

REALISTIC = Path.home() / ".cache/hyserve/models/realistic_qwen35_q4km.gguf"
TEXTS = [
    "The river town of Alder Bend grew around a ferry crossing in the eighteenth century.",
    "def parse(line):\n    key, value = line.split('=', 1)\n    return key.strip(), value.strip()\n",
    "A stone bridge replaced the ferry in 1851, and the mills turned wool into cloth.",
    "Today the town is known for its autumn market and its restored mill museum.",
]


@pytest.fixture(scope="module")
def realistic() -> LoadedModel:
    if not REALISTIC.exists():
        pytest.skip(f"{REALISTIC} not made (tests/fixtures/make_models.py realistic_qwen35)")
    return load_model(REALISTIC)


@pytest.fixture(scope="module")
def drafts(realistic: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, SpecConfig]:
    small = make_models.realistic_qwen35_draft(tmp_path_factory.mktemp("draft") / "draft.gguf")
    return {
        "ngram": SpecConfig(max_draft=4, adaptive=False, ngram_min=1),
        "self": SpecConfig(method="draft", max_draft=4, draft=realistic.arch),
        "random": SpecConfig(
            method="draft", max_draft=4, draft=load_draft_model(small, realistic.arch, realistic.tokenizer)
        ),
    }


@pytest.mark.parametrize("params", [SamplingParams(), SEEDED], ids=["greedy", "seeded"])
def test_in_process_output_is_the_plain_output(realistic: LoadedModel, drafts, params) -> None:
    prompt = realistic.tokenizer.encode(TEXTS[0])
    stop = StopRule(max_tokens=24, ignore_eos=True)
    plain = [g.token_id for g in generate(realistic, prompt, params, stop, n_ctx=1024)]
    for name, spec in drafts.items():
        stats = SpecStats()
        got = [g.token_id for g in generate(realistic, prompt, params, stop, n_ctx=1024, spec=spec, spec_stats=stats)]
        assert got == plain, name
        if name != "ngram":
            assert stats.drafts > 0, name
        if name == "self" and params.temperature == 0:
            assert stats.accepted >= stats.drafted - 4, stats


@pytest.mark.parametrize("params", [SamplingParams(), SEEDED], ids=["greedy", "seeded"])
def test_four_tasks_at_once_give_the_plain_output(realistic: LoadedModel, drafts, engine_of, params) -> None:
    stop = StopRule(max_tokens=16, ignore_eos=True)
    prompts = [realistic.tokenizer.encode(text) for text in TEXTS]
    want = [reference(realistic, p, params, stop) for p in prompts]
    for name in ("self", "random"):
        engine = engine_of(realistic, drafts[name], n_slots=4)  # the prompt cache on
        sinks = [submit(engine, f"{name}{i}", p, params, stop) for i, p in enumerate(prompts)]
        assert [s.tokens for s in sinks if s.finished] == want, name
        # a second turn resumes from the cache, the slot's draft memory keeps the shared prefix
        follow = prompts[0] + want[0] + realistic.tokenizer.encode(TEXTS[1])
        again = submit(engine, f"{name}-again", follow, params, stop)
        assert again.finished and again.tokens == reference(realistic, follow, params, stop), name
        assert again.accepted.reused_tokens >= len(prompts[0]) + len(want[0]) - 1
        speculated(engine, accepted=name == "self" and params.temperature == 0)
