"""How long a hostile constraint can hold up the rest of the server while it compiles.

Constraints compile on the API's preparation threads, never on the engine thread; what could still
stall the engine is the compile holding the GIL. This compiles each hostile source of
tests/test_constraints.py (deep nesting, a 15,000-value enum, an anyOf product, $ref fan-out,
3,000 required properties, counted repetitions, deep Lark) against the model's vocabulary while a
second Python thread ticks every millisecond, and reports each compile's time and outcome and the
longest gap the ticking thread saw (the worst stall any Python thread, such as the engine's, can
suffer during that compile).

    python bench/constraint_stall.py [--model default] [--out bench/results]
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

from report import publish
from test_constraints import HOSTILE

from hyserve.engine.constraints import ConstraintError, ConstraintSpec, GrammarCompiler
from hyserve.logging_setup import configure_logging
from hyserve.model.loader import load_model


class Ticker:
    """A Python thread that wakes every millisecond; `longest` is its longest gap since `reset`."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            self.longest, last = max(self.longest, now - last), now

    def reset(self) -> None:
        self.longest = 0.0

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def draw(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["sources"]
    fig, ax = plt.subplots(figsize=(9, 4))
    names = [r["name"] for r in rows]
    ax.barh(names, [r["compile_ms"] for r in rows], label="compile (ms)")
    ax.barh(names, [r["longest_gap_ms"] for r in rows], label="longest gap of another Python thread (ms)")
    ax.set_xscale("log")
    ax.set_title(f"Hostile constraints on {result['model']}: compile time and stall")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--name", default="constraint_stall")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()
    model = load_model(args.model)
    compiler = GrammarCompiler(model.tokenizer, model.arch.n_vocab)
    t0 = time.perf_counter()
    compiler.lltokenizer()
    vocab_s = time.perf_counter() - t0
    ticker = Ticker()
    rows = []
    for name, (kind, source) in HOSTILE.items():
        ticker.reset()
        t0 = time.perf_counter()
        try:
            compiler.compile(ConstraintSpec(kind, source, "sampling.constraint"))  # type: ignore[arg-type]
            outcome = "compiled"
        except ConstraintError:
            outcome = "refused"
        elapsed = time.perf_counter() - t0
        rows.append(
            {
                "name": name,
                "kind": kind,
                "outcome": outcome,
                "compile_ms": round(elapsed * 1000, 2),
                "longest_gap_ms": round(ticker.longest * 1000, 2),
            }
        )
    ticker.close()
    result = {
        "model": model.path.name if hasattr(model, "path") else str(args.model),
        "n_vocab": model.arch.n_vocab,
        "vocabulary_build_s": round(vocab_s, 3),
        "sources": rows,
        "worst_gap_ms": max(r["longest_gap_ms"] for r in rows),
    }
    publish(result, args.out, args.name, draw)


if __name__ == "__main__":
    main()
