"""The engine's invariant hook (`EngineConfig.check_invariants`, `hyserve serve --check-invariants`):
it passes on a healthy engine and catches a slot whose memory, bookkeeping or checkpoints were
corrupted (so the soak test's "violations = 0" is a check that can fail)."""

from __future__ import annotations

import queue
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models

from hyserve.engine.engine import Engine, EngineConfig
from hyserve.engine.generator import StopRule
from hyserve.engine.invariants import InvariantChecker
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.task import Event, FinishedEvent, Task
from hyserve.model.loader import LoadedModel, load_model

PROMPT = [int(t) for t in np.random.default_rng(1).integers(10, 400, size=50)]


@pytest.fixture(scope="module", params=["qwen35", "llama"])
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path: Path = make_models.write_model(tmp_path_factory.mktemp("hook") / "m.gguf", request.param, qtype="q8_0")
    return load_model(path)


def run(engine: Engine, prompt: list[int], n: int, boundaries: tuple[int, ...] = ()) -> list[int]:
    events: queue.Queue[Event] = queue.Queue()
    task = Task(
        id=f"t{len(prompt)}-{n}-{id(events)}",
        prompt=tuple(prompt),
        params=SamplingParams(),
        stop=StopRule(max_tokens=n, ignore_eos=True),
        sink=events.put,
        message_boundaries=boundaries,
    )
    engine.submit(task)
    tokens: list[int] = []
    while not isinstance(event := events.get(timeout=60), FinishedEvent):
        tokens += getattr(event, "token_ids", ())
    return tokens


def test_hook_passes_on_a_healthy_engine(model: LoadedModel) -> None:
    engine = Engine(
        model.arch, model.tokenizer, EngineConfig(n_slots=2, n_ctx=256, prompt_chunk=16, check_invariants=True)
    )
    engine.start()
    try:
        first = run(engine, PROMPT, 6, boundaries=(0, 20))
        run(engine, PROMPT + first + [11, 12], 4)  # extension: resumes the live state
        run(engine, [*PROMPT[:30], 13, 14, 15], 4)  # edit: back to a checkpoint (hybrid) or truncation
        counters = engine.stats().counters
    finally:
        engine.shutdown()
    assert counters.checkpoints_created > 0
    assert counters.invariant_checks > 10
    assert counters.invariant_violations == 0


def test_hook_catches_corrupted_memory_bookkeeping_and_checkpoints(model: LoadedModel) -> None:
    engine = Engine(model.arch, model.tokenizer, EngineConfig(n_slots=1, n_ctx=256, prompt_chunk=16))
    engine.start()
    try:
        run(engine, PROMPT, 4, boundaries=(0, 20))
    finally:
        engine.shutdown()
    slot = engine.slots[0]
    checker = InvariantChecker(model.arch, 256)
    assert checker.check_slot(0, slot.tokens, slot.memory, slot.checkpoints) == 0
    cps = list(slot.checkpoints)
    assert cps  # at least the prompt end's
    expected = 3
    if slot.memory.recurrent:
        # I3: a checkpoint whose state is not the one its prefix gives
        cp = cps[0]
        states = {il: (conv.copy(), ssm + 1.0) for il, (conv, ssm) in cp.snapshot.states.items()}
        bad = replace(cp, snapshot=replace(cp.snapshot, states=states))
        assert InvariantChecker(model.arch, 256).check_slot(0, slot.tokens, slot.memory, [bad]) == 1
    if cps:
        # I2: a checkpoint past its sequence's tokens, and one whose prefix tokens changed
        assert checker.check_entry(0, slot.tokens[: cps[-1].position - 1], cps[-1:]) == 1
        edited = [slot.tokens[0] + 1, *slot.tokens[1:]]
        assert checker.check_entry(0, edited, cps) == len(cps)
        expected += 1 + len(cps)
    # I1: a token the memory does not hold
    assert checker.check_slot(0, [*slot.tokens[:-1], slot.tokens[-1] + 1], slot.memory, ()) == 1
    assert checker.check_slot(0, slot.tokens[:-1], slot.memory, ()) == 1
    # I1: the memory's content changed behind the bookkeeping
    n = slot.memory.n_tokens
    if slot.memory.recurrent:
        next(iter(slot.memory.recurrent.values())).ssm[0] += 1.0
    else:
        next(iter(slot.memory.kv.values())).k[n - 1] += 1
    assert checker.check_slot(0, slot.tokens, slot.memory, ()) == 1
    assert checker.report.violations == expected
