"""Cancels that arrive before their task: a client that chooses its own task id may send Cancel
while its Generate is still being validated and tokenized. Such a cancel is remembered for a short
window, keyed by (owner, task id), and applied when a task with that key is submitted, so it is
not lost; a different owner's task with the same id is never touched.

No entry outlives its window (expired ones are dropped on every call) and the number of entries
is bounded (the oldest go first). Such a Cancel answers CANCEL_STATUS_PENDING, whether a Generate
with that id ever comes or not (the server cannot know), and so does a Cancel of another owner's
task: the answer must not tell a caller which ids exist. Only well-formed ids are kept (the
servicer checks), so an entry's size is bounded too. Single-threaded: the asyncio loop calls it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["DEFAULT_WINDOW_S", "EarlyCancels"]

DEFAULT_WINDOW_S = 10.0
DEFAULT_MAX_ENTRIES = 10_000

Key = tuple[str, str]  # (owner, task id); owner "" until tasks carry their caller's identity


class EarlyCancels:
    def __init__(
        self,
        window_s: float = DEFAULT_WINDOW_S,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0 or max_entries < 1:
            raise ValueError("window_s must be > 0 and max_entries >= 1")
        self.window_s = window_s
        self.max_entries = max_entries
        self._clock = clock
        self._expiry: OrderedDict[Key, float] = OrderedDict()  # in order of arrival, so of expiry

    def remember(self, task_id: str, owner: str = "") -> None:
        """A Cancel found no task with this id: keep it for the window."""
        now = self._clock()
        self._prune(now)
        key = (owner, task_id)
        self._expiry.pop(key, None)
        self._expiry[key] = now + self.window_s
        while len(self._expiry) > self.max_entries:
            self._expiry.popitem(last=False)

    def take(self, task_id: str, owner: str = "") -> bool:
        """A task with this id was just submitted: True (and forget it) if a cancel for it is waiting."""
        self._prune(self._clock())
        return self._expiry.pop((owner, task_id), None) is not None

    def __len__(self) -> int:
        self._prune(self._clock())
        return len(self._expiry)

    def _prune(self, now: float) -> None:
        while self._expiry:
            key, expiry = next(iter(self._expiry.items()))
            if expiry > now:
                break
            del self._expiry[key]
