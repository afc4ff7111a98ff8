"""Qwen3.5 dense hybrid (`qwen35`) as llama.cpp runs it: Gated DeltaNet layers (recurrent) with a
gated full-attention layer every `full_attention_interval` layers (model-reference.md §5).

Recurrent states are updated on working copies and committed only when the whole forward call
succeeded, so a cancel or an error mid-call leaves every memory exactly as it was (I1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import hyserve_kernels as hk
import numpy as np

from hyserve.model.architectures.base import (
    Architecture,
    Segment,
    check_cancel,
    segment_rows,
)
from hyserve.model.architectures.common import advance, attend, commit_states, output_logits, working_states
from hyserve.model.gguf_file import GGUFError, GGUFFile
from hyserve.model.hparams import HParams
from hyserve.model.memory import KVCache, RecurrentState, SequenceMemory
from hyserve.model.weights import WeightLoader


@dataclass
class _Attention:
    wq: hk.QMatrix  # query and output gate interleaved per head: [q_h | gate_h]
    wk: hk.QMatrix
    wv: hk.QMatrix
    q_norm: np.ndarray
    k_norm: np.ndarray
    wo: hk.QMatrix


@dataclass
class _DeltaNet:
    w_qkv: hk.QMatrix
    w_gate: hk.QMatrix  # z
    w_beta: hk.QMatrix
    w_alpha: hk.QMatrix
    conv: np.ndarray  # [channels, kernel]
    dt_bias: np.ndarray
    a: np.ndarray  # already -exp(A_log)
    norm: np.ndarray  # [dv]
    w_out: hk.QMatrix


@dataclass
class _Layer:
    attn_norm: np.ndarray
    mixer: _Attention | _DeltaNet
    ffn_norm: np.ndarray  # GGUF `post_attention_norm`: the pre-FFN norm
    w_gate: hk.QMatrix
    w_up: hk.QMatrix
    w_down: hk.QMatrix


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float32)))).astype(np.float32)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))).astype(np.float32)


class Qwen35(Architecture):
    name = "qwen35"

    def __init__(self, gguf: GGUFFile) -> None:
        hp = HParams(gguf)
        w = WeightLoader(gguf)
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
        interval = hp.int("full_attention_interval", 4)
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

        self.token_embd = w.matrix("token_embd.weight")
        self.n_vocab = self.token_embd.rows
        self.output = w.matrix("output.weight") if w.has("output.weight") else self.token_embd
        self.output_norm = w.vector("output_norm.weight", self.n_embd)
        self.layers: list[_Layer] = []
        for il in range(self.n_layer):
            p = f"blk.{il}."
            mixer: _Attention | _DeltaNet
            if (il + 1) % interval == 0:
                mixer = _Attention(
                    wq=w.matrix(p + "attn_q.weight"),
                    wk=w.matrix(p + "attn_k.weight"),
                    wv=w.matrix(p + "attn_v.weight"),
                    q_norm=w.vector(p + "attn_q_norm.weight", self.head_dim),
                    k_norm=w.vector(p + "attn_k_norm.weight", self.head_dim),
                    wo=w.matrix(p + "attn_output.weight"),
                )
            else:
                mixer = _DeltaNet(
                    w_qkv=w.matrix(p + "attn_qkv.weight"),
                    w_gate=w.matrix(p + "attn_gate.weight"),
                    w_beta=w.matrix(p + "ssm_beta.weight"),
                    w_alpha=w.matrix(p + "ssm_alpha.weight"),
                    conv=np.ascontiguousarray(w.vector(p + "ssm_conv1d.weight").reshape(self.channels, self.kernel)),
                    dt_bias=w.vector(p + "ssm_dt.bias", self.nv),
                    a=w.vector(p + "ssm_a", self.nv),
                    norm=w.vector(p + "ssm_norm.weight", self.dv),
                    w_out=w.matrix(p + "ssm_out.weight"),
                )
            self.layers.append(
                _Layer(
                    attn_norm=w.vector(p + "attn_norm.weight", self.n_embd),
                    mixer=mixer,
                    ffn_norm=w.vector(p + "post_attention_norm.weight", self.n_embd),
                    w_gate=w.matrix(p + "ffn_gate.weight"),
                    w_up=w.matrix(p + "ffn_up.weight"),
                    w_down=w.matrix(p + "ffn_down.weight"),
                )
            )

    def new_memory(self, n_ctx: int) -> SequenceMemory:
        kv, rec = {}, {}
        for il, layer in enumerate(self.layers):
            if isinstance(layer.mixer, _Attention):
                kv[il] = KVCache(n_ctx, self.n_kv, self.head_dim)
            else:
                # delta state per v head: [dv, dk] (key index contiguous, llama.cpp's layout)
                rec[il] = RecurrentState((self.kernel - 1, self.channels), (self.nv, self.dv, self.dk))
        return SequenceMemory(n_ctx, kv, rec)

    def _attention(self, L: _Attention, x: np.ndarray, il: int, segments, spans, pos, cancel) -> np.ndarray:
        rows, hd = len(x), self.head_dim
        qg, k, v = hk.matmul_many([L.wq, L.wk, L.wv], x, cancel)
        qg = qg.reshape(rows, self.n_head, 2 * hd)
        q = hk.rms_norm(np.ascontiguousarray(qg[:, :, :hd]).reshape(-1, hd), L.q_norm, self.eps).reshape(rows, -1)
        gate = qg[:, :, hd:].reshape(rows, -1)
        k = hk.rms_norm(k.reshape(-1, hd), L.k_norm, self.eps).reshape(rows, -1)
        hk.rope(q, self.n_head, pos, self.n_rot, self.rope_base, 1.0, True)
        hk.rope(k, self.n_kv, pos, self.n_rot, self.rope_base, 1.0, True)
        a = attend(
            segments,
            spans,
            il,
            q.reshape(rows, self.n_head, hd),
            k.reshape(rows, self.n_kv, hd),
            v.reshape(rows, self.n_kv, hd),
            pos,
            kq_scale=1.0 / math.sqrt(hd),
        )
        return hk.matmul(L.wo, np.ascontiguousarray(a * _sigmoid(gate)), cancel)

    def _delta_net(self, L: _DeltaNet, x: np.ndarray, il: int, segments, spans, states, cancel) -> np.ndarray:
        rows, nk, nv, dk, dv = len(x), self.nk, self.nv, self.dk, self.dv
        mixed, z, b, a = hk.matmul_many([L.w_qkv, L.w_gate, L.w_beta, L.w_alpha], x, cancel)
        beta = _sigmoid(b)
        g = (L.a * _softplus(a + L.dt_bias)).astype(np.float32)
        o = np.empty((rows, nv, dv), dtype=np.float32)
        for seg, span in zip(segments, spans):
            if span.stop == span.start:
                continue
            conv_state, ssm_state = states[id(seg.memory)][il]
            u = hk.conv1d_causal(np.ascontiguousarray(mixed[span]), L.conv, conv_state)
            u = hk.silu(u.reshape(-1)).reshape(u.shape)  # ggml's SiLU
            t = span.stop - span.start
            q = hk.l2_norm(np.ascontiguousarray(u[:, : nk * dk]).reshape(-1, dk), self.eps).reshape(t, nk, dk)
            k = hk.l2_norm(np.ascontiguousarray(u[:, nk * dk : 2 * nk * dk]).reshape(-1, dk), self.eps).reshape(
                t, nk, dk
            )
            v = np.ascontiguousarray(u[:, 2 * nk * dk :]).reshape(t, nv, dv)
            o[span] = hk.gated_delta_rule(
                q, k, v, np.ascontiguousarray(g[span]), np.ascontiguousarray(beta[span]), ssm_state
            )
        y = hk.rms_norm(o.reshape(-1, dv), L.norm, self.eps).reshape(rows, nv * dv)
        y = y * hk.silu(np.ascontiguousarray(z).reshape(-1)).reshape(z.shape)
        return hk.matmul(L.w_out, np.ascontiguousarray(y, dtype=np.float32), cancel)

    def _forward(self, segments: list[Segment], cancel: hk.CancelFlag | None) -> list[np.ndarray | None]:
        tokens, pos, spans = segment_rows(segments)
        states = working_states(segments)  # committed only after the whole call succeeded
        h = hk.get_rows(self.token_embd, tokens)
        for il, layer in enumerate(self.layers):
            check_cancel(cancel)
            x = hk.rms_norm(h, layer.attn_norm, self.eps)
            if isinstance(layer.mixer, _Attention):
                h = h + self._attention(layer.mixer, x, il, segments, spans, pos, cancel)
            else:
                h = h + self._delta_net(layer.mixer, x, il, segments, spans, states, cancel)
            x = hk.rms_norm(h, layer.ffn_norm, self.eps)
            gate, up = hk.matmul_many([layer.w_gate, layer.w_up], x, cancel)
            h = h + hk.matmul(layer.w_down, hk.swiglu(gate, up), cancel)
        commit_states(segments, states)
        advance(segments)
        return output_logits(h, segments, spans, self.output_norm, self.output, self.eps)
