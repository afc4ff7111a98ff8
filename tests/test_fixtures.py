"""Tests for tests/fixtures/make_models.py: the tiny random-weight GGUF models load and run in
llama.cpp (llama-cpp-python), our GGUF reader and tokenizer read them, and the chat template drops
earlier reasoning. Tests that need the oracle skip when llama_cpp cannot be imported."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixtures.make_models import CHAT_TEMPLATE, SPECIAL_TEXTS, build_tokenizer, write_model

from hyserve.model.chat_template import ChatTemplate
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.tokenizer import Tokenizer

KQUANT_SHAPE: dict[str, Any] = {"embd": 256, "ff": 512, "head_dim": 64}  # all matrix rows multiples of 256

DENSE_ARCHES = ("llama", "qwen3", "qwen35", "mamba2")
# (arch, qtype, extra write_model kwargs)
CASES: list[tuple[str, str, dict[str, Any]]] = [
    *[(arch, q, {}) for arch in (*DENSE_ARCHES, "qwen35moe", "qwen3next") for q in ("f32", "q8_0")],
    ("llama", "q4_k_m", KQUANT_SHAPE),
    ("qwen3", "q6_k", KQUANT_SHAPE),
    ("qwen35", "q4_k_m", {**KQUANT_SHAPE, "ssm_d_state": 64}),
    ("qwen3next", "q4_k_m", {**KQUANT_SHAPE, "expert_ff": 256, "shared_ff": 256}),
]
CASE_IDS = [f"{arch}-{q}" for arch, q, _ in CASES]

TOKENIZER_STRINGS = (
    "Hello world",
    "The quick brown fox jumps over the lazy dog. I'm sure you'll see.",
    "  leading spaces\tand tabs\n\nnew lines  ",
    "def f(x):\n    return x ** 2  # 123456",
    "Größe Straße, 你好，世界！ こんにちは 😀👍🏽",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nreasoning here\n</think>\n\nanswer<|im_end|><|endoftext|>",
    "a<|im_end|>b<think></think>c",
)

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nAdd two and two.\n</think>\n\nIt is 4."},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {cid: write_model(root / f"{cid}.gguf", arch, qtype=q, **kw) for cid, (arch, q, kw) in zip(CASE_IDS, CASES)}


@pytest.fixture(scope="module")
def llama_cpp() -> Any:
    return pytest.importorskip("llama_cpp")


@contextlib.contextmanager
def open_llama(llama_cpp: Any, path: Path) -> Iterator[Any]:
    llm = llama_cpp.Llama(str(path), n_ctx=256, logits_all=True, verbose=False, n_threads=1, n_threads_batch=1)
    try:
        yield llm
    finally:
        llm.close()


def expected_tensor_names(arch: str, layers: int = 4, interval: int = 4) -> set[str]:
    names = {"token_embd.weight", "output_norm.weight", "output.weight"}
    for il in range(layers):
        per: list[str] = ["attn_norm"]
        if arch in ("llama", "qwen3"):
            per += ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"]
            if arch == "qwen3":
                per += ["attn_q_norm", "attn_k_norm"]
        elif arch in ("qwen35", "qwen35moe", "qwen3next"):
            per.append("post_attention_norm")
            if arch == "qwen35":
                per += ["ffn_gate", "ffn_up", "ffn_down"]
            else:
                per += ["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
                per += ["ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]
            if (il + 1) % interval:
                per += ["attn_qkv", "attn_gate", "ssm_conv1d", "ssm_norm", "ssm_out"]
                per += ["ssm_ba"] if arch == "qwen3next" else ["ssm_beta", "ssm_alpha"]
                names |= {f"blk.{il}.ssm_a", f"blk.{il}.ssm_dt.bias"}
            else:
                per += ["attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output"]
        else:  # mamba2
            per += ["ssm_in", "ssm_conv1d", "ssm_norm", "ssm_out"]
            names |= {f"blk.{il}.{n}" for n in ("ssm_a", "ssm_d", "ssm_dt.bias", "ssm_conv1d.bias")}
        names |= {f"blk.{il}.{n}.weight" for n in per}
    return names


# ------------------------------------------------------------------------------------------
# llama.cpp runs them
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cid", CASE_IDS)
def test_llama_cpp_runs(cid: str, models: dict[str, Path], llama_cpp: Any) -> None:
    with open_llama(llama_cpp, models[cid]) as llm:
        tokens = llm.tokenize(b"<|im_start|>user\nHello world, how are you?", add_bos=False, special=True)[:8]
        assert len(tokens) == 8
        llm.eval(tokens)
        logits = np.array(llm.scores[:8], dtype=np.float64)
    assert logits.shape == (8, 512)
    assert np.isfinite(logits).all()
    spread = logits.std(axis=1)
    assert (spread > 0.3).all() and (spread < 10).all(), spread
    assert np.abs(logits).max() < 50
    # positions differ (the model looks at its input) and the argmax is not constant
    assert np.abs(np.diff(logits, axis=0)).max() > 0.1
    assert len(set(logits.argmax(axis=1).tolist())) > 1


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen35", "qwen35moe", "qwen3next", "mamba2"])
def test_q8_0_close_to_f32(arch: str, models: dict[str, Path], llama_cpp: Any) -> None:
    tokens = [5, 77, 300, 12, 505, 8, 260, 1]
    out = []
    for q in ("f32", "q8_0"):
        with open_llama(llama_cpp, models[f"{arch}-{q}"]) as llm:
            llm.eval(tokens)
            out.append(np.array(llm.scores[: len(tokens)], dtype=np.float64))
    assert np.abs(out[0] - out[1]).max() < 0.15
    assert np.abs(out[0]).max() > 1.0


def test_context_matters(models: dict[str, Path], llama_cpp: Any) -> None:
    """The mixers contribute: the last position's logits depend on the earlier tokens."""
    for arch in ("llama", "qwen35", "mamba2"):
        rows = []
        with open_llama(llama_cpp, models[f"{arch}-f32"]) as llm:
            for prefix in ([10, 20, 30, 40, 50, 60, 70], [300, 301, 302, 303, 304, 305, 306]):
                llm.reset()
                llm.eval([*prefix, 99])
                rows.append(np.array(llm.scores[7], dtype=np.float64))
        assert np.linalg.norm(rows[0] - rows[1]) > 0.2 * np.linalg.norm(rows[0]), arch


# ------------------------------------------------------------------------------------------
# Our reader
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cid", CASE_IDS)
def test_gguf_reader(cid: str, models: dict[str, Path]) -> None:
    arch, qtype, kw = CASES[CASE_IDS.index(cid)]
    f = GGUFFile.open(models[cid])
    assert f.architecture == arch
    assert f.metadata[f"{arch}.block_count"] == 4
    assert f.metadata[f"{arch}.embedding_length"] == kw.get("embd", 64)
    assert set(f.tensors) == expected_tensor_names(arch)
    assert f.metadata["tokenizer.ggml.model"] == "gpt2"
    assert f.metadata["tokenizer.ggml.pre"] == "qwen2"
    assert f.metadata["tokenizer.chat_template"] == CHAT_TEMPLATE
    types = {t.ggml_type.name for t in f.tensors.values()}
    matrix_name = {"mamba2": "ssm_in", "qwen35moe": "ffn_up_shexp", "qwen3next": "ffn_up_shexp"}.get(arch, "ffn_up")
    matrix = f.tensor(f"blk.0.{matrix_name}.weight")
    emb = f.tensor("token_embd.weight")
    assert emb.shape == (kw.get("embd", 64), 512)
    if qtype == "f32":
        assert types == {"F32"}
    elif qtype == "q8_0":
        assert types == {"F32", "Q8_0"}
        assert matrix.ggml_type.name == "Q8_0"
    else:
        assert {"Q4_K", "Q6_K"} & types
        assert matrix.ggml_type.name == qtype.upper()[:4]
    if arch in ("qwen35", "qwen35moe", "qwen3next"):
        assert f.metadata[f"{arch}.full_attention_interval"] == 4
        assert f.tensor("blk.3.attn_q.weight").shape == (
            f.metadata[f"{arch}.embedding_length"],
            2 * 4 * kw.get("head_dim", 16),
        )
    if arch in ("qwen35moe", "qwen3next"):
        assert f.metadata[f"{arch}.expert_count"] == 8 and f.metadata[f"{arch}.expert_used_count"] == 2
        assert f.tensor("blk.0.ffn_down_exps.weight").shape == (kw.get("expert_ff", 32), kw.get("embd", 64), 8)
        assert f.tensor("blk.0.ffn_gate_inp.weight").ggml_type.name == "F32"  # the router is never quantized
    # 1-D tensors and conv kernels stay F32 whatever the qtype
    for name, t in f.tensors.items():
        if len(t.shape) == 1 or "norm" in name or "ssm_conv1d" in name or name.endswith(("ssm_a", "ssm_d")):
            assert t.ggml_type.name == "F32", name


def test_deterministic(tmp_path: Path) -> None:
    a = write_model(tmp_path / "a.gguf", "qwen35", seed=3, layers=2, qtype="q8_0")
    b = write_model(tmp_path / "b.gguf", "qwen35", seed=3, layers=2, qtype="q8_0")
    c = write_model(tmp_path / "c.gguf", "qwen35", seed=4, layers=2, qtype="q8_0")
    data = [p.read_bytes() for p in (a, b, c)]
    assert data[0] == data[1]
    assert len(data[0]) == len(data[2]) and data[0] != data[2]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown arch"):
        write_model(tmp_path / "x.gguf", "gpt5")
    with pytest.raises(ValueError, match="unknown qtype"):
        write_model(tmp_path / "x.gguf", "llama", qtype="q3_k")
    with pytest.raises(TypeError, match="interval"):
        write_model(tmp_path / "x.gguf", "llama", interval=2)
    with pytest.raises(ValueError, match="rope_sections"):
        write_model(tmp_path / "x.gguf", "qwen35", rope_sections=[3, 3, 3, 0])


def test_filler_vocabulary() -> None:
    tok = build_tokenizer(6000)
    assert len(tok.tokens) == len(set(tok.tokens)) == 6000
    assert tok.tokens[-len(SPECIAL_TEXTS) :] == list(SPECIAL_TEXTS)
    assert tok.eos_id == tok.ids["<|im_end|>"] and tok.bos_id == tok.ids["<|endoftext|>"]


# ------------------------------------------------------------------------------------------
# Tokenizer and chat template
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cid", ["llama-f32", "qwen35-q8_0", "mamba2-f32", "qwen3-q6_k"])
def test_tokenizer_matches_llama_cpp(cid: str, models: dict[str, Path], llama_cpp: Any, tmp_path: Path) -> None:
    meta = GGUFFile.open(models[cid]).metadata
    tok = Tokenizer.from_metadata(meta, cache_dir=tmp_path)
    assert tok.vocab_size == 512
    assert tok.eos_id == meta["tokenizer.ggml.eos_token_id"] == tok.token_id("<|im_end|>")
    assert tok.bos_id == meta["tokenizer.ggml.bos_token_id"] == tok.token_id("<|endoftext|>")
    assert not tok.add_bos
    with open_llama(llama_cpp, models[cid]) as llm:
        assert llm.token_eos() == tok.eos_id
        assert llm.token_bos() == tok.bos_id
        for special in SPECIAL_TEXTS:
            ids = tok.encode(special, add_special=False, parse_special=True)
            assert ids == [tok.token_id(special)] == llm.tokenize(special.encode(), add_bos=False, special=True)
        for text in TOKENIZER_STRINGS:
            ours = tok.encode(text, add_special=True, parse_special=True)
            theirs = llm.tokenize(text.encode(), add_bos=True, special=True)
            assert ours == theirs, text
            assert tok.encode(text, parse_special=False) == llm.tokenize(text.encode(), add_bos=True, special=False)
            assert tok.decode(ours) == text
            assert llm.detokenize(theirs, special=True).decode() == text


def test_chat_template_drops_earlier_reasoning(models: dict[str, Path], llama_cpp: Any, tmp_path: Path) -> None:
    meta = GGUFFile.open(models["qwen35-f32"]).metadata
    template = ChatTemplate(meta["tokenizer.chat_template"], eos_token="<|im_end|>", name="fixture")
    text = template.render(CONVERSATION).text
    assert text == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\nIt is 4.<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    # a reply after the last user message keeps its reasoning
    later = [*CONVERSATION, {"role": "assistant", "content": "<think>\nThree and three.\n</think>\n\nSix."}]
    text2 = template.render(later, add_generation_prompt=False).text
    assert "Add two" not in text2
    assert text2.endswith("<|im_start|>assistant\n<think>\nThree and three.\n</think>\n\nSix.<|im_end|>\n")
    assert template.render(CONVERSATION, enable_thinking=False).text.endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # the rendered prompt tokenizes identically in both tokenizers, with single special ids
    tok = Tokenizer.from_metadata(meta, cache_dir=tmp_path)
    with open_llama(llama_cpp, models["qwen35-f32"]) as llm:
        assert llm.metadata["tokenizer.chat_template"] == CHAT_TEMPLATE
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
    assert tok.encode(text, add_special=False) == ids
    assert ids.count(tok.token_id("<|im_start|>")) == 5
    assert ids.count(tok.token_id("<think>")) == 1
