"""Byte-level BPE vocabularies (pre-tokenizers qwen2, qwen35, llama3, gpt-2, default) against
llama.cpp."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fixtures.bpe_vocab import MULTILINGUAL_TEXT

from hyserve.model.tokenizer import Tokenizer
from hyserve.model.tokenizer.pretokenizers import UNICODE16_ADDITIONS

from .checks import check_offsets, compare_with_llama, llama_detokenize, llama_piece, splits_a_character, stream
from .strings import BPE_SPECIALS, MIN_STRINGS, make_strings


def test_bpe_properties_match_llama(bpe_case: tuple[str, Path, Tokenizer], bpe_llama: Any, oracle: ModuleType) -> None:
    pre, _, tok = bpe_case
    vocab = bpe_llama._model.vocab
    assert tok.kind == "bpe" and tok.pre == pre
    assert tok.vocab_size == oracle.llama_vocab_n_tokens(vocab)
    assert tok.bos_id == oracle.llama_vocab_bos(vocab) == tok.token_id("<|endoftext|>")
    assert tok.eos_id == oracle.llama_vocab_eos(vocab) == tok.token_id("<|im_end|>")
    assert tok.add_bos is oracle.llama_vocab_get_add_bos(vocab) is (pre == "llama3")
    assert tok.add_eos is oracle.llama_vocab_get_add_eos(vocab) is False
    eog = {i for i in range(tok.vocab_size) if oracle.llama_vocab_is_eog(vocab, i)}
    assert tok.eog_ids == eog
    assert {tok.token_text(i) for i in eog} == {"<|endoftext|>", "<|im_end|>", "<|fim_pad|>"}
    attrs = [oracle.llama_vocab_get_attr(vocab, i) for i in range(tok.vocab_size)]
    hidden = oracle.LLAMA_TOKEN_ATTR_CONTROL | oracle.LLAMA_TOKEN_ATTR_UNKNOWN
    assert [tok.is_special(i) for i in range(tok.vocab_size)] == [bool(a & hidden) for a in attrs]
    for i in range(tok.vocab_size):
        assert tok.token_bytes(i) == llama_piece(oracle, bpe_llama, i, True), i


def test_bpe_ids_match_llama(bpe_case: tuple[str, Path, Tokenizer], bpe_llama: Any) -> None:
    _, _, tok = bpe_case
    strings = make_strings(BPE_SPECIALS)
    assert len(strings) >= MIN_STRINGS
    n, mismatches = compare_with_llama(tok, bpe_llama, strings)
    assert n == 4 * len(strings)
    assert not mismatches, f"{len(mismatches)}/{n} differ:\n" + "\n".join(mismatches[:10])


@pytest.mark.slow
def test_bpe_ids_match_llama_per_code_point(bpe_case: tuple[str, Path, Tokenizer], bpe_llama: Any) -> None:
    """Letters, digits, marks, spaces and symbols of every plane in pre-tokenizer-sensitive contexts,
    including every code point Unicode 16 added (llama.cpp's tables are older)."""
    _, _, tok = bpe_case
    cps = [c for c in range(1, 0x110000, 41) if not 0xD800 <= c <= 0xDFFF]
    cps += [c for a, b in UNICODE16_ADDITIONS for c in range(a, b + 1)]
    chunk = 48
    bad = []
    for i in range(0, len(cps), chunk):
        s = "".join(
            f"a{chr(c)}b {chr(c)}1{chr(c)}{chr(c)} {chr(c)}  x{chr(c)}\u0301'{chr(c)}\n" for c in cps[i : i + chunk]
        )
        if tok.encode(s, False, False) != bpe_llama.tokenize(s.encode(), False, False):
            bad.append(i)
    assert not bad


def test_bpe_decode_and_offsets(bpe_case: tuple[str, Path, Tokenizer], bpe_llama: Any, oracle: ModuleType) -> None:
    pre, _, tok = bpe_case
    for s in make_strings(BPE_SPECIALS, n_random=60, seed=13):
        ids = tok.encode(s, add_special=False, parse_special=False)
        assert tok.decode(ids) == s
        for add_special in (True, False):
            for parse_special in (True, False):
                check_offsets(tok, s, add_special, parse_special)
        if pre not in ("llama3", "default", "gpt-2"):  # those pre-tokenizers have clean_spaces on
            ids = tok.encode(s, add_special=True, parse_special=True)
            for skip_special in (False, True):
                expected = llama_detokenize(oracle, bpe_llama, ids, special=not skip_special)
                assert tok.decode(ids, skip_special=skip_special) == expected.decode("utf-8", errors="replace")


def test_bpe_incremental_decoder(bpe_case: tuple[str, Path, Tokenizer]) -> None:
    _, _, tok = bpe_case
    texts = ["👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵", "我能吞下玻璃而不伤身体。", "\U00020000\U0002a6d6 \U000f0000", MULTILINGUAL_TEXT]
    for text in texts:
        ids = tok.encode(text, add_special=False)
        assert splits_a_character(tok, ids)
        deltas = stream(tok, ids)
        assert all("\ufffd" not in d for d in deltas)
        assert "".join(deltas) == tok.decode(ids) == text
    ids = tok.encode("<|im_start|>assistant\nhi 🙂<|im_end|>")
    assert "".join(stream(tok, ids, skip_special=True)) == "assistant\nhi 🙂"


def test_bpe_special_tokens(bpe_case: tuple[str, Path, Tokenizer]) -> None:
    _, _, tok = bpe_case
    think, im_start = tok.token_id("<think>"), tok.token_id("<|im_start|>")
    # USER_DEFINED always matches, CONTROL only with parse_special
    assert think in tok.encode("a<think>b", add_special=False, parse_special=False)
    assert im_start in tok.encode("<|im_start|>", add_special=False, parse_special=True)
    assert im_start not in tok.encode("<|im_start|>", add_special=False, parse_special=False)
