"""Where checkpoints are taken: while a prompt is processed (`checkpoint_schedule`), and where a
chat is likely to diverge next time (`chat_checkpoint_positions`)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hyserve.engine.cache_plan.kinds import _KIND_RANK, CheckpointKind, MemoryKind

__all__ = [
    "GENERATION_PROMPT_BOUNDARY_TOKENS",
    "ChatLayout",
    "chat_checkpoint_positions",
    "checkpoint_schedule",
    "message_token_offsets",
]


def checkpoint_schedule(
    resume: int,
    prompt_len: int,
    kind: MemoryKind,
    message_boundaries: Iterable[int] = (),
    client_offsets: Iterable[int] = (),
    interval: int = 0,
) -> list[tuple[int, CheckpointKind]]:
    """Positions in (resume, prompt_len] where a checkpoint is taken, ascending, one kind each.

    The prompt end is always one (with its logits, so an identical resend evaluates nothing).
    Attention-only memory needs nothing else: truncation reaches every other position.
    """
    if resume >= prompt_len:
        return []
    chosen: dict[int, CheckpointKind] = {}

    def add(pos: int, k: CheckpointKind) -> None:
        if resume < pos <= prompt_len and (pos not in chosen or _KIND_RANK[k] > _KIND_RANK[chosen[pos]]):
            chosen[pos] = k

    add(prompt_len, CheckpointKind.PROMPT_END)
    if kind.needs_checkpoints:
        for p in message_boundaries:
            add(p, CheckpointKind.MESSAGE_START)
        for p in client_offsets:
            add(p, CheckpointKind.CLIENT_REQUESTED)
        if interval > 0:
            for p in range(interval * (resume // interval + 1), prompt_len, interval):
                add(p, CheckpointKind.INTERVAL)
    return sorted(chosen.items())


# The generation prompt ("<|im_start|>assistant\n<think>\n") is short; past this many tokens only its
# start is a boundary.
GENERATION_PROMPT_BOUNDARY_TOKENS = 16


@dataclass(frozen=True)
class ChatLayout:
    """Where the parts of a rendered chat are, in characters of `text`."""

    text: str
    message_starts: Sequence[int]  # where each message's rendering starts
    generation_prompt_at: int | None  # where the generation prompt starts (None: none was added)
    contents: Sequence[str]  # each message's content ("" when not a string)
    reasonings: Sequence[str]  # each assistant message's reasoning text ("" when none)


def chat_checkpoint_positions(layout: ChatLayout, token_starts: Sequence[int]) -> list[int]:
    """Token positions where a later conversation is likely to diverge from this one, for checkpoints:

    - where each message's rendering starts (an edited or dropped message diverges there);
    - where each message's content starts, when the content appears verbatim in its rendering (an
      edited message whose header is unchanged diverges there);
    - where an assistant message's rendered reasoning starts (its "<think>" tag, else the text):
      templates like Qwen3.5's drop that reasoning once a new user message arrives, so the next
      prompt diverges exactly there;
    - every position inside the generation prompt: the next turn renders this assistant message
      again, often with a different header tail (e.g. without the opened think block), so the
      divergence is anywhere in it.
    A position only costs a checkpoint; a wrong guess never changes an answer. `token_starts[t]`
    is where token t starts in `layout.text`.
    """
    text = layout.text
    chars = list(layout.message_starts)
    ends = [*chars[1:], layout.generation_prompt_at or len(text)]
    for start, end, content, reasoning in zip(layout.message_starts, ends, layout.contents, layout.reasonings):
        if content:
            at = text.find(content, start, max(end, start + len(content)))
            if at >= 0:
                chars.append(at)
        if reasoning:
            at = text.find(reasoning, start, max(end, start + len(reasoning)))
            if at >= 0:
                think = text.rfind("<think>", start, at)
                chars.append(think if think >= 0 else at)
    positions = set(message_token_offsets(chars, token_starts))
    gen_at = layout.generation_prompt_at
    if gen_at is not None and gen_at < len(text):
        first = message_token_offsets([gen_at], token_starts)[0]
        positions.update(range(first, min(len(token_starts), first + GENERATION_PROMPT_BOUNDARY_TOKENS)))
    return sorted(p for p in positions if 0 < p < len(token_starts))


def message_token_offsets(char_offsets: Sequence[int], token_char_starts: Sequence[int]) -> list[int]:
    """Map message character offsets to token indices.

    ``token_char_starts[t]`` is the character offset in the rendered text where token ``t``
    starts (non-decreasing; tokens are contiguous, so token ``t`` covers
    ``[start[t], start[t + 1])``). For each offset ``c`` the result is the index of the first
    token starting exactly at ``c`` if there is one; otherwise ``c`` lies inside a token and the
    result is that token (the last one starting before ``c``) so the token offset never goes past
    the message start. Several tokens may share a start (byte-fallback pieces of one character):
    then the first of them is returned. An offset after the last token's start is taken to lie
    inside the last token. With no tokens, every offset maps to 0.
    """
    starts = token_char_starts
    if not starts:
        return [0 for _ in char_offsets]
    result: list[int] = []
    for c in char_offsets:
        j = bisect.bisect_right(starts, c) - 1
        if j < 0:
            result.append(0)
        else:
            result.append(bisect.bisect_left(starts, starts[j], 0, j + 1))
    return result
