"""OpenAI response bodies built from engine events. Pure functions of their arguments."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hyserve.api.chat_output import ChatPiece, ParsedCall
from hyserve.api.proto_events import ended_with_calls
from hyserve.engine.task import DeltaEvent, FinishedEvent, FinishReason, TokenLogprob, Usage

__all__ = [
    "Completion",
    "chat_chunk",
    "chat_delta",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "finish_reason",
    "logprobs_json",
    "usage_json",
]

_FINISH = {
    FinishReason.EOS: "stop",
    FinishReason.STOP_STRING: "stop",
    FinishReason.STOP_TOKEN: "stop",
    FinishReason.MAX_TOKENS: "length",
    FinishReason.CONTEXT_FULL: "length",
    FinishReason.CANCELLED: "cancelled",  # stopped by the gRPC Cancel RPC (OpenAI has no such reason)
}

TokenBytes = Callable[[int], bytes]


def finish_reason(reason: FinishReason, calls: tuple[ParsedCall, ...] = ()) -> str:
    return "tool_calls" if ended_with_calls(reason, calls) else _FINISH[reason]


def chat_delta(piece: ChatPiece) -> dict[str, Any]:
    """A streamed chat delta in OpenAI's shape (vLLM's `reasoning_content` for the reasoning)."""
    delta: dict[str, Any] = {}
    if piece.reasoning:
        delta["reasoning_content"] = piece.reasoning
    if piece.content:
        delta["content"] = piece.content
    if piece.tool_calls:
        calls = []
        for c in piece.tool_calls:
            call: dict[str, Any] = {"index": c.index}
            function: dict[str, str] = {"arguments": c.arguments}
            if c.id:
                call |= {"id": c.id, "type": "function"}
            if c.name:
                function["name"] = c.name
            calls.append(call | {"function": function})
        delta["tool_calls"] = calls
    return delta


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
        # OpenAI's predicted-output counts: drafted tokens the model agreed with, and the rest
        "completion_tokens_details": {
            "accepted_prediction_tokens": usage.accepted_draft_tokens,
            "rejected_prediction_tokens": usage.draft_tokens - usage.accepted_draft_tokens,
        },
    }


def _token(token_id: int, logprob: float, token_bytes: TokenBytes) -> dict[str, Any]:
    raw = token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def logprobs_json(items: Sequence[TokenLogprob], token_bytes: TokenBytes, chat: bool) -> dict[str, Any]:
    """Chat: {"content": [...]}; completions: the legacy token/token_logprobs/top_logprobs lists."""
    if chat:
        return {
            "content": [
                {
                    **_token(lp.token_id, lp.logprob, token_bytes),
                    "top_logprobs": [_token(t, v, token_bytes) for t, v in lp.top],
                }
                for lp in items
            ]
        }
    pieces = [token_bytes(lp.token_id).decode("utf-8", errors="replace") for lp in items]
    return {
        "tokens": pieces,
        "token_logprobs": [lp.logprob for lp in items],
        "top_logprobs": [{token_bytes(t).decode("utf-8", errors="replace"): v for t, v in lp.top} for lp in items],
    }


@dataclass
class Completion:
    """What a non-streamed response accumulates from the task's events."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: FinishedEvent | None = None
    # chat answers split by a ChatOutput: `text` holds the content only
    reasoning: list[str] = field(default_factory=list)
    calls: tuple[ParsedCall, ...] = ()

    def add(self, event: DeltaEvent, piece: ChatPiece | None = None) -> None:
        self.token_ids.extend(event.token_ids)
        self.logprobs.extend(event.logprobs)
        if piece is None:
            self.text.append(event.text)
        else:
            self.add_piece(piece)

    def add_piece(self, piece: ChatPiece) -> None:
        self.text.append(piece.content)
        self.reasoning.append(piece.reasoning)


def _envelope(obj: str, id_: str, created: int, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": id_, "object": obj, "created": created, "model": model, "choices": choices}


def chat_response(
    id_: str,
    created: int,
    model: str,
    done: Completion,
    logprobs: dict[str, Any] | None,
    prompt_token_ids: Sequence[int] | None,
) -> dict[str, Any]:
    content = "".join(done.text)
    body: dict[str, Any] = {"role": "assistant", "content": content if content or not done.calls else None}
    if reasoning := "".join(done.reasoning):
        body["reasoning_content"] = reasoning
    if done.calls:
        body["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
            for c in done.calls
        ]
    message = {"message": body}
    return _final_response("chat.completion", id_, created, model, done, message, logprobs, prompt_token_ids)


def completion_response(
    id_: str,
    created: int,
    model: str,
    done: Completion,
    logprobs: dict[str, Any] | None,
    prompt_token_ids: Sequence[int] | None,
) -> dict[str, Any]:
    text = {"text": "".join(done.text)}
    return _final_response("text_completion", id_, created, model, done, text, logprobs, prompt_token_ids)


def _final_response(
    object_: str,
    id_: str,
    created: int,
    model: str,
    done: Completion,
    content: dict[str, Any],
    logprobs: dict[str, Any] | None,
    prompt_token_ids: Sequence[int] | None,
) -> dict[str, Any]:
    """A non-streamed response of one choice: chat and completions differ only in the object name
    and in how the choice carries the text."""
    if done.finished is None:
        raise ValueError("a response needs the finished event")
    choice: dict[str, Any] = {
        "index": 0,
        **content,
        "logprobs": logprobs,
        "finish_reason": finish_reason(done.finished.reason, done.calls),
    }
    body = _envelope(object_, id_, created, model, [choice])
    body["usage"] = usage_json(done.finished.usage)
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = list(prompt_token_ids)
        choice["token_ids"] = list(done.token_ids)
    return body


def chat_chunk(
    id_: str,
    created: int,
    model: str,
    delta: dict[str, Any],
    finish: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **(extra or {})}
    return _envelope("chat.completion.chunk", id_, created, model, [choice])


def completion_chunk(
    id_: str,
    created: int,
    model: str,
    text: str,
    finish: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, **(extra or {})}
    return _envelope("text_completion", id_, created, model, [choice])
