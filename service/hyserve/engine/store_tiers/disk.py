"""The disk tier of the prefix store: entries written to files, found again after a restart.

Every entry the engine stashes is also written here, on a background thread (the engine thread
only queues it): a stash is the one moment an entry is made, so writing it then keeps the disk a
superset of the host store without tracking the host store's evictions, and a crash loses only
the writes still queued. At shutdown the engine writes its slots too. Writes are crash-safe (a
temporary file, fsync, rename, fsync of the directory); a leftover temporary file is removed at
start. At start the headers are read into an index (tokens, checkpoint positions, kept runs), so
the files' prefixes are candidates of the resume decision like host entries; a chosen file is
read and checked in full on the engine thread at admission. The directory is bounded by bytes,
least recently used first (file mtime, touched on every use), and an entry another one subsumes
is deleted. A corrupt or truncated file is deleted and counted; a file of another format version
or another model is skipped and counted (it may belong to another server sharing the directory).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from hyserve.engine.cache_plan import CachedView, CheckpointView, StoreCandidate, same_view, subsumes
from hyserve.engine.prefix_store import StoredSequence
from hyserve.engine.store_tiers.format import EntryFormatError, decode_entry, encode_entry, read_header
from hyserve.engine.store_tiers.writer import BackgroundWriter

__all__ = ["DiskTier", "header_view"]

log = structlog.get_logger(__name__)

SUFFIX = ".hyc"
TEMP_SUFFIX = ".tmp"
_HEAD_BYTES = 1 << 16


def header_view(header: dict) -> CachedView:
    """What the resume plan needs of an entry, from its header alone."""
    runs: list[tuple[int, int]] = []
    for b in header["log"]:
        if runs and runs[-1][1] == b["start"]:
            runs[-1] = (runs[-1][0], b["start"] + b["n"])
        else:
            runs.append((b["start"], b["start"] + b["n"]))
    cps = tuple(CheckpointView(c["position"], c["logits"] is not None) for c in header["checkpoints"])
    return CachedView(tuple(header["tokens"]), header["live_floor"], cps, tuple(runs))


@dataclass
class _Indexed:
    path: Path
    view: CachedView
    size: int
    used: float  # mtime: last write or use


class DiskTier:
    """Entries on disk, indexed in memory. `candidates`, `load` and `put` are called by the engine
    thread; the writer thread updates the index under `_lock`."""

    def __init__(
        self,
        directory: str | Path,
        budget_bytes: int,
        identity: str,
        count: Callable[..., None] | None = None,
        count_tier: Callable[..., None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.budget = max(0, budget_bytes)
        self.identity = identity
        self._count = count or (lambda **_: None)
        self._count_tier = count_tier or (lambda *_, **__: None)
        self._lock = threading.Lock()
        self._index: dict[str, _Indexed] = {}  # file name -> entry
        self._keys: dict[int, tuple[str, CachedView]] = {}  # candidate key -> (file name, the view offered)
        self._scan()
        self._writer = BackgroundWriter("hyserve-disk-tier", self.write, self._write_failed)

    # -- index ---------------------------------------------------------------------------------

    def _scan(self) -> None:
        for path in self.directory.iterdir():
            if path.name.endswith(TEMP_SUFFIX):  # an interrupted write
                log.warning("disk_cache_temp_removed", file=path.name)
                path.unlink(missing_ok=True)
            elif path.suffix == SUFFIX:
                try:
                    with path.open("rb") as f:
                        head = f.read(_HEAD_BYTES)
                        try:
                            header = read_header(head, self.identity)
                        except EntryFormatError as exc:
                            if exc.reason != "corrupt" or "truncated header" not in str(exc):
                                raise
                            header = read_header(head + f.read(), self.identity)  # a long header
                    st = path.stat()
                    self._index[path.name] = _Indexed(path, header_view(header), st.st_size, st.st_mtime)
                except (EntryFormatError, KeyError, TypeError, OSError) as exc:
                    self._reject(path, exc)
        log.info("disk_cache_loaded", directory=str(self.directory), entries=len(self._index), bytes=self.bytes)

    def _reject(self, path: Path, exc: Exception) -> None:
        reason = exc.reason if isinstance(exc, EntryFormatError) else "corrupt"
        log.warning("disk_cache_entry_skipped", file=path.name, reason=reason, error=str(exc))
        self._count(disk_cache_rejected=1)
        self._count_tier("disk", errors=1)
        if reason == "corrupt":
            path.unlink(missing_ok=True)

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(e.size for e in self._index.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def candidates(self) -> list[StoreCandidate]:
        """The indexed entries as store candidates, with negative keys (host store keys are >= 0)."""
        with self._lock:
            items = list(self._index.items())
            self._keys = {-(i + 1): (name, item.view) for i, (name, item) in enumerate(items)}
            return [StoreCandidate(-(i + 1), item.view, "disk", item.size) for i, (_, item) in enumerate(items)]

    def load(self, key: int) -> StoredSequence | None:
        """The entry behind a candidate key, read and checked in full; None (logged, counted, and
        dropped from the index) when the file is gone, corrupt or foreign, and None (a miss) when
        the writer replaced it since it was offered (same tokens, other checkpoints): the plan was
        made for the offered one."""
        with self._lock:
            name, offered = self._keys.get(key, ("", None))
            item = self._index.get(name)
        if item is None or offered is None:
            return None
        try:
            entry = decode_entry(item.path.read_bytes(), self.identity)
            os.utime(item.path)
            item.used = item.path.stat().st_mtime
        except (EntryFormatError, OSError) as exc:
            with self._lock:
                self._index.pop(item.path.name, None)
            self._reject(item.path, exc)
            self._count_tier("disk", misses=1)
            return None
        if not same_view(entry.view(), offered):
            log.info("disk_cache_entry_replaced", file=item.path.name)
            self._count_tier("disk", misses=1)
            return None
        self._count(disk_cache_hits=1)
        self._count_tier("disk", hits=1, bytes_read=item.size)
        return entry

    # -- writes --------------------------------------------------------------------------------

    def put(self, entry: StoredSequence) -> None:
        """Queue an entry to be written (its arrays are immutable copies: safe to read later)."""
        self._writer.put(entry)

    def flush(self) -> None:
        """Wait until every queued entry is written."""
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def _write_failed(self, exc: Exception) -> None:  # a full disk or a bug: the entry stays in memory only
        self._count_tier("disk", errors=1)
        log.exception("disk_cache_write_failed")

    def write(self, entry: StoredSequence) -> bool:
        """Write one entry now (crash-safe), then keep the directory within its budget."""
        data = encode_entry(entry, self.identity)
        if len(data) > self.budget:
            return False
        name = hashlib.sha256(repr(entry.tokens).encode()).hexdigest()[:40] + SUFFIX
        path = self.directory / name
        tmp = self.directory / (name + f".{os.getpid()}{TEMP_SUFFIX}")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        view = entry.view()
        with self._lock:
            doomed = [n for n, e in self._index.items() if n != name and subsumes(view, e.view)]
            self._index[name] = _Indexed(path, view, len(data), path.stat().st_mtime)
            total = sum(e.size for e in self._index.values())
            for n in sorted((n for n in self._index if n != name), key=lambda n: self._index[n].used):
                if total - sum(self._index[d].size for d in doomed) <= self.budget:
                    break
                if n not in doomed:
                    doomed.append(n)
            for n in doomed:
                self._index.pop(n).path.unlink(missing_ok=True)
        self._count(disk_cache_writes=1, disk_cache_evicted=len(doomed))
        self._count_tier("disk", writes=1, bytes_written=len(data))
        return True
