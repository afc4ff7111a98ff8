"""hyserve.model.chat_template on real models' templates (Gemma 3, ChatML, Qwen3.5): HF-compatible
rendering and message offsets."""

from __future__ import annotations

from typing import Any

import pytest
from chat_templates import WEATHER_TOOL, chatml, check_offsets, gemma, qwen, tool_call

from hyserve.model.chat_template import ChatTemplateError

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


def test_qwen_tool_loop_then_new_query_offsets() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Zürich and 東京?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need two lookups.",
            "tool_calls": [tool_call("Zürich")],
        },
        {"role": "tool", "content": "12°C, rain"},
        {
            "role": "assistant",
            "content": "One more.",
            "reasoning_content": "Now Tokyo.",
            "tool_calls": [tool_call("東京")],
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
            "tool_calls": [tool_call("A"), tool_call("B")],
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
                "tool_calls": [tool_call(f"city {k}")],
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
