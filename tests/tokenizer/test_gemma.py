"""Gemma 3 (SentencePiece, 262k tokens) against llama.cpp: properties, ids, bytes, offsets, special
tokens, incremental decoding."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

from hyserve.model.tokenizer import IncrementalDecoder, Tokenizer

from .checks import check_offsets, compare_with_llama, llama_detokenize, llama_piece, stream
from .strings import GEMMA_SPECIALS, MIN_STRINGS, make_strings


def test_gemma_properties_match_llama(gemma: Tokenizer, gemma_llama: Any, oracle: ModuleType) -> None:
    vocab = gemma_llama._model.vocab
    assert gemma.kind == "spm"
    assert gemma.vocab_size == oracle.llama_vocab_n_tokens(vocab) == 262144
    assert gemma.bos_id == oracle.llama_vocab_bos(vocab) == 2
    assert gemma.eos_id == oracle.llama_vocab_eos(vocab) == 1
    assert gemma.add_bos is oracle.llama_vocab_get_add_bos(vocab) is True
    assert gemma.add_eos is oracle.llama_vocab_get_add_eos(vocab) is False
    assert gemma.add_space_prefix is False
    eog = {i for i in range(gemma.vocab_size) if oracle.llama_vocab_is_eog(vocab, i)}
    assert gemma.eog_ids == eog == {1, 106, 212}  # <eos>, <end_of_turn>, </s>
    assert gemma.is_eog(106) and not gemma.is_eog(105)
    assert gemma.eot_id == 106


@pytest.mark.slow
def test_gemma_token_attributes_match_llama(gemma: Tokenizer, gemma_llama: Any, oracle: ModuleType) -> None:
    vocab = gemma_llama._model.vocab
    attrs = np.array([oracle.llama_vocab_get_attr(vocab, i) for i in range(gemma.vocab_size)])
    hidden = set(np.flatnonzero(attrs & (oracle.LLAMA_TOKEN_ATTR_CONTROL | oracle.LLAMA_TOKEN_ATTR_UNKNOWN)).tolist())
    special_mask = (
        oracle.LLAMA_TOKEN_ATTR_CONTROL | oracle.LLAMA_TOKEN_ATTR_UNKNOWN | oracle.LLAMA_TOKEN_ATTR_USER_DEFINED
    )
    special = set(np.flatnonzero(attrs & special_mask).tolist())
    assert {i for i in range(gemma.vocab_size) if gemma.is_special(i)} == hidden
    assert set(gemma.special_ids()) == special


@pytest.mark.slow
def test_gemma_token_bytes_match_llama_for_every_token(gemma: Tokenizer, gemma_llama: Any, oracle: ModuleType) -> None:
    bad = [i for i in range(gemma.vocab_size) if gemma.token_bytes(i) != llama_piece(oracle, gemma_llama, i, True)]
    assert not bad, f"{len(bad)} tokens differ, e.g. {bad[:10]}"


def test_gemma_ids_match_llama(gemma: Tokenizer, gemma_llama: Any) -> None:
    strings = make_strings(GEMMA_SPECIALS)
    assert len(strings) >= MIN_STRINGS
    n, mismatches = compare_with_llama(gemma, gemma_llama, strings)
    assert n == 4 * len(strings)
    assert not mismatches, f"{len(mismatches)}/{n} differ:\n" + "\n".join(mismatches[:10])


@pytest.mark.slow
def test_gemma_ids_match_llama_per_code_point(gemma: Tokenizer, gemma_llama: Any) -> None:
    """A sample of every Unicode plane, each code point in a few contexts (byte fallback etc.)."""
    cps = [c for c in range(1, 0x110000, 37) if not 0xD800 <= c <= 0xDFFF]
    chunk = 64
    strings = []
    for i in range(0, len(cps), chunk):
        strings.append("".join(f"a{chr(c)}b {chr(c)}{chr(c)} 1{chr(c)}\n" for c in cps[i : i + chunk]))
    bad = [s for s in strings if gemma.encode(s, False, False) != gemma_llama.tokenize(s.encode(), False, False)]
    assert not bad


def test_gemma_build_needs_no_cache(gemma_build: dict[str, Any]) -> None:
    """A SentencePiece vocabulary is built straight from the metadata: no cache file to go stale."""
    assert not list(gemma_build["cache"].iterdir())
    first, second = gemma_build["first"], gemma_build["second"]
    text = "<start_of_turn>user\nTwo builds, one answer: 🙂 ∑ こんにちは<end_of_turn>"
    assert first.encode(text) == second.encode(text)
    assert first.encode_with_offsets(text) == second.encode_with_offsets(text)


def test_gemma_round_trip(gemma: Tokenizer) -> None:
    for s in make_strings(GEMMA_SPECIALS, n_random=100, seed=7):
        for parse_special in (True, False):
            ids = gemma.encode(s, add_special=False, parse_special=parse_special)
            assert gemma.decode(ids) == s
        ids = gemma.encode(s, add_special=True, parse_special=False)
        assert ids[0] == gemma.bos_id
        assert gemma.decode(ids) == "<bos>" + s
        assert gemma.decode(ids, skip_special=True) == s


def test_gemma_decode_matches_llama_detokenize(gemma: Tokenizer, gemma_llama: Any, oracle: ModuleType) -> None:
    for s in make_strings(GEMMA_SPECIALS, n_random=60, seed=11):
        ids = gemma.encode(s, add_special=True, parse_special=True)
        for skip_special in (False, True):
            expected = llama_detokenize(oracle, gemma_llama, ids, special=not skip_special)
            assert gemma.decode(ids, skip_special=skip_special) == expected.decode("utf-8", errors="replace")


def test_gemma_offsets(gemma: Tokenizer) -> None:
    for s in make_strings(GEMMA_SPECIALS, n_random=60, seed=3):
        for add_special in (True, False):
            for parse_special in (True, False):
                check_offsets(gemma, s, add_special, parse_special)
    ids, offsets = gemma.encode_with_offsets("<start_of_turn>user\nhi<end_of_turn>")
    assert ids == [2, 105, 2364, 107, 2202, 106]
    assert offsets == [0, 0, 15, 19, 20, 22]


def test_gemma_special_token_parsing(gemma: Tokenizer) -> None:
    # CONTROL tokens only with parse_special; USER_DEFINED ones ("\n", "<b>") always
    assert gemma.encode("<start_of_turn>", add_special=False) == [105]
    assert 105 not in gemma.encode("<start_of_turn>", add_special=False, parse_special=False)
    assert gemma.encode("\n", add_special=False, parse_special=False) == [107]
    assert gemma.encode("<b>", add_special=False, parse_special=False) == [gemma.token_id("<b>")]
    # "</s>" is USER_DEFINED in Gemma, but llama.cpp forces it to CONTROL because it is an EOG text
    assert gemma.encode("</s>", add_special=False, parse_special=True) == [212]
    assert 212 not in gemma.encode("</s>", add_special=False, parse_special=False)


def test_gemma_incremental_decoder_byte_tokens(gemma: Tokenizer) -> None:
    byte_id = {b: gemma.token_id(f"<0x{b:02X}>") for b in range(256)}
    for text in ("👨‍👩‍👧‍👦 family", "中文字符 and 日本語", "é ñ ü", "𝔘𝔫𝔦 \U000f0000 \U00020000", "🙂" * 5):
        ids = [byte_id[b] for b in text.encode("utf-8")]  # every multi-byte character split into bytes
        deltas = stream(gemma, ids)
        assert all("\ufffd" not in d for d in deltas)
        assert "".join(deltas) == gemma.decode(ids) == text
        # only whole characters come out: each non-empty delta ends where a character ends
        assert sum(1 for d in deltas if d) <= len(text)


def test_gemma_incremental_decoder_natural_stream(gemma: Tokenizer) -> None:
    for s in make_strings(GEMMA_SPECIALS, n_random=60, seed=5):
        ids = gemma.encode(s, add_special=True, parse_special=True)
        for skip_special in (False, True):
            deltas = stream(gemma, ids, skip_special)
            assert all("\ufffd" not in d for d in deltas)
            assert "".join(deltas) == gemma.decode(ids, skip_special=skip_special)


def test_gemma_incremental_decoder_incomplete_and_invalid(gemma: Tokenizer) -> None:
    b = {x: gemma.token_id(f"<0x{x:02X}>") for x in range(256)}
    emoji = "🙂".encode()
    dec = gemma.incremental_decoder()
    assert dec.push(b[emoji[0]]) == ""
    assert dec.push(b[emoji[1]]) == ""
    assert dec.flush() == "\ufffd"  # a truncated character is replaced only at the end
    assert gemma.decode([b[emoji[0]], b[emoji[1]]]) == "\ufffd"
    dec = gemma.incremental_decoder()
    assert dec.push(b[0xFF]) == "\ufffd"  # can never become valid: not held back
    assert dec.push(gemma.token_id("▁hello")) == " hello"
    assert isinstance(dec, IncrementalDecoder)
