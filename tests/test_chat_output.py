"""Reasoning and tool calls parsed together from one output, as it streams."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from chat_templates import QWEN35_TEMPLATE, WEATHER_TOOL, qwen
from hypothesis import given, settings
from hypothesis import strategies as st
from test_tool_calls import TOOLS, counter_ids, merged, pieces

from hyserve.chat import (
    ChatEvent,
    ChatOutputParser,
    ContentDelta,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallBegin,
    ToolCallEnd,
    ToolCallFormat,
    detect_tool_call_format,
    parse_chat_output,
    prompt_opens_reasoning,
    reasoning_markers,
)

F = ToolCallFormat
THINK = ("<think>", "</think>")

QWEN_OUTPUT = (
    "The user wants the weather; a <tool_call> needs a city.\n</think>\n\nChecking.\n\n<tool_call>\n"
    "<function=get_weather>\n<parameter=city>\nBern\n</parameter>\n</function>\n</tool_call>"
)


def run(
    chunks: Sequence[str],
    fmt: F | None = F.QWEN_XML,
    markers: tuple[str, str] | None = THINK,
    starts_inside: bool = True,
) -> tuple[list[ChatEvent], str]:
    parser = ChatOutputParser(fmt, TOOLS, markers, starts_inside, make_id=counter_ids())
    events: list[ChatEvent] = []
    for chunk in chunks:
        events += parser.push(chunk)
    tail, kind = parser.finish()
    return events + tail, kind


def test_reasoning_content_and_a_call() -> None:
    events, kind = run([QWEN_OUTPUT])
    assert kind == "tool_calls"
    assert merged(events)[:2] == [
        ReasoningDelta("The user wants the weather; a <tool_call> needs a city."),
        ContentDelta("Checking."),
    ]
    assert [type(e) for e in events[2:]] == [ToolCallBegin, ToolCallArguments, ToolCallEnd]
    end = events[-1]
    assert isinstance(end, ToolCallEnd)
    assert (end.call.id, end.call.name, json.loads(end.call.arguments_json)) == (
        "call_0",
        "get_weather",
        {"city": "Bern"},
    )


@settings(max_examples=80, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=40))
def test_random_chunkings_give_the_same_events(cuts: list[int]) -> None:
    assert merged(run(pieces(QWEN_OUTPUT, cuts))[0]) == merged(run([QWEN_OUTPUT])[0])


def test_every_two_piece_split_gives_the_same_events() -> None:
    whole = merged(run([QWEN_OUTPUT])[0])
    for i in range(len(QWEN_OUTPUT) + 1):
        assert merged(run([QWEN_OUTPUT[:i], QWEN_OUTPUT[i:]])[0]) == whole, i


def test_a_call_inside_the_reasoning_is_not_a_call() -> None:
    text = "<think>\nMaybe <tool_call>\n<function=add>\n</function>\n</tool_call>?\n</think>\n\nNo call needed."
    events, kind = run([text], starts_inside=False)
    assert kind == "stop"
    assert merged(events) == [
        ReasoningDelta("Maybe <tool_call>\n<function=add>\n</function>\n</tool_call>?"),
        ContentDelta("No call needed."),
    ]


def test_without_markers_or_format() -> None:
    events, kind = run(["<think>x</think>Plain"], fmt=None, markers=None)
    assert (merged(events), kind) == ([ContentDelta("<think>x</think>Plain")], "stop")
    events, kind = run(['<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'], F.HERMES, None)
    assert kind == "tool_calls" and [type(e) for e in events] == [ToolCallBegin, ToolCallArguments, ToolCallEnd]


def test_a_malformed_call_finishes_as_stop() -> None:
    events, kind = run(["Done.\n</think>\n\n<tool_call>\n<function=add>\n<parameter=a>\n1"])
    assert kind == "stop"
    assert merged(events) == [
        ReasoningDelta("Done."),
        ContentDelta("<tool_call>\n<function=add>\n<parameter=a>\n1"),
    ]


def test_an_unknown_tool_is_still_a_tool_call_finish() -> None:
    parser = ChatOutputParser(F.HERMES, TOOLS, None, False)
    parser.push('<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>')
    _, kind = parser.finish()
    assert kind == "tool_calls" and [c.known for c in parser.tool_calls] == [False]


@pytest.mark.parametrize("thinking", [True, False])
def test_the_qwen_template_round_trip(thinking: bool) -> None:
    """Render a conversation whose last assistant turn has reasoning, content and two calls; what
    the template puts after the generation prompt parses back into exactly those parts."""
    template = qwen()
    user = [{"role": "user", "content": "Weather in Zürich and Bern, for 2 days?"}]
    calls: list[dict[str, Any]] = [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bern"}}},
    ]
    assistant = {
        "role": "assistant",
        "reasoning_content": "Two cities, so two calls." if thinking else "",
        "content": "Checking both.",
        "tool_calls": calls,
    }
    prompt = template.render(user, tools=[WEATHER_TOOL]).text
    full = template.render([*user, assistant], add_generation_prompt=False, tools=[WEATHER_TOOL]).text
    assert full.startswith(prompt)
    output = full[len(prompt) :].removesuffix("<|im_end|>\n")

    markers = reasoning_markers(QWEN35_TEMPLATE)
    fmt = detect_tool_call_format(QWEN35_TEMPLATE)
    parsed = parse_chat_output(output, fmt, [WEATHER_TOOL], markers, prompt_opens_reasoning(prompt, markers))
    assert parsed.reasoning == assistant["reasoning_content"]
    assert parsed.content == "Checking both."
    assert [(c.name, json.loads(c.arguments_json)) for c in parsed.tool_calls] == [
        ("get_weather", {"city": "Zürich"}),
        ("get_weather", {"city": "Bern"}),
    ]
    assert parsed.finish_kind == "tool_calls"
    assert len({c.id for c in parsed.tool_calls}) == 2
