"""`serve`'s options of how a prompt's resume is chosen among a free slot and the prefix store's
entries (`--cache-resume`, `--cache-resume-rates`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine loads with the model, not with the CLI
    from hyserve.engine.resume_rates import PinnedRates

__all__ = ["add_resume_arguments", "pinned_rates"]


def add_resume_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-resume",
        choices=("cheapest", "furthest"),
        default="cheapest",
        help="a prompt resumes from the cheapest of a free slot and the prefix-store entries (reading an "
        "entry priced against evaluating the tokens it saves) or always from the one reaching furthest",
    )
    p.add_argument(
        "--cache-resume-rates",
        default=None,
        metavar="prefill=TOK_S,disk=MB_S,shared=MB_S",
        help="the rates resumes are priced with, instead of those measured as the server runs: prompt "
        "tokens per second, and per tier (memory, disk, shared) megabytes per second read into a slot",
    )


def pinned_rates(args: argparse.Namespace) -> PinnedRates | None:
    text = getattr(args, "cache_resume_rates", None)
    if text is None:
        return None
    from hyserve.engine.resume_rates import parse_pinned_rates

    try:
        return parse_pinned_rates(text)
    except ValueError as exc:
        raise SystemExit(f"hyserve serve: --cache-resume-rates: {exc}") from None
