"""hyserve.model.chat_template's Jinja environment (HF's helpers and filters, the sandbox, errors),
the fallback template, and loading a template from a file."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from chat_templates import chatml, check_offsets, gemma, tool_call

from hyserve.model.chat_template import ChatTemplate, ChatTemplateError

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
        {"role": "assistant", "content": None, "tool_calls": [tool_call("Zürich")]},
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
