"""The prefix store's disk tier: the entry format round-trips bit for bit (hybrid and
attention-only), refuses corrupt, other-version and other-model files, survives an interrupted
write, stays within its byte budget, and a restarted server resumes a conversation from it."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models
from server_process import running_server
from test_cache_transparency import settle, submit
from test_server_hybrid import generate, reference

from hyserve.engine.cache_plan import same_view
from hyserve.engine.checkpoints import CheckpointList
from hyserve.engine.config import EngineConfig
from hyserve.engine.engine import Engine
from hyserve.engine.prefix_store import StoredSequence
from hyserve.engine.store_tiers import DiskTier, EntryFormatError, decode_entry, encode_entry
from hyserve.engine.store_tiers.format import MAGIC
from hyserve.engine.task import FailedEvent
from hyserve.model.loader import load_model
from hyserve.model.memory import Snapshot

ID = "model-a|qwen35|cpu|0.1.0"


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_snapshot(a: Snapshot, b: Snapshot) -> bool:
    return (
        a.n_tokens == b.n_tokens
        and a.states.keys() == b.states.keys()
        and all(_same(x, y) for il in a.states for x, y in zip(a.states[il], b.states[il], strict=True))
        and a.windows.keys() == b.windows.keys()
        and all(a.windows[il][0] == b.windows[il][0] and _same(a.windows[il][1], b.windows[il][1]) for il in a.windows)
    )


def assert_same_entry(a: StoredSequence, b: StoredSequence) -> None:
    assert a.tokens == b.tokens and a.live_floor == b.live_floor and a.nbytes == b.nbytes
    assert a.image.n_tokens == b.image.n_tokens and a.image.kv.keys() == b.image.kv.keys()
    for il in a.image.kv:
        assert all(_same(x, y) for x, y in zip(a.image.kv[il], b.image.kv[il], strict=True))
    assert _same_snapshot(a.image.live, b.image.live)
    assert len(a.checkpoints) == len(b.checkpoints)
    for x, y in zip(a.checkpoints, b.checkpoints, strict=True):
        assert (x.position, x.kind, x.turn) == (y.position, y.kind, y.turn)
        assert _same_snapshot(x.snapshot, y.snapshot)
        assert (x.logits is None) == (y.logits is None)
        assert x.logits is None or _same(x.logits, y.logits)
    assert a.log.runs() == b.log.runs() and len(a.log) == len(b.log)
    for x, y in zip(a.log, b.log, strict=True):
        assert (x.start, x.n, x.turn, len(x.parts)) == (y.start, y.n, y.turn, len(y.parts))
        for p, q in zip(x.parts, y.parts, strict=True):
            assert p.keys() == q.keys()
            assert all(_same(u, v) for il in p for u, v in zip(p[il], q[il], strict=True))


def stored_entry(path: Path) -> StoredSequence:
    """A prefix-store entry made by the engine: a conversation stashed when another takes its slot."""
    model = load_model(path)
    engine = Engine(model.arch, model.tokenizer, EngineConfig(n_slots=1, n_ctx=256, prompt_chunk=8))
    engine.start()
    try:
        rng = np.random.default_rng(3)
        first = [int(t) for t in rng.integers(10, 400, size=30)]
        submit(engine, first, 5, checkpoint_offsets=(7, 19))[1].wait()
        submit(engine, [int(t) for t in rng.integers(10, 400, size=12)], 3)[1].wait()
        settle(engine)
        (entry,) = engine.store.entries()
        return entry
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def hybrid_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models.write_model(tmp_path_factory.mktemp("disk") / "qwen35.gguf", "qwen35", qtype="q8_0")


@pytest.fixture(scope="module")
def hybrid_entry(hybrid_path: Path) -> StoredSequence:
    return stored_entry(hybrid_path)


@pytest.fixture(scope="module")
def llama_entry(tmp_path_factory: pytest.TempPathFactory) -> StoredSequence:
    return stored_entry(make_models.write_model(tmp_path_factory.mktemp("disk") / "llama.gguf", "llama", qtype="q8_0"))


def test_hybrid_entry_round_trips_bit_for_bit(hybrid_entry: StoredSequence) -> None:
    e = hybrid_entry
    assert e.image.live.states and e.image.kv and len(e.checkpoints) >= 3 and len(e.log) >= 1
    assert any(cp.logits is not None for cp in e.checkpoints)
    assert_same_entry(e, decode_entry(encode_entry(e, ID), ID))


def test_attention_only_entry_round_trips_bit_for_bit(llama_entry: StoredSequence) -> None:
    assert llama_entry.image.kv and not llama_entry.image.live.states and llama_entry.live_floor == 0
    assert_same_entry(llama_entry, decode_entry(encode_entry(llama_entry, ID), ID))


def _with_header(data: bytes, **changes: object) -> bytes:
    """The file with header fields changed and a valid checksum (a well-formed file of another kind)."""
    (n,) = struct.unpack_from("<Q", data, len(MAGIC))
    start = len(MAGIC) + 8
    header = json.loads(data[start : start + n])
    header.update(changes)
    raw = json.dumps(header, separators=(",", ":")).encode()
    body = MAGIC + struct.pack("<Q", len(raw)) + raw + data[start + n : -32]
    return body + hashlib.sha256(body).digest()


def _with_arrays(data: bytes, arrays: bytes) -> bytes:
    """The file with other bytes where its arrays are, and a valid checksum."""
    (n,) = struct.unpack_from("<Q", data, len(MAGIC))
    body = data[: len(MAGIC) + 8 + n] + arrays
    return body + hashlib.sha256(body).digest()


def test_corrupt_truncated_foreign_and_other_version_files_are_refused(hybrid_entry: StoredSequence) -> None:
    data = encode_entry(hybrid_entry, ID)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    (n,) = struct.unpack_from("<Q", data, len(MAGIC))
    arrays = data[len(MAGIC) + 8 + n : -32]
    cases = {
        # checksummed, but not arrays: junk, a cut array, a header that is not a dict literal
        "corrupt": [
            bytes(flipped),
            data[: len(data) - 100],
            data[:10],
            b"",
            _with_arrays(data, b"junk" * 10),
            _with_arrays(data, arrays[:-7]),
            _with_arrays(data, arrays[:10] + b"(" + arrays[11:]),
        ],
        "version": [_with_header(data, version=99)],
        "identity": [_with_header(data, identity="model-b|qwen35|cpu|0.1.0")],
    }
    for reason, blobs in cases.items():
        for blob in blobs:
            with pytest.raises(EntryFormatError) as err:
                decode_entry(blob, ID)
            assert err.value.reason == reason
    with pytest.raises(EntryFormatError, match="identity"):
        decode_entry(data, "model-b|qwen35|cpu|0.1.0")
    assert_same_entry(hybrid_entry, decode_entry(_with_header(data), ID))  # the rewrite itself is sound


def _counts() -> tuple[dict[str, int], object]:
    counts: dict[str, int] = {}

    def count(**deltas: int) -> None:
        for k, v in deltas.items():
            counts[k] = counts.get(k, 0) + v

    return counts, count


def test_leftover_temp_files_and_bad_files_are_skipped(tmp_path: Path, hybrid_entry: StoredSequence) -> None:
    counts, count = _counts()
    tier = DiskTier(tmp_path, 1 << 30, ID, count)
    assert tier.write(hybrid_entry)
    tier.close()
    (good,) = tmp_path.glob("*.hyc")
    data = good.read_bytes()
    (tmp_path / "interrupted.hyc.123.tmp").write_bytes(data[: len(data) // 2])  # a write cut short
    (tmp_path / "truncated.hyc").write_bytes(data[: len(data) // 3])
    (tmp_path / "foreign.hyc").write_bytes(encode_entry(hybrid_entry, "model-b"))
    (tmp_path / "garbage.hyc").write_bytes(b"\0" * 64)
    tier = DiskTier(tmp_path, 1 << 30, ID, count)
    try:
        assert not list(tmp_path.glob("*.tmp"))
        assert not (tmp_path / "garbage.hyc").exists()
        assert (tmp_path / "foreign.hyc").exists()  # another server's: skipped, kept
        candidates = tier.candidates()
        # the truncated file's header is whole: it is indexed, and refused when read in full
        assert sorted(len(c.view.tokens) for c in candidates) == [len(hybrid_entry.tokens)] * 2
        loaded = [tier.load(c.key) for c in candidates]
        assert sum(e is None for e in loaded) == 1 and len(tier) == 1
        assert_same_entry(hybrid_entry, next(e for e in loaded if e is not None))
        assert counts["disk_cache_rejected"] == 3 and counts["disk_cache_hits"] == 1
        assert not (tmp_path / "truncated.hyc").exists()
    finally:
        tier.close()


def with_fewer_checkpoints(entry: StoredSequence) -> StoredSequence:
    """The same tokens stashed again with other checkpoints (the same conversation at another turn)."""
    assert len(entry.checkpoints) >= 2
    kept = CheckpointList(list(entry.checkpoints)[:1])
    return StoredSequence(entry.tokens, entry.image, kept, entry.live_floor, entry.log)


def test_an_entry_rewritten_after_it_was_offered_is_a_miss(tmp_path: Path, hybrid_entry: StoredSequence) -> None:
    """The writer may replace a file between the plan (made on the offered header) and the read:
    the read answers a miss, never an entry without the checkpoint the plan restores."""
    counts, count = _counts()
    tier = DiskTier(tmp_path, 1 << 30, ID, count)
    try:
        assert tier.write(hybrid_entry)
        (offered,) = tier.candidates()
        assert same_view(offered.view, hybrid_entry.view())
        replacement = with_fewer_checkpoints(hybrid_entry)
        assert tier.write(replacement) and len(list(tmp_path.glob("*.hyc"))) == 1
        assert tier.load(offered.key) is None and "disk_cache_rejected" not in counts
        (again,) = tier.candidates()
        loaded = tier.load(again.key)
        assert loaded is not None
        assert_same_entry(replacement, loaded)
    finally:
        tier.close()


def test_the_directory_stays_within_its_budget_least_recently_used_first(
    tmp_path: Path, hybrid_entry: StoredSequence
) -> None:
    def variant(i: int) -> StoredSequence:  # unrelated token lists: none subsumes another
        e = hybrid_entry
        return StoredSequence((1000 + i, *e.tokens[1:]), e.image, e.checkpoints, e.live_floor, e.log)

    size = len(encode_entry(variant(0), ID))
    counts, count = _counts()
    tier = DiskTier(tmp_path, 3 * size + size // 2, ID, count)
    try:
        for i in range(3):
            tier.write(variant(i))
            time.sleep(0.02)
        first = next(c for c in tier.candidates() if c.view.tokens[0] == 1000)
        assert tier.load(first.key) is not None  # used: now the most recent
        time.sleep(0.02)
        tier.write(variant(3))
        kept = sorted(c.view.tokens[0] for c in tier.candidates())
        assert kept == [1000, 1002, 1003] and tier.bytes <= tier.budget
        assert sum(p.stat().st_size for p in tmp_path.glob("*.hyc")) == tier.bytes
        assert counts["disk_cache_evicted"] == 1
        # an entry that extends another makes it redundant
        longer = variant(3)
        tier.write(StoredSequence((*longer.tokens, 5), longer.image, longer.checkpoints, 10**6, longer.log))
        assert sorted(c.view.tokens[0] for c in tier.candidates()) == [1000, 1002, 1003]
        assert len(list(tmp_path.glob("*.hyc"))) == 3
        assert not DiskTier(tmp_path / "small", size - 1, ID).write(variant(9))  # larger than the budget
    finally:
        tier.close()


def _serve(tmp: Path, path: Path, cache_dir: Path, name: str) -> Iterator[str]:
    args = ("--model", str(path), "--parallel", "1", "--ctx-size", "512", "--threads", "2", "--prompt-chunk", "16")
    disk = ("--cache-dir", str(cache_dir), "--cache-disk-bytes", str(64 << 20))
    return running_server(tmp / f"{name}.log", *args, *disk)


def test_a_restarted_server_resumes_the_conversation_from_disk(tmp_path: Path, hybrid_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    prompt = [int(t) for t in np.random.default_rng(5).integers(10, 400, size=120)]
    with _serve(tmp_path, hybrid_path, cache_dir, "first") as target:
        _, answer, _ = generate(target, prompt, 6)
        prompt = prompt + answer + [int(t) for t in np.random.default_rng(6).integers(10, 400, size=60)]
        accepted, answer, _ = generate(target, prompt, 6)
        assert accepted.reused_tokens > 120
    assert list(cache_dir.glob("*.hyc"))  # written at shutdown
    follow_up = prompt + answer + [21, 22, 23, 24]
    with _serve(tmp_path, hybrid_path, cache_dir, "second") as target:
        accepted, tokens, finished = generate(target, follow_up, 6)
    held = len(prompt) + len(answer) - 1  # the slot held prompt + completion less its last token
    assert accepted.reused_tokens == held
    assert finished.usage.processed_prompt_tokens == len(follow_up) - held
    assert tokens == reference(hybrid_path, follow_up, 6)
    # another model's server finds the files foreign and starts over
    other = make_models.write_model(tmp_path / "other.gguf", "qwen35", qtype="q8_0", seed=1)
    with _serve(tmp_path, other, cache_dir, "third") as target:
        accepted, _, _ = generate(target, follow_up, 2)
    assert accepted.reused_tokens == 0
    assert "disk_cache_entry_skipped" in (tmp_path / "third.log").read_text()
    assert os.listdir(cache_dir)


def test_a_failing_tier_read_fails_the_taken_task_alone(
    tmp_path: Path, hybrid_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task taken off the queue is in no slot until its store entry is read: an error there (an
    injected bug) ends it with a clear message instead of losing it, and the engine serves on."""
    model = load_model(hybrid_path)
    disk = {"cache_dir": str(tmp_path), "cache_disk_bytes": 1 << 30, "cache_memory": 0}  # entries from disk only
    config = EngineConfig(n_slots=1, n_ctx=256, prompt_chunk=8, **disk)
    engine = Engine(model.arch, model.tokenizer, config)
    engine.start()
    try:
        rng = np.random.default_rng(8)
        first = [int(t) for t in rng.integers(10, 400, size=30)]
        submit(engine, first, 3, checkpoint_offsets=(20,))[1].wait()
        submit(engine, [int(t) for t in rng.integers(10, 400, size=12)], 3)[1].wait()  # stashes `first`
        deadline = time.monotonic() + 60  # only against a hang: the disk tier writes in the background
        while engine.stats().counters.tiers["disk"].writes == 0 and time.monotonic() < deadline:
            time.sleep(0.02)

        def broken(self: DiskTier, key: int) -> StoredSequence | None:
            raise RuntimeError("injected read failure")

        with monkeypatch.context() as patch:
            patch.setattr(DiskTier, "load", broken)
            _, pending = submit(engine, first[:25], 2)
            event = pending.events.get(timeout=60)
        assert isinstance(event, FailedEvent) and "injected read failure" in event.message
        settle(engine)
        assert engine.idle()
        again = submit(engine, first[:25], 2)[1].wait()  # the entry is read now, and served from it
        assert again.tokens == reference(hybrid_path, first[:25], 2)
        disk = engine.stats().counters.tiers["disk"]
        assert disk.hits == 1 and disk.read_seconds > 0
    finally:
        engine.shutdown()
