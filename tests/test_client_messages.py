"""The Python client's messages without a server: requests built from keyword arguments, typed
events read from responses, channel options."""

from __future__ import annotations

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
        ((), {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, ValueError),
    ],
)
def test_request_rejects_client_mistakes(args: tuple[Any, ...], kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        build_generate_request(*args, **kwargs)


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
    assert client_types.event_from_proto(pb.GenerateResponse()) is None
    # A value added to the enum by a newer server reads as UNSPECIFIED instead of failing.
    assert client_types.enum_from_proto(client_types.FinishReason, 99) is FinishReason.UNSPECIFIED


def test_channel_options() -> None:
    opts = dict(channel_options())
    assert opts["grpc.max_receive_message_length"] == 64 * 1024 * 1024
    assert opts["grpc.keepalive_time_ms"] == 60_000
    assert opts["grpc.http2.max_pings_without_data"] == 0
    assert dict(channel_options(extra=[("grpc.keepalive_time_ms", 300_000)]))["grpc.keepalive_time_ms"] == 300_000
