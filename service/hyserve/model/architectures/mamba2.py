"""Mamba2 (`mamba2`) as llama.cpp runs it: attention-free; every block is a Mamba2 mixer
(in-projection, causal conv + bias + SiLU, selective scan with D skip, SiLU(z) gate, grouped RMSNorm,
out-projection) behind a pre-norm (model-reference.md §6). States update on working copies and are
committed only when the whole call succeeded (I1 under cancel or error)."""

from __future__ import annotations

from dataclasses import dataclass

import hyserve_kernels as hk
import numpy as np

from hyserve.model.architectures.base import (
    Architecture,
    Segment,
    check_cancel,
    segment_rows,
)
from hyserve.model.architectures.common import (
    InputNorm,
    WorkingStates,
    add_and_norm,
    advance,
    first_input_norm,
    next_input_norm,
    output_logits,
)
from hyserve.model.backend import CPU, Backend
from hyserve.model.backend.base import Matrix, Tensor
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.hparams import HParams
from hyserve.model.memory import SequenceMemory
from hyserve.model.weights import WeightLoader


@dataclass
class _Layer:
    norm: Tensor
    w_in: Matrix
    conv: Tensor  # [channels, kernel]
    conv_bias: Tensor
    dt_bias: Tensor
    a: Tensor  # -exp(A_log), per head
    d: Tensor
    ssm_norm: Tensor  # [d_inner] (G groups of d_inner/G)
    w_out: Matrix

    @property
    def input_norm(self) -> InputNorm:
        return InputNorm(self.norm, (self.w_in,))


class Mamba2(Architecture):
    name = "mamba2"

    has_gpu_path = True

    def __init__(self, gguf: GGUFFile, ops: Backend = CPU) -> None:
        hp = HParams(gguf)
        w = WeightLoader(gguf, ops)
        self.ops = ops
        self.n_embd = hp.int("embedding_length")
        self.n_layer = hp.int("block_count")
        self.eps = hp.float("attention.layer_norm_rms_epsilon", 1e-5)
        self.n_ctx_train = hp.int("context_length", 1 << 20)
        self.kernel = hp.int("ssm.conv_kernel")
        self.d_inner = hp.int("ssm.inner_size")
        self.d_state = hp.int("ssm.state_size")
        self.n_heads = hp.int("ssm.time_step_rank")
        self.n_groups = hp.int("ssm.group_count", 1)
        self.head_dim = self.d_inner // self.n_heads
        self.channels = self.d_inner + 2 * self.n_groups * self.d_state

        self.token_embd = w.matrix("token_embd.weight")
        self.n_vocab = self.token_embd.rows
        self.output = w.matrix("output.weight") if w.has("output.weight") else self.token_embd
        self.output_norm = w.vector("output_norm.weight", self.n_embd)
        self.layers = []
        for il in range(self.n_layer):
            p = f"blk.{il}."
            self.layers.append(
                _Layer(
                    norm=w.vector(p + "attn_norm.weight", self.n_embd),
                    w_in=w.matrix(p + "ssm_in.weight"),
                    conv=ops.vector(w.host_vector(p + "ssm_conv1d.weight").reshape(self.channels, self.kernel)),
                    conv_bias=w.vector(p + "ssm_conv1d.bias", self.channels),
                    dt_bias=w.vector(p + "ssm_dt.bias", self.n_heads),
                    a=w.vector(p + "ssm_a", self.n_heads),
                    d=w.vector(p + "ssm_d", self.n_heads),
                    ssm_norm=w.vector(p + "ssm_norm.weight", self.d_inner),
                    w_out=w.matrix(p + "ssm_out.weight"),
                )
            )

    def new_memory(self, n_ctx: int) -> SequenceMemory:
        conv, ssm = (self.kernel - 1, self.channels), (self.n_heads, self.head_dim, self.d_state)
        return SequenceMemory(n_ctx, {}, {il: self.ops.recurrent_state(conv, ssm) for il in range(self.n_layer)})

    def _mixer(self, L: _Layer, il: int, x: Tensor, segments, spans, states, cancel) -> Tensor:
        ops, rows, di, nh, hd = self.ops, len(x), self.d_inner, self.n_heads, self.head_dim
        zxbcdt = ops.matmul(L.w_in, x, cancel)
        z = ops.columns(zxbcdt, 0, di)
        xbc = ops.columns(zxbcdt, di, self.channels)
        dt = ops.columns(zxbcdt, di + self.channels, nh)
        y = None
        for seg, span in zip(segments, spans):
            if span.stop == span.start:
                continue
            inputs = (ops.rows(xbc, span.start, span.stop), ops.rows(dt, span.start, span.stop))
            if seg.inputs is not None:  # kept for replays (not written to again; read back with the logits)
                seg.inputs[il] = inputs
            out = self._scan(L, *inputs, *states.layer(seg.memory, il))
            if span.stop - span.start == rows:
                y = out
            else:
                if y is None:
                    y = ops.empty((rows, nh, hd))
                ops.put_rows(y, span.start, out)
        # y * silu(z), normalised per group, times the per-channel weight (one pass on a device)
        normed = ops.gated_rms_norm_groups(
            y.reshape(rows, di), z, L.ssm_norm, di // self.n_groups, self.eps, (L.w_out,)
        )
        return ops.matmul(L.w_out, normed, cancel)

    def _scan(
        self,
        L: _Layer,
        xbc: Tensor,
        dt: Tensor,
        conv_state: Tensor,
        ssm_state: Tensor,
        new_conv: Tensor,
        new_ssm: Tensor,
    ) -> Tensor:
        """A mixer's recurrent part for one sequence's rows (conv + bias + SiLU, selective scan):
        rows x heads x head_dim outputs; the new states go to new_conv/new_ssm."""
        ops, di, gn = self.ops, self.d_inner, self.n_groups * self.d_state
        u = ops.conv1d(xbc, L.conv, conv_state, new_conv, bias=L.conv_bias, silu=True)
        xs = ops.columns(u, 0, di)
        b = ops.columns(u, di, gn)
        c = ops.columns(u, di + gn, gn)
        return ops.mamba2_scan(xs, dt, L.a, b, c, L.d, L.dt_bias, ssm_state, new_ssm, self.n_heads, self.n_groups)

    def _replay_recurrent(self, il: int, inputs: tuple[Tensor, ...], state: tuple[Tensor, ...]) -> None:
        self._scan(self.layers[il], *inputs, *state)

    def _forward(self, segments: list[Segment], cancel: hk.CancelFlag | None) -> list[np.ndarray | None]:
        ops = self.ops
        tokens, _, spans = segment_rows(segments)
        states = WorkingStates(ops)
        h = ops.embed(self.token_embd, ops.ids(tokens, "tokens"))
        x = first_input_norm(ops, h, self.layers, self.eps)
        for il, layer in enumerate(self.layers):
            check_cancel(cancel)
            y = self._mixer(layer, il, x, segments, spans, states, cancel)
            x = add_and_norm(ops, h, y, next_input_norm(self.layers, il), self.eps)
        states.commit()
        advance(segments)
        return output_logits(ops, h, segments, spans, self.output_norm, self.output, self.eps)
