"""Constrained decoding: JSON Schema, any JSON object, regular expressions and Lark grammars,
through llguidance.

- `spec.py`: `ConstraintSpec` (what a request asks for) and `ConstraintError` (a bad one);
- `vocabulary.py`: the model's vocabulary as llguidance sees it;
- `compiler.py`: `GrammarCompiler` (one per model: checks, compiles, caches) and `CompiledGrammar`;
- `matcher.py`: `TokenMatcher` (one per task: its next-token masks) and `background_masks` (whether
  they are computed while the forward runs).
"""

from hyserve.engine.constraints.compiler import JSON_OPTIONS, CompiledGrammar, GrammarCompiler, with_json_options
from hyserve.engine.constraints.matcher import ConstraintViolation, TokenMatcher, background_masks, mask_logits
from hyserve.engine.constraints.spec import MAX_SOURCE_BYTES, ConstraintError, ConstraintKind, ConstraintSpec

__all__ = [
    "JSON_OPTIONS",
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
    "with_json_options",
]
