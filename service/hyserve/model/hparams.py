"""Typed access to an architecture's GGUF metadata keys, with clear errors for missing ones."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hyserve.model.gguf_file import GGUFError, GGUFFile

_MAX_INT = 2**31


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

    def int(self, key: str, default: Any = None, minimum: int = 1, maximum: int = _MAX_INT - 1) -> int:
        """An integer hyperparameter in [minimum, maximum] (at most 2**31 - 1): sizes and counts of a
        real model are, and a corrupt one must not size an allocation or a loop (nor divide by zero)."""
        value = self._get(key, _REQUIRED if default is None else default)
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise self._bad(key, value, "an integer")
        if not minimum <= value <= maximum:
            raise self._bad(key, value, f"an integer in [{minimum}, {maximum}]")
        return int(value)

    def float(self, key: str, default: Any = None) -> float:
        """A positive, finite float hyperparameter (epsilons, RoPE bases and factors)."""
        value = self._get(key, _REQUIRED if default is None else default)
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise self._bad(key, value, "a number")
        if not (math.isfinite(value) and value > 0):
            raise self._bad(key, value, "a positive finite number")
        return float(value)

    def _bad(self, key: str, value: Any, expected: str) -> GGUFError:
        shown = repr(value) if len(repr(value)) <= 40 else f"{type(value).__name__} {repr(value)[:40]}..."
        return GGUFError(f"{self.gguf.path}: metadata key {self.arch}.{key} is {shown}, expected {expected}")

    def optional(self, key: str) -> Any:
        return self._get(key, None)


_REQUIRED = object()
