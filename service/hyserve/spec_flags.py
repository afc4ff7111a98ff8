"""The speculative decoding flags of `run` and `serve` (`--spec`, `--spec-max-draft`,
`--spec-draft-model`, `--spec-draft-p-min`) and the one `SpecConfig` they make."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from hyserve.operator_errors import OperatorError, model_path_error

if TYPE_CHECKING:
    from hyserve.engine.speculative import SpecConfig
    from hyserve.model.architectures.base import Architecture
    from hyserve.model.backend.select import DeviceRequest
    from hyserve.model.tokenizer import Tokenizer


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--spec",
        choices=("ngram", "draft", "off"),
        default="off",
        help="speculative decoding: ngram drafts tokens by prompt lookup, draft by a smaller model with the "
        "same vocabulary (--spec-draft-model); verified several per forward (the same tokens as without)",
    )
    p.add_argument("--spec-max-draft", type=int, default=8, help="tokens per draft at most (adaptive below it)")
    p.add_argument(
        "--spec-draft-model",
        default=None,
        metavar="PATH",
        help="GGUF of the draft model for --spec draft (the target's vocabulary; drafts greedily)",
    )
    p.add_argument(
        "--spec-draft-p-min",
        type=float,
        default=0.0,
        metavar="P",
        help="--spec draft: end a draft before a token the draft model gives less probability (0: never)",
    )


def spec_flag_error(method: str, draft_model: str | None, p_min: float = 0.0) -> str | None:
    """What is wrong with the speculation flags before anything is loaded (None: go on)."""
    if not 0.0 <= p_min <= 1.0:
        return "--spec-draft-p-min must be in [0, 1]"
    if method == "draft" and draft_model is None:
        return "--spec draft needs --spec-draft-model PATH"
    if method != "draft" and draft_model is not None:
        return "--spec-draft-model is used with --spec draft only"
    if draft_model is not None:
        problem = model_path_error(draft_model)
        return None if problem is None else f"--spec-draft-model: {problem}"
    return None


def spec_config(
    method: str,
    max_draft: int,
    draft_model: str | None,
    target: Architecture,
    tokenizer: Tokenizer,
    device: DeviceRequest | None = None,
    p_min: float = 0.0,
) -> SpecConfig:
    """The configuration the flags make (method "off" without `--spec`), with the draft model loaded
    and checked against the target's vocabulary (OperatorError when it differs); ValueError on a
    bad `--spec-max-draft`."""
    from hyserve.engine.draft_model import DraftVocabularyError, load_draft_model
    from hyserve.engine.speculative import SpecConfig

    draft = None
    if method == "draft" and draft_model is not None:
        try:
            draft = load_draft_model(draft_model, target, tokenizer, device)
        except DraftVocabularyError as exc:
            raise OperatorError(f"--spec-draft-model {draft_model}: not the model's vocabulary: {exc}") from exc
    return SpecConfig(method=method, max_draft=max_draft, draft=draft, draft_p_min=p_min)
