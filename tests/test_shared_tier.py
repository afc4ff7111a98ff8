"""The prefix store's shared tier on a real redis-server: a second engine resumes a conversation
another one wrote, exactly; junk under the keys, an evicted chunk, a store that is down, stalled
(SIGSTOP) or full (maxmemory, noeviction) cost a prefill and a counter, never a request or an
answer; a server process authenticates with a password file and sets the TTL on every key."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from engine_ask import ask
from fixtures import make_models
from redis_process import RedisServer, redis_server_binary, running_redis
from server_process import free_port, running_server
from test_disk_tier import stored_entry, with_fewer_checkpoints
from test_server_hybrid import generate, reference

from hyserve.engine.cache_plan import ReuseSource
from hyserve.engine.config import EngineConfig
from hyserve.engine.engine import Engine
from hyserve.engine.stats import TierCounters
from hyserve.engine.store_tiers.shared import SharedTier, SharedTierConfig
from hyserve.model.loader import LoadedModel, load_model

GUARD_S = 120.0  # only against a hang: every wait below is for a condition
PROMPT = [int(t) for t in np.random.default_rng(11).integers(10, 400, size=600)]

if redis_server_binary() is None:
    pytest.skip("redis-server not installed (bash .ci/install.sh --test installs it)", allow_module_level=True)


def wait_until(what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + GUARD_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models.write_model(tmp_path_factory.mktemp("shared") / "qwen35.gguf", "qwen35", qtype="q8_0")


@pytest.fixture(scope="module")
def model(model_path: Path) -> LoadedModel:
    return load_model(model_path)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path / "redis.log") as server:
        yield server


def start_engine(model: LoadedModel, url: str) -> Engine:
    config = EngineConfig(
        n_slots=1,
        n_ctx=2048,
        prompt_chunk=64,
        model_identity="shared-tier-test",
        shared_cache=SharedTierConfig(url, ttl_s=3600, timeout_s=0.2),
    )
    engine = Engine(model.arch, model.tokenizer, config)
    engine.start()
    return engine


def shared(engine: Engine) -> TierCounters:
    return engine.stats().counters.tiers["shared"]


def written_by_one_engine(model: LoadedModel, url: str) -> tuple[list[int], list[int]]:
    """One engine answers PROMPT and writes its slot to the shared tier; (prompt, answer)."""
    writer = start_engine(model, url)
    try:
        answer = ask(writer, PROMPT)
        wait_until("the slot's state written to the shared tier", lambda: shared(writer).writes >= 1)
        assert shared(writer).errors == 0 and shared(writer).bytes_written > 0
        return PROMPT, answer.tokens
    finally:
        writer.shutdown()


def test_another_engine_resumes_from_the_shared_tier_bit_for_bit(
    model: LoadedModel, model_path: Path, store: RedisServer
) -> None:
    prompt, answer = written_by_one_engine(model, store.url)
    follow_up = prompt + answer + [int(t) for t in np.random.default_rng(12).integers(10, 400, size=40)]
    reader = start_engine(model, store.url)
    try:
        got = ask(reader, follow_up)
        held = len(prompt) + len(answer) - 1  # the writer's slot: prompt + completion less its last token
        assert got.accepted.reuse_source is ReuseSource.PREFIX_STORE and got.accepted.store_tier == "shared"
        assert got.accepted.reused_tokens == held
        assert got.finished.usage.processed_prompt_tokens == len(follow_up) - held
        assert got.tokens == reference(model_path, follow_up, 5)
        counts = shared(reader)
        assert counts.hits == 1 and counts.errors == 0 and counts.bytes_read > 0
        assert counts.read_seconds > 0  # the lookup, the load and the restore were timed
    finally:
        reader.shutdown()
    client = store.client()
    keys = list(client.scan_iter("hyserve:*"))
    assert keys and all(0 < client.ttl(k) <= 3600 for k in keys)


def test_an_entry_rewritten_after_its_lookup_is_a_miss(model_path: Path, store: RedisServer) -> None:
    """Another writer may replace an entry (same tokens, other checkpoints) between the lookup the
    plan was made on and the load: the load answers a miss, never an entry the plan does not fit."""
    entry = stored_entry(model_path)
    counts: dict[str, int] = {}

    def count_tier(tier: str, **deltas: int) -> None:
        for k, v in deltas.items():
            counts[k] = counts.get(k, 0) + v

    tier = SharedTier(SharedTierConfig(store.url, block_tokens=8), "rewrite-test", count_tier)
    try:
        tier.write(entry)
        tier.lookup([entry.tokens])
        (offered,) = tier.candidates()
        tier.write(with_fewer_checkpoints(entry))
        assert tier.load(offered.key) is None and counts.get("errors", 0) == 0
        tier.lookup([entry.tokens])
        (again,) = tier.candidates()
        loaded = tier.load(again.key)
        assert loaded is not None and len(loaded.checkpoints) == 1 and counts["hits"] == 1
    finally:
        tier.close()


def test_junk_or_evicted_keys_are_misses_never_a_restored_state(
    model: LoadedModel, model_path: Path, store: RedisServer
) -> None:
    prompt, answer = written_by_one_engine(model, store.url)
    follow_up = prompt + answer + [7, 8, 9]
    expected = reference(model_path, follow_up, 5)
    client = store.client()
    saved = {k: client.get(k) for k in client.scan_iter("hyserve:*")}
    chunks = sorted(k for k in saved if b":c:" in k)
    metas = sorted(k for k in saved if b":m:" in k)
    assert chunks and metas

    def answered_from_scratch(errors: int, **changed: bytes | None) -> None:
        client.flushdb()  # what the last engine wrote goes too: only the changed entry is there
        for k, v in saved.items():
            v = changed.get(k.decode(), v)
            if v is not None:
                client.set(k, v, ex=3600)
        engine = start_engine(model, store.url)
        try:
            got = ask(engine, follow_up)
            assert got.accepted.reuse_source is ReuseSource.NONE and got.accepted.reused_tokens == 0
            assert got.tokens == expected
            counts = shared(engine)
            assert counts.hits == 0 and counts.misses >= 1 and counts.errors == errors
        finally:
            engine.shutdown()

    # junk of the right length in every chunk: the checksum refuses it
    answered_from_scratch(1, **{k.decode(): bytes(len(saved[k])) for k in chunks})
    # junk in the header the lookup returns
    answered_from_scratch(1, **{k.decode(): b"not a header" for k in metas})
    # a chunk the server evicted (maxmemory) or expired: a plain miss
    answered_from_scratch(0, **{chunks[-1].decode(): None})


def test_a_store_that_is_down_stalled_or_full_never_fails_a_request(
    model: LoadedModel, model_path: Path, tmp_path: Path
) -> None:
    expected = reference(model_path, PROMPT, 5)

    def served_and_counted(store: RedisServer, what: str, tier_errors: int) -> None:
        engine = start_engine(model, store.url)
        try:
            got = ask(engine, PROMPT)
            assert got.tokens == expected, what
            wait_until(f"{what}: the failure counted", lambda: shared(engine).errors >= tier_errors)
            assert shared(engine).hits == 0 and shared(engine).writes == 0, what
        finally:
            engine.shutdown()

    with running_redis(tmp_path / "full.log", "--maxmemory", "100kb", "--maxmemory-policy", "noeviction") as store:
        # below what an empty server uses: every write is refused (OOM), the state stays local
        served_and_counted(store, "full", 1)
        assert not list(store.client().scan_iter("hyserve:*"))
    with running_redis(tmp_path / "stalled.log") as store:
        store.pause()
        try:
            served_and_counted(store, "stalled", 1)  # the lookup times out
        finally:
            store.resume()
    with running_redis(tmp_path / "down.log") as store:
        store.kill()
        served_and_counted(store, "down", 1)  # connection refused


def metric(port: int, name: str, tier: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    line = f'{name}{{tier="{tier}"}} '
    return next(float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line))


def test_a_server_authenticates_with_a_password_file_and_sets_the_ttl(model_path: Path, tmp_path: Path) -> None:
    password_file = tmp_path / "redis-password"
    password_file.write_text("s3cret-for-the-test\n")
    with running_redis(tmp_path / "redis.log", password="s3cret-for-the-test") as store:
        metrics = free_port()
        args = ["--model", str(model_path), "--ctx-size", "1024", "--threads", "2", "--prompt-chunk", "64"]
        args += ["--metrics-port", str(metrics), "--cache-redis", f"redis://127.0.0.1:{store.port}/0"]
        args += ["--cache-redis-password-file", str(password_file), "--cache-redis-ttl", "600"]
        with running_server(tmp_path / "server.log", *args) as target:
            _, tokens, _ = generate(target, PROMPT, 5)
            assert tokens == reference(model_path, PROMPT, 5)
            wait_until("written", lambda: metric(metrics, "hyserve_store_tier_writes_total", "shared") >= 1)
            assert metric(metrics, "hyserve_store_tier_errors_total", "shared") == 0
            assert metric(metrics, "hyserve_store_tier_misses_total", "shared") == 1  # the first lookup
        client = store.client()
        keys = list(client.scan_iter("hyserve:*"))
        assert keys and all(0 < client.ttl(k) <= 600 for k in keys)
    assert "s3cret" not in (tmp_path / "server.log").read_text()
