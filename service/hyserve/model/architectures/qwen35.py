"""Qwen3.5 dense hybrid (`qwen35`) as llama.cpp runs it: Gated DeltaNet layers (recurrent) with a
gated full-attention layer every `full_attention_interval` layers, each followed by a dense SwiGLU
FFN (model-reference.md §5; the shared stack is in `qwen_hybrid`)."""

from __future__ import annotations

from hyserve.model.architectures.ffn import Ffn, load_dense
from hyserve.model.architectures.qwen_hybrid import QwenHybrid
from hyserve.model.weights import WeightLoader


class Qwen35(QwenHybrid):
    name = "qwen35"

    has_gpu_path = True

    def _load_ffn(self, w: WeightLoader, p: str) -> Ffn:
        return load_dense(w, p)
