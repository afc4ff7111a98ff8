"""A/B two builds of the kernel wheel on batched decode steps (or prompts), in one run.

Each build runs in its own worker process (`--a`/`--b`: a directory holding an unpacked
`hyserve_kernels`, or "" for the installed one), both load the model and hold k sequences with a
64-token prompt each; blocks of `--block` decode steps (one forward over k single-token segments)
alternate between the two processes, so the machine's background load hits both alike. Prints per k
the median step time of each build and b / a.

    python bench/kernel_ab.py --a "" --b /tmp/hk_new [--model default] [--ks 1 2 4 8 16] [--simd avx2]

`--prompts 512 4096` times whole prompts instead (one forward of that many tokens on a fresh memory
per sample; `--block` samples per turn).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from report import add_simd_argument

REPO = Path(__file__).resolve().parents[1]

WORKER = """
import json, sys, time
import numpy as np
import hyserve_kernels as hk
from hyserve.model.loader import load_model
from hyserve.model.architectures.base import Logits, Segment
hk.set_num_threads(int(sys.argv[2]))
if sys.argv[3]:
    hk.set_simd_ceiling(sys.argv[3])
arch = load_model(sys.argv[1]).arch
prompt = list(range(100, 164))
held = {}
print("ready", flush=True)
for line in sys.stdin:
    k, n = map(int, line.split())
    if k < 0:  # a prompt of -k tokens, n times, each on a fresh memory
        ids = np.asarray([(7 * i) % 20000 + 100 for i in range(-k)], np.int32)
        times = []
        for _ in range(n):
            mem = arch.new_memory(-k + 8)
            t0 = time.perf_counter()
            arch.forward([Segment(mem, ids, Logits.LAST)])
            times.append(time.perf_counter() - t0)
        print(json.dumps(times), flush=True)
        continue
    if k not in held:
        mems = [arch.new_memory(4096) for _ in range(k)]
        nxt = [int(np.argmax(arch.forward([Segment(m, np.asarray(prompt[i:] + prompt[:i], np.int32))])[0]))
               for i, m in enumerate(mems)]
        held = {k: (mems, nxt)}
    mems, nxt = held[k]
    times = []
    for _ in range(n):
        segs = [Segment(m, np.array([t], np.int32), Logits.LAST) for m, t in zip(mems, nxt)]
        t0 = time.perf_counter()
        out = arch.forward(segs)
        times.append(time.perf_counter() - t0)
        nxt[:] = [int(np.argmax(o)) for o in out]
    print(json.dumps(times), flush=True)
"""


def start(kernels: str, model: str, threads: int, simd: str) -> subprocess.Popen:
    path = os.pathsep.join(p for p in [kernels, str(REPO / "service"), os.environ.get("PYTHONPATH", "")] if p)
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, model, str(threads), simd],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert proc.stdout is not None
    while proc.stdout.readline().strip() != "ready":  # skip the model's log lines
        if proc.poll() is not None:
            raise RuntimeError(f"worker for {kernels!r} exited")
    return proc


def steps(proc: subprocess.Popen, k: int, n: int) -> list[float]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{k} {n}\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="directory with build A's hyserve_kernels ('' = installed)")
    ap.add_argument("--b", required=True)
    ap.add_argument("--model", default="default")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--prompts", type=int, nargs="*", default=[], help="prompt lengths to time instead of --ks")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    add_simd_argument(ap)  # caps both builds
    args = ap.parse_args()
    simd = args.simd or ""
    procs = {name: start(d, args.model, args.threads, simd) for name, d in (("a", args.a), ("b", args.b))}
    result = {"a": args.a or "installed", "b": args.b, "load_before": os.getloadavg(), "runs": []}
    for k in [-p for p in args.prompts] or args.ks:
        times: dict[str, list[float]] = {name: [] for name in procs}
        for proc in procs.values():
            steps(proc, k, 1 if k < 0 else 2)  # warm-up
        for _ in range(args.rounds):
            for name, proc in procs.items():
                times[name] += steps(proc, k, args.block)
        med = {name: 1e3 * statistics.median(v) for name, v in times.items()}
        key = {"prompt": -k} if k < 0 else {"k": k}
        result["runs"].append({**key, "step_ms": med, "b_over_a": med["b"] / med["a"]})
        print(json.dumps(result["runs"][-1]), file=sys.stderr, flush=True)
    result["load_after"] = os.getloadavg()
    for proc in procs.values():
        proc.terminate()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
