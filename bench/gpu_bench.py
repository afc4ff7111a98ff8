"""GPU path benchmark (wgpu): prompt processing, generation and batched decode on one adapter,
with the bytes each decode step moves and, given the adapter's memory bandwidth, the fraction of
it that is; per op family, the time of each family with the device synchronised after every op.

Side by side with llama.cpp on the same device: each GPU build of llama-cpp-python given by
`--llama-build BACKEND=SITE` (bench/gpu_device_llama.sh makes CUDA and Vulkan ones), else the one
this Python imports, runs bench/llama_gpu_side.py in a process of its own, first (each model's
`llama_cpp_same_device` and `hyserve_over_llama_cpp`, by backend); the CPU build this project's
tests use has no GPU backend, and then the JSON's `llama_cpp` says so.
On a software adapter (Mesa's lavapipe) the figures are CPU emulation, not GPU speeds: the run
only shows the JSON's shape.

    python bench/gpu_bench.py [--model default|PATH] [--prompt 512] [--gen 128] [--batch 1 2 4 8 16]
                              [--adapter NAME] [--bandwidth-gbs 3350] [--qwen35 PATH] [--out bench/results]

The realistic qwen35 (`--qwen35`, default ~/.cache/hyserve/models/realistic_qwen35_q4km.gguf,
written by tests/fixtures/make_models.py realistic_qwen35) runs too where the file exists.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from report import publish

from hyserve.logging_setup import configure_logging
from hyserve.model.backend.select import DeviceRequest

TEXT = (
    "The history of computing is a story of abstraction layered on abstraction. Early machines were "
    "programmed by rewiring panels; later, stored programs let the same hardware run many tasks. "
)


class OpTimer:
    """Wraps a backend: each op is followed by a device sync and its wall time added to its family."""

    FAMILIES: ClassVar[dict[str, str]] = {
        "matmul": "matmul",
        "matmul_many": "matmul",
        "embed": "get_rows",
        "rms_norm": "norm",
        "rope": "rope",
        "attention": "attention",
        "geglu": "elementwise",
        "swiglu": "elementwise",
        "add_": "elementwise",
        "scale_": "elementwise",
        "add_row": "elementwise",
        "softcap": "elementwise",
        "take_rows": "copy",
    }

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.seconds: dict[str, float] = defaultdict(float)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.backend, name)
        family = self.FAMILIES.get(name)
        if family is None:
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            self.backend.device.flush()
            self.backend.device.to_host(self.backend.device.empty([1]))  # drain the queue
            start = time.perf_counter()
            out = attr(*args, **kwargs)
            self.backend.device.to_host(self.backend.device.empty([1]))
            self.seconds[family] += time.perf_counter() - start
            return out

        return timed


def timestamps(ops: Any, run: Any) -> dict:
    """GPU time per kernel (op family) of `run()` from wgpu timestamp queries, where the adapter
    has them: each pass's start and end ticks; `forward_s` is their sum over the run."""
    import hyserve_kernels as hk

    if not hasattr(hk, "GpuTimestamps"):
        return {"supported": False, "reason": "this hyserve_kernels build has no timestamp queries"}
    ts = hk.GpuTimestamps(ops.device)
    if not ts.supported:
        return {"supported": False, "reason": "the adapter has no TIMESTAMP_QUERY feature"}
    ts.start()
    ts.take()
    try:
        run()
        totals, untimed = ts.take()
    finally:
        ts.stop()
    return {
        "supported": True,
        "kernel_s": {name: t for name, (t, _) in sorted(totals.items())},
        "kernel_passes": {name: n for name, (_, n) in sorted(totals.items())},
        "forward_s": sum(t for t, _ in totals.values()),
        "untimed_passes": untimed,
    }


def decode_step_host_s(
    arch: Any, ops: Any, tokens: list[int], steps: int, replay: bool = True, greedy: bool = False
) -> dict:
    """Host time of one-token decode steps as the server runs them (a hybrid keeps its recurrent
    layers' inputs for exact resumes): `record_s` from the forward call to its read-back (a
    captured step's replay, or with `replay=False` the Python ops, bind groups and dispatches
    recorded one by one: work no GPU speeds up), `step_s` the whole step (submission, the
    device's work and the wait included), `submissions` per step. Medians over `steps` steps,
    after two warm-up steps (the second is captured); `replay_warm_s` (replayed steps) the
    recording alone with warm caches. `greedy`: the step returns its greedy token (one number
    read back) instead of the logits row."""
    from hyserve.model.architectures.base import Logits, Segment

    mode = Logits.ARGMAX if greedy else Logits.LAST

    ops.replay_steps = replay
    plans = arch.step_plans
    memory = arch.new_memory(len(tokens) + steps + 8)
    arch.forward([Segment(memory, np.asarray(tokens, np.int32), Logits.NONE)])
    for token in tokens[:2]:
        arch.forward([Segment(memory, np.asarray([token], np.int32), mode, {})])
    read_at: list[float] = []
    marked = {name: getattr(ops, name) for name in ("to_host", "to_host_many")}
    real_read_back = plans.read_back

    def marking(read: Any) -> Any:
        def marked_read(x: Any) -> Any:
            read_at.append(time.perf_counter())
            return read(x)

        return marked_read

    for name, read in marked.items():
        setattr(ops, name, marking(read))
    plans.read_back = marking(real_read_back)
    replays = plans.replays
    record, whole, submissions = [], [], []
    try:
        for i in range(steps):
            read_at.clear()
            before = ops.device.submissions
            start = time.perf_counter()
            token = np.asarray([tokens[i % len(tokens)]], np.int32)
            arch.forward([Segment(memory, token, mode, {})])
            whole.append(time.perf_counter() - start)
            record.append(read_at[0] - start)
            submissions.append(ops.device.submissions - before)
    finally:
        for name in marked:
            delattr(ops, name)  # the instance attribute: the class's method again
        plans.read_back = real_read_back
        ops.replay_steps = True
    return {
        "record_s": statistics.median(record),
        "replay_warm_s": replay_warm_s(arch, memory, tokens[0], mode) if replay else None,
        "step_s": statistics.median(whole),
        "submissions": statistics.median(submissions),
        "steps": steps,
        "replayed_steps": plans.replays - replays,
        # what one replay records (the step's plan): compute dispatches and buffer copies
        "plan_dispatches": plans.last_plan.dispatches if replay and plans.last_plan else None,
        "plan_copies": plans.last_plan.copies if replay and plans.last_plan else None,
    }


def replay_warm_s(arch: Any, memory: Any, token: int, mode: Any, times: int = 30) -> float:
    """A decode step's replay alone (its ids written, its plan recorded), repeated back to back
    and discarded unrun: the host's recording with warm caches, as on a machine whose CPU does
    not do the device's work. (`record_s` follows a step that a software adapter ran on this
    CPU, which leaves the caches cold.) Median seconds."""
    from hyserve.model.architectures.base import Segment

    step = arch.step_plans.plan_for([Segment(memory, np.asarray([token], np.int32), mode, {})])
    device = arch.ops.device
    writes = [(step.tokens, [token])] + ([(step.positions, [memory.n_tokens])] if step.positions is not None else [])
    took = []
    for _ in range(times):
        start = time.perf_counter()
        device.replay(step.plan, writes)
        took.append(time.perf_counter() - start)
        device.discard()
    return statistics.median(took)


def decode_bytes(arch: Any, n_ctx: int) -> int:
    """Bytes one decode step reads: every weight once (a tied LM head once) + the KV cache."""
    seen: dict[int, int] = {}
    for value in vars(arch).values():
        if hasattr(value, "n_bindings"):
            seen[id(value)] = value.nbytes
    for layer in getattr(arch, "layers", []):
        for value in vars(layer).values():
            if hasattr(value, "n_bindings"):
                seen[id(value)] = value.nbytes
    kv = 2 * len(getattr(arch, "layers", [])) * arch.n_kv * arch.head_dim * 2 * n_ctx
    return sum(seen.values()) + kv


def bench_hyserve(args: argparse.Namespace, path: str | Path) -> dict:
    from batched_decode import HyserveSide, measure

    from hyserve.model.architectures.base import Logits, Segment
    from hyserve.model.loader import load_model

    start = time.perf_counter()
    model = load_model(str(path), device=DeviceRequest("gpu", gpu_adapter=args.adapter, gpu_numerics=args.numerics))
    load_s = time.perf_counter() - start
    arch, ops = model.arch, model.arch.ops
    tokens = model.tokenizer.encode(TEXT * (1 + args.prompt // 30))[: args.prompt]

    def prompt() -> float:
        memory = arch.new_memory(args.prompt + args.gen + 8)
        t = time.perf_counter()
        arch.forward([Segment(memory, np.asarray(tokens, np.int32), Logits.LAST)])
        return time.perf_counter() - t

    def generation() -> float:
        memory = arch.new_memory(args.prompt + args.gen + 8)
        nxt = arch.forward([Segment(memory, np.asarray(tokens[:8], np.int32), Logits.ARGMAX)])[0]
        t = time.perf_counter()
        for _ in range(args.gen):  # greedy as the server runs it: the device returns the token
            nxt = arch.forward([Segment(memory, nxt, Logits.ARGMAX)])[0]
        return time.perf_counter() - t

    prompt()  # warm-up: pipelines built, weights resident
    host = {
        "replayed": decode_step_host_s(arch, ops, tokens[:8], args.host_steps),
        "op_by_op": decode_step_host_s(arch, ops, tokens[:8], args.host_steps, replay=False),
        "replayed_greedy": decode_step_host_s(arch, ops, tokens[:8], args.host_steps, greedy=True),
    }
    if args.host_only:
        return {
            "adapter": ops.description,
            "software_adapter": bool(ops.device.is_software),
            "numerics": ops.device.numerics,
            "decode_step_host": host,
        }
    pp = [prompt() for _ in range(args.repeats)]
    tg = [generation() for _ in range(args.repeats)]
    ours_side = HyserveSide(str(path), args.threads, model=model)
    sides: list[Any] = [_Idle("llama.cpp", ours_side.tokenize), ours_side]
    decode_runs = [measure(sides, k, args.rounds, args.block, 2) for k in args.batch]
    decode = {str(r["k"]): r["step_ms"]["hyserve"] / 1e3 for r in decode_runs}
    timer = OpTimer(ops)
    arch.ops = timer
    prompt()
    arch.ops = ops

    def decode_step() -> None:
        memory = arch.new_memory(64)
        arch.forward([Segment(memory, np.asarray(tokens[:8], np.int32), Logits.NONE)])
        step = [Segment(memory, np.asarray(tokens[8:9], np.int32), Logits.LAST)]
        ts_step.update(timestamps(ops, lambda: arch.forward(step)))

    ts_prompt = timestamps(ops, prompt)
    ts_step: dict = {}
    decode_step()
    step_bytes = decode_bytes(arch, 8)
    step_s = decode["1"] if "1" in decode else None
    gbs = step_bytes / step_s / 1e9 if step_s else None
    return {
        "adapter": ops.description,
        "software_adapter": bool(ops.device.is_software),
        "numerics": ops.device.numerics,
        "load_s": load_s,
        "prompt_tokens": len(tokens),
        "prompt_tok_s": len(tokens) / statistics.median(pp),
        "gen_tokens": args.gen,
        "gen_tok_s": args.gen / statistics.median(tg),
        "batched_decode_step_s": decode,
        "batched_decode_tok_s": {k: int(k) / s for k, s in decode.items()},
        "decode_step_bytes": step_bytes,
        "decode_gb_s": gbs,
        "bandwidth_gbs": args.bandwidth_gbs,
        "bandwidth_fraction": gbs / args.bandwidth_gbs if gbs and args.bandwidth_gbs else None,
        "bandwidth_note": None if args.bandwidth_gbs else "the adapter's memory bandwidth is unknown (--bandwidth-gbs)",
        "decode_step_host": host,
        "prompt_op_family_wall_s": dict(timer.seconds),
        "timestamps_prompt": ts_prompt,
        "timestamps_decode_step": ts_step,
        "timing": "tok/s: wall clock; prompt_op_family_wall_s: wall clock with a device sync after each op; "
        "timestamps_*: wgpu timestamp queries per kernel where the adapter has them (else the reason)",
    }


class _Idle:
    """Stands in for the engine that runs in the other process in `measure`: steps cost nothing."""

    def __init__(self, name: str, tokenize: Any) -> None:
        self.name, self.tokenize = name, tokenize

    def start(self, prompts: list[list[int]], n_ctx: int) -> None:
        pass

    def step(self) -> float:
        return 1.0

    def stop(self) -> None:
        pass


def side_by_side(ours: dict, theirs: dict | None) -> dict:
    """hyserve / llama.cpp throughput ratios (> 1: hyserve faster) where llama.cpp ran."""
    if not theirs or "skipped" in ours or "error" in theirs:
        return {}
    steps = theirs["batched_decode_step_s"]
    return {
        "prompt": ours["prompt_tok_s"] / theirs["prompt_tok_s"],
        "generation": ours["gen_tok_s"] / theirs["gen_tok_s"],
        "batched_decode": {k: steps[k] / s for k, s in ours["batched_decode_step_s"].items() if k in steps},
    }


def llama_builds(specs: list[str]) -> dict[str, Path | None]:
    """`--llama-build BACKEND=SITE` arguments as {backend: site}; none given: the llama_cpp this
    Python imports, as "installed"; `none`: no llama.cpp side."""
    if specs == ["none"]:
        return {}
    builds: dict[str, Path | None] = {}
    for spec in specs:
        backend, sep, site = spec.partition("=")
        if not sep or not backend or not site:
            raise SystemExit(f"--llama-build {spec!r}: expected BACKEND=SITE (cuda=/tmp/llama-cuda)")
        builds[backend] = Path(site)
    return builds or {"installed": None}


def llama_in_a_process(args: argparse.Namespace, path: Path | str, site: Path | None) -> dict | None:
    """llama.cpp's side (bench/llama_gpu_side.py) in a child process, with the llama-cpp-python
    installed in `site` (else the one this Python imports): None without the model file, else its
    JSON (`unavailable` where the build has no GPU backend, `error` where it died)."""
    if str(path) != "default" and not Path(path).exists():
        return None
    from hyserve.model.loader import resolve_model_path

    model = str(resolve_model_path(str(path)))
    cmd = [sys.executable, str(Path(__file__).with_name("llama_gpu_side.py")), model, "--prompt", str(args.prompt),
           "--gen", str(args.gen), "--repeats", str(args.repeats), "--rounds", str(args.rounds),
           "--block", str(args.block), "--threads", str(args.threads), "--batch", *map(str, args.batch)]  # fmt: skip
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr[-400:]}"}
    return json.loads(done.stdout)


def bench_model(args: argparse.Namespace, path: Path) -> dict:
    """`bench_hyserve` on `path`, or why it was skipped (no file, no GPU path for its architecture)."""
    from hyserve.model.backend.select import DeviceError

    if not path.exists():
        return {"skipped": f"{path} does not exist (tests/fixtures/make_models.py realistic_qwen35 writes it)"}
    try:
        return bench_hyserve(args, path)
    except DeviceError as exc:
        return {"skipped": str(exc)}


def llama_cpp_note(theirs: dict[str, dict | None]) -> dict:
    """Per llama.cpp build, whether it ran on the device (its system info) or why not."""
    note = {}
    for backend, side in theirs.items():
        if side is None:
            note[backend] = {"available": False, "reason": "no model file"}
        elif "unavailable" in side or "error" in side:
            note[backend] = {"available": False, "reason": side.get("unavailable") or side["error"]}
        else:
            note[backend] = {"available": True, "system_info": side.get("system_info", "")}
    return note


def draw(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours = result["hyserve"]
    builds = ours.get("llama_cpp_same_device", {})
    greys = ["#666666", "#aaaaaa", "#cccccc"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    labels = ["prompt tok/s", "generation tok/s"]
    xs = np.arange(len(labels))
    width = 0.8 / (1 + len(builds))
    a.bar(xs, [ours["prompt_tok_s"], ours["gen_tok_s"]], width, color="tab:green", label="hyserve (wgpu)")
    for i, (backend, theirs) in enumerate(builds.items()):
        a.bar(xs + (i + 1) * width, [theirs["prompt_tok_s"], theirs["gen_tok_s"]], width, color=greys[i % 3],
              label=f"llama.cpp ({backend})")  # fmt: skip
    a.set_xticks(xs + width * len(builds) / 2, labels)
    a.set_yscale("log")
    a.legend(fontsize=8)
    a.set_title(ours["adapter"][:48], fontsize=8)
    ks = list(ours["batched_decode_tok_s"])
    b.plot([int(k) for k in ks], [ours["batched_decode_tok_s"][k] for k in ks], "o-", color="tab:green",
           label="hyserve (wgpu)")  # fmt: skip
    for i, (backend, theirs) in enumerate(builds.items()):
        steps = theirs["batched_decode_step_s"]
        b.plot([int(k) for k in ks if k in steps], [int(k) / steps[k] for k in ks if k in steps], "o-",
               color=greys[i % 3], label=f"llama.cpp ({backend})")  # fmt: skip
    b.set_xlabel("sequences per decode step")
    b.set_ylabel("tokens/s")
    b.legend(fontsize=8)
    b.set_title("batched decode" + (" (software adapter: not a GPU speed)" if ours["software_adapter"] else ""))
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--adapter", default=None, help="GPU adapter name substring")
    p.add_argument("--numerics", choices=("fast", "exact"), default="fast", help="the GPU numerics mode")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="batched decode: alternating blocks per k")
    p.add_argument("--block", type=int, default=5, help="batched decode: steps per block")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of both engines")
    p.add_argument("--bandwidth-gbs", type=float, default=None, help="the adapter's memory bandwidth, GB/s")
    p.add_argument("--qwen35", type=Path, default=Path.home() / ".cache/hyserve/models/realistic_qwen35_q4km.gguf")
    p.add_argument("--host-steps", type=int, default=20, help="decode steps timed for the host's recording time")
    p.add_argument(
        "--host-only",
        action="store_true",
        help="only the host's recording time per decode step (quick; prints the JSON, writes nothing)",
    )
    p.add_argument(
        "--llama-build",
        action="append",
        default=[],
        metavar="BACKEND=SITE",
        help="a GPU build of llama-cpp-python installed in folder SITE (pip --target), run side by side "
        "as BACKEND (cuda, vulkan); repeatable. Without: the llama_cpp this Python imports; none: no llama.cpp",
    )
    p.add_argument("--name", default="gpu_bench")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    if args.host_only:
        host = {"hyserve": bench_hyserve(args, args.model), "realistic_qwen35": bench_model(args, args.qwen35)}
        print(json.dumps(host, indent=2))
        return
    # llama.cpp first, each build and model in its own process, before this process opens the device
    theirs = {
        key: {backend: llama_in_a_process(args, path, site) for backend, site in llama_builds(args.llama_build).items()}
        for key, path in (("hyserve", args.model), ("realistic_qwen35", args.qwen35))
    }
    result = {
        "machine": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
        "hyserve": bench_hyserve(args, args.model),
        "realistic_qwen35": bench_model(args, args.qwen35),
        "llama_cpp": llama_cpp_note(theirs["hyserve"]),
    }
    for key, builds in theirs.items():
        ran = {b: side for b, side in builds.items() if side and "unavailable" not in side and "error" not in side}
        if ran:
            result[key]["llama_cpp_same_device"] = ran
            result[key]["hyserve_over_llama_cpp"] = {b: side_by_side(result[key], side) for b, side in ran.items()}
    publish(result, args.out, args.name, draw)


if __name__ == "__main__":
    main()
