"""The tokenizer's one error type."""

from __future__ import annotations

__all__ = ["TokenizerError"]


class TokenizerError(ValueError):
    """The GGUF metadata describes a vocabulary this tokenizer cannot reproduce."""
