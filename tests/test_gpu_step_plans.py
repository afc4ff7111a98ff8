"""Captured decode steps on the GPU (`architectures/step_plans.py`): a decode step's forward is
captured once and replayed in one call. A replay gives the same bits as recording the step op by
op (logits and kept recurrent inputs), on every architecture, alone and batched; it makes no
Python backend call and one submission; and the memories it advances stay exact under
checkpoints, host images and replays of kept inputs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models
from gpu_passes import passes_while

from hyserve.model.architectures.base import Architecture, Logits, Segment
from hyserve.model.architectures.ffn import DenseFfn
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.loader import ARCHITECTURES

CASES = [
    ("llama", "q8_0"),
    ("qwen3", "f16"),
    ("qwen35", "q8_0"),
    ("qwen35moe", "q8_0"),
    ("qwen3next", "q8_0"),
    ("mamba2", "f32"),
]
PROMPT = [5, 17, 42, 99, 7, 250, 3]


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{q}" for a, q in CASES])
def arch(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, gpu_fast_backend) -> Architecture:
    name, qtype = request.param
    path: Path = make_models.write_model(tmp_path_factory.mktemp(name) / f"{name}.gguf", name, qtype=qtype)
    return ARCHITECTURES[name](GGUFFile.open(path), gpu_fast_backend)


@contextmanager
def replaying(arch: Architecture, on: bool) -> Iterator[None]:
    ops = arch.ops
    before = ops.replay_steps
    ops.replay_steps = on
    try:
        yield
    finally:
        ops.replay_steps = before


def greedy(arch: Architecture, prompts: list[list[int]], steps: int, keep: bool = True) -> list[list[tuple]]:
    """Greedy decode of every prompt in one batch per step: per prompt, per step (token, logits,
    kept inputs)."""
    memories = [arch.new_memory(64) for _ in prompts]
    logits = arch.forward([Segment(m, np.asarray(p, np.int32), Logits.LAST) for m, p in zip(memories, prompts)])
    out: list[list[tuple]] = [[] for _ in prompts]
    for _ in range(steps):
        tokens = [int(np.argmax(row)) for row in logits]
        segments = [
            Segment(m, np.asarray([t], np.int32), Logits.LAST, {} if keep else None) for m, t in zip(memories, tokens)
        ]
        logits = arch.forward(segments)
        for i, seg in enumerate(segments):
            out[i].append((tokens[i], logits[i], seg.inputs))
    return out


def assert_same(a: list[list[tuple]], b: list[list[tuple]]) -> None:
    for run_a, run_b in zip(a, b, strict=True):
        for (ta, la, ka), (tb, lb, kb) in zip(run_a, run_b, strict=True):
            assert ta == tb
            np.testing.assert_array_equal(la, lb)
            assert (ka is None) == (kb is None)
            if ka is not None:
                assert ka.keys() == kb.keys()
                for il in ka:
                    for x, y in zip(ka[il], kb[il], strict=True):
                        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("batch", [1, 3])
def test_replayed_steps_give_the_bits_of_steps_recorded_op_by_op(arch: Architecture, batch: int) -> None:
    prompts = [PROMPT[: 4 + i] for i in range(batch)]
    plans = arch.step_plans
    assert plans is not None
    with replaying(arch, False):
        recorded = greedy(arch, prompts, 6)
    before = plans.replays
    with replaying(arch, True):
        replayed = greedy(arch, prompts, 6)
    assert plans.replays - before == 4  # captured at the second step, replayed from the third
    assert_same(recorded, replayed)


def test_a_replayed_step_makes_no_backend_call_and_one_submission(
    arch: Architecture, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops, device = arch.ops, arch.ops.device
    memory = arch.new_memory(64)
    arch.forward([Segment(memory, np.asarray(PROMPT, np.int32), Logits.NONE)])
    calls: list[str] = []

    def step(token: int) -> None:
        arch.forward([Segment(memory, np.asarray([token], np.int32), Logits.LAST, {})])

    step(1)
    step(2)  # captured
    for name in dir(type(ops)):
        method = getattr(ops, name)
        if not name.startswith("_") and callable(method):
            monkeypatch.setattr(ops, name, lambda *a, _m=method, _n=name, **k: calls.append(_n) or _m(*a, **k))
    before, replays = device.submissions, arch.step_plans.replays
    step(3)
    assert arch.step_plans.replays == replays + 1
    assert calls == []
    assert device.submissions - before == 1


def test_memories_a_replay_advances_stay_exact(arch: Architecture) -> None:
    """Checkpoints (device copies), the prefix store's host image and a replay of kept inputs
    continue a replayed memory bit for bit as op-by-op steps do."""

    def run(replay: bool) -> list[np.ndarray]:
        with replaying(arch, replay):
            memory = arch.new_memory(64)
            arch.forward([Segment(memory, np.asarray(PROMPT, np.int32), Logits.NONE)])
            kept: list[dict] = []
            out = []
            for t in (11, 12, 13, 14):
                kept.append({})
                out.append(arch.forward([Segment(memory, np.asarray([t], np.int32), Logits.LAST, kept[-1])])[0])
            snap = memory.snapshot()
            image = memory.export()
            out.append(arch.forward([Segment(memory, np.asarray([15], np.int32), Logits.LAST, {})])[0])
            memory.restore(snap)
            out.append(arch.forward([Segment(memory, np.asarray([16], np.int32), Logits.LAST, {})])[0])
            other = arch.new_memory(64)
            other.load(image, memory.n_tokens - 1)
            out.append(arch.forward([Segment(other, np.asarray([16], np.int32), Logits.LAST, {})])[0])
            if memory.recurrent:
                third = arch.new_memory(64)
                arch.forward([Segment(third, np.asarray(PROMPT, np.int32), Logits.NONE)])
                if third.has_attention:
                    third.load_entries(memory.export(), 0, len(PROMPT) + len(kept))
                arch.replay(third, kept)
                out.append(arch.forward([Segment(third, np.asarray([16], np.int32), Logits.LAST, {})])[0])
            return out

    for a, b in zip(run(False), run(True), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_captured_step_copies_only_the_new_recurrent_states(arch: Architecture) -> None:
    """Everything else a decode step moves is a compute dispatch (a copy ends the compute pass):
    each recurrent layer's new conv and SSM states are copied into the memory's own buffers
    (the Mamba2 scan's per-head constants are packed once per layer, not in every step)."""
    memory = arch.new_memory(64)
    arch.forward([Segment(memory, np.asarray(PROMPT, np.int32), Logits.NONE)])
    for token in (1, 2):  # the second is captured
        arch.forward([Segment(memory, np.asarray([token], np.int32), Logits.ARGMAX, {})])
    plan = arch.step_plans.last_plan
    assert plan is not None and plan.copies == 2 * len(memory.recurrent)


@pytest.mark.parametrize("name", ["llama", "qwen35", "qwen35moe", "mamba2"])
def test_a_fast_step_quantizes_activations_in_the_passes_that_make_them(
    name: str, tmp_path: Path, gpu_fast_backend
) -> None:
    """With Q8_0 weights, every matmul input made by a norm or a gated unit is quantized in that
    unit's own pass (the architectures pass `feeds`): a decode step's only separate Q8
    quantizations are those of each layer's mixer output (attention's wo, the delta net's w_out),
    whose input comes from attention or a scan (MoE experts quantize their own; Mamba2's gated
    norm quantizes its w_out input, its group being the whole row here)."""
    path = make_models.write_model(tmp_path / f"{name}.gguf", name, qtype="q8_0")
    arch = ARCHITECTURES[name](GGUFFile.open(path), gpu_fast_backend)
    memory = arch.new_memory(64)
    arch.forward([Segment(memory, np.asarray(PROMPT, np.int32), Logits.NONE)])
    step = [Segment(memory, np.asarray([3], np.int32), Logits.LAST)]
    with replaying(arch, False):
        passes = passes_while(arch.ops.device, lambda: arch.forward(step))
    # llama's layers hold their FFN matrices themselves; the hybrids' are dense or MoE; Mamba2 has none
    dense_ffns = (
        len(arch.layers) if name == "llama" else sum(isinstance(getattr(L, "ffn", None), DenseFfn) for L in arch.layers)
    )
    gated_norms = len(arch.layers) if name == "mamba2" else 0
    assert passes.get("gated_rms_norm_quantize", 0) == gated_norms, passes
    assert passes.get("quantize_act_fast", 0) == len(arch.layers) - gated_norms, passes
    assert passes.get("gated_quantize", 0) == dense_ffns, passes
    fused_norms = passes.get("rms_norm_quantize", 0) + passes.get("add_rms_norm_quantize", 0)
    assert fused_norms == len(arch.layers) + 1 + dense_ffns, passes  # layer inputs, the output, FFN inputs
