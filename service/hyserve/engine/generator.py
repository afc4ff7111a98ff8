"""In-process generation for one sequence (the CLI's `generate` and the benchmarks).

The gRPC engine schedules many sequences; this is the plain loop: prompt in chunks, then one token
per forward call, stopping on EOG, a stop string or max_tokens.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from hyserve.engine.sampling import SamplingParams, sample
from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.loader import LoadedModel
from hyserve.model.memory import SequenceMemory


@dataclass(frozen=True)
class StopRule:
    max_tokens: int = 128
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    ignore_eos: bool = False


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
    assert logits is not None, "empty prompt"
    return logits


def generate(
    model: LoadedModel,
    prompt: Sequence[int],
    params: SamplingParams,
    stop: StopRule,
    n_ctx: int = 4096,
    chunk: int = 512,
) -> Iterator[Generated]:
    if not prompt:
        raise ValueError("empty prompt")
    memory = model.arch.new_memory(n_ctx)
    memory.check_room(len(prompt))
    logits = prefill(model, memory, prompt, chunk)
    rng = np.random.default_rng(params.seed)
    history = list(prompt)
    decoder = model.tokenizer.incremental_decoder()
    text = ""
    for n in range(1, stop.max_tokens + 1):
        token = sample(logits, history, params, rng)
        history.append(token)
        reason = None
        if token in stop.stop_token_ids:
            reason = "stop_token"
        elif model.tokenizer.is_eog(token) and not stop.ignore_eos:
            reason = "eos"
        delta = "" if reason else decoder.push(token)
        text += delta
        hit = next((s for s in stop.stop_strings if s in text), None)
        if hit is not None:
            reason = "stop_string"
            delta = delta[: max(0, len(delta) - (len(text) - text.index(hit)))]
        elif reason is None and n == stop.max_tokens:
            reason = "max_tokens"
        elif reason is None and memory.n_tokens + 1 > memory.n_ctx:
            reason = "context_full"
        if reason is not None:
            yield Generated(
                token, delta + (decoder.flush() if reason in ("max_tokens", "context_full") else ""), reason
            )
            return
        yield Generated(token, delta)
        logits = model.arch.forward([Segment(memory, np.array([token], np.int32), Logits.LAST)])[0]
