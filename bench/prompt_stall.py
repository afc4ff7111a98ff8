"""How much a big text prompt stalls another, running stream: a real `hyserve serve` (--parallel 2,
--ctx-size 4096), a greedy canary stream, and one text of `--text-mb` MB sent beside it (refused
for its length after tokenizing, or for its size before). Prints JSON: the canary's inter-token
gaps before and while the text was handled, the text's status and how long it took.

    python bench/prompt_stall.py --text-mb 1 [--server-arg=--max-prompt-bytes=2000000] [--out FILE]

Run it against another checkout by putting that checkout's service/ first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import grpc
from server_process import running_server

from hyserve.logging_setup import configure_logging
from hyserve_client import Delta, HyserveClient, HyserveError

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jolly boxers".split()


def main() -> int:
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text-mb", type=float, default=1.0)
    ap.add_argument("--server-arg", action="append", default=[], help="extra `hyserve serve` argument (repeatable)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    n_bytes = int(args.text_mb * 1_000_000)
    text = " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(n_bytes // 4))[:n_bytes]
    log = Path(tempfile.mkdtemp()) / "server.log"
    server_args = ["--model", "default", "--parallel", "2", "--ctx-size", "4096", "--threads", "2", *args.server_arg]
    with running_server(log, *server_args) as target, HyserveClient(target, timeout=600) as client:
        times: list[float] = []

        def canary() -> None:
            for event in client.generate("Once upon a time", task_id="canary", max_tokens=4000, ignore_eos=True):
                if isinstance(event, Delta):
                    times.append(time.perf_counter())

        thread = threading.Thread(target=canary, daemon=True)
        thread.start()
        while len(times) < 40:
            time.sleep(0.01)
        sent = time.perf_counter()
        try:
            client.generate_text(text, max_tokens=1)
            status = "OK"
        except HyserveError as exc:
            status = exc.code.name
        answered = time.perf_counter()
        n = len(times)
        while len(times) < n + 5:
            time.sleep(0.01)
        client.cancel("canary")
        thread.join(60)

    def gaps(start: float, end: float) -> list[float]:
        return [b - a for a, b in itertools.pairwise(times) if b > start and a < end]

    before, during = gaps(times[5], sent), gaps(sent, answered)
    result = {
        "text_bytes": n_bytes,
        "server_args": server_args,
        "status": status,
        "text_seconds": round(answered - sent, 3),
        "canary_before_ms": {"median": statistics.median(before) * 1e3, "max": max(before) * 1e3, "n": len(before)},
        "canary_during_ms": {"median": statistics.median(during) * 1e3, "max": max(during) * 1e3, "n": len(during)},
        "longest_gap_increase_ms": (max(during) - max(before)) * 1e3,
        "grpc": grpc.__version__,
    }
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
