"""Typed access to an architecture's GGUF metadata keys, with clear errors for missing ones."""

from __future__ import annotations

from typing import Any

from hyserve.model.gguf_file import GGUFError, GGUFFile


class HParams:
    def __init__(self, gguf: GGUFFile) -> None:
        self.gguf = gguf
        self.arch = gguf.architecture

    def _get(self, key: str, default: Any) -> Any:
        full = f"{self.arch}.{key}"
        if full in self.gguf.metadata:
            return self.gguf.metadata[full]
        if default is _REQUIRED:
            raise GGUFError(f"{self.gguf.path}: missing metadata key {full!r}")
        return default

    def int(self, key: str, default: Any = None) -> int:
        value = self._get(key, _REQUIRED if default is None else default)
        return int(value)

    def float(self, key: str, default: Any = None) -> float:
        value = self._get(key, _REQUIRED if default is None else default)
        return float(value)

    def optional(self, key: str) -> Any:
        return self._get(key, None)


_REQUIRED = object()
