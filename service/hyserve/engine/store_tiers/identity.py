"""The model half of a disk entry's identity: a fingerprint of the GGUF file, cheap to take.

SHA-256 over the file's size, its first 16 MiB (the GGUF header, metadata and tensor infos of
any usual model, and the start of the weights) and its last MiB (the end of the weights): a
re-quantized, fine-tuned or truncated file gets another fingerprint, a copy or a move does not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["model_fingerprint"]

_HEAD = 16 << 20
_TAIL = 1 << 20


def model_fingerprint(path: str | Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        size = f.seek(0, 2)
        h.update(size.to_bytes(8, "little"))
        f.seek(0)
        h.update(f.read(min(size, _HEAD)))
        if size > _HEAD:
            f.seek(max(_HEAD, size - _TAIL))
            h.update(f.read())
    return h.hexdigest()
