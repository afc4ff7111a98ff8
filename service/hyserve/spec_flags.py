"""The speculative decoding flags of `run` and `serve` (`--spec`, `--spec-max-draft`) and the one
`SpecConfig` they make."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hyserve.engine.speculative import SpecConfig


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--spec",
        choices=("ngram", "off"),
        default="off",
        help="speculative decoding: ngram drafts tokens by prompt lookup, verified several per forward "
        "(the same tokens as without)",
    )
    p.add_argument("--spec-max-draft", type=int, default=8, help="tokens per draft at most (adaptive below it)")


def spec_config(args: argparse.Namespace) -> SpecConfig:
    """The configuration the flags make (method "off" without `--spec ngram`); ValueError on a bad
    `--spec-max-draft`."""
    from hyserve.engine.speculative import SpecConfig

    return SpecConfig(method=args.spec, max_draft=args.spec_max_draft)
