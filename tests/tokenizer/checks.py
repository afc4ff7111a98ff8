"""Comparisons with llama.cpp (ids, pieces, detokenized bytes) and the checks the tokenizer tests
share (offsets, streaming)."""

from __future__ import annotations

import bisect
import ctypes
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from hyserve.model.tokenizer import Tokenizer


def compare_with_llama(tok: Tokenizer, llama: Any, strings: Sequence[str]) -> tuple[int, list[str]]:
    n = 0
    mismatches: list[str] = []
    for s in strings:
        data = s.encode("utf-8")
        for add_special in (True, False):
            for parse_special in (True, False):
                n += 1
                ours = tok.encode(s, add_special=add_special, parse_special=parse_special)
                theirs = llama.tokenize(data, add_bos=add_special, special=parse_special)
                if ours != theirs:
                    mismatches.append(
                        f"{s[:60]!r} add_special={add_special} parse_special={parse_special}: "
                        f"ours={ours[:16]} llama.cpp={theirs[:16]}"
                    )
    return n, mismatches


def llama_piece(oracle: ModuleType, llama: Any, token_id: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(256)
    n = oracle.llama_token_to_piece(llama._model.vocab, token_id, buf, len(buf), 0, special)
    assert 0 <= n <= len(buf)
    return buf.raw[:n]


def llama_detokenize(oracle: ModuleType, llama: Any, ids: Sequence[int], special: bool) -> bytes:
    arr = (oracle.llama_token * max(len(ids), 1))(*ids)
    size = 64 * len(ids) + 64
    buf = ctypes.create_string_buffer(size)
    n = oracle.llama_detokenize(llama._model.vocab, arr, len(ids), buf, size, False, special)
    assert 0 <= n <= size
    return buf.raw[:n]


def check_offsets(tok: Tokenizer, text: str, add_special: bool, parse_special: bool) -> None:
    ids, offsets = tok.encode_with_offsets(text, add_special=add_special, parse_special=parse_special)
    assert ids == tok.encode(text, add_special=add_special, parse_special=parse_special)
    assert len(offsets) == len(ids)
    assert offsets == sorted(offsets), "offsets must not decrease"
    assert all(0 <= o <= len(text) for o in offsets)
    body = list(range(len(ids)))
    if not body:
        return
    if add_special and tok.add_bos:
        assert offsets[0] == 0
        body = body[1:]
    if add_special and tok.add_eos:
        assert offsets[-1] == len(text)
        body = body[:-1]
    if tok.add_space_prefix or not body:
        return  # the inserted prefix space has no source character to compare against
    # the body's bytes are the text's bytes; each token's offset is the character holding its first byte
    pieces = [tok.token_bytes(t) for t in ids[body[0] : body[-1] + 1]]
    assert b"".join(pieces) == text.encode("utf-8")
    char_starts = [0]
    for ch in text:
        char_starts.append(char_starts[-1] + len(ch.encode("utf-8")))
    pos = 0
    for i, piece in zip(body, pieces, strict=True):
        assert offsets[i] == bisect.bisect_right(char_starts, pos) - 1, (text, i)
        pos += len(piece)


def splits_a_character(tok: Tokenizer, ids: Sequence[int]) -> bool:
    """True when some token holds only part of a UTF-8 character."""
    for t in ids:
        try:
            tok.token_bytes(t).decode("utf-8")
        except UnicodeDecodeError:
            return True
    return False


def stream(tok: Tokenizer, ids: Sequence[int], skip_special: bool = False) -> list[str]:
    dec = tok.incremental_decoder(skip_special=skip_special)
    deltas = [dec.push(t) for t in ids]
    deltas.append(dec.flush())
    return deltas
