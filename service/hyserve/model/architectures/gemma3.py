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
from hyserve.model.architectures.common import (
    InputNorm,
    add_and_norm,
    advance,
    attend,
    first_input_norm,
    inv_sqrt_f32,
    next_input_norm,
    output_logits,
)
from hyserve.model.backend import CPU, Backend
from hyserve.model.backend.base import Matrix, Tensor
from hyserve.model.backend.rotary import Rotary
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.hparams import HParams
from hyserve.model.memory import SequenceMemory
from hyserve.model.weights import WeightLoader


@dataclass
class _Layer:
    attn_norm: Tensor
    wq: Matrix
    wk: Matrix
    wv: Matrix
    q_norm: Tensor
    k_norm: Tensor
    wo: Matrix
    post_attn_norm: Tensor
    ffn_norm: Tensor
    w_gate: Matrix
    w_up: Matrix
    w_down: Matrix
    post_ffn_norm: Tensor
    window: int  # 0 for global layers
    rope_base: float
    rope_scale: float

    @property
    def input_norm(self) -> InputNorm:
        return InputNorm(self.attn_norm, (self.wq, self.wk, self.wv))


class Gemma3(Architecture):
    name = "gemma3"

    has_gpu_path = True

    def __init__(self, gguf: GGUFFile, ops: Backend = CPU) -> None:
        hp = HParams(gguf)
        w = WeightLoader(gguf, ops)
        self.ops = ops
        self.n_embd = hp.int("embedding_length")
        self.n_layer = hp.int("block_count")
        self.n_head = hp.int("attention.head_count")
        self.n_kv = hp.int("attention.head_count_kv", self.n_head)
        self.head_dim = hp.int("attention.key_length", 256)
        self.eps = hp.float("attention.layer_norm_rms_epsilon", 1e-6)
        self.n_ctx_train = hp.int("context_length")
        self.softcap = float(hp.optional("final_logit_softcapping") or 0.0)
        window = hp.int("attention.sliding_window", 0, minimum=0)
        pattern = hp.int("attention.sliding_window_pattern", 6)
        base = hp.float("rope.freq_base", 1e6)
        base_swa = hp.float("rope.freq_base_swa", 10000.0)
        scale = 1.0 / hp.float("rope.scaling.factor", 1.0) if hp.optional("rope.scaling.type") == "linear" else 1.0
        # llama.cpp ignores query_pre_attn_scalar; the 62-layer (27B) model uses n_embd/n_head.
        q_dim = self.n_embd // self.n_head if self.n_layer == 62 else self.head_dim
        self.q_scale = inv_sqrt_f32(q_dim)
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
        kv = {il: self.ops.kv_cache(n_ctx, self.n_kv, self.head_dim) for il in range(self.n_layer)}
        return SequenceMemory(n_ctx, kv)

    def _forward(self, segments: Sequence[Segment], cancel: hk.CancelFlag | None) -> list[np.ndarray | None]:
        ops = self.ops
        tokens, positions, spans = segment_rows(segments)
        hd, eps = self.head_dim, self.eps
        pos = ops.ids(positions, "positions")
        h = ops.embed(self.token_embd, ops.ids(tokens, "tokens"))
        ops.scale_(h, self.embd_scale)
        x = first_input_norm(ops, h, self.layers, eps)
        for il, L in enumerate(self.layers):
            check_cancel(cancel)
            q, k, v = ops.matmul_many([L.wq, L.wk, L.wv], x, cancel)
            rot_q = Rotary(self.n_head, pos, hd, L.rope_base, L.rope_scale, True)
            q = ops.rms_norm(q, L.q_norm, eps, rope=rot_q)  # RoPE in the norm's pass
            k = ops.rms_norm(k, L.k_norm, eps, rope=rot_q._replace(n_head=self.n_kv))
            ops.scale_(q, self.q_scale)
            a = attend(ops, segments, spans, il, q, k, v, pos, L.window)
            y = ops.rms_norm(ops.matmul(L.wo, a), L.post_attn_norm, eps)
            x = ops.add_rms_norm(h, y, L.ffn_norm, eps, feeds=(L.w_gate, L.w_up))
            gate, up = ops.matmul_many([L.w_gate, L.w_up], x, cancel)
            y = ops.rms_norm(ops.matmul(L.w_down, ops.geglu(gate, up, feeds=(L.w_down,))), L.post_ffn_norm, eps)
            x = add_and_norm(ops, h, y, next_input_norm(self.layers, il), eps)
        advance(segments)
        return output_logits(ops, h, segments, spans, self.output_norm, self.output, eps, self.softcap)
