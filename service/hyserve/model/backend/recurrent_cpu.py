"""The recurrent architectures' operations on the CPU: exactly the numpy steps and SIMD kernels
the architectures called before the device became a parameter (the same bits)."""

from __future__ import annotations

from collections.abc import Sequence

import hyserve_kernels as hk
import numpy as np

from hyserve.model.backend.rotary import Rotary
from hyserve.model.memory import RecurrentState


class CpuRecurrentOps:
    def recurrent_state(self, conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...]) -> RecurrentState:
        return RecurrentState(conv_shape, ssm_shape)

    def columns(self, x: np.ndarray, start: int, width: int) -> np.ndarray:
        return np.ascontiguousarray(x[:, start : start + width])

    def concat_columns(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        return np.concatenate(list(parts), axis=1)

    def rows(self, x: np.ndarray, start: int, stop: int) -> np.ndarray:
        return np.ascontiguousarray(x[start:stop])

    def put_rows(self, dst: np.ndarray, start: int, src: np.ndarray) -> None:
        dst[start : start + len(src)] = src

    def mul_(self, dst: np.ndarray, a: np.ndarray) -> None:
        dst *= a

    def silu(self, x: np.ndarray) -> np.ndarray:
        return hk.silu(np.ascontiguousarray(x).reshape(-1)).reshape(x.shape)

    def mul_silu_(self, dst: np.ndarray, gate: np.ndarray) -> None:
        self.mul_(dst, self.silu(gate))

    def sigmoid_mul_(self, dst: np.ndarray, gate: np.ndarray) -> None:
        dst *= hk.sigmoid(gate)  # libm's expf, as ggml (numpy's exp rounds differently)

    def sigmoid_mul_columns_(self, dst: np.ndarray, x: np.ndarray, start: int) -> None:
        self.sigmoid_mul_(dst, self.columns(x, start, dst.shape[1]))

    def mul_row_(self, dst: np.ndarray, w: np.ndarray) -> None:
        dst *= w

    def rms_norm_groups(self, x: np.ndarray, n: int, eps: float) -> np.ndarray:
        return hk.rms_norm(np.ascontiguousarray(x).reshape(-1, n), None, eps).reshape(x.shape)

    def gated_rms_norm_groups(
        self,
        x: np.ndarray,
        gate: np.ndarray,
        weight: np.ndarray,
        n: int,
        eps: float,
        feeds: Sequence[hk.QMatrix] = (),
    ) -> np.ndarray:
        self.mul_silu_(x, gate)
        normed = self.rms_norm_groups(x, n, eps)
        self.mul_row_(normed, weight)
        return normed

    def rms_norm_columns(
        self, x: np.ndarray, weight: np.ndarray, eps: float, width: int, rope: Rotary | None = None
    ) -> np.ndarray:
        out = self.rms_norm(self.columns(x, 0, width), weight, eps)  # the CPU backend's, as a copy then a norm
        if rope is not None:  # in place, a token's heads to a row
            self.rope(out.reshape(-1, rope.n_head * len(weight)), *rope)
        return out

    def l2_norm(self, x: np.ndarray, n: int, eps: float) -> np.ndarray:
        return hk.l2_norm(np.ascontiguousarray(x).reshape(-1, n), eps).reshape(x.shape)

    def rope_keeping(
        self, x: np.ndarray, n_head: int, positions: np.ndarray, n_rot: int, base: float, still: np.ndarray
    ) -> np.ndarray:
        x = np.ascontiguousarray(x)
        heads = x.reshape(len(x), n_head, -1)
        dims = np.concatenate([still, still + n_rot // 2])
        kept = heads[:, :, dims].copy()
        hk.rope(x, n_head, positions, n_rot, base, 1.0, True)
        heads[:, :, dims] = kept
        return x

    def gdn_gates(
        self, b: np.ndarray, a: np.ndarray, dt_bias: np.ndarray, neg_a: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        beta = hk.sigmoid(b)
        g = hk.softplus(np.add(a, dt_bias, dtype=np.float32))
        g *= neg_a
        return g, beta

    def conv1d(
        self,
        x: np.ndarray,
        weight: np.ndarray,
        state: np.ndarray,
        new_state: np.ndarray,
        bias: np.ndarray | None = None,
        silu: bool = False,
    ) -> np.ndarray:
        return hk.conv1d_causal(x, weight, state, bias, silu=silu, new_state=new_state)

    def gated_delta_rule(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        g: np.ndarray,
        beta: np.ndarray,
        state: np.ndarray,
        new_state: np.ndarray,
        n_k_heads: int,
        n_v_heads: int,
        grouped: bool,
        l2_eps: float | None = None,
    ) -> np.ndarray:
        t = len(g)
        q, k = q.reshape(t, n_k_heads, -1), k.reshape(t, n_k_heads, -1)
        if grouped and n_v_heads != n_k_heads:
            # the kernel pairs v head j with k head j % n_k: repeat each k head for its group
            q, k = np.repeat(q, n_v_heads // n_k_heads, axis=1), np.repeat(k, n_v_heads // n_k_heads, axis=1)
        v = v.reshape(t, n_v_heads, -1)
        if l2_eps is None:
            return hk.gated_delta_rule(q, k, v, g, beta, state, new_state=new_state)
        return hk.gated_delta_rule(q, k, v, g, beta, state, l2_eps=l2_eps, new_state=new_state)

    def gated_delta_rule_packed(
        self,
        u: np.ndarray,
        g: np.ndarray,
        beta: np.ndarray,
        state: np.ndarray,
        new_state: np.ndarray,
        n_k_heads: int,
        n_v_heads: int,
        grouped: bool,
        l2_eps: float | None = None,
    ) -> np.ndarray:
        width = n_k_heads * state.shape[-1]
        q, k = self.columns(u, 0, width), self.columns(u, width, width)
        v = self.columns(u, 2 * width, u.shape[1] - 2 * width)
        return self.gated_delta_rule(q, k, v, g, beta, state, new_state, n_k_heads, n_v_heads, grouped, l2_eps)

    def mamba2_scan(
        self,
        x: np.ndarray,
        dt: np.ndarray,
        a: np.ndarray,
        b: np.ndarray,
        c: np.ndarray,
        d: np.ndarray,
        dt_bias: np.ndarray,
        state: np.ndarray,
        new_state: np.ndarray,
        n_heads: int,
        n_groups: int,
    ) -> np.ndarray:
        t = len(dt)
        x = x.reshape(t, n_heads, -1)
        b, c = b.reshape(t, n_groups, -1), c.reshape(t, n_groups, -1)
        return hk.mamba2_scan(x, dt, a, b, c, state, d, dt_bias, new_state=new_state)
