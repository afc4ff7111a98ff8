"""Building GenerateRequest messages from keyword arguments (no network involved)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from hyserve_client._gen import hyserve_pb2 as pb
from hyserve_client.tools import (
    CONSTRAINT_KINDS,
    Tool,
    ToolCall,
    ToolChoiceSpec,
    constraint_to_proto,
    tool_call_to_proto,
    tool_choice_to_proto,
    tool_to_proto,
)

__all__ = ["GenerateParams", "Message", "build_generate_request"]


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message; plain mappings with the same keys are accepted too.

    `tool_calls`: the calls an assistant message made (ToolCall, or OpenAI-shaped mappings whose
    arguments are a mapping or JSON text); `tool_call_id`: the call a "tool" message answers.
    """

    role: str
    content: str = ""
    name: str | None = None
    reasoning_content: str | None = None
    tool_calls: Sequence[ToolCall | Mapping[str, Any]] = ()
    tool_call_id: str | None = None


class GenerateParams(TypedDict, total=False):
    """Optional settings of a Generate call; each maps to the proto field of the same name.

    Unset keys leave the field unset, so the server's default applies (documented in the proto).
    """

    task_id: str
    # TextInput options
    add_special: bool
    parse_special: bool
    # ChatInput options
    add_generation_prompt: bool
    chat_template_kwargs: Mapping[str, Any]
    tools: Iterable[Tool | Mapping[str, Any]]  # Tool, or OpenAI's {"type": "function", "function": {...}}
    tool_choice: ToolChoiceSpec  # "auto", "none", "required" or {"function": name}
    parallel_tool_calls: bool
    parse_output: bool
    # SamplingParams
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int
    # SamplingParams.constraint: at most one of these
    json_schema: Mapping[str, Any] | str  # a JSON Schema, as a mapping or JSON text
    json_object: bool  # True: any JSON object
    regex: str
    grammar: str  # Lark (llguidance dialect)
    # StoppingCriteria
    max_tokens: int
    stop: str | Sequence[str]
    stop_token_ids: Sequence[int]
    ignore_eos: bool
    # logprobs
    logprobs: bool
    top_logprobs: int
    # CacheOptions
    cache_prompt: bool
    checkpoint_offsets: Sequence[int]
    # SpeculativeOptions
    speculative: bool
    spec_max_draft: int


_SAMPLING = frozenset(
    (
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
    )
)
_CHAT = ("add_generation_prompt", "chat_template_kwargs", "tools", "tool_choice", "parallel_tool_calls", "parse_output")
_KNOWN = frozenset(GenerateParams.__annotations__)


def build_generate_request(
    text: str | None = None,
    *,
    token_ids: Sequence[int] | None = None,
    messages: Sequence[Message | Mapping[str, Any]] | None = None,
    **params: Unpack[GenerateParams],
) -> pb.GenerateRequest:
    """Build a GenerateRequest. Give exactly one input: `text`, `token_ids` or chat `messages`.

    Only obvious client-side mistakes are rejected here (no input or several, options for another
    input kind, several constraints, unknown keywords); the server validates values and answers
    INVALID_ARGUMENT.
    """
    unknown = params.keys() - _KNOWN
    if unknown:
        raise TypeError(f"unknown generate option(s): {', '.join(sorted(unknown))}")
    given = [
        name for name, value in (("text", text), ("token_ids", token_ids), ("messages", messages)) if value is not None
    ]
    if len(given) != 1:
        raise ValueError(f"give exactly one of text, token_ids or messages (got {', '.join(given) or 'none'})")

    req = pb.GenerateRequest(task_id=params.get("task_id", ""))
    text_opts = [k for k in ("add_special", "parse_special") if k in params]
    chat_opts = [k for k in _CHAT if k in params]
    if text is not None:
        req.text.text = text
        if "add_special" in params:
            req.text.add_special = params["add_special"]
        if "parse_special" in params:
            req.text.parse_special = params["parse_special"]
    elif text_opts:
        raise ValueError(f"{', '.join(text_opts)} only apply to text input")
    if token_ids is not None:
        req.tokens.token_ids.extend(int(t) for t in token_ids)
        if not token_ids:
            req.tokens.SetInParent()  # keep the oneof set: the server reports the empty prompt
    if messages is not None:
        req.chat.SetInParent()
        req.chat.messages.extend(_chat_message(m) for m in messages)
        if "add_generation_prompt" in params:
            req.chat.add_generation_prompt = params["add_generation_prompt"]
        if "chat_template_kwargs" in params:
            req.chat.chat_template_kwargs.update(dict(params["chat_template_kwargs"]))
        _tool_options(req.chat, params)
    elif chat_opts:
        raise ValueError(f"{', '.join(chat_opts)} only apply to chat messages")

    sampling: dict[str, Any] = {k: v for k, v in params.items() if k in _SAMPLING}
    if sampling:
        req.sampling.CopyFrom(pb.SamplingParams(**sampling))
    constraint = constraint_to_proto(**{k: v for k, v in params.items() if k in CONSTRAINT_KINDS})
    if constraint is not None:
        req.sampling.constraint.CopyFrom(constraint)

    if "max_tokens" in params:
        req.stopping.max_tokens = params["max_tokens"]
    if "stop" in params:
        stop = params["stop"]
        req.stopping.stop_strings.extend([stop] if isinstance(stop, str) else stop)
    if "stop_token_ids" in params:
        req.stopping.stop_token_ids.extend(int(t) for t in params["stop_token_ids"])
    if params.get("ignore_eos"):
        req.stopping.ignore_eos = True

    req.logprobs = bool(params.get("logprobs", False))
    req.top_logprobs = int(params.get("top_logprobs", 0))

    if "cache_prompt" in params:
        req.cache.cache_prompt = params["cache_prompt"]
    if "checkpoint_offsets" in params:
        req.cache.checkpoint_offsets.extend(int(o) for o in params["checkpoint_offsets"])
    if "speculative" in params:
        req.speculative.enabled = params["speculative"]
    if "spec_max_draft" in params:
        req.speculative.max_draft = params["spec_max_draft"]
    return req


def _tool_options(chat: pb.ChatInput, params: GenerateParams) -> None:
    if "tools" in params:
        tools = params["tools"]
        if isinstance(tools, str | Mapping | Tool):
            raise ValueError("tools must be a sequence of tools")
        chat.tools.extend(tool_to_proto(t) for t in tools)
    if "tool_choice" in params:
        chat.tool_choice.CopyFrom(tool_choice_to_proto(params["tool_choice"]))
    if "parallel_tool_calls" in params:
        chat.parallel_tool_calls = params["parallel_tool_calls"]
    if "parse_output" in params:
        chat.parse_output = params["parse_output"]


_MESSAGE_KEYS = frozenset(("role", "content", "name", "reasoning_content", "tool_calls", "tool_call_id"))


def _chat_message(m: Message | Mapping[str, Any]) -> pb.ChatMessage:
    if isinstance(m, Message):
        role, content, name, reasoning = m.role, m.content, m.name, m.reasoning_content
        tool_calls, tool_call_id = m.tool_calls or (), m.tool_call_id
    else:
        extra = m.keys() - _MESSAGE_KEYS
        if extra:
            raise ValueError(f"chat message has unsupported key(s): {', '.join(sorted(extra))}")
        role, content = m["role"], m.get("content") or ""
        name, reasoning = m.get("name"), m.get("reasoning_content")
        tool_calls, tool_call_id = m.get("tool_calls") or (), m.get("tool_call_id")
    if isinstance(tool_calls, str | Mapping | ToolCall):
        raise ValueError("a chat message's tool_calls must be a sequence of tool calls")
    msg = pb.ChatMessage(role=role, content=content, tool_calls=[tool_call_to_proto(c) for c in tool_calls])
    if name is not None:
        msg.name = name
    if reasoning is not None:
        msg.reasoning_content = reasoning
    if tool_call_id is not None:
        msg.tool_call_id = tool_call_id
    return msg
