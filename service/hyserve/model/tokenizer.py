"""Tokenizer built from the vocabulary in a GGUF file's metadata, matching llama.cpp's token ids.

Two vocabulary kinds are supported, as ``tokenizer.ggml.model`` names them:

``llama`` (SentencePiece with scores, e.g. Gemma 3)
    llama.cpp merges adjacent symbols by the *score* of the token they form (highest first, ties to
    the left), starting from UTF-8 characters, after replacing every space with ``▁``; characters
    that never became part of a token are emitted as ``<0xXX>`` byte tokens. The Hugging Face
    ``tokenizers`` library has no score-priority mode, so we give it a ``BPE`` model with *derived
    merges*: every split of every token into two tokens, ranked by the score of the token they
    form (characters that occur only inside tokens join as "virtual" entries, see
    ``_spm_virtual_chars``). That reproduces llama.cpp except when two different merges with
    equal scores compete (llama.cpp takes the leftmost one, BPE the lower rank), which real
    vocabularies avoid by giving every normal token its own score. Deriving the merges of a 262k
    vocabulary takes seconds, so the finished ``tokenizers`` JSON is cached on disk, keyed by a
    hash of the vocabulary.

``gpt2`` (byte-level BPE, e.g. Qwen, Llama 3)
    The text is split with the regex list of ``tokenizer.ggml.pre``, each piece's UTF-8 bytes are
    mapped through the GPT-2 byte-to-unicode table and merged by merge rank. This is a ``BPE``
    model behind a ``Split(regex) + ByteLevel`` pre-tokenizer with no normalizer (llama.cpp does
    not apply NFC). llama.cpp evaluates these regexes with its own Unicode tables (Unicode 15.1),
    while Oniguruma inside ``tokenizers`` 0.23 knows Unicode 16.0; the code points that Unicode 16
    added to letters, digits, marks and punctuation are removed from those classes so that both
    agree (see ``_UNICODE16_ADDITIONS``).

Special tokens are not handed to ``tokenizers``: the text is first split at special tokens exactly
as llama.cpp's ``tokenizer_st_partition`` does (longest token text first; CONTROL and UNKNOWN
tokens only when ``parse_special``, USER_DEFINED always; LSTRIP/RSTRIP attributes), and only the
raw fragments go through the model. Token attributes, the end-of-generation set and the
BOS/EOS defaults follow llama.cpp's vocabulary loader, including its rules that force some tokens
to CONTROL by their text (e.g. ``<end_of_turn>``, ``<|im_end|>``, ``</s>``).

Decoding concatenates the bytes of each token as llama.cpp's ``token_to_piece`` renders them
(``▁`` becomes a space, byte tokens become their byte, byte-level BPE tokens are unmapped, special
tokens render as their text unless skipped; with ``add_space_prefix`` the first token loses its
leading space, as in ``llama_detokenize``). llama.cpp's optional "clean up tokenization spaces"
pass is not applied: it is lossy and llama.cpp's server streams pieces without it.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers
from tokenizers import Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models as _hf_models
from tokenizers import pre_tokenizers as _hf_pre

__all__ = ["IncrementalDecoder", "Tokenizer", "TokenizerError"]

log = logging.getLogger(__name__)


class TokenizerError(ValueError):
    """The GGUF metadata describes a vocabulary this tokenizer cannot reproduce."""


# --------------------------------------------------------------------------------------------
# Token types (GGUF ``tokenizer.ggml.token_type``) and llama.cpp token attributes (``llama.h``)
# --------------------------------------------------------------------------------------------

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_UNUSED = 5
TOKEN_TYPE_BYTE = 6

ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

# index: GGUF token type 0..6 -> attribute; any other type is UNDEFINED
_TYPE_TO_ATTR = np.array(
    [ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE],
    dtype=np.int32,
)
_ATTR_SPECIAL = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN  # split out before the model runs
_ATTR_HIDDEN = ATTR_CONTROL | ATTR_UNKNOWN  # matched only with parse_special, rendered only when asked

# Token texts llama.cpp's loader recognises (llama-vocab.cpp, ``impl::load``). A token found this
# way is forced to CONTROL; the EOG texts also join the end-of-generation set.
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)  # fmt: skip
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PRE_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                  "<|code_prefix|>", "<|prefix|>")  # fmt: skip
_FIM_SUF_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                  "<|code_suffix|>", "<|suffix|>")  # fmt: skip
_FIM_MID_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                  "<|code_middle|>", "<|middle|>")  # fmt: skip
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = frozenset(
    ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
     "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
     "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
     "<｜end▁of▁sentence｜>", "[e~["),
)  # fmt: skip
_ALWAYS_RENDERED_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss

# --------------------------------------------------------------------------------------------
# Pre-tokenizer regexes (Oniguruma syntax), following llama.cpp's ``llm_tokenizer_bpe`` table
# --------------------------------------------------------------------------------------------

# Code points that Unicode 16.0 assigned as letters, digits, marks or punctuation. llama.cpp's
# tables (unicode-data.cpp, Unicode 15.1) mark them undefined, so its pre-tokenizers treat them
# like symbols; Oniguruma in tokenizers 0.23 already knows them. Found by comparing both tables
# over all code points.
_UNICODE16_ADDITIONS = (
    (0x0897, 0x0897), (0x1B4E, 0x1B4F), (0x1B7F, 0x1B7F), (0x1C89, 0x1C8A), (0xA7CB, 0xA7CD),
    (0xA7DA, 0xA7DC), (0x105C0, 0x105F3), (0x10D40, 0x10D65), (0x10D69, 0x10D85),
    (0x10EC2, 0x10EC4), (0x10EFC, 0x10EFC), (0x11380, 0x11389), (0x1138B, 0x1138B),
    (0x1138E, 0x1138E), (0x11390, 0x113B5), (0x113B7, 0x113C0), (0x113C2, 0x113C2),
    (0x113C5, 0x113C5), (0x113C7, 0x113CA), (0x113CC, 0x113D5), (0x113D7, 0x113D8),
    (0x113E1, 0x113E2), (0x116D0, 0x116E3), (0x11BC0, 0x11BE1), (0x11BF0, 0x11BF9),
    (0x11F5A, 0x11F5A), (0x13460, 0x143FA), (0x16100, 0x16139), (0x16D40, 0x16D79),
    (0x18CFF, 0x18CFF), (0x1CCF0, 0x1CCF9), (0x1E5D0, 0x1E5FA), (0x1E5FF, 0x1E5FF),
)  # fmt: skip
_U16 = "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in _UNICODE16_ADDITIONS)


def _cls(props: str) -> str:
    """A nested class: the union of the given ``\\p{..}`` properties minus the Unicode 16 additions."""
    return f"[{props}&&[^{_U16}]]"


_L, _N, _M, _P = _cls(r"\p{L}"), _cls(r"\p{N}"), _cls(r"\p{M}"), _cls(r"\p{P}")
_LN, _LMN = _cls(r"\p{L}\p{N}"), _cls(r"\p{L}\p{M}\p{N}")
_LM = _cls(r"\p{L}\p{M}")
_CONTRACTIONS_CI = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_WS_TAIL = r"\s*[\r\n]+|\s+(?!\S)|\s+"

_RE_GPT2 = rf"(?:'s|'t|'re|'ve|'m|'ll|'d)| ?{_L}+| ?{_N}+| ?[^\s{_LN}]+|\s+(?!\S)|\s+"
_RE_QWEN2 = rf"{_CONTRACTIONS_CI}|[^\r\n{_LN}]?{_L}+|{_N}| ?[^\s{_LN}]+[\r\n]*|{_WS_TAIL}"
_RE_QWEN35 = rf"{_CONTRACTIONS_CI}|[^\r\n{_LN}]?{_LM}+|{_N}| ?[^\s{_LMN}]+[\r\n]*|{_WS_TAIL}"
_RE_LLAMA3 = rf"{_CONTRACTIONS_CI}|[^\r\n{_LN}]?{_L}+|{_N}{{1,3}}| ?[^\s{_LN}]+[\r\n]*|{_WS_TAIL}"
_RES_DEFAULT = (rf"[{_P}\$\+<=>\^~\|]+", _RE_GPT2, rf"{_N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class _PreSpec:
    regexes: tuple[str, ...]
    add_bos: bool = False  # llama.cpp's default before tokenizer.ggml.add_bos_token
    ignore_merges: bool = False  # a piece that is itself a token is emitted without merging


_PRE_DEFAULT = _PreSpec(_RES_DEFAULT)
_PRE_GPT2 = _PreSpec((_RE_GPT2,))
_PRE_QWEN2 = _PreSpec((_RE_QWEN2,))
_PRE_QWEN35 = _PreSpec((_RE_QWEN35,))
_PRE_LLAMA3 = _PreSpec((_RE_LLAMA3,), add_bos=True, ignore_merges=True)
_PRE_LLAMA3_REGEX_ONLY = _PreSpec((_RE_LLAMA3,))

# tokenizer.ggml.pre -> spec, for the names whose llama.cpp behaviour is fully covered here
_PRE_TOKENIZERS: dict[str, _PreSpec] = {
    "default": _PRE_DEFAULT,
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo", "exaone4"), _PRE_GPT2),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open", "grok-2"),
        _PRE_QWEN2,
    ),
    "qwen35": _PRE_QWEN35,
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        _PRE_LLAMA3,
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), _PRE_LLAMA3_REGEX_ONLY),
}

_C_ISSPACE = frozenset(" \t\n\v\f\r")  # C isspace() in the "C" locale, as llama.cpp's strip uses
_CACHE_FORMAT = "hyserve-tokenizer-v3"
_SPACE_MARK = "\u2581"  # ▁


def _gpt2_byte_table() -> dict[str, int]:
    """GPT-2's printable-character -> byte table (the inverse of its byte -> unicode map)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    n = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + n)] = b
            n += 1
    return table


_GPT2_CHAR_TO_BYTE = _gpt2_byte_table()


# --------------------------------------------------------------------------------------------
# Vocabulary analysis (what llama.cpp's loader does with the metadata)
# --------------------------------------------------------------------------------------------


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass
class _Vocab:
    kind: str  # "spm" | "bpe"
    pre: str  # tokenizer.ggml.pre as given ("" for SPM)
    pre_spec: _PreSpec | None
    tokens: list[str]
    token_ids: dict[str, int]
    attrs: np.ndarray  # int32 llama.cpp attribute bits per token
    scores: np.ndarray | None  # float32, SPM only
    merges: list[str] | None  # BPE only
    special: dict[str, int | None]  # bos, eos, eot, eom, unk, sep, pad, mask, fim_*
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog_ids: frozenset[int]


_SPECIAL_ID_KEYS = (
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
    ("eom", "tokenizer.ggml.eom_token_id"),
    ("unk", "tokenizer.ggml.unknown_token_id"),
    ("sep", "tokenizer.ggml.seperator_token_id"),
    ("pad", "tokenizer.ggml.padding_token_id"),
    ("mask", "tokenizer.ggml.mask_token_id"),
    ("fim_pre", "tokenizer.ggml.fim_pre_token_id"),
    ("fim_suf", "tokenizer.ggml.fim_suf_token_id"),
    ("fim_mid", "tokenizer.ggml.fim_mid_token_id"),
    ("fim_pad", "tokenizer.ggml.fim_pad_token_id"),
    ("fim_rep", "tokenizer.ggml.fim_rep_token_id"),
    ("fim_sep", "tokenizer.ggml.fim_sep_token_id"),
    # deprecated spellings, read after the new ones as llama.cpp does
    ("fim_pre", "tokenizer.ggml.prefix_token_id"),
    ("fim_suf", "tokenizer.ggml.suffix_token_id"),
    ("fim_mid", "tokenizer.ggml.middle_token_id"),
)


def _analyze(metadata: Mapping[str, Any]) -> _Vocab:
    model = metadata.get("tokenizer.ggml.model")
    if not isinstance(model, str):
        raise TokenizerError("GGUF metadata has no tokenizer.ggml.model; the file carries no vocabulary")
    pre = metadata.get("tokenizer.ggml.pre")
    pre = pre if isinstance(pre, str) else ""
    special: dict[str, int | None] = dict.fromkeys(
        ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask", "fim_pre", "fim_suf", "fim_mid", "fim_pad",
         "fim_rep", "fim_sep")
    )  # fmt: skip
    pre_spec: _PreSpec | None = None
    if model == "llama":
        kind = "spm"
        special.update(bos=1, eos=2, unk=0)
        add_space_prefix, add_bos = True, True
    elif model == "gpt2":
        kind = "bpe"
        special.update(bos=11, eos=11)
        if not pre:
            log.warning("tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer as llama.cpp does")
            pre = "default"
        pre_spec = _PRE_TOKENIZERS.get(pre)
        if pre_spec is None:
            raise TokenizerError(
                f"unsupported tokenizer.ggml.pre {pre!r} (supported: {', '.join(sorted(_PRE_TOKENIZERS))})"
            )
        add_space_prefix, add_bos = False, pre_spec.add_bos
    else:
        raise TokenizerError(
            f"unsupported tokenizer.ggml.model {model!r}: only 'llama' (SentencePiece) and 'gpt2' "
            "(byte-level BPE) vocabularies are supported"
        )
    add_eos = False
    if isinstance(metadata.get("tokenizer.ggml.add_space_prefix"), bool | np.bool_):
        add_space_prefix = bool(metadata["tokenizer.ggml.add_space_prefix"])

    raw_tokens = metadata.get("tokenizer.ggml.tokens")
    if raw_tokens is None or isinstance(raw_tokens, str) or len(raw_tokens) == 0:
        raise TokenizerError("GGUF metadata has no tokenizer.ggml.tokens")
    tokens = list(raw_tokens)
    if not set(map(type, tokens)) <= {str}:
        tokens = [str(t) for t in tokens]
    n = len(tokens)
    token_ids = dict(zip(tokens, range(n), strict=True))
    if "" in token_ids:
        for i, t in enumerate(tokens):
            if not t:
                tokens[i] = f"[EMPTY_{i}]"  # llama.cpp renames empty tokens the same way
        token_ids = dict(zip(tokens, range(n), strict=True))
    if len(token_ids) != n:
        raise TokenizerError("tokenizer.ggml.tokens contains duplicate tokens (llama.cpp refuses such a vocab)")

    scores = None
    if kind == "spm":
        raw_scores = metadata.get("tokenizer.ggml.scores")
        if raw_scores is None:
            scores = np.zeros(n, dtype=np.float32)
        else:
            scores = np.asarray(raw_scores).astype(np.float32)
            if scores.shape[0] < n:
                raise TokenizerError(f"tokenizer.ggml.scores has {scores.shape[0]} entries for {n} tokens")
            scores = scores[:n]

    raw_types = metadata.get("tokenizer.ggml.token_type")
    if raw_types is None:
        attrs = np.full(n, ATTR_NORMAL, dtype=np.int32)
    else:
        types = np.asarray(raw_types).astype(np.int64)
        if types.shape[0] < n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {types.shape[0]} entries for {n} tokens")
        types = types[:n]
        valid = (types >= 0) & (types < len(_TYPE_TO_ATTR))
        attrs = np.where(valid, _TYPE_TO_ATTR[np.clip(types, 0, len(_TYPE_TO_ATTR) - 1)], ATTR_UNDEFINED)
        attrs = attrs.astype(np.int32)

    merges = None
    if kind == "bpe":
        raw_merges = metadata.get("tokenizer.ggml.merges")
        if raw_merges is None:
            raise TokenizerError("byte-level BPE vocabulary without tokenizer.ggml.merges")
        merges = [str(m) for m in raw_merges]

    # special token ids: defaults out of range are disabled, metadata ids out of range are ignored
    for name, value in special.items():
        if value is not None and value >= n:
            special[name] = None
    for name, key in _SPECIAL_ID_KEYS:
        new_id = _as_int(metadata.get(key))
        if new_id is None or new_id < 0:
            continue
        if new_id >= n:
            log.warning("%s = %d is out of the vocabulary (%d tokens); ignored", key, new_id, n)
            continue
        special[name] = new_id
    if isinstance(metadata.get("tokenizer.ggml.add_bos_token"), bool | np.bool_):
        add_bos = bool(metadata["tokenizer.ggml.add_bos_token"])
    if isinstance(metadata.get("tokenizer.ggml.add_eos_token"), bool | np.bool_):
        add_eos = bool(metadata["tokenizer.ggml.add_eos_token"])

    def force_control(tid: int) -> None:
        attrs[tid] |= ATTR_CONTROL

    # auto-detected special tokens (each is forced to CONTROL)
    for name, texts in (
        ("eot", _EOT_TEXTS),
        ("eom", _EOM_TEXTS),
        ("fim_pre", _FIM_PRE_TEXTS),
        ("fim_suf", _FIM_SUF_TEXTS),
        ("fim_mid", _FIM_MID_TEXTS),
        ("fim_pad", _FIM_PAD_TEXTS),
        ("fim_rep", _FIM_REP_TEXTS),
        ("fim_sep", _FIM_SEP_TEXTS),
    ):
        if special[name] is not None:
            continue
        for text in texts:
            tid = token_ids.get(text)
            if tid is not None:
                special[name] = tid
                force_control(tid)
                break

    # control tokens whose text says "unused"
    for tid in np.flatnonzero(attrs & ATTR_CONTROL).tolist():
        if "unused" in tokens[tid]:
            attrs[tid] |= ATTR_UNUSED

    # the end-of-generation set
    eog: set[int] = {tid for name in ("fim_pad", "fim_rep", "fim_sep") if (tid := special[name]) is not None}
    for text in _EOG_TEXTS:
        tid = token_ids.get(text)
        if tid is not None:
            eog.add(tid)
            force_control(tid)
    for text in _ALWAYS_RENDERED_TEXTS:
        tid = token_ids.get(text)
        if tid is not None:
            attrs[tid] = ATTR_USER_DEFINED
    for name in ("eos", "eot", "eom"):
        if (tid := special[name]) is not None:
            eog.add(tid)
    eog_texts = {tokens[t]: t for t in eog}
    if "<|end|>" in eog_texts and (
        ("<|return|>" in eog_texts and ("<|call|>" in eog_texts or "<|calls|>" in eog_texts))
        or ("<|flush|>" in eog_texts and ("<|call|>" in eog_texts or "<|calls|>" in eog_texts))
    ):
        end_id = eog_texts["<|end|>"]
        eog.discard(end_id)
        attrs[end_id] = ATTR_USER_DEFINED
    if "</s>" in eog_texts and ("<|tool_response>" in eog_texts or "<|plamo:eos|>" in eog_texts):
        s_id = eog_texts["</s>"]
        eog.discard(s_id)
        attrs[s_id] = ATTR_NORMAL

    # per-model strip attributes (llama.cpp sets them by model/pre-tokenizer/architecture name)
    name = str(metadata.get("general.name", "")).lower()
    arch = str(metadata.get("general.architecture", ""))
    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        s in arch for s in ("nomic-bert-moe", "jina-bert-v3")
    ):
        if (tid := token_ids.get("<mask>")) is not None:
            attrs[tid] |= ATTR_LSTRIP
    elif "phi-3" in name or "phi3" in name:
        attrs[(attrs & _ATTR_SPECIAL) != 0] |= ATTR_RSTRIP
        for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            if (tid := token_ids.get(text)) is not None:
                attrs[tid] = attrs[tid] | ATTR_RSTRIP if on else attrs[tid] & ~ATTR_RSTRIP
    elif "modern-bert" in name and (tid := token_ids.get("[MASK]")) is not None:
        attrs[tid] |= ATTR_LSTRIP

    return _Vocab(
        kind=kind,
        pre=pre if kind == "bpe" else "",
        pre_spec=pre_spec,
        tokens=tokens,
        token_ids=token_ids,
        attrs=attrs,
        scores=scores,
        merges=merges,
        special=special,
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=add_space_prefix,
        eog_ids=frozenset(eog),
    )


# --------------------------------------------------------------------------------------------
# Building (and caching) the `tokenizers` model
# --------------------------------------------------------------------------------------------


def _spm_virtual_chars(tokens: list[str], token_ids: Mapping[str, int]) -> list[str]:
    """Characters that occur inside tokens but are not tokens themselves (sorted).

    llama.cpp starts SPM merging from characters and merges any two adjacent symbols whose
    concatenation is a token, even when a symbol is a character outside the vocabulary. `tokenizers`
    can only merge vocabulary entries, so such characters join its vocabulary as "virtual" tokens
    with ids after the real ones; a virtual token left in the output becomes byte tokens, as in
    llama.cpp. Real SentencePiece vocabularies contain all their characters, so this is usually
    empty. The plain space is left out: it never reaches the model (it becomes ``▁``).
    """
    chars = set("".join(tokens))
    chars.discard(" ")
    return sorted(c for c in chars if c not in token_ids)


def _spm_merges(tokens: list[str], token_ids: Mapping[str, int], scores: np.ndarray) -> list[tuple[str, str]]:
    """Every split of every token into two symbols, ranked like llama.cpp's score-priority merging.

    ``token_ids`` includes the virtual characters. Rank order: the formed token's score
    (descending), then its id, then the split position. (Only the score order matters to
    llama.cpp; it breaks ties by text position, which fixed ranks cannot express.) Tokens
    containing a plain space are skipped: llama.cpp turns every space into ``▁`` before merging,
    so they can never be formed.
    """
    get = token_ids.get
    formed: list[int] = []
    lefts: list[str] = []
    rights: list[str] = []
    for tid, text in enumerate(tokens):
        n = len(text)
        if n < 2 or " " in text:
            continue
        for k in range(1, n):
            left = text[:k]
            if get(left) is not None:
                right = text[k:]
                if get(right) is not None:
                    formed.append(tid)
                    lefts.append(left)
                    rights.append(right)
    # records are in (token id, split position) order already; a stable sort by score keeps it
    order = np.argsort(-scores.astype(np.float64)[np.asarray(formed, dtype=np.int64)], kind="stable").tolist()
    return [(lefts[i], rights[i]) for i in order]


def _bpe_merges(merges: list[str], token_ids: dict[str, int]) -> list[tuple[str, str]]:
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


def _pre_tokenizer_json(spec: _PreSpec) -> Any:
    steps: list[_hf_pre.PreTokenizer] = [
        _hf_pre.Split(Regex(r), behavior="isolated", invert=False) for r in spec.regexes
    ]
    steps.append(_hf_pre.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False))
    probe = _HFTokenizer(_hf_models.BPE())
    probe.pre_tokenizer = _hf_pre.Sequence(steps)
    return json.loads(probe.to_str())["pre_tokenizer"]


def _tokenizer_json(vocab: _Vocab) -> str:
    """The `tokenizers` JSON for the vocabulary's model (no special tokens: we split those ourselves)."""
    if vocab.kind == "spm":
        assert vocab.scores is not None
        n = len(vocab.tokens)
        extended = dict(vocab.token_ids)
        extended.update((c, n + i) for i, c in enumerate(_spm_virtual_chars(vocab.tokens, vocab.token_ids)))
        merges = _spm_merges(vocab.tokens, extended, vocab.scores)
        unk = vocab.special["unk"]
        model: dict[str, Any] = {
            "type": "BPE",
            "dropout": None,
            "unk_token": vocab.tokens[unk] if unk is not None else None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": True,
            "ignore_merges": False,
        }
        pre_tokenizer = None
    else:
        assert vocab.merges is not None and vocab.pre_spec is not None
        merges = _bpe_merges(vocab.merges, vocab.token_ids)
        model = {
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
    model["vocab"] = extended if vocab.kind == "spm" else vocab.token_ids
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


def _vocab_digest(vocab: _Vocab) -> str:
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


def _load_or_build(vocab: _Vocab, cache_dir: Path | None) -> _HFTokenizer:
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


# --------------------------------------------------------------------------------------------
# Public classes
# --------------------------------------------------------------------------------------------


class Tokenizer:
    """llama.cpp-compatible tokenizer for the vocabulary in a GGUF file. Thread-safe after creation."""

    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    pad_id: int | None
    unk_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog_ids: frozenset[int]
    kind: str  # "spm" or "bpe"
    pre: str  # tokenizer.ggml.pre of a BPE vocabulary, "" for SPM

    def __init__(self, vocab: _Vocab, hf: _HFTokenizer) -> None:
        self._vocab = vocab
        self._hf = hf
        self._tokens = vocab.tokens
        self._token_ids = vocab.token_ids
        self._attrs = vocab.attrs
        self.vocab_size = len(vocab.tokens)
        self.bos_id = vocab.special["bos"]
        self.eos_id = vocab.special["eos"]
        self.eot_id = vocab.special["eot"]
        self.pad_id = vocab.special["pad"]
        self.unk_id = vocab.special["unk"]
        self.add_bos = vocab.add_bos
        self.add_eos = vocab.add_eos
        self.add_space_prefix = vocab.add_space_prefix
        self.eog_ids = vocab.eog_ids
        self.kind = vocab.kind
        self.pre = vocab.pre
        self._pieces: list[bytes | None] = [None] * self.vocab_size
        # SPM virtual characters (see _spm_virtual_chars) follow the real ids in the model's vocab
        self._virtual: dict[int, list[int]] = {}
        for vid in range(self.vocab_size, hf.get_vocab_size(with_added_tokens=False)):
            char = hf.id_to_token(vid)
            if char is not None:
                self._virtual[vid] = self._byte_tokens(char.encode("utf-8"))
        self._init_specials()

    def _byte_tokens(self, data: bytes) -> list[int]:
        """llama.cpp's SPM byte fallback: ``<0xXX>`` per byte, else the one-byte token, else unknown."""
        out = []
        for byte in data:
            tid = self._token_ids.get(f"<0x{byte:02X}>")
            if tid is None:
                tid = self._token_ids.get(chr(byte)) if byte < 0x80 else None
            if tid is None:
                if self.unk_id is None:
                    raise TokenizerError(f"no token for byte 0x{byte:02X} and no unknown token")
                tid = self.unk_id
            out.append(tid)
        return out

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], cache_dir: Path | None = None) -> Tokenizer:
        """Build the tokenizer for a GGUF file's metadata (key -> value, arrays as list/numpy).

        The `tokenizers` model is cached as JSON under ``cache_dir`` (default
        ``~/.cache/hyserve/tokenizers``), keyed by a hash of the vocabulary.
        """
        vocab = _analyze(metadata)
        return cls(vocab, _load_or_build(vocab, cache_dir))

    # ---- special-token partitioning --------------------------------------------------------

    def _init_specials(self) -> None:
        ids = np.flatnonzero(self._attrs & _ATTR_SPECIAL).tolist()
        tokens, attrs = self._tokens, self._attrs
        # llama.cpp: longest text (in bytes) first; equal lengths in id order here
        ids.sort(key=lambda t: (-len(tokens[t].encode("utf-8")), t))
        self._specials: list[tuple[str, int, int]] = [(tokens[t], t, int(attrs[t])) for t in ids]
        # Index for a quick "which specials occur in this text": by 3-character prefix (shorter
        # texts are checked one by one). One table for parse_special, one for the always-matched.
        self._special_index: dict[bool, tuple[dict[str, list[int]], list[int]]] = {}
        for parse_special in (True, False):
            by_prefix: dict[str, list[int]] = {}
            short: list[int] = []
            for i, (text, _, attr) in enumerate(self._specials):
                if not parse_special and attr & _ATTR_HIDDEN:
                    continue
                if len(text) < 3:
                    short.append(i)
                else:
                    by_prefix.setdefault(text[:3], []).append(i)
            self._special_index[parse_special] = (by_prefix, short)

    def _special_candidates(self, text: str, parse_special: bool) -> list[tuple[str, int, int]]:
        by_prefix, short = self._special_index[parse_special]
        specials = self._specials
        found = [i for i in short if specials[i][0] in text]
        for prefix, idxs in by_prefix.items():
            if prefix in text:
                found.extend(i for i in idxs if specials[i][0] in text)
        found.sort()
        return [specials[i] for i in found]

    def _partition(self, text: str, parse_special: bool) -> list[tuple[int, int, int]]:
        """Split ``text`` like llama.cpp's tokenizer_st_partition.

        Returns fragments ``(start, end, token)``: ``token >= 0`` is a special token found at
        ``start``; ``token == -1`` is raw text ``text[start:end]``.
        """
        if not text:
            return []
        fragments: list[tuple[int, int, int]] = [(0, len(text), -1)]
        for special, tid, attr in self._special_candidates(text, parse_special):
            size = len(special)
            out: list[tuple[int, int, int]] = []
            for start, end, tok in fragments:
                if tok >= 0:
                    out.append((start, end, tok))
                    continue
                pos = start
                while True:
                    match = text.find(special, pos, end)
                    if match < 0:
                        break
                    left_end = match
                    if attr & ATTR_LSTRIP:
                        while left_end > pos and text[left_end - 1] in _C_ISSPACE:
                            left_end -= 1
                    if left_end > pos:
                        out.append((pos, left_end, -1))
                    pos = match + size
                    out.append((match, pos, tid))
                    if attr & ATTR_RSTRIP:
                        while pos < end and text[pos] in _C_ISSPACE:
                            pos += 1
                if pos < end:
                    out.append((pos, end, -1))
            fragments = out
        return fragments

    # ---- encoding ---------------------------------------------------------------------------

    def _encode(
        self, text: str, add_special: bool, parse_special: bool, want_offsets: bool
    ) -> tuple[list[int], list[int]]:
        ids: list[int] = []
        offsets: list[int] = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise TokenizerError("the vocabulary asks for a BOS token but has none")
            ids.append(self.bos_id)
            offsets.append(0)
        spm = self.kind == "spm"
        prev_special = True  # SPM: a space prefix goes before the first fragment and after specials
        encode = self._hf.encode_batch  # unlike encode, it releases the GIL: other threads (streams) run meanwhile
        for start, end, tok in self._partition(text, parse_special):
            if tok >= 0:
                ids.append(tok)
                offsets.append(start)
                prev_special = True
                continue
            piece = text[start:end]
            shift = start
            if spm:
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                    shift -= 1
                piece = piece.replace(" ", _SPACE_MARK)
            prev_special = False
            try:
                enc = encode([piece], add_special_tokens=False)[0]
            except TypeError:
                piece.encode("utf-8")  # lone surrogates: raises UnicodeEncodeError (a ValueError)
                raise
            piece_ids = enc.ids
            if self._virtual and piece_ids and max(piece_ids) >= self.vocab_size:
                self._expand_virtual(piece_ids, enc.offsets, shift, start, ids, offsets, want_offsets)
                continue
            ids.extend(piece_ids)
            if want_offsets:
                offsets.extend(max(a + shift, start) for a, _ in enc.offsets)
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise TokenizerError("the vocabulary asks for an EOS token but has none")
            ids.append(self.eos_id)
            offsets.append(len(text))
        return ids, offsets

    def _expand_virtual(
        self,
        piece_ids: list[int],
        piece_offsets: list[tuple[int, int]],
        shift: int,
        start: int,
        ids: list[int],
        offsets: list[int],
        want_offsets: bool,
    ) -> None:
        for tid, (a, _) in zip(piece_ids, piece_offsets, strict=True):
            expanded = self._virtual.get(tid, [tid])
            ids.extend(expanded)
            if want_offsets:
                offsets.extend([max(a + shift, start)] * len(expanded))

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for ``text``, identical to llama.cpp's ``llama_tokenize``.

        ``add_special``: add BOS (and EOS) where the vocabulary asks for them. ``parse_special``:
        turn the text of CONTROL tokens into those tokens (USER_DEFINED tokens always match).
        """
        return self._encode(text, add_special, parse_special, want_offsets=False)[0]

    def encode_with_offsets(
        self, text: str, add_special: bool = True, parse_special: bool = True
    ) -> tuple[list[int], list[int]]:
        """Like :meth:`encode`, plus the character offset in ``text`` where each token starts.

        BOS gets 0 and an added EOS gets ``len(text)``; a token that covers part of a character (a
        byte token) gets that character's offset. Offsets never decrease.
        """
        return self._encode(text, add_special, parse_special, want_offsets=True)

    # ---- decoding ---------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` stands for, as llama.cpp's ``token_to_piece(special=True)``."""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._piece(token_id)
            self._pieces[token_id] = piece
        return piece

    def _piece(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            raise IndexError(f"token id {token_id} outside the vocabulary (0..{self.vocab_size - 1})")
        attr = int(self._attrs[token_id])
        text = self._tokens[token_id]
        if attr & (_ATTR_HIDDEN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            if self.kind == "spm":
                return text.replace(_SPACE_MARK, " ").encode("utf-8")
            table = _GPT2_CHAR_TO_BYTE
            # characters outside GPT-2's table (llama.cpp prints an "[UNK_BYTE...]" marker) keep
            # their own UTF-8 bytes
            return b"".join(bytes((table[c],)) if c in table else c.encode("utf-8") for c in text)
        if attr & ATTR_BYTE:
            try:
                return bytes((int(text[3:5], 16),))
            except ValueError:
                return text.encode("utf-8")
        return b""  # UNUSED / UNDEFINED tokens render as nothing in llama.cpp

    def is_special(self, token_id: int) -> bool:
        """A CONTROL or UNKNOWN token: hidden by ``skip_special``, matched only with ``parse_special``."""
        return bool(self._attrs[token_id] & _ATTR_HIDDEN)

    def _render(self, token_id: int, skip_special: bool, first: bool) -> bytes:
        if skip_special and self._attrs[token_id] & _ATTR_HIDDEN:
            return b""
        piece = self.token_bytes(token_id)
        if first and self.add_space_prefix and piece[:1] == b" ":
            piece = piece[1:]  # llama.cpp's detokenize drops the prefix space of the first token
        return piece

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text for ``ids``: the tokens' bytes concatenated, invalid UTF-8 replaced by U+FFFD.

        ``skip_special`` leaves out CONTROL and UNKNOWN tokens (llama.cpp's ``special=false``).
        """
        render = self._render
        data = b"".join(render(int(t), skip_special, i == 0) for i, t in enumerate(ids))
        return data.decode("utf-8", errors="replace")

    def incremental_decoder(self, skip_special: bool = False) -> IncrementalDecoder:
        """A streaming decoder whose deltas concatenate to :meth:`decode` of all pushed ids."""
        return IncrementalDecoder(self, skip_special)

    # ---- queries ----------------------------------------------------------------------------

    def is_eog(self, token_id: int) -> bool:
        """True for tokens that end generation (llama.cpp's ``llama_vocab_is_eog``)."""
        return token_id in self.eog_ids

    def token_text(self, token_id: int) -> str:
        """The token's string as stored in the GGUF vocabulary."""
        return self._tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose stored string is ``text``, if any."""
        return self._token_ids.get(text)

    def special_ids(self) -> Iterable[int]:
        """Ids of the tokens split out of text before the model runs (CONTROL, USER_DEFINED, UNKNOWN)."""
        return [tid for _, tid, _ in self._specials]

    def __repr__(self) -> str:
        pre = f", pre={self.pre!r}" if self.pre else ""
        return f"Tokenizer(kind={self.kind!r}{pre}, vocab_size={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id})"


class IncrementalDecoder:
    """Turns a stream of token ids into text deltas without ever splitting a UTF-8 character.

    Incomplete multi-byte sequences are held back until the bytes that complete them arrive;
    bytes that can never become valid UTF-8 come out as U+FFFD, as in :meth:`Tokenizer.decode`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now complete (possibly "")."""
        piece = self._tokenizer._render(int(token_id), self._skip_special, self._first)
        self._first = False
        return self._decoder.decode(piece, final=False)

    def flush(self) -> str:
        """Return whatever is still held back (an incomplete sequence becomes U+FFFD) and reset."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
