"""The recurrent and hybrid architectures (qwen35, qwen35moe, qwen3next, mamba2) end to end on the GPU against the CPU
path: teacher-forced logits, determinism, batch and chunking invariance, recurrent states that
live on the device (checkpoints as device copies, the prefix store's host images, replays of kept
inputs), and cancels that leave memory as it was, in fast numerics (the default). The same
`Architecture` code runs on both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models
from test_gpu_models import (
    TEXT,
    assert_cancel_leaves_memory_unchanged,
    assert_close_to_cpu,
    assert_deterministic_and_batch_invariant,
    fresh,
    noise_tie,
    run,
)

from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.loader import ARCHITECTURES, load_model

# small shapes: lavapipe runs every case in CI
CASES = [
    ("qwen35", "f32", {}),
    ("qwen35", "q8_0", {}),
    ("qwen35", "f16", {"ssm_d_state": 40, "ssm_dt_rank": 4, "ssm_n_group": 2}),
    # qwen3next's grouped V heads and fused / legacy projections, with dense and MoE FFN blocks
    ("qwen3next", "f32", {"dense_ffn": True}),
    ("qwen3next", "q8_0", {}),
    ("qwen35moe", "q8_0", {}),
    ("qwen3next", "q8_0", {"dense_ffn": True, "legacy_ssm_in": True}),
    ("mamba2", "f32", {}),
    ("mamba2", "q8_0", {"ssm_n_group": 2, "ssm_d_state": 40}),
]


class Pair:
    def __init__(self, path: Path, gpu_backend) -> None:
        self.cpu = load_model(path)
        self.gpu_arch = ARCHITECTURES[self.cpu.gguf.architecture](GGUFFile.open(path), gpu_backend)
        self.tokenizer = self.cpu.tokenizer


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{q}-{i}" for i, (a, q, _) in enumerate(CASES)])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, gpu_fast_backend) -> Pair:
    """In fast numerics, the default (as test_gpu_models)."""
    arch, qtype, kw = request.param
    path = make_models.write_model(tmp_path_factory.mktemp(arch) / f"{arch}-{qtype}.gguf", arch, qtype=qtype, **kw)
    return Pair(path, gpu_fast_backend)


def test_hybrid_gpu_logits_match_the_cpu_path(pair: Pair) -> None:
    tokens = pair.tokenizer.encode(TEXT)
    tie = noise_tie(pair.cpu, tokens)
    for n in (1, 7, len(tokens)):
        assert_close_to_cpu(fresh(pair.cpu.arch, tokens[:n]), fresh(pair.gpu_arch, tokens[:n]), tie)


def test_hybrid_gpu_results_are_deterministic_and_batch_invariant(pair: Pair) -> None:
    assert_deterministic_and_batch_invariant(pair.gpu_arch, pair.tokenizer, 30, 256)


def test_hybrid_gpu_states_restore_exactly(pair: Pair) -> None:
    """A checkpoint (device copies) restored, and the prefix store's host image loaded into another
    memory, continue bit for bit like a fresh evaluation."""
    arch = pair.gpu_arch
    a = pair.tokenizer.encode("The first part of a conversation that we keep.")
    b = pair.tokenizer.encode(" A branch that will be thrown away later on.")
    c = pair.tokenizer.encode(" And the real continuation.")
    expected = fresh(arch, a + c)[len(a) :]
    memory = arch.new_memory(256)
    assert memory.device_bytes > 0 and all(st.on_device for st in memory.recurrent.values())
    run(arch, memory, a, Logits.NONE)
    snap = memory.snapshot()
    assert all(not isinstance(t, np.ndarray) for pair_ in snap.states.values() for t in pair_)  # on the device
    image = memory.export()
    assert all(isinstance(t, np.ndarray) for pair_ in image.live.states.values() for t in pair_)  # host copies
    run(arch, memory, b, Logits.NONE)
    memory.restore(snap)
    np.testing.assert_array_equal(run(arch, memory, c), expected)
    other = arch.new_memory(256)
    other.load(image, len(a))
    np.testing.assert_array_equal(run(arch, other, c), expected)


def test_hybrid_gpu_replay_of_kept_inputs_is_exact(pair: Pair) -> None:
    arch = pair.gpu_arch
    tokens = pair.tokenizer.encode(TEXT)[:20]
    live = arch.new_memory(256)
    kept: list[dict] = []
    for lo, hi in [(0, 6), (6, 13)]:
        kept.append({})
        arch.forward([Segment(live, np.asarray(tokens[lo:hi], np.int32), Logits.NONE, kept[-1])])
    replayed = arch.new_memory(256)
    if replayed.has_attention:  # attention entries come from the prefix (as the engine loads them)
        replayed.load_entries(live.export(), 0, 13)
    arch.replay(replayed, kept)
    assert replayed.n_tokens == 13
    np.testing.assert_array_equal(run(arch, replayed, tokens[13:]), run(arch, live, tokens[13:]))


def test_hybrid_gpu_cancel_leaves_memory_unchanged(pair: Pair) -> None:
    assert_cancel_leaves_memory_unchanged(pair.gpu_arch, pair.tokenizer, 20, 256)


def test_hybrid_gpu_decode_step_is_one_submission(pair: Pair) -> None:
    """A decode step that keeps its recurrent inputs (as the server's do) reads them back with its
    logits: one submission and one wait per step, not a round trip per layer."""
    arch = pair.gpu_arch
    device = arch.ops.device
    tokens = pair.tokenizer.encode(TEXT)[:12]
    memory = arch.new_memory(64)
    run(arch, memory, tokens[:8], Logits.NONE)
    for t in tokens[8:]:
        kept: dict = {}
        before = device.submissions
        logits = arch.forward([Segment(memory, np.asarray([t], np.int32), Logits.LAST, kept)])[0]
        assert device.submissions - before == 1
        assert logits is not None and logits.shape == (arch.output.rows,)
        assert sorted(kept) == sorted(memory.recurrent)
        assert all(isinstance(a, np.ndarray) and len(a) == 1 for parts in kept.values() for a in parts)
