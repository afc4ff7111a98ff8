"""Builds a fuzz fixture, teacher-forces its texts through hyserve and llama.cpp's plain path, and
judges each text: bit-identical logits where hyserve claims them (`Fixture.claims_bits`), mean
KL(llama.cpp || hyserve) <= KL_LIMIT elsewhere; identical token ids from both tokenizers."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

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


def judge(fx: Fixture, i: int, ours: np.ndarray, ref: np.ndarray, tokens_match: bool) -> Outcome:
    diff = np.abs(ours - ref).max(-1)
    bad = np.flatnonzero(diff)
    kl = float(kl_per_position(ref, ours).mean())
    identical = len(bad) == 0
    passed = tokens_match and (identical if fx.claims_bits else kl <= KL_LIMIT)
    first = int(bad[0]) if len(bad) else -1
    return Outcome(fx.id, i, len(ours), identical, kl, first, float(diff[first]) if first >= 0 else 0.0,
                   tokens_match, passed)  # fmt: skip


def run_fixture(fx: Fixture, directory: Path, diagnose: bool = True) -> list[Outcome]:
    path = build(fx, directory)
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
            outcome = judge(fx, i, ours, oracle.logits(tokens), tokens == theirs)
            if not outcome.passed and diagnose and outcome.first_position >= 0:
                found = probe.first_divergence(arch, path, tokens[: outcome.first_position + 1], n_batch=512)
                outcome.where = str(found) if found else "no kernel output differs (an op outside the kernels)"
            outcomes.append(outcome)
    finally:
        oracle.close()
        del model
        path.unlink(missing_ok=True)
    return outcomes


__all__ = ["KL_LIMIT", "Outcome", "build", "run_fixture"]
