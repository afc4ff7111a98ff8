"""What an exact resume at any position costs, per mechanism, on one model.

For recurrent/hybrid memory (and ring-buffer window layers) a state exists only where it was
saved. Two ways to reach any position inside recent history:
- dense checkpoints: a full copy of the non-truncatable state at every position (bytes per
  position = one checkpoint), and prompt chunks cut at every one of them;
- kept inputs: what each recurrent layer's conv/scan consumed per token (and a ring layer's K/V),
  replayed from the checkpoint before the position by those kernels alone (`Architecture.replay`).

Prints JSON: bytes per position of each, the attention KV bytes per position (kept anyway), and
the time of a forward over N tokens against a replay over the same N tokens (median of --repeats).

    python bench/resume_cost.py --model PATH [--tokens 128] [--ring] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import hyserve_kernels as hk
import numpy as np

from hyserve.engine.input_log import InputLog
from hyserve.logging_setup import configure_logging
from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.loader import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ring", action="store_true", help="sliding-window layers as rings (--swa-cache ring)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    args = ap.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    hk.set_num_threads(args.threads)
    model = load_model(args.model)
    arch, n = model.arch, args.tokens
    tokens = np.random.default_rng(0).integers(100, min(arch.n_vocab, 20000), size=n).astype(np.int32)

    def new_memory():
        memory = arch.new_memory(max(4 * n, 1024))
        if args.ring:
            memory.use_window_rings(arch.sliding_windows(), 128)
        return memory

    forward_s, replay_s = [], []
    for _ in range(args.repeats):
        memory, log = new_memory(), InputLog()
        start = time.perf_counter()
        for i in range(0, n, 128):
            seg = Segment(memory, tokens[i : i + 128], Logits.NONE, {})
            arch.forward([seg])
            log.record(i, seg.inputs or {}, turn=0)
        forward_s.append(time.perf_counter() - start)
        snap = memory.snapshot()
        replayed = new_memory()
        start = time.perf_counter()
        arch.replay(replayed, log.rows(0, n))
        replay_s.append(time.perf_counter() - start)
        assert all(
            np.array_equal(a, b) for il in snap.states for a, b in zip(snap.states[il], replayed.snapshot().states[il])
        ), "replay != forward"
    kv_per_token = sum(c.k[0].nbytes + c.v[0].nbytes for c in memory.kv.values() if not hasattr(c, "capacity"))
    result = {
        "model": f"{model.gguf.architecture} {model.path.name}",
        "ring": args.ring,
        "threads": args.threads,
        "tokens": n,
        "checkpoint_bytes": snap.nbytes,
        "dense_checkpoints_bytes_per_token": snap.nbytes,
        "kept_inputs_bytes_per_token": log.nbytes // n,
        "attention_kv_bytes_per_token": kv_per_token,
        "forward_s_median": round(statistics.median(forward_s), 4),
        "replay_s_median": round(statistics.median(replay_s), 4),
        "replay_over_forward": round(statistics.median(replay_s) / statistics.median(forward_s), 4),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
