"""Unit: Anthropic Messages bodies -> GenerateRequest, the billing-line normalisation, content-block
events from chat pieces, and the error shapes. No model, no server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hyserve.api.anthropic_http.errors import AnthropicError, error_type, field_message
from hyserve.api.anthropic_http.messages import drop_billing_lines
from hyserve.api.anthropic_http.requests import parse_count_tokens, parse_messages
from hyserve.api.anthropic_http.responses import ContentBlocks, MessageContent, stop_reason, usage_json
from hyserve.api.chat_output import ChatPiece, ParsedCall, ToolCallPiece
from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.api.http_auth import http_token
from hyserve.engine.task import FinishReason

BILLING = "x-anthropic-billing-header: cc_version=2.1.3.abc; cc_entrypoint=cli; cch=1a2b3;"


def parse(**body: Any) -> pb.GenerateRequest:
    base: dict[str, Any] = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    return parse_messages({**base, **body}, "msg_1").generate


def roles(request: pb.GenerateRequest) -> list[str]:
    return [m.role for m in request.chat.messages]


# --- the billing line -----------------------------------------------------------------------------


def test_billing_lines_are_dropped_whole() -> None:
    assert drop_billing_lines(f"{BILLING}\nYou are helpful.") == "You are helpful."
    assert drop_billing_lines(f"Intro\n{BILLING}\nRest") == "Intro\nRest"
    assert drop_billing_lines(f"Intro\r\n  {BILLING.upper()}\r\nRest") == "Intro\r\nRest"
    assert drop_billing_lines(f"Intro\n{BILLING}") == "Intro\n"
    assert drop_billing_lines("no header: x-anthropic-billing-header: inline") == (
        "no header: x-anthropic-billing-header: inline"
    )


def test_system_prompts_differing_only_in_the_billing_line_are_equal() -> None:
    def system(cch: str) -> list[dict[str, str]]:
        return [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1; cch={cch};"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}},
        ]

    a, b = parse(system=system("aaaa")), parse(system=system("bbbb"))
    assert a.chat.messages[0] == b.chat.messages[0]
    assert a.chat.messages[0] == pb.ChatMessage(role="system", content="You are an agent.")
    assert roles(parse(system=[{"type": "text", "text": BILLING}])) == ["user"]  # nothing left: no system message


# --- messages -------------------------------------------------------------------------------------


def test_defaults_sampling_and_stopping() -> None:
    request = parse()
    assert request.task_id == "msg_1"
    assert request.sampling.temperature == 1.0 and not request.sampling.HasField("top_p")
    assert request.stopping.max_tokens == 16 and list(request.stopping.stop_strings) == []
    request = parse(temperature=0, top_p=0.5, top_k=7, stop_sequences=["END", "\n\n"], stream=True)
    assert (request.sampling.temperature, request.sampling.top_p, request.sampling.top_k) == (0.0, 0.5, 7)
    assert list(request.stopping.stop_strings) == ["END", "\n\n"]
    assert parse_messages({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "stream": True}, "t").stream


def test_system_string_and_blocks() -> None:
    assert parse(system="Be terse.").chat.messages[0] == pb.ChatMessage(role="system", content="Be terse.")
    blocks = [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}]
    assert parse(system=blocks).chat.messages[0].content == "One.\nTwo."
    assert roles(parse(system="Be terse.")) == ["system", "user"]


def test_tool_use_and_tool_result_round_trip() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xxx"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Lyon"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "20 C"}]},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    request = parse(messages=messages)
    assert roles(request) == ["user", "assistant", "tool", "tool", "user"]
    assistant = request.chat.messages[1]
    assert assistant.content == "Let me look." and assistant.reasoning_content == "Use the tool."
    assert [(c.id, c.name, json.loads(c.arguments_json)) for c in assistant.tool_calls] == [
        ("toolu_1", "weather", {"city": "Paris"}),
        ("toolu_2", "weather", {"city": "Lyon"}),
    ]
    assert [(m.tool_call_id, m.content) for m in request.chat.messages[2:4]] == [
        ("toolu_1", "18 C"),
        ("toolu_2", "20 C"),
    ]
    assert request.chat.messages[4].content == "And tomorrow?"
    # a user turn of tool results only adds no empty user message
    only_results = [*messages[:2], {**messages[2], "content": messages[2]["content"][:2]}]
    assert roles(parse(messages=only_results)) == ["user", "assistant", "tool", "tool"]
    assert not parse(messages=messages[:1]).chat.messages[0].HasField("reasoning_content")


def test_tools_tool_choice_and_thinking() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [{"name": "weather", "description": "Current weather", "input_schema": schema}]
    request = parse(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert [(t.name, t.description, json.loads(t.parameters_json)) for t in request.chat.tools] == [
        ("weather", "Current weather", schema)
    ]
    assert request.chat.tool_choice.mode == pb.TOOL_CHOICE_MODE_REQUIRED
    assert request.chat.HasField("parallel_tool_calls") and not request.chat.parallel_tool_calls
    assert parse(tools=tools, tool_choice={"type": "tool", "name": "weather"}).chat.tool_choice.function == "weather"
    assert parse(tool_choice={"type": "none"}).chat.tool_choice.mode == pb.TOOL_CHOICE_MODE_NONE
    assert parse(tool_choice={"type": "auto"}).chat.tool_choice.mode == pb.TOOL_CHOICE_MODE_AUTO
    assert not parse(tool_choice={"type": "auto"}).chat.HasField("parallel_tool_calls")

    def kwargs(**body: Any) -> dict[str, Any]:
        request = parse(**body)
        return dict(request.chat.chat_template_kwargs) if request.chat.HasField("chat_template_kwargs") else {}

    assert kwargs() == {}
    assert kwargs(thinking={"type": "enabled", "budget_tokens": 2048}) == {"enable_thinking": True}
    assert kwargs(thinking={"type": "disabled"}) == {"enable_thinking": False}
    assert kwargs(chat_template_kwargs={"preserve_thinking": True}) == {"preserve_thinking": True}
    both = kwargs(thinking={"type": "enabled"}, chat_template_kwargs={"enable_thinking": False})
    assert both == {"enable_thinking": False}  # the explicit template variable wins
    assert parse(metadata={"user_id": "u"}, service_tier="auto") == parse()


def test_count_tokens_needs_no_max_tokens() -> None:
    request = parse_count_tokens({"model": "m", "system": "S", "messages": [{"role": "user", "content": "hi"}]})
    assert roles(request) == ["system", "user"] and not request.HasField("stopping")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "messages[0].content[0].tool_use_id"),
        (
            {
                "messages": [
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": 1}]}
                ]
            },
            "messages[0].content[0].input",
        ),
        ({"system": [{"type": "image"}]}, "system[0]"),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"thinking": {"type": "maybe"}}, "thinking"),
        ({"chat_template_kwargs": [1]}, "chat_template_kwargs"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_bad_bodies_name_the_field(change: dict[str, Any], field: str) -> None:
    body: dict[str, Any] = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **change}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(AnthropicError) as info:
        parse_messages(body, "t")
    assert info.value.status == 400 and info.value.message.startswith(field + ":"), info.value.message
    assert info.value.body() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": info.value.message},
    }


def test_not_an_object() -> None:
    with pytest.raises(AnthropicError, match="JSON object"):
        parse_messages([1], "t")


# --- errors ---------------------------------------------------------------------------------------


def test_error_types_and_validation_fields() -> None:
    assert [error_type(s) for s in (400, 401, 403, 404, 413, 429, 500, 503, 529)] == [
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
        "overloaded_error",
    ]
    assert field_message("stopping.max_tokens: too many") == "max_tokens: too many"
    assert field_message("stopping.stop_strings[0]: too long") == "stop_sequences: too long"
    assert field_message("sampling.top_k: must be >= 0") == "top_k: must be >= 0"
    assert field_message("chat.tools[2].name: bad") == "tools[2].name: bad"
    assert field_message("chat.tool_choice.function: 'x' is not one of chat.tools") == (
        "tool_choice: 'x' is not one of chat.tools"
    )
    assert field_message("chat.messages[3].tool_call_id: unknown") == "messages: chat.messages[3].tool_call_id: unknown"
    assert field_message("input: the prompt has 2000 tokens") == "messages: the prompt has 2000 tokens"
    assert field_message("no field here") == "no field here"


def test_http_token_takes_bearer_then_x_api_key() -> None:
    assert http_token({"Authorization": "Bearer abc"}) == "abc"
    assert http_token({"x-api-key": " key "}) == "key"
    assert http_token({"Authorization": "Bearer abc", "x-api-key": "key"}) == "abc"
    assert http_token({"Authorization": "Basic abc"}) is None
    assert http_token({}) is None and http_token({"x-api-key": ""}) is None


# --- responses ------------------------------------------------------------------------------------


def test_stop_reasons_and_usage() -> None:
    assert stop_reason(FinishReason.EOS, False) == "end_turn"
    assert stop_reason(FinishReason.EOS, True) == "tool_use"
    assert stop_reason(FinishReason.STOP_STRING, False) == "stop_sequence"
    assert stop_reason(FinishReason.MAX_TOKENS, True) == "max_tokens"
    assert stop_reason(FinishReason.CONTEXT_FULL, False) == "max_tokens"
    assert usage_json(100, 80, 7) == {
        "input_tokens": 20,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 80,
        "output_tokens": 7,
    }


def test_pieces_become_blocks_a_new_one_when_the_kind_changes() -> None:
    blocks = ContentBlocks()
    events = blocks.push(ChatPiece(reasoning="Think"))
    events += blocks.push(ChatPiece(reasoning="ing."))
    events += blocks.push(ChatPiece(content="Hello"))
    events += blocks.push(ChatPiece())
    events += blocks.push(ChatPiece(content=" there.", tool_calls=(ToolCallPiece(0, "call_a", "weather", '{"ci'),)))
    events += blocks.push(ChatPiece(tool_calls=(ToolCallPiece(0, arguments='ty": "Paris"}'),)))
    events += blocks.push(ChatPiece(tool_calls=(ToolCallPiece(1, "call_b", "weather"),)))
    calls = (ParsedCall("call_a", "weather", '{"city": "Paris"}'), ParsedCall("call_b", "weather", '{"city": "Lyon"}'))
    events += blocks.finish(ChatPiece(tool_calls=(ToolCallPiece(1, arguments='{"city": "Lyon"}'),)), calls)
    names = [name for name, _ in events]
    assert names == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    assert [data["index"] for _, data in events] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 3
    assert events[0][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[9][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"ci'}
    content = MessageContent()
    content.add(events)
    assert content.result(calls) == [
        {"type": "thinking", "thinking": "Thinking.", "signature": ""},
        {"type": "text", "text": "Hello there."},
        {"type": "tool_use", "id": "call_a", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_b", "name": "weather", "input": {"city": "Lyon"}},
    ]


def test_calls_only_known_at_the_end_still_become_blocks() -> None:
    blocks = ContentBlocks()
    events = blocks.push(ChatPiece(content="Calling."))
    calls = (ParsedCall("call_x", "f", '{"a": 1}'),)
    events += blocks.finish(ChatPiece(), calls)
    content = MessageContent()
    content.add(events)
    assert content.result(calls) == [
        {"type": "text", "text": "Calling."},
        {"type": "tool_use", "id": "call_x", "name": "f", "input": {"a": 1}},
    ]
    assert ContentBlocks().finish(ChatPiece(), ()) == []
