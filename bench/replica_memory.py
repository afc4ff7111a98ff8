"""Memory one replica needs: resident memory of a real `hyserve serve` process idle, and with every
slot filled to nearly its context, for a few (slots, context) shapes. Gives the base (model + runtime)
and the cost per slot per token, the numbers behind docker/k8s resource requests (docker/README.md, "Memory").

Each shape starts a fresh server with `--cache-memory 0` (no prefix store, so only the slots grow),
sends one prompt of `fill` tokens per slot at the same time (distinct first tokens: nothing shared),
then reads /proc/PID/status: RssAnon (heap, KV caches, checkpoints) and RssFile (the memory-mapped
GGUF). Prints JSON and writes it to bench/results/replica_memory_NAME.json.

    python bench/replica_memory.py [--model default|PATH] [--name gemma3_270m] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from loopback import Replica, wait_until

from hyserve.logging_setup import configure_logging
from hyserve.model.loader import load_model
from hyserve_client import HyserveClient

SHAPES = [(1, 4096), (2, 4096), (1, 8192)]  # (slots, context per slot)
RESULTS = Path(__file__).resolve().parent / "results"
TEXT = "The replica keeps every conversation's state in its slot so that the next turn resumes it. "


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile, VmHWM of a process, in KiB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def measure(model: str, slots: int, ctx: int, threads: int, prompts: list[list[int]], log_dir: Path) -> dict[str, Any]:
    args = ["--model", model, "--parallel", str(slots), "--ctx-size", str(ctx), "--threads", str(threads)]
    args += ["--cache-memory", "0"]
    replica = Replica(f"mem-{slots}x{ctx}", args, log_dir)
    replica.start()
    try:
        wait_until("ready", replica.ready, guard_s=300)
        assert replica.proc is not None
        idle = status_kib(replica.proc.pid)

        def fill(i: int) -> None:
            with HyserveClient(replica.target, timeout=1800) as client:
                client.generate_text(token_ids=prompts[i], max_tokens=1)

        workers = [threading.Thread(target=fill, args=(i,)) for i in range(slots)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        with HyserveClient(replica.target) as client:
            cached = [s.cached_tokens for s in client.cache_stats().slots]
        full = status_kib(replica.proc.pid)
    finally:
        replica.stop()
    tokens = sum(cached)
    grown = full["RssAnon"] - idle["RssAnon"]
    return {
        "slots": slots,
        "ctx_size": ctx,
        "cached_tokens": cached,
        "idle_kib": idle,
        "filled_kib": full,
        "anon_growth_mib": round(grown / 1024, 1),
        "kib_per_token": round(grown / max(1, tokens), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--name", default="gemma3_270m")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    tok = load_model(args.model).tokenizer
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for slots, ctx in SHAPES:
            fill = ctx - 96  # room for the one generated token and the template's slack
            prompts = []
            for i in range(slots):
                ids = tok.encode(f"Document {i}. " + TEXT * (fill // 8), add_special=True)
                prompts.append(ids[:fill])
            results.append(measure(args.model, slots, ctx, args.threads, prompts, Path(tmp)))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    report = {"model": args.model, "name": args.name, "threads": args.threads, "shapes": results}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"replica_memory_{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
