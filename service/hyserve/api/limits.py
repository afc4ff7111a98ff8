"""Size limits that keep one client from stalling or starving the others, as pure functions.

Every check here runs on sizes the request already carries (serialized bytes, element counts),
before any tokenization or template rendering, so an oversized request costs the server almost
nothing. The gRPC receive limit is derived from the same prompt byte limit, so a message too large
to be a valid prompt is refused by grpc itself (RESOURCE_EXHAUSTED) before it is even parsed.
"""

from __future__ import annotations

import argparse

from hyserve.api.gen import hyserve_pb2 as pb

__all__ = [
    "DEFAULT_STREAM_STALL_SECONDS",
    "MAX_CHECKPOINT_OFFSETS",
    "MAX_PENDING_EVENTS",
    "MAX_STOP_STRINGS",
    "MAX_STOP_STRING_CHARS",
    "add_limit_arguments",
    "default_max_prompt_bytes",
    "default_max_queued_prompt_tokens",
    "prompt_size_error",
    "receive_limit_bytes",
]

# A token of real text is a few bytes; 32 per token of context leaves room for long whitespace runs
# and multi-byte scripts while keeping the tokenizer's worst case small.
BYTES_PER_CONTEXT_TOKEN = 32
MIN_PROMPT_BYTES = 64 * 1024
# Everything in a GenerateRequest besides the prompt (ids, sampling, stop rules) fits well in this.
REQUEST_OVERHEAD_BYTES = 1 << 20

# The engine checks every stop string against the text after every token (on the thread that runs
# every stream): both bounds keep that per-token cost small.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_CHECKPOINT_OFFSETS = 256

# Events a stream may hold while its client does not read (the transport's own buffer comes first);
# beyond this the task is cancelled and the stream ends RESOURCE_EXHAUSTED.
MAX_PENDING_EVENTS = 512
DEFAULT_STREAM_STALL_SECONDS = 30.0
QUEUED_PROMPT_TOKENS_PER_CONTEXT = 16


def default_max_prompt_bytes(n_ctx: int) -> int:
    """Prompt bytes (text, or everything of a chat input) accepted for a context of n_ctx tokens."""
    return max(MIN_PROMPT_BYTES, BYTES_PER_CONTEXT_TOKEN * n_ctx)


def default_max_queued_prompt_tokens(n_ctx: int) -> int:
    return QUEUED_PROMPT_TOKENS_PER_CONTEXT * n_ctx


def receive_limit_bytes(max_prompt_bytes: int) -> int:
    """The gRPC max receive message size that goes with a prompt byte limit."""
    return max_prompt_bytes + REQUEST_OVERHEAD_BYTES


def prompt_size_error(request: pb.GenerateRequest, max_prompt_bytes: int, n_ctx: int) -> str | None:
    """Why the request's input is too large to be served, judged on its size alone; None if it may be."""
    kind = request.WhichOneof("input")
    if kind == "tokens":
        n = len(request.tokens.token_ids)
        if n >= n_ctx:
            return (
                f"input: the prompt has {n} tokens, which leaves no room for a completion in the context "
                f"of {n_ctx} tokens"
            )
        return None
    if kind == "text":
        size = request.text.ByteSize()
    elif kind == "chat":
        size = request.chat.ByteSize()
    else:
        return None
    if size > max_prompt_bytes:
        return (
            f"{kind}: {size} bytes is more than this server accepts for one prompt ({max_prompt_bytes} bytes, "
            f"--max-prompt-bytes)"
        )
    return None


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """`hyserve serve` flags for the limits above."""
    p.add_argument(
        "--max-prompt-bytes",
        type=int,
        default=None,
        help=f"largest text or chat input in bytes, refused before tokenization "
        f"(default: {BYTES_PER_CONTEXT_TOKEN} x --ctx-size, at least {MIN_PROMPT_BYTES})",
    )
    p.add_argument(
        "--stream-stall-seconds",
        type=float,
        default=DEFAULT_STREAM_STALL_SECONDS,
        help="cancel a Generate whose client has read nothing for this long (RESOURCE_EXHAUSTED)",
    )
    p.add_argument(
        "--max-queued-prompt-tokens",
        type=int,
        default=None,
        help=f"prompt tokens all queued tasks may hold together; more: RESOURCE_EXHAUSTED "
        f"(default: {QUEUED_PROMPT_TOKENS_PER_CONTEXT} x --ctx-size; 0: no limit)",
    )
