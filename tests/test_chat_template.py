"""Tests for hyserve.model.chat_template: HF-compatible rendering and message offsets."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest

from hyserve.engine.cache_plan import message_token_offsets
from hyserve.model.chat_template import ChatTemplate, ChatTemplateError, RenderedChat

# The public Gemma 3 instruct chat template (google/gemma-3-*-it tokenizer_config.json).
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# The classic ChatML template.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen3.5-style template, following the logic of the public Qwen3 / Qwen3.5 templates: ChatML
# turns, a tools system block, <think> blocks kept only for assistant turns after the last real
# user query (taken from reasoning_content or split out of the content), XML-style tool calls,
# grouped tool responses, "No user query found" / role errors, enable_thinking.
QWEN35_TEMPLATE = """{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count, is_system_content=false) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain images.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Picture ' ~ image_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- else %}
                {{- raise_exception('Unexpected item type in content.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- else %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\\n' }}
    {{- "# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>" }}
    {{- '\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n' }}
    {{- '<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n' }}
    {{- '</parameter>\\n</function>\\n</tool_call>' }}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {%- if content %}
            {{- '\\n\\n' + content }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true)|trim %}
    {%- if message.role == "system" %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')
                                                  .split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- set reasoning_content = reasoning_content|trim %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content + '\\n</think>\\n\\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first %}
                    {%- if content|trim %}
                        {{- '\\n\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                    {%- else %}
                        {{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                    {%- endif %}
                {%- else %}
                    {{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                {%- endif %}
                {%- if tool_call.arguments is defined %}
                    {%- for args_name, args_value in tool_call.arguments|items %}
                        {{- '<parameter=' + args_name + '>\\n' }}
                        {%- set args_value = args_value | tojson | safe
                              if args_value is mapping or (args_value is sequence and args_value is not string)
                              else args_value | string %}
                        {{- args_value }}
                        {{- '\\n</parameter>\\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — Zürich, 東京, ...",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def gemma() -> ChatTemplate:
    return ChatTemplate(GEMMA3_TEMPLATE, bos_token="<bos>", eos_token="<eos>", name="gemma3")


def chatml() -> ChatTemplate:
    return ChatTemplate(CHATML_TEMPLATE, bos_token="", eos_token="<|im_end|>", name="chatml")


def qwen() -> ChatTemplate:
    return ChatTemplate(QWEN35_TEMPLATE, bos_token="<|endoftext|>", eos_token="<|im_end|>", name="qwen35")


def check_offsets(rendered: RenderedChat, expected_starts: list[str]) -> None:
    """text[offset_i:] starts with the expected rendering of message i, which occurs nowhere
    between the previous message's offset and offset_i; offsets are strictly increasing."""
    text, offsets = rendered.text, rendered.message_char_offsets
    assert len(offsets) == len(expected_starts)
    assert offsets == sorted(offsets)
    assert all(0 <= off <= len(text) for off in offsets)
    search_from = 0
    for i, (off, start) in enumerate(zip(offsets, expected_starts, strict=True)):
        assert text[off:].startswith(start), (i, off, text[off : off + 60], start)
        assert text.find(start, search_from) == off, (i, off, text.find(start, search_from))
        search_from = off + 1
    assert rendered.generation_prompt_offset is not None
    assert offsets[-1] <= rendered.generation_prompt_offset <= len(text)


# --------------------------------------------------------------------------------- Gemma 3


def test_gemma_render_matches_hf_format() -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Hello  "},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Bye"},
    ]
    r = gemma().render(msgs)
    assert r.text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHello<end_of_turn>\n"
        "<start_of_turn>model\nHi!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )


def test_gemma_offsets_with_folded_system() -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Bye"},
    ]
    r = gemma().render(msgs)
    # The system message has no turn of its own: it starts the conversation (offset 0) and the
    # first user turn, which carries it, starts right after <bos>.
    assert r.message_char_offsets[0] == 0
    assert r.message_char_offsets[1] == len("<bos>")
    check_offsets(
        r,
        [
            "<bos><start_of_turn>user\nBe brief.",
            "<start_of_turn>user\nBe brief.\n\nHello",
            "<start_of_turn>model\nHi!",
            "<start_of_turn>user\nBye",
        ],
    )
    assert r.text[r.generation_prompt_offset :] == "<start_of_turn>model\n"


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gemma_offsets_without_system(add_generation_prompt: bool) -> None:
    msgs = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "Sure?"},
        {"role": "assistant", "content": "Yes."},
    ]
    r = gemma().render(msgs, add_generation_prompt=add_generation_prompt)
    assert r.text.startswith("<bos><start_of_turn>user\n<start_of_image>What?<end_of_turn>\n")
    # Rendering an empty conversation fails in this template, so the first message's start
    # falls back to 0 (before <bos>), which is still not past the message.
    assert r.message_char_offsets[0] == 0
    check_offsets(
        r,
        [
            "<bos><start_of_turn>user\n<start_of_image>",
            "<start_of_turn>model\nA cat.",
            "<start_of_turn>user\nSure?",
            "<start_of_turn>model\nYes.",
        ],
    )
    expected_end = len(r.text) - (len("<start_of_turn>model\n") if add_generation_prompt else 0)
    assert r.generation_prompt_offset == expected_end


def test_gemma_raises_on_non_alternating_roles() -> None:
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError) as info:
        gemma().render(msgs)
    assert str(info.value) == "Conversation roles must alternate user/assistant/user/assistant/..."
    assert info.value.template_name == "gemma3"


# --------------------------------------------------------------------------------- ChatML


@pytest.mark.parametrize(
    "msgs",
    [
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Again"},
            {"role": "assistant", "content": ""},
        ],
        # Identical messages: offsets must still advance one turn at a time.
        [{"role": "user", "content": "same"}, {"role": "user", "content": "same"}],
    ],
)
def test_chatml_offsets(msgs: list[dict[str, Any]]) -> None:
    r = chatml().render(msgs)
    check_offsets(r, [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>" for m in msgs])
    assert r.text[r.generation_prompt_offset :] == "<|im_start|>assistant\n"
    # For an append-only template, each offset is exactly the length of the prefix render.
    for i, off in enumerate(r.message_char_offsets):
        assert off == len(chatml().render(msgs[:i], add_generation_prompt=False).text)


def test_empty_conversation_gives_no_offsets() -> None:
    r = chatml().render([])
    assert r.text == "<|im_start|>assistant\n"
    assert r.message_char_offsets == []
    assert r.generation_prompt_offset == 0


# --------------------------------------------------------------------------------- Qwen3.5


def test_qwen_basic_render_and_offsets() -> None:
    msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"}]
    r = qwen().render(msgs)
    assert r.text == (
        "<|im_start|>system\nYou are helpful.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    # render([system]) raises "No user query found" in this template; the offset of the user
    # message must still be exact.
    check_offsets(r, ["<|im_start|>system\nYou are helpful.", "<|im_start|>user\nHi"])
    assert r.text[r.generation_prompt_offset :] == "<|im_start|>assistant\n<think>\n"


def test_qwen_enable_thinking_false() -> None:
    r = qwen().render([{"role": "user", "content": "Hi"}], enable_thinking=False)
    assert r.text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    check_offsets(r, ["<|im_start|>user\nHi"])


def test_qwen_drops_reasoning_before_last_query() -> None:
    msgs = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\nIt is 4."},
        {"role": "user", "content": "And 3+3?"},
    ]
    r = qwen().render(msgs)
    assert "Add them." not in r.text
    assert r.text == (
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\nIt is 4.<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n"
    )
    # The prefix render [user, assistant] keeps the <think> block, so it is not a prefix of the
    # full text; the offsets must still point at the real starts.
    check_offsets(
        r,
        [
            "<|im_start|>user\nWhat is 2+2?",
            "<|im_start|>assistant\nIt is 4.",
            "<|im_start|>user\nAnd 3+3?",
        ],
    )
    # The previous assistant message starts exactly where the first turn's prompt ended.
    first_turn = qwen().render(msgs[:1])
    assert r.message_char_offsets[1] == first_turn.generation_prompt_offset
    assert r.text[: r.message_char_offsets[1]] == first_turn.text[: r.message_char_offsets[1]]


def test_qwen_keeps_reasoning_after_last_query() -> None:
    msgs = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A", "reasoning_content": "thinking..."},
    ]
    r = qwen().render(msgs, add_generation_prompt=False)
    assert r.text.endswith("<|im_start|>assistant\n<think>\nthinking...\n</think>\n\nA<|im_end|>\n")
    check_offsets(r, ["<|im_start|>user\nQ", "<|im_start|>assistant\n<think>\nthinking..."])
    assert r.generation_prompt_offset == len(r.text)


def _tool_call(city: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}


def test_qwen_tool_loop_then_new_query_offsets() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Zürich and 東京?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need two lookups.",
            "tool_calls": [_tool_call("Zürich")],
        },
        {"role": "tool", "content": "12°C, rain"},
        {
            "role": "assistant",
            "content": "One more.",
            "reasoning_content": "Now Tokyo.",
            "tool_calls": [_tool_call("東京")],
        },
        {"role": "tool", "content": "20°C, sun"},
        {"role": "assistant", "content": "Zürich 12°C, 東京 20°C.", "reasoning_content": "Done."},
        {"role": "user", "content": "Thanks!"},
    ]
    r = qwen().render(msgs, tools=[WEATHER_TOOL])
    text = r.text
    # All reasoning precedes the last query and is dropped.
    for reasoning in ("Need two lookups.", "Now Tokyo.", "Done."):
        assert reasoning not in text
    # tojson in the template keeps non-ASCII characters.
    assert "Zürich, 東京" in text
    assert text.startswith("<|im_start|>system\n# Tools\n")
    check_offsets(
        r,
        [
            "<|im_start|>system\n# Tools",
            "<|im_start|>user\nWeather in Zürich",
            "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich",
            "<|im_start|>user\n<tool_response>\n12°C, rain",
            "<|im_start|>assistant\nOne more.\n\n<tool_call>",
            "<|im_start|>user\n<tool_response>\n20°C, sun",
            "<|im_start|>assistant\nZürich 12°C",
            "<|im_start|>user\nThanks!",
        ],
    )
    # The system message's tools block comes first, then the user message.
    assert r.message_char_offsets[0] == 0


def test_qwen_tool_loop_in_progress_offsets() -> None:
    # During the tool loop the reasoning is kept (after the last query), consecutive tool
    # results share one user turn.
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "<think>\nTwo cities.\n</think>\n\n",
            "tool_calls": [_tool_call("A"), _tool_call("B")],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "cloudy"},
    ]
    r = qwen().render(msgs, tools=[WEATHER_TOOL])
    assert "<think>\nTwo cities.\n</think>\n\n<tool_call>" in r.text
    check_offsets(
        r,
        [
            "<|im_start|>user\nWeather?",
            "<|im_start|>assistant\n<think>\nTwo cities.",
            "<|im_start|>user\n<tool_response>\nsunny",
            "\n<tool_response>\ncloudy",
        ],
    )


def test_qwen_several_dropped_turns_offsets() -> None:
    msgs: list[dict[str, Any]] = []
    expected: list[str] = []
    for k in range(4):
        msgs.append({"role": "user", "content": f"question {k}"})
        expected.append(f"<|im_start|>user\nquestion {k}")
        msgs.append({"role": "assistant", "content": f"<think>\nr{k}\n</think>\n\nanswer {k}"})
        expected.append(f"<|im_start|>assistant\nanswer {k}")
    msgs.append({"role": "user", "content": "last"})
    expected.append("<|im_start|>user\nlast")
    r = qwen().render(msgs)
    check_offsets(r, expected)


def test_offsets_reused_across_turns_match_fresh_renders() -> None:
    # One template instance serves a whole conversation turn by turn (its memo of earlier
    # renderings is used); every turn must give the offsets a fresh instance gives, including
    # after an earlier message is edited and when the tools change.
    shared = qwen()
    turns: list[list[dict[str, Any]]] = []
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "S"}]
    for k in range(4):
        msgs.append({"role": "user", "content": f"question {k}"})
        turns.append(list(msgs))
        msgs.append(
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": f"look up {k}",
                "tool_calls": [_tool_call(f"city {k}")],
            }
        )
        msgs.append({"role": "tool", "content": f"result {k}"})
        turns.append(list(msgs))
        msgs.append({"role": "assistant", "content": f"answer {k}", "reasoning_content": f"r{k}"})
    turns.append(list(msgs))
    edited = [dict(m) for m in msgs]
    edited[3] = {**edited[3], "content": "now different"}
    turns.append(edited)
    for tools in (None, [WEATHER_TOOL]):
        for conv in turns:
            got = shared.render(conv, tools=tools)
            want = qwen().render(conv, tools=tools)
            assert got == want


def test_qwen_no_user_query_raises() -> None:
    with pytest.raises(ChatTemplateError, match=r"^No user query found in messages\.$"):
        qwen().render([{"role": "system", "content": "S"}])


# --------------------------------------------------------------------------------- helpers


def test_raise_exception_message_is_the_templates() -> None:
    t = ChatTemplate("{{ raise_exception('Bad role: ' + messages[0].role) }}", name="strict")
    with pytest.raises(ChatTemplateError) as info:
        t.render([{"role": "robot", "content": "x"}])
    assert str(info.value) == "Bad role: robot"
    assert info.value.template_name == "strict"
    assert isinstance(info.value, ValueError)


def test_strftime_now() -> None:
    t = ChatTemplate("Today is {{ strftime_now('%Y-%m-%d') }}.")
    before = datetime.date.today().isoformat()
    text = t.render([]).text
    after = datetime.date.today().isoformat()
    assert text in (f"Today is {before}.", f"Today is {after}.")


def test_tojson_keeps_non_ascii_and_html() -> None:
    t = ChatTemplate("{{ messages[0] | tojson }}")
    msg = {"role": "user", "content": "héllo 世界 <b>&</b> 'q'"}
    assert t.render([msg]).text == '{"role": "user", "content": "héllo 世界 <b>&</b> \'q\'"}'


def test_tojson_options() -> None:
    value = {"b": [1, 2], "a": "é"}
    cases = {
        "{{ v | tojson(indent=2) }}": '{\n  "b": [\n    1,\n    2\n  ],\n  "a": "é"\n}',
        "{{ v | tojson(separators=(',', ':')) }}": '{"b":[1,2],"a":"é"}',
        "{{ v | tojson(sort_keys=true) }}": '{"a": "é", "b": [1, 2]}',
        "{{ v | tojson(ensure_ascii=true) }}": '{"b": [1, 2], "a": "\\u00e9"}',
    }
    for source, expected in cases.items():
        assert ChatTemplate(source).render([], v=value).text == expected, source


def test_variables_and_extra_kwargs() -> None:
    source = (
        "[{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools | tojson }}"
        "|{{ documents | tojson }}|{{ enable_thinking }}]"
    )
    t = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    assert t.render([]).text == "[<s>|</s>|True|null|null|]"
    text = t.render(
        [],
        add_generation_prompt=False,
        tools=[{"name": "f"}],
        documents=[{"title": "t"}],
        enable_thinking=False,
    ).text
    assert text == '[<s>|</s>|False|[{"name": "f"}]|[{"title": "t"}]|False]'
    # Extra keyword arguments override the special tokens, as in transformers.
    assert t.render([], bos_token="<B>").text.startswith("[<B>|")


def test_trim_and_lstrip_blocks_and_loopcontrols() -> None:
    source = (
        "{% for m in messages %}\n"
        "    {% if loop.index0 == 2 %}{% break %}{% endif %}\n"
        "    {% if m.role == 'skip' %}{% continue %}{% endif %}\n"
        "{{ m.content }}\n"
        "{% endfor %}"
    )
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "skip", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    assert ChatTemplate(source).render(msgs).text == "a\n"


def test_generation_block_is_accepted() -> None:
    source = (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}"
        "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %};{% endfor %}"
    )
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    assert ChatTemplate(source).render(msgs).text == "u;a;"


def test_sandbox_blocks_mutation() -> None:
    t = ChatTemplate("{{ messages.append({'role': 'x'}) }}", name="evil")
    with pytest.raises(ChatTemplateError, match="evil"):
        t.render([{"role": "user", "content": "x"}])


def test_render_errors_become_chat_template_errors() -> None:
    # A type error inside the template (content None concatenated to a string).
    with pytest.raises(ChatTemplateError, match="chatml"):
        chatml().render([{"role": "assistant", "content": None}])
    # Undefined attribute access on an undefined value.
    with pytest.raises(ChatTemplateError):
        gemma().render([])


def test_syntax_error_names_the_template() -> None:
    with pytest.raises(ChatTemplateError) as info:
        ChatTemplate("{% for m in messages %}{{ m.content }}", name="broken.jinja")
    assert "broken.jinja" in str(info.value)
    assert info.value.template_name == "broken.jinja"
    with pytest.raises(ChatTemplateError, match="line 2"):
        ChatTemplate("ok\n{{ 1 + }}", name="x")


def test_inputs_are_not_mutated_and_mappings_work() -> None:
    from types import MappingProxyType

    msgs = (MappingProxyType({"role": "user", "content": "hi"}),)
    r = chatml().render(msgs, tools=(MappingProxyType({"name": "f"}),))
    assert r.text.startswith("<|im_start|>user\nhi<|im_end|>\n")


# --------------------------------------------------------------------------------- fallback


def test_fallback_template_format() -> None:
    t = ChatTemplate.fallback(bos_token="<bos>", eos_token="<eos>")
    assert t.name == "fallback"
    msgs = [
        {"role": "system", "content": "Be nice."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "image"}, "there"]},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    r = t.render(msgs)
    assert r.text == ("<bos>system: Be nice.\n\nuser: Hi there\n\nassistant: Hello.\n\nuser: Bye\n\nassistant:")
    check_offsets(r, ["system: Be nice.", "user: Hi there", "assistant: Hello.", "user: Bye"])
    assert r.text[r.generation_prompt_offset :] == "assistant:"
    assert t.render(msgs[:1], add_generation_prompt=False).text == "<bos>system: Be nice.\n\n"


def test_fallback_tools_and_tool_calls() -> None:
    t = ChatTemplate.fallback()
    msgs = [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [_tool_call("Zürich")]},
        {"role": "tool", "content": "12°C"},
    ]
    r = t.render(msgs, tools=[{"name": "get_weather"}], add_generation_prompt=False)
    assert r.text == (
        'tools:\n{"name": "get_weather"}\n\n'
        "user: Weather in Zürich?\n\n"
        'assistant: \ntool_calls: [{"type": "function", "function": {"name": "get_weather", '
        '"arguments": {"city": "Zürich"}}}]\n\n'
        "tool: 12°C\n\n"
    )
    check_offsets(r, ["user: Weather", "assistant: \ntool_calls", "tool: 12°C"])


def test_fallback_requires_roles() -> None:
    with pytest.raises(ChatTemplateError, match="message 0 has no role"):
        ChatTemplate.fallback().render([{"content": "x"}])


def test_from_file(tmp_path: Path) -> None:
    path = tmp_path / "custom.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}", "utf-8")
    t = ChatTemplate.from_file(path, bos_token="<s>")
    assert t.name == "custom.jinja"
    msgs = [{"role": "user", "content": "é"}, {"role": "assistant", "content": "ok"}]
    r = t.render(msgs)
    assert r.text == "[user] é\n[assistant] ok\n"
    assert r.message_char_offsets == [0, len("[user] é\n")]
    with pytest.raises(ChatTemplateError, match=r"missing\.jinja"):
        ChatTemplate.from_file(tmp_path / "missing.jinja")


# --------------------------------------------------------------------------------- tokens


def test_message_token_offsets_exact_boundaries() -> None:
    # tokens: "<s>" "ab" "c" "de" starting at 0, 3, 5, 6
    starts = [0, 3, 5, 6]
    assert message_token_offsets([0, 3, 5, 6], starts) == [0, 1, 2, 3]


def test_message_token_offsets_inside_a_token() -> None:
    starts = [0, 3, 5, 6]
    # 4 lies inside token 1 ("ab" covers 3..4): return that token, never a later one.
    assert message_token_offsets([4], starts) == [1]
    assert message_token_offsets([1, 2, 4, 7, 100], starts) == [0, 0, 1, 3, 3]


def test_message_token_offsets_shared_starts() -> None:
    # Byte-fallback pieces of one character share its start offset: pick the first piece.
    starts = [0, 2, 2, 2, 3]
    assert message_token_offsets([2, 3, 1], starts) == [1, 4, 0]


def test_message_token_offsets_edge_cases() -> None:
    assert message_token_offsets([], [0, 1]) == []
    assert message_token_offsets([0, 5], []) == [0, 0]
    # A first token that does not start at 0 (should not happen) still maps offsets before it
    # to token 0.
    assert message_token_offsets([0, 2], [1, 2]) == [0, 1]


def test_message_token_offsets_with_rendered_chat() -> None:
    r = chatml().render([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "yo"}])
    # A toy tokenizer: special tokens whole, other text in 3-character pieces.
    starts: list[int] = []
    pos = 0
    text = r.text
    while pos < len(text):
        starts.append(pos)
        for special in ("<|im_start|>", "<|im_end|>"):
            if text.startswith(special, pos):
                pos += len(special)
                break
        else:
            pos += 3
            nxt = min(
                (
                    p
                    for p in (text.find("<|im_start|>", starts[-1] + 1), text.find("<|im_end|>", starts[-1] + 1))
                    if p >= 0
                ),
                default=len(text),
            )
            pos = min(pos, nxt)
    token_offsets = message_token_offsets(r.message_char_offsets, starts)
    for char_off, tok in zip(r.message_char_offsets, token_offsets, strict=True):
        assert starts[tok] <= char_off
        assert tok + 1 == len(starts) or starts[tok + 1] > char_off
    assert [starts[t] for t in token_offsets] == r.message_char_offsets
