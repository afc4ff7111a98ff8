"""Request validation: GenerateRequest -> a `PreparedRequest` the engine can run, or a
`ValidationError` whose message names the field (the servicer answers INVALID_ARGUMENT).

Pure functions: they read the request, the tokenizer and the chat template, and change nothing.
Rules and defaults follow proto/hyserve/v1/hyserve.proto.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf import json_format

from hyserve.api.answer_format import NO_TRAITS, AnswerFormatError, answer_format, template_traits
from hyserve.api.chat_input import ChatRequest, ChatValidationError, chat_request
from hyserve.api.chat_output import OutputSpec
from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.api.limits import (
    MAX_CHECKPOINT_OFFSETS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    default_max_prompt_bytes,
    prompt_size_error,
)
from hyserve.engine.cache_plan import ChatLayout, chat_checkpoint_positions
from hyserve.engine.constraints import CompiledGrammar, ConstraintError, GrammarCompiler
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.stop import StopRule
from hyserve.engine.task import new_task_id
from hyserve.model.chat_template import ChatTemplate, ChatTemplateError, RenderedChat

__all__ = [
    "MAX_TOP_LOGPROBS",
    "PreparedRequest",
    "RequestLimits",
    "ValidationError",
    "is_task_id",
    "prepare_generate",
    "prompt_tokens",
    "sampling_params",
    "stop_rule",
    "validate_task_id",
]

MAX_TASK_ID_LEN = 128
MAX_TOP_LOGPROBS = 20
_TASK_ID = re.compile(r"[A-Za-z0-9._:-]+")


class ValidationError(ValueError):
    """The request is malformed, whatever the server's state (INVALID_ARGUMENT)."""


class TokenizerLike(Protocol):
    vocab_size: int

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def encode_with_offsets(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> tuple[list[int], list[int]]: ...


@dataclass(frozen=True)
class RequestLimits:
    n_ctx: int  # per slot: prompt + completion must fit
    default_max_tokens: int  # when the request sets none (generation also ends when the context is full)
    max_prompt_bytes: int = 0  # text or chat input, serialized; 0: derived from n_ctx (limits.py)

    @property
    def prompt_bytes(self) -> int:
        return self.max_prompt_bytes or default_max_prompt_bytes(self.n_ctx)


@dataclass(frozen=True)
class PreparedRequest:
    task_id: str
    prompt: tuple[int, ...]
    params: SamplingParams
    stop: StopRule
    logprobs: bool
    top_logprobs: int
    cache_prompt: bool
    message_boundaries: tuple[int, ...]
    checkpoint_offsets: tuple[int, ...]
    # chat input: how the answer's text splits into content, reasoning and tool calls
    output: OutputSpec | None = None
    # what the output must match (a request's constraint or a required tool call), compiled
    grammar: CompiledGrammar | None = None
    speculative: bool | None = None  # None: the server's setting
    spec_max_draft: int = 0  # 0: the server's


def is_task_id(text: str) -> bool:
    """Whether a Generate could use `text` as its task_id (a Cancel for any other id finds nothing, ever)."""
    return 0 < len(text) <= MAX_TASK_ID_LEN and _TASK_ID.fullmatch(text) is not None


def validate_task_id(task_id: str) -> str:
    """The client's id, or a fresh UUID when empty."""
    if not task_id:
        return new_task_id()
    if len(task_id) > MAX_TASK_ID_LEN:
        raise ValidationError(f"task_id: at most {MAX_TASK_ID_LEN} characters (got {len(task_id)})")
    if not _TASK_ID.fullmatch(task_id):
        raise ValidationError("task_id: only the characters [A-Za-z0-9._:-] are allowed")
    return task_id


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ValidationError(f"sampling.{name}: must be a finite number (got {value})")
    return float(value)


def sampling_params(msg: pb.SamplingParams) -> SamplingParams:
    def opt(name: str, default: float) -> float:
        return _finite(name, getattr(msg, name)) if msg.HasField(name) else default

    temperature = opt("temperature", 0.0)
    if temperature < 0:
        raise ValidationError(f"sampling.temperature: must be >= 0 (got {temperature:g})")
    top_k = msg.top_k if msg.HasField("top_k") else 0
    if top_k < 0:
        raise ValidationError(f"sampling.top_k: must be >= 0 (got {top_k})")
    top_p = opt("top_p", 1.0)
    if not 0.0 < top_p <= 1.0:
        raise ValidationError(f"sampling.top_p: must be in (0, 1] (got {top_p:g})")
    min_p = opt("min_p", 0.0)
    if not 0.0 <= min_p <= 1.0:
        raise ValidationError(f"sampling.min_p: must be in [0, 1] (got {min_p:g})")
    repetition_penalty = opt("repetition_penalty", 1.0)
    if repetition_penalty <= 0:
        raise ValidationError(f"sampling.repetition_penalty: must be > 0 (got {repetition_penalty:g})")
    return SamplingParams(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        presence_penalty=opt("presence_penalty", 0.0),
        frequency_penalty=opt("frequency_penalty", 0.0),
        seed=msg.seed if msg.HasField("seed") else None,
    )


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    checkpoint_positions: list[int]  # cache_plan.chat_checkpoint_positions (chat input only)
    chat: ChatRequest | None = None  # chat input: the validated conversation
    text: str = ""  # chat input: the rendered conversation


def prompt_tokens(
    request: pb.GenerateRequest, tokenizer: TokenizerLike, template: ChatTemplate
) -> tuple[list[int], list[int]]:
    """(prompt token ids, checkpoint-worthy token positions of a chat: cache_plan.chat_checkpoint_positions)."""
    prompt = build_prompt(request, tokenizer, template)
    return prompt.ids, prompt.checkpoint_positions


def build_prompt(request: pb.GenerateRequest, tokenizer: TokenizerLike, template: ChatTemplate) -> Prompt:
    """The prompt's token ids, with what a chat input adds (checkpoint positions, the conversation)."""
    kind = request.WhichOneof("input")
    if kind is None:
        raise ValidationError("input: exactly one of text, tokens or chat must be set")
    if kind == "text":
        text = request.text
        if not text.text:
            raise ValidationError("text.text: must not be empty")
        add_special = text.add_special if text.HasField("add_special") else True
        parse_special = text.parse_special if text.HasField("parse_special") else False
        ids = tokenizer.encode(text.text, add_special=add_special, parse_special=parse_special)
        if not ids:
            raise ValidationError("text.text: tokenizes to no tokens")
        return Prompt(ids, [])
    if kind == "tokens":
        ids = [int(t) for t in request.tokens.token_ids]
        if not ids:
            raise ValidationError("tokens.token_ids: must not be empty")
        bad = next((t for t in ids if t >= tokenizer.vocab_size), None)
        if bad is not None:
            raise ValidationError(f"tokens.token_ids: id {bad} is not below the vocabulary size {tokenizer.vocab_size}")
        return Prompt(ids, [])
    return _chat_prompt(request.chat, tokenizer, template)


def _chat_prompt(chat_input: pb.ChatInput, tokenizer: TokenizerLike, template: ChatTemplate) -> Prompt:
    add_generation_prompt = chat_input.add_generation_prompt if chat_input.HasField("add_generation_prompt") else True
    kwargs: dict[str, Any] = {}
    if chat_input.HasField("chat_template_kwargs"):
        try:
            kwargs = json_format.MessageToDict(chat_input.chat_template_kwargs)
        except ValueError as exc:  # e.g. a NaN or infinite number: JSON has none
            raise ValidationError(f"chat.chat_template_kwargs: {exc}") from exc
    try:
        chat = chat_request(chat_input, kwargs)
    except ChatValidationError as exc:
        raise ValidationError(str(exc)) from exc
    kwargs.pop("tools", None)
    messages = chat.messages
    try:
        rendered = template.render(messages, add_generation_prompt=add_generation_prompt, tools=chat.tools, **kwargs)
    except ChatTemplateError as exc:
        raise ValidationError(f"chat: the chat template cannot render these messages: {exc}") from exc
    except TypeError as exc:  # e.g. a kwarg name that collides with render()'s own parameters
        raise ValidationError(f"chat.chat_template_kwargs: {exc}") from exc
    # templates emit BOS themselves
    ids, starts = tokenizer.encode_with_offsets(rendered.text, add_special=False, parse_special=True)
    if not ids:
        raise ValidationError("chat: the rendered conversation is empty")
    positions = chat_checkpoint_positions(chat_layout(rendered, messages), starts)
    return Prompt(ids, positions, chat, rendered.text)


def _reasoning_text(message: Mapping[str, Any]) -> str:
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning.strip():
        return reasoning.strip()
    content = message.get("content")
    if isinstance(content, str) and "</think>" in content:
        return content.split("</think>")[0].split("<think>")[-1].strip()
    return ""


def chat_layout(rendered: RenderedChat, messages: Sequence[Mapping[str, Any]]) -> ChatLayout:
    """The rendered chat as cache_plan's checkpoint placement reads it."""
    contents = [c if isinstance(c := m.get("content"), str) else "" for m in messages]
    return ChatLayout(
        rendered.text,
        tuple(rendered.message_char_offsets),
        rendered.generation_prompt_offset,
        contents,
        [_reasoning_text(m) for m in messages],
    )


def stop_rule(
    msg: pb.StoppingCriteria, has_msg: bool, vocab_size: int, n_prompt: int, limits: RequestLimits
) -> StopRule:
    if has_msg and msg.HasField("max_tokens"):
        max_tokens = msg.max_tokens
        if max_tokens < 1:
            raise ValidationError("stopping.max_tokens: must be >= 1")
        if n_prompt + max_tokens > limits.n_ctx:
            raise ValidationError(
                f"stopping.max_tokens: {n_prompt} prompt tokens + {max_tokens} completion tokens exceed "
                f"the context size of {limits.n_ctx} tokens"
            )
    else:
        max_tokens = limits.default_max_tokens
    if not has_msg:
        return StopRule(max_tokens=max_tokens)
    if len(msg.stop_strings) > MAX_STOP_STRINGS:
        raise ValidationError(f"stopping.stop_strings: at most {MAX_STOP_STRINGS} (got {len(msg.stop_strings)})")
    for i, s in enumerate(msg.stop_strings):
        if not s:
            raise ValidationError(f"stopping.stop_strings[{i}]: must not be empty")
        if len(s) > MAX_STOP_STRING_CHARS:
            raise ValidationError(f"stopping.stop_strings[{i}]: at most {MAX_STOP_STRING_CHARS} characters")
    for t in msg.stop_token_ids:
        if t >= vocab_size:
            raise ValidationError(f"stopping.stop_token_ids: id {t} is not below the vocabulary size {vocab_size}")
    return StopRule(
        max_tokens=max_tokens,
        stop_strings=tuple(msg.stop_strings),
        stop_token_ids=frozenset(int(t) for t in msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
    )


def _checkpoint_offsets(offsets: Sequence[int], n_prompt: int) -> tuple[int, ...]:
    if len(offsets) > MAX_CHECKPOINT_OFFSETS:
        raise ValidationError(f"cache.checkpoint_offsets: at most {MAX_CHECKPOINT_OFFSETS} (got {len(offsets)})")
    for o in offsets:
        if o < 1:
            raise ValidationError("cache.checkpoint_offsets: offsets must be >= 1")
    return tuple(sorted({int(o) for o in offsets if o <= n_prompt}))


MAX_SPEC_DRAFT = 64


def _speculative(request: pb.GenerateRequest) -> dict[str, Any]:
    """The request's speculative-decoding options as PreparedRequest fields."""
    if not request.HasField("speculative"):
        return {}
    options = request.speculative
    out: dict[str, Any] = {}
    if options.HasField("enabled"):
        out["speculative"] = options.enabled
    if options.HasField("max_draft"):
        if not 1 <= options.max_draft <= MAX_SPEC_DRAFT:
            raise ValidationError(f"speculative.max_draft: must be in 1..{MAX_SPEC_DRAFT} (got {options.max_draft})")
        out["spec_max_draft"] = options.max_draft
    return out


def prepare_generate(
    request: pb.GenerateRequest,
    tokenizer: TokenizerLike,
    template: ChatTemplate,
    limits: RequestLimits,
    grammars: GrammarCompiler | None = None,
) -> PreparedRequest:
    """Validate a GenerateRequest and turn it into what the engine runs. Raises ValidationError.

    Sizes are checked first, on bytes and counts, so an oversized prompt is never tokenized."""
    too_large = prompt_size_error(request, limits.prompt_bytes, limits.n_ctx)
    if too_large is not None:
        raise ValidationError(too_large)
    task_id = validate_task_id(request.task_id)
    params = sampling_params(request.sampling)
    if request.top_logprobs > MAX_TOP_LOGPROBS:
        raise ValidationError(f"top_logprobs: at most {MAX_TOP_LOGPROBS} (got {request.top_logprobs})")
    built = build_prompt(request, tokenizer, template)
    prompt, message_boundaries = built.ids, built.checkpoint_positions
    if len(prompt) >= limits.n_ctx:
        raise ValidationError(
            f"input: the prompt has {len(prompt)} tokens, which leaves no room for a completion in the context "
            f"of {limits.n_ctx} tokens"
        )
    stop = stop_rule(request.stopping, request.HasField("stopping"), tokenizer.vocab_size, len(prompt), limits)
    cache_prompt = request.cache.cache_prompt if request.cache.HasField("cache_prompt") else True
    try:
        traits = template_traits(template.source) if built.chat is not None else NO_TRAITS
        spec, output = answer_format(request.sampling, built.chat, built.text, traits)
        if spec is not None and grammars is None:
            raise ValidationError(f"{spec.field}: constrained decoding is not available here")
        grammar = grammars.compile(spec) if spec is not None and grammars is not None else None
    except (AnswerFormatError, ConstraintError) as exc:
        raise ValidationError(str(exc)) from exc
    return PreparedRequest(
        task_id=task_id,
        prompt=tuple(prompt),
        params=params,
        stop=stop,
        logprobs=request.logprobs or request.top_logprobs > 0,
        top_logprobs=request.top_logprobs,
        cache_prompt=cache_prompt,
        message_boundaries=tuple(message_boundaries),
        checkpoint_offsets=_checkpoint_offsets(request.cache.checkpoint_offsets, len(prompt)),
        output=output,
        grammar=grammar,
        **_speculative(request),
    )
