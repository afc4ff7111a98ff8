"""Tool calls in chat output: the syntax a chat template teaches, the streaming parser (whole text,
every two-piece split, random chunkings), malformed calls, and the grammars that force calls."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import llguidance
import pytest
from chat_templates import CHATML_TEMPLATE, GEMMA3_TEMPLATE, QWEN35_TEMPLATE, WEATHER_TOOL, qwen
from hypothesis import given, settings
from hypothesis import strategies as st

from hyserve.chat import (
    ChatEvent,
    ContentDelta,
    ReasoningDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallBegin,
    ToolCallEnd,
    ToolCallFormat,
    ToolCallStreamParser,
    auto_grammar,
    call_grammar,
    detect_tool_call_format,
    new_call_id,
)

F = ToolCallFormat
TEMPLATES = Path(__file__).resolve().parents[1] / "service" / "hyserve" / "model" / "templates"

# --- shared with the reasoning and chat output tests ------------------------------------------------


def counter_ids() -> Callable[[], str]:
    numbers = itertools.count()
    return lambda: f"call_{next(numbers)}"


def merged(events: Sequence[ChatEvent]) -> list[ChatEvent]:
    """Adjacent deltas of the same kind (and call index) joined: how a client sees the stream."""
    out: list[ChatEvent] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, ContentDelta) and isinstance(last, ContentDelta):
            out[-1] = ContentDelta(last.text + event.text)
        elif isinstance(event, ReasoningDelta) and isinstance(last, ReasoningDelta):
            out[-1] = ReasoningDelta(last.text + event.text)
        elif isinstance(event, ToolCallArguments) and isinstance(last, ToolCallArguments) and last.index == event.index:
            out[-1] = ToolCallArguments(event.index, last.fragment + event.fragment)
        else:
            out.append(event)
    return out


def pieces(text: str, cuts: Sequence[int]) -> list[str]:
    bounds = [0, *sorted({c % (len(text) + 1) for c in cuts}), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


# --- samples ----------------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}, "note": {"type": ["string", "null"]}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]

QWEN_TEXT = (
    "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=add>\n"
    "<parameter=a>\n1\n</parameter>\n<parameter=b>\n2.5\n</parameter>\n</function>\n</tool_call>"
)
HERMES_TEXT = (
    'Sure <tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2.5}}\n</tool_call>'
)
LLAMA_TEXT = (
    '{"name": "get_weather", "parameters": {"city": "Zürich", "days": 3}}; '
    '{"name": "add", "parameters": {"a": 1, "b": 2.5}}'
)
MISTRAL_TEXT = (
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}, '
    '{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2.5}"}]'
)
MISTRAL_ARGS_TEXT = '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich", "days": 3}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2.5}'

SAMPLES = {
    F.QWEN_XML: QWEN_TEXT,
    F.HERMES: HERMES_TEXT,
    F.LLAMA3_JSON: LLAMA_TEXT,
    F.MISTRAL: MISTRAL_TEXT,
    F.MISTRAL_ARGS: MISTRAL_ARGS_TEXT,
}
EXPECTED_CALLS = [("get_weather", {"city": "Zürich", "days": 3}), ("add", {"a": 1, "b": 2.5})]
LEADING_CONTENT = {F.QWEN_XML: "Let me check.", F.HERMES: "Sure"}

# Small realistic templates for syntaxes without a template in the repository.
HERMES_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\nYou are provided with function signatures within <tools></tools>:"
    "\\n<tools>' }}{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\\n</tool_call><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA31_TEMPLATE = (
    "{{- bos_token }}{%- if tools %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\nEnvironment: ipython\\n"
    "<|eot_id|>' }}{%- endif %}{%- for message in messages %}"
    "{%- if message.tool_calls %}{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    '{{- \'{"name": "\' + tool_call.name + \'", "parameters": \' + tool_call.arguments | tojson + "}" }}'
    "{{- '<|eom_id|>' }}{%- elif message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + "
    "'<|eot_id|>' }}{%- endif %}{%- endfor %}"
)
MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{%- if message.role == 'user' %}"
    "{%- if tools and loop.last %}{{- '[AVAILABLE_TOOLS]' + tools | tojson + '[/AVAILABLE_TOOLS]' }}{%- endif %}"
    "{{- '[INST]' + message.content + '[/INST]' }}{%- elif message.tool_calls %}{{- '[TOOL_CALLS][' }}"
    "{%- for tc in message.tool_calls %}{{- {'name': tc.function.name, 'arguments': tc.function.arguments, "
    "'id': tc.id} | tojson }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- ']' + eos_token }}"
    "{%- elif message.role == 'tool' %}{{- '[TOOL_RESULTS]' + message.content + '[/TOOL_RESULTS]' }}"
    "{%- else %}{{- message.content + eos_token }}{%- endif %}{%- endfor %}"
)
MISTRAL_ARGS_TEMPLATE = MISTRAL_TEMPLATE.replace(
    "{{- '[TOOL_CALLS][' }}{%- for tc in message.tool_calls %}{{- {'name': tc.function.name, 'arguments': "
    "tc.function.arguments, 'id': tc.id} | tojson }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}"
    "{{- ']' + eos_token }}",
    "{%- for tc in message.tool_calls %}{{- '[TOOL_CALLS]' + tc.function.name + '[ARGS]' + "
    "tc.function.arguments | tojson }}{%- endfor %}{{- eos_token }}",
)


def parse(
    fmt: F | None, chunks: Sequence[str], tools: Sequence[dict[str, Any]] | None = TOOLS
) -> tuple[list[ChatEvent], list[ToolCall]]:
    parser = ToolCallStreamParser(fmt, tools, make_id=counter_ids())
    events: list[ChatEvent] = []
    for chunk in chunks:
        events += parser.push(chunk)
    events += parser.finish()
    return events, parser.calls


def calls_of(calls: Sequence[ToolCall]) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments_json)) for c in calls]


# --- detection --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (QWEN35_TEMPLATE, F.QWEN_XML),
        (HERMES_TEMPLATE, F.HERMES),
        (LLAMA31_TEMPLATE, F.LLAMA3_JSON),
        (MISTRAL_TEMPLATE, F.MISTRAL),
        (MISTRAL_ARGS_TEMPLATE, F.MISTRAL_ARGS),
        (GEMMA3_TEMPLATE, None),
        (CHATML_TEMPLATE, None),
        ((TEMPLATES / "fallback.jinja").read_text(), None),
        ("", None),
        (None, None),
    ],
)
def test_the_format_is_read_from_the_template(source: str | None, expected: F | None) -> None:
    assert detect_tool_call_format(source) is expected


def test_the_mistral_args_template_differs_from_the_array_one() -> None:
    assert MISTRAL_ARGS_TEMPLATE != MISTRAL_TEMPLATE and "[ARGS]" in MISTRAL_ARGS_TEMPLATE


# --- whole and streamed -----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", list(SAMPLES))
def test_each_format_parses_whole(fmt: F) -> None:
    events, calls = parse(fmt, [SAMPLES[fmt]])
    assert calls_of(calls) == EXPECTED_CALLS
    assert [c.id for c in calls] == ["call_0", "call_1"]
    assert all(c.known for c in calls)
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert content == LEADING_CONTENT.get(fmt, "")
    kinds = [type(e).__name__ for e in events if not isinstance(e, ContentDelta)]
    assert kinds == ["ToolCallBegin", "ToolCallArguments", "ToolCallEnd"] * 2
    for index, call in enumerate(calls):
        begin = next(e for e in events if isinstance(e, ToolCallBegin) and e.index == index)
        end = next(e for e in events if isinstance(e, ToolCallEnd) and e.index == index)
        fragments = "".join(e.fragment for e in events if isinstance(e, ToolCallArguments) and e.index == index)
        assert (begin.id, begin.name) == (call.id, call.name)
        assert end.call == call and fragments == call.arguments_json


@pytest.mark.parametrize("fmt", list(SAMPLES))
def test_every_two_piece_split_gives_the_same_events(fmt: F) -> None:
    text = SAMPLES[fmt]
    whole = merged(parse(fmt, [text])[0])
    for i in range(len(text) + 1):
        assert merged(parse(fmt, [text[:i], text[i:]])[0]) == whole, i


@settings(max_examples=60, deadline=None)
@given(fmt=st.sampled_from(list(SAMPLES)), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=30))
def test_random_chunkings_give_the_same_events(fmt: F, cuts: list[int]) -> None:
    text = SAMPLES[fmt] + " and done"
    assert merged(parse(fmt, pieces(text, cuts))[0]) == merged(parse(fmt, [text])[0])


@settings(max_examples=60, deadline=None)
@given(
    fmt=st.sampled_from(list(SAMPLES)),
    text=st.text(alphabet=st.sampled_from(list('<tool_call>[TOOL_CALLS]{"name": }\n |python_tag')), max_size=60),
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=10),
)
def test_arbitrary_text_never_raises_and_keeps_every_character(fmt: F, text: str, cuts: list[int]) -> None:
    events, calls = parse(fmt, pieces(text, cuts))
    if not calls:
        content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        assert content.strip() == text.strip()
    assert merged(events) == merged(parse(fmt, [text])[0])


def test_a_marker_is_held_back_until_decided_and_plain_text_is_not() -> None:
    parser = ToolCallStreamParser(F.QWEN_XML, TOOLS)
    assert parser.push("Hello world") == [ContentDelta("Hello world")]
    assert parser.push(", then <tool_") == [ContentDelta(", then")]
    assert parser.push("ca") == []
    assert parser.push("rpet") == [ContentDelta(" <tool_carpet")]
    assert parser.push(" <tool_call") == []
    assert parser.push(">\n<function=add>\n") == []
    assert merged(parser.finish()) == [ContentDelta(" <tool_call>\n<function=add>\n")]


def test_a_llama_call_must_open_the_answer() -> None:
    text = 'The JSON is {"name": "get_weather", "parameters": {"city": "Bern"}}'
    events, calls = parse(F.LLAMA3_JSON, [text])
    assert calls == [] and merged(events) == [ContentDelta(text)]
    events, calls = parse(F.LLAMA3_JSON, ['{"name": "Bob", "age": 3} is a person'])
    assert calls == [] and merged(events) == [ContentDelta('{"name": "Bob", "age": 3} is a person')]
    _, calls = parse(F.LLAMA3_JSON, ['<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}'])
    assert calls_of(calls) == [("add", {"a": 1, "b": 2})]


def test_both_body_shapes_are_read_inside_tool_call_tags() -> None:
    json_body = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    xml_body = (
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    for fmt in (F.QWEN_XML, F.HERMES):
        _, calls = parse(fmt, [json_body + "\n" + xml_body])
        assert calls_of(calls) == [("add", {"a": 1, "b": 2})] * 2


def test_content_after_a_call_is_kept() -> None:
    events, calls = parse(
        F.HERMES, ['<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n\nDone.']
    )
    assert len(calls) == 1
    assert isinstance(merged(events)[-1], ContentDelta) and merged(events)[-1] == ContentDelta("Done.")


def test_plain_text_keeps_its_whitespace() -> None:
    events, calls = parse(F.HERMES, ["  Hello\n\n", "world \n"])
    assert calls == [] and merged(events) == [ContentDelta("  Hello\n\nworld \n")]
    events, _ = parse(None, ["<tool_call>\n", '{"name": "add", "arguments": {}}\n</tool_call>'])
    assert merged(events) == [ContentDelta('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>')]


# --- malformed and unknown --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        (F.HERMES, 'Hi <tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>'),
        (F.HERMES, 'Hi <tool_call>\n{"name": "add", "argu'),
        (F.HERMES, 'Hi <tool_call>\n["add", 1]\n</tool_call>'),
        (F.QWEN_XML, "Hi <tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n"),
        (F.QWEN_XML, "Hi <tool_call>\nadd(a=1)\n</tool_call>"),
        (F.QWEN_XML, "Hi <tool_call>\n<function=add>\nstray text\n</function>\n</tool_call>"),
        (F.MISTRAL, 'Hi [TOOL_CALLS][{"arguments": {}}]'),
        (F.MISTRAL, 'Hi [TOOL_CALLS][{"name": "add", "arguments": {"a": 1}'),
        (F.MISTRAL_ARGS, "Hi [TOOL_CALLS] is a marker"),
        (F.MISTRAL_ARGS, 'Hi [TOOL_CALLS]add[ARGS]["a"]'),
        (F.LLAMA3_JSON, '{"name": "add", "parameters": {"a": 1'),
        (F.LLAMA3_JSON, '{"name": "add", "parameters": {"a": NaN}}'),
    ],
)
def test_a_malformed_call_falls_back_to_content(fmt: F, text: str) -> None:
    events, calls = parse(fmt, [text])
    assert calls == []
    assert merged(events) == [ContentDelta(text)]
    for i in range(len(text) + 1):
        assert merged(parse(fmt, [text[:i], text[i:]])[0]) == [ContentDelta(text)], i


def test_a_malformed_call_does_not_spoil_the_next_one() -> None:
    bad = '<tool_call>\n{"name": oops}\n</tool_call>'
    good = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    events, calls = parse(F.HERMES, [bad + "\n" + good])
    assert calls_of(calls) == [("add", {"a": 1, "b": 2})]
    assert merged(events)[0] == ContentDelta(bad)
    assert [e.index for e in events if isinstance(e, ToolCallBegin)] == [0]


def test_unknown_tools_are_parsed_and_flagged() -> None:
    text = '<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>'
    _, calls = parse(F.HERMES, [text])
    assert [(c.name, c.known) for c in calls] == [("launch", False)]
    _, calls = parse(F.HERMES, [text], tools=None)
    assert [(c.name, c.known) for c in calls] == [("launch", True)]


def test_default_ids_are_random_and_url_safe() -> None:
    ids = {new_call_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"call_[A-Za-z0-9_-]{24}", i) for i in ids)
    parser = ToolCallStreamParser(F.HERMES, TOOLS)
    parser.push('<tool_call>\n{"name": "add", "arguments": {}}\n</tool_call>')
    parser.finish()
    assert re.fullmatch(r"call_[A-Za-z0-9_-]{24}", parser.calls[0].id)


# --- Qwen XML values --------------------------------------------------------------------------------

TYPED = {
    "type": "function",
    "function": {
        "name": "typed",
        "parameters": {
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "i": {"type": "integer"},
                "n": {"type": "number"},
                "b": {"type": "boolean"},
                "o": {"type": "object"},
                "a": {"type": "array", "items": {"type": "integer"}},
                "maybe": {"type": ["integer", "null"]},
                "either": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            },
        },
    },
}


def xml_call(values: dict[str, str]) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function=typed>\n{params}</function>\n</tool_call>"


def test_xml_values_follow_the_parameter_types() -> None:
    text = xml_call(
        {
            "s": "42\nsecond line",
            "i": "7",
            "n": "2.5",
            "b": "True",
            "o": '{"k": [1, 2]}',
            "a": "[1, 2]",
            "maybe": "null",
            "either": '"quoted"',
        }
    )
    _, calls = parse(F.QWEN_XML, [text], tools=[TYPED])
    assert calls_of(calls) == [
        (
            "typed",
            {
                "s": "42\nsecond line",
                "i": 7,
                "n": 2.5,
                "b": True,
                "o": {"k": [1, 2]},
                "a": [1, 2],
                "maybe": None,
                "either": "quoted",
            },
        )
    ]


def test_xml_values_that_do_not_fit_their_type_stay_text() -> None:
    values = {"i": "seven", "n": "NaN", "o": "{broken", "either": "plain"}
    _, calls = parse(F.QWEN_XML, [xml_call(values)], tools=[TYPED])
    assert calls_of(calls) == [("typed", values)]


def test_xml_values_without_tools_are_json_when_they_parse() -> None:
    _, calls = parse(F.QWEN_XML, [xml_call({"s": "Bern", "i": "7", "o": '{"k": 1}', "e": ""})], tools=None)
    assert calls_of(calls) == [("typed", {"s": "Bern", "i": 7, "o": {"k": 1}, "e": ""})]


def test_the_qwen_template_rendering_of_a_call_parses_back() -> None:
    """What the Qwen3.5 template renders for an assistant tool call is what the parser reads."""
    messages = [
        {"role": "user", "content": "Weather in Zürich and Bern?"},
        {
            "role": "assistant",
            "content": "Checking both.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bern"}}},
            ],
        },
    ]
    text = qwen().render(messages, add_generation_prompt=False, tools=[WEATHER_TOOL, WEATHER]).text
    answer = text.split("<|im_start|>assistant\n")[-1].removesuffix("<|im_end|>\n")
    answer = answer.split("</think>\n\n")[-1]
    events, calls = parse(F.QWEN_XML, [answer], tools=[WEATHER])
    assert calls_of(calls) == [("get_weather", {"city": "Zürich", "days": 2}), ("get_weather", {"city": "Bern"})]
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "Checking both."


# --- grammars ---------------------------------------------------------------------------------------


class _ByteTokenizer:
    """One token per byte, and an end-of-sequence token."""

    eos_token_id = 256
    bos_token_id = None
    tokens: ClassVar[list[bytes]] = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids: ClassVar[list[int]] = [256]

    def __call__(self, data: bytes) -> list[int]:
        return list(data)


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokenizer()))


def accepts(grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(TOKENIZER, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    tokens = list(text.encode())
    if matcher.validate_tokens(tokens) != len(tokens):
        return False
    assert matcher.consume_tokens(tokens)
    return matcher.is_accepting()


ONE_CALL = {
    F.QWEN_XML: "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n3\n"
    "</parameter>\n</function>\n</tool_call>",
    F.HERMES: '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}\n</tool_call>',
    F.LLAMA3_JSON: '{"name": "get_weather", "parameters": {"city": "Zürich", "days": 3}}',
    F.MISTRAL: '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}}]',
    F.MISTRAL_ARGS: '[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich", "days": 3}',
}
WRONG_TYPE = {f: t.replace("3", '"three"') for f, t in ONE_CALL.items()}
WRONG_TYPE[F.QWEN_XML] = ONE_CALL[F.QWEN_XML].replace("\n3\n", "\nthree\n")
MISSING = {
    F.QWEN_XML: "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
    F.HERMES: '<tool_call>\n{"name": "get_weather", "arguments": {"days": 3}}\n</tool_call>',
    F.LLAMA3_JSON: '{"name": "get_weather", "parameters": {"days": 3}}',
    F.MISTRAL: '[TOOL_CALLS][{"name": "get_weather", "arguments": {"days": 3}}]',
    F.MISTRAL_ARGS: '[TOOL_CALLS]get_weather[ARGS]{"days": 3}',
}
UNKNOWN = {f: t.replace("get_weather", "get_time") for f, t in ONE_CALL.items()}
PAIR = {
    F.QWEN_XML: ONE_CALL[F.QWEN_XML] + "\n" + ONE_CALL[F.QWEN_XML],
    F.HERMES: ONE_CALL[F.HERMES] + "\n" + ONE_CALL[F.HERMES],
    F.LLAMA3_JSON: ONE_CALL[F.LLAMA3_JSON] + "\n" + ONE_CALL[F.LLAMA3_JSON],
    F.MISTRAL: ONE_CALL[F.MISTRAL][:-1] + ", " + ONE_CALL[F.MISTRAL][len("[TOOL_CALLS][") :],
    F.MISTRAL_ARGS: ONE_CALL[F.MISTRAL_ARGS] + ONE_CALL[F.MISTRAL_ARGS],
}


@pytest.mark.parametrize("fmt", list(ONE_CALL))
def test_the_call_grammar_accepts_valid_calls_and_rejects_invalid_ones(fmt: F) -> None:
    grammar = call_grammar(fmt, TOOLS, "required")
    assert llguidance.LLMatcher.validate_grammar(grammar, TOKENIZER) == ""
    assert accepts(grammar, ONE_CALL[fmt])
    assert accepts(grammar, PAIR[fmt])
    assert not accepts(grammar, WRONG_TYPE[fmt])
    assert not accepts(grammar, MISSING[fmt])
    assert not accepts(grammar, UNKNOWN[fmt])
    assert not accepts(grammar, "The weather is fine.")
    assert not accepts(grammar, "")


@pytest.mark.parametrize("fmt", list(ONE_CALL))
def test_what_the_grammar_accepts_the_parser_reads(fmt: F) -> None:
    for text in (ONE_CALL[fmt], PAIR[fmt]):
        assert accepts(call_grammar(fmt, TOOLS), text)
        _, calls = parse(fmt, [text])
        assert calls_of(calls) == [("get_weather", {"city": "Zürich", "days": 3})] * (1 if text == ONE_CALL[fmt] else 2)


@pytest.mark.parametrize("fmt", list(ONE_CALL))
def test_a_named_choice_and_no_parallel_calls(fmt: F) -> None:
    named = call_grammar(fmt, TOOLS, "get_weather", parallel=False)
    assert accepts(named, ONE_CALL[fmt])
    assert not accepts(named, PAIR[fmt])
    add = call_grammar(fmt, TOOLS, "add")
    assert not accepts(add, ONE_CALL[fmt])


@pytest.mark.parametrize("fmt", list(ONE_CALL))
def test_the_auto_grammar_allows_text_but_constrains_a_started_call(fmt: F) -> None:
    grammar = auto_grammar(fmt, TOOLS)
    assert llguidance.LLMatcher.validate_grammar(grammar, TOKENIZER) == ""
    assert accepts(grammar, "The weather is fine.")
    assert accepts(grammar, "")
    assert accepts(grammar, ONE_CALL[fmt])
    assert accepts(grammar, PAIR[fmt])
    assert not accepts(grammar, WRONG_TYPE[fmt])
    assert not accepts(grammar, MISSING[fmt])
    assert not accepts(grammar, UNKNOWN[fmt])
    if fmt is not F.LLAMA3_JSON:
        assert accepts(grammar, "Let me look.\n\n" + ONE_CALL[fmt])
        marker = "<tool_call>" if fmt in (F.QWEN_XML, F.HERMES) else "[TOOL_CALLS]"
        assert not accepts(grammar, f"Let me look. {marker} no call here")


def test_xml_string_values_cannot_contain_the_closing_tag() -> None:
    grammar = call_grammar(F.QWEN_XML, TOOLS, "get_weather")
    multi_line = ONE_CALL[F.QWEN_XML].replace("Zürich", "Zürich\nand <b>more</b>")
    assert accepts(grammar, multi_line)
    assert not accepts(grammar, ONE_CALL[F.QWEN_XML].replace("Zürich", "Zü</parameter>rich"))
    enum_ok = ONE_CALL[F.QWEN_XML].replace("</function>", "<parameter=unit>\nc\n</parameter>\n</function>")
    assert accepts(grammar, enum_ok)
    assert not accepts(grammar, enum_ok.replace("\nc\n", "\nkelvin\n"))


def test_a_grammar_needs_tools_and_a_known_choice() -> None:
    with pytest.raises(ValueError, match="at least one tool"):
        call_grammar(F.HERMES, [], "required")
    with pytest.raises(ValueError, match="not among the tools"):
        call_grammar(F.HERMES, TOOLS, "get_time")
