"""Agreement and cache tables generated from `bench/results/*.json`: hyserve against llama.cpp
(`oracle_report`), the GPU path against the CPU path (`gpu_agreement*`), prompt tokens processed in
agent conversations (`agent_replay_*`) and the memory of one replica (`replica_memory_*`)."""

from __future__ import annotations

from collections.abc import Sequence

from report_tables.records import NONE, Results, num, pct, runs_table, sci, table


def _options(options: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in options.items()) if options else ""


def oracle(results: Results) -> str:
    run = results.run("oracle_report")
    rows = []
    for case in run.data["cases"]:
        prompts = case["prompts"]
        rows.append(
            [
                f"`{case['arch']}`",
                case["qtype"],
                _options(case.get("options", {})),
                " / ".join(str(p["tokens"]) for p in prompts),
                " / ".join(sci(p["mean_kl"]) for p in prompts),
                pct(min(p["top1"] for p in prompts)),
                "yes" if all(p["bit_identical"] for p in prompts) else "no",
            ]
        )
    worst = run.data.get("worst", {})
    header = ["architecture", "weights", "fixture options", "tokens", "mean KL", "lowest top-1", "bit-identical"]
    return "\n".join(
        [
            table(header, rows),
            "",
            f"Largest mean KL {sci(worst.get('max_mean_kl'))}, lowest top-1 {pct(worst.get('min_top1'))}.",
            "",
            runs_table([run]),
        ]
    )


def gpu_agreement(results: Results, names: Sequence[str]) -> str:
    parts = []
    runs = results.runs(names)
    for run in runs:
        features = run.data.get("features")
        adapter = run.data.get("adapter", NONE) + (f", features: {', '.join(features) or 'none'}" if features else "")
        cases = run.data["cases"]
        rows = [
            [
                c["case"],
                str(c["tokens"]),
                sci(c["mean_kl"]),
                pct(c["top1"]),
                pct(c.get("top1_up_to_ties")),
                "yes" if c["bit_identical"] else "no",
            ]
            for c in cases
        ]
        same = sum(1 for c in cases if c["bit_identical"])
        parts += [
            f"**{adapter}** (`{run.name}`): {len(cases)} cases, {same} bit-identical, largest mean KL "
            f"{sci(max(c['mean_kl'] for c in cases))}.",
            "",
            table(["case", "tokens", "mean KL(CPU ‖ GPU)", "top-1", "top-1 up to ties", "bit-identical"], rows),
            "",
        ]
    return "\n".join([*parts, runs_table(runs)])


SCENARIO_ORDER = (
    "agent_append",
    "reasoning_stripped",
    "edit_last_user",
    "regenerate",
    "interleaved",
    "edit_keep_words",
    "system_prompts_part",
    "regenerate_from_answer",
    "follow_up_repeats_answer",
)
REPLAY = (
    ("agent_replay_gemma3_270m", "Gemma 3 270M, `--swa-cache full`"),
    ("agent_replay_gemma3_270m_ring", "Gemma 3 270M, `--swa-cache ring`"),
    ("agent_replay_qwen35_08b", "realistic qwen35"),
    ("agent_replay_qwen35_08b_no_replay", "realistic qwen35, `--replay-memory 0`"),
    ("agent_replay_mamba2_tiny", "tiny mamba2 fixture"),
)


def _processed(s: dict) -> str:
    return f"{s['processed']:,} / {s['minimum']:,} = {s['processed'] / s['minimum']:.2f}"


def agent_replay(results: Results) -> str:
    runs = results.runs(name for name, _ in REPLAY)
    rows = []
    for scenario in SCENARIO_ORDER:
        first = runs[0].data["scenarios"][scenario]
        rows.append([f"{scenario} ({first['requests']})", *(_processed(r.data["scenarios"][scenario]) for r in runs)])
    rows.append([f"**all {runs[0].data['total']['requests']} requests**", *(_processed(r.data["total"]) for r in runs)])
    replays = ", ".join(
        f"{label}: {r.data['counters'].get('replayed_tokens', 0):,} positions in {r.data['counters'].get('replays', 0)}"
        for r, (_, label) in zip(runs, REPLAY)
        if r.data["counters"].get("replays")
    )
    return "\n".join(
        [
            table(["scenario (requests)", *(label for _, label in REPLAY)], rows),
            "",
            f"Cells: prompt tokens processed / the minimum = ratio. Replays of kept inputs: {replays or NONE}.",
            "",
            runs_table(runs),
        ]
    )


def replica_memory(results: Results) -> str:
    run = results.run("replica_memory_gemma3_270m")
    rows = []
    for s in run.data["shapes"]:
        idle, filled = s["idle_kib"], s["filled_kib"]
        rows.append(
            [
                f"{s['slots']} x {s['ctx_size']}",
                f"{idle['VmRSS'] / 1024:.0f} MiB ({idle['RssAnon'] / 1024:.0f} + {idle['RssFile'] / 1024:.0f})",
                f"{filled['VmRSS'] / 1024:.0f} MiB",
                f"{num(s['kib_per_token'])} KiB",
            ]
        )
    header = ["slots x context", "resident idle (anon + mapped GGUF)", "resident filled", "growth per cached token"]
    return "\n".join([table(header, rows), "", runs_table([run])])
