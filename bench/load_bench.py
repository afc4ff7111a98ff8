"""Model load time, hyserve against llama.cpp, same file, same run, samples alternating.

Each sample is a fresh process that imports its engine first (not timed), then times one load:
hyserve's `load_model(path)` (GGUF header, architecture and weights, the one-token probe, the
tokenizer, the chat template) against llama-cpp-python's `Llama(model_path=path)` with stock
settings (it too reads the vocabulary and builds its context). The order alternates
(AB BA AB ...) so that drift on a shared machine hits both alike. Prints JSON (medians, ranges,
the ratio llama.cpp / hyserve: > 1 means hyserve loads faster) and writes it with a PNG under
bench/results/.

    python bench/load_bench.py [--model default] [--samples 10] [--name load_gemma3_270m]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hyserve.logging_setup import configure_logging

ENGINES = ("hyserve", "llama_cpp")


def child(engine: str, path: str) -> float:
    """One load in this process; returns its seconds."""
    if engine == "hyserve":
        from hyserve.model.loader import load_model

        start = time.perf_counter()
        load_model(path)
        return time.perf_counter() - start
    import llama_cpp

    start = time.perf_counter()
    llama_cpp.Llama(model_path=path, verbose=False)
    return time.perf_counter() - start


def sample(engine: str, path: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--child", engine, "--model", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.strip().splitlines()[-1])


def order(i: int) -> tuple[str, str]:
    """AB, BA, AB, ...: neither engine always goes first."""
    return ENGINES if i % 2 == 0 else ENGINES[::-1]


def summary(values: list[float]) -> dict:
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values), "samples": values}


def draw(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for x, engine in enumerate(ENGINES):
        values = result[engine]["samples"]
        ax.scatter([x] * len(values), values, alpha=0.6)
        ax.hlines(result[engine]["median_s"], x - 0.25, x + 0.25, color="black")
    ax.set_xticks(range(len(ENGINES)), ["hyserve", "llama.cpp"])
    ax.set_ylabel("load seconds (one fresh process each)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{result['model']}: llama.cpp / hyserve = {result['ratio_median']:.2f}x")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="GGUF path, or 'default' for Gemma 3 270M")
    ap.add_argument("--samples", type=int, default=10, help="loads per engine")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--name", default="load_gemma3_270m")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON (a child's: its seconds)
    if args.child:
        print(child(args.child, args.model))
        return

    from hyserve.model.loader import resolve_model_path

    path = str(resolve_model_path(args.model))  # both engines get the same path
    times: dict[str, list[float]] = {e: [] for e in ENGINES}
    pairs: list[float] = []
    for i in range(args.samples):
        got = {engine: sample(engine, path) for engine in order(i)}
        for engine, seconds in got.items():
            times[engine].append(seconds)
        pairs.append(got["llama_cpp"] / got["hyserve"])
    result = {
        "model": Path(path).name,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "hyserve": summary(times["hyserve"]),
        "llama_cpp": summary(times["llama_cpp"]),
        # > 1: hyserve loads faster
        "ratio_median": statistics.median(times["llama_cpp"]) / statistics.median(times["hyserve"]),
        "paired_ratio": {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    draw(result, args.out / f"{args.name}.png")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
