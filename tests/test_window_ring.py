"""Sliding-window layers kept as ring buffers (`--swa-cache ring`) on Gemma 3 270M: the same logits
bit for bit as the full cache, window checkpoints that restore exactly, and truncation limited to
what the ring still holds."""

from __future__ import annotations

import numpy as np
import pytest

from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.memory import SequenceMemory

CHUNKS = [128, 57, 128, 1, 3, 128, 128, 100, 128, 128, 128, 128, 90]  # 1275 tokens: past 2 windows


def evaluate(arch, memory: SequenceMemory, tokens: np.ndarray) -> np.ndarray:
    """In chunks of at most 128 tokens (the forward size the rings are built for)."""
    out = None
    for i in range(0, len(tokens), 128):
        out = arch.forward([Segment(memory, tokens[i : i + 128], Logits.LAST)])[0]
    assert out is not None
    return out


@pytest.fixture(scope="module")
def tokens() -> np.ndarray:
    return np.random.default_rng(0).integers(100, 20000, size=sum(CHUNKS)).astype(np.int32)


def ring_memory(arch, n_ctx: int = 2048) -> SequenceMemory:
    memory = arch.new_memory(n_ctx)
    memory.use_window_rings(arch.sliding_windows(), 128)
    return memory


def test_ring_gives_the_full_cache_logits_bit_for_bit(gemma_model, tokens: np.ndarray) -> None:
    arch = gemma_model.arch
    full, ring = arch.new_memory(2048), ring_memory(arch)
    rings = ring.rings
    assert len(rings) == 15 and all(r.capacity == 648 for r in rings.values())  # window 512 + chunk + 8
    pos = 0
    for n in CHUNKS:  # chunks of every size; the ring wraps several times
        a = evaluate(arch, full, tokens[pos : pos + n])
        b = evaluate(arch, ring, tokens[pos : pos + n])
        assert np.array_equal(a, b), f"chunk at {pos}"
        pos += n


def test_window_checkpoint_restores_exactly_and_truncation_is_bounded(gemma_model, tokens: np.ndarray) -> None:
    arch = gemma_model.arch
    ring = ring_memory(arch)
    evaluate(arch, ring, tokens[:700])
    snap = ring.snapshot()  # the window a next token sees: 15 layers x (512 + alignment) positions
    assert snap.n_tokens == 700 and len(snap.windows) == 15 and 7_000_000 < snap.nbytes < 9_000_000
    evaluate(arch, ring, tokens[700:1250])
    floor = ring.live_floor
    assert 0 < floor < 1250  # the ring no longer holds what positions before `floor` would see
    with pytest.raises(ValueError):
        ring.truncate(floor - 1)
    ring.restore(snap)
    fresh = arch.new_memory(2048)
    evaluate(arch, fresh, tokens[:700])
    cont = tokens[1000:1040]
    assert np.array_equal(evaluate(arch, ring, cont), evaluate(arch, fresh, cont))
    ring.truncate(ring.live_floor)  # truncation within the ring's reach is exact too
    fresh.truncate(ring.n_tokens)
    assert np.array_equal(evaluate(arch, ring, cont[:5]), evaluate(arch, fresh, cont[:5]))
