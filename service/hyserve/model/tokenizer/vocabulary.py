"""What llama.cpp's vocabulary loader makes of a GGUF file's tokenizer metadata.

`analyze` reads ``tokenizer.ggml.*`` into a `Vocab`: the tokens, their llama.cpp attributes, the
special token ids, the BOS/EOS defaults and the end-of-generation set, including the loader's rules
that find special tokens by their text and force them to CONTROL (e.g. ``<end_of_turn>``,
``<|im_end|>``, ``</s>``). Rules llama.cpp keys on model names of architectures hyserve does not
load (Phi-3, BERT-family strip attributes, gpt-oss and PLaMo end-of-generation fix-ups) are left
out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from hyserve_kernels import TokenIndex

from hyserve.model.tokenizer.errors import TokenizerError
from hyserve.model.tokenizer.pretokenizers import PRE_TOKENIZERS, PreSpec

log = logging.getLogger(__name__)

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
# index: GGUF token type 0..6 -> attribute; any other type is UNDEFINED
_TYPE_TO_ATTR = np.array(
    [ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE],
    dtype=np.int32,
)
ATTR_SPECIAL = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN  # split out before the model runs
ATTR_HIDDEN = ATTR_CONTROL | ATTR_UNKNOWN  # matched only with parse_special, rendered only when asked

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


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass
class Vocab:
    kind: str  # "spm" | "bpe"
    pre: str  # tokenizer.ggml.pre as given ("" for SPM)
    pre_spec: PreSpec | None
    tokens: list[str]
    token_ids: TokenIndex  # text -> id (`get`, `in`)
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


def analyze(metadata: Mapping[str, Any]) -> Vocab:
    model = metadata.get("tokenizer.ggml.model")
    if not isinstance(model, str):
        raise TokenizerError("GGUF metadata has no tokenizer.ggml.model; the file carries no vocabulary")
    pre = metadata.get("tokenizer.ggml.pre")
    pre = pre if isinstance(pre, str) else ""
    special: dict[str, int | None] = dict.fromkeys(
        ("bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask", "fim_pre", "fim_suf", "fim_mid", "fim_pad",
         "fim_rep", "fim_sep")
    )  # fmt: skip
    pre_spec: PreSpec | None = None
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
        pre_spec = PRE_TOKENIZERS.get(pre)
        if pre_spec is None:
            raise TokenizerError(
                f"unsupported tokenizer.ggml.pre {pre!r} (supported: {', '.join(sorted(PRE_TOKENIZERS))})"
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
    if "" in tokens:
        for i, t in enumerate(tokens):
            if not t:
                tokens[i] = f"[EMPTY_{i}]"  # llama.cpp renames empty tokens the same way
    try:  # native: a dict of 262k fresh strings is a tenth of a second of load time
        token_ids = TokenIndex(tokens, "".join(tokens))
    except UnicodeEncodeError as exc:
        raise TokenizerError(f"tokenizer.ggml.tokens holds text that is not valid Unicode: {exc}") from exc
    if token_ids.distinct != n:
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
    for name in ("eos", "eot", "eom"):
        if (tid := special[name]) is not None:
            eog.add(tid)

    return Vocab(
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
