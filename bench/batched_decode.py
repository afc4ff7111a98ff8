"""Batched decode: one step of k sequences x 1 token, hyserve against llama.cpp, same file, same run.

For each k: k sequences get a 64-token prompt each (different prompts), then every step evaluates
one token per sequence: one `arch.forward` over k single-token segments (hyserve) against one
`llama_decode` of a k-sequence batch (llama-cpp-python's low-level API, stock context settings
apart from the sizes and threads). Only the forward / decode call is timed; the next tokens are the
greedy ones of each side's own logits. Blocks of `--block` steps alternate between the engines
(alternating single steps would penalise whichever engine runs right after llama.cpp, whose
threads spin after each decode); per k and engine the median step time over all blocks.

Prints JSON and writes JSON + PNG: per k both medians, llama.cpp / hyserve (> 1: hyserve faster),
the per-block paired ratio, and each engine's step time relative to its own k = 1 step.

    python bench/batched_decode.py [--model default|PATH] [--ks 1 2 4 8 16] [--threads 2]
        [--rounds 5] [--block 10] [--name batched_decode_gemma3_270m]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from report import add_simd_argument, instruction_sets

from hyserve.logging_setup import configure_logging

PROMPT_LEN = 64
TEXTS = [
    "The history of computing is a story of abstraction layered on abstraction. ",
    "Rivers carve their valleys over millions of years, grain by grain, flood by flood. ",
    "A good recipe for bread needs flour, water, salt, yeast and above all patience. ",
    "In the early morning the harbour was quiet except for the gulls and the tide. ",
]


def prompts(tokenize: Callable[[str], list[int]], k: int) -> list[list[int]]:
    """k different 64-token prompts (a numbered preamble keeps them apart)."""
    out = []
    for i in range(k):
        text = f"Story {i + 1}. " + TEXTS[i % len(TEXTS)]
        while len(tokenize(text)) < PROMPT_LEN:
            text += TEXTS[(i + len(text)) % len(TEXTS)]
        out.append(tokenize(text)[:PROMPT_LEN])
    return out


class HyserveSide:
    name = "hyserve"

    def __init__(self, model_arg: str, threads: int, model: Any = None) -> None:
        """`model`: an already loaded model (any device) instead of loading `model_arg` on the CPU."""
        import hyserve_kernels as hk

        from hyserve.model.loader import load_model

        hk.set_num_threads(threads)
        self.model = model if model is not None else load_model(model_arg)

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenizer.encode(text)

    def start(self, prompts: list[list[int]], n_ctx: int) -> None:
        from hyserve.model.architectures.base import Logits, Segment

        arch = self.model.arch
        self.mems = [arch.new_memory(n_ctx) for _ in prompts]
        self.next = []
        for mem, p in zip(self.mems, prompts):
            logits = arch.forward([Segment(mem, np.asarray(p, np.int32), Logits.LAST)])[0]
            self.next.append(int(np.argmax(logits)))

    def step(self) -> float:
        from hyserve.model.architectures.base import Logits, Segment

        # greedy decoding as the server runs it: the forward returns each row's greedy token
        segs = [Segment(m, np.array([t], np.int32), Logits.ARGMAX) for m, t in zip(self.mems, self.next)]
        t0 = time.perf_counter()
        out = self.model.arch.forward(segs)
        dt = time.perf_counter() - t0
        self.next = [int(token[0]) for token in out]
        return dt

    def stop(self) -> None:
        self.mems = []


class LlamaSide:
    name = "llama.cpp"

    def __init__(self, path: str, threads: int, n_gpu_layers: int = 0, model: Any = None) -> None:
        """`n_gpu_layers`: layers offloaded to a GPU build's device (-1: all); 0 on the CPU build,
        which is also kept quiet (its log lines cost time). `model`: an already loaded llama_model
        (a second load of the same file in one process segfaulted in a CUDA build)."""
        import llama_cpp
        import llama_cpp._logger

        if n_gpu_layers == 0:
            llama_cpp._logger.set_verbose(False)
        self.lc = llama_cpp
        self.threads = threads
        llama_cpp.llama_backend_init()
        if model is None:
            model_params = llama_cpp.llama_model_default_params()
            model_params.n_gpu_layers = n_gpu_layers
            model = llama_cpp.llama_model_load_from_file(path.encode(), model_params)
        self.model = model
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.version = llama_cpp.__version__
        self.ctx = None

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        buf = (self.lc.llama_token * (len(raw) + 8))()
        n = self.lc.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, False)
        return list(buf[:n])

    def _decode(self, entries: list[tuple[int, int, int]]) -> None:
        """One llama_decode of (token, position, sequence) entries, logits for every entry."""
        b = self.batch
        for i, (tok, pos, seq) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, 1
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        rc = self.lc.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.lc.llama_synchronize(self.ctx)  # a GPU backend returns before the device is done

    def _argmax(self, i: int) -> int:
        ptr = self.lc.llama_get_logits_ith(self.ctx, i)
        row = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self.n_vocab,))
        return int(np.argmax(row))

    def start(self, prompts: list[list[int]], n_ctx: int) -> None:
        lc, k = self.lc, len(prompts)
        params = lc.llama_context_default_params()
        params.n_ctx = k * n_ctx
        params.n_batch = max(PROMPT_LEN, k)
        params.n_ubatch = max(PROMPT_LEN, k)
        params.n_seq_max = k
        params.n_threads = params.n_threads_batch = self.threads
        self.ctx = lc.llama_init_from_model(self.model, params)
        self.batch = lc.llama_batch_init(max(PROMPT_LEN, k), 0, k)
        self.next, self.pos = [], []
        for s, p in enumerate(prompts):
            self._decode([(t, i, s) for i, t in enumerate(p)])
            self.next.append(self._argmax(len(p) - 1))
            self.pos.append(len(p))

    def step(self) -> float:
        entries = [(t, p, s) for s, (t, p) in enumerate(zip(self.next, self.pos))]
        t0 = time.perf_counter()
        self._decode(entries)
        dt = time.perf_counter() - t0
        self.next = [self._argmax(i) for i in range(len(entries))]
        self.pos = [p + 1 for p in self.pos]
        return dt

    def stop(self) -> None:
        self.lc.llama_batch_free(self.batch)
        self.lc.llama_free(self.ctx)
        self.ctx = None


def measure(sides: list, k: int, rounds: int, block: int, warmup: int) -> dict:
    """Both sides hold k sequences; `rounds` x (a block of steps per side, alternating)."""
    n_ctx = PROMPT_LEN + warmup + rounds * block + 8
    for side in sides:
        side.start(prompts(sides[0].tokenize, k), n_ctx)
        for _ in range(warmup):
            side.step()
    times: dict[str, list[float]] = {s.name: [] for s in sides}
    block_medians: dict[str, list[float]] = {s.name: [] for s in sides}
    for _ in range(rounds):
        for side in sides:
            got = [side.step() for _ in range(block)]
            times[side.name] += got
            block_medians[side.name].append(statistics.median(got))
    for side in sides:
        side.stop()
    med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    paired = [a / b for a, b in zip(block_medians["llama.cpp"], block_medians["hyserve"])]
    return {
        "k": k,
        "step_ms": med,
        "ratio": med["llama.cpp"] / med["hyserve"],
        "paired_ratio": statistics.median(paired),
        "block_ratios": paired,
        "samples_ms": {name: [x * 1e3 for x in v] for name, v in times.items()},
    }


def draw(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["k"] for r in result["runs"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for name, color in [("hyserve", "#2a7ab0"), ("llama.cpp", "#999999")]:
        axes[0].plot(ks, [r["step_ms"][name] for r in result["runs"]], "o-", color=color, label=name)
        axes[1].plot(ks, [r["step_ms"][name] / result["runs"][0]["step_ms"][name] for r in result["runs"]], "o-",
                     color=color, label=name)  # fmt: skip
    axes[1].plot(ks, ks, ":", color="#cc5555", label="k separate steps")
    axes[0].set(xscale="log", xticks=ks, xticklabels=ks, xlabel="sequences per step (k)", ylabel="ms per step")
    axes[1].set(xscale="log", yscale="log", xticks=ks, xticklabels=ks, xlabel="k", ylabel="step / own k=1 step")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    ratios = ", ".join(f"k={r['k']}: {r['ratio']:.2f}x" for r in result["runs"])
    fig.suptitle(
        f"{result['model']} · {result['threads']} threads · llama.cpp / hyserve step time: {ratios}", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--name", default="batched_decode_gemma3_270m")
    add_simd_argument(ap)
    args = ap.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    isa = instruction_sets(args.simd)

    from hyserve.model.loader import resolve_model_path

    path = str(resolve_model_path(args.model))
    ours = HyserveSide(args.model, args.threads)
    llama = LlamaSide(path, args.threads)
    load_before = os.getloadavg()
    runs = [measure([llama, ours], k, args.rounds, args.block, args.warmup) for k in args.ks]
    base = {name: runs[0]["step_ms"][name] for name in ("hyserve", "llama.cpp")}
    for r in runs:
        r["vs_own_first_k"] = {name: r["step_ms"][name] / base[name] for name in base}
    result = {
        "model": Path(path).name,
        "threads": args.threads,
        "prompt_len": PROMPT_LEN,
        "rounds": args.rounds,
        "block": args.block,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            # other work on a shared machine slows compute-bound steps (large k) most
            "loadavg_before_after": [load_before, os.getloadavg()],
        },
        **isa,
        "llama_cpp_version": llama.version,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    draw(result, args.out / f"{args.name}.png")
    summary = {r["k"]: {**r["step_ms"], "ratio": r["ratio"], "paired": r["paired_ratio"], **{
        f"vs_k{args.ks[0]}_{n}": v for n, v in r["vs_own_first_k"].items()}} for r in runs}  # fmt: skip
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
