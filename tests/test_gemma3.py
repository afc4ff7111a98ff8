"""Gemma 3 270M (the default model): oracle agreement with llama.cpp, batch invariance, and the CLI."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hyserve.model.architectures.base import Logits, Segment

APACHE = Path("/usr/share/common-licenses/Apache-2.0")


def oracle_prompts() -> dict[str, str]:
    json_src = Path(importlib.util.find_spec("json").origin).read_text()  # type: ignore[arg-type]
    prompts = {
        "short": "Once upon a time",
        "prose": (
            "The history of computing is a story of abstraction layered on abstraction. Early machines were "
            "programmed by rewiring panels; later, stored programs let the same hardware run many tasks. "
            "Compilers, operating systems and networks each hid a layer of detail from the people above them."
        ),
        "code_long": json_src[:3000],  # > 700 tokens: the 512-token sliding window matters
    }
    if APACHE.exists():
        prompts["license_long"] = APACHE.read_text()[:3500]
    return prompts


def all_logits(model, tokens: list[int], chunks: list[int] | None = None) -> np.ndarray:
    memory = model.arch.new_memory(4096)
    sizes = chunks or [len(tokens)]
    out, at = [], 0
    for size in sizes:
        part = np.asarray(tokens[at : at + size], dtype=np.int32)
        out.append(model.arch.forward([Segment(memory, part, Logits.ALL)])[0])
        at += size
    assert at == len(tokens)
    return np.concatenate(out)


@pytest.fixture(scope="module")
def oracle(gemma_path: Path):
    from llama_oracle import LlamaOracle

    plain = LlamaOracle(gemma_path, repack=False)
    repacked = LlamaOracle(gemma_path, repack=True)
    yield plain, repacked
    plain.close()
    repacked.close()


def test_logits_agree_with_llama_cpp(gemma_model, oracle, record_property) -> None:
    """Teacher-forced per-position logits against llama.cpp on the same file.

    llama.cpp's own two CPU code paths (weight repacking on/off) disagree with each other at the
    level of ~5e-3 nats, because int8 activation quantization amplifies f32 summation-order
    differences through the layers. hyserve reproduces llama.cpp's attention, RoPE, RMSNorm, GELU,
    Q8_0/Q5_0 and K-quant (vec_dot) matmul numerics exactly, so against the plain path (no repack,
    no tiled K-quant GEMM) the logits agree (measured: KL 0, top-1 100%); we require mean KL <= 1e-3
    and top-1 >= 98% per prompt (and record the figures).
    """
    from llama_oracle import kl_per_position, top1_agreement

    plain, repacked = oracle
    report = {}
    for name, text in oracle_prompts().items():
        tokens = gemma_model.tokenizer.encode(text)
        ours = all_logits(gemma_model, tokens)
        ref, ref_repacked = plain.logits(tokens), repacked.logits(tokens)
        kl = kl_per_position(ref, ours)
        self_kl = kl_per_position(ref, ref_repacked)
        top1 = top1_agreement(ref, ours)
        report[name] = {
            "tokens": len(tokens),
            "mean_kl": float(kl.mean()),
            "top1": top1,
            "llama_repack_vs_plain_mean_kl": float(self_kl.mean()),
            "llama_repack_vs_plain_top1": top1_agreement(ref, ref_repacked),
        }
        np.testing.assert_array_equal(ours[0], ref[0])  # the first position is bit-identical
        assert kl.mean() <= 1e-3, report[name]
        assert top1 >= 0.98, report[name]
    print(json.dumps(report, indent=1))
    record_property("oracle", json.dumps(report))
    assert any(v["tokens"] > 700 for v in report.values())


def test_chunked_and_token_by_token_logits_are_bit_identical(gemma_model) -> None:
    tokens = gemma_model.tokenizer.encode("In uneven chunks or one at a time, the logits must not change: " * 3)
    whole = all_logits(gemma_model, tokens)
    np.testing.assert_array_equal(all_logits(gemma_model, tokens, [5, 1, 17, len(tokens) - 23]), whole)
    np.testing.assert_array_equal(all_logits(gemma_model, tokens, [1] * len(tokens)), whole)


def test_sequences_batched_together_equal_separate_runs(gemma_model) -> None:
    a = gemma_model.tokenizer.encode("The first conversation talks about the weather.")
    b = gemma_model.tokenizer.encode("A second, unrelated prompt about prime numbers and their gaps")
    arch = gemma_model.arch
    mem_a, mem_b = arch.new_memory(256), arch.new_memory(256)
    arch.forward([Segment(mem_a, np.asarray(a[:4], np.int32), Logits.NONE)])
    both = arch.forward(
        [Segment(mem_a, np.asarray(a[4:], np.int32), Logits.ALL), Segment(mem_b, np.asarray(b, np.int32), Logits.ALL)]
    )
    np.testing.assert_array_equal(both[0], all_logits(gemma_model, a)[4:])
    np.testing.assert_array_equal(both[1], all_logits(gemma_model, b))


def run_cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hyserve", "run", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return done.stdout


def test_cli_generate_greedy_and_seeded() -> None:
    greedy = run_cli("Once upon a time", "--max-tokens", "12")
    assert greedy.startswith("Once upon a time") and len(greedy) > len("Once upon a time\n")
    assert run_cli("Once upon a time", "--max-tokens", "12") == greedy
    seeded = [run_cli("Once upon a time", "--max-tokens", "12", "--temperature", "1.0", "--seed", s) for s in "112"]
    assert seeded[0] == seeded[1]
    assert seeded[0] != seeded[2] or seeded[0] != greedy


def test_a_set_cancel_flag_stops_the_forward_and_advances_nothing(gemma_model) -> None:
    import hyserve_kernels as hk

    from hyserve.model.architectures.base import ForwardCancelled

    tokens = gemma_model.tokenizer.encode("A prompt that will be cancelled before it is evaluated.")
    memory, flag = gemma_model.arch.new_memory(256), hk.CancelFlag()
    gemma_model.arch.forward([Segment(memory, np.asarray(tokens[:3], np.int32), Logits.NONE)], cancel=flag)
    flag.set()
    with pytest.raises(ForwardCancelled):
        gemma_model.arch.forward([Segment(memory, np.asarray(tokens[3:], np.int32), Logits.ALL)], cancel=flag)
    assert memory.n_tokens == 3
    rest = gemma_model.arch.forward([Segment(memory, np.asarray(tokens[3:], np.int32), Logits.ALL)])[0]
    np.testing.assert_array_equal(rest, all_logits(gemma_model, tokens)[3:])
