"""Qwen3.5 MoE hybrid (`qwen35moe`): the `qwen35` stack (IMROPE, tiled V heads, separate β/α
projections) with a mixture-of-experts FFN plus a sigmoid-gated shared expert in every block
(model-reference.md §5.6)."""

from __future__ import annotations

from hyserve.model.architectures.ffn import Ffn, load_moe
from hyserve.model.architectures.qwen35 import Qwen35
from hyserve.model.weights import WeightLoader


class Qwen35Moe(Qwen35):
    name = "qwen35moe"
    has_gpu_path = True

    def _load_ffn(self, w: WeightLoader, p: str) -> Ffn:
        return load_moe(w, p, self.hp.int("expert_count"), self.hp.int("expert_used_count"))
