"""One prefix-store entry as bytes: versioned, checksummed, tied to one model and build.

Layout: MAGIC (8 bytes), header length (u64 little-endian), the header (UTF-8 JSON: format
version, model identity, tokens, live floor and the entry's structure with array indices), the
arrays (each in numpy's own `.npy` format, in index order), then the SHA-256 of everything before
it. The header can be read alone (the disk tier's index at start); `decode_entry` checks the
checksum, the version and the identity before it builds anything.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import math
import struct
from typing import Any

import numpy as np

from hyserve.engine.cache_plan import CheckpointKind
from hyserve.engine.checkpoints import Checkpoint, CheckpointList
from hyserve.engine.input_log import InputLog, LogBlock
from hyserve.engine.prefix_store import StoredSequence
from hyserve.model.memory import MemoryImage, Snapshot

__all__ = ["FORMAT_VERSION", "MAGIC", "EntryFormatError", "decode_entry", "encode_entry", "read_header"]

MAGIC = b"HYSCACHE"
FORMAT_VERSION = 1
_LEN = struct.Struct("<Q")
_DIGEST = 32
_MAX_HEADER = 1 << 30


class EntryFormatError(ValueError):
    """A file that is not a usable entry; `reason` is one of corrupt, version, identity."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class _Arrays:
    def __init__(self) -> None:
        self.items: list[np.ndarray] = []

    def add(self, a: np.ndarray) -> int:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"only host arrays can be written, not {type(a).__name__}")
        self.items.append(a)
        return len(self.items) - 1


def _snapshot(s: Snapshot, arr: _Arrays) -> dict[str, Any]:
    return {
        "n": s.n_tokens,
        "states": [[il, arr.add(c), arr.add(m)] for il, (c, m) in sorted(s.states.items())],
        "windows": [[il, base, arr.add(k), arr.add(v)] for il, (base, k, v) in sorted(s.windows.items())],
    }


def encode_entry(entry: StoredSequence, identity: str) -> bytes:
    arr = _Arrays()
    image = entry.image
    body = {
        "version": FORMAT_VERSION,
        "identity": identity,
        "tokens": list(entry.tokens),
        "live_floor": entry.live_floor,
        "image": {
            "n": image.n_tokens,
            "kv": [[il, arr.add(k), arr.add(v)] for il, (k, v) in sorted(image.kv.items())],
            "live": _snapshot(image.live, arr),
        },
        "checkpoints": [
            {
                "position": cp.position,
                "kind": cp.kind.value,
                "snapshot": _snapshot(cp.snapshot, arr),
                "logits": None if cp.logits is None else arr.add(cp.logits),
                "turn": cp.turn,
            }
            for cp in entry.checkpoints
        ],
        "log": [
            {
                "start": b.start,
                "n": b.n,
                "turn": b.turn,
                "parts": [[[il, [arr.add(a) for a in arrays]] for il, arrays in sorted(p.items())] for p in b.parts],
            }
            for b in entry.log
        ],
    }
    header = json.dumps(body, separators=(",", ":")).encode()
    parts: list[bytes | memoryview] = [MAGIC + _LEN.pack(len(header)) + header]
    for a in arr.items:
        a = np.ascontiguousarray(a)
        if a.dtype.hasobject:
            raise TypeError("arrays of objects cannot be written")
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(a))
        parts += [head.getvalue(), memoryview(a.reshape(-1).view(np.uint8))]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    # one copy of the arrays: a GiB-sized entry is not built up in a stream and copied out again
    return b"".join([*parts, digest.digest()])


def _parse_header(data: bytes | memoryview, identity: str | None) -> tuple[dict[str, Any], int]:
    if len(data) < len(MAGIC) + _LEN.size or bytes(data[: len(MAGIC)]) != MAGIC:
        raise EntryFormatError("corrupt", "not a prefix-store entry (bad magic or truncated)")
    (n,) = _LEN.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    if n > _MAX_HEADER or start + n > len(data):
        raise EntryFormatError("corrupt", "truncated header")
    try:
        body = json.loads(bytes(data[start : start + n]))
    except ValueError as exc:
        raise EntryFormatError("corrupt", f"header is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise EntryFormatError("corrupt", "header is not an object")
    if body.get("version") != FORMAT_VERSION:
        raise EntryFormatError("version", f"format version {body.get('version')!r}, expected {FORMAT_VERSION}")
    if identity is not None and body.get("identity") != identity:
        raise EntryFormatError("identity", "written for another model or build")
    return body, start + n


def read_header(data: bytes | memoryview, identity: str | None = None) -> dict[str, Any]:
    """The header of an entry (from the file's first bytes); checks magic, version and identity only."""
    return _parse_header(data, identity)[0]


def _read_snapshot(d: dict[str, Any], arrays: list[np.ndarray]) -> Snapshot:
    states = {il: (arrays[c], arrays[m]) for il, c, m in d["states"]}
    windows = {il: (base, arrays[k], arrays[v]) for il, base, k, v in d["windows"]}
    return Snapshot(d["n"], states, windows)


def _arrays_in(view: memoryview, offset: int) -> list[np.ndarray]:
    """The `.npy` arrays from `offset` to the end of `view`, as read-only arrays over its bytes:
    a GiB-sized entry is not copied again (numpy's `read_array` copies each array from a stream)."""
    arrays: list[np.ndarray] = []
    while offset < len(view):
        if bytes(view[offset : offset + 6]) != b"\x93NUMPY":
            raise ValueError("not an .npy array")
        major = view[offset + 6]
        size_format = "<H" if major == 1 else "<I"
        head_len = struct.unpack_from(size_format, view, offset + 8)[0]
        start = offset + 8 + struct.calcsize(size_format)
        header = ast.literal_eval(bytes(view[start : start + head_len]).decode("latin1"))
        dtype = np.dtype(header["descr"])
        shape = tuple(header["shape"])
        if dtype.hasobject or header["fortran_order"] or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError("an array of objects, in Fortran order or of a shape that is not one")
        count = math.prod(shape)
        offset = start + head_len
        arrays.append(np.frombuffer(view, dtype, count, offset).reshape(shape))
        offset += count * dtype.itemsize
    return arrays


def decode_entry(data: bytes, identity: str) -> StoredSequence:
    """The entry these bytes hold; raises EntryFormatError for a corrupt, truncated, foreign or
    other-version file."""
    view = memoryview(data)[:-_DIGEST]
    if len(data) < _DIGEST or hashlib.sha256(view).digest() != data[-_DIGEST:]:
        raise EntryFormatError("corrupt", "checksum mismatch (corrupt or truncated)")
    body, offset = _parse_header(view, identity)
    try:
        arrays = _arrays_in(view, offset)
        img = body["image"]
        image = MemoryImage(
            img["n"], {il: (arrays[k], arrays[v]) for il, k, v in img["kv"]}, _read_snapshot(img["live"], arrays)
        )
        checkpoints = CheckpointList(
            [
                Checkpoint(
                    c["position"],
                    CheckpointKind(c["kind"]),
                    _read_snapshot(c["snapshot"], arrays),
                    None if c["logits"] is None else arrays[c["logits"]],
                    c["turn"],
                )
                for c in body["checkpoints"]
            ]
        )
        blocks = [
            LogBlock(
                b["start"], tuple({il: tuple(arrays[i] for i in idx) for il, idx in p} for p in b["parts"]), b["turn"]
            )
            for b in body["log"]
        ]
        return StoredSequence(tuple(body["tokens"]), image, checkpoints, body["live_floor"], InputLog(blocks))
    except (KeyError, IndexError, TypeError, ValueError, SyntaxError, struct.error) as exc:
        raise EntryFormatError("corrupt", f"malformed entry ({exc})") from None
