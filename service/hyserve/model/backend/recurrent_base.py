"""The operations the recurrent and hybrid architectures (qwen35, qwen3next, mamba2) add to a
`Backend`: tensor slicing, the small gating steps, the convolution with carried state, the gated
delta rule, the Mamba2 scan, and device-resident recurrent states."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from hyserve.model.backend.rotary import Rotary

Tensor = Any
Matrix = Any


class RecurrentState(Protocol):
    """One recurrent layer's conv and SSM/delta state, where the backend keeps it."""

    conv: Tensor
    ssm: Tensor
    on_device: bool

    @property
    def nbytes(self) -> int: ...
    def reset(self) -> None: ...
    def copies(self) -> tuple[Tensor, Tensor]:
        """(conv, ssm) copies on the same device (checkpoints)."""
        ...

    def host_copies(self) -> tuple[np.ndarray, np.ndarray]:
        """(conv, ssm) copies in host memory (the prefix store)."""
        ...

    def to_host(self, conv: Tensor, ssm: Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of a (conv, ssm) pair from `copies` (as they are when already on the host)."""
        ...

    def put(self, conv: Tensor | np.ndarray, ssm: Tensor | np.ndarray) -> None:
        """Become the given state (a copy from `copies` or `host_copies`), exactly."""
        ...

    def adopt(self, conv: Tensor, ssm: Tensor) -> None:
        """Become the state a forward wrote into spare buffers (which the caller gives up)."""
        ...


class RecurrentOps(Protocol):
    def recurrent_state(self, conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...]) -> RecurrentState: ...
    def columns(self, x: Tensor, start: int, width: int) -> Tensor:
        """Columns start..start+width of a 2-D tensor, as a new (contiguous) tensor."""
        ...

    def concat_columns(self, parts: Sequence[Tensor]) -> Tensor: ...
    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Rows start..stop (first dimension): a new tensor, or x itself when that is all of it
        (callers only read the result)."""
        ...

    def put_rows(self, dst: Tensor, start: int, src: Tensor) -> None: ...
    def mul_(self, dst: Tensor, a: Tensor) -> None: ...
    def silu(self, x: Tensor) -> Tensor: ...
    def mul_silu_(self, dst: Tensor, gate: Tensor) -> None:
        """dst *= silu(gate): the bits of `mul_(dst, silu(gate))`, without the copy on a device"""
        ...

    def sigmoid_mul_(self, dst: Tensor, gate: Tensor) -> None:
        """dst *= sigmoid(gate)"""
        ...

    def sigmoid_mul_columns_(self, dst: Tensor, x: Tensor, start: int) -> None:
        """dst (rows x m) *= sigmoid(x[:, start:start + m]) for a 2-D x of as many rows: the bits
        of `sigmoid_mul_(dst, columns(x, start, m))`, without the copy on a device."""
        ...

    def mul_row_(self, dst: Tensor, w: Tensor) -> None:
        """dst[r, :] *= w for every row"""
        ...

    def rms_norm_groups(self, x: Tensor, n: int, eps: float) -> Tensor:
        """RMSNorm without weight over consecutive groups of n values."""
        ...

    def gated_rms_norm_groups(
        self, x: Tensor, gate: Tensor, weight: Tensor, n: int, eps: float, feeds: Sequence[Matrix] = ()
    ) -> Tensor:
        """x (rows x m) *= silu(gate) in place, then RMSNorm over consecutive groups of n values,
        times `weight` (length m: it spans a row's groups): the bits of `mul_silu_`,
        `rms_norm_groups` and `mul_row_` (one pass on a device; `feeds` as in `rms_norm`)."""
        ...

    def rms_norm_columns(self, x: Tensor, weight: Tensor, eps: float, width: int, rope: Rotary | None = None) -> Tensor:
        """RMSNorm (times `weight`, groups of len(weight)) of the first `width` columns of each
        row of a 2-D x, as a rows x width tensor: `rms_norm(columns(x, 0, width), rope=rope)`
        without the copy on a device, the same bits."""
        ...

    def l2_norm(self, x: Tensor, n: int, eps: float) -> Tensor:
        """x / max(|x|, eps) over consecutive groups of n values (ggml_l2_norm)."""
        ...

    def rope_keeping(
        self, x: Tensor, n_head: int, positions: Tensor, n_rot: int, base: float, still: np.ndarray
    ) -> Tensor:
        """NEOX RoPE except the rotary pairs `still` (IMROPE's unrotated pairs for text)."""
        ...

    def gdn_gates(self, b: Tensor, a: Tensor, dt_bias: Tensor, neg_a: Tensor) -> tuple[Tensor, Tensor]:
        """Gated DeltaNet (g, beta): softplus(a + dt_bias) * neg_a, sigmoid(b)."""
        ...

    def conv1d(
        self,
        x: Tensor,
        weight: Tensor,
        state: Tensor,
        new_state: Tensor,
        bias: Tensor | None = None,
        silu: bool = False,
    ) -> Tensor:
        """Causal depthwise convolution of x (rows x channels) continuing from `state`; the new
        state is written to `new_state` (`state` is left as it was)."""
        ...

    def gated_delta_rule(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        state: Tensor,
        new_state: Tensor,
        n_k_heads: int,
        n_v_heads: int,
        grouped: bool,
        l2_eps: float | None = None,
    ) -> Tensor:
        """q, k: rows x nk*dk, L2-normalised (or normalised here with `l2_eps` as llama.cpp's graph
        does it: rms_norm(x, eps / dk) / sqrt(dk)); v: rows x nv*dv; returns rows x nv x dv. V head j
        uses k head j // (nv/nk) when `grouped`, else j % nk."""
        ...

    def gated_delta_rule_packed(
        self,
        u: Tensor,
        g: Tensor,
        beta: Tensor,
        state: Tensor,
        new_state: Tensor,
        n_k_heads: int,
        n_v_heads: int,
        grouped: bool,
        l2_eps: float | None = None,
    ) -> Tensor:
        """`gated_delta_rule` on q, k and v as the columns of one tensor, u = [q | k | v]
        (rows x (2*nk*dk + nv*dv), a delta-net layer's convolution output; dk and dv from the state's
        shape nv x dv x dk): the same bits, without copying the three apart on a device."""
        ...

    def mamba2_scan(
        self,
        x: Tensor,
        dt: Tensor,
        a: Tensor,
        b: Tensor,
        c: Tensor,
        d: Tensor,
        dt_bias: Tensor,
        state: Tensor,
        new_state: Tensor,
        n_heads: int,
        n_groups: int,
    ) -> Tensor:
        """x: rows x H*P, dt: rows x H, b, c: rows x G*N; returns rows x H x P."""
        ...
