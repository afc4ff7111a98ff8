"""Builds a fuzz fixture, teacher-forces its texts through hyserve and llama.cpp's plain path, and
judges each text: bit-identical logits where hyserve claims them (`Fixture.claims_bits`), mean
KL(llama.cpp || hyserve) <= KL_LIMIT elsewhere; identical token ids from both tokenizers."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.loader import LoadedModel, load_model
from llama_oracle import LlamaOracle, kl_per_position

from . import probe, writer
from .cases import Fixture
from .texts import random_text
from .vocab import make_vocab

KL_LIMIT = 1e-4
MAX_TOKENS = 2048


@dataclass
class Outcome:
    fixture: str
    text: int
    n_tokens: int
    bit_identical: bool
    mean_kl: float
    first_position: int  # first position whose logits differ (-1: none)
    max_diff_there: float
    tokens_match: bool
    passed: bool
    claimed_bits: bool = True  # judged by bit identity (else by KL)
    where: str = ""  # probe.Divergence, when it failed

    def describe(self) -> str:
        s = f"{self.fixture} text {self.text} ({self.n_tokens} tokens): "
        if not self.tokens_match:
            s += "hyserve and llama.cpp tokenize differently; "
        s += f"bit-identical={self.bit_identical} mean KL={self.mean_kl:.3g}"
        if self.first_position >= 0:
            s += f", first differing position {self.first_position} (max |logit diff| {self.max_diff_there:.3g})"
        return s + (f"; {self.where}" if self.where else "")


def build(fx: Fixture, directory: Path) -> Path:
    path = directory / f"{fx.id}.gguf"
    if fx.writer == "independent":
        assert fx.shape is not None
        return writer.write(path, fx.shape, make_vocab(fx.n_merges), fx.qtype, seed=fx.seed * 100003 + fx.index)
    from fixtures import make_models

    return make_models.write_model(path, fx.arch, qtype=fx.qtype, seed=fx.index, **fx.builder_kw)


def tinyblas_matrices(path: Path) -> list[str]:
    """The 2-D F32/F16/BF16 weights (a quantized file keeps those whose rows are no whole blocks)
    that llama.cpp's batches multiply with tinyBLAS: rows % 4 == 0 and columns % 8 == 0 on AVX2,
    summed in another order than its one-row `vec_dot`, which hyserve follows (batch-invariant).
    MoE routers are left to `Fixture.claims_bits`; an embedding only looked up is no product."""
    reader = gguf.GGUFReader(path)
    names = {t.name for t in reader.tensors}
    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16)
    found = []
    for t in reader.tensors:
        if t.tensor_type not in floats or len(t.shape) != 2:
            continue
        if t.name.endswith(("ffn_gate_inp.weight", "conv1d.weight")):
            continue
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        if int(t.shape[1]) % 4 == 0 and int(t.shape[0]) % 8 == 0:
            found.append(t.name)
    return found


def texts(fx: Fixture) -> list[str]:
    r = random.Random(f"texts-{fx.seed}-{fx.index}")
    return [random_text(r, n) for n in fx.text_lengths]


def llama_tokens(oracle: LlamaOracle, text: str) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(oracle.model)
    raw = text.encode()
    cap = len(raw) + 16
    buf = (llama_cpp.llama_token * cap)()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, cap, False, False)
    if n < 0:
        raise RuntimeError(f"llama_tokenize needs {-n} slots")
    return list(buf[:n])


def judge(fx: Fixture, i: int, ours: np.ndarray, ref: np.ndarray, tokens_match: bool, claims_bits: bool) -> Outcome:
    diff = np.abs(ours - ref).max(-1)
    bad = np.flatnonzero(diff)
    kl = float(kl_per_position(ref, ours).mean())
    identical = len(bad) == 0
    passed = tokens_match and (identical if claims_bits else kl <= KL_LIMIT)
    first = int(bad[0]) if len(bad) else -1
    return Outcome(fx.id, i, len(ours), identical, kl, first, float(diff[first]) if first >= 0 else 0.0,
                   tokens_match, passed, claims_bits)  # fmt: skip


def run_fixture(fx: Fixture, directory: Path, diagnose: bool = True) -> list[Outcome]:
    path = build(fx, directory)
    claims_bits = fx.claims_bits and not tinyblas_matrices(path)
    model: LoadedModel = load_model(path)
    oracle = LlamaOracle(path, n_ctx=MAX_TOKENS, n_batch=512)
    outcomes: list[Outcome] = []
    try:
        for i, text in enumerate(texts(fx)):
            tokens = model.tokenizer.encode(text, add_special=False, parse_special=False)[:MAX_TOKENS]
            theirs = llama_tokens(oracle, text)[:MAX_TOKENS]
            if not tokens:
                continue
            arch = model.arch
            ours = arch.forward([Segment(arch.new_memory(MAX_TOKENS), np.asarray(tokens, np.int32), Logits.ALL)])[0]
            outcome = judge(fx, i, ours, oracle.logits(tokens), tokens == theirs, claims_bits)
            if not outcome.passed and diagnose and outcome.first_position >= 0:
                found = probe.first_divergence(arch, path, tokens[: outcome.first_position + 1], n_batch=512)
                outcome.where = str(found) if found else "no kernel output differs (an op outside the kernels)"
            outcomes.append(outcome)
    finally:
        oracle.close()
        del model
        path.unlink(missing_ok=True)
    return outcomes


__all__ = ["KL_LIMIT", "Outcome", "build", "run_fixture", "tinyblas_matrices"]
