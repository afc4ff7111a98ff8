"""One sampled token of a running task: mask, sample, logprobs, grammar, stop rules, Delta.

The engine loop calls `take_token` wherever logits come back for a task (after a forward, or
from a restored checkpoint's prompt-end logits); the loop then either schedules the token for the
next forward or ends the task with the returned decision.

With a grammar (`Run.matcher`), only the tokens it allows are sampled: penalties, temperature,
top-k, top-p and min-p act on them, unchanged (`sample_allowed`). Logprobs are those of the
distribution actually sampled from: after penalties and the grammar (a disallowed token has
-inf and is never among the top alternatives), before temperature and the top-k/top-p/min-p
cuts. The mask for the following token is started as soon as the sampled token is consumed
(computed while the next forward runs, where the matcher does that).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hyserve.engine.constraints import TokenMatcher
from hyserve.engine.sampling import SamplingParams, apply_penalties, log_softmax, sample
from hyserve.engine.slot import Run
from hyserve.engine.stop import FinishReason, StopCheck, StopDecision
from hyserve.engine.task import DeltaEvent, TokenLogprob

__all__ = [
    "advance_grammar",
    "grammar_complete",
    "greedy_token_suffices",
    "sample_allowed",
    "take_token",
    "token_logprobs",
]


def sample_allowed(
    logits: np.ndarray,
    history: list[int],
    params: SamplingParams,
    rng: np.random.Generator,
    matcher: TokenMatcher | None,
) -> int:
    """`sample` over the tokens the grammar allows (every token without one). The allowed tokens'
    penalised logits are sampled as one compact array in id order, the order the sampler's ties
    follow: logits masked to -inf would send every exp over the vocabulary down numpy's slow
    underflow path (4-5x slower, about 1.5 ms a row at 262k tokens)."""
    if matcher is None:
        return sample(logits, history, params, rng)
    ids = matcher.allowed_ids(len(logits))
    return int(ids[sample(apply_penalties(logits, history, params)[ids], (), params, rng)])


def token_logprobs(
    logits: np.ndarray, history: list[int], params: SamplingParams, top: int, matcher: TokenMatcher | None
) -> tuple[np.ndarray, tuple[tuple[int, float], ...]]:
    """Log-probabilities after penalties (over the tokens the grammar allows: -inf for the
    others), and the `top` most likely tokens, most likely first (ties by id); never a token the
    grammar removed."""
    penalised = apply_penalties(logits, history, params)
    if matcher is None:
        lp = log_softmax(penalised)
    else:
        ids = matcher.allowed_ids(len(penalised))
        lp = np.full(len(penalised), -np.inf)
        lp[ids] = log_softmax(penalised[ids])
    k = min(top, int(np.isfinite(lp).sum()) if matcher is not None else len(lp))
    if k <= 0:
        return lp, ()
    idx = np.argpartition(-lp, k - 1)[:k]
    idx = idx[np.lexsort((idx, -lp[idx]))]
    return lp, tuple((int(i), float(lp[i])) for i in idx)


def grammar_complete(decision: StopDecision, eog: bool, stopped: bool) -> bool:
    """Whether a constrained generation ends here although the stop rules go on: its grammar is
    complete and the token is the end-of-generation token that closes it (with `ignore_eos` the
    stop rules skip it, but nothing else could follow)."""
    return decision.reason is None and stopped and eog


def advance_grammar(
    matcher: TokenMatcher | None, token: int, decision: StopDecision, check: StopCheck, eog: bool
) -> StopDecision:
    """After the stop rules have seen `token` (already consumed by `matcher`): end a completed
    grammar as EOS, or start computing the next token's mask while the next forward runs."""
    if matcher is None or decision.reason is not None:
        return decision
    if grammar_complete(decision, eog, matcher.is_stopped):
        return StopDecision(decision.text + check.finish(), FinishReason.EOS, stop_token_id=token)
    matcher.start_mask()
    return decision


def greedy_token_suffices(run: Run) -> bool:
    """Whether the first maximum of the raw logits is all `run` needs of its next row: greedy, no
    penalties, no logprobs, no grammar (then the device returns the token, not the logits)."""
    task, p = run.task, run.task.params
    no_penalties = p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
    return p.greedy and no_penalties and not (task.logprobs or task.top_logprobs) and run.matcher is None


def take_token(
    run: Run, logits: np.ndarray, now: float, is_eog: Callable[[int], bool], greedy: int | None = None
) -> tuple[int, StopDecision]:
    """Sample `run`'s next token from `logits` (left untouched), or take `greedy` (the device's
    argmax, where `greedy_token_suffices`), record it, send its Delta and return it with the
    stop decision. Raises ConstraintViolation when the grammar cannot go on."""
    task, matcher = run.task, run.matcher
    logprob_entry: tuple[TokenLogprob, ...] = ()
    if greedy is not None:
        token = greedy
    else:
        token = sample_allowed(logits, run.history, task.params, run.rng, matcher)
    if greedy is None and (task.logprobs or task.top_logprobs):
        lp, top = token_logprobs(logits, run.history, task.params, task.top_logprobs, matcher)
        logprob_entry = (TokenLogprob(token, float(lp[token]), top),)
    if matcher is not None:
        matcher.consume(token)
    run.history.append(token)
    run.generated.append(token)
    if run.first_token_at is None:
        run.first_token_at = now
    run.last_token_at = now

    decision = advance_grammar(matcher, token, run.stop.push(token), run.stop, is_eog(token))
    task.emit(DeltaEvent((token,), decision.text, logprob_entry))
    return token, decision
