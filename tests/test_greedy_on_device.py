"""The greedy token computed where the logits are (`Logits.ARGMAX`): on the GPU one number per row
comes back instead of the vocabulary's logits. The device's argmax is numpy's (the first maximum)
on any row; a forward's greedy tokens are the argmax of the same forward's logits on every
architecture and both devices, alone, batched and beside rows that want their logits; captured
decode steps replay them; and the engine asks for them exactly when a task's next token is the
raw greedy one (no penalties, logprobs or grammar), with the same answers."""

from __future__ import annotations

import queue
from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models
from test_gpu_step_plans import CASES, replaying

from hyserve.engine.config import EngineConfig
from hyserve.engine.engine import Engine
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.stop import StopRule
from hyserve.engine.task import DeltaEvent, FailedEvent, FinishedEvent, Task
from hyserve.model.architectures.base import Architecture, Logits, Segment
from hyserve.model.backend.cpu import CPU
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.loader import ARCHITECTURES, load_model

PROMPTS = [[5, 17, 42, 99], [7, 250, 3, 11, 60], [8, 8, 8]]


def test_the_device_argmax_is_numpys(gpu_fast_backend) -> None:
    device = gpu_fast_backend.device
    rng = np.random.default_rng(0)
    for rows, cols in [(1, 1), (1, 7), (3, 255), (2, 256), (5, 257), (70, 1000), (2, 262144)]:
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        for r in range(rows):  # the maximum again further on, in this thread's stride and others'
            for c in {cols // 2, cols - 1, min(cols - 1, 256 + 3), min(cols - 1, 256 + r)}:
                x[r, c] = x[r].max()
        x[rows // 2] = np.round(x[rows // 2])  # many ties
        x[-1, : cols // 3] = -np.inf
        if rows > 2:
            x[1] = 0.0  # all equal: the first
            x[2] = -np.inf
        got = device.to_host(device.argmax_rows(device.tensor(x)))
        np.testing.assert_array_equal(got.astype(np.int64), np.argmax(x, axis=1), err_msg=f"{rows}x{cols}")


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{q}" for a, q in CASES])
def model_file(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    name, qtype = request.param
    return name, make_models.write_model(tmp_path_factory.mktemp(name) / f"{name}.gguf", name, qtype=qtype)


def prefilled(arch: Architecture) -> list:
    """Memories holding every prompt but its last token."""
    memories = [arch.new_memory(64) for _ in PROMPTS]
    arch.forward([Segment(m, np.asarray(p[:-1], np.int32), Logits.NONE) for m, p in zip(memories, PROMPTS)])
    return memories


def decode(arch: Architecture, modes: list[Logits], steps: int) -> list[list[int]]:
    """Greedy decode of every prompt in one batch per step, each row asking for `modes[i]`
    (LAST: its logits, the token taken on the host; ARGMAX: its greedy token)."""
    memories = prefilled(arch)
    tokens = [p[-1] for p in PROMPTS]  # the last prompt token is the first step's input
    out: list[list[int]] = [[] for _ in PROMPTS]
    for _ in range(steps):
        rows = arch.forward(
            [Segment(m, np.asarray([t], np.int32), mode, {}) for m, t, mode in zip(memories, tokens, modes)]
        )
        for i, (row, mode) in enumerate(zip(rows, modes)):
            assert row is not None
            if mode is Logits.ARGMAX:
                assert row.dtype == np.int32 and row.shape == (1,)
                tokens[i] = int(row[0])
            else:
                tokens[i] = int(np.argmax(row))
            out[i].append(tokens[i])
    return out


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_greedy_tokens_are_the_argmax_of_the_logits(
    model_file: tuple[str, Path], device: str, gpu_fast_backend
) -> None:
    name, path = model_file
    arch = ARCHITECTURES[name](GGUFFile.open(path), CPU if device == "cpu" else gpu_fast_backend)
    want = decode(arch, [Logits.LAST] * 3, 5)
    assert decode(arch, [Logits.ARGMAX] * 3, 5) == want
    assert decode(arch, [Logits.ARGMAX, Logits.LAST, Logits.ARGMAX], 5) == want  # mixed: argmax on the host


def test_replayed_greedy_steps_read_back_one_number_per_row(
    model_file: tuple[str, Path], gpu_fast_backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, path = model_file
    arch = ARCHITECTURES[name](GGUFFile.open(path), gpu_fast_backend)
    with replaying(arch, False):
        want = decode(arch, [Logits.ARGMAX] * 3, 6)
    plans = arch.step_plans
    assert plans is not None
    read_back, shapes = plans.read_back, []
    monkeypatch.setattr(plans, "read_back", lambda outputs: shapes.append(outputs[-1].shape) or read_back(outputs))
    before = plans.replays
    with replaying(arch, True):
        assert decode(arch, [Logits.ARGMAX] * 3, 6) == want
    assert plans.replays - before == 4  # captured at the second step, replayed from the third
    assert shapes == [[3]] * 4  # the tokens, not 3 rows of logits


def run_task(engine: Engine, prompt: list[int], n: int, **extra: object) -> list[int]:
    events: queue.Queue[object] = queue.Queue()
    task = Task(
        id=f"g{len(prompt)}-{n}-{sorted(extra)}",
        prompt=tuple(prompt),
        params=extra.pop("params", SamplingParams()),  # type: ignore[arg-type]
        stop=StopRule(max_tokens=n, ignore_eos=True),
        sink=events.put,
        **extra,  # type: ignore[arg-type]
    )
    engine.submit(task)
    tokens: list[int] = []
    while True:
        event = events.get(timeout=120)
        if isinstance(event, DeltaEvent):
            tokens += event.token_ids
        elif isinstance(event, FailedEvent):
            raise AssertionError(event.message)
        elif isinstance(event, FinishedEvent):
            return tokens


def test_the_engine_asks_for_the_greedy_token_only_when_it_suffices(tmp_path: Path) -> None:
    model = load_model(make_models.write_model(tmp_path / "qwen35.gguf", "qwen35", qtype="q8_0"))
    arch = model.arch
    asked: list[Logits] = []
    forward = arch.forward

    def recording(segments, *args, **kwargs):  # the real forward; its decode rows' modes noted
        asked.extend(s.logits for s in segments if len(s.tokens) == 1 and s.logits is not Logits.NONE)
        return forward(segments, *args, **kwargs)

    arch.forward = recording  # type: ignore[method-assign]
    engine = Engine(arch, model.tokenizer, EngineConfig(n_slots=1, n_ctx=256, prompt_chunk=16, cache_memory=0))
    engine.start()
    try:
        prompt = PROMPTS[1] * 3
        plain = run_task(engine, prompt, 6)
        assert set(asked) == {Logits.ARGMAX}
        asked.clear()
        assert run_task(engine, prompt, 6, logprobs=True) == plain
        assert set(asked) == {Logits.LAST}
        asked.clear()
        penalised = SamplingParams(repetition_penalty=1.3)
        run_task(engine, prompt, 6, params=penalised)
        assert set(asked) == {Logits.LAST}
    finally:
        engine.shutdown()
