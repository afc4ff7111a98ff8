"""cache_plan.message_token_offsets: message character offsets to token positions."""

from __future__ import annotations

from chat_templates import chatml

from hyserve.engine.cache_plan import message_token_offsets

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
