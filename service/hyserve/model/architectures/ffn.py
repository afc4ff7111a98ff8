"""Feed-forward blocks: the dense SwiGLU FFN and the mixture-of-experts FFN (routed experts plus
a sigmoid-gated shared expert), both callable as `ffn(x, cancel) -> rows x n_embd`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import hyserve_kernels as hk
import numpy as np

from hyserve.model.backend.base import Backend, Matrix, Tensor
from hyserve.model.backend.cpu import CPU
from hyserve.model.gguf_file import GGUFError
from hyserve.model.weights import WeightLoader


class Ffn(Protocol):
    @property
    def inputs(self) -> tuple[Matrix, ...]:
        """The matrices the FFN's input goes into (a norm's `feeds`)."""
        ...

    def __call__(self, x: np.ndarray, cancel: hk.CancelFlag | None = None) -> np.ndarray: ...


@dataclass
class DenseFfn:
    """`W_down · (silu(W_gate · x) ⊙ W_up · x)`."""

    w_gate: Matrix
    w_up: Matrix
    w_down: Matrix
    ops: Backend = CPU

    @property
    def inputs(self) -> tuple[Matrix, ...]:
        return (self.w_gate, self.w_up)

    def __call__(self, x: Tensor, cancel: hk.CancelFlag | None = None) -> Tensor:
        ops = self.ops
        gate, up = ops.matmul_many(self.inputs, x, cancel)
        return ops.matmul(self.w_down, ops.swiglu(gate, up, feeds=(self.w_down,)), cancel)


def load_dense(w: WeightLoader, prefix: str) -> DenseFfn:
    return DenseFfn(
        w.matrix(prefix + "ffn_gate.weight"),
        w.matrix(prefix + "ffn_up.weight"),
        w.matrix(prefix + "ffn_down.weight"),
        w.backend,
    )


@dataclass
class MoeBlock:
    """A MoE FFN on the loader's device: the backend's `moe_ffn` (the CPU: `hk.MoeFfn` itself)."""

    backend: Backend
    moe: Any
    # the experts quantize their own inputs (the backend's moe_ffn): nothing for a norm to do
    inputs: tuple[Matrix, ...] = ()

    def __call__(self, x: Tensor, cancel: hk.CancelFlag | None = None) -> Tensor:
        return self.backend.moe_ffn(self.moe, x, cancel)


def load_moe(w: WeightLoader, prefix: str, n_expert: int, n_used: int) -> MoeBlock:
    """The MoE FFN of one block (`ffn_gate_inp`, `ffn_{gate,up,down}_exps` or a fused
    `ffn_gate_up_exps`, optional `ffn_{gate,up,down}_shexp` + `ffn_gate_inp_shexp`).

    Routing is llama.cpp's for qwen2moe/qwen3moe/qwen35moe/qwen3next: softmax, top `n_used`, the
    selected probabilities always renormalised and never scaled (llama.cpp hard-codes this for
    these architectures, whatever `expert_weights_norm` / `expert_weights_scale` say).
    """
    router = w.host_matrix(prefix + "ffn_gate_inp.weight")
    if router.rows != n_expert:
        raise GGUFError(f"{w.gguf.path}: {prefix}ffn_gate_inp routes to {router.rows} experts, expected {n_expert}")
    if w.has(prefix + "ffn_gate_up_exps.weight"):
        gate, up = w.experts(prefix + "ffn_gate_up_exps.weight", n_expert), None
    else:
        gate = w.experts(prefix + "ffn_gate_exps.weight", n_expert)
        up = w.experts(prefix + "ffn_up_exps.weight", n_expert)
    down = w.experts(prefix + "ffn_down_exps.weight", n_expert)
    shared: dict[str, hk.QMatrix] = {}
    if w.has(prefix + "ffn_up_shexp.weight"):
        shared = {f"shared_{p}": w.host_matrix(prefix + f"ffn_{p}_shexp.weight") for p in ("gate", "up", "down")}
        if w.has(prefix + "ffn_gate_inp_shexp.weight"):
            shared["shared_gate_inp"] = w.host_matrix(prefix + "ffn_gate_inp_shexp.weight")
    try:
        return MoeBlock(w.backend, w.backend.moe(hk.MoeFfn(router, gate, up, down, n_used, True, 0.0, **shared)))
    except ValueError as exc:
        raise GGUFError(f"{w.gguf.path}: block {prefix!r}: {exc}") from None
