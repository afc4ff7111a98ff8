"""What a resume costs, in seconds: the prompt tokens the model still evaluates and the bytes read
from a prefix-store tier to get there (`ResumeCosts`). The admission plan compares a free slot's
resume with each store entry's by this cost and takes the cheapest (`admission._choose`); without
costs it takes the furthest resume."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ResumeCosts"]


@dataclass(frozen=True)
class ResumeCosts:
    """Seconds per prompt token evaluated and, per tier, seconds per byte of an entry read and
    restored into a slot. A tier not named costs nothing to read (nothing known about it yet)."""

    prefill_s_per_token: float
    read_s_per_byte: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.prefill_s_per_token > 0 or any(not r >= 0 for r in self.read_s_per_byte.values()):
            raise ValueError("resume costs must be positive (prefill) and non-negative (reads)")

    def prefill(self, tokens: int) -> float:
        return max(0, tokens) * self.prefill_s_per_token

    def read(self, tier: str, nbytes: int) -> float:
        return nbytes * self.read_s_per_byte.get(tier, 0.0)

    def seconds(self, prompt_len: int, resume: int, tier: str | None = None, nbytes: int = 0) -> float:
        """A resume at `resume` of a `prompt_len`-token prompt, from a slot (tier None) or from an
        entry of `nbytes` in `tier`. Replayed positions are not counted: a replay runs only the
        recurrent layers' kernels on kept inputs, a small part of a forward."""
        return self.prefill(prompt_len - resume) + (self.read(tier, nbytes) if tier is not None else 0.0)
