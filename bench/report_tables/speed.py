"""Speed tables generated from `bench/results/*.json`: hyserve against llama.cpp on the CPU (prompt,
generation, load, batched decode), serving, engine overhead, model load, the GPU path, and the
history of earlier runs. Every table is followed by where its runs were measured."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from report_tables.records import NONE, Results, Run, model_name, num, provenance_line, ratio, runs_table, table

# The runs the documentation leads with. Same ISA: hyserve capped at AVX2 (`--simd avx2`) against
# llama.cpp's AVX2 build, the like-for-like comparison. Newest: hyserve on its best path
# (AVX-512 VNNI) against the same AVX2 build of llama.cpp, so not the same instruction set.
SAME_ISA = (
    "runtime_gemma3_270m_avx2",
    "runtime_qwen35_08b_avx2",
    "runtime_qwen35_08b_prompt4096_avx2",
    "batched_decode_gemma3_270m_avx2",
    "batched_decode_qwen35_08b_avx2",
)
NEWEST = (
    "runtime_gemma3_270m_bd15f24",
    "runtime_gemma3_270m_prompt4096_bd15f24",
    "runtime_qwen35_08b_bd15f24",
    "runtime_qwen35_08b_prompt4096_bd15f24",
    "batched_decode_gemma3_270m_bd15f24",
    "batched_decode_qwen35_08b_bd15f24",
    "batched_decode_qwen35_08b_bd15f24_run2",
)
SERVE_NEWEST = ("serve_gemma3_270m_bd15f24", "serve_gemma3_270m_bd15f24_run2", "serve_gemma3_270m_bd15f24_run3")
LOAD = ("load_gemma3_270m_fresh", "load_gemma3_270m_warm")
ENGINE = ("engine_overhead", "engine_overhead_topk40")
GPU = ("gpu_bench_h200_qwen35", "gpu_bench_h100")

RATIO_NOTE = (
    "Ratio: hyserve's speed over llama.cpp's (above 1: hyserve is faster), from medians of alternating "
    "samples in one run; in brackets the median of the paired per-sample ratios. 2 threads each."
)


def _kind(run: Run) -> str:
    return "qwen35" if "qwen35" in (run.data.get("model") or "").lower() else "gemma"


def _runtime(runs: Sequence[Run], kind: str, n_prompt: int) -> Run | None:
    for r in runs:
        if r.name.startswith("runtime_") and _kind(r) == kind and r.data.get("n_prompt") == n_prompt:
            return r
    return None


def _batched(runs: Sequence[Run], kind: str) -> Run | None:
    return next((r for r in runs if r.name.startswith("batched_decode_") and _kind(r) == kind), None)


def _paired(x: float | None) -> str:
    return "" if x is None else f" ({x:.2f}x)"


Cell = tuple[str, str]  # ("hyserve / llama.cpp", "ratio")


def _speed(run: Run | None, key: str) -> Cell:
    if run is None:
        return NONE, NONE
    h, ll = run.data["hyserve"].get(key), run.data["llama_cpp"].get(key)
    r = run.data.get("ratios", {}).get(key)
    return f"{num(h)} / {num(ll)}", ratio(r) + _paired(run.data.get("paired_ratios", {}).get(key))


def _load(run: Run | None) -> Cell:
    if run is None:
        return NONE, NONE
    h, ll = run.data["hyserve"]["load_s"], run.data["llama_cpp"]["load_s"]
    return f"{num(h, 2)} / {num(ll, 2)}", ratio(run.data.get("ratios", {}).get("load_s"))


def _step(run: Run | None, k: int) -> Cell:
    if run is None:
        return NONE, NONE
    row = next((x for x in run.data["runs"] if x["k"] == k), None)
    if row is None:
        return NONE, NONE
    ms = row["step_ms"]
    return f"{num(ms['hyserve'])} / {num(ms['llama.cpp'])}", ratio(row["ratio"]) + _paired(row.get("paired_ratio"))


ROWS: list[tuple[str, Callable[[Sequence[Run], str], Cell]]] = [
    ("prompt, 512 tokens (tok/s)", lambda rs, m: _speed(_runtime(rs, m, 512), "prompt_tok_s")),
    ("prompt, 4096 tokens (tok/s)", lambda rs, m: _speed(_runtime(rs, m, 4096), "prompt_tok_s")),
    ("generation, 128 tokens (tok/s)", lambda rs, m: _speed(_runtime(rs, m, 512), "gen_tok_s")),
    ("decode step, 4 sequences (ms)", lambda rs, m: _step(_batched(rs, m), 4)),
    ("model load incl. tokenizer (s)", lambda rs, m: _load(_runtime(rs, m, 512))),
]
MODELS = (("gemma", "Gemma 3 270M"), ("qwen35", "realistic qwen35"))


def headline(results: Results) -> str:
    """The one table the README shows: same-ISA ratios first, the newest (unequal-ISA) run beside."""
    same, newest = results.runs(SAME_ISA), results.runs(NEWEST[:6])
    rows = []
    for kind, label in MODELS:
        for what, cell in ROWS:
            s, n = cell(same, kind), cell(newest, kind)
            rows.append([f"{label}: {what}", *s, *n])
    header = [
        "measure",
        "same ISA (AVX2 / AVX2): hyserve / llama.cpp",
        "ratio",
        "unequal ISA (AVX-512 VNNI / AVX2), newest: hyserve / llama.cpp",
        "ratio",
    ]
    return "\n".join(
        [
            table(header, rows),
            "",
            provenance_line("Same ISA (hyserve capped at AVX2, llama.cpp's AVX2 build)", same),
            "",
            provenance_line("Unequal ISA (hyserve on AVX-512 VNNI, the same AVX2 build of llama.cpp)", newest),
            "",
            RATIO_NOTE + " The two column groups are different runs, on different machines and commits: compare "
            'ratios within a group. In the cells, step and load times are better lower; "—": no such run.',
        ]
    )


def _snapshot(run: Run) -> str:
    h = run.data["hyserve"]
    if "snapshot_ms" not in h:
        return NONE
    return f"{num(h['snapshot_ms'])} / {num(h['restore_ms'])} ms ({h['snapshot_bytes'] / 1e6:.1f} MB)"


def _runtime_table(runs: Sequence[Run]) -> str:
    rows = []
    for r in runs:
        p, pr = _speed(r, "prompt_tok_s")
        g, gr = _speed(r, "gen_tok_s")
        ld, ldr = _load(r)
        d = r.data
        row = [model_name(d.get("model")), str(d.get("n_prompt")), p, pr, str(d.get("n_gen")), g, gr, ld, ldr]
        rows.append([*row, _snapshot(r)])
    header = ["model", "prompt tokens", "prompt tok/s", "ratio", "generated", "gen tok/s", "ratio", "load s", "ratio"]
    return table([*header, "hyserve state snapshot / restore"], rows)


def runtime(results: Results, names: Sequence[str]) -> str:
    runs = results.runs(names)
    return "\n".join([_runtime_table(runs), "", runs_table(runs)])


def _batched_table(run: Run) -> str:
    rows = []
    for x in run.data["runs"]:
        ms, own = x["step_ms"], x.get("vs_own_first_k", {})
        rows.append(
            [
                str(x["k"]),
                num(ms["hyserve"]),
                num(ms["llama.cpp"]),
                ratio(x["ratio"]) + _paired(x.get("paired_ratio")),
                num(own.get("hyserve"), 2),
                num(own.get("llama.cpp"), 2),
            ]
        )
    header = [
        "sequences k",
        "hyserve step ms",
        "llama.cpp step ms",
        "ratio",
        "hyserve / its k=1",
        "llama.cpp / its k=1",
    ]
    return table(header, rows)


def batched(results: Results, names: Sequence[str]) -> str:
    parts = []
    runs = results.runs(names)
    for r in runs:
        parts += [f"**{model_name(r.data.get('model'))}** (`{r.name}`):", "", _batched_table(r), ""]
    return "\n".join([*parts, runs_table(runs)])


def _serve_row(r: Run) -> list[str]:
    by = {c["clients"]: c for c in r.data["concurrency"]}
    speedup = r.data.get("speedup_vs_one_client", {})
    cells = [f"`{r.name}`"]
    for n in (1, 4, 8):
        c = by.get(n)
        cells.append(NONE if c is None else num(c["aggregate_tok_s"]))
    cells += [ratio(speedup.get("4")), ratio(speedup.get("8"))]
    cells.append(NONE if 8 not in by else f"{num(by[1]['itl_p50_ms'])} / {num(by[8]['itl_p50_ms'])}")
    overhead = r.data.get("grpc_overhead")
    cells.append(NONE if overhead is None else f"{100 * overhead:+.1f}%")
    return cells


SERVE_HEADER = [
    "run",
    "1 client tok/s",
    "4 clients tok/s",
    "8 clients tok/s",
    "4 clients / 1",
    "8 clients / 1",
    "inter-token p50 ms, 1 / 8 clients",
    "gRPC overhead",
]


def serve(results: Results, names: Sequence[str]) -> str:
    runs = results.runs(names)
    return "\n".join([table(SERVE_HEADER, (_serve_row(r) for r in runs)), "", runs_table(runs)])


def load(results: Results, names: Sequence[str] = LOAD) -> str:
    runs = results.runs(names)
    rows = []
    for r in runs:
        d = r.data
        h, ll = d["hyserve"], d["llama_cpp"]
        paired = d.get("paired_ratio", {})
        rows.append(
            [
                d.get("mode", NONE),
                f"{num(h['median_s'], 3)} ({num(h['min_s'], 3)}-{num(h['max_s'], 3)})",
                f"{num(ll['median_s'], 3)} ({num(ll['min_s'], 3)}-{num(ll['max_s'], 3)})",
                f"{ratio(d.get('ratio_median'))} (paired {num(paired.get('min'), 2)}-{num(paired.get('max'), 2)})",
            ]
        )
    header = ["mode", "hyserve s, median (range)", "llama.cpp s, median (range)", "llama.cpp / hyserve"]
    return "\n".join([table(header, rows), "", runs_table(runs)])


def engine(results: Results, names: Sequence[str] = ENGINE) -> str:
    runs = results.runs(names)
    rows = []
    for r in runs:
        sampling = r.data.get("sampling") or "greedy"
        for x in r.data["runs"]:
            rows.append(
                [
                    f"`{r.name}`",
                    str(sampling) if isinstance(sampling, str) else ", ".join(f"{k} {v}" for k, v in sampling.items()),
                    str(x["slots"]),
                    num(x["forward_ms_per_step"]),
                    num(x["outside_ms_per_step"], 2),
                    f"{100 * x['outside_share']:.1f}%",
                ]
            )
    header = ["run", "sampling", "slots", "forward ms / step", "engine ms / step outside forward", "share"]
    return "\n".join([table(header, rows), "", runs_table(runs)])


GPU_LLAMA_BUILDS = ("cuda", "vulkan")


def _llama_builds(side: dict) -> list[dict]:
    """llama.cpp's side of a GPU run per build of GPU_LLAMA_BUILDS ({} where it did not run). Runs
    from before the Vulkan side hold one build, CUDA, as the side itself."""
    other = side.get("llama_cpp_same_device") or {}
    if "prompt_tok_s" in other:
        other = {"cuda": other}
    return [other.get(b) or {} for b in GPU_LLAMA_BUILDS]


def _gpu_side(name: str, side: dict) -> list[list[str]]:
    if "skipped" in side:
        return []
    builds = _llama_builds(side)
    steps = side.get("batched_decode_step_s", {})
    rows = [
        [
            name,
            f"prompt, {side['prompt_tokens']} tokens (tok/s)",
            num(side["prompt_tok_s"]),
            *(num(b.get("prompt_tok_s")) for b in builds),
        ],
        [
            name,
            f"generation, {side['gen_tokens']} tokens (tok/s)",
            num(side["gen_tok_s"]),
            *(num(b.get("gen_tok_s")) for b in builds),
        ],
    ]
    for k in ("1", "4", "16"):
        if k in steps:
            theirs = [b.get("batched_decode_step_s", {}).get(k) for b in builds]
            rows.append(
                [
                    name,
                    f"decode step, k = {k} (ms)",
                    num(1e3 * steps[k]),
                    *(num(None if ms is None else 1e3 * ms) for ms in theirs),
                ]
            )
    return rows


def gpu(results: Results) -> str:
    runs = results.runs(GPU)
    rows = []
    for r in runs:
        d = r.data
        first = "realistic qwen35" if r.name.endswith("qwen35") else "Gemma 3 270M"
        rows += [[f"`{r.name}`", *row] for row in _gpu_side(first, d["hyserve"])]
        rows += [[f"`{r.name}`", *row] for row in _gpu_side("realistic qwen35", d.get("realistic_qwen35", {}))]
    header = ["run", "model", "measure", "hyserve (wgpu)", "llama.cpp (CUDA, same GPU)", "llama.cpp (Vulkan, same GPU)"]
    return "\n".join([table(header, rows), "", runs_table(runs)])


# --- history: every run not shown above ---------------------------------------------------------


def _by_date(runs: list[Run]) -> list[Run]:
    return sorted(runs, key=lambda r: (r.date, r.name), reverse=True)


def _history_runs(results: Results, prefix: str, shown: Sequence[str]) -> list[Run]:
    return _by_date([results.run(n) for n in results.names(prefix) if n not in shown])


def history_runtime(results: Results) -> str:
    rows = []
    for r in _history_runs(results, "runtime_", SAME_ISA + NEWEST):
        d = r.data
        _, pr = _speed(r, "prompt_tok_s")
        _, gr = _speed(r, "gen_tok_s")
        _, lr = _load(r)
        rows.append(
            [
                f"`{r.name}`",
                model_name(d.get("model")),
                str(d.get("n_prompt")),
                pr,
                gr,
                lr,
                r.machine,
                r.isa,
                r.date,
                r.commit,
            ]
        )
    header = [
        "result file",
        "model",
        "prompt tokens",
        "prompt ratio",
        "gen ratio",
        "load ratio",
        "machine",
        "ISA",
        "date",
        "commit",
    ]
    return table(header, rows)


def history_batched(results: Results) -> str:
    rows = []
    for r in _history_runs(results, "batched_decode_", SAME_ISA + NEWEST):
        by = {x["k"]: x for x in r.data["runs"]}
        ratios = " / ".join(ratio(by[k]["ratio"]) if k in by else NONE for k in (1, 2, 4, 8, 16))
        own = by.get(4, {}).get("vs_own_first_k", {}).get("hyserve")
        rows.append(
            [f"`{r.name}`", model_name(r.data.get("model")), ratios, num(own, 2), r.machine, r.isa, r.date, r.commit]
        )
    header = [
        "result file",
        "model",
        "ratio at k = 1 / 2 / 4 / 8 / 16",
        "hyserve k=4 / k=1",
        "machine",
        "ISA",
        "date",
        "commit",
    ]
    return table(header, rows)


def history_serve(results: Results) -> str:
    runs = _history_runs(results, "serve_", SERVE_NEWEST)
    rows = [[*_serve_row(r), r.machine, r.date, r.commit] for r in runs]
    return table([*SERVE_HEADER, "machine", "date", "commit"], rows)


def history_load(results: Results) -> str:
    return load(results, [n for n in results.names("load_") if n not in LOAD])


def history_engine(results: Results) -> str:
    return engine(results, [n for n in results.names("engine_overhead") if n not in ENGINE])
