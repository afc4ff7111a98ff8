"""OpenAI request bodies -> the gRPC `GenerateRequest` the servicer would get, so that both fronts
share validation (`validation.prepare_generate`), chat rendering and message-start checkpoints.

Pure functions: they read a decoded JSON body and raise `OpenAIError` (OpenAI's error shape, with
`param` naming the offending field) for what OpenAI itself would refuse or hyserve cannot honour.
Fields this server does not use (user, metadata, store, ...) are ignored, as OpenAI
ignores unknown ones. Extensions used by vLLM / llama-server clients: top_k, min_p,
repetition_penalty, ignore_eos, chat_template_kwargs, cache_prompt, return_token_ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from google.protobuf import struct_pb2

from hyserve.api import body_fields
from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.api.openai_http import chat_tools
from hyserve.api.openai_http.errors import OpenAIError

__all__ = ["OpenAIError", "OpenAIRequest", "parse_chat", "parse_completion", "validation_param"]

# OpenAI's default when temperature is unset (the gRPC API's default is greedy)
DEFAULT_TEMPERATURE = 1.0
MAX_TOP_LOGPROBS = 20
_ROLES = {"system", "developer", "user", "assistant", "tool"}


@dataclass(frozen=True)
class OpenAIRequest:
    kind: Literal["chat", "completion"]
    generate: pb.GenerateRequest
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    return_token_ids: bool  # vLLM's extension: prompt_token_ids and per-choice token_ids
    logprobs: bool
    top_logprobs: int


def _error(message: str, field: str) -> OpenAIError:
    return OpenAIError(message, field)


def _number(body: dict[str, Any], name: str, lo: float, hi: float, *, lo_open: bool = False) -> float | None:
    return body_fields.number(body, name, lo, hi, _error, lo_open=lo_open)


def _integer(body: dict[str, Any], name: str, lo: int, hi: int | None = None) -> int | None:
    return body_fields.integer(body, name, lo, hi, _error)


def _boolean(body: dict[str, Any], name: str) -> bool | None:
    return body_fields.boolean(body, name, _error)


def _sampling(body: dict[str, Any]) -> pb.SamplingParams:
    s = pb.SamplingParams()
    temperature = _number(body, "temperature", 0.0, 2.0)
    s.temperature = DEFAULT_TEMPERATURE if temperature is None else temperature
    if (top_p := _number(body, "top_p", 0.0, 1.0, lo_open=True)) is not None:
        s.top_p = top_p
    for name in ("presence_penalty", "frequency_penalty"):
        if (value := _number(body, name, -2.0, 2.0)) is not None:
            setattr(s, name, value)
    if (min_p := _number(body, "min_p", 0.0, 1.0)) is not None:
        s.min_p = min_p
    if (rep := _number(body, "repetition_penalty", 0.0, math.inf, lo_open=True)) is not None:
        s.repetition_penalty = rep
    if (top_k := _integer(body, "top_k", -1)) is not None:
        s.top_k = max(top_k, 0)  # vLLM spells "no limit" -1
    if (seed := _integer(body, "seed", 0, 2**64 - 1)) is not None:
        s.seed = seed
    return s


def _speculative(body: dict[str, Any]) -> pb.SpeculativeOptions | None:
    """hyserve's extension `speculative`: a boolean, or {"enabled": bool, "max_draft": int}."""
    value = body.get("speculative")
    if value is None:
        return None
    if isinstance(value, bool):
        return pb.SpeculativeOptions(enabled=value)
    if not isinstance(value, dict):
        raise OpenAIError('speculative: must be a boolean or {"enabled": ..., "max_draft": ...}', "speculative")
    out = pb.SpeculativeOptions()

    def error(message: str, _field: str) -> OpenAIError:
        return OpenAIError(f"speculative.{message}", "speculative")

    if (enabled := body_fields.boolean(value, "enabled", error)) is not None:
        out.enabled = enabled
    if (max_draft := body_fields.integer(value, "max_draft", 1, 2**32 - 1, error)) is not None:
        out.max_draft = max_draft
    return out


def _stop_strings(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise OpenAIError("stop: must be a string or an array of strings", "stop")
    if any(not s for s in items):
        raise OpenAIError("stop: stop strings must not be empty", "stop")
    return items


def _stopping(body: dict[str, Any], max_tokens_names: tuple[str, ...]) -> pb.StoppingCriteria:
    stopping = pb.StoppingCriteria(stop_strings=_stop_strings(body))
    for name in max_tokens_names:
        if (n := _integer(body, name, 1, 2**32 - 1)) is not None:
            stopping.max_tokens = n
            break
    stopping.ignore_eos = bool(_boolean(body, "ignore_eos"))
    return stopping


def _refuse_unsupported(body: dict[str, Any]) -> None:
    if (n := _integer(body, "n", 1)) is not None and n != 1:
        raise OpenAIError("n: only n=1 is supported", "n")
    if body.get("logit_bias"):
        raise OpenAIError("logit_bias: not supported by this server", "logit_bias")


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise OpenAIError("stream_options: only allowed when stream is true", "stream_options")
    if not isinstance(options, dict):
        raise OpenAIError("stream_options: must be an object", "stream_options")
    return bool(_boolean(options, "include_usage"))


def _common(body: dict[str, Any], request: pb.GenerateRequest, task_id: str) -> None:
    request.task_id = task_id
    request.sampling.CopyFrom(_sampling(body))
    if (constraint := chat_tools.constraint(body)) is not None:
        request.sampling.constraint.CopyFrom(constraint)
    if (speculative := _speculative(body)) is not None:
        request.speculative.CopyFrom(speculative)
    cache_prompt = _boolean(body, "cache_prompt")
    if cache_prompt is not None:
        request.cache.cache_prompt = cache_prompt


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise OpenAIError(f"{where}[{j}]: only text parts are supported", where)
            texts.append(part["text"])
        return "\n".join(texts)
    raise OpenAIError(f"{where}: must be a string or an array of text parts", where)


def _chat_message(i: int, message: Any) -> pb.ChatMessage:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise OpenAIError(f"{where}: must be an object", where)
    role = message.get("role")
    if role not in _ROLES:
        raise OpenAIError(f"{where}.role: must be one of {sorted(_ROLES)}", f"{where}.role")
    out = pb.ChatMessage(
        role="system" if role == "developer" else role,
        content=_content_text(message.get("content"), f"{where}.content"),
        tool_calls=chat_tools.message_tool_calls(message, where),
    )
    for name in ("name", "reasoning_content", "tool_call_id"):
        value = message.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise OpenAIError(f"{where}.{name}: must be a string", f"{where}.{name}")
            setattr(out, name, value)
    return out


def _chat_kwargs(body: dict[str, Any]) -> struct_pb2.Struct | None:
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise OpenAIError("chat_template_kwargs: must be an object", "chat_template_kwargs")
    merged = dict(kwargs or {})
    if not merged:
        return None
    out = struct_pb2.Struct()
    try:
        out.update(merged)
    except (TypeError, ValueError) as exc:
        raise OpenAIError(f"chat_template_kwargs: {exc}", "chat_template_kwargs") from exc
    return out


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    _refuse_unsupported(body)
    return body


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = bool(_boolean(body, "stream"))
    return stream, _stream_options(body, stream)


def parse_chat(raw: Any, task_id: str) -> OpenAIRequest:
    """A /v1/chat/completions body -> a GenerateRequest with ChatInput (rendered like gRPC chat)."""
    body = _body(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise OpenAIError("messages: must be a non-empty array", "messages")
    request = pb.GenerateRequest(
        chat=pb.ChatInput(messages=[_chat_message(i, m) for i, m in enumerate(messages)], tools=chat_tools.tools(body))
    )
    if (kwargs := _chat_kwargs(body)) is not None:
        request.chat.chat_template_kwargs.CopyFrom(kwargs)
    if (choice := chat_tools.tool_choice(body)) is not None:
        request.chat.tool_choice.CopyFrom(choice)
    if (parallel := _boolean(body, "parallel_tool_calls")) is not None:
        request.chat.parallel_tool_calls = parallel
    _common(body, request, task_id)
    request.stopping.CopyFrom(_stopping(body, ("max_completion_tokens", "max_tokens")))
    logprobs = bool(_boolean(body, "logprobs"))
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    if top and not logprobs:
        raise OpenAIError("top_logprobs: requires logprobs to be true", "top_logprobs")
    request.logprobs, request.top_logprobs = logprobs, top
    stream, include_usage = _stream(body)
    return OpenAIRequest(
        "chat", request, stream, include_usage, bool(_boolean(body, "return_token_ids")), logprobs, top
    )


def _prompt(prompt: Any) -> pb.GenerateRequest:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise OpenAIError("prompt: must not be empty", "prompt")
        return pb.GenerateRequest(text=pb.TextInput(text=prompt))
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(t < 0 for t in prompt):
            raise OpenAIError("prompt: token ids must be >= 0", "prompt")
        return pb.GenerateRequest(tokens=pb.TokenInput(token_ids=prompt))
    raise OpenAIError("prompt: must be a non-empty string or array of token ids (one prompt per request)", "prompt")


def parse_completion(raw: Any, task_id: str) -> OpenAIRequest:
    """A /v1/completions body -> a GenerateRequest with text (BOS added as the model asks) or tokens."""
    body = _body(raw)
    if body.get("echo"):
        raise OpenAIError("echo: not supported by this server", "echo")
    if body.get("suffix"):
        raise OpenAIError("suffix: not supported by this server", "suffix")
    if (best_of := _integer(body, "best_of", 1)) is not None and best_of != 1:
        raise OpenAIError("best_of: only 1 is supported", "best_of")
    request = _prompt(body.get("prompt"))
    _common(body, request, task_id)
    request.stopping.CopyFrom(_stopping(body, ("max_tokens",)))
    top = _integer(body, "logprobs", 0, 5)  # completions: an int, the number of alternatives
    if top is not None:
        request.logprobs, request.top_logprobs = True, top
    stream, include_usage = _stream(body)
    return OpenAIRequest(
        "completion",
        request,
        stream,
        include_usage,
        bool(_boolean(body, "return_token_ids")),
        top is not None,
        top or 0,
    )


# hyserve's validation messages name GenerateRequest fields; OpenAI's `param` names the body's.
_PARAMS = {
    "stopping.max_tokens": "max_tokens",
    "stopping.stop_strings": "stop",
    "stopping.stop_token_ids": "stop",
    "tokens.token_ids": "prompt",
    "text.text": "prompt",
    "chat.chat_template_kwargs": "chat_template_kwargs",
    "chat.messages": "messages",
    "chat.tools": "tools",
    "chat.tool_choice": "tool_choice",
    "chat.tool_choice.function": "tool_choice",
    "chat.tool_choice.mode": "tool_choice",
    "chat": "messages",
    "top_logprobs": "top_logprobs",
    "task_id": None,
    "speculative.max_draft": "speculative",
}


def validation_param(message: str, kind: Literal["chat", "completion"]) -> str | None:
    """The body field a hyserve validation message is about (its text starts with the proto field)."""
    field = message.split(":", 1)[0].split("[", 1)[0]
    if field == "input":
        return "messages" if kind == "chat" else "prompt"
    if field.startswith("sampling.constraint"):
        return "response_format"
    if field.startswith("sampling."):
        return field.removeprefix("sampling.")
    return _PARAMS.get(field, field if field.isidentifier() else None)
