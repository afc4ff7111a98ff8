"""The tokenizer's build cache, and its errors on vocabularies it does not support."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fixtures.bpe_vocab import write_bpe_vocab_gguf

from hyserve.model.gguf_file import GGUFFile
from hyserve.model.tokenizer import Tokenizer, TokenizerError


def test_cache_file_reused_and_corrupt_cache_rebuilt(tmp_path: Path) -> None:
    path = write_bpe_vocab_gguf(tmp_path / "v.gguf", pre="qwen2")
    metadata = GGUFFile.open(path).metadata
    cache = tmp_path / "cache"
    first = Tokenizer.from_metadata(metadata, cache_dir=cache)
    (file,) = cache.glob("*.json")
    mtime = file.stat().st_mtime_ns
    second = Tokenizer.from_metadata(metadata, cache_dir=cache)
    assert file.stat().st_mtime_ns == mtime
    text = "Caching 🙂 <|im_start|>user\nhi"
    assert first.encode(text) == second.encode(text)
    file.write_text("{not json")
    third = Tokenizer.from_metadata(metadata, cache_dir=cache)
    assert third.encode(text) == first.encode(text)
    json.loads(file.read_text())  # rewritten
    file.unlink()  # a deleted cache is rebuilt too
    fourth = Tokenizer.from_metadata(metadata, cache_dir=cache)
    assert fourth.encode(text) == first.encode(text) and file.is_file()
    # a different vocabulary gets its own cache entry
    other = write_bpe_vocab_gguf(tmp_path / "w.gguf", pre="qwen35")
    Tokenizer.from_metadata(GGUFFile.open(other).metadata, cache_dir=cache)
    assert len(list(cache.glob("*.json"))) == 2


def _tiny_metadata(**overrides: Any) -> dict[str, Any]:
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen2",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.token_type": np.array([1, 1, 1], dtype=np.int32),
        "tokenizer.ggml.merges": ["a b"],
    }
    md.update(overrides)
    return {k: v for k, v in md.items() if v is not None}


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match=re.escape("unsupported tokenizer.ggml.model 'bert'")):
        Tokenizer.from_metadata(_tiny_metadata(**{"tokenizer.ggml.model": "bert"}), cache_dir=tmp_path)
    with pytest.raises(TokenizerError, match=re.escape("unsupported tokenizer.ggml.pre 'no-such-pre'")):
        Tokenizer.from_metadata(_tiny_metadata(**{"tokenizer.ggml.pre": "no-such-pre"}), cache_dir=tmp_path)
    with pytest.raises(TokenizerError, match=re.escape("no tokenizer.ggml.model")):
        Tokenizer.from_metadata({"general.architecture": "llama"}, cache_dir=tmp_path)
    with pytest.raises(TokenizerError, match="duplicate"):
        Tokenizer.from_metadata(_tiny_metadata(**{"tokenizer.ggml.tokens": ["a", "b", "a"]}), cache_dir=tmp_path)
    with pytest.raises(TokenizerError, match="merges"):
        Tokenizer.from_metadata(_tiny_metadata(**{"tokenizer.ggml.merges": None}), cache_dir=tmp_path)
    assert issubclass(TokenizerError, ValueError)


def test_tiny_vocab_defaults(tmp_path: Path) -> None:
    tok = Tokenizer.from_metadata(_tiny_metadata(), cache_dir=tmp_path)
    assert tok.encode("ab", add_special=False) == [2]
    assert tok.bos_id is None and tok.eos_id is None  # llama.cpp's default 11 is out of range
    assert tok.add_bos is False
    # a missing pre-tokenizer falls back to "default", as in llama.cpp
    tok = Tokenizer.from_metadata(_tiny_metadata(**{"tokenizer.ggml.pre": None}), cache_dir=tmp_path)
    assert tok.pre == "default"
    assert tok.encode("abab", add_special=False) == [2, 2]
