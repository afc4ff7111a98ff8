"""Typed fields of a decoded JSON request body, checked the same way by the OpenAI and Anthropic
fronts. Each checker returns None for an absent field and raises the front's own error, built by
`error(message, field)`, for a present one of the wrong type or range."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = ["ErrorFactory", "boolean", "integer", "number"]

ErrorFactory = Callable[[str, str], Exception]


def number(
    body: dict[str, Any], name: str, lo: float, hi: float, error: ErrorFactory, *, lo_open: bool = False
) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise error(f"{name}: must be a number", name)
    if value < lo or value > hi or (lo_open and value == lo):
        bracket = "(" if lo_open else "["
        raise error(f"{name}: must be in {bracket}{lo:g}, {hi:g}] (got {value:g})", name)
    return float(value)


def integer(body: dict[str, Any], name: str, lo: int, hi: int | None, error: ErrorFactory) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise error(f"{name}: must be an integer", name)
    if value < lo or (hi is not None and value > hi):
        upper = f" and <= {hi}" if hi is not None else ""
        raise error(f"{name}: must be >= {lo}{upper} (got {value})", name)
    return value


def boolean(body: dict[str, Any], name: str, error: ErrorFactory) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise error(f"{name}: must be a boolean", name)
    return value
