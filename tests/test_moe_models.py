"""Mixture-of-experts hybrids on tiny fixtures: `qwen35moe` (Qwen3.5 MoE) and `qwen3next`
(Qwen3-Next: grouped V heads, fused ssm_ba, optionally the legacy fused ssm_in). llama.cpp oracle
on prompts of 1, 7 and 300+ tokens (whole and in uneven chunks). Their state tests (snapshot/restore,
batch invariance, cancel) run with the other recurrent models in test_recurrent_models.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models

from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.loader import LoadedModel, load_model
from llama_oracle import LlamaOracle, kl_per_position, top1_agreement

TEXT = "def main():\n    print('hello world')\n    return 0\n# The quick brown fox jumps over the lazy dog.\n" * 12
KQUANT = {"embd": 256, "ff": 512, "head_dim": 64, "expert_ff": 256, "shared_ff": 256}

ORACLE_CASES = [
    ("qwen35moe", "f32", {}),
    ("qwen35moe", "q8_0", {}),
    # more than 16 experts: ggml's argsort (std::sort) is an introsort there, not an insertion sort
    ("qwen35moe", "f16", {"fused_gate_up": True, "n_expert": 20, "n_expert_used": 4}),
    ("qwen35moe", "q6_k", KQUANT),
    ("qwen35moe", "q4_k_m", KQUANT),
    ("qwen3next", "f32", {}),
    ("qwen3next", "q8_0", {}),
    ("qwen3next", "f16", {"legacy_ssm_in": True}),
    ("qwen3next", "q4_k_m", KQUANT),
]
# q8_0: every op on these paths matches ggml's, so the logits equal llama.cpp's bit for bit
BIT_EXACT = {("qwen35moe", "q8_0"), ("qwen3next", "q8_0")}


def build(tmp_path_factory: pytest.TempPathFactory, arch: str, qtype: str, kw: dict) -> tuple[Path, LoadedModel]:
    path = make_models.write_model(tmp_path_factory.mktemp(arch) / f"{arch}-{qtype}.gguf", arch, qtype=qtype, **kw)
    return path, load_model(path)


def run(model: LoadedModel, memory, tokens, logits: Logits = Logits.ALL) -> np.ndarray:
    return model.arch.forward([Segment(memory, np.asarray(tokens, np.int32), logits)])[0]


def fresh(model: LoadedModel, tokens: list[int]) -> np.ndarray:
    return run(model, model.arch.new_memory(1024), tokens)


def in_chunks(model: LoadedModel, tokens: list[int], sizes: list[int]) -> np.ndarray:
    memory, out, at = model.arch.new_memory(1024), [], 0
    for size in sizes:
        out.append(run(model, memory, tokens[at : at + size]))
        at += size
    return np.concatenate(out)


@pytest.mark.parametrize(("arch", "qtype", "kw"), ORACLE_CASES, ids=[f"{a}-{q}" for a, q, _ in ORACLE_CASES])
def test_matches_llama_cpp(arch: str, qtype: str, kw: dict, tmp_path_factory: pytest.TempPathFactory) -> None:
    path, model = build(tmp_path_factory, arch, qtype, kw)
    assert model.arch.name == arch
    oracle = LlamaOracle(path)
    try:
        long = model.tokenizer.encode(TEXT)
        assert len(long) > 300
        whole = fresh(model, long)
        for tokens, ours in (
            (long[:1], fresh(model, long[:1])),
            (long[:7], in_chunks(model, long[:7], [2, 5])),
            (long, whole),
        ):
            ref = oracle.logits(tokens)
            kl = kl_per_position(ref, ours)
            top1 = top1_agreement(ref, ours)
            assert kl.mean() <= 1e-3 and top1 >= 0.99, (len(tokens), kl.mean(), top1)
            if (arch, qtype) in BIT_EXACT:
                np.testing.assert_array_equal(ours, ref)
        np.testing.assert_array_equal(in_chunks(model, long, [3, 1, 50, 7, len(long) - 61]), whole)
    finally:
        oracle.close()
