"""Fuzzed GenerateRequest validation: any request is prepared or refused with a ValidationError.

`prepare_generate` (api/validation.py) runs on every request before the engine sees it, with the
tokenizer and chat template of a real model (the corpus's tiny llama, ChatML template). Hypothesis
draws requests field by field (every input kind, sampling values at float edges, NaN and
infinities, stop rules, cache options, chat messages and template kwargs of any JSON shape) and
also decodes random bytes as a request. What validation accepts must be runnable: a prompt inside
the vocabulary and the context, a completion limit that fits, logprob counts within bounds, and
sampling parameters that sample a token from random logits without an error.

Seeded (derandomized) and bounded in CI; HYSERVE_FUZZ_EXAMPLES=N for a longer run.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import message as pb_message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.api.validation import MAX_TOP_LOGPROBS, PreparedRequest, RequestLimits, ValidationError, prepare_generate
from hyserve.engine.sampling import sample
from hyserve.model.loader import LoadedModel, load_model

pytestmark = pytest.mark.fuzz

SEED_MODEL = Path(__file__).parent / "corpus" / "seed-llama.gguf"
LIMITS = RequestLimits(n_ctx=256, default_max_tokens=64)
EXAMPLES = int(os.environ.get("HYSERVE_FUZZ_EXAMPLES", "0"))
TRIED = {"fields": 0, "bytes": 0, "sampled": 0, "accepted": 0}


def budget(ci_examples: int) -> settings:
    return settings(
        max_examples=EXAMPLES or ci_examples,
        derandomize=True,
        deadline=5000,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


_model: LoadedModel | None = None


def model() -> LoadedModel:
    global _model
    if _model is None:
        _model = load_model(SEED_MODEL)
    return _model


# --- strategies -----------------------------------------------------------------------------------

floats32 = st.one_of(
    st.floats(width=32, allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-45, -1e-45, 1e-30, 3e38, -3e38, 1.0, 2.0, -1.0, 0.5]),
)
u32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2, 255, 256, 299, 300, 2**31, 2**32 - 1]))
# most values plausible (so accepted requests get far), some wild: hypothesis tries branches in order
small = st.one_of(st.integers(0, 40), u32)
token_ids = st.one_of(st.integers(0, 299), st.integers(0, 299), st.integers(0, 299), u32)
PLAUSIBLE = {
    "temperature": st.floats(0, 2, width=32),
    "top_p": st.floats(0.5, 1, width=32),
    "min_p": st.floats(0, 1, width=32),
    "repetition_penalty": st.floats(0.5, 2, width=32),
    "presence_penalty": st.floats(-2, 2, width=32),
    "frequency_penalty": st.floats(-2, 2, width=32),
}
text = st.text(max_size=60)
json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def mostly(draw: st.DrawFn, plausible: st.SearchStrategy[Any], wild: st.SearchStrategy[Any]) -> Any:
    """Plausible nine times in ten (so accepted requests get far), wild otherwise."""
    return draw(wild) if draw(st.integers(0, 9)) == 9 else draw(plausible)


@st.composite
def requests(draw: st.DrawFn) -> pb.GenerateRequest:
    req = pb.GenerateRequest()
    if draw(st.booleans()):
        req.task_id = mostly(draw, st.from_regex(r"[A-Za-z0-9._:-]{1,128}", fullmatch=True), text)
    kind = draw(st.sampled_from(["text", "tokens", "chat", "none"]))
    if kind == "text":
        req.text.text = draw(st.one_of(st.text(min_size=1, max_size=60), text, st.just("<|im_start|>hi<|im_end|>")))
        if draw(st.booleans()):
            req.text.add_special = draw(st.booleans())
        if draw(st.booleans()):
            req.text.parse_special = draw(st.booleans())
    elif kind == "tokens":
        req.tokens.SetInParent()
        req.tokens.token_ids.extend(mostly(draw, st.lists(st.integers(0, 299), max_size=300), st.lists(u32)))
    elif kind == "chat":
        req.chat.SetInParent()
        for _ in range(draw(st.integers(0, 4))):
            m = req.chat.messages.add(role=draw(st.sampled_from(["user", "assistant", "system", "tool", "", "x"])))
            m.content = draw(text)
            if draw(st.integers(0, 3)) == 0:
                m.name = draw(text)
            if draw(st.integers(0, 3)) == 0:
                m.reasoning_content = draw(text)
        if draw(st.booleans()):
            req.chat.add_generation_prompt = draw(st.booleans())
        if draw(st.integers(0, 3)) == 0:
            kwargs: dict[str, Any] = draw(
                st.dictionaries(st.sampled_from(["tools", "enable_thinking", "x"]), json_values)
            )
            req.chat.chat_template_kwargs.update(kwargs)
    s = req.sampling
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        if draw(st.booleans()):
            setattr(s, name, mostly(draw, PLAUSIBLE[name], floats32))
    if draw(st.booleans()):
        s.top_k = mostly(draw, st.integers(0, 100), st.integers(-(2**31), 2**31 - 1))
    if draw(st.booleans()):
        s.seed = draw(st.integers(0, 2**64 - 1))
    if draw(st.booleans()):
        req.stopping.max_tokens = mostly(draw, st.integers(0, 40), u32)
    if draw(st.integers(0, 2)) == 0:
        req.stopping.stop_strings.extend(draw(st.lists(text, max_size=3)))
    if draw(st.integers(0, 2)) == 0:
        req.stopping.stop_token_ids.extend(draw(st.lists(token_ids, max_size=3)))
    req.stopping.ignore_eos = draw(st.booleans())
    req.logprobs = draw(st.booleans())
    req.top_logprobs = mostly(draw, st.integers(0, 20), u32)
    if draw(st.booleans()):
        req.cache.cache_prompt = draw(st.booleans())
    req.cache.checkpoint_offsets.extend(draw(st.lists(small, max_size=3)))
    return req


# --- properties -----------------------------------------------------------------------------------


def check(req: pb.GenerateRequest, then_sample: bool = False) -> None:
    m = model()
    try:
        prepared = prepare_generate(req, m.tokenizer, m.chat_template, LIMITS)
    except ValidationError as exc:
        assert str(exc), "a refusal must say what is wrong"
        return
    TRIED["accepted"] += 1
    runnable(prepared, m.tokenizer.vocab_size)
    if then_sample:
        samples_a_token(prepared, m.tokenizer.vocab_size)


def runnable(p: PreparedRequest, vocab: int) -> None:
    """What the engine relies on for an accepted request."""
    assert p.prompt and len(p.prompt) < LIMITS.n_ctx
    assert all(0 <= t < vocab for t in p.prompt)
    assert p.stop.max_tokens >= 1
    assert 0 <= p.top_logprobs <= MAX_TOP_LOGPROBS
    assert all(0 < o <= len(p.prompt) for o in p.checkpoint_offsets)
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        assert math.isfinite(getattr(p.params, name)), name


def samples_a_token(p: PreparedRequest, vocab: int) -> None:
    """Accepted sampling parameters sample a token from random logits (no NaN path)."""
    logits = np.random.default_rng(0).normal(size=vocab).astype(np.float32) * 5
    history = list(p.prompt[-64:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # saturating on the way is fine; the token must come
        token = sample(logits, history, p.params, np.random.default_rng(p.params.seed))
    assert 0 <= token < vocab


@budget(600)
@given(req=requests())
def fields_validate_or_refuse(req: pb.GenerateRequest) -> None:
    TRIED["fields"] += 1
    check(req)


@budget(300)
@given(raw=st.binary(max_size=200))
def bytes_validate_or_refuse(raw: bytes) -> None:
    TRIED["bytes"] += 1
    try:
        req = pb.GenerateRequest.FromString(raw)
    except pb_message.DecodeError:
        return  # the servicer never sees undecodable bytes (grpc answers them)
    check(req)


@budget(300)
@given(req=requests())
def accepted_params_sample(req: pb.GenerateRequest) -> None:
    TRIED["sampled"] += 1
    check(req, then_sample=True)


def test_validation_refuses_or_prepares_runnable_requests(capsys: pytest.CaptureFixture[str]) -> None:
    fields_validate_or_refuse()
    bytes_validate_or_refuse()
    accepted_params_sample()
    with capsys.disabled():
        print(f"\nfuzz: GenerateRequest validation, {TRIED} inputs, no crash")


def test_template_kwargs_that_json_cannot_hold_are_refused() -> None:
    """Found by the long run: an infinite number in chat_template_kwargs raised ValueError."""
    req = pb.GenerateRequest()
    req.chat.messages.add(role="user", content="hi")
    req.chat.chat_template_kwargs.update({"tools": float("inf")})
    m = model()
    with pytest.raises(ValidationError, match="chat_template_kwargs"):
        prepare_generate(req, m.tokenizer, m.chat_template, LIMITS)
