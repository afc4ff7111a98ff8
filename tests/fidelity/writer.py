"""An independent GGUF writer for fuzz fixtures: `gguf.GGUFWriter` called directly (not the
project's fixture builder), F32/F16 tensors from a seeded generator, and every other type made by
llama.cpp's own quantizer (`llama_model_quantize`) from the F32 file.

Shapes follow the GGUF conventions llama.cpp loads (numpy order: rows = output features)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from .vocab import Vocab

INDEPENDENT_ARCHES = ("llama", "qwen2", "qwen3", "gemma3", "qwen35")
# llama.cpp file types its quantizer makes from an F32 file
QUANT_FTYPES = {
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K",
}


@dataclass(frozen=True)
class Shape:
    """One fixture's hyperparameters (the hybrid ones are used by qwen35 only)."""

    arch: str
    layers: int
    embd: int
    ff: int
    heads: int
    kv_heads: int
    head_dim: int
    tie: bool = False
    n_rot: int = 0  # qwen35: rotated dims per head
    sections: tuple[int, int, int, int] = (0, 0, 0, 0)  # qwen35 IMROPE sections (sum n_rot / 2)
    interval: int = 4  # qwen35: every interval-th layer is full attention
    d_conv: int = 4
    d_state: int = 16
    n_group: int = 2
    dt_rank: int = 4
    window: int = 0  # gemma3 sliding window
    rope_base: float = 10000.0
    extra: dict[str, float] = field(default_factory=dict)


class _Rng:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def mat(self, rows: int, cols: int, scale: float | None = None) -> np.ndarray:
        s = np.float32(scale if scale is not None else 0.6 / np.sqrt(cols))
        return self.rng.standard_normal((rows, cols), dtype=np.float32) * s

    def norm(self, n: int, center: float = 1.0) -> np.ndarray:
        return (center + 0.15 * self.rng.standard_normal(n)).astype(np.float32)

    def vec(self, n: int, scale: float) -> np.ndarray:
        return (scale * self.rng.standard_normal(n)).astype(np.float32)


def _tensors(s: Shape, vocab: int, r: _Rng) -> dict[str, np.ndarray]:
    """name -> F32 array for every tensor of the architecture."""
    t: dict[str, np.ndarray] = {"token_embd.weight": r.mat(vocab, s.embd, 0.7), "output_norm.weight": r.norm(s.embd)}
    if not s.tie:
        t["output.weight"] = r.mat(vocab, s.embd, 1.2 / np.sqrt(s.embd))
    q_rows = s.heads * s.head_dim
    kv_rows = s.kv_heads * s.head_dim
    for il in range(s.layers):
        p = f"blk.{il}."
        t[p + "attn_norm.weight"] = r.norm(s.embd)
        full = s.arch != "qwen35" or (il + 1) % s.interval == 0
        if full:
            t[p + "attn_q.weight"] = r.mat(2 * q_rows if s.arch == "qwen35" else q_rows, s.embd)
            t[p + "attn_k.weight"] = r.mat(kv_rows, s.embd)
            t[p + "attn_v.weight"] = r.mat(kv_rows, s.embd)
            t[p + "attn_output.weight"] = r.mat(s.embd, q_rows)
            if s.arch in ("qwen3", "gemma3", "qwen35"):
                t[p + "attn_q_norm.weight"] = r.norm(s.head_dim)
                t[p + "attn_k_norm.weight"] = r.norm(s.head_dim)
            if s.arch == "qwen2":
                t[p + "attn_q.bias"] = r.vec(q_rows, 0.3)
                t[p + "attn_k.bias"] = r.vec(kv_rows, 0.3)
                t[p + "attn_v.bias"] = r.vec(kv_rows, 0.3)
        else:
            key, value = s.d_state * s.n_group, s.d_state * s.dt_rank
            conv = 2 * key + value
            t[p + "attn_qkv.weight"] = r.mat(conv, s.embd)
            t[p + "attn_gate.weight"] = r.mat(value, s.embd)
            t[p + "ssm_conv1d.weight"] = r.mat(conv, s.d_conv, 0.5)
            t[p + "ssm_dt.bias"] = r.vec(s.dt_rank, 1.0)
            t[p + "ssm_a"] = -np.exp(r.vec(s.dt_rank, 0.5))
            t[p + "ssm_beta.weight"] = r.mat(s.dt_rank, s.embd)
            t[p + "ssm_alpha.weight"] = r.mat(s.dt_rank, s.embd)
            t[p + "ssm_norm.weight"] = r.norm(s.d_state)
            t[p + "ssm_out.weight"] = r.mat(s.embd, value)
        if s.arch == "gemma3":
            t[p + "post_attention_norm.weight"] = r.norm(s.embd)
            t[p + "ffn_norm.weight"] = r.norm(s.embd)
            t[p + "post_ffw_norm.weight"] = r.norm(s.embd)
        elif s.arch == "qwen35":
            t[p + "post_attention_norm.weight"] = r.norm(s.embd)
        else:
            t[p + "ffn_norm.weight"] = r.norm(s.embd)
        t[p + "ffn_gate.weight"] = r.mat(s.ff, s.embd)
        t[p + "ffn_up.weight"] = r.mat(s.ff, s.embd)
        t[p + "ffn_down.weight"] = r.mat(s.embd, s.ff)
    return t


def _keys(w: gguf.GGUFWriter, s: Shape, vocab: Vocab) -> None:
    w.add_context_length(4096)
    w.add_embedding_length(s.embd)
    w.add_block_count(s.layers)
    w.add_feed_forward_length(s.ff)
    w.add_head_count(s.heads)
    w.add_head_count_kv(s.kv_heads)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(s.rope_base)
    if s.arch == "qwen35":
        w.add_rope_dimension_count(s.n_rot)
        w.add_rope_dimension_sections(list(s.sections))
        w.add_ssm_conv_kernel(s.d_conv)
        w.add_ssm_inner_size(s.d_state * s.dt_rank)
        w.add_ssm_state_size(s.d_state)
        w.add_ssm_time_step_rank(s.dt_rank)
        w.add_ssm_group_count(s.n_group)
        w.add_full_attention_interval(s.interval)
    elif s.arch != "gemma3":
        w.add_rope_dimension_count(s.head_dim)
    if s.arch == "gemma3":
        w.add_sliding_window(s.window)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos)
    w.add_eos_token_id(vocab.eos)
    w.add_add_bos_token(False)


def write_f32(path: Path, s: Shape, vocab: Vocab, seed: int, f16: bool = False) -> Path:
    """Every tensor F32 (2-D matrices F16 with f16=True)."""
    w = gguf.GGUFWriter(str(path), s.arch)
    w.add_name(f"fidelity fuzz {s.arch}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    _keys(w, s, vocab)
    for name, a in _tensors(s, len(vocab.tokens), _Rng(seed)).items():
        matrix = a.ndim == 2 and "ssm_conv1d" not in name
        w.add_tensor(name, a.astype(np.float16) if f16 and matrix else a)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return path


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def write(path: Path, s: Shape, vocab: Vocab, qtype: str, seed: int) -> Path:
    """A fixture of `qtype`: f32/f16 written here, anything else quantized by llama.cpp."""
    if qtype in ("f32", "f16"):
        return write_f32(path, s, vocab, seed, f16=qtype == "f16")
    import llama_cpp

    src = write_f32(path.with_suffix(".src.gguf"), s, vocab, seed)
    try:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, QUANT_FTYPES[qtype])
        params.nthread = 2
        with _silenced():
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(path).encode(), params)
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({qtype}) failed: {rc}")
    finally:
        src.unlink(missing_ok=True)
    return path
