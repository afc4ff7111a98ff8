"""Accuracy report: hyserve against llama.cpp (llama-cpp-python) on every oracle case of the model
tests (tiny random-weight fixtures of each architecture and weight type), teacher-forced logits on
prompts of 1, 7 and 300+ tokens. Prints JSON: per case and prompt length the mean KL(llama.cpp ||
hyserve) per position, top-1 agreement and whether the logits are bit-identical. The tests assert
the bars (mean KL <= 1e-3, top-1 >= 99%); this prints the figures.

    python bench/oracle_report.py [--out bench/results/oracle_report.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from hyserve.logging_setup import configure_logging


def cases() -> list[tuple[str, str, dict]]:
    import test_moe_models
    import test_recurrent_models
    import test_transformers

    return (
        [(a, q, kw) for a, q, kw in test_transformers.CASES]
        + [(a, q, {}) for a, q in test_recurrent_models.CASES]
        + list(test_moe_models.ORACLE_CASES)
    )


def measure(arch: str, qtype: str, kw: dict, workdir: Path) -> dict:
    from fixtures import make_models
    from test_transformers import TEXT

    from hyserve.model.architectures.base import Logits, Segment
    from hyserve.model.loader import load_model
    from llama_oracle import LlamaOracle, kl_per_position, top1_agreement

    path = make_models.write_model(workdir / f"{arch}-{qtype}-{len(kw)}.gguf", arch, qtype=qtype, **kw)
    model = load_model(path)
    oracle = LlamaOracle(path)
    try:
        long = model.tokenizer.encode(TEXT)
        prompts = []
        for tokens in (long[:1], long[:7], long):
            memory = model.arch.new_memory(len(tokens) + 8)
            ours = model.arch.forward([Segment(memory, np.asarray(tokens, np.int32), Logits.ALL)])[0]
            ref = oracle.logits(tokens)
            prompts.append(
                {
                    "tokens": len(tokens),
                    "mean_kl": float(kl_per_position(ref, ours).mean()),
                    "top1": top1_agreement(ref, ours),
                    "bit_identical": bool(np.array_equal(ours, ref)),
                }
            )
    finally:
        oracle.close()
    return {"arch": arch, "qtype": qtype, "options": kw, "prompts": prompts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "oracle_report.json")
    args = ap.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(arch, qtype, kw, Path(tmp)) for arch, qtype, kw in cases()]
    worst = {
        "max_mean_kl": max(p["mean_kl"] for r in rows for p in r["prompts"]),
        "min_top1": min(p["top1"] for r in rows for p in r["prompts"]),
    }
    result = {"cases": rows, "worst": worst}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
