"""engine/scheduler.py's policy as plain functions: what one forward call evaluates (compose_batch) and
the bounded FIFO queue."""

from __future__ import annotations

import pytest

from hyserve.engine.scheduler import BatchItem, BoundedFifo, QueueFullError, SlotWork, compose_batch


def test_compose_batch_decodes_every_generating_slot_and_chunks_prompts() -> None:
    work = [
        SlotWork(0, decoding=True, admitted=1),
        SlotWork(1, decoding=False, prompt_remaining=500, admitted=3),
        SlotWork(2, decoding=True, admitted=2),
        SlotWork(3, decoding=False, prompt_remaining=40, admitted=2),
    ]
    items = compose_batch(work, token_budget=128)
    # decodes get one token each; the earlier admitted prompt (slot 3) is served first
    assert items == [
        BatchItem(0, 1, True),
        BatchItem(1, 128 - 2 - 40, False),
        BatchItem(2, 1, True),
        BatchItem(3, 40, False),
    ]
    assert sum(i.n_tokens for i in items) == 128


def test_compose_batch_prompt_processing_is_never_starved() -> None:
    work = [SlotWork(i, decoding=True) for i in range(20)] + [SlotWork(20, False, prompt_remaining=100)]
    items = compose_batch(work, token_budget=16)
    assert [i for i in items if not i.decode] == [BatchItem(20, 2, False)]  # max(1, 16 // 8)
    assert compose_batch([SlotWork(0, False, prompt_remaining=3)], token_budget=1) == [BatchItem(0, 1, False)]


def test_compose_batch_only_prompts_and_empty() -> None:
    assert compose_batch([SlotWork(0, False, prompt_remaining=10)], 128) == [BatchItem(0, 10, False)]
    assert compose_batch([], 128) == []
    with pytest.raises(ValueError):
        compose_batch([], 0)


# --- BoundedFifo -----------------------------------------------------------------------------------


def test_bounded_fifo() -> None:
    q: BoundedFifo[str] = BoundedFifo(2)
    q.push("a")
    q.push("b")
    with pytest.raises(QueueFullError):
        q.push("c")
    assert q.remove("a") and not q.remove("a")
    q.push("c")
    assert list(q) == ["b", "c"] and q.pop() == "b" and len(q) == 1
    assert q.drain() == ["c"] and len(q) == 0
    with pytest.raises(QueueFullError):
        BoundedFifo[int](0).push(1)
