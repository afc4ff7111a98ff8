"""Reasoning split from the answer: markers from the template, a prompt that already opened the
reasoning, markers cut between pieces, and the whitespace the templates put around the markers."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from chat_templates import CHATML_TEMPLATE, GEMMA3_TEMPLATE, QWEN35_TEMPLATE, qwen
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tool_calls import merged, pieces

from hyserve.chat import ChatEvent, ContentDelta, ReasoningDelta, ReasoningSplitter
from hyserve.chat.reasoning import prompt_opens_reasoning, reasoning_markers

MAGISTRAL_TEMPLATE = (
    "{%- for message in messages %}{%- if message.role == 'user' %}{{- '[INST]' + message.content + '[/INST]' }}"
    "{%- elif message.role == 'assistant' %}{%- if message.reasoning_content %}"
    "{{- '[THINK]' + message.reasoning_content + '[/THINK]' }}{%- endif %}{{- message.content + eos_token }}"
    "{%- endif %}{%- endfor %}"
)


def split(
    chunks: Sequence[str], *, starts_inside: bool = False, markers: tuple[str, str] = ("<think>", "</think>")
) -> list[ChatEvent]:
    splitter = ReasoningSplitter(*markers, starts_inside=starts_inside)
    events: list[ChatEvent] = []
    for chunk in chunks:
        events += splitter.push(chunk)
    return events + splitter.finish()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (QWEN35_TEMPLATE, ("<think>", "</think>")),
        (MAGISTRAL_TEMPLATE, ("[THINK]", "[/THINK]")),
        (GEMMA3_TEMPLATE, None),
        (CHATML_TEMPLATE, None),
        (None, None),
    ],
)
def test_markers_are_read_from_the_template(source: str | None, expected: tuple[str, str] | None) -> None:
    assert reasoning_markers(source) == expected


def test_the_qwen_prompt_opens_the_reasoning_only_when_thinking_is_on() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    markers = reasoning_markers(QWEN35_TEMPLATE)
    on = qwen().render(messages).text
    off = qwen().render(messages, enable_thinking=False).text
    assert on.endswith("<think>\n") and prompt_opens_reasoning(on, markers)
    assert not prompt_opens_reasoning(off, markers)
    assert not prompt_opens_reasoning(on, None)
    assert not prompt_opens_reasoning("<|im_start|>user\nWhat does <think> mean?<|im_end|>\n", markers)


CASES = [
    # (output, starts_inside, reasoning, content)
    ("<think>\nFirst this.\nThen that.\n</think>\n\nThe answer.", False, "First this.\nThen that.", "The answer."),
    ("First this.\n</think>\n\nThe answer.", True, "First this.", "The answer."),
    ("\n\n</think>\n\nThe answer.", True, "", "The answer."),
    ("The answer, no thinking.", False, "", "The answer, no thinking."),
    ("  The answer.\n", False, "", "  The answer.\n"),
    ("The <think> tag is literal.", False, "", "The <think> tag is literal."),
    ("<think>\nCut off by the token limit", False, "Cut off by the token limit", ""),
    ("Cut off </thi", True, "Cut off </thi", ""),
    ("<thi", False, "", "<thi"),
    ("<think>a</think>b</think>c", False, "a", "b</think>c"),
    ("", True, "", ""),
]


@pytest.mark.parametrize(("text", "inside", "reasoning", "content"), CASES)
def test_reasoning_and_content_are_split(text: str, inside: bool, reasoning: str, content: str) -> None:
    events = split([text], starts_inside=inside)
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == reasoning
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == content
    assert all(e.text for e in events), "no empty deltas"
    for i in range(len(text) + 1):
        assert merged(split([text[:i], text[i:]], starts_inside=inside)) == merged(events), i


@settings(max_examples=80, deadline=None)
@given(case=st.sampled_from(CASES), cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=20))
def test_random_chunkings_give_the_same_events(case: tuple[str, bool, str, str], cuts: list[int]) -> None:
    text, inside = case[0], case[1]
    assert merged(split(pieces(text, cuts), starts_inside=inside)) == merged(split([text], starts_inside=inside))


def test_reasoning_is_released_promptly_and_a_cut_marker_held_back() -> None:
    splitter = ReasoningSplitter(starts_inside=True)
    assert splitter.push("Let me think") == [ReasoningDelta("Let me think")]
    assert splitter.push(" about it</th") == [ReasoningDelta(" about it")]
    assert splitter.push("ink>") == []
    assert splitter.push("\n\nYes") == [ContentDelta("Yes")]
    assert splitter.finish() == []


def test_other_markers() -> None:
    events = split(["[THINK]Plan.[/THI", "NK]Done."], markers=("[THINK]", "[/THINK]"))
    assert merged(events) == [ReasoningDelta("Plan."), ContentDelta("Done.")]


def test_push_after_finish_is_an_error() -> None:
    splitter = ReasoningSplitter()
    splitter.finish()
    with pytest.raises(RuntimeError):
        splitter.push("x")
    with pytest.raises(ValueError):
        ReasoningSplitter("", "</think>")
