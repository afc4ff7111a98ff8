"""The host-memory prefix store: states of conversations whose slot was taken over, keyed by tokens.

An entry holds a full copy of a slot's memory (KV entries + recurrent state at its end), the
slot's checkpoints and its kept inputs. A later prompt sharing a prefix restores it into whichever slot it gets
(cache_plan.plan_admissions decides). Bytes are bounded: least recently used entries go first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from hyserve.engine.cache_plan import CachedView, StoreCandidate, subsumes
from hyserve.engine.checkpoints import CheckpointList
from hyserve.engine.input_log import InputLog
from hyserve.model.memory import MemoryImage

__all__ = ["PrefixStore", "StoredSequence"]


@dataclass(eq=False)
class StoredSequence:
    tokens: tuple[int, ...]
    image: MemoryImage
    checkpoints: CheckpointList
    live_floor: int  # as the slot's memory had it: 0 when any prefix is reachable by truncation
    log: InputLog = field(default_factory=InputLog)  # the slot's kept inputs (replays)
    key: int = -1
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = self.image.nbytes + self.checkpoints.nbytes + self.log.nbytes

    def view(self) -> CachedView:
        return CachedView(self.tokens, self.live_floor, self.checkpoints.views(), self.log.runs())


class PrefixStore:
    def __init__(self, budget_bytes: int) -> None:
        self.budget = max(0, budget_bytes)
        self._entries: OrderedDict[int, StoredSequence] = OrderedDict()  # oldest use first
        self._next_key = 0
        self.bytes = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredSequence) -> tuple[bool, int]:
        """Store an entry, dropping entries it makes redundant and then the least recently used
        ones until it fits. Returns (stored, entries evicted); an entry larger than the whole
        budget is not stored."""
        if entry.nbytes > self.budget:
            return False, 0
        view = entry.view()
        for key, old in list(self._entries.items()):
            if subsumes(view, old.view()):
                self._drop(key)
        evicted = 0
        while self.bytes + entry.nbytes > self.budget:
            self._drop(next(iter(self._entries)))
            evicted += 1
        entry.key = self._next_key
        self._next_key += 1
        self._entries[entry.key] = entry
        self.bytes += entry.nbytes
        return True, evicted

    def entries(self) -> list[StoredSequence]:
        return list(self._entries.values())

    def candidates(self) -> list[StoreCandidate]:
        return [StoreCandidate(key, e.view(), "memory", e.nbytes) for key, e in self._entries.items()]

    def get(self, key: int) -> StoredSequence:
        entry = self._entries[key]
        self._entries.move_to_end(key)
        return entry

    def discard(self, key: int) -> None:
        """Remove the entry if it is still stored."""
        if key in self._entries:
            self._drop(key)

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.nbytes
