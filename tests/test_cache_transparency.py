"""Cache transparency (I4) as a property: random request sequences never see the cache.

Hypothesis draws sequences of Generate requests - new prompts, extensions of earlier requests
(with their generated tokens), edits at random positions, rewrites that keep a random part of a
message (or of an answer) and go on differently, identical resends, interleaved
conversations, random message boundaries and client checkpoint offsets, and cancels at random
moments of queued and running tasks - and runs them on a real engine (tiny `qwen35`: recurrent
and attention layers, real kernels) with small checkpoint and prefix-store budgets so eviction
happens, on 1 and 2 slots (and on 2 slots that speculate: n-gram drafts, a draft model whose
drafts are rejected, one whose drafts are accepted), and a small budget of kept inputs (replays to any position inside a
message; their eviction happens too). Every completed greedy request must return exactly the tokens and
logprobs of the same request on a fresh engine that never reuses anything (`cache_prompt=False`).
After each example the memory invariants are checked directly: each slot's memory, and every
checkpoint of the slots and of the store, equals a fresh evaluation of the tokens it claims, and
so does a replay of the kept inputs to the far end of each run they reach (I1, I2, I3).

The engines live for the whole module, like a long-running server: examples build on the state
earlier examples left behind.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from fixtures import make_models
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis_process import running_redis

from hyserve.engine.cache_plan import CachedView, replay_reach
from hyserve.engine.cancel import CancelSource
from hyserve.engine.checkpoints import CheckpointList
from hyserve.engine.draft_model import load_draft_model
from hyserve.engine.engine import Engine, EngineConfig
from hyserve.engine.generator import StopRule
from hyserve.engine.input_log import InputLog
from hyserve.engine.sampling import SamplingParams
from hyserve.engine.speculative import SpecConfig
from hyserve.engine.store_tiers.shared import SharedTierConfig
from hyserve.engine.task import DeltaEvent, Event, FailedEvent, FinishedEvent, FinishReason, Task
from hyserve.model.architectures.base import Logits, Segment
from hyserve.model.backend.select import DeviceRequest
from hyserve.model.loader import LoadedModel, load_model
from hyserve.model.memory import SequenceMemory, Snapshot

VOCAB_LO, VOCAB_HI = 10, 400  # plain tokens of the fixture vocabulary
EXAMPLES = 200  # per hybrid engine (1 and 2 slots), half that for attention-only: 500 per run


@dataclass
class Outcome:
    reason: FinishReason
    tokens: list[int]
    logprobs: list[tuple[float, tuple[tuple[int, float], ...]]]


class Pending:
    """A submitted task's events, read on the test thread (cancels come from here, not the sink)."""

    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()

    def wait(self, cancel_after: int | None = None, engine: Engine | None = None, task: Task | None = None) -> Outcome:
        seen = 0
        tokens: list[int] = []
        logprobs: list[tuple[float, tuple[tuple[int, float], ...]]] = []
        while True:
            if cancel_after is not None and seen == cancel_after and engine and task:
                engine.cancel_task(task, CancelSource.RPC)
            event = self.events.get(timeout=120)
            seen += 1
            if isinstance(event, DeltaEvent):
                tokens += event.token_ids
                logprobs += [(lp.logprob, lp.top) for lp in event.logprobs]
            elif isinstance(event, FinishedEvent):
                return Outcome(event.reason, tokens, logprobs)
            elif isinstance(event, FailedEvent):
                raise AssertionError(f"task failed: {event.message}")


def submit(engine: Engine, prompt: Sequence[int], n: int, cache: bool = True, **extra: object) -> tuple[Task, Pending]:
    pending = Pending()
    task = Task(
        id=f"t{next(_ids)}",
        prompt=tuple(prompt),
        params=SamplingParams(),
        stop=StopRule(max_tokens=n, ignore_eos=True),
        sink=pending.events.put,
        logprobs=True,
        top_logprobs=2,
        cache_prompt=cache,
        **extra,  # type: ignore[arg-type]
    )
    engine.submit(task)
    return task, pending


_ids = iter(range(10**9))


@dataclass
class Rig:
    model: LoadedModel
    engine: Engine
    reference: Engine
    history: list[list[int]]  # this example's prompts (+ answers): material for extensions and edits
    cache: dict[tuple[tuple[int, ...], int], Outcome]
    examples: int = 0  # property examples run on this rig

    def expected(self, prompt: list[int], n: int) -> Outcome:
        key = (tuple(prompt), n)
        if key not in self.cache:
            _, pending = submit(self.reference, prompt, n, cache=False)
            self.cache[key] = pending.wait()
        return self.cache[key]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models.write_model(tmp_path_factory.mktemp("transparency") / "qwen35.gguf", "qwen35", qtype="q8_0")


@pytest.fixture(scope="module")
def attention_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_models.write_model(tmp_path_factory.mktemp("transparency") / "llama.gguf", "llama", qtype="q8_0")


def input_bytes_per_token(model: LoadedModel) -> int:
    """Bytes of kept inputs one position costs (what a forward records for one token)."""
    seg = Segment(model.arch.new_memory(8), np.asarray([VOCAB_LO], dtype=np.int32), Logits.NONE, {})
    model.arch.forward([seg])
    return sum(a.nbytes for arrays in (seg.inputs or {}).values() for a in arrays)


def _rig(
    path: Path,
    n_slots: int,
    checkpoints_kept: int = 3,
    replay_tokens: int = 16,
    device: str = "cpu",
    spec: Callable[[LoadedModel], SpecConfig] | None = None,
    tiers: tuple[Path, str] | None = None,
) -> Iterator[Rig]:
    model = load_model(path, device=DeviceRequest(device))
    # budgets in units of one checkpoint (attention-only memory: logits only) so eviction happens
    snap_bytes = max(model.arch.new_memory(8).snapshot().nbytes, 4 * model.arch.n_vocab)
    logits_bytes = 4 * model.arch.n_vocab
    config = EngineConfig(
        n_slots=n_slots,
        n_ctx=512,
        prompt_chunk=8,
        checkpoint_interval=16,
        checkpoint_memory=checkpoints_kept * (snap_bytes + logits_bytes),  # eviction happens
        cache_memory=40 * snap_bytes,  # a few entries: store eviction happens
        replay_memory=replay_tokens * input_bytes_per_token(model),  # kept inputs for this many positions
        spec=spec(model) if spec is not None else SpecConfig(method="off"),
        # (disk folder, Redis URL): the store's disk and shared tiers behind the host store
        cache_dir=str(tiers[0]) if tiers else None,
        cache_disk_bytes=1 << 30 if tiers else 0,
        shared_cache=SharedTierConfig(tiers[1], block_tokens=8) if tiers else None,  # short prompts indexed
    )
    engine = Engine(model.arch, model.tokenizer, config)
    reference = Engine(model.arch, model.tokenizer, EngineConfig(n_slots=1, n_ctx=512, prompt_chunk=8, cache_memory=0))
    engine.start()
    reference.start()
    try:
        yield Rig(model, engine, reference, [], {})
    finally:
        engine.shutdown()
        reference.shutdown()


@pytest.fixture(scope="module")
def rig1(model_path: Path) -> Iterator[Rig]:
    yield from _rig(model_path, 1)


@pytest.fixture(scope="module")
def rig2(model_path: Path) -> Iterator[Rig]:
    yield from _rig(model_path, 2)


def ngram_spec(model: LoadedModel) -> SpecConfig:
    # unigram lookup: drafts where a token recurs (how often depends on the random requests)
    return SpecConfig(max_draft=3, adaptive=False, ngram_min=1)


def wrong_draft_spec(model: LoadedModel) -> SpecConfig:
    # a random draft model of the same vocabulary drafts at every step and is nearly always wrong:
    # rollbacks (restore and replay) at every step
    path = make_models.write_model(model.path.with_name("draft.gguf"), "qwen35", qtype="q8_0", seed=5, layers=2)
    draft = load_draft_model(path, model.arch, model.tokenizer)
    return SpecConfig(method="draft", max_draft=3, adaptive=False, draft=draft)


def self_draft_spec(model: LoadedModel) -> SpecConfig:
    # the target as its own draft model: greedy drafts are accepted, cut by max_tokens and cancels
    return SpecConfig(method="draft", max_draft=3, draft=load_draft_model(model.path, model.arch, model.tokenizer))


@pytest.fixture(scope="module")
def ngram_rig(model_path: Path) -> Iterator[Rig]:
    """Two slots speculating with n-gram drafts."""
    yield from _rig(model_path, 2, spec=ngram_spec)


@pytest.fixture(scope="module")
def spec_rig(model_path: Path) -> Iterator[Rig]:
    """Two slots whose drafts are rejected at every step: verifying rows, rollbacks and kept inputs
    of accepted tokens only, beside the cache."""
    yield from _rig(model_path, 2, spec=wrong_draft_spec)


@pytest.fixture(scope="module")
def draft_rig(model_path: Path) -> Iterator[Rig]:
    """Two slots whose drafts are accepted, with draft memories that follow each slot's sequences."""
    yield from _rig(model_path, 2, spec=self_draft_spec)


@pytest.fixture(scope="module")
def tiered_rig(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """Two hybrid slots whose store spills to the disk tier and writes to a real Redis (the shared
    tier), so that restores come from every tier."""
    folder = tmp_path_factory.mktemp("tiers")
    with running_redis(folder / "redis.log") as redis:
        yield from _rig(model_path, 2, tiers=(folder / "disk", redis.url))


@pytest.fixture(scope="module")
def attention_rig(attention_model_path: Path) -> Iterator[Rig]:
    yield from _rig(attention_model_path, 2, checkpoints_kept=1)


@pytest.fixture(scope="module")
def gpu_rig(attention_model_path: Path) -> Iterator[Rig]:
    """The attention-only engine on the wgpu device (a software adapter where no GPU exists)."""
    yield from _rig(attention_model_path, 2, checkpoints_kept=1, device="gpu")


@pytest.fixture(scope="module")
def hybrid_gpu_rig(model_path: Path) -> Iterator[Rig]:
    """The hybrid (recurrent + attention) engine on the wgpu device: states, checkpoints and
    replays on the device."""
    yield from _rig(model_path, 2, device="gpu")


# --- request generation --------------------------------------------------------------------------

tokens_st = st.lists(st.integers(VOCAB_LO, VOCAB_HI), min_size=1, max_size=40)


@st.composite
def request_st(draw: st.DrawFn, history: list[list[int]]) -> tuple[list[int], dict[str, object]]:
    kinds = ["new", "extend", "edit", "rewrite", "rewrite", "resend", "prefix"]
    kind = draw(st.sampled_from(kinds if history else ["new"]))
    if kind == "new":
        prompt = draw(tokens_st)
    else:
        base = draw(st.sampled_from(history[-12:]))  # recent conversations, interleaved
        if kind == "extend":
            prompt = base + draw(tokens_st)
        elif kind == "edit":
            at = draw(st.integers(0, len(base) - 1))
            prompt = [*base[:at], draw(st.integers(VOCAB_LO, VOCAB_HI)), *base[at + 1 :], *draw(tokens_st)[:8]]
        elif kind == "rewrite":  # keeps the first words of a message (or answer), then goes on otherwise
            prompt = base[: draw(st.integers(1, len(base)))] + draw(tokens_st)
        elif kind == "resend":
            prompt = list(base)
        else:
            prompt = base[: draw(st.integers(1, len(base)))]
    prompt = prompt[-300:]
    n = len(prompt)
    extra: dict[str, object] = {}
    if n > 1 and draw(st.booleans()):
        extra["message_boundaries"] = tuple(sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=4)))))
    if n > 1 and draw(st.booleans()):
        extra["checkpoint_offsets"] = tuple(sorted(set(draw(st.lists(st.integers(1, n), max_size=2)))))
    return prompt, extra


def run_example(rig: Rig, data: st.DataObject) -> None:
    # what the draws depend on must be the same when hypothesis replays an example: a per-example
    # history of deterministic material (prompts, and reference answers of uncancelled requests)
    rig.history = []
    rig.examples += 1
    settle(rig.engine)
    for _ in range(data.draw(st.integers(2, 6), label="steps")):
        batch = data.draw(st.integers(1, 3), label="batch")
        submitted = []
        for _ in range(batch):
            prompt, extra = data.draw(request_st(rig.history), label="request")
            n = data.draw(st.integers(1, 5), label="max_tokens")
            # None: runs to the end; 0: cancelled at once (often still queued); k: after k events
            cancel = data.draw(st.one_of(st.none(), st.integers(0, 4)), label="cancel_after")
            task, pending = submit(rig.engine, prompt, n, **extra)
            submitted.append((prompt, n, cancel, task, pending))
        for prompt, n, cancel, task, pending in submitted:
            got = pending.wait(cancel, rig.engine, task)
            want = rig.expected(prompt, n)
            rig.history.append(prompt + want.tokens if cancel is None else prompt)
            if got.reason is FinishReason.CANCELLED:
                continue
            assert (got.tokens, got.logprobs) == (want.tokens, want.logprobs), "the cache changed an answer (I4)"
    check_memory_invariants(rig)


def settle(engine: Engine) -> None:
    """Cancel what a failed earlier example left running, and wait until the engine is idle."""
    for task in engine.live_tasks():
        engine.cancel_task(task, CancelSource.SHUTDOWN)
    deadline = time.monotonic() + 60
    while not engine.idle() and time.monotonic() < deadline:
        time.sleep(0.01)


# --- direct checks of I1-I3 ----------------------------------------------------------------------


def fresh_state(rig: Rig, tokens: Sequence[int]) -> SequenceMemory:
    memory = rig.model.arch.new_memory(512)
    if tokens:
        rig.model.arch.forward([Segment(memory, np.asarray(tokens, dtype=np.int32), Logits.NONE)])
    return memory


def same_states(a: Snapshot, b: Snapshot) -> bool:
    """Host snapshots (`snapshot(host=True)`: a GPU memory's own are device tensors) hold the same bits."""
    return a.n_tokens == b.n_tokens and all(
        np.array_equal(a.states[il][0], b.states[il][0]) and np.array_equal(a.states[il][1], b.states[il][1])
        for il in a.states
    )


def check_memory_invariants(rig: Rig) -> None:
    engine = rig.engine
    # every task has ended; wait for the engine thread to finish the iteration that ended the last
    # one (its commits and evictions), so the slots and the store are read at rest
    deadline = time.monotonic() + 60  # a hang guard only
    while not engine.idle() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert engine.idle(), f"every task has ended: {engine.live_tasks()}"
    for slot in engine.slots:
        assert slot.run is None and len(slot.tokens) == slot.memory.n_tokens  # I1 bookkeeping
        fresh = fresh_state(rig, slot.tokens)
        assert same_states(slot.memory.snapshot(host=True), fresh.snapshot(host=True)), "slot != fresh evaluation (I1)"
        for il, cache in slot.memory.kv.items():
            n = slot.memory.n_tokens
            (k, v), (fresh_k, fresh_v) = cache.host_copy(n), fresh.kv[il].host_copy(n)
            assert np.array_equal(k, fresh_k) and np.array_equal(v, fresh_v)
        for cp in slot.checkpoints:  # I2 + I3: a complete state of a prefix of T
            assert cp.position <= len(slot.tokens)
            expected = fresh_state(rig, slot.tokens[: cp.position]).snapshot(host=True)
            assert same_states(slot.memory.host_snapshot(cp.snapshot), expected)
        check_replays(rig, slot.tokens, slot.checkpoints, slot.log)
    for entry in list(engine.store._entries.values()):
        assert entry.image.n_tokens == len(entry.tokens)
        assert same_states(entry.image.live, fresh_state(rig, entry.tokens).snapshot(host=True))
        for cp in entry.checkpoints:
            assert cp.position <= len(entry.tokens)
            assert same_states(cp.snapshot, fresh_state(rig, entry.tokens[: cp.position]).snapshot(host=True))
        check_replays(rig, list(entry.tokens), entry.checkpoints, entry.log)


def check_replays(rig: Rig, tokens: list[int], checkpoints: CheckpointList, log: InputLog) -> None:
    """Kept inputs describe positions of the sequence's own tokens (I2): replaying them from each
    base to the far end of what it reaches gives a fresh evaluation's state."""
    runs = log.runs()
    assert all(end <= len(tokens) for _, end in runs)
    view = CachedView(tokens, len(tokens), checkpoints.views(), runs)
    for base, _, last in replay_reach(view):
        memory = fresh_state(rig, tokens[:base])  # what the checkpoint at base holds (checked above)
        rig.model.arch.replay(memory, log.rows(base, last))
        replayed, fresh = memory.snapshot(host=True), fresh_state(rig, tokens[:last]).snapshot(host=True)
        assert same_states(replayed, fresh), "replay != fresh (I1)"


# --- the properties ------------------------------------------------------------------------------

SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every CI run
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@SETTINGS
@given(data=st.data())
def test_cache_is_transparent_on_one_slot(rig1: Rig, data: st.DataObject) -> None:
    run_example(rig1, data)


@SETTINGS
@given(data=st.data())
def test_cache_is_transparent_on_two_slots(rig2: Rig, data: st.DataObject) -> None:
    run_example(rig2, data)


@settings(SETTINGS, max_examples=EXAMPLES // 2)
@given(data=st.data())
def test_cache_is_transparent_with_disk_and_shared_tiers(tiered_rig: Rig, data: st.DataObject) -> None:
    run_example(tiered_rig, data)


@settings(SETTINGS, max_examples=EXAMPLES // 2)
@given(data=st.data())
def test_cache_is_transparent_on_attention_only_memory(attention_rig: Rig, data: st.DataObject) -> None:
    run_example(attention_rig, data)


@settings(SETTINGS, max_examples=EXAMPLES // 4)
@given(data=st.data())
def test_cache_is_transparent_with_ngram_speculation(ngram_rig: Rig, data: st.DataObject) -> None:
    run_example(ngram_rig, data)


@settings(SETTINGS, max_examples=EXAMPLES // 4)
@given(data=st.data())
def test_cache_is_transparent_with_speculation(spec_rig: Rig, data: st.DataObject) -> None:
    run_example(spec_rig, data)


@settings(SETTINGS, max_examples=EXAMPLES // 4)
@given(data=st.data())
def test_cache_is_transparent_with_a_draft_model(draft_rig: Rig, data: st.DataObject) -> None:
    run_example(draft_rig, data)


@settings(SETTINGS, max_examples=EXAMPLES // 20)
@given(data=st.data())
def test_cache_is_transparent_on_the_gpu(gpu_rig: Rig, data: st.DataObject) -> None:
    """Fewer examples: the software adapter is slow, and the engine logic is the CPU runs' own."""
    run_example(gpu_rig, data)


@settings(SETTINGS, max_examples=EXAMPLES // 20)
@given(data=st.data())
def test_cache_is_transparent_on_the_gpu_with_recurrent_memory(hybrid_gpu_rig: Rig, data: st.DataObject) -> None:
    run_example(hybrid_gpu_rig, data)


def exercise(rig: Rig, prop: Callable[..., None], **fixture: Rig) -> None:
    """Run a property test here, with its own examples, when it has not run on `rig` yet (this test
    run alone or selected with -k)."""
    if not rig.examples:
        prop(**fixture)


def test_the_runs_exercised_the_cache(rig1: Rig, rig2: Rig, attention_rig: Rig) -> None:
    """Guards against a vacuous property: the random runs did restore, evict and use the store."""
    exercise(rig1, test_cache_is_transparent_on_one_slot, rig1=rig1)
    exercise(rig2, test_cache_is_transparent_on_two_slots, rig2=rig2)
    exercise(attention_rig, test_cache_is_transparent_on_attention_only_memory, attention_rig=attention_rig)
    for rig in (rig1, rig2, attention_rig):
        c = rig.engine.stats().counters
        assert c.restores > 0 and c.checkpoints_evicted > 0 and c.checkpoints_invalidated > 0
        assert c.prefix_store_hits > 0 and c.prompt_tokens_reused > 0 and c.tiers["memory"].read_seconds > 0
        assert c.full_reprocess_by_reason and c.reprocessed_tokens_by_reason
    for rig in (rig1, rig2):  # replays inside messages happened, and kept inputs were evicted
        c = rig.engine.stats().counters
        assert c.replays > 0 and c.replayed_tokens > c.replays and c.input_blocks_evicted > 0


def test_the_speculating_runs_drafted_and_rolled_back(spec_rig: Rig, draft_rig: Rig) -> None:
    """Guards against a vacuous property: drafts were verified and rejected (rolled back) on one
    engine, accepted on the other, beside restores from the cache."""
    exercise(spec_rig, test_cache_is_transparent_with_speculation, spec_rig=spec_rig)
    exercise(draft_rig, test_cache_is_transparent_with_a_draft_model, draft_rig=draft_rig)
    rejected, accepted = spec_rig.engine.stats().counters, draft_rig.engine.stats().counters
    assert rejected.spec_drafts > 50 and rejected.spec_draft_tokens > 2 * rejected.spec_accepted_tokens, rejected
    assert accepted.spec_drafts > 50 and accepted.spec_accepted_tokens > accepted.spec_draft_tokens // 2, accepted
    assert rejected.restores > 0 and accepted.restores > 0


def test_the_tiered_run_restored_from_the_disk_tier(tiered_rig: Rig) -> None:
    """Guards against a vacuous property: the host store spilled, entries came back from disk, and
    the shared tier was written (and looked up) without an error."""
    exercise(tiered_rig, test_cache_is_transparent_with_disk_and_shared_tiers, tiered_rig=tiered_rig)
    tiers = tiered_rig.engine.stats().counters.tiers
    assert tiers["disk"].hits > 0 and tiers["disk"].writes > 0, tiers
    deadline = time.monotonic() + 60  # only against a hang: the shared tier writes in the background
    while tiered_rig.engine.stats().counters.tiers["shared"].writes == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    shared = tiered_rig.engine.stats().counters.tiers["shared"]
    assert shared.writes > 0 and shared.errors == 0, shared
