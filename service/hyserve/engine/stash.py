"""Where a slot's whole state goes before the slot is reused, and where it comes back from: the
host-memory prefix store, and the disk tier behind it (`--cache-dir`). Engine thread only.

Every stash goes to both tiers: the disk stays a superset of the host store without tracking its
evictions. Host entries have keys >= 0, disk entries keys < 0 (`DiskTier`)."""

from __future__ import annotations

from importlib import metadata

import numpy as np
import structlog

from hyserve.engine.cache_plan import ResumePlan, StoreCandidate
from hyserve.engine.checkpoints import CheckpointList
from hyserve.engine.config import EngineConfig
from hyserve.engine.prefix_store import PrefixStore, StoredSequence
from hyserve.engine.shared import Shared
from hyserve.engine.slot import Slot
from hyserve.engine.store_tiers import DiskTier
from hyserve.model.architectures.base import Architecture

__all__ = ["StateStash", "export_slot"]

log = structlog.get_logger(__name__)


def _kernels_version() -> str:
    try:
        return metadata.version("hyserve-kernels")
    except metadata.PackageNotFoundError:
        return "unknown"


def export_slot(slot: Slot) -> StoredSequence:
    """A slot's whole state as a store entry (host copies)."""
    return StoredSequence(
        tuple(slot.tokens),
        slot.memory.export(),
        # host copies: a GPU slot's checkpoints hold device states
        CheckpointList([cp.with_snapshot(slot.memory.host_snapshot(cp.snapshot)) for cp in slot.checkpoints]),
        0 if slot.memory.truncatable else len(slot.tokens),  # the image keeps only the end's state
        slot.log.up_to(len(slot.tokens)),
    )


class StateStash:
    def __init__(self, arch: Architecture, config: EngineConfig, shared: Shared) -> None:
        self.arch = arch
        self.shared = shared
        self.store = PrefixStore(config.cache_memory)
        self.disk: DiskTier | None = None
        if config.cache_dir and config.cache_disk_bytes > 0:
            # the file, the architecture, where the math runs and the kernels' build decide the bits;
            # ring-buffer window layers keep no full KV in an entry: their entries fit ring memory only
            parts = (config.model_identity, arch.name, arch.ops.name, _kernels_version(), str(config.window_ring))
            self.disk = DiskTier(config.cache_dir, config.cache_disk_bytes, "|".join(parts), shared.count)

    @property
    def enabled(self) -> bool:
        return self.store.enabled or self.disk is not None

    def candidates(self) -> list[StoreCandidate]:
        # host entries first: on a tie the plan keeps the earlier candidate
        found = self.store.candidates() if self.store.enabled else []
        return found + (self.disk.candidates() if self.disk is not None else [])

    def get(self, key: int) -> StoredSequence | None:
        """The entry of a planned key; a disk entry is read here, on the engine thread (None:
        unreadable, already logged and counted)."""
        if key >= 0:
            return self.store.get(key)
        if self.disk is None:
            return None
        entry = self.disk.load(key)
        if entry is not None:
            entry.key = key
        return entry

    def put(self, slot: Slot) -> None:
        """Copy a slot's whole state (memory + checkpoints) before it is overwritten."""
        if not self.enabled or not slot.tokens:
            return
        entry = export_slot(slot)
        if self.disk is not None:
            self.disk.put(entry)
        if not self.store.enabled:
            return
        stored, evicted = self.store.put(entry)
        self.shared.count(prefix_store_evicted=evicted)
        log.info("slot_stashed", slot=slot.index, tokens=len(entry.tokens), bytes=entry.nbytes, stored=stored)

    def load(self, slot: Slot, entry: StoredSequence, plan: ResumePlan) -> np.ndarray | None:
        """Put `entry` into the slot up to the plan's resume point; the logits to sample from when
        the plan resumes at the prompt end."""
        cp = entry.checkpoints.get(plan.restore) if plan.restore is not None else None
        dropped = slot.checkpoints.clear()
        if plan.replay_from is None:
            slot.load(entry, plan.resume, cp)
        else:
            slot.load_for_replay(entry, plan.replay_from, cp, plan.resume)
            self.shared.count(replays=1, replayed_tokens=slot.replay(self.arch, entry.tokens, plan.resume))
        self.shared.count(checkpoints_invalidated=len(dropped), restores=1, prefix_store_hits=1)
        return cp.logits if cp is not None and plan.from_logits else None

    def close(self, slots: list[Slot]) -> None:
        """At shutdown: what the slots hold goes to disk too, so it survives a restart."""
        if self.disk is None:
            return
        for slot in slots:
            if slot.tokens:
                self.disk.put(export_slot(slot))
        self.disk.close()
