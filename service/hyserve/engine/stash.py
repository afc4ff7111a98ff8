"""Where a slot's whole state goes before the slot is reused, and where it comes back from: the
host-memory prefix store, the disk tier behind it (`--cache-dir`) and the shared tier on Redis
(`--cache-redis`), which every replica reads. Engine thread only.

Every stash goes to every tier: the disk stays a superset of the host store without tracking its
evictions. The shared tier also gets each slot's state when a task finishes, so another replica
resumes the conversation after this one is gone. Host entries have keys >= 0, disk entries small
keys < 0 (`DiskTier`), shared entries keys <= SHARED_KEY_BASE."""

from __future__ import annotations

import time
from importlib import metadata

import numpy as np
import structlog

from hyserve.engine.cache_plan import ResumePlan, ReuseSource, StoreCandidate
from hyserve.engine.checkpoints import CheckpointList
from hyserve.engine.config import EngineConfig
from hyserve.engine.prefix_store import PrefixStore, StoredSequence
from hyserve.engine.resume_rates import ResumeRates
from hyserve.engine.shared import Shared
from hyserve.engine.slot import Slot
from hyserve.engine.store_tiers import DiskTier
from hyserve.engine.store_tiers.shared import SHARED_KEY_BASE, SharedTier
from hyserve.model.architectures.base import Architecture

__all__ = ["StateStash", "export_slot", "tier_of"]

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


def tier_of(key: int) -> str:
    """The tier a store candidate's key belongs to."""
    return "memory" if key >= 0 else "disk" if key > SHARED_KEY_BASE else "shared"


class StateStash:
    def __init__(self, arch: Architecture, config: EngineConfig, shared: Shared) -> None:
        self.arch = arch
        self.shared = shared
        self.store = PrefixStore(config.cache_memory)
        self.disk: DiskTier | None = None
        self.shared_tier: SharedTier | None = None
        self.served_by: dict[int, str] = {}  # slot index -> the tier of the entry it was last loaded from
        self.rates = ResumeRates(config.resume_rates, config.resume_choice == "cheapest")
        self._read_seconds: dict[int, float] = {}  # entry key -> seconds its tier took to read it (get)
        # the file, the architecture, where the math runs and the kernels' build decide the bits;
        # ring-buffer window layers keep no full KV in an entry: their entries fit ring memory only
        parts = (config.model_identity, arch.name, arch.ops.name, _kernels_version(), str(config.window_ring))
        if config.cache_dir and config.cache_disk_bytes > 0:
            self.disk = DiskTier(
                config.cache_dir, config.cache_disk_bytes, "|".join(parts), shared.count, shared.count_tier
            )
        if config.shared_cache is not None:
            self.shared_tier = SharedTier(config.shared_cache, "|".join(parts), shared.count_tier)

    @property
    def enabled(self) -> bool:
        return self.store.enabled or self.disk is not None or self.shared_tier is not None

    def lookup(self, prompts: list[tuple[int, ...]], slots: list[Slot]) -> None:
        """Ask the shared tier about the waiting prompts that nothing here resumes as far as the
        shared tier could (its index knows whole blocks only); called outside the shared lock."""
        if self.shared_tier is None:
            return
        local = [s.tokens for s in slots] + [c.view.tokens for c in self._local_candidates()]
        block = self.shared_tier.block
        asked = [p for p in prompts if _best_prefix(p, local) < len(p) // block * block]
        if asked:
            start = time.perf_counter()
            self.shared_tier.lookup(asked)
            self.shared.count_tier("shared", read_seconds=time.perf_counter() - start)

    def _local_candidates(self) -> list[StoreCandidate]:
        # host entries first: on a tie the plan keeps the earlier candidate
        found = self.store.candidates() if self.store.enabled else []
        return found + (self.disk.candidates() if self.disk is not None else [])

    def candidates(self) -> list[StoreCandidate]:
        shared = self.shared_tier.candidates() if self.shared_tier is not None else []
        return self._local_candidates() + shared

    def get(self, key: int) -> StoredSequence | None:
        """The entry of a planned key; a disk entry is read here, on the engine thread (None:
        unreadable, already logged and counted)."""
        if key >= 0:
            return self.store.get(key)
        name = tier_of(key)
        tier = self.disk if name == "disk" else self.shared_tier
        if tier is None:
            return None
        start = time.perf_counter()
        entry = tier.load(key)
        seconds = time.perf_counter() - start
        self.shared.count_tier(name, read_seconds=seconds)
        if entry is not None:
            entry.key = key
            self._read_seconds[key] = seconds
        return entry

    def put(self, slot: Slot) -> None:
        """Copy a slot's whole state (memory + checkpoints) before it is overwritten."""
        if not self.enabled or not slot.tokens:
            return
        entry = export_slot(slot)
        if self.disk is not None:
            self.disk.put(entry)
        if self.shared_tier is not None:
            self.shared_tier.put(entry)
        if not self.store.enabled:
            return
        stored, evicted = self.store.put(entry)
        self.shared.count(prefix_store_evicted=evicted)
        if stored:
            self.shared.count_tier("memory", writes=1, bytes_written=entry.nbytes)
        log.info("slot_stashed", slot=slot.index, tokens=len(entry.tokens), bytes=entry.nbytes, stored=stored)

    def load(self, slot: Slot, entry: StoredSequence, plan: ResumePlan) -> np.ndarray | None:
        """Put `entry` into the slot up to the plan's resume point; the logits to sample from when
        the plan resumes at the prompt end."""
        start = time.perf_counter()
        cp = entry.checkpoints.get(plan.restore) if plan.restore is not None else None
        dropped = slot.checkpoints.clear()
        tier = tier_of(entry.key)
        if plan.replay_from is None:
            slot.load(entry, plan.resume, cp)
        else:
            slot.load_for_replay(entry, plan.replay_from, cp, plan.resume)
        # what moving the entry cost, the tier's read included (a replay after it is not a read)
        self.rates.entry_read(tier, entry.nbytes, time.perf_counter() - start + self._read_seconds.pop(entry.key, 0.0))
        if plan.replay_from is not None:
            self.shared.count(replays=1, replayed_tokens=slot.replay(self.arch, entry.tokens, plan.resume))
        self.shared.count(checkpoints_invalidated=len(dropped), restores=1, prefix_store_hits=1)
        self.served_by[slot.index] = tier
        if tier == "memory":
            self.shared.count_tier("memory", hits=1, bytes_read=entry.nbytes)
        self.shared.count_tier(tier, read_seconds=time.perf_counter() - start)  # the restore into the slot
        return cp.logits if cp is not None and plan.from_logits else None

    def tier_served(self, slot: int, source: ReuseSource) -> str:
        """The tier whose entry a resume with this source was loaded from ("" unless from the store)."""
        return self.served_by.get(slot, "") if source is ReuseSource.PREFIX_STORE else ""

    def finished(self, slot: Slot) -> None:
        """A task ended on this slot: its state goes to the shared tier (queued), so the next turn
        resumes on any replica, even after this one is killed."""
        if self.shared_tier is not None and len(slot.tokens) >= self.shared_tier.block and slot.consistent():
            self.shared_tier.put(export_slot(slot))

    def close(self, slots: list[Slot]) -> None:
        """At shutdown: what the slots hold goes to disk too, so it survives a restart."""
        if self.shared_tier is not None:
            self.shared_tier.close()
        if self.disk is None:
            return
        for slot in slots:
            if slot.tokens:
                self.disk.put(export_slot(slot))
        self.disk.close()


def _best_prefix(prompt: tuple[int, ...], cached: list) -> int:
    """The longest common prefix of the prompt with any cached token sequence."""
    best = 0
    want = np.asarray(prompt, dtype=np.int64)
    for tokens in cached:
        n = min(len(prompt), len(tokens))
        if n <= best:
            continue
        differ = np.flatnonzero(np.asarray(tokens[:n], dtype=np.int64) != want[:n])
        best = max(best, int(differ[0]) if differ.size else n)
    return best
