"""Dense GPU matmul kernels alone: GPU time per matmul of the fast-numerics kernel (matmul_fast)
and the exact one (matmul, the CPU's order), with the activation quantization they need, per
weight format, weight shape and number of activation rows, and the weight bytes per second that
makes. GPU time from wgpu timestamp queries (wall time per call, labelled, where the adapter has
none). On a software adapter (Mesa's lavapipe) the figures are CPU emulation, not GPU speeds.

    python bench/gpu_matvec_bench.py [--adapter NAME] [--types Q4_K Q6_K ...] [--shapes 1024x3584 ...]
                                     [--batch 1 4 16 512] [--repeats 20] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import hyserve_kernels as hk
import numpy as np
from gguf import GGMLQuantizationType as T

from hyserve.logging_setup import configure_logging

# block bytes, elements per block, offsets of the block's f16 scales
BLOCKS = {
    T.Q4_0: (18, 32, [0]),
    T.Q4_1: (20, 32, [0, 2]),
    T.Q5_0: (22, 32, [0]),
    T.Q5_1: (24, 32, [0, 2]),
    T.Q8_0: (34, 32, [0]),
    T.Q4_K: (144, 256, [0, 2]),
    T.Q5_K: (176, 256, [0, 2]),
    T.Q6_K: (210, 256, [208]),
}


def weight(t: T, rows: int, cols: int, rng: np.random.Generator) -> tuple[hk.QMatrix, int]:
    """Random weights (random block bytes with small finite f16 scales, or random floats) and their
    bytes."""
    if t in BLOCKS:
        size, per, scales = BLOCKS[t]
        blocks = rng.integers(0, 256, size=(rows * cols // per, size), dtype=np.uint8)
        for at in scales:
            blocks[:, at : at + 2] = np.full(len(blocks), 0.004, np.float16).view(np.uint8).reshape(-1, 2)
        data = blocks.reshape(-1)
    else:
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        if t == T.F16:
            values = values.astype(np.float16)
        elif t == T.BF16:
            values = (values.view(np.uint32) >> 16).astype(np.uint16)
        data = values.view(np.uint8).reshape(-1)
    return hk.QMatrix(np.ascontiguousarray(data), int(t), rows, cols), len(data)


def time_matmul(dev, w, x, repeats: int) -> dict:
    """GPU seconds per matmul call and its passes per kernel, or wall seconds per call."""
    ts = hk.GpuTimestamps(dev)
    dev.to_host(dev.matmul(w, x))  # pipelines built, buffers pooled
    if not ts.supported:
        start = time.perf_counter()
        for _ in range(repeats):
            dev.to_host(dev.matmul(w, x))
        return {"wall_s": (time.perf_counter() - start) / repeats}
    ts.start()
    try:
        ts.take()
        outs = [dev.matmul(w, x) for _ in range(repeats)]
        dev.to_host(outs[-1])
        totals, untimed = ts.take()
    finally:
        ts.stop()
    return {
        "gpu_s": sum(t for t, _ in totals.values()) / repeats,
        "kernel_s": {k: t / repeats for k, (t, _) in sorted(totals.items())},
        "passes": {k: n // repeats for k, (_, n) in sorted(totals.items())},
        "untimed_passes": untimed,
    }


def main() -> None:
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adapter", default=None, help="GPU adapter name substring")
    p.add_argument("--types", nargs="+", default=["F32", "F16", "BF16", *[t.name for t in BLOCKS]])
    p.add_argument("--shapes", nargs="+", default=["1024x1024", "3584x1024", "1024x3584"], help="ROWSxCOLS")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 512], help="activation rows")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--name", default="gpu_matvec_bench")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    result: dict = {"date": time.strftime("%Y-%m-%d"), "runs": []}
    for numerics in ("fast", "exact"):
        dev = hk.GpuDevice(None, args.adapter, allow_software=True, numerics=numerics)
        result["adapter"], result["software_adapter"] = dev.name, dev.is_software
        for name in args.types:
            t = T[name]
            for shape in args.shapes:
                rows, cols = (int(v) for v in shape.split("x"))
                m, weight_bytes = weight(t, rows, cols, rng)
                w = dev.matrix(m)
                for n in args.batch:
                    x = dev.tensor(rng.standard_normal((n, cols)).astype(np.float32))
                    run = {"numerics": numerics, "type": name, "rows": rows, "cols": cols, "n": n}
                    run.update(time_matmul(dev, w, x, args.repeats))
                    secs = run.get("gpu_s", run.get("wall_s"))
                    run["weight_gb_s"] = weight_bytes / secs / 1e9 if secs else None
                    result["runs"].append(run)
                    print(json.dumps(run), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
