"""The Qwen hybrid stack shared by `qwen35`, `qwen35moe` and `qwen3next` (model-reference.md §5):
Gated DeltaNet layers (recurrent) with a gated full-attention layer every
`full_attention_interval` layers (or where `attention.recurrent_layers` says), each followed by
an FFN. Subclasses choose how a block's FFN and delta-net input projections are stored.

Recurrent states are updated on working copies and committed only when the whole forward call
succeeded, so a cancel or an error mid-call leaves every memory exactly as it was (I1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import hyserve_kernels as hk
import numpy as np

from hyserve.model.architectures.base import Architecture, Segment, check_cancel, segment_rows
from hyserve.model.architectures.common import WorkingStates, advance, attend, output_logits
from hyserve.model.architectures.ffn import Ffn
from hyserve.model.gguf_file import GGUFError, GGUFFile
from hyserve.model.hparams import HParams
from hyserve.model.memory import KVCache, RecurrentState, SequenceMemory
from hyserve.model.weights import WeightLoader


@dataclass
class GatedAttention:
    wq: hk.QMatrix  # query and output gate interleaved per head: [q_h | gate_h]
    wk: hk.QMatrix
    wv: hk.QMatrix
    q_norm: np.ndarray
    k_norm: np.ndarray
    wo: hk.QMatrix


class Projections(Protocol):
    def __call__(self, x: np.ndarray, cancel: hk.CancelFlag | None) -> Sequence[np.ndarray]:
        """mixed (conv input), z, b (pre-sigmoid β), a (pre-softplus α), each rows x width."""
        ...


@dataclass
class SplitProjections:
    """Delta-net inputs as separate matrices (qwen35, qwen35moe; current qwen3next without β/α)."""

    w_qkv: hk.QMatrix
    w_gate: hk.QMatrix  # z
    w_beta: hk.QMatrix
    w_alpha: hk.QMatrix

    def __call__(self, x: np.ndarray, cancel: hk.CancelFlag | None) -> Sequence[np.ndarray]:
        return hk.matmul_many([self.w_qkv, self.w_gate, self.w_beta, self.w_alpha], x, cancel)


@dataclass
class DeltaNet:
    project: Projections
    conv: np.ndarray  # [channels, kernel]
    dt_bias: np.ndarray
    a: np.ndarray  # already -exp(A_log)
    norm: np.ndarray  # [dv]
    w_out: hk.QMatrix


@dataclass
class HybridLayer:
    attn_norm: np.ndarray
    mixer: GatedAttention | DeltaNet
    ffn_norm: np.ndarray  # GGUF `post_attention_norm`: the pre-FFN norm
    ffn: Ffn


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


def sigmoid(x: np.ndarray) -> np.ndarray:
    """`1 / (1 + exp(-x))` in f32, in one new array (the same operations as the plain expression)."""
    y = np.negative(x, dtype=np.float32)
    np.exp(y, out=y)
    y += 1.0
    return np.divide(1.0, y, out=y)


def softplus(x: np.ndarray) -> np.ndarray:
    """`x > 20 ? x : log1p(exp(x))` for an f32 array, in one new array (the same operations as `np.where`)."""
    y = np.minimum(x, 20.0)
    np.exp(y, out=y)
    np.log1p(y, out=y)
    np.copyto(y, x, where=x > 20.0)
    return y


class QwenHybrid(Architecture):
    # Value head j uses key head j % nk ("tiled", qwen35 GGUFs) or j // (nv/nk) ("grouped", qwen3next).
    grouped_heads = False
    imrope = True  # qwen35*: IMROPE with rope.dimension_sections; qwen3next: plain NEOX

    def __init__(self, gguf: GGUFFile) -> None:
        hp = HParams(gguf)
        w = WeightLoader(gguf)
        self.hp = hp
        self.n_embd = hp.int("embedding_length")
        n_all = hp.int("block_count")
        self.n_layer = n_all - hp.int("nextn_predict_layers", 0)
        self.n_head = hp.int("attention.head_count")
        self.n_kv = hp.int("attention.head_count_kv", self.n_head)
        self.head_dim = hp.int("attention.key_length", 256)
        self.n_rot = hp.int("rope.dimension_count", self.head_dim // 4)
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
            conv=np.ascontiguousarray(w.vector(p + "ssm_conv1d.weight").reshape(self.channels, self.kernel)),
            dt_bias=w.vector(p + "ssm_dt.bias", self.nv),
            a=w.vector(p + "ssm_a", self.nv),
            norm=w.vector(p + "ssm_norm.weight", self.dv),
            w_out=w.matrix(p + "ssm_out.weight"),
        )

    def _load_ffn(self, w: WeightLoader, p: str) -> Ffn:
        raise NotImplementedError

    # ---- forward ----------------------------------------------------------------------------------

    def new_memory(self, n_ctx: int) -> SequenceMemory:
        kv, rec = {}, {}
        for il, layer in enumerate(self.layers):
            if isinstance(layer.mixer, GatedAttention):
                kv[il] = KVCache(n_ctx, self.n_kv, self.head_dim)
            else:
                # delta state per v head: [dv, dk] (key index contiguous, llama.cpp's layout)
                rec[il] = RecurrentState((self.kernel - 1, self.channels), (self.nv, self.dv, self.dk))
        return SequenceMemory(n_ctx, kv, rec)

    def _attention(self, L: GatedAttention, x: np.ndarray, il: int, segments, spans, pos, cancel) -> np.ndarray:
        # RoPE: IMROPE for qwen35*, NEOX for qwen3next; with text positions (p, p, p, 0) the two agree.
        rows, hd = len(x), self.head_dim
        qg, k, v = hk.matmul_many([L.wq, L.wk, L.wv], x, cancel)
        qg = qg.reshape(rows, self.n_head, 2 * hd)
        q = hk.rms_norm(np.ascontiguousarray(qg[:, :, :hd]).reshape(-1, hd), L.q_norm, self.eps).reshape(rows, -1)
        gate = qg[:, :, hd:].reshape(rows, -1)
        k = hk.rms_norm(k.reshape(-1, hd), L.k_norm, self.eps).reshape(rows, -1)
        self._rope(q, self.n_head, pos)
        self._rope(k, self.n_kv, pos)
        a = attend(
            self.ops,
            segments,
            spans,
            il,
            q.reshape(rows, self.n_head, hd),
            k.reshape(rows, self.n_kv, hd),
            v.reshape(rows, self.n_kv, hd),
            pos,
            kq_scale=1.0 / math.sqrt(hd),
        )
        a *= sigmoid(gate)
        return hk.matmul(L.wo, a, cancel)

    def _rope(self, x: np.ndarray, n_head: int, pos: np.ndarray) -> None:
        """NEOX RoPE in place over the first n_rot dims of each head, except IMROPE's still pairs."""
        if len(self.still_pairs) == 0:
            hk.rope(x, n_head, pos, self.n_rot, self.rope_base, 1.0, True)
            return
        heads = x.reshape(len(x), n_head, self.head_dim)
        dims = np.concatenate([self.still_pairs, self.still_pairs + self.n_rot // 2])
        kept = heads[:, :, dims].copy()
        hk.rope(x, n_head, pos, self.n_rot, self.rope_base, 1.0, True)
        heads[:, :, dims] = kept

    def _delta_net(self, L: DeltaNet, x: np.ndarray, il: int, segments, spans, states, cancel) -> np.ndarray:
        rows, nv, dv = len(x), self.nv, self.dv
        mixed, z, b, a = L.project(x, cancel)
        beta = sigmoid(b)
        g = softplus(np.add(a, L.dt_bias, dtype=np.float32))
        g *= L.a
        o = np.empty((rows, nv, dv), dtype=np.float32)
        for seg, span in zip(segments, spans):
            if span.stop == span.start:
                continue
            inputs = tuple(np.ascontiguousarray(m[span]) for m in (mixed, g, beta))
            if seg.inputs is not None:  # kept for replays (the arrays are not written to again)
                seg.inputs[il] = inputs
            out = self._scan(L, *inputs, *states.layer(seg.memory, il))
            t = span.stop - span.start
            if t == rows:
                o = out
            else:
                o[span] = out
        y = hk.rms_norm(o.reshape(-1, dv), L.norm, self.eps).reshape(rows, nv * dv)
        y *= hk.silu(np.ascontiguousarray(z).reshape(-1)).reshape(z.shape)
        return hk.matmul(L.w_out, y, cancel)

    def _scan(
        self,
        L: DeltaNet,
        mixed: np.ndarray,
        g: np.ndarray,
        beta: np.ndarray,
        conv_state: np.ndarray,
        ssm_state: np.ndarray,
        new_conv: np.ndarray,
        new_ssm: np.ndarray,
    ) -> np.ndarray:
        """A delta-net layer's recurrent part for one sequence's rows (conv, L2 norms, delta rule):
        rows x nv x dv outputs; the new states go to new_conv/new_ssm."""
        nk, nv, dk, dv, t = self.nk, self.nv, self.dk, self.dv, len(mixed)
        # ggml's SiLU: the convolution's own is the same per element when no row has a tail of
        # fewer than 8 channels (which it computes with libm's expf)
        fused = self.channels % 8 == 0
        u = hk.conv1d_causal(mixed, L.conv, conv_state, silu=fused, new_state=new_conv)
        if not fused:
            u = hk.silu(u.reshape(-1)).reshape(u.shape)
        # q and k heads L2-normalised in one call (per row: the same bits as two)
        qk = hk.l2_norm(np.ascontiguousarray(u[:, : 2 * nk * dk]).reshape(-1, dk), self.eps).reshape(t, 2 * nk, dk)
        q, k = np.ascontiguousarray(qk[:, :nk]), np.ascontiguousarray(qk[:, nk:])
        if self.grouped_heads and nv != nk:
            # the kernel pairs v head j with k head j % n_k: repeat each k head for its group
            q, k = np.repeat(q, nv // nk, axis=1), np.repeat(k, nv // nk, axis=1)
        v = np.ascontiguousarray(u[:, 2 * nk * dk :]).reshape(t, nv, dv)
        return hk.gated_delta_rule(q, k, v, g, beta, ssm_state, new_state=new_ssm)

    def _replay_recurrent(self, il: int, inputs: tuple[np.ndarray, ...], state: tuple[np.ndarray, ...]) -> None:
        mixer = self.layers[il].mixer
        if not isinstance(mixer, DeltaNet):
            raise TypeError(f"layer {il} keeps no recurrent inputs to replay")
        self._scan(mixer, *inputs, *state)

    def _forward(self, segments: list[Segment], cancel: hk.CancelFlag | None) -> list[np.ndarray | None]:
        tokens, pos, spans = segment_rows(segments)
        states = WorkingStates()  # committed only after the whole call succeeded
        h = hk.get_rows(self.token_embd, tokens)
        for il, layer in enumerate(self.layers):
            check_cancel(cancel)
            x = hk.rms_norm(h, layer.attn_norm, self.eps)
            if isinstance(layer.mixer, GatedAttention):
                h += self._attention(layer.mixer, x, il, segments, spans, pos, cancel)
            else:
                h += self._delta_net(layer.mixer, x, il, segments, spans, states, cancel)
            h += layer.ffn(hk.rms_norm(h, layer.ffn_norm, self.eps), cancel)
        states.commit()
        advance(segments)
        return output_logits(self.ops, h, segments, spans, self.output_norm, self.output, self.eps)
