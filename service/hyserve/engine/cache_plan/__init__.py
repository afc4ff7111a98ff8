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

`plan_resume` picks where a prompt resumes on one cached sequence (`resume.py`); `plan_admissions`
picks the slot (and prefix-store entry: with `ResumeCosts`, the cheapest resume, `costs.py`) for
each queued prompt and returns every decision the engine then carries out as plain data on
`Admission` (the resume plan, whether the slot's state is stashed in the prefix store first,
whether the store entry is consumed, the checkpoint positions; `admission.py`);
`checkpoint_schedule` says where checkpoints are taken while a prompt is processed and
`chat_checkpoint_positions` where a chat is likely to diverge next time (`placement.py`);
`choose_evictions` / `choose_log_evictions` keep checkpoints and kept inputs within their byte
budgets, and `subsumes` tells when a store entry is made redundant by a newer one (`budgets.py`).
The kinds they speak of are in `kinds.py`. This package's namespace holds all of them.
"""

from hyserve.engine.cache_plan.admission import Admission, QueuedPrompt, SlotCandidate, StoreCandidate, plan_admissions
from hyserve.engine.cache_plan.budgets import (
    EvictionCandidate,
    LogBlockView,
    choose_evictions,
    choose_log_evictions,
    subsumes,
)
from hyserve.engine.cache_plan.costs import ResumeCosts
from hyserve.engine.cache_plan.kinds import CheckpointKind, MemoryKind, ReuseSource
from hyserve.engine.cache_plan.placement import (
    GENERATION_PROMPT_BOUNDARY_TOKENS,
    ChatLayout,
    chat_checkpoint_positions,
    checkpoint_schedule,
    message_token_offsets,
)
from hyserve.engine.cache_plan.resume import (
    CachedView,
    CheckpointView,
    ResumePlan,
    common_prefix_len,
    plan_resume,
    replay_reach,
    same_view,
)

__all__ = [
    "GENERATION_PROMPT_BOUNDARY_TOKENS",
    "Admission",
    "CachedView",
    "ChatLayout",
    "CheckpointKind",
    "CheckpointView",
    "EvictionCandidate",
    "LogBlockView",
    "MemoryKind",
    "QueuedPrompt",
    "ResumeCosts",
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
    "same_view",
    "subsumes",
]
