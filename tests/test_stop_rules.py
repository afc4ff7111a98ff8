"""The stop rules (engine/stop.py) are one: the same request gives the same tokens, the same text
deltas and the same finish reason through the engine and through the in-process loop
(engine/generator.py, the CLI's and the server tests' reference). Cases: the context filling up,
a stop string that spans tokens (held back until it is decided), a stop token, max_tokens."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from fixtures import make_models

from hyserve.engine.engine import Engine, EngineConfig
from hyserve.engine.generator import generate
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.stop import FinishReason, StopCheck, StopRule
from hyserve.engine.task import DeltaEvent, Event, FailedEvent, FinishedEvent, Task
from hyserve.model.loader import LoadedModel, load_model

N_CTX = 40
PROMPT = (17, 230, 41, 99, 5, 310, 77, 12)
SAMPLING = SamplingParams(temperature=0.9, seed=11)

Steps = list[tuple[int, str]]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    path = make_models.write_model(tmp_path_factory.mktemp("stop") / "llama.gguf", "llama", vocab=512)
    return load_model(path)


@pytest.fixture(scope="module")
def engine(model: LoadedModel) -> Iterator[Engine]:
    e = Engine(model.arch, model.tokenizer, EngineConfig(n_ctx=N_CTX, prompt_chunk=8, cache_memory=0))
    e.start()
    yield e
    e.shutdown()


def through_engine(engine: Engine, rule: StopRule, name: str) -> tuple[Steps, str]:
    events: list[Event] = []
    done = threading.Event()

    def sink(event: Event) -> None:
        events.append(event)
        if isinstance(event, FinishedEvent | FailedEvent):
            done.set()

    engine.submit(Task(id=name, prompt=PROMPT, params=SAMPLING, stop=rule, sink=sink))
    assert done.wait(120)
    end = events[-1]
    assert isinstance(end, FinishedEvent), end
    steps: Steps = []
    for ev in events:
        if isinstance(ev, DeltaEvent):
            steps.extend((t, ev.text if i == len(ev.token_ids) - 1 else "") for i, t in enumerate(ev.token_ids))
            if not ev.token_ids and ev.text:  # text released without a token (cancellation only)
                steps.append((-1, ev.text))
    return steps, end.reason.value


def in_process(model: LoadedModel, rule: StopRule) -> tuple[Steps, str]:
    out = list(generate(model, PROMPT, SAMPLING, rule, n_ctx=N_CTX, chunk=8))
    reason = out[-1].finish_reason
    assert reason is not None and all(g.finish_reason is None for g in out[:-1])
    return [(g.token_id, g.text) for g in out], reason


def test_context_full_both_ways(model: LoadedModel, engine: Engine) -> None:
    rule = StopRule(max_tokens=1000)
    got, want = through_engine(engine, rule, "ctx"), in_process(model, rule)
    assert got == want
    steps, reason = got
    assert reason == FinishReason.CONTEXT_FULL.value and len(PROMPT) + len(steps) == N_CTX


def test_stop_string_across_tokens_both_ways(model: LoadedModel, engine: Engine) -> None:
    free, _ = in_process(model, StopRule(max_tokens=24))
    # a stop string that starts inside one token's text and ends inside a later one
    pieces = [model.tokenizer.decode([t]) for t, _ in free]
    i = next(k for k in range(2, len(pieces) - 1) if len(pieces[k]) >= 2 and pieces[k + 1])
    stop = pieces[i][-2:] + pieces[i + 1][:1]
    rule = StopRule(max_tokens=24, stop_strings=(stop,))
    got, want = through_engine(engine, rule, "stop"), in_process(model, rule)
    assert got == want
    steps, reason = got
    assert reason == FinishReason.STOP_STRING.value
    text = "".join(t for _, t in steps)
    full = "".join(pieces)
    assert stop not in text and full.startswith(text) and full[len(text) :].startswith(stop)


def test_stop_token_and_max_tokens_both_ways(model: LoadedModel, engine: Engine) -> None:
    free, _ = in_process(model, StopRule(max_tokens=12))
    rule = StopRule(max_tokens=12, stop_token_ids=frozenset({free[5][0]}))
    assert through_engine(engine, rule, "tok") == in_process(model, rule)
    rule = StopRule(max_tokens=7)
    got = through_engine(engine, rule, "max")
    assert got == in_process(model, rule) and got[1] == FinishReason.MAX_TOKENS.value and len(got[0]) == 7


class _Letters:
    """A vocabulary of single letters ('a' + id) with token 0 as end of generation."""

    def is_eog(self, token_id: int) -> bool:
        return token_id == 0

    def incremental_decoder(self) -> _Letters:
        return self

    def push(self, token_id: int) -> str:
        return chr(ord("a") + token_id)

    def flush(self) -> str:
        return ""


def test_partial_stop_string_is_held_back_then_released() -> None:
    check = StopCheck(StopRule(max_tokens=10, stop_strings=("bcd",)), _Letters(), prompt_len=1, n_ctx=100)
    assert [check.push(t).text for t in (1, 2, 4)] == ["", "", "bce"]  # "bc" held until "e" rules it out
    check = StopCheck(StopRule(max_tokens=3, stop_strings=("bcd",)), _Letters(), prompt_len=1, n_ctx=100)
    decisions = [check.push(t) for t in (0 + 5, 1, 2)]
    assert [d.text for d in decisions] == ["f", "", "bc"] and decisions[-1].reason is FinishReason.MAX_TOKENS
    check = StopCheck(StopRule(max_tokens=10, ignore_eos=True), _Letters(), prompt_len=1, n_ctx=4)
    decisions = [check.push(t) for t in (0, 1, 2)]
    assert [d.text for d in decisions] == ["", "b", "c"] and decisions[-1].reason is FinishReason.CONTEXT_FULL
