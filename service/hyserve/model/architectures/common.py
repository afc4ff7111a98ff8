"""Pieces shared by the transformer architectures."""

from __future__ import annotations

from collections.abc import Sequence

import hyserve_kernels as hk
import numpy as np

from hyserve.model.architectures.base import Segment, logit_rows, split_logits


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
        cache.write(start, k[span], v[span])
        k_bits, v_bits = cache.bits_until(start + (span.stop - span.start))
        a = hk.attention(q[span], k_bits, v_bits, positions[span], window, kq_scale)
        out[span] = a.reshape(span.stop - span.start, -1)
    return out


def advance(segments: Sequence[Segment]) -> None:
    """Commit the evaluated tokens to each memory (after the whole forward succeeded)."""
    for seg in segments:
        seg.memory.n_tokens += len(seg.tokens)


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


RecurrentCopies = dict[int, dict[int, tuple[np.ndarray, np.ndarray]]]


def working_states(segments: Sequence[Segment]) -> RecurrentCopies:
    """Copies of every segment's recurrent states (by id(memory), then layer) for a forward call to
    update; `commit_states` writes them back only once the whole call succeeded (I1)."""
    return {
        id(seg.memory): {il: (st.conv.copy(), st.ssm.copy()) for il, st in seg.memory.recurrent.items()}
        for seg in segments
    }


def commit_states(segments: Sequence[Segment], states: RecurrentCopies) -> None:
    for seg in segments:
        for il, (conv, ssm) in states[id(seg.memory)].items():
            seg.memory.recurrent[il].conv[...] = conv
            seg.memory.recurrent[il].ssm[...] = ssm
