"""Serving benchmark: N concurrent streaming gRPC clients against one `hyserve serve --parallel N`.

For N in (1, 4, 8): aggregate generated tokens/s, time to first token and inter-token latency
(p50/p99), measured by real gRPC clients on 127.0.0.1. Also the gRPC streaming overhead: the same
greedy request (same prompt token ids, same max_tokens) through an in-process `Engine` configured
as the server's (one slot, same context, same GIL switch interval, same warm-up request first) and
through the one-client server, samples alternating; reported as the median of the paired ratios
(server time / in-process time - 1). Only one side runs at a time.
Prints JSON and writes JSON + PNG under bench/results/.

    python bench/serve_bench.py [--clients 1 4 8] [--max-tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np
from report import publish
from server_process import running_server

from hyserve.logging_setup import configure_logging

PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "The three most important ideas in computer science are",
    "Here is a short recipe for a tomato soup:",
    "The history of the printing press begins",
    "A good way to learn a new programming language is",
    "In the year 2050, cities will",
    "The mitochondria is",
    "Dear diary, today I",
]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def one_stream(target: str, prompt: str | list[int], max_tokens: int, out: list[dict]) -> None:
    from hyserve_client import HyserveClient

    source = {"token_ids": prompt} if isinstance(prompt, list) else {"text": prompt}
    with HyserveClient(target) as client:
        start = time.perf_counter()
        stamps: list[float] = []
        n_tokens = 0
        for event in client.generate(**source, max_tokens=max_tokens, ignore_eos=True):
            kind = type(event).__name__
            if kind == "Delta":
                stamps.append(time.perf_counter())
                n_tokens += len(event.token_ids)
        end = time.perf_counter()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    out.append({"ttft": stamps[0] - start, "gaps": gaps, "tokens": n_tokens, "seconds": end - start})


def run_clients(target: str, n: int, max_tokens: int) -> dict:
    results: list[dict] = []
    threads = [
        threading.Thread(target=one_stream, args=(target, PROMPTS[i % len(PROMPTS)], max_tokens, results))
        for i in range(n)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    gaps = [g for r in results for g in r["gaps"]]
    ttfts = [r["ttft"] for r in results]
    return {
        "clients": n,
        "aggregate_tok_s": sum(r["tokens"] for r in results) / wall,
        "ttft_p50_ms": 1e3 * percentile(ttfts, 50),
        "ttft_p99_ms": 1e3 * percentile(ttfts, 99),
        "itl_p50_ms": 1e3 * percentile(gaps, 50),
        "itl_p99_ms": 1e3 * percentile(gaps, 99),
        "wall_s": wall,
    }


class InProcessEngine:
    """The server's engine without the server: one slot, the same context and GIL switch interval."""

    def __init__(self, threads: int, n_ctx: int) -> None:
        import hyserve_kernels

        from hyserve.api.server import GIL_SWITCH_INTERVAL_S
        from hyserve.engine.engine import Engine, EngineConfig
        from hyserve.model.loader import load_model

        hyserve_kernels.set_num_threads(threads)
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self.model = load_model("default")
        self.engine = Engine(self.model.arch, self.model.tokenizer, EngineConfig(n_slots=1, n_ctx=n_ctx))
        self.engine.start()
        self._n = 0

    def seconds(self, tokens: list[int], max_tokens: int) -> float:
        """Submit to the end event of one greedy request, as a client sees a stream end."""
        from hyserve.engine.generator import StopRule
        from hyserve.engine.sampling import SamplingParams
        from hyserve.engine.task import FailedEvent, FinishedEvent, Task

        done = threading.Event()
        ends: list[object] = []

        def sink(event: object) -> None:
            if isinstance(event, FinishedEvent | FailedEvent):
                ends.append(event)
                done.set()

        self._n += 1
        task = Task(f"bench-{self._n}", tuple(tokens), SamplingParams(), StopRule(max_tokens, ignore_eos=True), sink)
        start = time.perf_counter()
        self.engine.submit(task)
        done.wait()
        elapsed = time.perf_counter() - start
        assert isinstance(ends[0], FinishedEvent), ends[0]
        return elapsed

    def close(self) -> None:
        self.engine.shutdown()


def grpc_overhead(target: str, local: InProcessEngine, max_tokens: int, repeats: int) -> dict:
    """Alternating samples of the same request in-process and through the server (after one warm-up
    each, which also leaves both with the same cached prompt)."""
    tokens = local.model.tokenizer.encode(PROMPTS[0])

    def remote() -> float:
        out: list[dict] = []
        one_stream(target, tokens, max_tokens, out)
        return out[0]["seconds"]

    local.seconds(tokens, max_tokens)
    remote()
    pairs = [(local.seconds(tokens, max_tokens), remote()) for _ in range(repeats)]
    ratios = [g / i for i, g in pairs]
    return {
        "in_process_s": statistics.median(i for i, _ in pairs),
        "grpc_one_client_s": statistics.median(g for _, g in pairs),
        "grpc_overhead": statistics.median(ratios) - 1.0,
        "grpc_overhead_samples": [r - 1.0 for r in ratios],
    }


def draw(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["concurrency"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = [str(r["clients"]) for r in rows]
    bars = axes[0].bar(xs, [r["aggregate_tok_s"] for r in rows], color="#2a7ab0")
    axes[0].bar_label(bars, fmt="%.0f")
    axes[0].set_title("aggregate generated tok/s")
    axes[0].set_xlabel("concurrent clients (= --parallel)")
    axes[1].plot(xs, [r["itl_p50_ms"] for r in rows], "o-", label="ITL p50")
    axes[1].plot(xs, [r["itl_p99_ms"] for r in rows], "o-", label="ITL p99")
    axes[1].plot(xs, [r["ttft_p50_ms"] for r in rows], "s--", label="TTFT p50")
    axes[1].set_ylabel("ms")
    axes[1].legend()
    axes[1].set_title(f"gRPC overhead vs in-process: {100 * result['grpc_overhead']:.1f}%")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--overhead-repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    args.out.mkdir(parents=True, exist_ok=True)

    local = InProcessEngine(args.threads, n_ctx=1024)
    rows = []
    for n in args.clients:
        log = args.out / f"serve_bench_server_{n}.log"
        server_args = ["--model", "default", "--parallel", str(n), "--ctx-size", "1024", "--threads", str(args.threads)]
        with running_server(log, *server_args) as target:
            run_clients(target, n, 8)  # warm-up
            rows.append(run_clients(target, n, args.max_tokens))
            if n == 1:
                overhead = grpc_overhead(target, local, args.max_tokens, args.overhead_repeats)
        log.unlink(missing_ok=True)
    local.close()
    one = next(r for r in rows if r["clients"] == 1)
    result = {
        "model": "gemma-3-270m-q4_k_m (default)",
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "concurrency": rows,
        **overhead,
        "speedup_vs_one_client": {r["clients"]: r["aggregate_tok_s"] / one["aggregate_tok_s"] for r in rows},
    }
    publish(result, args.out, "serve_gemma3_270m", draw)


if __name__ == "__main__":
    main()
