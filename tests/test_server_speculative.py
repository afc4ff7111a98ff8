"""The real server with `--spec ngram` (and `--spec draft`): every answer equals plain in-process decoding (greedy and
seeded, one request or four at once sharing the batch, a second turn resumed from the prompt
cache, a request after a cancelled one), and the vLLM-style draft counters on /metrics move."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.request import urlopen

import pytest
from fixtures import make_models
from server_process import free_port, running_server

from hyserve_client import Accepted, Delta, Finished, HyserveClient

COPIES = [
    f"def {name}(a, b):\n    return a {op} b\n\ndef sub(a, b):\n    return a - b\n\n" * 3 + f"def {name}(a, b):\n"
    for name, op in (("add", "+"), ("mul", "*"), ("div", "/"), ("mod", "%"))
]
SEEDED = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 11}


def reference(model, token_ids: list[int], n: int, **sampling: float) -> list[int]:
    """Plain in-process decoding: no server, no cache, no speculation."""
    from hyserve.engine.generator import StopRule, generate
    from hyserve.engine.sampling import SamplingParams

    params = SamplingParams(**sampling)  # type: ignore[arg-type]
    stop = StopRule(max_tokens=n, ignore_eos=True)
    return [g.token_id for g in generate(model, token_ids, params, stop, n_ctx=1024)]


def ask(target: str, token_ids: list[int], n: int, **params: object) -> tuple[Accepted, list[int], Finished]:
    with HyserveClient(target) as client:
        events = list(client.generate(token_ids=token_ids, max_tokens=n, ignore_eos=True, **params))  # type: ignore[arg-type]
    assert isinstance(events[0], Accepted) and isinstance(events[-1], Finished), events[-1]
    return events[0], [t for e in events if isinstance(e, Delta) for t in e.token_ids], events[-1]


def counters(metrics_port: int) -> dict[str, float]:
    """The server's unlabelled counters, by name without the prefix and the `_total` suffix."""
    text = urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30).read().decode()
    found = re.findall(r"^hyserve_(\w+)_total (\S+)$", text, re.M)
    return {name: float(value) for name, value in found}


def serve(tmp: Path, model: str, spec: tuple[str, ...] = ("--spec", "ngram")) -> Iterator[tuple[str, int]]:
    metrics_port = free_port()
    args = ("--model", model, "--parallel", "4", "--ctx-size", "1024", "--threads", "2", "--prompt-chunk", "64")
    args += (*spec, "--metrics-port", str(metrics_port), "--check-invariants")
    with running_server(tmp / "server.log", *args) as target:
        yield target, metrics_port


@pytest.fixture(scope="module")
def gemma_server(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    yield from serve(tmp_path_factory.mktemp("gemma-spec"), str(gemma_path))


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str, int]]:
    from hyserve.model.loader import load_model

    tmp = tmp_path_factory.mktemp("hybrid-spec")
    path = make_models.write_model(tmp / "qwen35.gguf", "qwen35", qtype="q8_0")
    for target, metrics_port in serve(tmp, str(path)):
        yield load_model(path), target, metrics_port


@pytest.fixture(scope="module")
def drafted_hybrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str, int]]:
    """The hybrid fixture served with `--spec draft`, its own file as the draft model: the drafts
    are its greedy continuation."""
    from hyserve.model.loader import load_model

    tmp = tmp_path_factory.mktemp("hybrid-draft")
    path = make_models.write_model(tmp / "qwen35.gguf", "qwen35", qtype="q8_0")
    for target, metrics_port in serve(tmp, str(path), ("--spec", "draft", "--spec-draft-model", str(path))):
        yield load_model(path), target, metrics_port


def test_gemma_answers_equal_plain_decoding_alone_and_four_at_once(gemma_model, gemma_server) -> None:
    target, metrics_port = gemma_server
    prompts = [gemma_model.tokenizer.encode(text) for text in COPIES]
    before = counters(metrics_port)
    for sampling in ({}, SEEDED):
        want = [reference(gemma_model, p, 24, **sampling) for p in prompts]
        assert ask(target, prompts[0], 24, **sampling)[1] == want[0]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda p, s=sampling: ask(target, p, 24, **s)[1], prompts))
        assert got == want
    after = counters(metrics_port)
    assert after["spec_decode_num_drafts"] > before["spec_decode_num_drafts"]
    accepted = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
    assert accepted > 20  # Gemma copies its prompt
    assert after["spec_decode_num_draft_tokens"] >= after["spec_decode_num_accepted_tokens"]
    assert after["invariant_checks"] > 0 and after["invariant_violations"] == 0


def test_gemma_second_turn_from_the_cache_and_after_a_cancel(gemma_model, gemma_server) -> None:
    target, metrics_port = gemma_server
    first_prompt = gemma_model.tokenizer.encode(COPIES[1])
    _, first, _ = ask(target, first_prompt, 16)
    second_prompt = first_prompt + first + gemma_model.tokenizer.encode(COPIES[2])
    accepted, second, _ = ask(target, second_prompt, 24)
    assert accepted.reused_tokens >= len(first_prompt)
    assert second == reference(gemma_model, second_prompt, 24)
    with HyserveClient(target) as client:
        stream = client.generate(token_ids=second_prompt, max_tokens=200, ignore_eos=True, task_id="spec-cancel")
        seen = 0
        for event in stream:
            seen += len(event.token_ids) if isinstance(event, Delta) else 0
            if seen >= 10:
                client.cancel("spec-cancel")
                break
        rest = list(stream)
    assert isinstance(rest[-1], Finished) and rest[-1].reason.name == "CANCELLED"
    _, again, _ = ask(target, second_prompt, 24)
    assert again == second
    assert counters(metrics_port)["invariant_violations"] == 0


def test_the_hybrid_model_answers_equal_plain_decoding(hybrid) -> None:
    model, target, metrics_port = hybrid
    prompts = [model.tokenizer.encode(text) for text in COPIES]  # type: ignore[attr-defined]
    for sampling in ({}, SEEDED):
        want = [reference(model, p, 48, **sampling) for p in prompts]
        assert ask(target, prompts[3], 48, **sampling)[1] == want[3]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda p, s=sampling: ask(target, p, 48, **s)[1], prompts))
        assert got == want
    after = counters(metrics_port)
    assert after["spec_decode_num_drafts"] > 0 and after["invariant_violations"] == 0


def test_a_request_turns_speculation_off_or_bounds_its_drafts(gemma_model, gemma_server) -> None:
    """Per request (SpeculativeOptions): off drafts nothing, max_draft bounds each draft, and the
    usage reports what was drafted and accepted; the tokens are the same every way."""
    target, _ = gemma_server
    prompt = gemma_model.tokenizer.encode(COPIES[1])
    want = reference(gemma_model, prompt, 24)
    _, plain, off = ask(target, prompt, 24, speculative=False)
    _, drafted, on = ask(target, prompt, 24)
    _, bounded, one = ask(target, prompt, 24, spec_max_draft=1)
    assert plain == drafted == bounded == want
    assert off.usage.draft_tokens == off.usage.accepted_draft_tokens == 0
    assert on.usage.draft_tokens >= on.usage.accepted_draft_tokens > 0
    # one token per draft at most: no more drafted tokens than verifying forwards could hold
    assert 0 < one.usage.draft_tokens <= 24 and one.usage.accepted_draft_tokens <= one.usage.draft_tokens
    assert one.usage.draft_tokens < on.usage.draft_tokens


def test_a_draft_model_server_answers_equal_plain_decoding(drafted_hybrid) -> None:
    model, target, metrics_port = drafted_hybrid
    prompts = [model.tokenizer.encode(text) for text in COPIES]  # type: ignore[attr-defined]
    for sampling in ({}, SEEDED):
        want = [reference(model, p, 24, **sampling) for p in prompts]
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda p, s=sampling: ask(target, p, 24, **s)[1], prompts))
        assert got == want
    after = counters(metrics_port)
    assert after["spec_decode_num_accepted_tokens"] > 24 and after["invariant_violations"] == 0
