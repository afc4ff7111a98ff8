"""OpenAI request bodies -> GenerateRequest (pure functions of hyserve.api.openai_http.requests)."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.api.openai_http.requests import OpenAIError, parse_chat, parse_completion, validation_param

USER = [{"role": "user", "content": "Hi"}]


def test_chat_defaults_follow_openai() -> None:
    parsed = parse_chat({"messages": USER}, "chatcmpl-1")
    req = parsed.generate
    assert req.task_id == "chatcmpl-1"
    assert req.sampling.temperature == 1.0  # OpenAI's default, where gRPC's unset means greedy
    assert not req.sampling.HasField("top_p") and not req.stopping.HasField("max_tokens")
    assert not parsed.stream and not parsed.include_usage and not parsed.return_token_ids
    assert [(m.role, m.content) for m in req.chat.messages] == [("user", "Hi")]


def test_chat_mapping() -> None:
    body: dict[str, Any] = {
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None, "reasoning_content": "hmm"},
            {"role": "tool", "content": "42", "name": "calc"},
        ],
        "max_completion_tokens": 7,
        "max_tokens": 99,
        "temperature": 0,
        "top_p": 0.5,
        "top_k": -1,
        "seed": 3,
        "stop": "END",
        "presence_penalty": -0.5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [{"type": "function", "function": {"name": "calc"}}],
        "chat_template_kwargs": {"enable_thinking": False},
        "cache_prompt": False,
        "logprobs": True,
        "top_logprobs": 3,
        "user": "ignored",
    }
    parsed = parse_chat(body, "t")
    req = parsed.generate
    roles = [(m.role, m.content) for m in req.chat.messages]
    assert roles == [("system", "Be brief."), ("user", "a\nb"), ("assistant", ""), ("tool", "42")]
    assert req.chat.messages[2].reasoning_content == "hmm" and req.chat.messages[3].name == "calc"
    assert req.stopping.max_tokens == 7 and list(req.stopping.stop_strings) == ["END"]
    assert req.sampling.temperature == 0 and req.sampling.top_p == 0.5 and req.sampling.top_k == 0
    assert req.sampling.seed == 3 and req.sampling.presence_penalty == -0.5
    kwargs = json_format.MessageToDict(req.chat.chat_template_kwargs)
    assert kwargs == {"enable_thinking": False}
    assert [(t.name, t.parameters_json) for t in req.chat.tools] == [("calc", "")]
    assert req.cache.HasField("cache_prompt") and not req.cache.cache_prompt
    assert req.logprobs and req.top_logprobs == 3
    assert parsed.stream and parsed.include_usage and parsed.logprobs


def test_tool_fields_map_to_the_chat_input() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get", "arguments": '{"city":"Oslo"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "get"}},
        "parallel_tool_calls": False,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}},
    }
    chat = parse_chat(body, "t").generate
    call = chat.chat.messages[1].tool_calls[0]
    assert (call.id, call.name, call.arguments_json) == ("call_1", "get", '{"city":"Oslo"}')
    assert chat.chat.messages[2].tool_call_id == "call_1"
    assert chat.chat.tool_choice.function == "get" and not chat.chat.parallel_tool_calls
    assert chat.chat.tools[0].parameters_json == '{"type":"object"}'
    assert chat.sampling.constraint.json_schema == '{"type":"integer"}'
    assert parse_chat(
        {"messages": USER, "response_format": {"type": "json_object"}}, "t"
    ).generate.sampling.constraint.json_object
    assert not parse_chat({"messages": USER, "response_format": {"type": "text"}}, "t").generate.sampling.HasField(
        "constraint"
    )
    required = parse_chat({"messages": USER, "tool_choice": "required"}, "t").generate.chat.tool_choice
    assert required.mode == pb.TOOL_CHOICE_MODE_REQUIRED


def test_completion_prompts() -> None:
    assert parse_completion({"prompt": "Once"}, "t").generate.text.text == "Once"
    assert parse_completion({"prompt": ["Once"]}, "t").generate.text.text == "Once"
    assert list(parse_completion({"prompt": [1, 2]}, "t").generate.tokens.token_ids) == [1, 2]
    assert list(parse_completion({"prompt": [[5]]}, "t").generate.tokens.token_ids) == [5]
    parsed = parse_completion({"prompt": "x", "logprobs": 2, "max_tokens": 4}, "t")
    assert parsed.generate.top_logprobs == 2 and parsed.generate.stopping.max_tokens == 4


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER, "temperature": "hot"}, "temperature"),
        ({"messages": USER, "temperature": 2.5}, "temperature"),
        ({"messages": USER, "frequency_penalty": 3}, "frequency_penalty"),
        ({"messages": USER, "max_tokens": True}, "max_tokens"),
        ({"messages": USER, "seed": -1}, "seed"),
        ({"messages": USER, "stop": ["a", 1]}, "stop"),
        ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": USER, "logit_bias": {"1": 5}}, "logit_bias"),
        ({"messages": USER, "response_format": {"type": "xml"}}, "response_format"),
        ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": []}}, "response_format"),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{}]}]},
            "messages[0].tool_calls[0].function",
        ),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]},
            "messages[0].tool_calls[0].id",
        ),
        ({"messages": USER, "tools": {"type": "function"}}, "tools"),
        ({"messages": USER, "tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"messages": USER, "tools": [{"function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
        ({"messages": USER, "tool_choice": "always"}, "tool_choice"),
        ({"messages": USER, "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"messages": USER, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"messages": "Hi"}, "messages"),
    ],
)
def test_chat_refusals_name_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as info:
        parse_chat(body, "t")
    assert info.value.param == param and info.value.status == 400
    assert info.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "body", [{"prompt": ""}, {"prompt": []}, {"prompt": ["a", "b"]}, {"prompt": [-1]}, {"prompt": "x", "echo": True}]
)
def test_completion_refusals(body: dict[str, Any]) -> None:
    with pytest.raises(OpenAIError):
        parse_completion(body, "t")


def test_validation_messages_map_to_body_fields() -> None:
    assert validation_param("sampling.temperature: must be >= 0", "chat") == "temperature"
    assert validation_param("stopping.max_tokens: 10 prompt tokens + ...", "chat") == "max_tokens"
    assert validation_param("input: the prompt has 9000 tokens", "completion") == "prompt"
    assert validation_param("chat: the chat template cannot render these messages", "chat") == "messages"
    assert validation_param("tokens.token_ids: id 5 is not below", "completion") == "prompt"
