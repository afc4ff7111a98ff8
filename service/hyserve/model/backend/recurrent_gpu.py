"""The recurrent architectures' operations on the GPU (`gpu::recurrent`'s WGSL shaders), and
recurrent states resident on the device: checkpoints are device-to-device copies, the prefix
store's images host copies, and a restored state continues bit for bit like the live one."""

from __future__ import annotations

from collections.abc import Sequence

import hyserve_kernels as hk
import hyserve_kernels._native as native
import numpy as np

from hyserve.model.backend.errors import GpuUnsupported
from hyserve.model.backend.rotary import Rotary


class GpuRecurrentState:
    """One recurrent layer's conv and SSM/delta state (f32) in device memory."""

    on_device = True

    def __init__(self, device: hk.GpuDevice, conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...]) -> None:
        self.device = device
        self._conv = device.tensor(np.zeros(conv_shape, dtype=np.float32))
        self._ssm = device.tensor(np.zeros(ssm_shape, dtype=np.float32))

    # Read-only: the buffers stay the same ones for the state's life (new values are copied in),
    # so a captured decode step that binds them stays valid while the state object does.
    @property
    def conv(self) -> hk.GpuTensor:
        return self._conv

    @property
    def ssm(self) -> hk.GpuTensor:
        return self._ssm

    @property
    def nbytes(self) -> int:
        return int(self.conv.nbytes + self.ssm.nbytes)

    def reset(self) -> None:
        for t in (self.conv, self.ssm):
            native.gpu_write(self.device, t, np.zeros(t.shape, dtype=np.float32))

    def copies(self) -> tuple[hk.GpuTensor, hk.GpuTensor]:
        out = native.gpu_clone(self.device, self.conv), native.gpu_clone(self.device, self.ssm)
        self.device.flush()  # a forward call dropped later must not take the copy with it
        return out

    def host_copies(self) -> tuple[np.ndarray, np.ndarray]:
        return self.device.to_host(self.conv), self.device.to_host(self.ssm)

    def to_host(self, conv: hk.GpuTensor, ssm: hk.GpuTensor) -> tuple[np.ndarray, np.ndarray]:
        return self.device.to_host(conv), self.device.to_host(ssm)

    def adopt(self, conv: hk.GpuTensor, ssm: hk.GpuTensor) -> None:
        # copied into place, so that the state's buffers stay the same ones for the memory's life:
        # a captured decode step binds them (a device copy costs far less than re-recording);
        # recorded into the forward's own work, which has advanced the memory by then
        native.gpu_copy_into(self.device, conv, self.conv, False)
        native.gpu_copy_into(self.device, ssm, self.ssm, False)

    def put(self, conv: hk.GpuTensor | np.ndarray, ssm: hk.GpuTensor | np.ndarray) -> None:
        for dst, src in ((self.conv, conv), (self.ssm, ssm)):
            if isinstance(src, np.ndarray):
                native.gpu_write(self.device, dst, np.ascontiguousarray(src, dtype=np.float32))
            else:
                native.gpu_copy_into(self.device, src, dst)


class GpuRecurrentOps:
    device: hk.GpuDevice

    def recurrent_state(self, conv_shape: tuple[int, ...], ssm_shape: tuple[int, ...]) -> GpuRecurrentState:
        return GpuRecurrentState(self.device, conv_shape, ssm_shape)

    def columns(self, x: hk.GpuTensor, start: int, width: int) -> hk.GpuTensor:
        return self.device.columns(x, start, width)

    def concat_columns(self, parts: Sequence[hk.GpuTensor]) -> hk.GpuTensor:
        return native.gpu_concat_columns(self.device, list(parts))

    def rows(self, x: hk.GpuTensor, start: int, stop: int) -> hk.GpuTensor:
        if start == 0 and stop == x.shape[0]:
            return x  # a batch of one sequence: no copy (as numpy's slice of a whole array)
        return native.gpu_rows(self.device, x, start, stop)

    def put_rows(self, dst: hk.GpuTensor, start: int, src: hk.GpuTensor) -> None:
        native.gpu_put_rows(self.device, dst, start, src)

    def mul_(self, dst: hk.GpuTensor, a: hk.GpuTensor) -> None:
        self.device.mul(dst, a)

    def silu(self, x: hk.GpuTensor) -> hk.GpuTensor:
        out = native.gpu_clone(self.device, x)
        self.device.silu(out)
        return out

    def mul_silu_(self, dst: hk.GpuTensor, gate: hk.GpuTensor) -> None:
        self.device.mul_silu(dst, gate)

    def sigmoid_mul_(self, dst: hk.GpuTensor, gate: hk.GpuTensor) -> None:
        native.gpu_sigmoid_mul(self.device, dst, gate)

    def sigmoid_mul_columns_(self, dst: hk.GpuTensor, x: hk.GpuTensor, start: int) -> None:
        native.gpu_sigmoid_mul_columns(self.device, dst, x, start)

    def mul_row_(self, dst: hk.GpuTensor, w: hk.GpuTensor) -> None:
        native.gpu_mul_row(self.device, dst, w)

    def rms_norm_groups(self, x: hk.GpuTensor, n: int, eps: float) -> hk.GpuTensor:
        return self.device.rms_norm(x, None, eps, n)

    def gated_rms_norm_groups(
        self,
        x: hk.GpuTensor,
        gate: hk.GpuTensor,
        weight: hk.GpuTensor,
        n: int,
        eps: float,
        feeds: Sequence[hk.GpuMatrix] = (),
    ) -> hk.GpuTensor:
        return self.device.gated_rms_norm(x, gate, weight, n, eps, feeds=list(feeds))

    def rms_norm_columns(
        self, x: hk.GpuTensor, weight: hk.GpuTensor, eps: float, width: int, rope: Rotary | None = None
    ) -> hk.GpuTensor:
        return self.device.rms_norm(x, weight, eps, weight.shape[0], width, rope=rope)

    def l2_norm(self, x: hk.GpuTensor, n: int, eps: float) -> hk.GpuTensor:
        return native.gpu_l2_norm(self.device, x, n, eps)

    def rope_keeping(
        self, x: hk.GpuTensor, n_head: int, positions: hk.GpuTensor, n_rot: int, base: float, still: np.ndarray
    ) -> hk.GpuTensor:
        raise GpuUnsupported("IMROPE sections that leave rotary pairs unrotated have no GPU kernel yet")

    def gdn_gates(
        self, b: hk.GpuTensor, a: hk.GpuTensor, dt_bias: hk.GpuTensor, neg_a: hk.GpuTensor
    ) -> tuple[hk.GpuTensor, hk.GpuTensor]:
        return native.gpu_gdn_gates(self.device, b, a, dt_bias, neg_a)

    def conv1d(
        self,
        x: hk.GpuTensor,
        weight: hk.GpuTensor,
        state: hk.GpuTensor,
        new_state: hk.GpuTensor,
        bias: hk.GpuTensor | None = None,
        silu: bool = False,
    ) -> hk.GpuTensor:
        return native.gpu_conv1d(self.device, x, weight, state, new_state, bias, silu)

    def gated_delta_rule(
        self,
        q: hk.GpuTensor,
        k: hk.GpuTensor,
        v: hk.GpuTensor,
        g: hk.GpuTensor,
        beta: hk.GpuTensor,
        state: hk.GpuTensor,
        new_state: hk.GpuTensor,
        n_k_heads: int,
        n_v_heads: int,
        grouped: bool,
        l2_eps: float | None = None,
    ) -> hk.GpuTensor:
        rows = g.shape[0]
        if rows == 0:  # the kernel's call only carries the state over
            return native.gpu_delta_rule(self.device, q, v, 0, g, beta, state, new_state, n_k_heads, n_v_heads, grouped)
        u = self.concat_columns([t.reshape(rows, -1) for t in (q, k, v)])
        return self.gated_delta_rule_packed(u, g, beta, state, new_state, n_k_heads, n_v_heads, grouped, l2_eps)

    def gated_delta_rule_packed(
        self,
        u: hk.GpuTensor,
        g: hk.GpuTensor,
        beta: hk.GpuTensor,
        state: hk.GpuTensor,
        new_state: hk.GpuTensor,
        n_k_heads: int,
        n_v_heads: int,
        grouped: bool,
        l2_eps: float | None = None,
    ) -> hk.GpuTensor:
        dk = state.shape[-1]
        width = 2 * n_k_heads * dk
        rest = (g, beta, state, new_state, n_k_heads, n_v_heads, grouped)
        # the kernel reads v from u's own rows
        if l2_eps is None:
            return native.gpu_delta_rule(self.device, self.columns(u, 0, width), u, width, *rest)
        eps_dk, weight = l2_constants(dk, l2_eps)
        if self.device.numerics == "fast":  # q and k normalised in the rule's own pass
            return native.gpu_delta_rule(self.device, u, u, width, *rest, (eps_dk, weight))
        # exact: the norm's pass (the CPU's exact sums), straight out of u (no copies of the columns)
        scales = self.__dict__.setdefault("_l2_scales", {})
        if dk not in scales:
            scales[dk] = self.device.tensor(np.full(dk, weight, np.float32))
        qk = self.device.rms_norm(u, scales[dk], eps_dk, dk, width)
        return native.gpu_delta_rule(self.device, qk, u, width, *rest)

    def mamba2_scan(
        self,
        x: hk.GpuTensor,
        dt: hk.GpuTensor,
        a: hk.GpuTensor,
        b: hk.GpuTensor,
        c: hk.GpuTensor,
        d: hk.GpuTensor,
        dt_bias: hk.GpuTensor,
        state: hk.GpuTensor,
        new_state: hk.GpuTensor,
        n_heads: int,
        n_groups: int,
    ) -> hk.GpuTensor:
        heads = self._mamba2_heads(a, d, dt_bias)
        return native.gpu_mamba2_scan(self.device, x, dt, heads, b, c, state, new_state, n_groups)

    def _mamba2_heads(self, a: hk.GpuTensor, d: hk.GpuTensor, dt_bias: hk.GpuTensor) -> hk.GpuTensor:
        """A layer's per-head constants [A | D | dt_bias] in one tensor, as the scan binds them:
        packed once per layer (the weights never change), not in every step."""
        packed = self.__dict__.setdefault("_packed_heads", {})
        key = (id(a), id(d), id(dt_bias))
        if key not in packed:  # the constants are kept alive with their key, so ids stay theirs
            parts = [t.reshape(1, -1) for t in (a, d, dt_bias)]
            packed[key] = (a, d, dt_bias, native.gpu_concat_columns(self.device, parts))
        return packed[key][3]


def l2_constants(dk: int, l2_eps: float) -> tuple[float, float]:
    """How q and k are L2-normalised per head of dk, as the CPU and current llama.cpp's graph do
    it: rms_norm(x, eps / dk) * (1 / sqrt(dk)), both constants rounded in f32 as the CPU computes
    them (ggml_l2_norm's own formula differs in the last bits). The factor is the norm's weight:
    x * scale * w rounds as a norm and then a scale do. Returns (eps / dk, 1 / sqrt(dk))."""
    return float(np.float32(l2_eps) / np.float32(dk)), float(np.float32(1) / np.sqrt(np.float32(dk)))
