"""The Qwen hybrid stack shared by `qwen35`, `qwen35moe` and `qwen3next` (model-reference.md §5):
Gated DeltaNet layers (recurrent) with a gated full-attention layer every
`full_attention_interval` layers (or where `attention.recurrent_layers` says), each followed by
an FFN. Subclasses choose how a block's FFN and delta-net input projections are stored.

Recurrent states are updated on working copies and committed only when the whole forward call
succeeded, so a cancel or an error mid-call leaves every memory exactly as it was (I1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import hyserve_kernels as hk
import numpy as np

from hyserve.model.architectures.base import Architecture, Segment, check_cancel, segment_rows
from hyserve.model.architectures.common import (
    InputNorm,
    WorkingStates,
    add_and_norm,
    advance,
    attend,
    first_input_norm,
    inv_sqrt_f32,
    next_input_norm,
    output_logits,
)
from hyserve.model.architectures.ffn import Ffn
from hyserve.model.backend import CPU, Backend
from hyserve.model.backend.base import Matrix, Tensor
from hyserve.model.backend.rotary import Rotary
from hyserve.model.gguf_file import GGUFError, GGUFFile
from hyserve.model.hparams import HParams
from hyserve.model.memory import SequenceMemory
from hyserve.model.weights import WeightLoader

__all__ = ["QwenHybrid", "imrope_still_pairs"]


@dataclass
class GatedAttention:
    wq: Matrix  # query and output gate interleaved per head: [q_h | gate_h]
    wk: Matrix
    wv: Matrix
    q_norm: Tensor
    k_norm: Tensor
    wo: Matrix

    @property
    def inputs(self) -> tuple[Matrix, ...]:
        return (self.wq, self.wk, self.wv)


class Projections(Protocol):
    @property
    def inputs(self) -> tuple[Matrix, ...]:
        """The matrices the layer's input goes into."""
        ...

    def __call__(self, ops: Backend, x: Tensor, cancel: hk.CancelFlag | None) -> Sequence[Tensor]:
        """mixed (conv input), z, b (pre-sigmoid β), a (pre-softplus α), each rows x width."""
        ...


@dataclass
class SplitProjections:
    """Delta-net inputs as separate matrices (qwen35, qwen35moe; current qwen3next without β/α)."""

    w_qkv: Matrix
    w_gate: Matrix  # z
    w_beta: Matrix
    w_alpha: Matrix

    @property
    def inputs(self) -> tuple[Matrix, ...]:
        return (self.w_qkv, self.w_gate, self.w_beta, self.w_alpha)

    def __call__(self, ops: Backend, x: Tensor, cancel: hk.CancelFlag | None) -> Sequence[Tensor]:
        return ops.matmul_many(self.inputs, x, cancel)


@dataclass
class DeltaNet:
    project: Projections
    conv: Tensor  # [channels, kernel]
    dt_bias: Tensor
    a: Tensor  # already -exp(A_log)
    norm: Tensor  # [dv]
    w_out: Matrix

    @property
    def inputs(self) -> tuple[Matrix, ...]:
        return self.project.inputs


@dataclass
class HybridLayer:
    attn_norm: Tensor
    mixer: GatedAttention | DeltaNet
    ffn_norm: Tensor  # GGUF `post_attention_norm`: the pre-FFN norm
    ffn: Ffn

    @property
    def input_norm(self) -> InputNorm:
        return InputNorm(self.attn_norm, self.mixer.inputs)


def imrope_still_pairs(sections: Sequence[int] | None, n_rot: int) -> np.ndarray:
    """Rotary pairs that IMROPE does not rotate for text. llama.cpp gives pair s (sector
    s % sum(sections)) to axis sector % 3 while sector < 3 * that axis' section, else to the 4th
    axis, whose position is 0 for text. Published Qwen3.5 sections cover every pair, and then
    IMROPE for text is plain NEOX RoPE."""
    if sections is None:
        return np.empty(0, dtype=np.int64)
    sec = [int(v) for v in list(sections)[:4]]
    total = sum(sec)
    still = [i for i in range(n_rot // 2) if total == 0 or not (i % total) < 3 * sec[(i % total) % 3]]
    return np.asarray(still, dtype=np.int64)


class QwenHybrid(Architecture):
    # Value head j uses key head j % nk ("tiled", qwen35 GGUFs) or j // (nv/nk) ("grouped", qwen3next).
    grouped_heads = False
    imrope = True  # qwen35*: IMROPE with rope.dimension_sections; qwen3next: plain NEOX

    def __init__(self, gguf: GGUFFile, ops: Backend = CPU) -> None:
        hp = HParams(gguf)
        w = WeightLoader(gguf, ops)
        self.ops = ops
        self.hp = hp
        self.n_embd = hp.int("embedding_length")
        n_all = hp.int("block_count")
        self.n_layer = n_all - hp.int("nextn_predict_layers", 0, minimum=0)
        self.n_head = hp.int("attention.head_count")
        self.n_kv = hp.int("attention.head_count_kv", self.n_head)
        self.head_dim = hp.int("attention.key_length", 256)
        self.n_rot = hp.int("rope.dimension_count", self.head_dim // 4, maximum=self.head_dim)
        self.rope_base = hp.float("rope.freq_base", 1e7)
        self.eps = hp.float("attention.layer_norm_rms_epsilon", 1e-6)
        self.n_ctx_train = hp.int("context_length")
        self.kernel = hp.int("ssm.conv_kernel")
        self.dk = hp.int("ssm.state_size")
        self.nk = hp.int("ssm.group_count")
        self.nv = hp.int("ssm.time_step_rank")
        self.dv = hp.int("ssm.inner_size") // self.nv
        if self.dk != self.dv or self.nv % self.nk:
            raise GGUFError(
                f"{gguf.path}: unsupported delta-net shape dk={self.dk} dv={self.dv} nk={self.nk} nv={self.nv}"
            )
        self.channels = 2 * self.nk * self.dk + self.nv * self.dv
        sections = hp.optional("rope.dimension_sections") if self.imrope else None
        self.still_pairs = imrope_still_pairs(sections, self.n_rot)
        recurrent = self._recurrent_layers(hp)

        self.token_embd = w.matrix("token_embd.weight")
        self.n_vocab = self.token_embd.rows
        self.output = w.matrix("output.weight") if w.has("output.weight") else self.token_embd
        self.output_norm = w.vector("output_norm.weight", self.n_embd)
        self.layers: list[HybridLayer] = []
        for il in range(self.n_layer):
            p = f"blk.{il}."
            mixer = self._load_delta_net(w, p) if recurrent[il] else self._load_attention(w, p)
            self.layers.append(
                HybridLayer(
                    attn_norm=w.vector(p + "attn_norm.weight", self.n_embd),
                    mixer=mixer,
                    ffn_norm=w.vector(p + "post_attention_norm.weight", self.n_embd),
                    ffn=self._load_ffn(w, p),
                )
            )

    # ---- loading: subclasses override the parts their GGUFs store differently -------------------

    def _recurrent_layers(self, hp: HParams) -> list[bool]:
        explicit = hp.optional("attention.recurrent_layers")
        if explicit is not None:
            return [bool(v) for v in list(explicit)[: self.n_layer]]
        interval = hp.int("full_attention_interval", 4)
        return [(il + 1) % interval != 0 for il in range(self.n_layer)]

    def _load_attention(self, w: WeightLoader, p: str) -> GatedAttention:
        return GatedAttention(
            wq=w.matrix(p + "attn_q.weight"),
            wk=w.matrix(p + "attn_k.weight"),
            wv=w.matrix(p + "attn_v.weight"),
            q_norm=w.vector(p + "attn_q_norm.weight", self.head_dim),
            k_norm=w.vector(p + "attn_k_norm.weight", self.head_dim),
            wo=w.matrix(p + "attn_output.weight"),
        )

    def _load_projections(self, w: WeightLoader, p: str) -> Projections:
        return SplitProjections(
            w_qkv=w.matrix(p + "attn_qkv.weight"),
            w_gate=w.matrix(p + "attn_gate.weight"),
            w_beta=w.matrix(p + "ssm_beta.weight"),
            w_alpha=w.matrix(p + "ssm_alpha.weight"),
        )

    def _load_delta_net(self, w: WeightLoader, p: str) -> DeltaNet:
        return DeltaNet(
            project=self._load_projections(w, p),
            conv=w.backend.vector(w.host_vector(p + "ssm_conv1d.weight").reshape(self.channels, self.kernel)),
            dt_bias=w.vector(p + "ssm_dt.bias", self.nv),
            a=w.vector(p + "ssm_a", self.nv),
            norm=w.vector(p + "ssm_norm.weight", self.dv),
            w_out=w.matrix(p + "ssm_out.weight"),
        )

    def _load_ffn(self, w: WeightLoader, p: str) -> Ffn:
        raise NotImplementedError

    # ---- forward ----------------------------------------------------------------------------------

    def new_memory(self, n_ctx: int) -> SequenceMemory:
        ops = self.ops
        kv, rec = {}, {}
        for il, layer in enumerate(self.layers):
            if isinstance(layer.mixer, GatedAttention):
                kv[il] = ops.kv_cache(n_ctx, self.n_kv, self.head_dim)
            else:
                # delta state per v head: [dv, dk] (key index contiguous, llama.cpp's layout)
                rec[il] = ops.recurrent_state((self.kernel - 1, self.channels), (self.nv, self.dv, self.dk))
        return SequenceMemory(n_ctx, kv, rec)

    def _attention(self, L: GatedAttention, x: Tensor, il: int, segments, spans, pos, cancel) -> Tensor:
        # RoPE: IMROPE for qwen35*, NEOX for qwen3next; with text positions (p, p, p, 0) the two agree.
        ops, rows, hd = self.ops, len(x), self.head_dim
        qg, k, v = ops.matmul_many([L.wq, L.wk, L.wv], x, cancel)
        heads = qg.reshape(rows * self.n_head, 2 * hd)
        if len(self.still_pairs) == 0:  # plain NEOX RoPE, turned in the norms' passes
            rot_q = Rotary(self.n_head, pos, self.n_rot, self.rope_base, 1.0, True)
            q = ops.rms_norm_columns(heads, L.q_norm, self.eps, hd, rope=rot_q)  # q_h of [q_h | gate_h]
            k = ops.rms_norm(k, L.k_norm, self.eps, rope=rot_q._replace(n_head=self.n_kv))
        else:
            q = self._rope(ops.rms_norm_columns(heads, L.q_norm, self.eps, hd).reshape(rows, -1), self.n_head, pos)
            k = self._rope(ops.rms_norm(k, L.k_norm, self.eps), self.n_kv, pos)
        q = q.reshape(rows, -1)
        a = attend(ops, segments, spans, il, q, k, v, pos, kq_scale=float(inv_sqrt_f32(hd)))
        ops.sigmoid_mul_columns_(a.reshape(rows * self.n_head, hd), heads, hd)  # gate_h of [q_h | gate_h]
        return ops.matmul(L.wo, a, cancel)

    def _rope(self, x: Tensor, n_head: int, pos: Tensor) -> Tensor:
        """NEOX RoPE over the first n_rot dims of each head, except IMROPE's still pairs."""
        return self.ops.rope_keeping(x, n_head, pos, self.n_rot, self.rope_base, self.still_pairs)

    def _delta_net(self, L: DeltaNet, x: Tensor, il: int, segments, spans, states, cancel) -> Tensor:
        ops, rows, nv, dv = self.ops, len(x), self.nv, self.dv
        mixed, z, b, a = L.project(ops, x, cancel)
        g, beta = ops.gdn_gates(b, a, L.dt_bias, L.a)
        o = None
        for seg, span in zip(segments, spans):
            if span.stop == span.start:
                continue
            inputs = tuple(ops.rows(m, span.start, span.stop) for m in (mixed, g, beta))
            if seg.inputs is not None:  # kept for replays (not written to again; read back with the logits)
                seg.inputs[il] = inputs
            out = self._scan(L, *inputs, *states.layer(seg.memory, il))
            if span.stop - span.start == rows:
                o = out
            else:
                if o is None:
                    o = ops.empty((rows, nv, dv))
                ops.put_rows(o, span.start, out)
        y = ops.rms_norm(o, L.norm, self.eps, gate=z).reshape(rows, nv * dv)  # y = norm(o) * silu(z)
        return ops.matmul(L.w_out, y, cancel)

    def _scan(
        self,
        L: DeltaNet,
        mixed: Tensor,
        g: Tensor,
        beta: Tensor,
        conv_state: Tensor,
        ssm_state: Tensor,
        new_conv: Tensor,
        new_ssm: Tensor,
    ) -> Tensor:
        """A delta-net layer's recurrent part for one sequence's rows (conv, L2 norms, delta rule):
        rows x nv x dv outputs; the new states go to new_conv/new_ssm."""
        ops, nk, nv = self.ops, self.nk, self.nv
        # ggml's SiLU: the convolution's own is the same per element when no row has a tail of
        # fewer than 8 channels (which it computes with libm's expf)
        fused = self.channels % 8 == 0
        u = ops.conv1d(mixed, L.conv, conv_state, new_conv, silu=fused)
        if not fused:
            u = ops.silu(u)
        # q and k are L2-normalised inside the rule as llama.cpp's graph does it
        # (`rms_norm(x, eps / dk) / sqrt(dk)`, not ggml_l2_norm: the two differ in the last bits);
        # u holds q, k and v side by side (nk*dk, nk*dk and nv*dv columns)
        return ops.gated_delta_rule_packed(u, g, beta, ssm_state, new_ssm, nk, nv, self.grouped_heads, l2_eps=self.eps)

    def _replay_recurrent(self, il: int, inputs: tuple[Tensor, ...], state: tuple[Tensor, ...]) -> None:
        mixer = self.layers[il].mixer
        if not isinstance(mixer, DeltaNet):
            raise TypeError(f"layer {il} keeps no recurrent inputs to replay")
        self._scan(mixer, *inputs, *state)

    def _forward(self, segments: list[Segment], cancel: hk.CancelFlag | None) -> list[np.ndarray | None]:
        ops = self.ops
        tokens, positions, spans = segment_rows(segments)
        states = WorkingStates(ops)  # committed only after the whole call succeeded
        pos = ops.ids(positions, "positions")
        h = ops.embed(self.token_embd, ops.ids(tokens, "tokens"))
        x = first_input_norm(ops, h, self.layers, self.eps)
        for il, layer in enumerate(self.layers):
            check_cancel(cancel)
            if isinstance(layer.mixer, GatedAttention):
                y = self._attention(layer.mixer, x, il, segments, spans, pos, cancel)
            else:
                y = self._delta_net(layer.mixer, x, il, segments, spans, states, cancel)
            x = ops.add_rms_norm(h, y, layer.ffn_norm, self.eps, feeds=layer.ffn.inputs)
            x = add_and_norm(ops, h, layer.ffn(x, cancel), next_input_norm(self.layers, il), self.eps)
        states.commit()
        advance(segments)
        return output_logits(ops, h, segments, spans, self.output_norm, self.output, self.eps)
