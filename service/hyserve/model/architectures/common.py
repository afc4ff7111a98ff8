"""Pieces shared by the transformer architectures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from hyserve.model.architectures.base import Segment, greedy_only, logit_rows, split_logits
from hyserve.model.backend.base import AttentionSpan, Backend, Matrix, Tensor
from hyserve.model.backend.cpu import CPU
from hyserve.model.memory import RecurrentState, SequenceMemory, WindowCache, as_f16


def inv_sqrt_f32(n: float) -> np.float32:
    """1/sqrt(n) as llama.cpp computes attention scales, in float (`1.0f/sqrtf(float(n))`): the
    quotient of the double square root rounds differently for some n (24, 96, 112)."""
    return np.float32(1.0) / np.sqrt(np.float32(n))


def attend(
    ops: Backend,
    segments: Sequence[Segment],
    spans: list[slice],
    layer: int,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    positions: Tensor,
    window: int = 0,
    kq_scale: float = 1.0,
) -> Tensor:
    """Write each segment's K/V rows into its own cache, then attend its queries over that cache.

    q: rows x n_head*head_dim, k, v: rows x n_kv*head_dim (or the same split per head); scores are
    multiplied by kq_scale before the softmax (1.0 when q is pre-scaled); `positions` as
    `ops.ids` made them. Returns rows x n_head*head_dim.
    """
    rows = q.shape[0]
    out = ops.empty((rows, math.prod(q.shape[1:])))
    jobs = []
    for seg, span in zip(segments, spans):
        if span.stop == span.start:
            continue
        cache = seg.memory.kv[layer]
        if seg.inputs is not None and isinstance(cache, WindowCache):  # kept for replays, as the ring holds them
            n, hd = span.stop - span.start, cache.k.shape[2]
            seg.inputs[layer] = tuple(as_f16(t[span].reshape(n, -1, hd)) for t in (k, v))
        jobs.append(AttentionSpan(cache, seg.memory.n_tokens, span))
    ops.attention(jobs, q, k, v, positions, window, kq_scale, out)
    return out


class InputNorm(NamedTuple):
    """A sub-layer's input norm and the matrices its input goes into first (the norm's `feeds`)."""

    weight: Tensor
    feeds: Sequence[Matrix]


def next_input_norm(layers: Sequence[Any], il: int) -> InputNorm | None:
    """The input norm of the layer after layer `il` (its `input_norm`), or None after the last."""
    return layers[il + 1].input_norm if il + 1 < len(layers) else None


def first_input_norm(ops: Backend, h: Tensor, layers: Sequence[Any], eps: float) -> Tensor:
    """The first layer's input norm of the embeddings `h`."""
    norm: InputNorm = layers[0].input_norm
    return ops.rms_norm(h, norm.weight, eps, feeds=norm.feeds)


def add_and_norm(ops: Backend, h: Tensor, y: Tensor, norm: InputNorm | None, eps: float) -> Tensor | None:
    """h += y (the residual stream), and the RMSNorm of the new h with `norm` (the next sub-layer's
    input) in the same pass on a device; with no norm (after the last layer, whose norm is the
    output's, taken on the rows asked for) the add alone."""
    if norm is None:
        ops.add_(h, y)
        return None
    return ops.add_rms_norm(h, y, norm.weight, eps, feeds=norm.feeds)


def advance(segments: Sequence[Segment]) -> None:
    """Commit the evaluated tokens to each memory (after the whole forward succeeded)."""
    for seg in segments:
        seg.memory.n_tokens += len(seg.tokens)
        seg.memory.note_written(seg.memory.n_tokens)


def output_logits(
    ops: Backend,
    h: Tensor,
    segments: Sequence[Segment],
    spans: list[slice],
    norm: Tensor,
    output: Matrix,
    eps: float,
    softcap: float = 0.0,
) -> list[np.ndarray | None]:
    """Final norm and LM head (optionally soft-capped), for the rows whose logits were asked for
    only; only those logits come back to the host, in one read-back with the kept inputs."""
    wanted = logit_rows(segments, spans)
    if len(wanted) == 0:
        read_back(ops, segments)
        return split_logits(segments, spans, np.empty((0, output.rows), np.float32))
    logits = ops.matmul(output, ops.rms_norm(ops.take_rows(h, wanted), norm, eps, feeds=(output,)))
    if softcap:
        logits = ops.softcap(logits, softcap)
    if greedy_only(segments):  # one number per row comes back instead of the vocabulary's logits
        return split_logits(segments, spans, read_back(ops, segments, ops.argmax_rows(logits)))
    return split_logits(segments, spans, read_back(ops, segments, logits))


def read_back(ops: Backend, segments: Sequence[Segment], logits: Tensor | None = None) -> np.ndarray | None:
    """Bring the segments' kept inputs (device tensors while the forward records) to the host
    together with `logits`: on a GPU one submission and one wait per forward, where a read-back
    per recurrent layer would leave the device idle between them."""
    kept = [(seg.inputs, il) for seg in segments if seg.inputs for il in seg.inputs]
    flat = [t for inputs, il in kept for t in inputs[il]]
    host = ops.to_host_many(flat if logits is None else [*flat, logits])
    at = 0
    for inputs, il in kept:
        n = len(inputs[il])
        inputs[il] = tuple(host[at : at + n])
        at += n
    return None if logits is None else host[-1]


class WorkingStates:
    """The recurrent states a forward call produces, kept apart from the memories' own until the
    whole call succeeded (I1). A layer's kernels read the memory's (conv, ssm) states and write the
    new ones into spare buffers (`new_state=`); `commit` swaps those in. The replaced arrays
    become the spare buffers of later calls, so a forward neither copies nor allocates states, and
    a call that raises leaves every memory's arrays as they were."""

    def __init__(self, ops: Backend = CPU) -> None:
        self.ops = ops
        # (id(memory), layer) -> (state object, new conv, new ssm)
        self._new: dict[tuple[int, int], tuple[RecurrentState, Tensor, Tensor]] = {}
        self._dropped: list[np.ndarray] = []

    def layer(self, memory: SequenceMemory, il: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(conv, ssm, new_conv, new_ssm) for `memory`'s recurrent layer `il`: the states to continue
        from (read only) and the buffers to write the updated ones to."""
        key = (id(memory), il)
        st = memory.recurrent[il]
        got = self._new.get(key)
        if got is None:
            conv, ssm = st.conv, st.ssm
        else:  # the same memory twice in one call: continue from its first update
            conv, ssm = got[1], got[2]
            if isinstance(conv, np.ndarray):
                self._dropped += [conv, ssm]
        new_conv, new_ssm = self._spare(conv), self._spare(ssm)
        self._new[key] = (st, new_conv, new_ssm)
        return conv, ssm, new_conv, new_ssm

    def _spare(self, like: Tensor) -> Tensor:
        # device tensors come from the device's own buffer pool
        return _spare(like) if isinstance(like, np.ndarray) else self.ops.empty(tuple(like.shape))

    def commit(self) -> None:
        spare = self._dropped
        for st, conv, ssm in self._new.values():
            if isinstance(st.conv, np.ndarray):
                spare += [st.conv, st.ssm]
            st.adopt(conv, ssm)
        for a in spare:
            _SPARE.setdefault(_spare_key(a), []).append(a)
        self._new, self._dropped = {}, []


# Spare state buffers by (shape, dtype): the arrays replaced by the last commits. list.pop/append
# are atomic, so concurrent forward calls (on different memories) can share them.
_SPARE: dict[tuple, list[np.ndarray]] = {}


def _spare_key(a: np.ndarray) -> tuple:
    return a.shape, a.dtype


def _spare(like: np.ndarray) -> np.ndarray:
    try:
        return _SPARE[_spare_key(like)].pop()
    except (KeyError, IndexError):
        return np.empty_like(like)
