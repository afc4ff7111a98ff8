"""Where a bench's result goes: `<out>/<name>.json`, `<out>/<name>.png` and the JSON on stdout
(logs go to stderr, so stdout parses as JSON)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path


def publish(result: dict, out: Path, name: str, draw: Callable[[dict, Path], None], shown: dict | None = None) -> None:
    """Write the JSON and the PNG, and print `shown` (default: the whole result) as JSON."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    draw(result, out / f"{name}.png")
    print(json.dumps(result if shown is None else shown, indent=2))


def add_simd_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--simd",
        choices=["avx512vnni", "avx2", "scalar"],
        help="cap hyserve's kernel path (default: the best this CPU has; all give the same bits), "
        "e.g. avx2 to compare on the instruction set of the llama.cpp build",
    )


def instruction_sets(simd: str | None) -> dict:
    """Apply `--simd` and say what each engine runs on: hyserve's kernel path and the CPU features
    the llama.cpp build was compiled for (`.ci/install.sh` builds it for AVX2, without AVX-512)."""
    import hyserve_kernels as hk
    import llama_cpp

    if simd is not None:
        hk.set_simd_ceiling(simd)
    return {
        "hyserve_simd": hk.simd_path(),
        "llama_cpp_cpu": llama_cpp.llama_print_system_info().decode().strip(),
    }
