"""Model load time, hyserve against llama.cpp, same file, same run, samples alternating.

A load is hyserve's `load_model(path)` (GGUF header, architecture and weights, the one-token
probe, the tokenizer, the chat template) against llama-cpp-python's `Llama(model_path=path)` with
stock settings (it too reads the vocabulary and builds its context). `--mode fresh` (default):
each sample is a fresh process that imports its engine first (not timed) and times one load, as a
server start does. `--mode warm`: one long-lived process per engine loads again and again (the
previous model freed first), like the loads in `runtime_bench.py`. The order alternates
(AB BA AB ...) so that drift on a shared machine hits both alike. Prints JSON (medians, ranges,
the ratio llama.cpp / hyserve: > 1 means hyserve loads faster) and writes it with a PNG under
bench/results/.

    python bench/load_bench.py [--model default] [--samples 10] [--mode fresh|warm] [--name load_gemma3_270m]
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from report import publish

from hyserve.logging_setup import configure_logging

ENGINES = ("hyserve", "llama_cpp")


def load_once(engine: str, path: str) -> float:
    """One load in this process; returns its seconds. The loaded model is dropped on return."""
    if engine == "hyserve":
        from hyserve.model.loader import load_model

        start = time.perf_counter()
        load_model(path)
        return time.perf_counter() - start
    import llama_cpp

    start = time.perf_counter()
    llama_cpp.Llama(model_path=path, verbose=False)
    return time.perf_counter() - start


def worker(engine: str, path: str) -> None:
    """Import the engine, then one load per line read from stdin, its seconds printed per line."""
    if engine == "hyserve":
        import hyserve.model.loader  # noqa: F401
    else:
        import llama_cpp  # noqa: F401
    print("ready", flush=True)
    for _ in sys.stdin:
        seconds = load_once(engine, path)
        gc.collect()
        print(seconds, flush=True)


class Sampler:
    """Loads in a fresh process each time, or in one long-lived worker per engine."""

    def __init__(self, path: str, warm: bool) -> None:
        self.path, self.warm = path, warm
        self.workers: dict[str, subprocess.Popen] = {}
        if warm:
            for engine in ENGINES:
                proc = subprocess.Popen(
                    [sys.executable, __file__, "--child", engine, "--model", path],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
                if proc.stdout is None or proc.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"the {engine} worker did not start")
                self.workers[engine] = proc

    def sample(self, engine: str) -> float:
        if not self.warm:
            run = subprocess.run(
                [sys.executable, __file__, "--child", engine, "--model", self.path],
                input="load\n",
                capture_output=True,
                text=True,
                check=True,
            )
            return float(run.stdout.strip().splitlines()[-1])
        proc = self.workers[engine]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("load\n")
        proc.stdin.flush()
        return float(proc.stdout.readline())

    def close(self) -> None:
        for proc in self.workers.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=60)


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
    ax.set_ylabel(f"load seconds ({result['mode']} process)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{result['model']}: llama.cpp / hyserve = {result['ratio_median']:.2f}x")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="GGUF path, or 'default' for Gemma 3 270M")
    ap.add_argument("--samples", type=int, default=10, help="loads per engine")
    ap.add_argument("--mode", choices=("fresh", "warm"), default="fresh", help="a process per load, or one per engine")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--name", default="load_gemma3_270m")
    ap.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON (a child's: its seconds)
    if args.child:
        worker(args.child, args.model)
        return

    from hyserve.model.loader import resolve_model_path

    path = str(resolve_model_path(args.model))  # both engines get the same path
    times: dict[str, list[float]] = {e: [] for e in ENGINES}
    pairs: list[float] = []
    sampler = Sampler(path, warm=args.mode == "warm")
    try:
        for i in range(args.samples):
            got = {engine: sampler.sample(engine) for engine in order(i)}
            for engine, seconds in got.items():
                times[engine].append(seconds)
            pairs.append(got["llama_cpp"] / got["hyserve"])
    finally:
        sampler.close()
    result = {
        "model": Path(path).name,
        "mode": args.mode,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "hyserve": summary(times["hyserve"]),
        "llama_cpp": summary(times["llama_cpp"]),
        # > 1: hyserve loads faster
        "ratio_median": statistics.median(times["llama_cpp"]) / statistics.median(times["hyserve"]),
        "paired_ratio": {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)},
    }
    publish(result, args.out, args.name, draw)


if __name__ == "__main__":
    main()
