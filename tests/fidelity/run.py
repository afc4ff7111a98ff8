"""Command line: `python -m fidelity.run --seed 0 --fixtures 60` (from tests/) runs the fuzz
outside pytest and prints one line per failing text and a JSON summary."""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

from .cases import draw
from .runner import run_fixture


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--fixtures", type=int, default=40)
    ap.add_argument("--no-diagnose", action="store_true")
    args = ap.parse_args()
    t0 = time.monotonic()
    per_arch: collections.Counter[str] = collections.Counter()
    failed, identical, cases, claimed = [], 0, 0, 0
    with tempfile.TemporaryDirectory() as d:
        for index in range(args.start, args.start + args.fixtures):
            fx = draw(args.seed, index)
            try:
                outs = run_fixture(fx, Path(d), diagnose=not args.no_diagnose)
            except Exception as e:  # a fixture that does not build or load is a finding too
                print(f"ERROR {fx.id}: {type(e).__name__}: {e}", flush=True)
                failed.append(fx.id)
                continue
            print(f"{fx.id}: {len(outs)} texts, {time.monotonic() - t0:.0f} s", flush=True)
            for o in outs:
                cases += 1
                per_arch[f"{fx.arch}/{fx.qtype}"] += 1
                identical += o.bit_identical
                claimed += o.claimed_bits
                if not o.passed:
                    failed.append(o.fixture)
                    print("FAIL", o.describe(), flush=True)
    summary = {"seed": args.seed, "fixtures": args.fixtures, "cases": cases, "bit_identical": identical}
    summary["claimed_bit_identical"] = claimed
    summary |= {"failed": len(failed), "seconds": round(time.monotonic() - t0, 1), "per_arch_qtype": dict(per_arch)}
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
