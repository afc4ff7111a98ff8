"""RoPE's arguments as one value, for a norm that turns its heads in its own pass."""

from __future__ import annotations

from typing import Any, NamedTuple


class Rotary(NamedTuple):
    """`Backend.rope`'s arguments after x: heads per row, positions (one per row), rotated dims,
    frequency base and scale, NEOX pairs. `ops.rope(x, *rotary)` turns x by them."""

    n_head: int
    positions: Any
    n_rot: int
    base: float
    scale: float
    neox: bool
