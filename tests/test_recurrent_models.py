"""Recurrent architectures on tiny fixtures: the Qwen3.5 hybrid (`qwen35`: Gated DeltaNet + gated
attention) and Mamba2 (`mamba2`) against the llama.cpp oracle; then the sequence-memory tests for
every fixture architecture (also the MoE hybrids `qwen35moe`, `qwen3next` and the plain
transformers `llama`, `qwen3`, whose oracle cases live in their own files): batch invariance, exact
snapshot/restore, and cancel leaving memory intact."""

from __future__ import annotations

import hyserve_kernels as hk
import numpy as np
import pytest
from fixtures import make_models

from hyserve.model.architectures.base import ForwardCancelled, Logits, Segment
from hyserve.model.loader import load_model
from llama_oracle import LlamaOracle, kl_per_position, top1_agreement

TEXT = "def main():\n    print('hello world')\n    return 0\n# The quick brown fox jumps over the lazy dog.\n" * 12


CASES = [("qwen35", "f32"), ("qwen35", "q8_0"), ("mamba2", "f32"), ("mamba2", "q8_0")]
STATE_CASES = [(a, q, {}) for a, q in CASES] + [
    ("qwen35moe", "q8_0", {}),
    ("qwen3next", "f32", {"legacy_ssm_in": True}),
    ("llama", "q8_0", {}),  # attention only: the snapshot is empty, restore truncates the KV cache
    ("qwen3", "f32", {}),
]


def build(tmp_path_factory: pytest.TempPathFactory, arch: str, qtype: str, kw: dict):
    path = make_models.write_model(tmp_path_factory.mktemp(arch) / f"{arch}-{qtype}.gguf", arch, qtype=qtype, **kw)
    return path, load_model(path)


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{q}" for a, q in CASES])
def fixture(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    arch, qtype = request.param
    return build(tmp_path_factory, arch, qtype, {})


@pytest.fixture(scope="module", params=STATE_CASES, ids=[f"{a}-{q}" for a, q, _ in STATE_CASES])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    arch, qtype, kw = request.param
    return build(tmp_path_factory, arch, qtype, kw)[1]


def run(model, memory, tokens, logits: Logits = Logits.ALL) -> np.ndarray:
    return model.arch.forward([Segment(memory, np.asarray(tokens, np.int32), logits)])[0]


def fresh(model, tokens: list[int]) -> np.ndarray:
    return run(model, model.arch.new_memory(1024), tokens)


def test_matches_llama_cpp(fixture) -> None:
    path, model = fixture
    oracle = LlamaOracle(path)
    try:
        long = model.tokenizer.encode(TEXT)
        assert len(long) > 300
        for tokens in (long[:1], long[:7], long):
            ours, ref = fresh(model, tokens), oracle.logits(tokens)
            kl = kl_per_position(ref, ours)
            top1 = top1_agreement(ref, ours)
            assert kl.mean() <= 1e-3 and top1 >= 0.99, (len(tokens), kl.mean(), top1)
            if path.name == "mamba2-q8_0.gguf":
                np.testing.assert_array_equal(ours, ref)  # every op on this path matches ggml bit for bit
    finally:
        oracle.close()


def test_chunks_and_single_tokens_are_bit_identical(model) -> None:
    tokens = model.tokenizer.encode(TEXT)[:90]
    whole = fresh(model, tokens)
    memory = model.arch.new_memory(1024)
    parts = [run(model, memory, tokens[a:b]) for a, b in [(0, 5), (5, 6), (6, 40), (40, 90)]]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    memory = model.arch.new_memory(1024)
    np.testing.assert_array_equal(np.concatenate([run(model, memory, [t]) for t in tokens]), whole)


def test_snapshot_restore_is_exact(model) -> None:
    """Evaluate A, snapshot after n tokens, continue with B, restore, continue with C:
    the logits equal a fresh evaluation of A[:n] + C, bit for bit."""
    a = model.tokenizer.encode("The first part of a conversation that we keep.")
    b = model.tokenizer.encode(" A branch that will be thrown away later on.")
    c = model.tokenizer.encode(" And the real continuation.")
    memory = model.arch.new_memory(1024)
    run(model, memory, a, Logits.NONE)
    snap = memory.snapshot()
    assert snap.n_tokens == len(a) and (snap.nbytes > 0) == bool(memory.recurrent)
    run(model, memory, b, Logits.NONE)
    memory.restore(snap)
    assert memory.n_tokens == len(a)
    np.testing.assert_array_equal(run(model, memory, c), fresh(model, a + c)[len(a) :])
    if memory.recurrent:  # a recurrent state cannot go back without a snapshot
        with pytest.raises(ValueError, match="snapshot"):
            memory.truncate(len(a) - 1)


def test_sequences_in_one_batch_equal_separate_runs(model) -> None:
    texts = ["one sequence about trees", "a different one, about the sea and boats", "x"]
    seqs = [model.tokenizer.encode(t) for t in texts]
    memories = [model.arch.new_memory(256) for _ in seqs]
    run(model, memories[0], seqs[0][:3], Logits.NONE)  # one sequence already under way
    parts = [seqs[0][3:], seqs[1], seqs[2]]
    out = model.arch.forward([Segment(m, np.asarray(p, np.int32), Logits.ALL) for m, p in zip(memories, parts)])
    np.testing.assert_array_equal(out[0], fresh(model, seqs[0])[3:])
    np.testing.assert_array_equal(out[1], fresh(model, seqs[1]))
    np.testing.assert_array_equal(out[2], fresh(model, seqs[2]))


def test_cancel_leaves_memory_untouched(model) -> None:
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


EXPECTED_KINDS = {
    "qwen35": "MEMORY_KIND_HYBRID",
    "qwen35moe": "MEMORY_KIND_HYBRID",
    "qwen3next": "MEMORY_KIND_HYBRID",
    "mamba2": "MEMORY_KIND_RECURRENT",
    "llama": "MEMORY_KIND_ATTENTION_ONLY",
    "qwen3": "MEMORY_KIND_ATTENTION_ONLY",
}


def test_model_info_memory_kind(model) -> None:
    """ModelInfo.memory_kind names the memory each architecture keeps (qwen35 once said attention-only)."""
    from hyserve.api.gen import hyserve_pb2 as pb
    from hyserve.api.servicer import memory_kind

    assert pb.MemoryKind.Name(memory_kind(model.arch)) == EXPECTED_KINDS[model.arch.name]


def test_model_info_memory_kind_of_gemma3(gemma_model) -> None:
    from hyserve.api.gen import hyserve_pb2 as pb
    from hyserve.api.servicer import memory_kind

    assert memory_kind(gemma_model.arch) == pb.MEMORY_KIND_SLIDING_WINDOW
