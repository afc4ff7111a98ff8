"""Decode steps captured once and replayed on a GPU, as CUDA graphs are: the host cost of a step
is one replay call instead of a Python call, a bind group and a parameter upload per operation.

A decode step's batch (which memories, one token each, whether each keeps its recurrent inputs)
is its key. The second time a key comes, its forward runs as usual while the device captures
it (`GpuBackend.begin_capture`); from the third on, the step writes its token ids and positions
into the captured input buffers (the RoPE tables follow them) and replays the plan. Nothing else
a plan records depends on the step: the memories' K/V caches and recurrent states keep their
buffers for their whole life (states are copied into place, `GpuRecurrentState.adopt`), attention
takes cache positions from the positions buffer, and the intermediates belong to the plan. A
replay runs the same kernels on the same buffers as the captured forward, so its results are
the same bits as the operations recorded one by one.
"""

from __future__ import annotations

import weakref
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import hyserve_kernels as hk
import numpy as np

from hyserve.model.architectures.base import Logits, Segment, split_logits
from hyserve.model.architectures.common import advance
from hyserve.model.backend.gpu import GpuBackend
from hyserve.model.backend.gpu_capture import CaptureLog
from hyserve.model.memory import SequenceMemory

CAPTURE_AT = 2  # the time a key is seen when its step is captured (a batch seen once may not recur)
MAX_PLANS = 32  # plans kept per architecture, least recently used dropped first

StepKey = tuple[tuple[int, bool, Logits], ...]
_DECODE_OUTPUTS = (Logits.LAST, Logits.ARGMAX)


def step_key(segments: Sequence[Segment]) -> StepKey | None:
    """The key of a decode step (every segment one token with its logits or its greedy token,
    each memory once), or None for any other call (prompt chunks, speculative verification:
    recorded op by op)."""
    # list comprehensions rather than generators: a decode step's host time is what a plan saves
    key = tuple(
        [
            (id(s.memory), s.inputs is not None, s.logits)
            for s in segments
            if len(s.tokens) == 1 and s.logits in _DECODE_OUTPUTS
        ]
    )
    if not key or len(key) != len(segments) or len({m for m, _, _ in key}) != len(key):
        return None
    return key


def bound_objects(memory: SequenceMemory) -> list[Any]:
    """The objects whose buffers a step binds in a memory: its K/V caches and its recurrent
    states (whose buffers are fixed for the state's life), which must still be the same objects
    when the plan is replayed."""
    return [*memory.kv.values(), *memory.recurrent.values()]


@dataclass
class StepPlan:
    plan: hk.GpuPlan
    tokens: hk.GpuTensor
    positions: hk.GpuTensor | None
    outputs: list[hk.GpuTensor]  # read back after a replay: the kept inputs, then the logits
    kept: list[tuple[int, int, int]]  # (segment, layer, tensors) of the kept inputs, in order
    memories: list[weakref.ref[SequenceMemory]]
    bound: list[Any]  # bound_objects of the memories, in order

    def fits(self, segments: Sequence[Segment]) -> bool:
        # list equality compares identities first: no object here defines another equality
        memories = [s.memory for s in segments]
        return [ref() for ref in self.memories] == memories and self.bound == [
            b for m in memories for b in bound_objects(m)
        ]


class StepPlans:
    """One architecture's captured decode steps on a GPU backend."""

    def __init__(self, ops: GpuBackend) -> None:
        self.ops = ops
        self._plans: OrderedDict[StepKey, StepPlan] = OrderedDict()
        self._seen: Counter[StepKey] = Counter()
        self.replays = 0  # steps replayed (tests and the bench read it)
        # a replay's read-back: its outputs are all device tensors (one submission, one wait)
        self.read_back = ops.device.to_host_many

    def replay(self, segments: Sequence[Segment]) -> list[np.ndarray | None] | None:
        """The step's logits from its plan (memories advanced, kept inputs filled), or None when
        it has no plan that fits."""
        key = step_key(segments) if self.ops.replay_steps else None
        plan = None if key is None else self._plans.get(key)
        if plan is None or key is None:
            return None
        if not plan.fits(segments):
            del self._plans[key]
            return None
        self._plans.move_to_end(key)
        for seg in segments:
            seg.memory.check_room(1)
        # the step's token ids and positions written, and the plan recorded, in one call
        writes = [(plan.tokens, [s.tokens[0] for s in segments])]
        if plan.positions is not None:
            writes.append((plan.positions, [s.memory.n_tokens for s in segments]))
        self.ops.device.replay(plan.plan, writes)
        advance(segments)
        host = self.read_back(plan.outputs)
        at = 0
        for i, il, n in plan.kept:
            inputs = segments[i].inputs
            if inputs is not None:
                inputs[il] = tuple(host[at : at + n])
            at += n
        self.replays += 1
        return split_logits(segments, [slice(i, i + 1) for i in range(len(segments))], host[-1])

    def capture(self, segments: Sequence[Segment]) -> CaptureLog | None:
        """A log to capture this call's forward into (capture begun), or None: not a decode step,
        not seen often enough, or the device cannot capture now."""
        key = step_key(segments)
        if key is None or not self.ops.replay_steps:
            return None
        self._seen[key] += 1
        if self._seen[key] < CAPTURE_AT:
            return None
        log = CaptureLog()
        return log if self.ops.begin_capture(log) else None

    def keep(self, log: CaptureLog, segments: Sequence[Segment]) -> None:
        """After the captured forward succeeded: keep its plan for the step's key."""
        self.ops.end_capture()  # in case the forward read nothing back
        key = step_key(segments)
        tokens = log.inputs.get("tokens")
        if key is None or log.plan is None or tokens is None or not log.outputs:
            return
        kept = [(i, il, len(parts)) for i, s in enumerate(segments) if s.inputs for il, parts in s.inputs.items()]
        self._plans[key] = StepPlan(
            plan=log.plan,
            tokens=tokens,
            positions=log.inputs.get("positions"),
            outputs=log.outputs,
            kept=kept,
            memories=[weakref.ref(s.memory) for s in segments],
            bound=[b for s in segments for b in bound_objects(s.memory)],
        )
        self._seen.pop(key, None)
        self._drop_stale()

    def plan_for(self, segments: Sequence[Segment]) -> StepPlan | None:
        """The plan a decode step of these segments would replay, if any (the bench times it)."""
        key = step_key(segments)
        plan = None if key is None else self._plans.get(key)
        return plan if plan is not None and plan.fits(segments) else None

    @property
    def last_plan(self) -> hk.GpuPlan | None:
        """The plan captured or replayed last (the bench reports its size)."""
        return next(reversed(self._plans.values())).plan if self._plans else None

    def _drop_stale(self) -> None:
        for key in [k for k, p in self._plans.items() if any(ref() is None for ref in p.memories)]:
            del self._plans[key]
        while len(self._plans) > MAX_PLANS:
            self._plans.popitem(last=False)
        if len(self._seen) > 4 * MAX_PLANS:
            self._seen.clear()
