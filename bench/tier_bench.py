"""Resume latency and bytes per tier of the prefix store, against prefill of the same prefix.

For each model and prompt length N: a conversation of N random tokens is answered once (the
prefill: its wall time, one token generated), its slot is then taken by another prompt, which puts
its state into the host-memory store, the disk tier and the shared Redis tier. The follow-up
(the N tokens and one more) is then asked of an engine that holds the state in one tier only:
the same engine (memory), a fresh engine with the directory (disk), a fresh engine with the Redis
(shared: another replica). Each request's wall time (submit to the end of its one generated token)
and the bytes the tier read are recorded; answers are checked to be the prefill's.

    python bench/tier_bench.py [--model default --model PATH ...] [--tokens 2048 4096 16384]
        [--tiers memory disk shared] [--threads 2] [--out bench/results]

Needs redis-server (Debian package; `.ci/install.sh --test` installs it): one is started on a
free 127.0.0.1 port with no persistence.
"""

from __future__ import annotations

import argparse
import queue
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import hyserve_kernels as hk
import numpy as np
import structlog
from redis_process import running_redis
from report import publish, save

from hyserve.engine.config import EngineConfig
from hyserve.engine.engine import Engine
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.stop import StopRule
from hyserve.engine.store_tiers.identity import model_fingerprint
from hyserve.engine.store_tiers.shared import SharedTierConfig
from hyserve.engine.task import AcceptedEvent, DeltaEvent, FailedEvent, FinishedEvent, Task
from hyserve.logging_setup import configure_logging
from hyserve.model.loader import LoadedModel, load_model

TIERS = ("memory", "disk", "shared")
log = structlog.get_logger("tier_bench")
_ids = iter(range(10**9))


def ask(engine: Engine, prompt: list[int]) -> tuple[float, AcceptedEvent, list[int]]:
    """Wall seconds from submit to the end of one generated token; the Accepted event; the tokens."""
    events: queue.Queue[object] = queue.Queue()
    task = Task(
        id=f"b{next(_ids)}",
        prompt=tuple(prompt),
        params=SamplingParams(),
        stop=StopRule(max_tokens=1, ignore_eos=True),
        sink=events.put,
    )
    start = time.perf_counter()
    engine.submit(task)
    accepted, tokens = None, []
    while True:
        event = events.get(timeout=3600)
        if isinstance(event, AcceptedEvent):
            accepted = event
        elif isinstance(event, DeltaEvent):
            tokens += event.token_ids
        elif isinstance(event, FailedEvent):
            raise RuntimeError(event.message)
        elif isinstance(event, FinishedEvent):
            assert accepted is not None
            return time.perf_counter() - start, accepted, tokens


def wait_for(what: str, predicate) -> None:
    deadline = time.monotonic() + 600
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {what}")
        time.sleep(0.01)


def measure(
    model: LoadedModel, identity: str, n: int, redis_url: str, work: Path, repeats: int, tiers: tuple[str, ...] = TIERS
) -> dict:
    rng = np.random.default_rng(n)
    prompt = [int(t) for t in rng.integers(100, min(model.arch.n_vocab, 20000), size=n)]
    # one new token, another per repeat: each engine keeps (and writes) what it answered
    follow_ups = [[*prompt, 100 + i] for i in range(repeats)]
    probes = [[*prompt, 50 + i] for i in range(repeats)]
    follow_up = probes[0]
    cache_dir = work / f"disk-{n}"

    def engine(memory: bool, disk: bool, shared: bool) -> Engine:
        config = EngineConfig(
            n_slots=1,
            n_ctx=n + 64,
            prompt_chunk=256,
            checkpoint_interval=0,
            cache_memory=(8 << 30) if memory else 0,
            cache_dir=str(cache_dir) if disk else None,
            cache_disk_bytes=(64 << 30) if disk else 0,
            model_identity=identity,
            # a GiB-sized entry: the store may take seconds to answer while it is still taking in
            # the last one, which a server's short timeout would count as a miss (not measured here)
            shared_cache=SharedTierConfig(redis_url, ttl_s=3600, timeout_s=30.0) if shared else None,
        )
        e = Engine(model.arch, model.tokenizer, config)
        e.start()
        return e

    writer = engine(*(t in tiers for t in TIERS))
    prefill_s, _, expected = ask(writer, prompt)
    ask(writer, [int(t) for t in rng.integers(100, 1000, size=16)])  # takes the slot: stashes the prompt's state
    for tier in set(tiers) - {"memory"}:
        wait_for("tier writes", lambda t=tier: writer.stats().counters.tiers[t].writes >= 1)
    written = writer.stats().counters.tiers
    rows: dict[str, dict] = {t: {"seconds": []} for t in tiers}
    # the reference: a cache-free prefill of the follow-up itself
    cold = engine(False, False, False)
    prefill_follow_s, _, cold_tokens = ask(cold, follow_up)
    cold.shutdown()
    for i in range(repeats if "memory" in tiers else 0):
        if i:  # the state back into the store (the last resume took its entry whole into the slot)
            ask(writer, [int(t) for t in rng.integers(100, 1000, size=16)])
        s, accepted, tokens = ask(writer, follow_ups[i])
        assert accepted.store_tier == "memory" and accepted.reused_tokens == n, accepted
        rows["memory"]["seconds"].append(s)
    if "memory" in tiers:
        rows["memory"]["bytes"] = writer.stats().counters.tiers["memory"].bytes_read // repeats
    writer.shutdown()
    for tier in [t for t in ("disk", "shared") if t in tiers]:
        for i in range(repeats):
            e = engine(False, tier == "disk", tier == "shared")
            s, accepted, tokens = ask(e, probes[i])
            assert accepted.store_tier == tier and accepted.reused_tokens == n, accepted
            assert i or tokens == cold_tokens
            rows[tier]["seconds"].append(s)
            rows[tier]["bytes"] = e.stats().counters.tiers[tier].bytes_read
            e.shutdown()
    assert expected and cold_tokens
    out = {
        "tokens": n,
        "prefill_s": round(prefill_follow_s, 4),
        "first_prefill_s": round(prefill_s, 4),
        "bytes_written": {t: written[t].bytes_written for t in tiers},
    }
    for tier in tiers:
        secs = rows[tier]["seconds"]
        out[tier] = {
            "median_s": round(statistics.median(secs), 4),
            "all_s": [round(s, 4) for s in secs],
            "bytes": rows[tier]["bytes"],
            "speedup_vs_prefill": round(prefill_follow_s / statistics.median(secs), 1),
        }
    log.info(
        "tier_bench_row",
        model=model.path.name,
        tokens=n,
        prefill_s=out["prefill_s"],
        **{f"{t}_s": out[t]["median_s"] for t in tiers},
        **{f"{t}_mib": round(out[t]["bytes"] / 2**20, 1) for t in tiers},
    )
    return out


def draw(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = result["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, m in zip(axes[0], models, strict=True):
        ns = [r["tokens"] for r in m["rows"]]
        ax.plot(ns, [r["prefill_s"] for r in m["rows"]], "o-", label="prefill")
        for tier in [t for t in TIERS if t in m["rows"][0]]:
            ax.plot(ns, [r[tier]["median_s"] for r in m["rows"]], "o-", label=f"resume from {tier}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("prefix tokens")
        ax.set_ylabel("seconds to the first token")
        ax.set_title(m["model"])
        ax.legend()
    fig.suptitle("Prefix-store tiers against prefill (2 vCPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    configure_logging()  # logs go to stderr: stdout carries only the JSON
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", default=None, help="GGUF path or 'default' (repeatable)")
    p.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096, 16384])
    p.add_argument("--repeats", type=int, default=3)
    # fewer tiers, less memory: a long hybrid entry is GiB-sized, and each tier holds its own copy
    p.add_argument("--tiers", nargs="+", choices=TIERS, default=list(TIERS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--name", default="tier_bench")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()
    hk.set_num_threads(args.threads)
    result: dict = {"threads": args.threads, "repeats": args.repeats, "tiers": args.tiers, "models": []}
    with tempfile.TemporaryDirectory() as tmp, running_redis(Path(tmp) / "redis.log") as redis:
        for spec in args.model or ["default"]:
            model = load_model(spec)
            identity = model_fingerprint(model.path)
            rows: list[dict] = []
            result["models"].append({"model": f"{model.gguf.architecture} {model.path.name}", "rows": rows})
            for n in args.tokens:
                rows.append(measure(model, identity, n, redis.url, Path(tmp), args.repeats, tuple(args.tiers)))
                redis.client().flushdb()  # a 16k-token hybrid entry is GiBs: keep one length's at a time
                shutil.rmtree(Path(tmp) / f"disk-{n}", ignore_errors=True)
                save(result, args.out, args.name, draw)  # the rows so far survive a run cut short
    publish(result, args.out, args.name, draw)


if __name__ == "__main__":
    main()
