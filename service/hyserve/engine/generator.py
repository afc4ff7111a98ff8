"""In-process generation for one sequence (the CLI's `generate` and the benchmarks).

The gRPC engine schedules many sequences; this is the plain loop: prompt in chunks, then one token
per forward call, until a stop rule (stop.py, shared with the engine) ends it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from hyserve.engine.sampling import SamplingParams, sample
from hyserve.engine.stop import StopCheck, StopRule
from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.loader import LoadedModel
from hyserve.model.memory import SequenceMemory

__all__ = ["Generated", "StopRule", "generate", "prefill"]


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
) -> Iterator[Generated]:
    """Sample until a stop rule ends the generation (stop.py: the same rules, in the same order, as
    the engine's, so the same request gives the same tokens and text here and through the server)."""
    if not prompt:
        raise ValueError("empty prompt")
    memory = model.arch.new_memory(n_ctx)
    memory.check_room(len(prompt))
    logits = prefill(model, memory, prompt, chunk)
    rng = np.random.default_rng(params.seed)
    history = list(prompt)
    check = StopCheck(stop, model.tokenizer, len(prompt), n_ctx)
    while True:
        token = sample(logits, history, params, rng)
        history.append(token)
        decision = check.push(token)
        if decision.reason is not None:
            yield Generated(token, decision.text, decision.reason.value)
            return
        yield Generated(token, decision.text)
        logits = model.arch.forward([Segment(memory, np.array([token], np.int32), Logits.LAST)])[0]
