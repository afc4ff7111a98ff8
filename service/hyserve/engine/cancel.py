"""A task's own cancel flag. There is deliberately no process-wide stop flag anywhere.

The flag is a `threading.Event`: setting it from the asyncio side (Cancel RPC, client disconnect,
deadline) and reading it from the engine thread needs no further locking. The engine reads it at
every step boundary (between prompt chunks and decode steps).
"""

from __future__ import annotations

import threading
from enum import Enum


class CancelSource(Enum):
    """Who asked for the cancel (kept for logs; the effect on the task is the same)."""

    RPC = "cancel_rpc"
    CLIENT_GONE = "client_gone"  # the Generate call was cancelled by its client or its deadline passed
    SHUTDOWN = "shutdown"  # the server's drain deadline passed with the task still running


class CancelFlag:
    """Set once, never cleared. Owned by exactly one task."""

    __slots__ = ("_event", "source")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.source: CancelSource | None = None

    def set(self, source: CancelSource) -> None:
        if not self._event.is_set():
            self.source = source
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def __bool__(self) -> bool:
        return self._event.is_set()
