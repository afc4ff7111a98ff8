"""The prompt cache's decisions (engine/cache_plan/) over tables of cases, without a model.

Scenario numbers refer to the scenario list of llama.cpp server's checkpoint notes (section 9); where our
rules differ from llama.cpp's on purpose the comment says how.
"""

from __future__ import annotations

import pytest

from hyserve.engine.cache_plan import (
    CachedView,
    ChatLayout,
    CheckpointKind,
    CheckpointView,
    EvictionCandidate,
    LogBlockView,
    MemoryKind,
    QueuedPrompt,
    ResumeCosts,
    SlotCandidate,
    StoreCandidate,
    chat_checkpoint_positions,
    checkpoint_schedule,
    choose_evictions,
    choose_log_evictions,
    common_prefix_len,
    plan_admissions,
    plan_resume,
    replay_reach,
    subsumes,
)
from hyserve.engine.task import ReuseSource

CP = CheckpointView
NONE, LIVE, CHECKPOINT, STORE = (
    ReuseSource.NONE,
    ReuseSource.SLOT_LIVE,
    ReuseSource.CHECKPOINT,
    ReuseSource.PREFIX_STORE,
)


def seq(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def attention(tokens: list[int], *cps: CheckpointView) -> CachedView:
    return CachedView(tokens, 0, cps)


def recurrent(tokens: list[int], *cps: CheckpointView) -> CachedView:
    return CachedView(tokens, len(tokens), cps)


P100 = seq(100)
GEN = seq(20, 1000)  # generated tokens of the previous task (the last one never evaluated)
T_AFTER = P100 + GEN[:-1]


@pytest.mark.parametrize(
    ("case", "cached", "prompt", "expect"),
    [
        # (resume, source, restore, from_logits, invalidate, reason)
        ("cold slot (1)", recurrent([]), P100, (0, NONE, None, False, (), "cold_slot")),
        ("no common prefix", attention(seq(5, 500)), P100, (0, NONE, None, False, (), "no_common_prefix")),
        (
            "pure extension after generation (3): live state as is, nothing restored or dropped",
            recurrent(T_AFTER, CP(96), CP(100, True)),
            [*T_AFTER, GEN[-1], *seq(50, 2000)],
            (len(T_AFTER), LIVE, None, False, (), None),
        ),
        (
            "identical resend (4): the prompt end's logits, zero tokens [llama.cpp: N-4, 4 tokens]",
            recurrent(T_AFTER, CP(96), CP(100, True)),
            P100,
            (100, CHECKPOINT, 100, True, (), None),
        ),
        (
            "identical resend without stored logits: newest checkpoint below N",
            recurrent(T_AFTER, CP(60), CP(96), CP(100)),
            P100,
            (96, CHECKPOINT, 96, False, (100,), "no_stored_logits"),
        ),
        (
            "reasoning stripped (6): the next prompt diverges inside the generation prompt",
            recurrent(T_AFTER, CP(95), CP(97), CP(98), CP(99), CP(100, True)),
            [*P100[:98], 777, *seq(30, 3000)],
            (98, CHECKPOINT, 98, False, (99, 100), None),
        ),
        (
            "edit of the last user message (7): its start",
            recurrent(T_AFTER, CP(40), CP(80), CP(100, True)),
            [*P100[:85], *seq(20, 4000)],
            (80, CHECKPOINT, 80, False, (100,), "no_checkpoint_at_divergence"),
        ),
        (
            "edit of an early message (8): newest checkpoint <= L",
            recurrent(T_AFTER, CP(10), CP(40), CP(80), CP(100, True)),
            [*P100[:45], *seq(20, 4000)],
            (40, CHECKPOINT, 40, False, (80, 100), "no_checkpoint_at_divergence"),
        ),
        (
            "divergence before every checkpoint (9): full re-processing, all dropped",
            recurrent(T_AFTER, CP(40), CP(100, True)),
            [*P100[:9], *seq(20, 4000)],
            (0, NONE, None, False, (40, 100), "no_checkpoint"),
        ),
        (
            "stale checkpoint must lose (10): never continue from a state past L",
            recurrent(T_AFTER, CP(60), CP(100, True)),
            [*P100[:50], *seq(20, 4000)],
            (0, NONE, None, False, (60, 100), "no_checkpoint"),
        ),
        (
            "selection boundary (12): a checkpoint exactly at L with new tokens is taken",
            recurrent(T_AFTER, CP(50)),
            [*P100[:50], *seq(5, 4000)],
            (50, CHECKPOINT, 50, False, (), None),
        ),
        (
            "selection boundary (12): a checkpoint at L+1 is not",
            recurrent(T_AFTER, CP(30), CP(51)),
            [*P100[:50], *seq(5, 4000)],
            (30, CHECKPOINT, 30, False, (51,), "no_checkpoint_at_divergence"),
        ),
        (
            "invalidation keeps valid checkpoints (13): LCP 2500 restores 2000, drops 3000 only",
            recurrent(seq(3500), CP(1000), CP(2000), CP(3000)),
            [*seq(2500), *seq(10, 9000)],
            (2000, CHECKPOINT, 2000, False, (3000,), "no_checkpoint_at_divergence"),
        ),
        (
            "full-attention model (17): any divergence is a trim, identical resend one token",
            attention(T_AFTER),
            [*P100[:70], *seq(5, 4000)],
            (70, LIVE, None, False, (), None),
        ),
        (
            "full attention identical resend, no logits",
            attention(T_AFTER),
            P100,
            (99, LIVE, None, False, (), "no_stored_logits"),
        ),
        (
            "full attention identical resend with the prompt end's logits: zero tokens",
            attention(T_AFTER, CP(100, True)),
            P100,
            (100, CHECKPOINT, 100, True, (), None),
        ),
        (
            "ring-buffer window cache: truncation reaches only recent positions (15)",
            CachedView(seq(200), 150, (CP(64), CP(128))),
            [*seq(170), *seq(5, 4000)],
            (170, LIVE, None, False, (), None),
        ),
        (
            "ring-buffer window cache: deep divergence restores a window checkpoint (15/16)",
            CachedView(seq(200), 150, (CP(64), CP(128))),
            [*seq(140), *seq(5, 4000)],
            (128, CHECKPOINT, 128, False, (), "no_checkpoint_at_divergence"),
        ),
        ("single-token prompt", attention([5, 6]), [5], (0, NONE, None, False, (), "single_token_prompt")),
    ],
)
def test_plan_resume(case: str, cached: CachedView, prompt: list[int], expect: tuple) -> None:
    plan = plan_resume(cached, prompt)
    got = (plan.resume, plan.source, plan.restore, plan.from_logits, plan.invalidate, plan.reason)
    assert got == expect, case
    assert plan.matched == common_prefix_len(cached.tokens, prompt)
    assert plan.reprocessed == plan.matched - min(plan.matched, plan.resume)
    # a state is never continued past the divergence, and one token is evaluated unless logits are stored
    assert plan.resume <= plan.matched
    assert plan.resume < len(prompt) or plan.from_logits


def test_plan_resume_cache_prompt_disabled_drops_everything() -> None:
    plan = plan_resume(recurrent(T_AFTER, CP(50), CP(100, True)), P100, cache_prompt=False)
    assert (plan.resume, plan.source, plan.invalidate, plan.reason) == (0, NONE, (50, 100), "cache_prompt_disabled")


def test_plan_resume_from_a_store_entry_names_the_store() -> None:
    assert plan_resume(attention(T_AFTER), [*T_AFTER, 5], from_store=True).source is STORE
    plan = plan_resume(recurrent(T_AFTER, CP(100, True)), P100, from_store=True)
    assert (plan.source, plan.restore, plan.from_logits) == (STORE, 100, True)


def test_plan_resume_rejects_an_empty_prompt() -> None:
    with pytest.raises(ValueError):
        plan_resume(attention([1]), [])


# --- admissions ----------------------------------------------------------------------------------


def slot(index: int, view: CachedView, last_used: int = 0) -> SlotCandidate:
    return SlotCandidate(index, view, last_used)


def test_admission_prefers_the_slot_that_resumes_furthest() -> None:
    a = seq(50)
    free = [slot(0, attention(a[:10]), 9), slot(1, attention(a), 1), slot(2, attention([]), 0)]
    [adm] = plan_admissions([([*a[:40], 7], True)], free)
    assert (adm.slot, adm.plan.resume, adm.store_key) == (1, 40, None)


def test_admission_of_a_hybrid_prompt_does_not_destroy_a_slot_it_cannot_resume_on() -> None:
    # slot 0 matches 30 tokens but holds no checkpoint there: resuming means starting over, so the
    # empty slot is used and slot 0's conversation stays (scenario 21: two slots)
    free = [slot(0, recurrent(seq(60)), 5), slot(1, recurrent([]), 9)]
    [adm] = plan_admissions([([*seq(30), 99], True)], free)
    assert (adm.slot, adm.plan.resume) == (1, 0)
    # without an empty slot: the least recently used one
    free = [slot(0, recurrent(seq(60)), 5), slot(1, recurrent(seq(5, 700)), 9)]
    assert plan_admissions([([*seq(30), 99], True)], free)[0].slot == 0


def test_admission_takes_a_prefix_store_entry_when_it_resumes_further() -> None:
    # scenario 19: conversation A went to the store; A + a new turn comes back
    conv_a, conv_b = seq(80), seq(60, 500)
    free = [slot(0, recurrent(conv_b, CP(60, True)), 3)]
    store = [StoreCandidate(7, recurrent(conv_a, CP(80, True))), StoreCandidate(8, recurrent(seq(10, 900)))]
    [adm] = plan_admissions([([*conv_a, *seq(12, 3000)], True)], free, store)
    assert (adm.slot, adm.store_key, adm.plan.resume, adm.plan.source) == (0, 7, 80, STORE)


def test_admission_prefers_the_slot_on_a_tie_and_ignores_the_store_without_cache_prompt() -> None:
    conv = seq(40)
    free = [slot(0, attention(conv), 1)]
    store = [StoreCandidate(1, attention(conv))]
    assert plan_admissions([([*conv, 1], True)], free, store)[0].store_key is None
    [adm] = plan_admissions([([*conv, 1], False)], free, [StoreCandidate(1, attention([*conv, 1, 2]))])
    assert (adm.store_key, adm.plan.resume, adm.plan.reason) == (None, 0, "cache_prompt_disabled")


def test_admissions_are_fifo_and_never_share_a_slot_or_an_entry() -> None:
    conv = seq(40)
    free = [slot(0, attention([]), 0), slot(1, attention([]), 0)]
    store = [StoreCandidate(3, attention(conv))]
    plan = plan_admissions([([*conv, 1], True), ([*conv, 2], True), ([5], True)], free, store)
    assert [(a.queue_pos, a.store_key) for a in plan] == [(0, 3), (1, None)]
    assert len({a.slot for a in plan}) == 2
    assert plan_admissions([([1], True)], []) == []


# 1 ms per prompt token; memory free, disk 1 us per byte (1 MB/s), shared 2 us per byte
COSTS = ResumeCosts(1e-3, {"disk": 1e-6, "shared": 2e-6})


def test_with_costs_an_entry_is_taken_only_when_reading_it_costs_less_than_the_tokens_it_saves() -> None:
    conv = seq(100)
    prompt = [*conv, *seq(10, 3000)]
    free = [slot(0, attention(conv[:40]), 1)]  # resumes at 40: 70 tokens to evaluate, 70 ms
    # resumes at 100 (10 tokens, 10 ms) after reading 50 kB from disk (50 ms): 60 ms < 70 ms
    cheap = StoreCandidate(-1, attention(conv), "disk", 50_000)
    [adm] = plan_admissions([(prompt, True)], free, [cheap], costs=COSTS)
    assert (adm.store_key, adm.plan.resume, adm.passed_over) == (-1, 100, None)
    # 70 kB: 80 ms against 70 ms: the slot resumes at 40 and the entry is counted as passed over
    costly = StoreCandidate(-1, attention(conv), "disk", 70_000)
    [adm] = plan_admissions([(prompt, True)], free, [costly], costs=COSTS)
    assert (adm.store_key, adm.slot, adm.plan.resume, adm.plan.source, adm.passed_over) == (None, 0, 40, LIVE, "disk")
    # without costs the furthest resume wins, whatever it reads
    [adm] = plan_admissions([(prompt, True)], free, [costly])
    assert (adm.store_key, adm.plan.resume, adm.passed_over) == (-1, 100, None)


def test_with_costs_the_cheapest_entry_wins_over_the_furthest() -> None:
    conv = seq(200)
    prompt = [*conv, 7]
    free = [slot(0, attention([]), 0)]
    store = [
        StoreCandidate(-(1 << 41), attention(conv), "shared", 10_000),  # 200: 1 token + 20 ms
        StoreCandidate(-1, attention(conv[:190]), "disk", 1_000),  # 190: 11 tokens + 1 ms
        StoreCandidate(3, attention(conv[:150]), "memory", 10**9),  # 150: 51 tokens, memory is free
    ]
    [adm] = plan_admissions([(prompt, True)], free, store, costs=COSTS)
    assert (adm.store_key, adm.plan.resume) == (-1, 190)
    [adm] = plan_admissions([(prompt, True)], free, store)
    assert (adm.store_key, adm.plan.resume) == (-(1 << 41), 200)
    # equal costs and reach: the first offered (the nearest tier: host entries come first)
    even = [StoreCandidate(1, attention(conv), "memory", 0), StoreCandidate(-1, attention(conv), "disk", 0)]
    assert plan_admissions([(prompt, True)], free, even, costs=COSTS)[0].store_key == 1


def test_resume_costs_refuse_rates_that_cannot_price() -> None:
    with pytest.raises(ValueError, match="positive"):
        ResumeCosts(0.0)
    with pytest.raises(ValueError, match="non-negative"):
        ResumeCosts(1e-3, {"disk": -1.0})
    assert ResumeCosts(1e-3).seconds(10, 4, "disk", 10**9) == pytest.approx(6e-3)  # an unknown tier reads free


# --- checkpoint schedule -------------------------------------------------------------------------


def test_schedule_attention_only_keeps_just_the_prompt_end() -> None:
    got = checkpoint_schedule(0, 300, MemoryKind.ATTENTION, [10, 50], [20], interval=64)
    assert got == [(300, CheckpointKind.PROMPT_END)]


@pytest.mark.parametrize("kind", [MemoryKind.HYBRID, MemoryKind.RECURRENT, MemoryKind.SLIDING_WINDOW])
def test_schedule_recurrent_memory(kind: MemoryKind) -> None:
    got = checkpoint_schedule(30, 300, kind, [10, 50, 128, 299], [64, 50, 400], interval=128)
    assert got == [
        (50, CheckpointKind.CLIENT_REQUESTED),  # client beats message start on the same position
        (64, CheckpointKind.CLIENT_REQUESTED),
        (128, CheckpointKind.MESSAGE_START),  # message start beats interval
        (256, CheckpointKind.INTERVAL),
        (299, CheckpointKind.MESSAGE_START),
        (300, CheckpointKind.PROMPT_END),
    ]
    assert checkpoint_schedule(300, 300, kind, [10], [], 128) == []
    # cold long prompt (2): intervals at absolute multiples, so they line up across requests
    assert [p for p, _ in checkpoint_schedule(0, 1000, kind, interval=256)] == [256, 512, 768, 1000]


# --- eviction ------------------------------------------------------------------------------------


def ev(position: int, kind: CheckpointKind, turn: int, nbytes: int = 10, owner: int = 0) -> EvictionCandidate:
    return EvictionCandidate(owner, position, kind, nbytes, turn)


def test_eviction_order_within_a_tier() -> None:
    mk, end, iv = CheckpointKind.MESSAGE_START, CheckpointKind.PROMPT_END, CheckpointKind.INTERVAL
    items = [ev(10, mk, 1), ev(20, end, 1), ev(30, mk, 2), ev(40, iv, 2), ev(45, end, 2), ev(60, mk, 3), ev(70, end, 3)]
    assert choose_evictions(items, budget=70, keep_head=0, keep_tail=0) == []
    dropped = choose_evictions(items, budget=40, keep_head=0, keep_tail=0)  # older turns first, intervals first
    assert [(d.turn, d.position) for d in dropped] == [(1, 10), (1, 20), (2, 40)]
    assert len(choose_evictions(items, budget=0)) == len(items)


def test_eviction_keeps_both_ends_of_a_long_history() -> None:
    # scenario 18, a 20-turn conversation under a budget of 6 checkpoints: the start (the end of the
    # shared system prompt) and the newest turns stay, the middle goes
    mk, end = CheckpointKind.MESSAGE_START, CheckpointKind.PROMPT_END
    items: list[EvictionCandidate] = []
    for turn in range(1, 21):
        items += [ev(turn * 100, mk, turn), ev(turn * 100 + 50, end, turn)]
        items = [i for i in items if i not in choose_evictions(items, budget=60, keep_head=2, keep_tail=4)]
        assert sum(i.nbytes for i in items) <= 60
    assert [i.position for i in items] == [100, 150, 1900, 1950, 2000, 2050]
    # ends are per slot: only slot 1's middle checkpoint is unprotected among the oldest turn's
    other = [ev(5, mk, 1, owner=1), ev(500, mk, 1, owner=1), ev(900, end, 1, owner=1)]
    dropped = choose_evictions(items + other, budget=80, keep_head=1, keep_tail=1)
    assert [(d.owner, d.position) for d in dropped] == [(1, 500)]


# --- store subsumption ---------------------------------------------------------------------------


def test_subsumes() -> None:
    old, new = seq(40), seq(60)
    assert subsumes(attention(new), attention(old))
    assert not subsumes(attention(old), attention(new))
    assert not subsumes(attention([*seq(39), 5, *seq(20)]), attention(old))
    # recurrent: the old end must be reachable in the new entry, with logits where old had them
    assert not subsumes(recurrent(new), recurrent(old))
    assert subsumes(recurrent(new, CP(40)), recurrent(old))
    assert not subsumes(recurrent(new, CP(40)), recurrent(old, CP(40, True)))
    assert subsumes(recurrent(new, CP(20), CP(40, True)), recurrent(old, CP(20), CP(40, True)))
    assert subsumes(recurrent(old), recurrent(old))


# --- replays of kept inputs ----------------------------------------------------------------------


def logged(tokens: list[int], runs: tuple[tuple[int, int], ...], *cps: CheckpointView) -> CachedView:
    return CachedView(tokens, len(tokens), cps, runs)


@pytest.mark.parametrize(
    ("case", "cached", "prompt", "expect"),
    [
        # (resume, source, restore, replay_from, reason)
        (
            "divergence inside a message: replay from the checkpoint before it",
            logged(T_AFTER, ((0, 119),), CP(3), CP(60), CP(100, True)),
            P100[:75] + seq(10, 5000),
            (75, CHECKPOINT, 60, 60, None),
        ),
        (
            "a run from position 0 needs no checkpoint",
            logged(T_AFTER, ((0, 119),)),
            P100[:75] + seq(10, 5000),
            (75, CHECKPOINT, None, 0, None),
        ),
        (
            "inside the generated tokens (an assistant text that repeats them, then differs)",
            logged(T_AFTER, ((0, 119),), CP(60), CP(100, True)),
            P100 + GEN[:7] + seq(5, 5000),
            (107, CHECKPOINT, 100, 100, None),
        ),
        (
            "a prompt that is a prefix of T: the last token is evaluated (a replay has no logits)",
            logged(T_AFTER, ((0, 119),), CP(60), CP(100, True)),
            P100 + GEN[:7],
            (106, CHECKPOINT, 100, 100, "no_stored_logits"),
        ),
        (
            "a run with no base inside it reaches nothing",
            logged(T_AFTER, ((70, 119),), CP(60), CP(100, True)),
            P100[:75] + seq(10, 5000),
            (60, CHECKPOINT, 60, None, "inputs_not_kept"),
        ),
        (
            "a gap in the run stops the replay at the gap",
            logged(T_AFTER, ((0, 50), (52, 119)), CP(3), CP(60)),
            P100[:55] + seq(10, 5000),
            (50, CHECKPOINT, 3, 3, "inputs_not_kept"),
        ),
        (
            "a plain checkpoint at the divergence wins the tie (nothing to replay)",
            logged(T_AFTER, ((0, 119),), CP(60)),
            P100[:60] + seq(10, 5000),
            (60, CHECKPOINT, 60, None, None),
        ),
        (
            "a pure extension keeps the live end",
            logged(T_AFTER, ((0, 119),), CP(60)),
            T_AFTER + seq(3, 5000),
            (119, LIVE, None, None, None),
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_plan_resume_with_kept_inputs(case: str, cached: CachedView, prompt: list[int], expect: tuple) -> None:
    plan = plan_resume(cached, prompt)
    assert (plan.resume, plan.source, plan.restore, plan.replay_from, plan.reason) == expect, case
    assert not plan.from_logits and all(p > plan.resume for p in plan.invalidate)


def test_a_store_entry_replays_too() -> None:
    entry = logged(T_AFTER, ((0, 119),), CP(60))
    plan = plan_resume(entry, P100[:75] + seq(3, 5000), from_store=True)
    assert (plan.resume, plan.source, plan.restore, plan.replay_from) == (75, STORE, 60, 60)


def test_replay_reach() -> None:
    view = logged(T_AFTER, ((0, 50), (52, 119)), CP(3), CP(60), CP(100))
    assert replay_reach(view) == [(0, 0, 2), (3, 3, 50), (60, 60, 99), (100, 100, 119)]


def test_log_eviction_drops_the_middle_then_the_newest_turns_and_keeps_the_head_longest() -> None:
    cps = {0: [10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]}
    blocks = [LogBlockView(0, s, s + 10, 100, turn=s // 40) for s in range(0, 130, 10)]
    # head: the empty state and the first 3 checkpoints; tail: the last 8; 40 is the only middle base
    order = [b.start for b in choose_log_evictions(blocks, cps, 0)]
    assert order == [40, 50, 60, 70, 80, 90, 100, 110, 120, 0, 10, 20, 30]  # then older turns, earlier positions
    assert choose_log_evictions(blocks, cps, 1300) == []
    assert [b.start for b in choose_log_evictions(blocks, cps, 1150)] == [40, 50]


def test_subsumes_counts_replays() -> None:
    old = logged(P100, ((0, 100),), CP(50))
    assert subsumes(logged(T_AFTER, ((0, 119),), CP(50)), old)
    assert not subsumes(recurrent(T_AFTER, CP(50), CP(100)), old)  # 60 was reachable in old only
    assert not subsumes(logged(T_AFTER, ((0, 60), (61, 119)), CP(50)), old)


def test_admission_stashes_a_slot_only_when_it_loses_more_than_its_last_generation() -> None:
    prompt_a = seq(40)
    held = [*prompt_a, *seq(10, 800)]  # A's prompt and what it generated
    a_slot = SlotCandidate(0, recurrent(held, CP(40, True)), 1, last_prompt_len=40, kind=MemoryKind.HYBRID)
    # another conversation overwrites the slot: A's state goes to the store first
    [adm] = plan_admissions([QueuedPrompt(seq(30, 500))], [a_slot], store_enabled=True)
    assert (adm.stash, adm.store_miss, adm.discard_entry) == (True, True, False)
    # A's next turn (drops the generated tail only): nothing worth stashing, no miss
    [adm] = plan_admissions([QueuedPrompt([*prompt_a, 7, 8])], [a_slot], store_enabled=True)
    assert (adm.stash, adm.store_miss, adm.plan.resume) == (False, False, 40)
    # the store off: never
    [adm] = plan_admissions([QueuedPrompt(seq(30, 500))], [a_slot])
    assert (adm.stash, adm.store_miss) == (False, False)


def test_admission_discards_a_store_entry_the_slot_takes_whole() -> None:
    conv = seq(80)
    free = [SlotCandidate(0, recurrent([]), 0, kind=MemoryKind.RECURRENT)]
    whole = [StoreCandidate(7, recurrent(conv, CP(80, True)))]
    [adm] = plan_admissions([QueuedPrompt([*conv, 5])], free, whole, store_enabled=True)
    assert (adm.store_key, adm.plan.resume, adm.discard_entry, adm.stash) == (7, 80, True, False)
    part = [StoreCandidate(7, recurrent([*conv, *seq(5, 900)], CP(80, True)))]
    [adm] = plan_admissions([QueuedPrompt([*conv, 5])], free, part, store_enabled=True)
    assert (adm.store_key, adm.plan.resume, adm.discard_entry) == (7, 80, False)


def test_admission_carries_the_checkpoint_schedule() -> None:
    free = [SlotCandidate(0, recurrent([]), 0, kind=MemoryKind.HYBRID)]
    q = QueuedPrompt(seq(100), message_boundaries=(10, 40), checkpoint_offsets=(70,))
    [adm] = plan_admissions([q], free, checkpoint_interval=64)
    assert adm.checkpoints == tuple(checkpoint_schedule(0, 100, MemoryKind.HYBRID, (10, 40), (70,), 64))
    assert [p for p, _ in adm.checkpoints] == [10, 40, 64, 70, 100]
    [adm] = plan_admissions([QueuedPrompt(seq(100), cache_prompt=False)], free)
    assert adm.checkpoints == ()
    attention_only = [SlotCandidate(0, attention([]), 0)]
    [adm] = plan_admissions([q], attention_only, checkpoint_interval=64)
    assert adm.checkpoints == ((100, CheckpointKind.PROMPT_END),)


def test_chat_checkpoint_positions() -> None:
    text = "<s>user: hi there</s><s>assistant: <think>hmm</think>ok</s><s>assistant:"
    gen_at = text.rindex("<s>assistant:")
    layout = ChatLayout(text, (0, text.index("<s>assistant")), gen_at, ("hi there", "ok"), ("", "hmm"))
    starts = list(range(len(text)))  # one token per character
    got = chat_checkpoint_positions(layout, starts)
    think = text.index("<think>")
    want = {layout.message_starts[1], text.index("hi there"), text.index("ok</s>"), think}
    want |= set(range(gen_at, min(len(text), gen_at + 16)))
    assert got == sorted(p for p in want if 0 < p < len(text))
