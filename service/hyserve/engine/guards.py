"""Engine invariant guards (ARCHITECTURE.md "Invariants") checked with explicit raises, not `assert`
statements, so that `python -O` keeps every check."""

from __future__ import annotations

__all__ = ["InvariantError", "require"]


class InvariantError(AssertionError):
    """An invariant does not hold: a bug in hyserve, never a bad request."""


def require(ok: bool, message: str) -> None:
    """Raise InvariantError(message) unless `ok`."""
    if not ok:
        raise InvariantError(message)
