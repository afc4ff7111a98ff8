"""An agent's tool loop through the real server, with the official `openai` and `anthropic` clients.

The model is the tiny hybrid fixture (`qwen35`: Gated DeltaNet + attention, random weights) with
a Qwen3.5-style template that renders tools and XML tool calls. `tool_choice="required"` is held by
constrained decoding, so even random weights answer every turn with a call whose arguments
validate against the tool's schema. Each turn's prompt extends the previous one with the rendered
call and the tool's result: the prompt cache must carry the conversation across tool turns, with
exactly the minimum processed (the `Ledger` counts it from tokens, in-process).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
from cache_ledger import Ledger
from chat_templates import QWEN35_TEMPLATE
from fixtures import make_models
from server_process import free_port, running_server

from hyserve.api.anthropic_http.requests import parse_messages
from hyserve.api.openai_http.requests import parse_chat
from hyserve.api.validation import prompt_tokens
from hyserve.chat import parse_chat_output
from hyserve.model.backend.select import DeviceRequest
from hyserve.model.loader import LoadedModel, load_model
from hyserve_client import Delta, Finished, FinishReason, HyserveClient, HyserveError, build_generate_request
from hyserve_client._gen import hyserve_pb2_grpc as pb_grpc

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Oslo", "Lima", "Pune"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"type": "string", "enum": ["metric", "imperial"]},
    },
    "required": ["city", "days"],
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "A forecast.", "parameters": WEATHER}}]
NO_THINKING = {"enable_thinking": False}
TURNS = 10


@dataclass(frozen=True)
class Served:
    base: str
    grpc: str
    model: LoadedModel


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("tool-loop")
    template = tmp / "qwen35.jinja"
    template.write_text(QWEN35_TEMPLATE)
    path: Path = make_models.write_model(tmp / "qwen35.gguf", "qwen35", qtype="q8_0")
    http_port = free_port()
    args = ["--model", str(path), "--chat-template", str(template), "--parallel", "1", "--ctx-size", "4096"]
    args += ["--threads", "2", "--prompt-chunk", "64", "--http-port", str(http_port)]
    with running_server(tmp / "server.log", *args) as target:
        yield Served(f"http://127.0.0.1:{http_port}", target, load_model(path, template, DeviceRequest("cpu")))


class OpenAILedger(Ledger):
    def body_tokens(self, body: dict[str, Any]) -> list[int]:
        ids, _ = prompt_tokens(parse_chat(body, "t").generate, self.model.tokenizer, self.model.chat_template)
        return ids


def _streamed(oai: Any, body: dict[str, Any]) -> tuple[dict[str, Any], Any, str, list[int]]:
    """One streamed request reassembled: (the call, the usage, the finish reason, the token ids)."""
    call: dict[str, Any] = {"id": "", "name": "", "arguments": ""}
    usage, finish, tokens = None, "", []
    for chunk in oai.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            tokens += getattr(choice, "token_ids", None) or []
            for piece in choice.delta.tool_calls or ():
                assert piece.index == 0
                call["id"] += piece.id or ""
                if piece.function is not None:
                    call["name"] += piece.function.name or ""
                    call["arguments"] += piece.function.arguments or ""
    return call, usage, finish, tokens


def test_openai_tool_loop_with_required_calls_reuses_the_cache_every_turn(served: Served) -> None:
    oai = openai.OpenAI(base_url=f"{served.base}/v1", api_key="unused", timeout=300, max_retries=0)
    ledger = OpenAILedger(served.model)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "What is the weather this week?"},
    ]
    previous_prompt = 0
    for turn in range(TURNS):
        body = {
            "model": "m",
            "messages": messages,
            "tools": TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
            "temperature": 0,
            "max_tokens": 96,
            "extra_body": {"chat_template_kwargs": NO_THINKING, "return_token_ids": True},
        }
        prompt = ledger.body_tokens({**body, **body["extra_body"]})
        expected = ledger.minimum(prompt)
        if turn == 3:
            call, usage, finish, generated = _streamed(oai, body)
        else:
            response = oai.chat.completions.create(**body)
            choice = response.choices[0]
            finish, usage, generated = choice.finish_reason, response.usage, choice.token_ids
            (made,) = choice.message.tool_calls
            call = {"id": made.id, "name": made.function.name, "arguments": made.function.arguments}
        assert finish == "tool_calls", turn
        assert call["name"] == "get_weather" and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)
        assert usage.prompt_tokens == len(prompt)
        cached = usage.prompt_tokens_details.cached_tokens
        assert usage.prompt_tokens - cached == expected, (turn, usage)
        assert cached >= previous_prompt, "the cache did not survive the tool turn"
        previous_prompt = len(prompt)
        ledger.record(prompt, generated)
        city = json.loads(call["arguments"])["city"]
        made_call = {
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [made_call]},
            {"role": "tool", "tool_call_id": call["id"], "content": f"{city}: sunny, {turn + 12} C"},
        ]


def test_anthropic_tool_loop_with_required_calls_reuses_the_cache_every_turn(served: Served) -> None:
    client = anthropic.Anthropic(base_url=served.base, api_key="unused", timeout=300, max_retries=0)
    ledger = Ledger(served.model)
    tools = [{"name": "get_weather", "description": "A forecast.", "input_schema": WEATHER}]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather this week?"}]
    previous_prompt = 0
    for turn in range(TURNS):
        body = {
            "model": "m",
            "max_tokens": 96,
            "system": "You call tools.",
            "messages": messages,
            "tools": tools,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "temperature": 0,
            "chat_template_kwargs": NO_THINKING,
        }
        generate = parse_messages(body, "t").generate
        prompt, _ = prompt_tokens(generate, served.model.tokenizer, served.model.chat_template)
        expected = ledger.minimum(prompt)
        extra = {k: body[k] for k in ("temperature", "chat_template_kwargs")}
        kwargs = {k: v for k, v in body.items() if k not in extra}
        reply = client.messages.create(**kwargs, extra_body=extra)
        assert reply.stop_reason == "tool_use", turn
        (use,) = [b for b in reply.content if b.type == "tool_use"]
        jsonschema.validate(use.input, WEATHER)
        # Anthropic's usage: input_tokens evaluated, cache_read_input_tokens reused from the cache
        assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == len(prompt)
        # at most the tokens after the previous prompt: the Messages API returns no token ids, so
        # the ledger knows the prompts only (the server may also reuse the answer it generated)
        assert reply.usage.input_tokens <= expected, (turn, reply.usage)
        assert reply.usage.cache_read_input_tokens >= previous_prompt, "the cache did not survive the tool turn"
        previous_prompt = len(prompt)
        ledger.record(prompt, [])
        messages += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},
        ]


# --- the same through gRPC, and what is refused ---------------------------------------------------


def test_grpc_required_call_and_json_schema(served: Served) -> None:
    with HyserveClient(served.grpc, timeout=300) as client:
        events = list(
            client.generate(
                messages=[{"role": "user", "content": "Weather in Lima?"}],
                tools=TOOLS,
                tool_choice="required",
                parallel_tool_calls=False,
                chat_template_kwargs=NO_THINKING,
                max_tokens=96,
            )
        )
        finished = events[-1]
        assert isinstance(finished, Finished) and finished.reason is FinishReason.TOOL_CALLS
        (call,) = finished.tool_calls
        jsonschema.validate(json.loads(call.arguments_json), WEATHER)
        pieces = [p for e in events if isinstance(e, Delta) for p in e.tool_calls]
        assert pieces[0].id == call.id and pieces[0].name == "get_weather"
        assert "".join(p.arguments_fragment for p in pieces) == call.arguments_json
        assert "<tool_call>" not in "".join(e.text for e in events if isinstance(e, Delta))

        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        text, done = client.generate_text("Answer in JSON.", json_schema=schema, max_tokens=64)
        assert done.reason is FinishReason.EOS
        jsonschema.validate(json.loads(text), schema)


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/nowhere"}}}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [{"role": "tool", "tool_call_id": "call_x", "content": "42"}]}, "messages"),
    (
        {
            "messages": [
                {"role": "user", "content": "x", "tool_calls": []},
                {"role": "tool", "content": "4", "tool_call_id": "c"},
            ]
        },
        "messages",
    ),
]


@pytest.mark.parametrize(("extra", "param"), BAD)
def test_bad_constraints_tools_and_tool_messages_are_400_naming_the_field(
    served: Served, extra: dict[str, Any], param: str
) -> None:
    oai = openai.OpenAI(base_url=f"{served.base}/v1", api_key="unused", timeout=60, max_retries=0)
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(**body)
    assert info.value.body["param"] == param, info.value.body


def test_a_hostile_schema_is_refused_and_a_running_stream_is_untouched(served: Served) -> None:
    """A schema whose grammar explodes is refused while another stream runs; that stream's tokens
    equal its solo run (compiling happens on the preparation threads, never on the engine's)."""
    hostile = {"type": "object", "properties": {}}
    node = hostile
    for i in range(200):  # nesting far past the compiler's bound
        child: dict[str, Any] = {"type": "object", "properties": {}}
        node["properties"][f"k{i}"] = child
        node = child
    prompt = [{"role": "user", "content": "Tell a long story."}]
    with HyserveClient(served.grpc, timeout=300) as client:
        solo = [
            t
            for e in client.generate(messages=prompt, max_tokens=48, ignore_eos=True)
            if isinstance(e, Delta)
            for t in e.token_ids
        ]
        with client.generate(messages=prompt, max_tokens=48, ignore_eos=True) as stream:
            events = iter(stream)
            canary = [next(events), next(events)]  # accepted, and the first tokens: it is running
            with pytest.raises(HyserveError) as info:
                client.generate_text("x", json_schema=hostile, max_tokens=4)
            canary += list(events)
        assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "sampling.constraint.json_schema" in info.value.details
    assert [t for e in canary if isinstance(e, Delta) for t in e.token_ids] == solo


def test_reasoning_is_split_out_streamed_and_not(served: Served) -> None:
    """The prompt opens the reasoning (thinking on): the answer's text up to `</think>` comes back as
    `reasoning_content`, the same streamed and not, and it is what the model wrote."""
    oai = openai.OpenAI(base_url=f"{served.base}/v1", api_key="unused", timeout=300, max_retries=0)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Think first."}],
        "temperature": 0,
        "max_tokens": 24,
        "extra_body": {"return_token_ids": True},
    }
    message = oai.chat.completions.create(**body).choices[0]
    written = served.model.tokenizer.decode(message.token_ids, skip_special=True)
    expected = parse_chat_output(written, None, None, ("<think>", "</think>"), starts_inside=True)
    assert message.message.reasoning_content == expected.reasoning != ""
    assert (message.message.content or "") == expected.content
    streamed = {"reasoning_content": "", "content": ""}
    for chunk in oai.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            for key in streamed:
                streamed[key] += getattr(choice.delta, key, None) or ""
    assert streamed == {"reasoning_content": expected.reasoning, "content": expected.content}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_json_nested_past_the_decoders_stack_is_a_400(served: Served, path: str) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    request = urllib.request.Request(
        served.base + path, data=f'{{"messages": {deep}}}'.encode(), headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=60)
    assert info.value.code == 400


def test_a_schema_nested_past_the_decoders_stack_is_invalid_argument(served: Served) -> None:
    deep = '{"type": "array", "items": ' * 3_000 + "{}" + "}" * 3_000
    as_constraint = build_generate_request("x", max_tokens=2, json_schema=deep)
    as_tool = build_generate_request(messages=[{"role": "user", "content": "x"}], max_tokens=2)
    as_tool.chat.tools.add(name="f", parameters_json=deep)
    with grpc.insecure_channel(served.grpc) as channel:
        stub = pb_grpc.HyserveServiceStub(channel)
        for request, field in ((as_constraint, "sampling.constraint.json_schema"), (as_tool, "chat.tools[0]")):
            with pytest.raises(grpc.RpcError) as info:
                list(stub.Generate(request, timeout=60))
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details().startswith(field), info.value.details()


def test_speculation_per_request_through_the_openai_front(served: Served) -> None:
    """The `speculative` extension turns prompt-lookup drafts on for one request on a server that
    does not speculate: the same tokens, and the drafts in `completion_tokens_details`."""
    oai = openai.OpenAI(base_url=f"{served.base}/v1", api_key="unused", timeout=300, max_retries=0)
    text = "alpha beta gamma delta " * 12
    body = {"model": "m", "prompt": text, "temperature": 0, "max_tokens": 32}
    extra = {"return_token_ids": True, "ignore_eos": True}
    plain = oai.completions.create(**body, extra_body=extra)
    fast = oai.completions.create(**body, extra_body={**extra, "speculative": {"enabled": True, "max_draft": 4}})
    assert fast.choices[0].token_ids == plain.choices[0].token_ids
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens == 0
    assert plain.usage.completion_tokens_details.rejected_prediction_tokens == 0
    details = fast.usage.completion_tokens_details
    assert details.accepted_prediction_tokens >= 0 and details.rejected_prediction_tokens >= 0
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(**body, extra_body={"speculative": {"max_draft": 0}})
    assert info.value.body["param"] == "speculative"
