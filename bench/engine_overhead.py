"""The engine's time per step outside `forward`: sampling, logits hand-over, stop checks, event fan-out.

For each slot count n: n greedy (or `--top-k`) requests of `--max-tokens` tokens run together in an
in-process `Engine` (no gRPC); the model's `forward` is wrapped to add up its own time, and the
engine thread's wall time between its first and last forward minus that sum, divided by the steps,
is the per-step overhead. Events go to a sink that only counts, as the servicer's hand-off does.
Prints JSON (and writes it under bench/results/).

    python bench/engine_overhead.py [--slots 1 4 8] [--max-tokens 64] [--top-k 0] [--model default]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

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


class TimedForward:
    """Wraps `arch.forward`: the time spent inside it and the wall span from the first call."""

    def __init__(self, arch) -> None:
        self.inner = arch.forward
        self.inside: list[float] = []
        self.first = self.last_end = 0.0
        arch.forward = self

    def __call__(self, segments, cancel=None):
        start = time.perf_counter()
        if not self.inside:
            self.first = start
        try:
            return self.inner(segments, cancel)
        finally:
            self.last_end = time.perf_counter()
            self.inside.append(self.last_end - start)

    def reset(self) -> None:
        self.inside = []


def run(engine, model, timer: TimedForward, n: int, max_tokens: int, params) -> dict:
    from hyserve.engine.generator import StopRule
    from hyserve.engine.task import FailedEvent, FinishedEvent, Task

    left = threading.Semaphore(0)
    ended: list[float] = []

    def sink(event: object) -> None:
        if isinstance(event, FinishedEvent | FailedEvent):
            ended.append(time.perf_counter())
            left.release()

    timer.reset()
    tasks = [
        Task(f"t{n}-{i}-{time.monotonic_ns()}", tuple(model.tokenizer.encode(PROMPTS[i % len(PROMPTS)])), params,
             StopRule(max_tokens, ignore_eos=True), sink)
        for i in range(n)
    ]  # fmt: skip
    for task in tasks:
        engine.submit(task)
    for _ in tasks:
        left.acquire()
    steps = len(timer.inside)
    span = max(ended) - timer.first
    inside = sum(timer.inside)
    return {
        "slots": n,
        "steps": steps,
        "forward_ms_per_step": 1e3 * inside / steps,
        "outside_ms_per_step": 1e3 * (span - inside) / steps,
        "outside_share": (span - inside) / span,
        "median_forward_ms": 1e3 * statistics.median(timer.inside),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=0, help="0: greedy; else temperature 0.8 with this top-k")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="default")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON

    import hyserve_kernels

    from hyserve.api.server import GIL_SWITCH_INTERVAL_S
    from hyserve.engine.engine import Engine, EngineConfig
    from hyserve.engine.sampling import SamplingParams
    from hyserve.model.loader import load_model

    hyserve_kernels.set_num_threads(args.threads)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    model = load_model(args.model)
    timer = TimedForward(model.arch)
    params = SamplingParams() if args.top_k == 0 else SamplingParams(temperature=0.8, top_k=args.top_k, seed=1)
    rows = []
    for n in args.slots:
        engine = Engine(model.arch, model.tokenizer, EngineConfig(n_slots=n, n_ctx=1024, cache_memory=0))
        engine.start()
        run(engine, model, timer, n, 4, params)  # warm-up
        rows.append(run(engine, model, timer, n, args.max_tokens, params))
        engine.shutdown()
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result = {
        "model": args.model,
        "sampling": "greedy" if args.top_k == 0 else f"temperature 0.8, top-k {args.top_k}",
        "max_tokens": args.max_tokens,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "engine_overhead" + ("" if args.top_k == 0 else f"_topk{args.top_k}")
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
