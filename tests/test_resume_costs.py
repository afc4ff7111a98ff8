"""A resume is priced (engine/resume_rates.py, cache_plan/costs.py): a prefix-store entry whose
read costs more than evaluating the tokens it saves is passed over for the slot and counted, one
that costs less is taken, the answer is the same either way; with measured rates the first entry
of a tier is taken and measured; the rates in use are exported as gauges, and the rates an
operator pins are parsed or refused clearly."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest
from engine_ask import ask
from fixtures import make_models
from test_cache_transparency import settle

from hyserve.api.metrics import StatsCollector
from hyserve.api.resume_args import add_resume_arguments, pinned_rates
from hyserve.engine.config import EngineConfig
from hyserve.engine.engine import Engine
from hyserve.engine.resume_rates import PinnedRates, parse_pinned_rates
from hyserve.model.loader import LoadedModel, load_model

PROMPT = [int(t) for t in np.random.default_rng(5).integers(10, 400, size=200)]
FOLLOW_UP = [*PROMPT, 77, 78, 79]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(make_models.write_model(tmp_path_factory.mktemp("costs") / "qwen35.gguf", "qwen35", qtype="q8_0"))


@pytest.fixture(scope="module")
def written_disk(tmp_path_factory: pytest.TempPathFactory, model: LoadedModel) -> Path:
    """A disk tier holding PROMPT's conversation (written as the engine shut down)."""
    path = tmp_path_factory.mktemp("costs") / "disk"
    engine = _engine(model, path)
    ask(engine, PROMPT, 2)
    settle(engine)
    engine.shutdown()
    assert any(path.iterdir())
    return path


@pytest.fixture
def disk_dir(written_disk: Path, tmp_path: Path) -> Path:
    """A copy per test: each engine writes what its slot holds when it shuts down."""
    return Path(shutil.copytree(written_disk, tmp_path / "disk"))


@pytest.fixture(scope="module")
def cold_answer(model: LoadedModel) -> list[int]:
    engine = _engine(model, None)
    try:
        return ask(engine, FOLLOW_UP, 4).tokens
    finally:
        engine.shutdown()


def _engine(model: LoadedModel, disk: Path | None, rates: PinnedRates | None = None) -> Engine:
    config = EngineConfig(
        n_slots=1,
        n_ctx=512,
        prompt_chunk=32,
        cache_dir=str(disk) if disk else None,
        cache_disk_bytes=(1 << 30) if disk else 0,
        model_identity="costs-test",
        resume_rates=rates,
    )
    engine = Engine(model.arch, model.tokenizer, config)
    engine.start()
    return engine


@pytest.mark.parametrize(
    ("rates", "from_disk"),
    [
        # the model evaluates a billion tokens a second, the disk reads a kilobyte: prefill is cheaper
        (PinnedRates(1e9, {"disk": 1e-3}), False),
        # a token a second against a terabyte a second: the entry is cheaper
        (PinnedRates(1.0, {"disk": 1e6}), True),
    ],
)
def test_an_entry_is_taken_only_when_reading_it_costs_less_than_its_prefill(
    model: LoadedModel, disk_dir: Path, cold_answer: list[int], rates: PinnedRates, from_disk: bool
) -> None:
    engine = _engine(model, disk_dir, rates)
    try:
        answer = ask(engine, FOLLOW_UP, 4)
        tier = engine.stats().counters.tiers["disk"]
    finally:
        engine.shutdown()
    assert answer.tokens == cold_answer  # the cache never changes an answer
    accepted = answer.accepted
    if from_disk:
        assert (accepted.store_tier, tier.hits, tier.passed_over) == ("disk", 1, 0)
        assert accepted.reused_tokens >= len(PROMPT)
    else:
        assert (accepted.store_tier, accepted.reused_tokens, tier.hits, tier.passed_over) == ("", 0, 0, 1)


def test_measured_rates_take_a_tiers_first_entry_and_learn_from_it(
    model: LoadedModel, disk_dir: Path, cold_answer: list[int]
) -> None:
    engine = _engine(model, disk_dir)  # nothing pinned: measured
    try:
        rates = engine._loop.stash.rates
        assert rates.costs() is None  # nothing measured yet: the furthest resume
        answer = ask(engine, FOLLOW_UP, 4)
        assert answer.tokens == cold_answer and answer.accepted.store_tier == "disk"
        costs = rates.costs()
    finally:
        engine.shutdown()
    assert costs is not None and costs.prefill_s_per_token > 0 and costs.read_s_per_byte["disk"] > 0


def resume_gauges(engine: Engine) -> dict[tuple[str, tuple[str, ...]], float]:
    """The hyserve_resume_* samples a metrics scrape of this engine would carry."""
    return {
        (m.name, tuple(sample.labels.values())): sample.value
        for m in StatsCollector(engine.stats, 512).collect()
        if m.name.startswith("hyserve_resume_")
        for sample in m.samples
    }


def test_the_prices_resumes_are_weighed_with_are_exported(model: LoadedModel, disk_dir: Path) -> None:
    """Pinned: the gauges carry the pinned rates. Measured: nothing before the first prompt
    forward (the furthest resume), then what the engine learned."""
    pinned = _engine(model, disk_dir, parse_pinned_rates("prefill=2000,disk=800"))
    try:
        settle(pinned)
        assert resume_gauges(pinned) == {
            ("hyserve_resume_prefill_seconds_per_token", ()): pytest.approx(5e-4),
            ("hyserve_resume_read_seconds_per_byte", ("disk",)): pytest.approx(1.25e-9),
        }
    finally:
        pinned.shutdown()
    measured = _engine(model, disk_dir)
    try:
        settle(measured)
        assert resume_gauges(measured) == {}
        ask(measured, FOLLOW_UP, 2)
        settle(measured)
        learned = measured._loop.stash.rates.costs()
        gauges = resume_gauges(measured)
    finally:
        measured.shutdown()
    assert learned is not None and gauges == {
        ("hyserve_resume_prefill_seconds_per_token", ()): learned.prefill_s_per_token,
        ("hyserve_resume_read_seconds_per_byte", ("disk",)): learned.read_s_per_byte["disk"],
    }


def test_the_furthest_choice_ignores_prices(model: LoadedModel, disk_dir: Path) -> None:
    config = EngineConfig(
        n_slots=1,
        n_ctx=512,
        cache_dir=str(disk_dir),
        cache_disk_bytes=1 << 30,
        model_identity="costs-test",
        resume_choice="furthest",
        resume_rates=PinnedRates(1e9, {"disk": 1e-3}),
    )
    engine = Engine(model.arch, model.tokenizer, config)
    engine.start()
    try:
        answer = ask(engine, FOLLOW_UP, 1)
    finally:
        engine.shutdown()
    assert answer.accepted.store_tier == "disk"


def test_pinned_rates_are_parsed_or_refused_with_the_reason() -> None:
    rates = parse_pinned_rates("prefill=2000, disk=800,shared=150.5")
    assert rates == PinnedRates(2000.0, {"disk": 800.0, "shared": 150.5})
    costs = rates.costs()
    assert costs.prefill_s_per_token == pytest.approx(5e-4) and costs.read_s_per_byte["disk"] == pytest.approx(1.25e-9)
    for text, reason in [
        ("disk=800", "prefill=TOKENS_PER_S is required"),
        ("prefill=10,tape=3", "'tape=3': expected"),
        ("prefill=fast", "not a number"),
        ("prefill=10,disk=0", "positive"),
        ("prefill=10,disk=inf", "positive"),
        ("prefill=10,prefill=20", "given twice"),
    ]:
        with pytest.raises(ValueError, match=reason):
            parse_pinned_rates(text)
    p = argparse.ArgumentParser()
    add_resume_arguments(p)
    assert pinned_rates(p.parse_args([])) is None
    with pytest.raises(SystemExit, match="--cache-resume-rates: 'x': expected"):
        pinned_rates(p.parse_args(["--cache-resume-rates", "x"]))
    with pytest.raises(SystemExit):
        p.parse_args(["--cache-resume", "nearest"])
