"""CPU runtime benchmark: hyserve vs llama.cpp (llama-cpp-python) on the same GGUF, same threads.

Measures, in one run and one process: model load time, prompt processing tok/s on a 512-token
prompt, and greedy generation tok/s over 128 tokens. Both engines are loaded first and their timed
samples alternate (llama.cpp prompt, hyserve prompt, llama.cpp generation, hyserve generation, per
repeat), so load from other work on a shared machine hits both sides alike. Prints JSON with the
ratios (ours / llama.cpp, from the medians; `paired_ratios` has the median of per-repeat ratios)
and writes JSON + a PNG bar chart.

    python bench/runtime_bench.py [--model default|PATH] [--threads 2] [--out bench/results]
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from report import add_simd_argument, instruction_sets, publish

from hyserve.logging_setup import configure_logging

PROMPT_SEED_TEXT = (
    "The history of computing is a story of abstraction layered on abstraction. Early machines were "
    "programmed by rewiring panels; later, stored programs let the same hardware run many tasks. "
)


class Side:
    """One engine, loaded: its load time, timed prompt/generation callables and extra fields."""

    def __init__(self, load_s: float, pp: Callable[[], float], tg: Callable[[], float], extra: dict) -> None:
        self.load_s, self.pp, self.tg, self.extra = load_s, pp, tg, extra
        self.pp_all: list[float] = []
        self.tg_all: list[float] = []

    def result(self, n_prompt: int, n_gen: int) -> dict:
        return {
            "load_s": self.load_s,
            "prompt_tok_s": n_prompt / statistics.median(self.pp_all),
            "gen_tok_s": n_gen / statistics.median(self.tg_all),
            "prompt_samples_s": self.pp_all,
            "gen_samples_s": self.tg_all,
            **self.extra,
        }


def run_interleaved(sides: list[Side], repeats: int) -> None:
    """Warm up each side (pages in the weights), then alternate the sides' timed samples."""
    for side in sides:
        side.pp()
    for _ in range(repeats):
        for side in sides:
            side.pp_all.append(side.pp())
        for side in sides:
            side.tg_all.append(side.tg())


def prompt_tokens(tokenize: Callable[[str], list[int]], n: int) -> list[int]:
    text = PROMPT_SEED_TEXT
    while len(tokenize(text)) < n:
        text += PROMPT_SEED_TEXT
    return tokenize(text)[:n]


def setup_hyserve(model_arg: str, threads: int, n_prompt: int, n_gen: int) -> Side:
    import hyserve_kernels as hk

    from hyserve.model.architectures.base import Logits, Segment
    from hyserve.model.loader import load_model

    hk.set_num_threads(threads)
    start = time.perf_counter()
    model = load_model(model_arg)
    load_s = time.perf_counter() - start
    arch = model.arch
    tokens = prompt_tokens(lambda s: model.tokenizer.encode(s), n_prompt)

    def pp() -> float:
        mem = arch.new_memory(n_prompt + n_gen + 8)
        t = time.perf_counter()
        arch.forward([Segment(mem, np.asarray(tokens, np.int32), Logits.LAST)])
        return time.perf_counter() - t

    def tg() -> float:
        mem = arch.new_memory(n_prompt + n_gen + 8)
        logits = arch.forward([Segment(mem, np.asarray(tokens[:16], np.int32), Logits.LAST)])[0]
        t = time.perf_counter()
        for _ in range(n_gen):
            tok = int(np.argmax(logits))
            logits = arch.forward([Segment(mem, np.array([tok], np.int32), Logits.LAST)])[0]
        return time.perf_counter() - t

    return Side(load_s, pp, tg, {"simd": hk.simd_path(), **snapshot_costs(arch, tokens[:64])})


def snapshot_costs(arch, tokens: list[int], repeats: int = 20) -> dict:
    """Median time to snapshot and to restore a sequence's non-truncatable state (recurrent layers),
    and its size: what a prompt-cache checkpoint costs. Empty for attention-only models."""
    from hyserve.model.architectures.base import Logits, Segment

    mem = arch.new_memory(len(tokens) + 8)
    if not mem.recurrent:
        return {}
    arch.forward([Segment(mem, np.asarray(tokens, np.int32), Logits.NONE)])
    snaps, restores = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        snap = mem.snapshot()
        snaps.append(time.perf_counter() - t)
        t = time.perf_counter()
        mem.restore(snap)
        restores.append(time.perf_counter() - t)
    return {
        "snapshot_bytes": snap.nbytes,
        "snapshot_ms": statistics.median(snaps) * 1e3,
        "restore_ms": statistics.median(restores) * 1e3,
    }


def setup_llama_cpp(path: str, threads: int, n_prompt: int, n_gen: int) -> Side:
    import llama_cpp

    start = time.perf_counter()
    llm = llama_cpp.Llama(path, n_ctx=n_prompt + n_gen + 8, n_batch=512, n_threads=threads, verbose=False)
    load_s = time.perf_counter() - start
    n_vocab = llm.n_vocab()
    tokens = prompt_tokens(lambda s: llm.tokenize(s.encode(), add_bos=True), n_prompt)

    def last_logits() -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))

    def pp() -> float:
        llm.reset()
        t = time.perf_counter()
        llm.eval(tokens)
        return time.perf_counter() - t

    def tg() -> float:
        llm.reset()
        llm.eval(tokens[:16])
        t = time.perf_counter()
        for _ in range(n_gen):
            llm.eval([int(np.argmax(last_logits()))])
        return time.perf_counter() - t

    return Side(load_s, pp, tg, {"version": llama_cpp.__version__})


def draw(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [("prompt_tok_s", "prompt tok/s"), ("gen_tok_s", "generation tok/s"), ("load_s", "load s")]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    for ax, (key, label) in zip(axes, metrics):
        vals = [result["hyserve"][key], result["llama_cpp"][key]]
        bars = ax.bar(["hyserve", "llama.cpp"], vals, color=["#2a7ab0", "#999999"])
        ax.bar_label(bars, fmt="%.2f" if key == "load_s" else "%.0f")
        ax.set_title(f"{label} (ratio {result['ratios'][key]:.2f}x)")
    fig.suptitle(
        f"{result['model']} · {result['threads']} threads · "
        f"{result['n_prompt']}-token prompt, {result['n_gen']} generated"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--name", default="runtime_gemma3_270m")
    add_simd_argument(ap)
    args = ap.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    isa = instruction_sets(args.simd)

    from hyserve.model.loader import resolve_model_path

    path = str(resolve_model_path(args.model))
    llama_side = setup_llama_cpp(path, args.threads, args.n_prompt, args.n_gen)
    ours_side = setup_hyserve(path, args.threads, args.n_prompt, args.n_gen)  # the same path: no checksum of 'default'
    run_interleaved([llama_side, ours_side], args.repeats)
    llama = llama_side.result(args.n_prompt, args.n_gen)
    ours = ours_side.result(args.n_prompt, args.n_gen)
    result = {
        "model": Path(path).name,
        "threads": args.threads,
        "n_prompt": args.n_prompt,
        "n_gen": args.n_gen,
        "machine": {"cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        **isa,
        "hyserve": ours,
        "llama_cpp": llama,
        # > 1 means hyserve is faster (for load: llama.cpp's time / ours, so > 1 is also better)
        "ratios": {
            "prompt_tok_s": ours["prompt_tok_s"] / llama["prompt_tok_s"],
            "gen_tok_s": ours["gen_tok_s"] / llama["gen_tok_s"],
            "load_s": llama["load_s"] / ours["load_s"],
        },
        # median over repeats of (llama.cpp sample time / ours) for samples taken back to back
        "paired_ratios": {
            "prompt_tok_s": statistics.median(a / b for a, b in zip(llama_side.pp_all, ours_side.pp_all)),
            "gen_tok_s": statistics.median(a / b for a, b in zip(llama_side.tg_all, ours_side.tg_all)),
        },
    }
    publish(result, args.out, args.name, draw)


if __name__ == "__main__":
    main()
