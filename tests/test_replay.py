"""Replays of kept inputs (`Segment.inputs` + `Architecture.replay`): the state at any position
inside a run of recorded tokens, recomputed from a checkpoint (or the empty state) by the
recurrent kernels and ring writes alone, equals a fresh evaluation bit for bit, on the tiny
recurrent fixtures and on Gemma 3 270M with ring-buffer window layers."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures import make_models

from hyserve.engine.input_log import InputLog
from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.loader import load_model
from hyserve.model.memory import SequenceMemory

CASES = [("qwen35", "q8_0", {}), ("mamba2", "q8_0", {}), ("qwen3next", "f32", {"legacy_ssm_in": True})]
CHUNKS = [(0, 5), (5, 6), (6, 40), (40, 41), (41, 42), (42, 90)]  # prompt chunks and decode steps


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    arch, qtype, kw = request.param
    path = make_models.write_model(tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch, qtype=qtype, **kw)
    return load_model(path)


def record(arch, memory: SequenceMemory, tokens: np.ndarray, chunks, log: InputLog) -> None:
    for a, b in chunks:
        seg = Segment(memory, tokens[a:b], Logits.NONE, {})
        start = memory.n_tokens
        arch.forward([seg])
        log.record(start, seg.inputs, turn=1)


def states(memory: SequenceMemory) -> dict:
    snap = memory.snapshot()
    return {"n": snap.n_tokens, "rec": snap.states, "win": snap.windows}


def assert_same_state(a: SequenceMemory, b: SequenceMemory) -> None:
    sa, sb = states(a), states(b)
    assert sa["n"] == sb["n"]
    for il in sa["rec"]:
        for x, y in zip(sa["rec"][il], sb["rec"][il]):
            np.testing.assert_array_equal(x, y)
    for il in sa["win"]:
        assert sa["win"][il][0] == sb["win"][il][0]
        np.testing.assert_array_equal(sa["win"][il][1], sb["win"][il][1])
        np.testing.assert_array_equal(sa["win"][il][2], sb["win"][il][2])


def fresh(arch, tokens: np.ndarray, n_ctx: int = 1024, ring: bool = False) -> SequenceMemory:
    memory = arch.new_memory(n_ctx)
    if ring:
        memory.use_window_rings(arch.sliding_windows(), 128)
    for i in range(0, len(tokens), 128):
        arch.forward([Segment(memory, tokens[i : i + 128], Logits.NONE)])
    return memory


@pytest.mark.parametrize("base", [0, 6, 41])
def test_replay_from_a_checkpoint_reaches_every_position_exactly(model, base: int) -> None:
    arch = model.arch
    tokens = np.asarray(model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 12)[:90], np.int32)
    memory, log = arch.new_memory(1024), InputLog()
    record(arch, memory, tokens, [c for c in CHUNKS if c[1] <= base], log)
    snap = memory.snapshot()
    record(arch, memory, tokens, [c for c in CHUNKS if c[0] >= base], log)
    assert log.runs() == ((0, 90),)
    for target in (base + 1, 40, 77, 89):
        if target <= base:
            continue
        if base:
            memory.restore(snap)
        else:
            memory.truncate(0)
        arch.replay(memory, log.rows(base, target))
        expected = fresh(arch, tokens[:target])
        assert_same_state(memory, expected)
        # the next token's logits too (attention layers keep their entries: a prefix of the same tokens)
        nxt = tokens[target : target + 1]
        got = arch.forward([Segment(memory, nxt, Logits.LAST)])[0]
        want = arch.forward([Segment(expected, nxt, Logits.LAST)])[0]
        np.testing.assert_array_equal(got, want)
        # back to the end of the recorded tokens for the next target
        memory.truncate(0)
        arch.replay(memory, log.rows(0, 90))
        assert memory.n_tokens == 90


def test_the_log_trims_merges_and_reports_its_runs(model) -> None:
    arch = model.arch
    tokens = np.asarray(model.tokenizer.encode("one two three four five six seven eight nine ten " * 10)[:90], np.int32)
    memory, log = arch.new_memory(1024), InputLog()
    record(arch, memory, tokens, CHUNKS, log)
    sizes = [b.n for b in log]
    assert sizes == [42, 48]  # consecutive forwards share a block up to 64 tokens
    nbytes = log.nbytes
    log.drop_after(50)
    assert log.runs() == ((0, 50),) and log.nbytes < nbytes
    first = next(iter(log))
    log.remove(first)
    assert log.runs() == ((42, 50),)
    with pytest.raises(ValueError, match="not kept"):
        log.rows(0, 10)


def test_ring_window_replay_on_gemma(gemma_model) -> None:
    arch = gemma_model.arch
    tokens = np.random.default_rng(1).integers(100, 20000, size=900).astype(np.int32)
    memory = arch.new_memory(2048)
    memory.use_window_rings(arch.sliding_windows(), 128)
    log = InputLog()
    chunks = [(i, min(i + 128, 700)) for i in range(0, 700, 128)]
    record(arch, memory, tokens, chunks, log)
    snap = memory.snapshot()  # a window checkpoint at 700
    record(arch, memory, tokens, [(700, 828), (828, 900)], log)
    assert memory.live_floor > 710  # the ring alone no longer reaches 710
    for base, target in ((700, 710), (0, 650), (700, 899)):
        if base:
            memory.restore(snap)
        else:
            memory.truncate(0)
        arch.replay(memory, log.rows(base, target))
        expected = fresh(arch, tokens[:target], 2048, ring=True)
        assert_same_state(memory, expected)
        nxt = tokens[target : target + 1]
        got = arch.forward([Segment(memory, nxt, Logits.LAST)])[0]
        want = arch.forward([Segment(expected, nxt, Logits.LAST)])[0]
        np.testing.assert_array_equal(got, want)
        memory.truncate(0)
        arch.replay(memory, log.rows(0, 900))
