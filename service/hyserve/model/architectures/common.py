"""Pieces shared by the transformer architectures."""

from __future__ import annotations

from collections.abc import Sequence

import hyserve_kernels as hk
import numpy as np

from hyserve.model.architectures.base import Segment


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
