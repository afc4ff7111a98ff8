"""Gemma 3 (`gemma3`) as llama.cpp runs it: sliding-window layers, QK-norm, sandwich norms, GEGLU.

Norm weights in GGUF already include Gemma's "+1"; the embedding is scaled by sqrtf(n_embd);
Q is pre-scaled by 1/sqrt(head_dim); layer il is sliding-window unless il % pattern == pattern-1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import hyserve_kernels as hk
import numpy as np

from hyserve.model.architectures.base import (
    Architecture,
    Segment,
    check_cancel,
    segment_rows,
)
from hyserve.model.architectures.common import advance, attend, output_logits
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.hparams import HParams
from hyserve.model.memory import KVCache, SequenceMemory
from hyserve.model.weights import WeightLoader


@dataclass
class _Layer:
    attn_norm: np.ndarray
    wq: hk.QMatrix
    wk: hk.QMatrix
    wv: hk.QMatrix
    q_norm: np.ndarray
    k_norm: np.ndarray
    wo: hk.QMatrix
    post_attn_norm: np.ndarray
    ffn_norm: np.ndarray
    w_gate: hk.QMatrix
    w_up: hk.QMatrix
    w_down: hk.QMatrix
    post_ffn_norm: np.ndarray
    window: int  # 0 for global layers
    rope_base: float
    rope_scale: float


class Gemma3(Architecture):
    name = "gemma3"

    def __init__(self, gguf: GGUFFile) -> None:
        hp = HParams(gguf)
        w = WeightLoader(gguf)
        self.n_embd = hp.int("embedding_length")
        self.n_layer = hp.int("block_count")
        self.n_head = hp.int("attention.head_count")
        self.n_kv = hp.int("attention.head_count_kv", self.n_head)
        self.head_dim = hp.int("attention.key_length", 256)
        self.eps = hp.float("attention.layer_norm_rms_epsilon", 1e-6)
        self.n_ctx_train = hp.int("context_length")
        self.softcap = float(hp.optional("final_logit_softcapping") or 0.0)
        window = hp.int("attention.sliding_window", 0)
        pattern = hp.int("attention.sliding_window_pattern", 6)
        base = hp.float("rope.freq_base", 1e6)
        base_swa = hp.float("rope.freq_base_swa", 10000.0)
        scale = 1.0 / hp.float("rope.scaling.factor", 1.0) if hp.optional("rope.scaling.type") == "linear" else 1.0
        # llama.cpp ignores query_pre_attn_scalar; the 62-layer (27B) model uses n_embd/n_head.
        q_dim = self.n_embd / self.n_head if self.n_layer == 62 else self.head_dim
        self.q_scale = np.float32(1.0 / math.sqrt(q_dim))
        self.embd_scale = np.float32(math.sqrt(self.n_embd))

        self.token_embd = w.matrix("token_embd.weight")
        self.n_vocab = self.token_embd.rows
        self.output = w.matrix("output.weight") if w.has("output.weight") else self.token_embd
        self.output_norm = w.vector("output_norm.weight", self.n_embd)
        self.layers = []
        for il in range(self.n_layer):
            sliding = window > 0 and il % pattern < pattern - 1
            p = f"blk.{il}."
            self.layers.append(
                _Layer(
                    attn_norm=w.vector(p + "attn_norm.weight", self.n_embd),
                    wq=w.matrix(p + "attn_q.weight"),
                    wk=w.matrix(p + "attn_k.weight"),
                    wv=w.matrix(p + "attn_v.weight"),
                    q_norm=w.vector(p + "attn_q_norm.weight", self.head_dim),
                    k_norm=w.vector(p + "attn_k_norm.weight", self.head_dim),
                    wo=w.matrix(p + "attn_output.weight"),
                    post_attn_norm=w.vector(p + "post_attention_norm.weight", self.n_embd),
                    ffn_norm=w.vector(p + "ffn_norm.weight", self.n_embd),
                    w_gate=w.matrix(p + "ffn_gate.weight"),
                    w_up=w.matrix(p + "ffn_up.weight"),
                    w_down=w.matrix(p + "ffn_down.weight"),
                    post_ffn_norm=w.vector(p + "post_ffw_norm.weight", self.n_embd),
                    window=window if sliding else 0,
                    rope_base=base_swa if sliding else base,
                    rope_scale=1.0 if sliding else scale,
                )
            )

    def sliding_windows(self) -> dict[int, int]:
        return {il: L.window for il, L in enumerate(self.layers) if L.window > 0}

    def new_memory(self, n_ctx: int) -> SequenceMemory:
        return SequenceMemory(n_ctx, {il: KVCache(n_ctx, self.n_kv, self.head_dim) for il in range(self.n_layer)})

    def _forward(self, segments: Sequence[Segment], cancel: hk.CancelFlag | None) -> list[np.ndarray | None]:
        tokens, pos, spans = segment_rows(segments)
        rows, hd, eps = len(tokens), self.head_dim, self.eps
        h = hk.get_rows(self.token_embd, tokens)
        h *= self.embd_scale
        for il, L in enumerate(self.layers):
            check_cancel(cancel)
            x = hk.rms_norm(h, L.attn_norm, eps)
            q, k, v = hk.matmul_many([L.wq, L.wk, L.wv], x, cancel)
            q = hk.rms_norm(q.reshape(-1, hd), L.q_norm, eps).reshape(rows, -1)
            k = hk.rms_norm(k.reshape(-1, hd), L.k_norm, eps).reshape(rows, -1)
            hk.rope(q, self.n_head, pos, hd, L.rope_base, L.rope_scale, True)
            hk.rope(k, self.n_kv, pos, hd, L.rope_base, L.rope_scale, True)
            q *= self.q_scale
            a = attend(
                segments,
                spans,
                il,
                q.reshape(rows, self.n_head, hd),
                k.reshape(rows, self.n_kv, hd),
                v.reshape(rows, self.n_kv, hd),
                pos,
                L.window,
            )
            h += hk.rms_norm(hk.matmul(L.wo, a), L.post_attn_norm, eps)
            x = hk.rms_norm(h, L.ffn_norm, eps)
            gate, up = hk.matmul_many([L.w_gate, L.w_up], x, cancel)
            h += hk.rms_norm(hk.matmul(L.w_down, hk.geglu(gate, up)), L.post_ffn_norm, eps)
        advance(segments)
        return output_logits(h, segments, spans, self.output_norm, self.output, eps, self.softcap)
