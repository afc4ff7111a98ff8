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
from hyserve.model.architectures.common import WorkingStates, advance, output_logits
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.hparams import HParams
from hyserve.model.memory import RecurrentState, SequenceMemory
from hyserve.model.weights import WeightLoader


@dataclass
class _Layer:
    norm: np.ndarray
    w_in: hk.QMatrix
    conv: np.ndarray  # [channels, kernel]
    conv_bias: np.ndarray
    dt_bias: np.ndarray
    a: np.ndarray  # -exp(A_log), per head
    d: np.ndarray
    ssm_norm: np.ndarray  # [d_inner] (G groups of d_inner/G)
    w_out: hk.QMatrix


class Mamba2(Architecture):
    name = "mamba2"

    def __init__(self, gguf: GGUFFile) -> None:
        hp = HParams(gguf)
        w = WeightLoader(gguf)
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
                    conv=np.ascontiguousarray(w.vector(p + "ssm_conv1d.weight").reshape(self.channels, self.kernel)),
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
        return SequenceMemory(n_ctx, {}, {il: RecurrentState(conv, ssm) for il in range(self.n_layer)})

    def _mixer(self, L: _Layer, il: int, x: np.ndarray, segments, spans, states, cancel) -> np.ndarray:
        rows, di, nh, hd = len(x), self.d_inner, self.n_heads, self.head_dim
        zxbcdt = hk.matmul(L.w_in, x, cancel)
        z, xbc, dt = zxbcdt[:, :di], zxbcdt[:, di : di + self.channels], zxbcdt[:, di + self.channels :]
        y = np.empty((rows, nh, hd), dtype=np.float32)
        for seg, span in zip(segments, spans):
            if span.stop == span.start:
                continue
            inputs = (np.ascontiguousarray(xbc[span]), np.ascontiguousarray(dt[span]))
            if seg.inputs is not None:  # kept for replays (the arrays are not written to again)
                seg.inputs[il] = inputs
            y[span] = self._scan(L, *inputs, *states.layer(seg.memory, il))
        gated = y.reshape(rows, di) * hk.silu(np.ascontiguousarray(z).reshape(-1)).reshape(rows, di)
        group = di // self.n_groups
        normed = hk.rms_norm(np.ascontiguousarray(gated).reshape(-1, group), None, self.eps).reshape(rows, di)
        return hk.matmul(L.w_out, np.ascontiguousarray(normed * L.ssm_norm), cancel)

    def _scan(
        self,
        L: _Layer,
        xbc: np.ndarray,
        dt: np.ndarray,
        conv_state: np.ndarray,
        ssm_state: np.ndarray,
        new_conv: np.ndarray,
        new_ssm: np.ndarray,
    ) -> np.ndarray:
        """A mixer's recurrent part for one sequence's rows (conv + bias + SiLU, selective scan):
        rows x heads x head_dim outputs; the new states go to new_conv/new_ssm."""
        t, di, gn = len(xbc), self.d_inner, self.n_groups * self.d_state
        u = hk.conv1d_causal(xbc, L.conv, conv_state, L.conv_bias, silu=True, new_state=new_conv)
        xs = np.ascontiguousarray(u[:, :di]).reshape(t, self.n_heads, self.head_dim)
        b = np.ascontiguousarray(u[:, di : di + gn]).reshape(t, self.n_groups, self.d_state)
        c = np.ascontiguousarray(u[:, di + gn :]).reshape(t, self.n_groups, self.d_state)
        return hk.mamba2_scan(xs, dt, L.a, b, c, ssm_state, L.d, L.dt_bias, new_state=new_ssm)

    def _replay_recurrent(self, il: int, inputs: tuple[np.ndarray, ...], state: tuple[np.ndarray, ...]) -> None:
        self._scan(self.layers[il], *inputs, *state)

    def _forward(self, segments: list[Segment], cancel: hk.CancelFlag | None) -> list[np.ndarray | None]:
        tokens, _, spans = segment_rows(segments)
        states = WorkingStates()
        h = hk.get_rows(self.token_embd, tokens)
        for il, layer in enumerate(self.layers):
            check_cancel(cancel)
            x = hk.rms_norm(h, layer.norm, self.eps)
            h += self._mixer(layer, il, x, segments, spans, states, cancel)
        states.commit()
        advance(segments)
        return output_logits(self.ops, h, segments, spans, self.output_norm, self.output, self.eps)
