"""Prompt-cache decisions as plain functions of state: no model, no memory, no threads.

ARCHITECTURE.md "The prompt cache" is the specification. Words used here:
- `T`: the tokens whose effect a cached sequence (a slot's memory or a prefix-store entry) holds;
- a checkpoint: a copy of that memory's non-truncatable part (recurrent state, ring-buffer window)
  after exactly the first `position` tokens of `T`, optionally with the logits after token
  `position - 1`;
- `live_floor`: the smallest position the live memory reaches by truncation alone (0 for a plain
  KV cache, `len(T)` for recurrent state, in between for a ring-buffer window cache);
- kept inputs ("logged" positions): for a run of positions, what each recurrent layer's kernels
  consumed there (and a ring layer's keys/values), so the state at any position inside the run is
  recomputed from a checkpoint at or before it (or from the empty state at 0) by those kernels
  alone, bit for bit (a "replay").

`plan_resume` picks where a prompt resumes on one cached sequence; `plan_admissions` picks the
slot (and prefix-store entry) for each queued prompt and returns every decision the engine then
carries out as plain data on `Admission` (the resume plan, whether the slot's state is stashed in
the prefix store first, whether the store entry is consumed, the checkpoint positions);
`checkpoint_schedule` says where checkpoints are taken while a prompt is processed and
`chat_checkpoint_positions` where a chat is likely to diverge next time; `choose_evictions` /
`choose_log_evictions` keep checkpoints and kept inputs within their byte budgets, and `subsumes`
tells when a store entry is made redundant by a newer one.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

__all__ = [
    "Admission",
    "CachedView",
    "ChatLayout",
    "CheckpointKind",
    "CheckpointView",
    "EvictionCandidate",
    "LogBlockView",
    "MemoryKind",
    "ResumePlan",
    "ReuseSource",
    "SlotCandidate",
    "StoreCandidate",
    "chat_checkpoint_positions",
    "checkpoint_schedule",
    "choose_evictions",
    "choose_log_evictions",
    "common_prefix_len",
    "message_token_offsets",
    "plan_admissions",
    "plan_resume",
    "replay_reach",
    "subsumes",
]


class ReuseSource(Enum):
    """Where a prompt's reused tokens come from."""

    NONE = "none"
    SLOT_LIVE = "slot_live"
    CHECKPOINT = "checkpoint"
    PREFIX_STORE = "prefix_store"


class MemoryKind(Enum):
    ATTENTION = "attention"  # KV caches only: every prefix is reachable by truncation
    SLIDING_WINDOW = "sliding_window"  # a ring-buffer window cache: only recent positions are
    RECURRENT = "recurrent"  # conv + SSM state only
    HYBRID = "hybrid"  # recurrent layers and attention layers

    @property
    def needs_checkpoints(self) -> bool:
        """Whether resuming before the live end needs a saved copy of the memory."""
        return self is not MemoryKind.ATTENTION


class CheckpointKind(Enum):
    MESSAGE_START = "message_start"
    PROMPT_END = "prompt_end"
    CLIENT_REQUESTED = "client_requested"
    INTERVAL = "interval"


# When two kinds fall on one position the more specific one names it; eviction drops the lower first.
_KIND_RANK = {
    CheckpointKind.INTERVAL: 0,
    CheckpointKind.MESSAGE_START: 1,
    CheckpointKind.CLIENT_REQUESTED: 2,
    CheckpointKind.PROMPT_END: 3,
}


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if n < 64:
        for i in range(n):
            if a[i] != b[i]:
                return i
        return n
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(diff[0]) if len(diff) else n


# --- where a prompt resumes ----------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointView:
    position: int
    has_logits: bool = False


@dataclass(frozen=True)
class CachedView:
    """What resume planning needs to know about one cached sequence."""

    tokens: Sequence[int]
    live_floor: int  # truncating the live memory to any n in [live_floor, len(tokens)] is exact
    checkpoints: Sequence[CheckpointView] = ()
    logged: Sequence[tuple[int, int]] = ()  # maximal runs [start, end) of positions whose inputs are kept


def replay_reach(view: CachedView) -> list[tuple[int, int, int]]:
    """(base, first, last): every position in [first, last] is reached by replaying kept inputs from
    `base` (a checkpoint position, or 0: the empty state) on; base == first, the nearest base for the
    positions up to the next one. Positions reached by a checkpoint alone are included."""
    cps = sorted(cp.position for cp in view.checkpoints)
    out: list[tuple[int, int, int]] = []
    for start, end in view.logged:
        bases = ([0] if start == 0 else []) + [c for c in cps if start <= c <= end]
        for i, b in enumerate(bases):
            last = bases[i + 1] - 1 if i + 1 < len(bases) else end
            if last >= b:
                out.append((b, b, last))
    return out


@dataclass(frozen=True)
class ResumePlan:
    matched: int  # L: longest common prefix of the cached tokens and the prompt
    resume: int  # r: prompt[:r] is kept, prompt[r:] is evaluated
    source: ReuseSource
    restore: int | None = None  # position of the checkpoint to restore (None: keep/truncate the live memory)
    replay_from: int | None = None  # replay kept inputs from this position (the restored checkpoint, or 0: empty)
    from_logits: bool = False  # r == len(prompt): the first token is sampled from the checkpoint's logits
    invalidate: tuple[int, ...] = ()  # checkpoint positions past r: no longer prefixes of T once T = prompt[:r]
    reason: str | None = None  # why matched tokens are evaluated again (matched > resume), or why r == 0

    @property
    def reprocessed(self) -> int:
        """Tokens whose state was cached but that are evaluated again."""
        return self.matched - min(self.matched, self.resume)


def plan_resume(
    cached: CachedView, prompt: Sequence[int], cache_prompt: bool = True, from_store: bool = False
) -> ResumePlan:
    """The resume point r for `prompt` on `cached`: the largest position <= L reachable exactly.

    Reachable: any n in [live_floor, len(T)] by truncating the live memory; any checkpoint
    position; any position inside a run of kept inputs that starts at a checkpoint or at 0 (by a
    replay from there). At least one prompt token is evaluated unless a checkpoint at len(prompt)
    holds the logits to sample from. Ties go to the live memory (nothing to copy), then to a plain
    checkpoint (nothing to replay).
    """
    if not prompt:
        raise ValueError("empty prompt")
    n = len(prompt)
    matched = common_prefix_len(cached.tokens, prompt)
    every = tuple(sorted(cp.position for cp in cached.checkpoints))
    if not cache_prompt:
        return ResumePlan(matched, 0, ReuseSource.NONE, invalidate=every, reason="cache_prompt_disabled")
    live_source = ReuseSource.PREFIX_STORE if from_store else ReuseSource.SLOT_LIVE
    cp_source = ReuseSource.PREFIX_STORE if from_store else ReuseSource.CHECKPOINT

    resume, source, restore, from_logits = 0, ReuseSource.NONE, None, False
    live_max = min(matched, n - 1)
    if cached.live_floor <= live_max and live_max > 0:
        resume, source = live_max, live_source
    for cp in cached.checkpoints:
        usable = cp.position <= matched and (cp.position < n or cp.has_logits)
        if usable and cp.position > resume:
            resume, source, restore, from_logits = cp.position, cp_source, cp.position, cp.position == n
    replay_from: int | None = None
    for base, first, last in replay_reach(cached):
        target = min(last, matched, n - 1)  # a replay gives no logits: the last prompt token is evaluated
        if first <= target and target > resume:
            resume, source, from_logits, replay_from = target, cp_source, False, base
            restore = base if base > 0 else None
    invalidate = tuple(p for p in every if p > resume)

    reason: str | None = None
    if resume == 0:
        if not cached.tokens:
            reason = "cold_slot"
        elif matched == 0:
            reason = "no_common_prefix"
        elif n == 1:
            reason = "single_token_prompt"
        else:
            reason = "no_checkpoint"
    elif resume < matched:
        live_blocked = cached.live_floor > live_max
        if not (live_blocked and matched < n):
            reason = "no_stored_logits"
        else:  # neither a checkpoint nor kept inputs reach the divergence
            reason = "inputs_not_kept" if cached.logged else "no_checkpoint_at_divergence"
    return ResumePlan(matched, resume, source, restore, replay_from, from_logits, invalidate, reason)


# --- which slot and which store entry ------------------------------------------------------------


@dataclass(frozen=True)
class SlotCandidate:
    index: int
    view: CachedView
    last_used: int  # larger = used more recently
    last_prompt_len: int = 0  # the last task's prompt length: what it generated starts there
    kind: MemoryKind | None = None  # the slot memory's kind (None: attention only)


@dataclass(frozen=True)
class StoreCandidate:
    key: int
    view: CachedView


@dataclass(frozen=True)
class QueuedPrompt:
    tokens: Sequence[int]
    cache_prompt: bool = True
    message_boundaries: Sequence[int] = ()  # chat positions worth a checkpoint (chat_checkpoint_positions)
    checkpoint_offsets: Sequence[int] = ()  # client-requested checkpoint positions


@dataclass(frozen=True)
class Admission:
    """Where a queued prompt goes and everything the engine does to prepare it, in this order:
    stash the slot's state in the prefix store (`stash`), bring the slot to `plan.resume` (from
    the store entry `store_key` if set, dropping that entry when `discard_entry`), count a store
    miss (`store_miss`), then process the prompt taking checkpoints at `checkpoints`."""

    queue_pos: int
    slot: int
    plan: ResumePlan
    store_key: int | None = None  # restore this prefix-store entry into the slot first
    stash: bool = False  # the slot holds state nothing else reaches: copy it to the store first
    discard_entry: bool = False  # the slot takes all of the store entry: the entry is redundant
    store_miss: bool = False  # a store lookup found nothing better than the slot
    checkpoints: tuple[tuple[int, CheckpointKind], ...] = ()  # (position, kind) while processing the prompt


def _slot_order(c: SlotCandidate) -> tuple[int, int, int]:
    """Which slot to overwrite when nothing in it is reused: an empty one, then the least recently used."""
    return (1 if not c.view.tokens else 0, -c.last_used, -c.index)


def _choose(
    free: Sequence[SlotCandidate], store: Sequence[StoreCandidate], prompt: Sequence[int], cache_prompt: bool
) -> Admission:
    best_slot, best_plan = None, None
    for c in free:
        plan = plan_resume(c.view, prompt, cache_prompt)
        key = (plan.resume, plan.matched, *_slot_order(c))
        if best_slot is None or key > best_slot[0]:
            best_slot, best_plan = (key, c), plan
    if best_slot is None or best_plan is None:
        raise ValueError("no free slot to choose from")
    if best_plan.resume == 0:  # nothing of a slot is reused: don't destroy a useful one
        target = max(free, key=_slot_order)
        best_slot, best_plan = ((0,), target), plan_resume(target.view, prompt, cache_prompt)
    if cache_prompt:
        best_entry: tuple[int, StoreCandidate, ResumePlan] | None = None
        for entry in store:
            plan = plan_resume(entry.view, prompt, True, from_store=True)
            if best_entry is None or plan.resume > best_entry[0]:
                best_entry = (plan.resume, entry, plan)
        if best_entry is not None and best_entry[0] > best_plan.resume:
            target = max(free, key=_slot_order)
            return Admission(-1, target.index, best_entry[2], best_entry[1].key)
    return Admission(-1, best_slot[1].index, best_plan)


def plan_admissions(
    queued: Sequence[QueuedPrompt | tuple[Sequence[int], bool]],
    free: Sequence[SlotCandidate],
    store: Sequence[StoreCandidate] = (),
    *,
    store_enabled: bool = False,
    checkpoint_interval: int = 0,
) -> list[Admission]:
    """Admit queued prompts in FIFO order while free slots remain.

    Each prompt gets the free slot where it resumes furthest, or a prefix-store entry restored
    into the emptiest / least recently used free slot when that resumes further still. A slot or
    entry given to one prompt is not offered to the next. With `store_enabled`, a slot about to
    lose state that no store entry and no new prompt keeps (more than its last generation) is
    stashed first; an entry whose tokens the slot takes whole is discarded.
    """
    sizes = {e.key: len(e.view.tokens) for e in store}
    remaining, entries = list(free), list(store)
    out: list[Admission] = []
    for pos, item in enumerate(queued):
        if not remaining:
            break
        q = item if isinstance(item, QueuedPrompt) else QueuedPrompt(item[0], item[1])
        a = _choose(remaining, entries, q.tokens, q.cache_prompt)
        slot = next(c for c in remaining if c.index == a.slot)
        out.append(_decide(pos, a, slot, q, store_enabled, checkpoint_interval, sizes))
        remaining = [c for c in remaining if c.index != a.slot]
        entries = [e for e in entries if e.key != a.store_key]
    return out


def _decide(
    pos: int,
    a: Admission,
    slot: SlotCandidate,
    q: QueuedPrompt,
    store_enabled: bool,
    interval: int,
    sizes: Mapping[int, int],
) -> Admission:
    """The stash/discard/miss decisions and the checkpoint positions of one admission."""
    plan, held = a.plan, slot.view.tokens
    stash = discard = miss = False
    if store_enabled and held:
        if a.store_key is not None:
            # the slot is overwritten by the entry: keep it unless the prompt keeps what it generated
            stash = common_prefix_len(held, q.tokens) < slot.last_prompt_len
        elif q.cache_prompt:
            # the slot loses more than its last generation: keep that state for later
            stash = plan.resume < len(held) and plan.matched < slot.last_prompt_len
    if a.store_key is not None:
        discard = plan.resume == sizes.get(a.store_key, -1)
    elif store_enabled and q.cache_prompt:
        miss = bool(plan.reprocessed) or plan.resume == 0  # the store had nothing better either
    checkpoints: tuple[tuple[int, CheckpointKind], ...] = ()
    if q.cache_prompt:
        kind = slot.kind or MemoryKind.ATTENTION
        checkpoints = tuple(
            checkpoint_schedule(plan.resume, len(q.tokens), kind, q.message_boundaries, q.checkpoint_offsets, interval)
        )
    return Admission(pos, a.slot, plan, a.store_key, stash, discard, miss, checkpoints)


# --- where checkpoints are taken -----------------------------------------------------------------


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


# --- keeping checkpoints within a byte budget ----------------------------------------------------


@dataclass(frozen=True)
class EvictionCandidate:
    owner: int  # slot index
    position: int
    kind: CheckpointKind
    nbytes: int
    turn: int  # admission number of the task that created it (larger = newer)


def choose_evictions(
    items: Sequence[EvictionCandidate], budget: int, keep_head: int = 3, keep_tail: int = 8
) -> list[EvictionCandidate]:
    """The checkpoints to drop so that the rest fit in `budget` bytes.

    Each slot's first `keep_head` positions (the end of a shared system prompt: every new
    conversation of the same agent resumes there) and last `keep_tail` positions (the newest
    messages: appends, edits of the last message, regenerates) are kept longest; the middle of a
    long history goes first. Within each of those two tiers older turns go first, interval
    checkpoints before message boundaries, client-requested ones and prompt ends, and earlier
    positions before later ones.
    """
    ends: set[tuple[int, int]] = set()
    for owner in {i.owner for i in items}:
        positions = sorted(i.position for i in items if i.owner == owner)
        ends.update((owner, p) for p in positions[:keep_head] + positions[len(positions) - keep_tail :])
    total = sum(i.nbytes for i in items)
    out: list[EvictionCandidate] = []
    order = sorted(items, key=lambda i: ((i.owner, i.position) in ends, i.turn, _KIND_RANK[i.kind], i.position))
    for item in order:
        if total <= budget:
            break
        out.append(item)
        total -= item.nbytes
    return out


@dataclass(frozen=True)
class LogBlockView:
    """A block of kept inputs: positions [start, end) of one slot's tokens."""

    owner: int  # slot index
    start: int
    end: int
    nbytes: int
    turn: int  # admission number of the task whose forward recorded it (larger = newer)


def choose_log_evictions(
    blocks: Sequence[LogBlockView],
    checkpoints: Mapping[int, Sequence[int]],
    budget: int,
    keep_head: int = 3,
    keep_tail: int = 8,
) -> list[LogBlockView]:
    """The blocks of kept inputs to drop so that the rest fit in `budget` bytes.

    A block serves the positions after the nearest base before it (a checkpoint of its slot, or
    0). The middle of a long history goes first; then blocks after one of the slot's last
    `keep_tail` checkpoints (the newest messages and the last answer: edits, regenerates); blocks
    after the empty state or one of the first `keep_head` checkpoints (a shared system prompt, where
    every new conversation of the same agent parts) go last. Within each tier older turns go first,
    then earlier positions.
    """
    tiers: dict[int, tuple[set[int], set[int]]] = {}
    for owner, positions in checkpoints.items():
        ordered = sorted(positions)
        tiers[owner] = ({0, *ordered[:keep_head]}, set(ordered[len(ordered) - keep_tail :]))

    def tier(b: LogBlockView) -> int:
        cps = checkpoints.get(b.owner, ())
        anchor = max((c for c in cps if c <= b.start), default=0)
        head, tail = tiers.get(b.owner, ({0}, set()))
        return 2 if anchor in head else 1 if anchor in tail else 0

    total = sum(b.nbytes for b in blocks)
    out: list[LogBlockView] = []
    for b in sorted(blocks, key=lambda b: (tier(b), b.turn, b.start)):
        if total <= budget:
            break
        out.append(b)
        total -= b.nbytes
    return out


def _covered(intervals: Iterable[tuple[int, int]], first: int, last: int) -> bool:
    """Whether the closed intervals cover every integer in [first, last]."""
    at = first
    for a, b in sorted(intervals):
        if a > at:
            break
        at = max(at, b + 1)
        if at > last:
            return True
    return at > last


def subsumes(new: CachedView, old: CachedView) -> bool:
    """Whether `new` reaches every state `old` offers: old's tokens are a prefix of new's, and each
    position old can resume at exactly (its live range, its checkpoints, its replays) is reachable
    in new too, with logits wherever old has them."""
    n_old = len(old.tokens)
    if n_old > len(new.tokens) or common_prefix_len(new.tokens, old.tokens) < n_old:
        return False
    new_cps = {cp.position: cp.has_logits for cp in new.checkpoints}
    new_reach = [(first, last) for _, first, last in replay_reach(new)] + [(new.live_floor, len(new.tokens))]

    def reachable(pos: int, with_logits: bool) -> bool:
        if with_logits:
            return new_cps.get(pos, False)
        return pos in new_cps or _covered(new_reach, pos, pos)

    if old.live_floor < n_old and new.live_floor > old.live_floor:
        return False
    if not reachable(n_old, False) and n_old > 0:
        return False
    if not all(reachable(cp.position, cp.has_logits) for cp in old.checkpoints):
        return False
    return all(_covered(new_reach, first, last) for _, first, last in replay_reach(old))
