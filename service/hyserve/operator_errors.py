"""Operator errors (a wrong path, a corrupt model file, a bad flag value) end `hyserve run|serve`
with one line on stderr and exit status 1; a traceback only with `--debug`. Bugs keep their
traceback: anything not recognised here is re-raised."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["OperatorError", "is_operator_error", "model_path_error", "run_flag_error", "run_reporting"]


class OperatorError(ValueError):
    """A mistake in the command line or the files it names."""


def is_operator_error(exc: BaseException) -> bool:
    from hyserve.api.security import SecurityError
    from hyserve.model.backend.select import DeviceError
    from hyserve.model.chat_template import ChatTemplateError
    from hyserve.model.gguf_file import GGUFError

    kinds = (OperatorError, GGUFError, DeviceError, SecurityError, ChatTemplateError, OSError)
    return isinstance(exc, kinds)


def model_path_error(model: str) -> str | None:
    """What is wrong with --model before anything is loaded (None: go on)."""
    if model == "default":
        return None
    path = Path(model)
    if path.is_dir():
        return f"--model {model}: is a directory; give the path of a .gguf file"
    if not path.exists():
        return f"--model {model}: no such file"
    if not path.is_file():
        return f"--model {model}: not a regular file"
    return None


def run_flag_error(args: argparse.Namespace) -> str | None:
    """The first bad flag value of `hyserve run` (None: all valid)."""
    checks = [
        (args.threads >= 1, "--threads must be >= 1"),
        (args.ctx_size >= 1, "--ctx-size must be >= 1"),
        (args.max_tokens >= 1, "--max-tokens must be >= 1"),
        (math.isfinite(args.temperature) and args.temperature >= 0, "--temperature must be a finite number >= 0"),
        (args.top_k >= 0, "--top-k must be >= 0"),
        (0 < args.top_p <= 1, "--top-p must be in (0, 1]"),
        (args.seed is None or args.seed >= 0, "--seed must be >= 0"),
        (args.spec_max_draft >= 1, "--spec-max-draft must be >= 1"),
    ]
    return next((message for ok, message in checks if not ok), None)


def run_reporting(command: str, func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand; an operator error becomes `hyserve COMMAND: error: MESSAGE` and status 1."""
    try:
        return func(args)
    except Exception as exc:
        if getattr(args, "debug", False) or not is_operator_error(exc):
            raise
        message = str(exc) or type(exc).__name__
        print(f"hyserve {command}: error: {message}", file=sys.stderr)
        return 1
