"""Mixture-of-experts hybrids on tiny fixtures: `qwen35moe` (Qwen3.5 MoE) and `qwen3next`
(Qwen3-Next: grouped V heads, fused ssm_ba, optionally the legacy fused ssm_in). llama.cpp oracle
on prompts of 1, 7 and 300+ tokens (whole and in uneven chunks), exact snapshot/restore of the
recurrent state, batch invariance across sequences, and cancel leaving memory intact."""

from __future__ import annotations

from pathlib import Path

import hyserve_kernels as hk
import numpy as np
import pytest

from hyserve.model.architectures.base import ForwardCancelled, Logits, Segment
from hyserve.model.loader import LoadedModel, load_model
from llama_oracle import LlamaOracle, kl_per_position

make_models = pytest.importorskip("fixtures.make_models")
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
STATE_CASES = [("qwen35moe", "q8_0", {}), ("qwen3next", "f32", {"legacy_ssm_in": True})]


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
            top1 = (ref.argmax(-1) == ours.argmax(-1)).mean()
            assert kl.mean() <= 1e-3 and top1 >= 0.99, (len(tokens), kl.mean(), top1)
            if (arch, qtype) in BIT_EXACT:
                np.testing.assert_array_equal(ours, ref)
        np.testing.assert_array_equal(in_chunks(model, long, [3, 1, 50, 7, len(long) - 61]), whole)
    finally:
        oracle.close()


@pytest.fixture(scope="module", params=STATE_CASES, ids=[f"{a}-{q}" for a, q, _ in STATE_CASES])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    arch, qtype, kw = request.param
    return build(tmp_path_factory, arch, qtype, kw)[1]


def test_single_tokens_are_bit_identical(model: LoadedModel) -> None:
    tokens = model.tokenizer.encode(TEXT)[:40]
    memory = model.arch.new_memory(1024)
    np.testing.assert_array_equal(np.concatenate([run(model, memory, [t]) for t in tokens]), fresh(model, tokens))


def test_snapshot_restore_is_exact(model: LoadedModel) -> None:
    """Evaluate A, snapshot after n tokens, continue with B, restore, continue with C:
    the logits equal a fresh evaluation of A[:n] + C, bit for bit."""
    a = model.tokenizer.encode("The first part of a conversation that we keep.")
    b = model.tokenizer.encode(" A branch that will be thrown away later on.")
    c = model.tokenizer.encode(" And the real continuation.")
    memory = model.arch.new_memory(1024)
    run(model, memory, a, Logits.NONE)
    snap = memory.snapshot()
    assert snap.n_tokens == len(a) and snap.nbytes > 0
    run(model, memory, b, Logits.NONE)
    memory.restore(snap)
    assert memory.n_tokens == len(a)
    np.testing.assert_array_equal(run(model, memory, c), fresh(model, a + c)[len(a) :])


def test_sequences_in_one_batch_equal_separate_runs(model: LoadedModel) -> None:
    texts = ["one sequence about trees", "a different one, about the sea and boats", "x"]
    seqs = [model.tokenizer.encode(t) for t in texts]
    memories = [model.arch.new_memory(256) for _ in seqs]
    run(model, memories[0], seqs[0][:3], Logits.NONE)  # one sequence already under way
    parts = [seqs[0][3:], seqs[1], seqs[2]]
    both = model.arch.forward([Segment(m, np.asarray(p, np.int32), Logits.ALL) for m, p in zip(memories, parts)])
    np.testing.assert_array_equal(both[0], fresh(model, seqs[0])[3:])
    np.testing.assert_array_equal(both[1], fresh(model, seqs[1]))
    np.testing.assert_array_equal(both[2], fresh(model, seqs[2]))


def test_cancel_leaves_memory_untouched(model: LoadedModel) -> None:
    tokens = model.tokenizer.encode("cancel me in the middle of a forward call please")
    memory, flag = model.arch.new_memory(256), hk.CancelFlag()
    run(model, memory, tokens[:4], Logits.NONE)
    before = memory.snapshot()
    flag.set()
    with pytest.raises(ForwardCancelled):
        model.arch.forward([Segment(memory, np.asarray(tokens[4:], np.int32), Logits.ALL)], cancel=flag)
    after = memory.snapshot()
    assert after.n_tokens == before.n_tokens
    for il, (conv, ssm) in before.states.items():
        np.testing.assert_array_equal(after.states[il][0], conv)
        np.testing.assert_array_equal(after.states[il][1], ssm)
    np.testing.assert_array_equal(run(model, memory, tokens[4:]), fresh(model, tokens)[4:])
