"""Constrained decoding: JSON Schema, any JSON object, regular expressions and Lark grammars,
through llguidance.

- `spec.py`: `ConstraintSpec` (what a request asks for) and `ConstraintError` (a bad one);
- `vocabulary.py`: the model's vocabulary as llguidance sees it;
- `compiler.py`: `GrammarCompiler` (one per model: checks, compiles, caches) and `CompiledGrammar`;
- `matcher.py`: `TokenMatcher` (one per task: next-token masks computed off the engine thread).
"""

from hyserve.engine.constraints.compiler import CompiledGrammar, GrammarCompiler
from hyserve.engine.constraints.matcher import ConstraintViolation, TokenMatcher, background_masks, mask_logits
from hyserve.engine.constraints.spec import MAX_SOURCE_BYTES, ConstraintError, ConstraintKind, ConstraintSpec

__all__ = [
    "MAX_SOURCE_BYTES",
    "CompiledGrammar",
    "ConstraintError",
    "ConstraintKind",
    "ConstraintSpec",
    "ConstraintViolation",
    "GrammarCompiler",
    "TokenMatcher",
    "background_masks",
    "mask_logits",
]
