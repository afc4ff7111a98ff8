"""In-process generation for one sequence (the CLI's `generate` and the benchmarks).

The gRPC engine schedules many sequences; this is the plain loop: prompt in chunks, then one token
per forward call, until a stop rule (stop.py, shared with the engine) ends it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import hyserve_kernels
import numpy as np

from hyserve.engine.constraints import CompiledGrammar, TokenMatcher, background_masks
from hyserve.engine.drafting import Drafter
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.speculative import (
    DraftLength,
    SpecConfig,
    SpecStats,
    Verified,
    keep_accepted,
    new_drafter,
    verify,
)
from hyserve.engine.stop import StopCheck, StopRule
from hyserve.engine.token_step import advance_grammar, sample_allowed
from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.loader import LoadedModel
from hyserve.model.memory import SequenceMemory

__all__ = ["Generated", "SpecConfig", "SpecStats", "StopRule", "generate", "prefill"]


@dataclass(frozen=True)
class Generated:
    token_id: int
    text: str  # UTF-8-safe delta
    finish_reason: str | None = None  # set on the last item: eos, stop_string, stop_token, max_tokens, context_full


def prefill(model: LoadedModel, memory: SequenceMemory, tokens: Sequence[int], chunk: int = 512) -> np.ndarray:
    """Evaluate a prompt in chunks of `chunk` tokens; returns the logits after the last token."""
    logits = None
    for start in range(0, len(tokens), chunk):
        part = np.asarray(tokens[start : start + chunk], dtype=np.int32)
        logits = model.arch.forward([Segment(memory, part, Logits.LAST)])[0]
    if logits is None:
        raise ValueError("empty prompt")
    return logits


def generate(
    model: LoadedModel,
    prompt: Sequence[int],
    params: SamplingParams,
    stop: StopRule,
    n_ctx: int = 4096,
    chunk: int = 512,
    spec: SpecConfig | None = None,
    spec_stats: SpecStats | None = None,
    drafter: Drafter | None = None,
    grammar: CompiledGrammar | None = None,
) -> Iterator[Generated]:
    """Sample until a stop rule ends the generation (stop.py: the same rules, in the same order, as
    the engine's, so the same request gives the same tokens and text here and through the server).
    With `spec`, drafted tokens are verified several per forward (speculative.py): the same tokens
    come out, greedy or seeded; `spec_stats` counts the drafts; `drafter` replaces the one `spec`
    names (the benchmarks' scripted drafts). With `grammar`, the output matches it (token_step.py:
    the same masking and ending as the engine's); ConstraintViolation if the grammar cannot go on."""
    if not prompt:
        raise ValueError("empty prompt")
    memory = model.arch.new_memory(n_ctx)
    memory.check_room(len(prompt))
    background = background_masks("auto", model.arch.ops.name, hyserve_kernels.num_threads(), os.cpu_count() or 1)
    matcher = TokenMatcher(grammar, background) if grammar is not None else None
    if matcher is not None:
        matcher.start_mask()  # computed while the prompt is evaluated
    rows = prefill(model, memory, prompt, chunk)[None, :]
    rng = np.random.default_rng(params.seed)
    history = list(prompt)
    check = StopCheck(stop, model.tokenizer, len(prompt), n_ctx)
    if drafter is None and spec is not None:
        drafter = new_drafter(spec, n_ctx)
    length = DraftLength(spec) if spec is not None else None
    stats = spec_stats if spec_stats is not None else SpecStats()
    if drafter is not None:
        drafter.extend(prompt)
    draft: list[int] = []
    verified: Verified | None = None
    while True:
        # rows[i]: the logits after the last sampled token and i drafted ones; sampled in order
        for i, row in enumerate(rows):
            token = sample_allowed(row, history, params, rng, matcher)
            if matcher is not None:
                matcher.consume(token)  # a drafted row is sampled only after its draft was: same state
            history.append(token)
            decision = advance_grammar(matcher, token, check.push(token), check, model.tokenizer.is_eog(token))
            if decision.reason is not None:
                yield Generated(token, decision.text, decision.reason.value)
                return
            yield Generated(token, decision.text)
            if drafter is not None:
                drafter.extend([token])
            if i < len(draft) and token == draft[i]:
                continue  # the draft's token, already in memory
            if verified is not None:  # keep the last sampled token and the accepted draft
                keep_accepted(model.arch, memory, verified, i + 1)
            break
        if length is not None and draft:
            stats.accepted += i
            length.update(len(draft), i)
        # the next draft: never past the context or the tokens still to generate
        room = min(n_ctx - memory.n_tokens - 2, stop.max_tokens - check.generated - 1)
        draft = drafter.propose(min(length.k, room)) if drafter is not None and length is not None else []
        if draft:
            stats.drafts += 1
            stats.drafted += len(draft)
            verified = verify(model.arch, memory, [token, *draft])
            rows = verified.rows
        else:
            verified = None
            rows = model.arch.forward([Segment(memory, np.array([token], np.int32), Logits.LAST)])[0][None, :]
