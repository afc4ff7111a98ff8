"""Where a bench's result goes, and the tables made from the results.

`publish` writes `<out>/<name>.json` (stamped with where and when it was measured: `provenance`),
`<out>/<name>.png` and the JSON on stdout (logs go to stderr, so stdout parses as JSON).
`tables` renders every benchmark table of the documentation from `bench/results/*.json`;
`python3 docs/gen/generate.py` writes them into the README and the docs (`--check`: fail if stale).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def provenance() -> dict:
    """When, on which code and on which CPU a result was measured (what the tables show with it)."""
    commit = _git("rev-parse", "--short", "HEAD")
    if commit is not None and _git("status", "--porcelain", "--untracked-files=no", "--", "service", "rust_kernels"):
        commit += " with uncommitted changes"
    cpu = _cpu_model()
    return {
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "cpu": None if cpu is None else f"{cpu}, {os.cpu_count()} CPUs",
    }


def save(result: dict, out: Path, name: str, draw: Callable[[dict, Path], None]) -> None:
    """Write the JSON (with `provenance` added) and the PNG."""
    out.mkdir(parents=True, exist_ok=True)
    result.setdefault("provenance", provenance())
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    draw(result, out / f"{name}.png")


def publish(result: dict, out: Path, name: str, draw: Callable[[dict, Path], None], shown: dict | None = None) -> None:
    """`save`, then print `shown` (default: the whole result) as JSON."""
    save(result, out, name, draw)
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


def tables(directory: Path | None = None) -> dict[str, str]:
    """Every generated benchmark table, by the name of the block it fills in the README and docs."""
    from report_tables import fidelity as fid
    from report_tables import speed
    from report_tables.records import RESULTS, Results

    r = Results(directory or RESULTS)
    return {
        "bench-headline": speed.headline(r),
        "bench-runtime-same-isa": speed.runtime(r, speed.SAME_ISA[:3]),
        "bench-runtime-newest": speed.runtime(r, speed.NEWEST[:4]),
        "bench-batched-same-isa": speed.batched(r, speed.SAME_ISA[3:]),
        "bench-batched-newest": speed.batched(r, speed.NEWEST[4:]),
        "bench-serve": speed.serve(r, speed.SERVE_NEWEST),
        "bench-load": speed.load(r),
        "bench-engine": speed.engine(r),
        "bench-gpu": speed.gpu(r),
        "history-runtime": speed.history_runtime(r),
        "history-batched": speed.history_batched(r),
        "history-serve": speed.history_serve(r),
        "history-load": speed.history_load(r),
        "history-engine": speed.history_engine(r),
        "oracle-report": fid.oracle(r),
        "gpu-agreement-lavapipe": fid.gpu_agreement(r, ["gpu_agreement", "gpu_agreement_matrix"]),
        "gpu-agreement-h200": fid.gpu_agreement(r, ["gpu_agreement_matrix_h200", "gpu_agreement_matrix_h200_before"]),
        "gpu-agreement-h100": fid.gpu_agreement(r, ["gpu_agreement_h100"]),
        "agent-replay": fid.agent_replay(r),
        "replica-memory": fid.replica_memory(r),
    }
