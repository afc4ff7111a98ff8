"""Pieces shared by the transformer architectures."""

from __future__ import annotations

from collections.abc import Sequence

import hyserve_kernels as hk
import numpy as np

from hyserve.model.architectures.base import Segment, logit_rows, split_logits
from hyserve.model.memory import RecurrentState, SequenceMemory, WindowCache


def attend(
    segments: Sequence[Segment],
    spans: list[slice],
    layer: int,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    positions: np.ndarray,
    window: int = 0,
    kq_scale: float = 1.0,
) -> np.ndarray:
    """Write each segment's K/V rows into its own cache, then attend its queries over that cache.

    q: rows x n_head x head_dim; k, v: rows x n_kv x head_dim; scores are multiplied by kq_scale before
    the softmax (1.0 when q is pre-scaled). Returns rows x n_head*head_dim.
    """
    out = np.empty((q.shape[0], q.shape[1] * q.shape[2]), dtype=np.float32)
    for seg, span in zip(segments, spans):
        if span.stop == span.start:
            continue
        cache = seg.memory.kv[layer]
        start = seg.memory.n_tokens
        end = start + (span.stop - span.start)
        cache.write(start, k[span], v[span])
        if seg.inputs is not None and isinstance(cache, WindowCache):  # kept for replays, as the ring holds them
            seg.inputs[layer] = (k[span].astype(np.float16), v[span].astype(np.float16))
        # a ring-buffer window cache hands over its keys from `base` on: positions shift with them
        k_bits, v_bits, base = cache.attention_view(start, end, window)
        pos = positions[span] if base == 0 else positions[span] - base
        a = hk.attention(q[span], k_bits, v_bits, pos, window, kq_scale)
        out[span] = a.reshape(span.stop - span.start, -1)
    return out


def advance(segments: Sequence[Segment]) -> None:
    """Commit the evaluated tokens to each memory (after the whole forward succeeded)."""
    for seg in segments:
        seg.memory.n_tokens += len(seg.tokens)
        seg.memory.note_written(seg.memory.n_tokens)


def output_logits(
    h: np.ndarray,
    segments: Sequence[Segment],
    spans: list[slice],
    norm: np.ndarray,
    output: hk.QMatrix,
    eps: float,
    softcap: float = 0.0,
) -> list[np.ndarray | None]:
    """Final norm and LM head (optionally soft-capped), for the rows whose logits were asked for only."""
    wanted = logit_rows(segments, spans)
    if len(wanted) == 0:
        return split_logits(segments, spans, np.empty((0, output.rows), np.float32))
    logits = hk.matmul(output, hk.rms_norm(np.ascontiguousarray(h[wanted]), norm, eps))
    if softcap:
        logits = (softcap * np.tanh(logits / softcap)).astype(np.float32)
    return split_logits(segments, spans, logits)


class WorkingStates:
    """The recurrent states a forward call produces, kept apart from the memories' own until the
    whole call succeeded (I1). A layer's kernels read the memory's (conv, ssm) states and write the
    new ones into spare buffers (`new_state=`); `commit` swaps those in. The replaced arrays
    become the spare buffers of later calls, so a forward neither copies nor allocates states, and
    a call that raises leaves every memory's arrays as they were."""

    def __init__(self) -> None:
        # (id(memory), layer) -> (state object, new conv, new ssm)
        self._new: dict[tuple[int, int], tuple[RecurrentState, np.ndarray, np.ndarray]] = {}
        self._dropped: list[np.ndarray] = []

    def layer(self, memory: SequenceMemory, il: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(conv, ssm, new_conv, new_ssm) for `memory`'s recurrent layer `il`: the states to continue
        from (read only) and the buffers to write the updated ones to."""
        key = (id(memory), il)
        st = memory.recurrent[il]
        got = self._new.get(key)
        if got is None:
            conv, ssm = st.conv, st.ssm
        else:  # the same memory twice in one call: continue from its first update
            conv, ssm = got[1], got[2]
            self._dropped += [conv, ssm]
        new_conv, new_ssm = _spare(conv), _spare(ssm)
        self._new[key] = (st, new_conv, new_ssm)
        return conv, ssm, new_conv, new_ssm

    def commit(self) -> None:
        spare = self._dropped
        for st, conv, ssm in self._new.values():
            spare += [st.conv, st.ssm]
            st.conv, st.ssm = conv, ssm
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
