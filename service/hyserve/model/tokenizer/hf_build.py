"""Building (and caching on disk) the Hugging Face `tokenizers` model that reproduces llama.cpp's
byte-level BPE (``gpt2``) vocabularies: a ``BPE`` model behind ``Split(regex) + ByteLevel`` with no
normalizer. Checking the merges of a large vocabulary costs time, so the JSON is cached, keyed by a
hash of the vocabulary; a missing or unreadable cache file is rebuilt. (SentencePiece vocabularies
do not come here: see `hyserve_kernels.SpmVocab`.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
from hyserve_kernels import TokenIndex
from tokenizers import Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models as _hf_models
from tokenizers import pre_tokenizers as _hf_pre

from hyserve.model.tokenizer.errors import TokenizerError
from hyserve.model.tokenizer.pretokenizers import PreSpec
from hyserve.model.tokenizer.vocabulary import Vocab

log = logging.getLogger(__name__)

_CACHE_FORMAT = "hyserve-tokenizer-v3"


def _bpe_merges(merges: list[str], token_ids: TokenIndex) -> list[tuple[str, str]]:
    """GGUF merges ("left right", split at the first space after position 0) usable by `tokenizers`."""
    out: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    skipped = 0
    for m in merges:
        pos = m.find(" ", 1)
        if pos < 0:
            skipped += 1
            continue
        pair = (m[:pos], m[pos + 1 :])
        if pair in seen:
            continue  # llama.cpp keeps the first rank of a repeated merge
        seen.add(pair)
        if pair[0] in token_ids and pair[1] in token_ids and (pair[0] + pair[1]) in token_ids:
            out.append(pair)
        else:
            skipped += 1
    if skipped:
        log.warning("%d of %d merges refer to tokens outside the vocabulary; skipped", skipped, len(merges))
    return out


def _pre_tokenizer_json(spec: PreSpec) -> Any:
    steps: list[_hf_pre.PreTokenizer] = [
        _hf_pre.Split(Regex(r), behavior="isolated", invert=False) for r in spec.regexes
    ]
    steps.append(_hf_pre.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False))
    probe = _HFTokenizer(_hf_models.BPE())
    probe.pre_tokenizer = _hf_pre.Sequence(steps)
    return json.loads(probe.to_str())["pre_tokenizer"]


def _tokenizer_json(vocab: Vocab) -> str:
    """The `tokenizers` JSON for the vocabulary's model (no special tokens: we split those ourselves)."""
    if vocab.merges is None or vocab.pre_spec is None:
        raise TokenizerError("a byte-level BPE vocabulary without merges or pre-tokenizer")
    merges = _bpe_merges(vocab.merges, vocab.token_ids)
    model: dict[str, Any] = {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": vocab.pre_spec.ignore_merges,
    }
    pre_tokenizer = _pre_tokenizer_json(vocab.pre_spec)
    model["vocab"] = dict(zip(vocab.tokens, range(len(vocab.tokens)), strict=True))
    # "a b" strings parse faster than pairs, but only work when no side contains a space
    if any(" " in a or " " in b for a, b in merges):
        model["merges"] = merges
    else:
        model["merges"] = [f"{a} {b}" for a, b in merges]
    doc: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": None,
        "model": model,
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def _vocab_digest(vocab: Vocab) -> str:
    h = hashlib.sha256()

    def feed(*parts: str) -> None:
        for p in parts:
            data = p.encode("utf-8", "surrogatepass")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)

    feed(_CACHE_FORMAT, tokenizers.__version__, vocab.kind)
    if vocab.pre_spec is not None:
        feed(*vocab.pre_spec.regexes, str(vocab.pre_spec.ignore_merges))
    unk = vocab.special["unk"]
    feed(str(unk), str(len(vocab.tokens)))
    joined = "\x00".join(vocab.tokens)
    if joined.count("\x00") != len(vocab.tokens) - 1:  # a token contains NUL: make the split unambiguous
        joined = json.dumps(vocab.tokens)
    feed(joined)
    if vocab.scores is not None:
        h.update(np.ascontiguousarray(vocab.scores, dtype="<f4").tobytes())
    if vocab.merges is not None:
        feed(str(len(vocab.merges)), "\x00".join(vocab.merges))
    return h.hexdigest()


def _default_cache_dir() -> Path:
    return Path(os.path.expanduser("~")) / ".cache" / "hyserve" / "tokenizers"


def load_or_build(vocab: Vocab, cache_dir: Path | None) -> _HFTokenizer:
    directory = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    path = directory / f"{vocab.kind}-{_vocab_digest(vocab)}.json"
    try:
        if path.is_file():
            return _HFTokenizer.from_file(str(path))
    except Exception as exc:  # a corrupt or foreign cache file: rebuild it
        log.warning("ignoring unreadable tokenizer cache %s: %s", path, exc)
    text = _tokenizer_json(vocab)
    hf = _HFTokenizer.from_str(text)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        log.warning("could not cache the tokenizer in %s: %s", directory, exc)
    return hf
