"""What the soak test asserts about each request, the figures it prints, and the cache-free reference."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import grpc

from hyserve_client import CancelStatus

from .traffic import Fault, Outcome

_CANCEL_FAULTS = (Fault.CANCEL_EARLY, Fault.CANCEL_LATER)


def problems(out: Outcome, shutdown_phase: bool) -> list[str]:
    """Everything wrong with one request's events and status (empty: it behaved).

    Every request ends exactly once: one Finished event (nothing after it), or an error status, or
    the client's own disconnect. Which statuses and finish reasons are allowed depends on its fault;
    during a SIGTERM drain a request may also be refused (UNAVAILABLE) or cancelled by the shutdown."""
    r, found = out.request, []
    if len(out.accepted) > 1 or len(out.finished) > 1 or out.events_after_finished:
        found.append(f"{len(out.accepted)} Accepted, {len(out.finished)} Finished, {out.events_after_finished} after")
    if not out.finished and out.status is None and not out.disconnected:
        found.append("lost: no Finished, no status, no disconnect")
    if out.status is not None:
        allowed = {grpc.StatusCode.DEADLINE_EXCEEDED} if r.fault is Fault.DEADLINE else set()
        if shutdown_phase:
            allowed |= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
        if out.status not in allowed:
            found.append(f"status {out.status.name}: {out.status_details}")
    if out.finish_reason == "cancelled" and r.fault not in _CANCEL_FAULTS and not shutdown_phase:
        found.append("finished CANCELLED without a Cancel")
    if r.fault in _CANCEL_FAULTS and out.cancel_answers and not shutdown_phase:
        answer = out.cancel_answers[-1]
        if answer not in (CancelStatus.CANCELLED, CancelStatus.ALREADY_FINISHED, CancelStatus.PENDING):
            found.append(f"Cancel answered {answer}")
        # the answer tells the truth about what happened to the task
        if answer is CancelStatus.ALREADY_FINISHED and out.finish_reason == "cancelled":
            found.append("Cancel said ALREADY_FINISHED but the task ended CANCELLED")
        if answer in (CancelStatus.CANCELLED, CancelStatus.PENDING) and out.finished:
            if out.finish_reason != "cancelled":
                found.append(f"Cancel said {answer.name} but the task ended {out.finish_reason}")
        if answer is CancelStatus.PENDING and out.tokens:
            found.append(f"Cancel said PENDING but the task generated {len(out.tokens)} tokens")
    if out.finished and not out.finish_reason == "cancelled" and len(out.tokens) != r.max_tokens:
        found.append(f"completed with {len(out.tokens)} tokens, max_tokens {r.max_tokens} (ignore_eos)")
    return found


@dataclass
class Figures:
    requests: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)  # injected, by kind
    completed: int = 0
    cancelled_queued: int = 0  # Finished CANCELLED without Accepted
    cancelled_running: int = 0  # Finished CANCELLED after Accepted
    disconnected: int = 0
    deadline_exceeded: int = 0
    refused_draining: int = 0  # UNAVAILABLE during the SIGTERM drain/restart
    failed: int = 0  # INTERNAL or any status not caused by a fault
    failed_by_status: Counter = field(default_factory=Counter)
    compared_complete: int = 0
    compared_partial: int = 0
    with_output: int = 0
    idle_checks: list[str] = field(default_factory=list)
    invariant_checks: int = 0
    invariant_violations: int = 0
    leaked_slots: int = 0
    lost: int = 0

    @property
    def total_faults(self) -> int:
        return sum(self.faults.values())

    def add(self, outcomes: Iterable[Outcome]) -> None:
        for out in outcomes:
            self.requests += 1
            self.by_kind[out.request.kind.value] += 1
            if out.request.fault is not Fault.NONE:
                self.faults[out.request.fault.value] += 1
            if out.finish_reason == "cancelled":
                if out.accepted:
                    self.cancelled_running += 1
                else:
                    self.cancelled_queued += 1
            elif out.finished:
                self.completed += 1
            if out.disconnected:
                self.disconnected += 1
            if out.status is grpc.StatusCode.DEADLINE_EXCEEDED and out.request.fault is Fault.DEADLINE:
                self.deadline_exceeded += 1
            elif out.status is grpc.StatusCode.UNAVAILABLE:
                self.refused_draining += 1
            elif out.status is not None and out.status is not grpc.StatusCode.CANCELLED:
                self.failed += 1
                self.failed_by_status[out.status.name] += 1

    def report(self) -> str:
        return "\n".join(
            [
                f"requests {self.requests} by kind {dict(self.by_kind)}",
                f"faults injected {self.total_faults}: {dict(self.faults)}",
                f"tasks completed {self.completed}, cancelled {self.cancelled_queued} queued + "
                f"{self.cancelled_running} running, disconnected {self.disconnected}, "
                f"deadline exceeded {self.deadline_exceeded}, refused while draining {self.refused_draining}, "
                f"failed {self.failed} {dict(self.failed_by_status)}, lost {self.lost}",
                f"leaked slots {self.leaked_slots} ({'; '.join(self.idle_checks)})",
                f"invariant checks {self.invariant_checks}, violations {self.invariant_violations}",
                f"outputs equal to the cache-free reference: {self.compared_complete} complete, "
                f"{self.compared_partial} partial (a prefix of it) of {self.with_output} with output",
            ]
        )


def sample_outputs(outcomes: Sequence[Outcome], limit: int | None, seed: str) -> list[Outcome]:
    """The outputs to compare with the reference: all of them, or `limit` drawn at random (seeded),
    half completed and half cut short where there are enough of each."""
    with_output = [o for o in outcomes if o.tokens or o.finished]
    if limit is None or len(with_output) <= limit:
        return with_output
    rng = random.Random(seed)
    complete = [o for o in with_output if o.finished and o.finish_reason != "cancelled" and o.status is None]
    cut = [o for o in with_output if not (o.finished and o.finish_reason != "cancelled" and o.status is None)]
    n_cut = min(len(cut), limit // 2)
    n_complete = min(len(complete), limit - n_cut)
    return rng.sample(complete, n_complete) + rng.sample(cut, min(len(cut), limit - n_complete))


def reference_mismatches(outcomes: Sequence[Outcome], model_path: str, n_ctx: int) -> tuple[int, int, list[str]]:
    """Compare outputs with greedy generation on a fresh in-process memory (no cache, no
    batching): completed outputs must equal it, cut-short ones must be a prefix of it. Returns
    (complete compared, partial compared, mismatches)."""
    from hyserve.engine.generator import StopRule, generate
    from hyserve.engine.sampling import SamplingParams
    from hyserve.model.loader import load_model

    model = load_model(model_path)
    tok, template = model.tokenizer, model.chat_template

    def prompt_of(out: Outcome) -> tuple[int, ...]:
        if out.request.tokens is not None:
            return tuple(out.request.tokens)
        messages = [{"role": m.role, "content": m.content} for m in out.request.messages or ()]
        text = template.render(messages, add_generation_prompt=True).text
        return tuple(tok.encode(text, add_special=False, parse_special=True))

    wanted: dict[tuple[int, ...], int] = {}
    prompts: dict[int, tuple[int, ...]] = {}
    for i, out in enumerate(outcomes):
        if out.tokens or out.finished:
            prompts[i] = prompt_of(out)
            wanted[prompts[i]] = max(wanted.get(prompts[i], 0), out.request.max_tokens)
    refs: dict[tuple[int, ...], list[int]] = {}
    for prompt, n in wanted.items():
        stop = StopRule(max_tokens=n, ignore_eos=True)
        refs[prompt] = [g.token_id for g in generate(model, prompt, SamplingParams(), stop, n_ctx=n_ctx)]
    complete = partial = 0
    bad: list[str] = []
    for i, prompt in prompts.items():
        out = outcomes[i]
        ref = refs[prompt][: out.request.max_tokens]
        if out.accepted and out.accepted[0].prompt_tokens != len(prompt):
            bad.append(f"{out.task_id}: {out.accepted[0].prompt_tokens} prompt tokens, expected {len(prompt)}")
        if out.finished and out.finish_reason != "cancelled" and out.status is None:
            complete += 1
            if out.tokens != ref:
                bad.append(f"{out.task_id} ({out.request.kind.value}): {out.tokens} != reference {ref}")
        else:
            partial += 1
            if out.tokens != ref[: len(out.tokens)]:
                bad.append(f"{out.task_id} ({out.request.kind.value}, cut short): {out.tokens} not a prefix of {ref}")
    return complete, partial, bad
