"""Speculative decoding benchmark: decode tok/s with and without speculation, side by side with
llama.cpp's prompt lookup decoding (`llama_cpp.llama_speculative.LlamaPromptLookupDecoding`) on the
same prompts, greedy, in one run.

Gemma 3 270M (n-gram drafts): a copy-heavy edit (a function rewritten with a small fix), a summary
of a document, free story text. The realistic qwen35 (random weights, so its text does not copy):
n-gram drafts, oracle drafts (the target's own greedy continuation: the most speculation can gain),
wrong drafts (never accepted: what a rollback costs per drafted token) and a draft model
(`--spec draft`: a 2-layer random qwen35 with the target's vocabulary, so its drafts rarely agree
and the figure is the cost of drafting and rolling back both memories).

Decode tok/s counts the generated tokens after the first over the time from the first token to the
last (prompt processing excluded); each side's samples alternate with the others'. hyserve's
speculative output is checked against its plain output (`identical`).

    python bench/spec_bench.py [--max-tokens 128] [--rounds 2] [--qwen35 PATH] [--qwen35-draft PATH]
        [--out bench/results]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fixtures import make_models
from report import instruction_sets, publish

from hyserve.engine.draft_model import load_draft_model
from hyserve.engine.generator import SpecConfig, SpecStats, StopRule, generate
from hyserve.engine.sampling import SamplingParams
from hyserve.logging_setup import configure_logging
from hyserve.model.loader import LoadedModel, load_model

SOURCE = '''def parse_config(path):
    """Read a key=value file into a dict, skipping comments and blank lines."""
    result = {}
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, value = line.split("=", 1)
            result[key.strip()] = value.strip()
    return result
'''
DOCUMENT = (
    "The river town of Alder Bend grew around a ferry crossing in the eighteenth century. A stone "
    "bridge replaced the ferry in 1851, and the town's mills turned wool into cloth until the 1920s, "
    "when the last mill closed. Today Alder Bend is known for its autumn market, its restored mill "
    "museum and the bridge, which still carries traffic. The town council plans to add a cycle path "
    "along the river and to reopen the old ferry landing as a park."
)
GEMMA_PROMPTS = {
    "copy_edit": "Here is a Python function:\n\n" + SOURCE + "\nRewrite it so that keys are lowercased. "
    "Output the whole function.",
    "summary": "Summarise this text in three sentences, keeping its facts:\n\n" + DOCUMENT,
    "free_text": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}
SPEC = SpecConfig(max_draft=8)


def chat_tokens(model: LoadedModel, text: str) -> list[int]:
    rendered = model.chat_template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    return model.tokenizer.encode(rendered.text, add_special=False, parse_special=True)


def decode_rate(stream: Iterator[object]) -> tuple[float, int]:
    """(tokens/s after the first token, tokens) of a token stream."""
    first = None
    n = 0
    for _ in stream:
        n += 1
        if first is None:
            first = time.perf_counter()
    if first is None or n < 2:
        return 0.0, n
    return (n - 1) / (time.perf_counter() - first), n


class ScriptedDrafter:
    """Drafts from a known continuation: the target's own (oracle) or shifted by one (wrong)."""

    def __init__(self, continuation: list[int], prompt_len: int, wrong: bool) -> None:
        self.continuation, self.prompt_len, self.wrong, self.n = continuation, prompt_len, wrong, 0

    def extend(self, tokens: list[int]) -> None:
        self.n += len(tokens)

    def propose(self, k: int) -> list[int]:
        at = self.n - self.prompt_len
        draft = self.continuation[at : at + k]
        return [t + 1 for t in draft] if self.wrong else draft


def hyserve_side(model: LoadedModel, prompt: list[int], n: int, spec: SpecConfig | None, drafter=None):
    stats = SpecStats()
    out: list[int] = []

    def tokens() -> Iterator[int]:
        out.clear()
        stats.__init__()
        made = drafter() if drafter else None
        rule = StopRule(max_tokens=n)
        for g in generate(model, prompt, SamplingParams(), rule, n_ctx=2048, spec=spec, spec_stats=stats, drafter=made):
            out.append(g.token_id)
            yield g.token_id

    def run() -> float:
        rate, _ = decode_rate(tokens())
        return rate

    return run, out, stats


def llama_side(llm, prompt: list[int], n: int) -> Callable[[], float]:
    def run() -> float:
        llm.reset()
        # greedy as top_k=1: with temperature 0 alone the sampler still sorts 40 candidates per token
        rate, _ = decode_rate(llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1, stream=True))
        return rate

    return run


def interleave(sides: dict[str, Callable[[], float]], rounds: int, record: dict | None = None) -> dict[str, float]:
    """Medians of `rounds` alternating samples per side; `record` gets the samples themselves (the
    spread says how quiet the machine was)."""
    for run in sides.values():  # warm-up
        run()
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            samples[name].append(run())
    if record is not None:
        record["decode_tok_s_samples"] = {name: [round(x, 2) for x in s] for name, s in samples.items()}
    return {name: statistics.median(s) for name, s in samples.items()}


def bench_gemma(args: argparse.Namespace) -> dict:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    model = load_model("default")
    path = str(model.path)
    plain = llama_cpp.Llama(path, n_ctx=2048, n_threads=args.threads, verbose=False)
    lookup = llama_cpp.Llama(
        path,
        n_ctx=2048,
        n_threads=args.threads,
        verbose=False,
        draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10),
    )
    cases = {}
    for name, text in GEMMA_PROMPTS.items():
        prompt = chat_tokens(model, text)
        samples: dict = {}
        ours_plain, plain_out, _ = hyserve_side(model, prompt, args.max_tokens, None)
        ours_spec, spec_out, stats = hyserve_side(model, prompt, args.max_tokens, SPEC)
        rates = interleave(
            {
                "hyserve": ours_plain,
                "hyserve_ngram": ours_spec,
                "llama_cpp": llama_side(plain, prompt, args.max_tokens),
                "llama_cpp_prompt_lookup": llama_side(lookup, prompt, args.max_tokens),
            },
            args.rounds,
            samples,
        )
        cases[name] = {
            "prompt_tokens": len(prompt),
            "decode_tok_s": rates,
            "hyserve_speedup": rates["hyserve_ngram"] / rates["hyserve"],
            "llama_cpp_speedup": rates["llama_cpp_prompt_lookup"] / rates["llama_cpp"],
            "hyserve_ngram_over_llama_cpp_lookup": rates["hyserve_ngram"] / rates["llama_cpp_prompt_lookup"],
            "drafted": stats.drafted,
            "accepted": stats.accepted,
            "identical": spec_out == plain_out,
            **samples,
        }
    return {"model": "Gemma 3 270M Q4_K_M", "cases": cases}


def bench_qwen35(args: argparse.Namespace) -> dict | None:
    if not args.qwen35.exists():
        return None
    model = load_model(args.qwen35)
    prompt = model.tokenizer.encode(DOCUMENT)
    plain, plain_out, _ = hyserve_side(model, prompt, args.max_tokens, None)
    plain()
    continuation = list(plain_out)
    sides, outputs = {"plain": plain}, {}
    draft_path = (
        args.qwen35_draft if args.qwen35_draft.exists() else make_models.realistic_qwen35_draft(args.qwen35_draft)
    )
    draft_spec = SpecConfig(
        method="draft", max_draft=SPEC.max_draft, draft=load_draft_model(draft_path, model.arch, model.tokenizer)
    )
    for name, drafter, spec in (
        ("ngram", None, SPEC),
        ("oracle", lambda: ScriptedDrafter(continuation, len(prompt), wrong=False), SPEC),
        ("wrong", lambda: ScriptedDrafter(continuation, len(prompt), wrong=True), SPEC),
        ("draft_model", None, draft_spec),
    ):
        run, out, stats = hyserve_side(model, prompt, args.max_tokens, spec, drafter)
        sides[name] = run
        outputs[name] = (out, stats)
    samples: dict = {}
    rates = interleave(sides, args.rounds, samples)
    wrong_stats = outputs["wrong"][1]
    n = args.max_tokens - 1
    return {
        "model": str(args.qwen35.name),
        "prompt_tokens": len(prompt),
        "decode_tok_s": rates,
        "speedup": {name: rates[name] / rates["plain"] for name in rates if name != "plain"},
        "drafted_accepted": {name: [s.drafted, s.accepted] for name, (_, s) in outputs.items()},
        "identical": {name: out == continuation for name, (out, _) in outputs.items()},
        # extra time per drafted token when every draft is rejected (verify + rollback)
        "rollback_ms_per_drafted_token": 1e3 * (n / rates["wrong"] - n / rates["plain"]) / max(wrong_stats.drafted, 1),
        **samples,
        "draft_model": f"{draft_path.name}: random weights, the target's vocabulary (its drafts rarely agree)",
    }


def draw(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = result["gemma"]["cases"]
    names = list(cases)
    sides = ["hyserve", "hyserve_ngram", "llama_cpp", "llama_cpp_prompt_lookup"]
    colors = ["#8fbf8f", "tab:green", "#bbbbbb", "#777777"]
    fig, ax = plt.subplots(figsize=(8, 4))
    for i, (side, color) in enumerate(zip(sides, colors)):
        ax.bar([j + 0.2 * i for j in range(len(names))], [cases[c]["decode_tok_s"][side] for c in names], 0.2,
               color=color, label=side)  # fmt: skip
    ax.set_xticks([j + 0.3 for j in range(len(names))], names)
    ax.set_ylabel("decode tokens/s (greedy)")
    ax.set_title("Gemma 3 270M: speculative decoding (n-gram) vs llama.cpp prompt lookup", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--qwen35", type=Path, default=Path.home() / ".cache/hyserve/models/realistic_qwen35_q4km.gguf")
    p.add_argument(
        "--qwen35-draft",
        type=Path,
        default=Path.home() / ".cache/hyserve/models/realistic_qwen35_draft_q8.gguf",
        help="draft model of the realistic qwen35 (made by make_models.realistic_qwen35_draft when absent)",
    )
    p.add_argument("--name", default="spec_bench")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    import hyserve_kernels as hk

    hk.set_num_threads(args.threads)
    result = {"instruction_sets": instruction_sets(None), "max_tokens": args.max_tokens, "rounds": args.rounds}
    result["gemma"] = bench_gemma(args)
    result["realistic_qwen35"] = bench_qwen35(args)
    publish(result, args.out, args.name, draw)


if __name__ == "__main__":
    main()
