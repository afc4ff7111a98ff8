"""The rates the admission plan prices resumes with (`cache_plan.ResumeCosts`), learned as the
engine runs or pinned by the operator (`--cache-resume-rates`).

Learned: seconds per prompt token from the forwards that evaluate prompt chunks, and for the disk
and shared tiers the seconds per byte of reading an entry and restoring it into a slot, each a
moving average of what was measured. Until the prompt rate is known the plan takes the furthest
resume; a tier not read yet costs nothing, so its first entry is taken when it resumes further
(and measured); host-memory entries are not priced (a copy in this process). Pinned rates price
what they name, the memory tier too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hyserve.engine.cache_plan import ResumeCosts
from hyserve.engine.stats import STORE_TIERS

__all__ = ["PinnedRates", "ResumeRates", "parse_pinned_rates"]

_WEIGHT = 0.2  # of the newest measurement in the moving averages


@dataclass(frozen=True)
class PinnedRates:
    """Rates set by the operator instead of measured: prompt tokens per second, and per tier the
    megabytes per second of reading an entry into a slot (a tier not named costs nothing)."""

    prefill_tokens_per_s: float
    read_mb_per_s: Mapping[str, float]

    def costs(self) -> ResumeCosts:
        return ResumeCosts(1.0 / self.prefill_tokens_per_s, {t: 1e-6 / r for t, r in self.read_mb_per_s.items()})


def parse_pinned_rates(text: str) -> PinnedRates:
    """`prefill=TOKENS_PER_S,disk=MB_PER_S,shared=MB_PER_S[,memory=MB_PER_S]`; ValueError names
    what is wrong."""
    values: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in ("prefill", *STORE_TIERS):
            raise ValueError(
                f"{part.strip()!r}: expected prefill=TOKENS_PER_S or TIER=MB_PER_S ({', '.join(STORE_TIERS)})"
            )
        try:
            rate = float(value)
        except ValueError:
            raise ValueError(f"{name}: {value.strip()!r} is not a number") from None
        if not rate > 0 or rate == float("inf"):
            raise ValueError(f"{name}: the rate must be a positive number")
        if name in values:
            raise ValueError(f"{name} is given twice")
        values[name] = rate
    if "prefill" not in values:
        raise ValueError("prefill=TOKENS_PER_S is required")
    prefill = values.pop("prefill")
    return PinnedRates(prefill, values)


class ResumeRates:
    """Engine thread only."""

    def __init__(self, pinned: PinnedRates | None = None, cheapest: bool = True) -> None:
        self.pinned = pinned
        self.cheapest = cheapest  # False: always the furthest resume (--cache-resume furthest)
        self.prefill_s_per_token: float | None = None
        self.read_s_per_byte: dict[str, float] = {}

    @staticmethod
    def _average(old: float | None, new: float) -> float:
        return new if old is None else (1 - _WEIGHT) * old + _WEIGHT * new

    def prompt_forward(self, tokens: int, seconds: float) -> None:
        """A forward that evaluated `tokens` prompt tokens (and maybe a few decode rows) took `seconds`."""
        if tokens > 0 and seconds > 0:
            self.prefill_s_per_token = self._average(self.prefill_s_per_token, seconds / tokens)

    def entry_read(self, tier: str, nbytes: int, seconds: float) -> None:
        """An entry of `nbytes` was read from `tier` and restored into a slot in `seconds`. The
        host-memory tier is not priced: its entries are a copy away in this process, and pricing
        such short copies by their timing would let noise flip choices."""
        if tier != "memory" and nbytes > 0 and seconds > 0:
            self.read_s_per_byte[tier] = self._average(self.read_s_per_byte.get(tier), seconds / nbytes)

    def costs(self) -> ResumeCosts | None:
        """What the admission plan prices with; None: take the furthest resume (asked for, or
        nothing measured yet)."""
        if not self.cheapest:
            return None
        if self.pinned is not None:
            return self.pinned.costs()
        if self.prefill_s_per_token is None:
            return None
        return ResumeCosts(self.prefill_s_per_token, dict(self.read_s_per_byte))
