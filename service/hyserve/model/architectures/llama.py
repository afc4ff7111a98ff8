"""The plain transformer family as llama.cpp runs it: `llama` (RoPE on adjacent pairs), `qwen2`
(NeoX RoPE, q/k/v biases) and `qwen3` (NeoX RoPE, per-head RMSNorm of q and k). Pre-norm blocks,
SwiGLU FFN, grouped-query attention with the scale applied to the scores (not to Q).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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
    bias_qkv: tuple[Tensor, Tensor, Tensor] | None
    q_norm: Tensor | None
    k_norm: Tensor | None
    wo: Matrix
    ffn_norm: Tensor
    w_gate: Matrix
    w_up: Matrix
    w_down: Matrix

    @property
    def input_norm(self) -> InputNorm:
        return InputNorm(self.attn_norm, (self.wq, self.wk, self.wv))


class Llama(Architecture):
    name = "llama"
    neox_rope: ClassVar[bool] = False
    has_gpu_path = True

    def __init__(self, gguf: GGUFFile, ops: Backend = CPU) -> None:
        hp = HParams(gguf)
        w = WeightLoader(gguf, ops)
        self.ops = ops
        self.name = gguf.architecture
        self.n_embd = hp.int("embedding_length")
        self.n_layer = hp.int("block_count")
        self.n_head = hp.int("attention.head_count")
        self.n_kv = hp.int("attention.head_count_kv", self.n_head)
        self.head_dim = hp.int("attention.key_length", self.n_embd // self.n_head)
        self.n_rot = hp.int("rope.dimension_count", self.head_dim, maximum=self.head_dim)
        self.rope_base = hp.float("rope.freq_base", 10000.0)
        linear = hp.optional("rope.scaling.type") == "linear"
        self.rope_scale = 1.0 / hp.float("rope.scaling.factor", 1.0) if linear else 1.0
        self.eps = hp.float("attention.layer_norm_rms_epsilon", 1e-6)
        self.n_ctx_train = hp.int("context_length")
        self.kq_scale = float(inv_sqrt_f32(self.head_dim))

        self.token_embd = w.matrix("token_embd.weight")
        self.n_vocab = self.token_embd.rows
        self.output = w.matrix("output.weight") if w.has("output.weight") else self.token_embd
        self.output_norm = w.vector("output_norm.weight", self.n_embd)
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_kv * self.head_dim
        self.layers = []
        for il in range(self.n_layer):
            p = f"blk.{il}."
            biased = w.has(p + "attn_q.bias")
            self.layers.append(
                _Layer(
                    attn_norm=w.vector(p + "attn_norm.weight", self.n_embd),
                    wq=w.matrix(p + "attn_q.weight"),
                    wk=w.matrix(p + "attn_k.weight"),
                    wv=w.matrix(p + "attn_v.weight"),
                    bias_qkv=(
                        w.vector(p + "attn_q.bias", q_dim),
                        w.vector(p + "attn_k.bias", kv_dim),
                        w.vector(p + "attn_v.bias", kv_dim),
                    )
                    if biased
                    else None,
                    q_norm=w.optional_vector(p + "attn_q_norm.weight", self.head_dim),
                    k_norm=w.optional_vector(p + "attn_k_norm.weight", self.head_dim),
                    wo=w.matrix(p + "attn_output.weight"),
                    ffn_norm=w.vector(p + "ffn_norm.weight", self.n_embd),
                    w_gate=w.matrix(p + "ffn_gate.weight"),
                    w_up=w.matrix(p + "ffn_up.weight"),
                    w_down=w.matrix(p + "ffn_down.weight"),
                )
            )

    def new_memory(self, n_ctx: int) -> SequenceMemory:
        kv = {il: self.ops.kv_cache(n_ctx, self.n_kv, self.head_dim) for il in range(self.n_layer)}
        return SequenceMemory(n_ctx, kv)

    def _forward(self, segments: list[Segment], cancel: hk.CancelFlag | None) -> list[np.ndarray | None]:
        ops = self.ops
        tokens, positions, spans = segment_rows(segments)
        eps = self.eps
        pos = ops.ids(positions, "positions")
        h = ops.embed(self.token_embd, ops.ids(tokens, "tokens"))
        x = first_input_norm(ops, h, self.layers, eps)
        for il, L in enumerate(self.layers):
            check_cancel(cancel)
            q, k, v = ops.matmul_many([L.wq, L.wk, L.wv], x, cancel)
            if L.bias_qkv is not None:
                q, k, v = (ops.add_row(t, b) for t, b in zip((q, k, v), L.bias_qkv))
            rot_q = Rotary(self.n_head, pos, self.n_rot, self.rope_base, self.rope_scale, self.neox_rope)
            rot_k = rot_q._replace(n_head=self.n_kv)
            if L.q_norm is not None and L.k_norm is not None:  # qwen3: RoPE in the norms' passes
                q, k = ops.rms_norm(q, L.q_norm, eps, rope=rot_q), ops.rms_norm(k, L.k_norm, eps, rope=rot_k)
            else:
                q, k = ops.rope(q, *rot_q), ops.rope(k, *rot_k)
            a = attend(ops, segments, spans, il, q, k, v, pos, kq_scale=self.kq_scale)
            x = ops.add_rms_norm(h, ops.matmul(L.wo, a), L.ffn_norm, eps, feeds=(L.w_gate, L.w_up))
            gate, up = ops.matmul_many([L.w_gate, L.w_up], x, cancel)
            y = ops.matmul(L.w_down, ops.swiglu(gate, up, feeds=(L.w_down,)))
            x = add_and_norm(ops, h, y, next_input_norm(self.layers, il), eps)
        advance(segments)
        return output_logits(ops, h, segments, spans, self.output_norm, self.output, eps)


class Qwen(Llama):
    """`qwen2` and `qwen3`: NeoX RoPE (qwen3's q/k norms and qwen2's biases are read when present)."""

    neox_rope = True
