"""The shared tier of the prefix store: entries in Redis (or Valkey), seen by every replica.

An entry is stored as in a disk file (`format.encode_entry`: versioned, checksummed, tied to the
model and build) under keys named by the identity's hash and the entry's id (the hash of its
tokens):

- `<ns>:c:<id>:<i>`: the encoded entry in chunks of at most `chunk_bytes`;
- `<ns>:m:<id>`: the chunk count and size, then the entry's header (tokens, checkpoint positions,
  kept runs: what the resume plan needs, no arrays);
- `<ns>:i:<h>`: the id of the newest entry whose first `k * BLOCK` tokens hash to `h` (a chained
  hash, one key per block boundary of the entry).

A lookup is one round trip: a server-side script walks the prompt's block hashes from the longest
down and returns the first header it finds. A load is one more: all chunks and the header in one
MGET (a header changed since the lookup means the entry was rewritten: a miss, the plan was made
for the old one). Every key gets the TTL, and the server's `maxmemory` policy may drop any of
them: a missing key is a miss, a chunk that does not check out (checksum, identity, tokens) is a
miss counted as an error, never a restored state. Writes go through a bounded queue to a writer
thread (the engine thread never waits on the network to write); a full queue drops the entry.
Reads use a short socket timeout; after a failure the tier is skipped for a moment instead of
waiting on every admission.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import redis
import structlog

from hyserve.engine.cache_plan import CachedView, StoreCandidate, same_view
from hyserve.engine.prefix_store import StoredSequence
from hyserve.engine.store_tiers.disk import header_view
from hyserve.engine.store_tiers.format import EntryFormatError, decode_entry, encode_entry, read_header
from hyserve.engine.store_tiers.writer import BackgroundWriter

__all__ = ["BLOCK", "SHARED_KEY_BASE", "SharedTier", "SharedTierConfig", "block_hashes"]

log = structlog.get_logger(__name__)

BLOCK = 128  # tokens between index keys by default: a prompt shorter than one block is never looked up
SHARED_KEY_BASE = -(1 << 40)  # candidate keys <= this are shared-tier entries (disk keys are small negatives)
_RETRY_AFTER_S = 2.0  # after a failure, lookups and writes skip the tier this long

# KEYS: the prompt's index keys, longest prefix first; ARGV[1]: the namespace. Returns
# {block count, header} of the first index key whose entry's header still exists, or nil.
_LOOKUP = """
for i, key in ipairs(KEYS) do
  local id = redis.call('GET', key)
  if id then
    local meta = redis.call('GET', ARGV[1] .. ':m:' .. id)
    if meta then return {#KEYS - i + 1, id, meta} end
  end
end
return nil
"""


@dataclass(frozen=True)
class SharedTierConfig:
    url: str  # redis://, rediss:// (TLS) or unix://; user and password may be in it
    password: str | None = None  # used when the URL has none (--cache-redis-password-file)
    ttl_s: int = 86400  # every key's time to live (0: none, the server's maxmemory policy decides)
    timeout_s: float = 0.2  # socket timeout of lookups and loads (per read, not per transfer)
    chunk_bytes: int = 8 << 20
    queue_entries: int = 2  # entries waiting to be written (each holds host copies of a state)
    block_tokens: int = BLOCK  # tokens between index keys (small ones only in tests: more keys)
    # rediss:// only: the CA bundle that verifies the store's certificate (None: the system's), and
    # the client certificate and key for mutual TLS (both or neither)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def tls_arguments(self) -> dict[str, str]:
        """redis-py's `ssl_*` keyword arguments of the TLS files (the URL's own `ssl_*` query
        parameters win over them)."""
        files = {"ssl_ca_certs": self.ca_file, "ssl_certfile": self.cert_file, "ssl_keyfile": self.key_file}
        given = {name: path for name, path in files.items() if path is not None}
        if given and urlsplit(self.url).scheme.lower() != "rediss":
            # a plain connection would refuse the ssl_* arguments only on its first command
            raise ValueError("TLS files need a rediss:// URL")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        return given


def block_hashes(tokens: Sequence[int], n_blocks: int, block: int = BLOCK) -> list[str]:
    """Chained SHA-256 of the first k * block tokens, k = 1..n_blocks."""
    data = np.asarray(tokens[: n_blocks * block], dtype=np.uint32).tobytes()
    h = hashlib.sha256()
    out = []
    for k in range(n_blocks):
        h.update(data[k * block * 4 : (k + 1) * block * 4])
        out.append(h.copy().hexdigest()[:32])
    return out


def _entry_id(tokens: Sequence[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, dtype=np.uint32).tobytes()).hexdigest()[:32]


@dataclass
class _Found:
    entry_id: str
    view: CachedView
    chunks: int
    size: int
    meta: bytes  # the header as looked up: a load that finds another was rewritten since


class SharedTier:
    """`lookup`, `candidates`, `load` and `put` are called by the engine thread; `count_tier`
    (`Shared.count_tier`) takes the tier's counters under the shared lock."""

    def __init__(self, config: SharedTierConfig, identity: str, count_tier: Callable[..., None]) -> None:
        self.config = config
        self.block = config.block_tokens
        self.identity = identity
        self.ns = "hyserve:" + hashlib.sha256(identity.encode()).hexdigest()[:24]
        self._count = count_tier
        kwargs: dict[str, Any] = {"socket_timeout": config.timeout_s, "socket_connect_timeout": config.timeout_s}
        if config.password is not None:
            kwargs["password"] = config.password
        kwargs.update(config.tls_arguments())
        # from_url: the URL's own user/password and TLS settings win over these keyword arguments
        self._client = redis.Redis.from_url(config.url, **kwargs)
        # writes send up to chunk_bytes per command: a longer timeout than lookups
        self._writer_client = redis.Redis.from_url(
            config.url, **{**kwargs, "socket_timeout": 10 * config.timeout_s + 5}
        )
        self._lookup = self._client.register_script(_LOOKUP)
        self._found: dict[int, _Found] = {}
        self._skip_until = 0.0
        # what was written lately: a slot stashed right after its task finished is not sent twice
        self._recent: deque[tuple[object, ...]] = deque(maxlen=16)
        self._writer = BackgroundWriter(
            "hyserve-shared-tier", self.write, self._write_failed, max_queued=max(1, config.queue_entries)
        )
        log.info(
            "shared_cache_configured",
            url=_redacted(config.url),
            ttl_s=config.ttl_s,
            namespace=self.ns,
            mutual_tls=config.cert_file is not None,
        )

    # -- failures ------------------------------------------------------------------------------

    def _available(self) -> bool:
        return time.monotonic() >= self._skip_until

    def _failed(self, what: str, exc: BaseException) -> None:
        self._skip_until = time.monotonic() + _RETRY_AFTER_S
        self._count("shared", errors=1)
        log.warning("shared_cache_error", op=what, error_type=type(exc).__name__, error=str(exc)[:200])

    # -- reads ---------------------------------------------------------------------------------

    def lookup(self, prompts: Sequence[Sequence[int]]) -> None:
        """Find the entry that shares the longest block-aligned prefix with each prompt (one
        round trip each); `candidates` returns them until the next lookup."""
        self._found = {}
        for prompt in prompts:
            n_blocks = len(prompt) // self.block
            if n_blocks == 0:
                continue
            if not self._available():
                self._count("shared", misses=1)
                continue
            keys = [f"{self.ns}:i:{h}" for h in reversed(block_hashes(prompt, n_blocks, self.block))]
            try:
                reply = self._lookup(keys=keys, args=[self.ns])
            except redis.RedisError as exc:
                self._failed("lookup", exc)
                continue
            found = self._parse(reply) if reply else None
            if found is None:
                self._count("shared", misses=1)
            elif found.entry_id not in {f.entry_id for f in self._found.values()}:
                self._found[SHARED_KEY_BASE - len(self._found)] = found

    def _parse(self, reply: Any) -> _Found | None:
        try:
            _, entry_id, meta = reply
            entry_id = entry_id.decode()
            line, _, head = bytes(meta).partition(b"\n")
            info = json.loads(line)
            view = header_view(read_header(head, self.identity))
            if _entry_id(view.tokens) != entry_id:
                raise EntryFormatError("corrupt", "header does not name its entry")
            self._count("shared", bytes_read=len(meta))
            return _Found(entry_id, view, int(info["chunks"]), int(info["size"]), bytes(meta))
        except (EntryFormatError, ValueError, KeyError, TypeError, AttributeError) as exc:
            # junk under our keys (another writer, a bug, an operator): a miss, and said so
            self._count("shared", misses=1, errors=1)
            log.warning("shared_cache_entry_rejected", op="lookup", error=str(exc)[:200])
            return None

    def candidates(self) -> list[StoreCandidate]:
        return [StoreCandidate(key, found.view, "shared", found.size) for key, found in self._found.items()]

    def load(self, key: int) -> StoredSequence | None:
        """The entry behind a candidate key (one MGET of its chunks), checked in full; None
        (counted, logged) when a chunk is gone, does not check out, or the server fails."""
        found = self._found.get(key)
        if found is None:
            return None
        names = [f"{self.ns}:c:{found.entry_id}:{i}" for i in range(found.chunks)]
        try:  # the header too: a write is one transaction, so chunks and header are of one entry
            *parts, meta = self._client.mget([*names, f"{self.ns}:m:{found.entry_id}"])
        except redis.RedisError as exc:
            self._failed("load", exc)
            return None
        if meta is not None and bytes(meta) != found.meta:  # rewritten since the lookup: the plan fits the old one
            self._count("shared", misses=1)
            log.info("shared_cache_entry_replaced", entry=found.entry_id)
            return None
        if any(p is None for p in parts):  # expired or evicted by the server: a plain miss
            self._count("shared", misses=1)
            log.info("shared_cache_entry_incomplete", entry=found.entry_id, missing=sum(p is None for p in parts))
            return None
        data = b"".join(parts)
        del parts  # a GiB-sized entry: not held twice while it is checked and restored
        self._count("shared", bytes_read=len(data))
        try:
            if len(data) != found.size:
                raise EntryFormatError("corrupt", f"{len(data)} bytes, {found.size} expected")
            entry = decode_entry(data, self.identity)
            if not same_view(entry.view(), found.view):  # tokens, checkpoints, kept runs
                raise EntryFormatError("corrupt", "entry differs from its header")
        except EntryFormatError as exc:
            self._count("shared", misses=1, errors=1)
            log.warning("shared_cache_entry_rejected", op="load", entry=found.entry_id, error=str(exc)[:200])
            return None
        self._count("shared", hits=1)
        return entry

    # -- writes --------------------------------------------------------------------------------

    def put(self, entry: StoredSequence) -> None:
        """Queue an entry to be written (its arrays are immutable host copies); dropped, and
        counted, when the writer is behind."""
        if len(entry.tokens) < self.block or not self._available() or _signature(entry) in self._recent:
            return
        if not self._writer.put(entry):
            self._count("shared", dropped=1)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
        self._client.close()
        self._writer_client.close()

    def _write_failed(self, exc: Exception) -> None:
        if isinstance(exc, redis.RedisError):  # down, slow, full (OOM): the entry stays local
            self._failed("write", exc)
        else:  # a bug: logged with its traceback, the engine goes on
            self._count("shared", errors=1)
            log.exception("shared_cache_write_failed")

    def write(self, entry: StoredSequence) -> int:
        """Write one entry now (chunks, header, index keys in one transaction); its size."""
        data = encode_entry(entry, self.identity)
        head = read_header_bytes(data)
        entry_id = _entry_id(entry.tokens)
        step = self.config.chunk_bytes
        chunks = [data[i : i + step] for i in range(0, len(data), step)]
        meta = json.dumps({"chunks": len(chunks), "size": len(data)}).encode() + b"\n" + head
        ttl = self.config.ttl_s or None
        # MULTI/EXEC: a reader's MGET sees all chunks of one write or of the other, never a mix;
        # a server out of memory (noeviction) refuses the whole transaction
        pipe = self._writer_client.pipeline(transaction=True)
        for i, chunk in enumerate(chunks):
            pipe.set(f"{self.ns}:c:{entry_id}:{i}", chunk, ex=ttl)
        pipe.set(f"{self.ns}:m:{entry_id}", meta, ex=ttl)
        for h in block_hashes(entry.tokens, len(entry.tokens) // self.block, self.block):
            pipe.set(f"{self.ns}:i:{h}", entry_id, ex=ttl)
        pipe.execute()
        self._recent.append(_signature(entry))
        self._count("shared", writes=1, bytes_written=len(data) + len(meta))
        return len(data)


def _signature(entry: StoredSequence) -> tuple[object, ...]:
    """Two exports of a slot that did not change in between have the same signature."""
    return (len(entry.tokens), hash(entry.tokens), tuple(cp.position for cp in entry.checkpoints), entry.log.runs())


def read_header_bytes(data: bytes) -> bytes:
    """The magic, length and header of an encoded entry (what a lookup returns)."""
    n = int.from_bytes(data[8:16], "little")
    return data[: 16 + n]


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return scheme + sep + rest
