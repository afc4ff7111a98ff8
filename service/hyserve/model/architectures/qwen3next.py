"""Qwen3-Next (`qwen3next`): the Qwen hybrid stack with a mixture-of-experts FFN and a
sigmoid-gated shared expert (model-reference.md §5.6). Unlike `qwen35`/`qwen35moe`:

- plain NEOX partial RoPE (the same rotation for text positions);
- V heads in grouped order: value head j uses key head j // (nv/nk);
- β and α come from one fused `ssm_ba`, laid out per key-head group as [β × R | α × R];
- old GGUFs store q, k, v, z in one `ssm_in`, interleaved per key-head group as
  [q (dk) | k (dk) | v (R·dv) | z (R·dv)], instead of `attn_qkv` + `attn_gate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import hyserve_kernels as hk

from hyserve.model.architectures.ffn import Ffn, load_dense, load_moe
from hyserve.model.architectures.qwen_hybrid import Projections, QwenHybrid
from hyserve.model.backend.base import Backend, Matrix, Tensor
from hyserve.model.weights import WeightLoader


def _split_ba(ops: Backend, ba: Tensor, nk: int) -> tuple[Tensor, Tensor]:
    rows, r = len(ba), ba.shape[1] // (2 * nk)
    grouped = ba.reshape(rows * nk, 2 * r)
    return ops.columns(grouped, 0, r).reshape(rows, nk * r), ops.columns(grouped, r, r).reshape(rows, nk * r)


@dataclass
class FusedBetaAlpha:
    w_qkv: Matrix
    w_gate: Matrix  # z
    w_ba: Matrix
    nk: int

    @property
    def inputs(self) -> tuple[Matrix, ...]:
        return (self.w_qkv, self.w_gate, self.w_ba)

    def __call__(self, ops: Backend, x: Tensor, cancel: hk.CancelFlag | None) -> Sequence[Tensor]:
        mixed, z, ba = ops.matmul_many(self.inputs, x, cancel)
        return (mixed, z, *_split_ba(ops, ba, self.nk))


@dataclass
class LegacyQkvz:
    w_in: Matrix  # ssm_in: [q | k | v | z] per key-head group
    w_ba: Matrix
    nk: int
    dk: int
    vz: int  # R·dv, the v (and z) width of one key-head group

    @property
    def inputs(self) -> tuple[Matrix, ...]:
        return (self.w_in, self.w_ba)

    def __call__(self, ops: Backend, x: Tensor, cancel: hk.CancelFlag | None) -> Sequence[Tensor]:
        qkvz, ba = ops.matmul_many(self.inputs, x, cancel)
        rows, dk, vz = len(x), self.dk, self.vz
        g = qkvz.reshape(rows * self.nk, 2 * dk + 2 * vz)
        mixed = ops.concat_columns(
            [
                ops.columns(g, 0, dk).reshape(rows, -1),
                ops.columns(g, dk, dk).reshape(rows, -1),
                ops.columns(g, 2 * dk, vz).reshape(rows, -1),
            ]
        )
        z = ops.columns(g, 2 * dk + vz, vz).reshape(rows, -1)
        return (mixed, z, *_split_ba(ops, ba, self.nk))


class Qwen3Next(QwenHybrid):
    name = "qwen3next"
    has_gpu_path = True
    grouped_heads = True
    imrope = False

    def _load_projections(self, w: WeightLoader, p: str) -> Projections:
        w_ba = w.matrix(p + "ssm_ba.weight")
        if w.has(p + "attn_qkv.weight"):
            return FusedBetaAlpha(w.matrix(p + "attn_qkv.weight"), w.matrix(p + "attn_gate.weight"), w_ba, self.nk)
        vz = self.nv // self.nk * self.dv
        return LegacyQkvz(w.matrix(p + "ssm_in.weight"), w_ba, self.nk, self.dk, vz)

    def _load_ffn(self, w: WeightLoader, p: str) -> Ffn:
        if not w.has(p + "ffn_gate_inp.weight"):
            return load_dense(w, p)  # llama.cpp keeps a dense branch for such blocks
        return load_moe(w, p, self.hp.int("expert_count"), self.hp.int("expert_used_count"))
