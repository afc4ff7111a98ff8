"""The Python client's messages without a server: requests built from keyword arguments, typed
events read from responses, channel options."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hyserve.api.gen import hyserve_pb2 as server_pb
from hyserve_client import (
    Accepted,
    Delta,
    Finished,
    FinishReason,
    Message,
    ReuseSource,
    Tool,
    ToolCall,
    ToolCallDelta,
    build_generate_request,
    channel_options,
)
from hyserve_client import types as client_types
from hyserve_client._gen import hyserve_pb2 as pb


def test_request_text_with_options() -> None:
    req = build_generate_request(
        "Hello",
        task_id="job-1",
        add_special=False,
        temperature=0.0,
        top_k=40,
        seed=7,
        max_tokens=16,
        stop="\n\n",
        stop_token_ids=[1, 106],
        ignore_eos=True,
        top_logprobs=3,
        cache_prompt=False,
        checkpoint_offsets=[12, 40],
    )
    assert req.task_id == "job-1"
    assert req.WhichOneof("input") == "text"
    assert req.text.text == "Hello"
    assert req.text.HasField("add_special") and not req.text.add_special
    assert not req.text.HasField("parse_special")
    assert req.sampling.HasField("temperature") and req.sampling.temperature == 0.0  # explicit zero kept
    assert req.sampling.top_k == 40 and req.sampling.seed == 7
    assert not req.sampling.HasField("top_p") and not req.sampling.HasField("min_p")
    assert req.stopping.max_tokens == 16
    assert list(req.stopping.stop_strings) == ["\n\n"]
    assert list(req.stopping.stop_token_ids) == [1, 106]
    assert req.stopping.ignore_eos
    assert req.top_logprobs == 3 and not req.logprobs
    assert req.cache.HasField("cache_prompt") and not req.cache.cache_prompt
    assert list(req.cache.checkpoint_offsets) == [12, 40]


def test_request_defaults_leave_everything_unset() -> None:
    req = build_generate_request("Hi")
    assert req.task_id == ""
    assert not req.HasField("sampling") and not req.HasField("stopping") and not req.HasField("cache")
    assert not req.text.HasField("add_special")


def test_request_tokens_and_chat() -> None:
    req = build_generate_request(token_ids=[2, 651, 1234], stop=["a", "b"])
    assert req.WhichOneof("input") == "tokens"
    assert list(req.tokens.token_ids) == [2, 651, 1234]
    assert list(req.stopping.stop_strings) == ["a", "b"]
    assert build_generate_request(token_ids=[]).WhichOneof("input") == "tokens"  # the server rejects it

    req = build_generate_request(
        messages=[
            Message("system", "Be brief."),
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello", "reasoning_content": "greet back"},
        ],
        add_generation_prompt=True,
        chat_template_kwargs={"enable_thinking": False, "tools": [{"name": "f"}]},
    )
    assert req.WhichOneof("input") == "chat"
    assert [(m.role, m.content) for m in req.chat.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello"),
    ]
    assert req.chat.messages[2].reasoning_content == "greet back"
    assert not req.chat.messages[0].HasField("name")
    assert req.chat.add_generation_prompt
    kwargs = req.chat.chat_template_kwargs
    assert kwargs.fields["enable_thinking"].WhichOneof("kind") == "bool_value"  # a bool, not the string "false"
    assert kwargs.fields["tools"].list_value.values[0].struct_value.fields["name"].string_value == "f"


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {}, ValueError),
        (("a",), {"token_ids": [1]}, ValueError),
        ((), {"token_ids": [1], "add_special": True}, ValueError),
        (("a",), {"add_generation_prompt": True}, ValueError),
        (("a",), {"temprature": 0.5}, TypeError),
        ((), {"messages": [{"role": "user", "content": "x", "images": []}]}, ValueError),
        (("a",), {"tools": [Tool("f")]}, ValueError),
        (("a",), {"tool_choice": "auto"}, ValueError),
        (("a",), {"parse_output": False}, ValueError),
        (("a",), {"json_object": True, "regex": "a+"}, ValueError),
        (("a",), {"json_schema": {}, "grammar": "start: /a/"}, ValueError),
        ((), {"messages": [Message("user", "x")], "tools": Tool("f")}, ValueError),
        ((), {"messages": [Message("user", "x")], "tool_choice": "get_weather"}, ValueError),
        ((), {"messages": [Message("user", "x")], "tool_choice": {"type": "function"}}, ValueError),
        ((), {"messages": [Message("user", "x")], "tools": [{"type": "web_search"}]}, ValueError),
        ((), {"messages": [Message("user", "x")], "tools": [{"description": "no name"}]}, ValueError),
        ((), {"messages": [{"role": "assistant", "tool_calls": {"name": "f"}}]}, ValueError),
    ],
)
def test_request_rejects_client_mistakes(args: tuple[Any, ...], kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        build_generate_request(*args, **kwargs)


WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_request_constraints() -> None:
    req = build_generate_request("x", json_schema=WEATHER_SCHEMA, temperature=0.5)
    assert req.sampling.constraint.WhichOneof("kind") == "json_schema"
    assert json.loads(req.sampling.constraint.json_schema) == WEATHER_SCHEMA
    assert req.sampling.HasField("temperature")  # the constraint joins the other sampling settings
    text = '{"type": "integer"}'
    assert build_generate_request("x", json_schema=text).sampling.constraint.json_schema == text  # JSON text kept
    req = build_generate_request("x", json_object=True)
    assert req.sampling.constraint.WhichOneof("kind") == "json_object" and req.sampling.constraint.json_object
    assert not req.sampling.HasField("temperature")
    assert build_generate_request("x", regex=r"\d+").sampling.constraint.regex == r"\d+"
    grammar = 'start: "yes" | "no"'
    assert build_generate_request(token_ids=[1], grammar=grammar).sampling.constraint.grammar == grammar
    assert not build_generate_request("x", json_object=False).HasField("sampling")  # False: no constraint


def test_request_tools_and_tool_messages() -> None:
    openai_tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather of a city", "parameters": WEATHER_SCHEMA},
    }
    req = build_generate_request(
        messages=[
            Message("user", "Weather in Paris?"),
            Message("assistant", tool_calls=[ToolCall("call_1", "get_weather", '{"city": "Paris"}')]),
            Message("tool", '{"temp_c": 21}', tool_call_id="call_1"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                    {"id": "call_3", "name": "get_weather", "arguments": {"city": "Nice"}},
                ],
            },
            {"role": "tool", "content": "12:00", "tool_call_id": "call_2", "name": "get_time"},
        ],
        tools=[openai_tool, Tool("get_time", "The time now"), {"name": "noop"}],
        tool_choice={"function": "get_weather"},
        parallel_tool_calls=False,
        parse_output=True,
    )
    chat = req.chat
    assert [(t.name, t.description) for t in chat.tools] == [
        ("get_weather", "Weather of a city"),
        ("get_time", "The time now"),
        ("noop", ""),
    ]
    assert json.loads(chat.tools[0].parameters_json) == WEATHER_SCHEMA
    assert chat.tools[1].parameters_json == "" and chat.tools[2].parameters_json == ""  # no arguments
    assert chat.tool_choice.WhichOneof("choice") == "function" and chat.tool_choice.function == "get_weather"
    assert chat.HasField("parallel_tool_calls") and not chat.parallel_tool_calls
    assert chat.HasField("parse_output") and chat.parse_output
    m = chat.messages
    assert m[1].content == "" and [(c.id, c.name, c.arguments_json) for c in m[1].tool_calls] == [
        ("call_1", "get_weather", '{"city": "Paris"}')
    ]
    assert m[2].tool_call_id == "call_1" and not m[1].HasField("tool_call_id")
    assert [(c.id, c.name) for c in m[3].tool_calls] == [("call_2", "get_time"), ("call_3", "get_weather")]
    assert m[3].tool_calls[0].arguments_json == "{}"
    assert json.loads(m[3].tool_calls[1].arguments_json) == {"city": "Nice"}
    assert m[4].tool_call_id == "call_2" and m[4].name == "get_time"

    for choice, mode in (("auto", pb.TOOL_CHOICE_MODE_AUTO), ("none", pb.TOOL_CHOICE_MODE_NONE)):
        chat = build_generate_request(messages=[Message("user", "x")], tool_choice=choice).chat
        assert chat.tool_choice.mode == mode
    openai_choice = {"type": "function", "function": {"name": "f"}}
    chat = build_generate_request(messages=[Message("user", "x")], tool_choice=openai_choice).chat
    assert chat.tool_choice.function == "f"
    chat = build_generate_request(messages=[Message("user", "x")], tool_choice="required").chat
    assert chat.tool_choice.mode == pb.TOOL_CHOICE_MODE_REQUIRED
    chat = build_generate_request(messages=[Message("user", "x")]).chat
    assert not chat.tools and not chat.HasField("tool_choice")
    assert not chat.HasField("parallel_tool_calls") and not chat.HasField("parse_output")  # server defaults


def test_request_wire_compatible_with_server_copy() -> None:
    req = build_generate_request("x", temperature=0.5)
    parsed = server_pb.GenerateRequest.FromString(req.SerializeToString())
    assert parsed.sampling.HasField("temperature") and parsed.sampling.temperature == 0.5
    assert not parsed.sampling.HasField("top_p")


def test_events_from_proto() -> None:
    accepted = client_types.event_from_proto(
        pb.GenerateResponse(
            accepted=pb.Accepted(
                task_id="t", slot_index=1, prompt_tokens=10, reused_tokens=8, reuse_source=3, matched_tokens=9
            )
        )
    )
    assert accepted == Accepted("t", 1, 10, 8, ReuseSource.CHECKPOINT, 9)
    delta = client_types.event_from_proto(
        pb.GenerateResponse(
            delta=pb.Delta(
                token_ids=[5],
                text="é",
                logprobs=[
                    pb.TokenLogprob(
                        token_id=5, logprob=-0.5, piece=b"\xc3", top_logprobs=[pb.TopLogprob(token_id=6, logprob=-1.0)]
                    )
                ],
            )
        )
    )
    assert isinstance(delta, Delta) and delta.token_ids == (5,) and delta.text == "é"
    assert delta.logprobs[0].piece == b"\xc3" and delta.logprobs[0].top_logprobs[0].token_id == 6
    finished = client_types.event_from_proto(
        pb.GenerateResponse(finished=pb.Finished(reason=pb.FINISH_REASON_STOP_STRING, stop_string="END"))
    )
    assert isinstance(finished, Finished)
    assert finished.reason is FinishReason.STOP_STRING and finished.stop_string == "END"
    assert finished.stop_token_id is None
    assert delta.reasoning == "" and delta.tool_calls == ()
    assert client_types.event_from_proto(pb.GenerateResponse()) is None
    # A value added to the enum by a newer server reads as UNSPECIFIED instead of failing.
    assert client_types.enum_from_proto(client_types.FinishReason, 99) is FinishReason.UNSPECIFIED


def test_reasoning_and_tool_call_events() -> None:
    delta = client_types.event_from_proto(
        pb.GenerateResponse(
            delta=pb.Delta(
                token_ids=[7, 8],
                reasoning="Paris is a city.",
                tool_calls=[
                    pb.ToolCallDelta(index=0, id="call_1", name="get_weather"),
                    pb.ToolCallDelta(index=0, arguments_fragment='{"city": '),
                ],
            )
        )
    )
    assert isinstance(delta, Delta) and delta.text == "" and delta.reasoning == "Paris is a city."
    assert delta.tool_calls == (
        ToolCallDelta(0, "call_1", "get_weather", ""),
        ToolCallDelta(0, "", "", '{"city": '),
    )
    finished = client_types.event_from_proto(
        pb.GenerateResponse(
            finished=pb.Finished(
                reason=pb.FINISH_REASON_TOOL_CALLS,
                tool_calls=[pb.ToolCall(id="call_1", name="get_weather", arguments_json='{"city": "Paris"}')],
            )
        )
    )
    assert isinstance(finished, Finished) and finished.reason is FinishReason.TOOL_CALLS
    assert finished.tool_calls == (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)
    assert finished.tool_calls[0].arguments() == {"city": "Paris"}
    assert ToolCall("call_2", "get_time").arguments() == {}
    # a call read back from a Finished event goes into the next request's assistant message as it is
    req = build_generate_request(messages=[Message("assistant", tool_calls=finished.tool_calls)])
    assert req.chat.messages[0].tool_calls[0] == pb.ToolCall(
        id="call_1", name="get_weather", arguments_json='{"city": "Paris"}'
    )


def test_channel_options() -> None:
    opts = dict(channel_options())
    assert opts["grpc.max_receive_message_length"] == 64 * 1024 * 1024
    assert opts["grpc.keepalive_time_ms"] == 60_000
    assert opts["grpc.http2.max_pings_without_data"] == 0
    assert dict(channel_options(extra=[("grpc.keepalive_time_ms", 300_000)]))["grpc.keepalive_time_ms"] == 300_000
