"""GPU path vs CPU path, teacher-forced: mean KL(CPU || GPU), top-1 agreement (raw, and up to
near-ties of the CPU's logits) and bit-identity, on the fixtures of tests/test_gpu_models.py and
tests/test_gpu_hybrid_models.py and on Gemma 3 270M. Prints a Markdown table and writes
bench/results/gpu_agreement.json. `--matrix`: instead, every fixture architecture in every weight
format the fixtures make (f32, f16, q8_0, Q4_K_M and Q6_K quantized by llama.cpp; the cases of
tests/test_gpu_matrix.py), written to bench/results/gpu_agreement_matrix.json.

    python bench/gpu_agreement.py [--adapter NAME] [--matrix]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from fixtures import make_models
from test_gpu_hybrid_models import CASES as HYBRID_CASES
from test_gpu_matrix import MATRIX_CASES
from test_gpu_models import CASES, TEXT

from hyserve.logging_setup import configure_logging
from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.backend import DeviceRequest, open_backend
from hyserve.model.gguf_file import GGUFFile
from hyserve.model.loader import ARCHITECTURES, load_model
from llama_oracle import kl_per_position, top1_agreement, top1_agreement_up_to_ties

GEMMA_PROMPTS = ["Once upon a time, there was a little robot who", "The capital of France is Paris. The capital of"]


def compare(name: str, cpu, gpu_arch, tokens: list[int]) -> dict:
    def logits(arch) -> np.ndarray:
        return arch.forward([Segment(arch.new_memory(512), np.asarray(tokens, np.int32), Logits.ALL)])[0]

    a, b = logits(cpu.arch), logits(gpu_arch)
    return {
        "case": name,
        "tokens": len(tokens),
        "mean_kl": float(kl_per_position(a, b).mean()),
        "top1": top1_agreement(a, b),
        "top1_up_to_ties": top1_agreement_up_to_ties(a, b),
        "bit_identical": bool(np.array_equal(a, b)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--adapter", default=None)
    p.add_argument("--numerics", choices=("fast", "exact"), default="exact", help="the GPU numerics mode")
    p.add_argument("--matrix", action="store_true", help="every fixture architecture x every weight format")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    gpu = open_backend(DeviceRequest("gpu", gpu_adapter=args.adapter, gpu_numerics=args.numerics))
    rows = []
    cases = MATRIX_CASES if args.matrix else CASES + HYBRID_CASES
    with tempfile.TemporaryDirectory() as tmp:
        for i, (arch, qtype, kw) in enumerate(cases):
            path = make_models.write_model(Path(tmp) / f"{i}-{arch}-{qtype}.gguf", arch, qtype=qtype, **kw)
            cpu = load_model(path)
            name = f"{arch} {qtype}" + (f" {kw}" if not args.matrix and i >= len(CASES) and kw else "")
            rows.append(compare(name, cpu, ARCHITECTURES[arch](GGUFFile.open(path), gpu), cpu.tokenizer.encode(TEXT)))
    if not args.matrix:
        gemma = load_model("default")
        gemma_gpu = ARCHITECTURES["gemma3"](gemma.gguf, gpu)
        for text in GEMMA_PROMPTS:
            rows.append(compare("Gemma 3 270M Q4_K_M", gemma, gemma_gpu, gemma.tokenizer.encode(text)))
    result = {
        "adapter": gpu.description,
        "features": gpu.device.features,
        "numerics": gpu.device.numerics,
        "cases": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "gpu_agreement_matrix.json" if args.matrix else "gpu_agreement.json"
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    # the fidelity record's table (docs/fidelity.md), for a person reading the run
    print(f"adapter: {gpu.description}\n", file=sys.stderr)
    header = "| case | tokens | mean KL | top-1 | top-1 up to ties | bit-identical |\n|---|---|---|---|---|---|"
    print(header, file=sys.stderr)
    for r in rows:
        print(
            f"| {r['case']} | {r['tokens']} | {r['mean_kl']:.1e} | {100 * r['top1']:.1f}% | "
            f"{100 * r['top1_up_to_ties']:.1f}% | {'yes' if r['bit_identical'] else 'no'} |",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
