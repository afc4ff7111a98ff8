"""What the engine reports: per-slot snapshots, cumulative counters and memory use.

The engine thread builds these (`slot_snapshots`, `memory_usage`) after each iteration and
publishes them under the shared lock; `Engine.stats()` hands out copies to any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from hyserve.engine.cache_plan import CheckpointKind, ResumeCosts
from hyserve.engine.prefix_store import PrefixStore
from hyserve.engine.slot import Slot

__all__ = [
    "STORE_TIERS",
    "CheckpointInfo",
    "EngineCounters",
    "EngineStats",
    "MemoryUsage",
    "SlotSnapshot",
    "SlotState",
    "StoreSnapshot",
    "TierCounters",
    "memory_usage",
    "slot_snapshots",
]


class SlotState(Enum):
    IDLE = "idle"
    PROCESSING_PROMPT = "processing_prompt"
    GENERATING = "generating"


@dataclass(frozen=True)
class CheckpointInfo:
    position: int
    kind: CheckpointKind
    nbytes: int
    has_logits: bool


@dataclass(frozen=True)
class SlotSnapshot:
    index: int
    state: SlotState
    task_id: str
    cached_tokens: int
    checkpoints: tuple[CheckpointInfo, ...] = ()


STORE_TIERS = ("memory", "disk", "shared")  # the prefix store's tiers, nearest first


@dataclass
class TierCounters:
    """One tier of the prefix store: what it served, what it missed, its traffic and failures."""

    hits: int = 0  # entries restored into a slot from this tier
    misses: int = 0  # lookups or loads that found nothing usable there
    writes: int = 0  # entries written to it
    bytes_read: int = 0
    bytes_written: int = 0
    errors: int = 0  # failures: unreachable, timed out, full, rejected (corrupt, foreign) entries
    dropped: int = 0  # entries not written because the writer was behind
    read_seconds: float = 0.0  # engine time spent reading it: lookups, loads, restores into slots
    passed_over: int = 0  # entries that resumed further than a slot, not taken: reading them cost more


@dataclass
class EngineCounters:
    prompt_tokens_received: int = 0
    prompt_tokens_reused: int = 0
    prompt_tokens_processed: int = 0
    full_reprocess_by_reason: dict[str, int] = field(default_factory=dict)
    reprocessed_tokens_by_reason: dict[str, int] = field(default_factory=dict)
    restores: int = 0
    checkpoints_created: int = 0
    checkpoints_evicted: int = 0
    checkpoints_invalidated: int = 0
    prefix_store_hits: int = 0
    prefix_store_misses: int = 0
    prefix_store_evicted: int = 0
    disk_cache_hits: int = 0  # disk-tier entries restored into a slot
    disk_cache_writes: int = 0  # entries written to the disk tier
    disk_cache_evicted: int = 0  # disk-tier files deleted for the byte budget or subsumed
    disk_cache_rejected: int = 0  # disk-tier files skipped: corrupt, truncated, other version or model
    replays: int = 0  # resumes that replayed kept inputs
    replayed_tokens: int = 0  # positions advanced by those replays (no forward pass)
    input_blocks_evicted: int = 0  # blocks of kept inputs dropped for the byte budget
    spec_drafts: int = 0  # verifying rows run (speculative decoding)
    spec_draft_tokens: int = 0  # tokens drafted in them
    spec_accepted_tokens: int = 0  # drafted tokens emitted (the model's own sample agreed)
    invariant_checks: int = 0  # slot/entry checks of I1-I3 (EngineConfig.check_invariants)
    invariant_violations: int = 0
    tiers: dict[str, TierCounters] = field(default_factory=lambda: {t: TierCounters() for t in STORE_TIERS})

    def copy(self) -> EngineCounters:
        c = replace(self)
        c.tiers = {t: replace(v) for t, v in self.tiers.items()}
        c.full_reprocess_by_reason = dict(self.full_reprocess_by_reason)
        c.reprocessed_tokens_by_reason = dict(self.reprocessed_tokens_by_reason)
        return c


@dataclass(frozen=True)
class StoreSnapshot:
    entries: int = 0
    nbytes: int = 0
    budget: int = 0


@dataclass(frozen=True)
class MemoryUsage:
    """Bytes the slots and the prompt cache hold, by where they live."""

    device_bytes: int = 0
    host_bytes: int = 0


@dataclass(frozen=True)
class EngineStats:
    slots: tuple[SlotSnapshot, ...]
    counters: EngineCounters
    queued: int
    store: StoreSnapshot = StoreSnapshot()
    memory: MemoryUsage = MemoryUsage()
    # what the admission plan prices resumes with (pinned or measured); None: the furthest resume
    resume_costs: ResumeCosts | None = None


def slot_snapshots(slots: Sequence[Slot]) -> tuple[SlotSnapshot, ...]:
    out = []
    for slot in slots:
        run = slot.run
        if run is None:
            state, task_id = SlotState.IDLE, ""
        elif run.pos < len(run.prompt):
            state, task_id = SlotState.PROCESSING_PROMPT, run.task.id
        else:
            state, task_id = SlotState.GENERATING, run.task.id
        checkpoints = tuple(
            CheckpointInfo(cp.position, cp.kind, cp.nbytes, cp.logits is not None) for cp in slot.checkpoints
        )
        out.append(SlotSnapshot(slot.index, state, task_id, len(slot.tokens), checkpoints))
    return tuple(out)


def memory_usage(slots: Sequence[Slot], store: PrefixStore) -> MemoryUsage:
    host = store.bytes + sum(s.memory.host_bytes + s.checkpoints.nbytes + s.log.nbytes for s in slots)
    device = sum(s.memory.device_bytes + s.checkpoints.device_nbytes for s in slots)
    return MemoryUsage(device, host - sum(s.checkpoints.device_nbytes for s in slots))
