"""The background writer the disk and shared tiers share: the engine thread queues an entry and
goes on; one thread writes the entries in order, and a failed write is reported, never raised."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from hyserve.engine.prefix_store import StoredSequence

__all__ = ["BackgroundWriter"]


class BackgroundWriter:
    """`write` runs on the writer thread for every queued entry; `on_error` gets what it raised
    (called inside the handler: a logger's `exception` sees the traceback)."""

    def __init__(
        self,
        name: str,
        write: Callable[[StoredSequence], object],
        on_error: Callable[[Exception], None],
        max_queued: int = 0,  # 0: unbounded
    ) -> None:
        self._write = write
        self._on_error = on_error
        self._queue: queue.Queue[StoredSequence | None] = queue.Queue(maxsize=max_queued)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, entry: StoredSequence) -> bool:
        """Queue an entry (its arrays are immutable host copies); False when the queue is full."""
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            return False
        return True

    def flush(self) -> None:
        """Wait until every queued entry is written."""
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            entry = self._queue.get()
            try:
                if entry is None:
                    return
                self._write(entry)
            except Exception as exc:
                self._on_error(exc)
            finally:
                self._queue.task_done()
