"""The kinds the cache's decisions speak of: where a prompt's reused tokens come from, what a slot's
memory is made of, and what a checkpoint marks (with the rank that names a shared position)."""

from __future__ import annotations

from enum import Enum

__all__ = ["CheckpointKind", "MemoryKind", "ReuseSource"]


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
