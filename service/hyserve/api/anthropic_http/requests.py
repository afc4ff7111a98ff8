"""Anthropic Messages request bodies -> the gRPC `GenerateRequest` the servicer would get, so that
every front shares validation (`validation.prepare_generate`), chat rendering and checkpoints.

Pure functions: they read a decoded JSON body and raise `AnthropicError` for what the Messages API
itself would refuse or hyserve cannot honour. `metadata`, `service_tier` and other fields this
server does not use are ignored. Extension: `chat_template_kwargs` (an object passed to the chat
template, e.g. {"preserve_thinking": true}); `thinking` sets its `enable_thinking` unless given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import struct_pb2

from hyserve.api import body_fields
from hyserve.api.anthropic_http import messages, tools
from hyserve.api.anthropic_http.errors import AnthropicError
from hyserve.api.gen import hyserve_pb2 as pb

__all__ = ["DEFAULT_TEMPERATURE", "MessagesRequest", "parse_count_tokens", "parse_messages"]

DEFAULT_TEMPERATURE = 1.0  # the Messages API's default (the gRPC API's is greedy)


@dataclass(frozen=True)
class MessagesRequest:
    generate: pb.GenerateRequest
    stream: bool


def _error(message: str, field: str) -> AnthropicError:
    return AnthropicError(message)


def _number(body: dict[str, Any], name: str, lo: float, hi: float, *, lo_open: bool = False) -> float | None:
    return body_fields.number(body, name, lo, hi, _error, lo_open=lo_open)


def _integer(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    return body_fields.integer(body, name, lo, hi, _error)


def _sampling(body: dict[str, Any]) -> pb.SamplingParams:
    s = pb.SamplingParams()
    temperature = _number(body, "temperature", 0.0, 1.0)
    s.temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    if (top_p := _number(body, "top_p", 0.0, 1.0, lo_open=True)) is not None:
        s.top_p = top_p
    if (top_k := _integer(body, "top_k", 0, 2**31 - 1)) is not None:
        s.top_k = top_k
    return s


def _stopping(body: dict[str, Any]) -> pb.StoppingCriteria:
    max_tokens = _integer(body, "max_tokens", 1, 2**32 - 1)
    if max_tokens is None:
        raise AnthropicError("max_tokens: required")
    stop = body.get("stop_sequences")
    if stop is None:
        stop = []
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise AnthropicError("stop_sequences: must be an array of non-empty strings")
    return pb.StoppingCriteria(max_tokens=max_tokens, stop_strings=stop)


def _template_kwargs(body: dict[str, Any]) -> struct_pb2.Struct | None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise AnthropicError("chat_template_kwargs: must be an object")
    merged = dict(kwargs or {})
    thinking = tools.enable_thinking(body)
    if thinking is not None:
        merged.setdefault("enable_thinking", thinking)
    if not merged:
        return None
    out = struct_pb2.Struct()
    try:
        out.update(merged)
    except (TypeError, ValueError) as exc:
        raise AnthropicError(f"chat_template_kwargs: {exc}") from exc
    return out


def _chat(body: dict[str, Any]) -> pb.ChatInput:
    system = messages.system_message(body.get("system"))
    turns = messages.chat_messages(body.get("messages"))
    chat = pb.ChatInput(messages=[system, *turns] if system is not None else turns, tools=tools.tools(body))
    choice, parallel = tools.tool_choice(body)
    if choice is not None:
        chat.tool_choice.CopyFrom(choice)
    if parallel is not None:
        chat.parallel_tool_calls = parallel
    if (kwargs := _template_kwargs(body)) is not None:
        chat.chat_template_kwargs.CopyFrom(kwargs)
    return chat


def _body(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise AnthropicError("the request body must be a JSON object")
    return raw


def parse_messages(raw: Any, task_id: str) -> MessagesRequest:
    """A /v1/messages body -> a GenerateRequest with ChatInput, and whether to stream."""
    body = _body(raw)
    request = pb.GenerateRequest(task_id=task_id, chat=_chat(body), sampling=_sampling(body), stopping=_stopping(body))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise AnthropicError("stream: must be a boolean")
    return MessagesRequest(request, stream)


def parse_count_tokens(raw: Any) -> pb.GenerateRequest:
    """A /v1/messages/count_tokens body (a Messages body without max_tokens) -> what is rendered."""
    return pb.GenerateRequest(chat=_chat(_body(raw)))
