"""The real server on a tiny hybrid model (`qwen35`: recurrent Gated DeltaNet + attention layers):
results equal in-process generation, a pure extension resumes from the live recurrent state, an
edit before the first checkpoint starts over (token input has no message boundaries; the chat
scenarios are in test_cache_scenarios.py), and a cancelled prompt leaves the slot consistent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models
from server_process import running_server

from hyserve_client import Accepted, Delta, Finished, HyserveClient


def reference(model_path: Path, token_ids: list[int], n: int) -> list[int]:
    from hyserve.engine.generator import StopRule, generate
    from hyserve.engine.sampling import SamplingParams
    from hyserve.model.loader import load_model

    model = load_model(model_path)
    return [g.token_id for g in generate(model, token_ids, SamplingParams(), StopRule(max_tokens=n, ignore_eos=True))]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    tmp = tmp_path_factory.mktemp("hybrid")
    path = make_models.write_model(tmp / "qwen35.gguf", "qwen35", qtype="q8_0")
    args = ("--model", str(path), "--parallel", "1", "--ctx-size", "512", "--threads", "2", "--prompt-chunk", "16")
    with running_server(tmp / "server.log", *args) as target:
        yield path, target


def generate(target: str, token_ids: list[int], n: int) -> tuple[Accepted, list[int], Finished]:
    with HyserveClient(target) as client:
        events = list(client.generate(token_ids=token_ids, max_tokens=n, ignore_eos=True))
    assert isinstance(events[0], Accepted) and isinstance(events[-1], Finished)
    tokens = [t for e in events if isinstance(e, Delta) for t in e.token_ids]
    return events[0], tokens, events[-1]


PROMPT = [int(t) for t in np.random.default_rng(0).integers(10, 400, size=40)]


def test_generation_equals_in_process_and_extension_resumes_live_state(hybrid) -> None:
    path, target = hybrid
    accepted, first, _ = generate(target, PROMPT, 8)
    assert first == reference(path, PROMPT, 8)
    # the slot now holds PROMPT + first[:-1]: a pure extension resumes there, with no re-processing
    extended = PROMPT + first + [11, 12, 13]
    accepted, second, finished = generate(target, extended, 6)
    assert accepted.reused_tokens == len(PROMPT) + len(first) - 1
    assert finished.usage.processed_prompt_tokens == len(extended) - accepted.reused_tokens
    assert second == reference(path, extended, 6)


def test_an_edited_prompt_resumes_at_the_edit_and_gives_the_same_answer(hybrid) -> None:
    path, target = hybrid
    generate(target, PROMPT, 4)
    edited = [*PROMPT[:20], 7, 7, 7, *PROMPT[23:]]
    # no checkpoint before the edit but the empty state: the kept inputs are replayed from there
    accepted, tokens, finished = generate(target, edited, 6)
    assert accepted.reused_tokens == accepted.matched_tokens == 20 and accepted.reprocess_reason == ""
    assert finished.usage.processed_prompt_tokens == len(edited) - 20
    assert tokens == reference(path, edited, 6)


def test_cancel_during_a_long_prompt_then_retry(hybrid) -> None:
    path, target = hybrid
    long_prompt = [int(t) for t in np.random.default_rng(1).integers(10, 400, size=300)]
    with HyserveClient(target) as client:
        stream = client.generate(token_ids=long_prompt, max_tokens=4, ignore_eos=True, task_id="hybrid-cancel")
        first = next(iter(stream))
        assert isinstance(first, Accepted)
        client.cancel("hybrid-cancel")  # while its 300-token prompt runs in chunks of 16
        events = list(stream)
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason.name == "CANCELLED"
    assert finished.usage.processed_prompt_tokens < len(long_prompt)
    _, tokens, _ = generate(target, long_prompt, 4)
    assert tokens == reference(path, long_prompt, 4)
