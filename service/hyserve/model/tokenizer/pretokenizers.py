"""Pre-tokenizers of byte-level BPE vocabularies: llama.cpp's regex lists, in Oniguruma syntax.

``tokenizer.ggml.pre`` names the list (llama.cpp's ``llm_tokenizer_bpe`` table); each text piece
it splits off is mapped byte by byte through GPT-2's byte-to-unicode table and merged by rank.
llama.cpp evaluates the regexes with its own Unicode tables (Unicode 15.1) while Oniguruma inside
``tokenizers`` 0.23 knows Unicode 16.0: the code points Unicode 16 added to letters, digits, marks
and punctuation are removed from those classes so that both agree (``UNICODE16_ADDITIONS``).
"""

from __future__ import annotations

from dataclasses import dataclass

# Code points that Unicode 16.0 assigned as letters, digits, marks or punctuation. llama.cpp's
# tables (unicode-data.cpp, Unicode 15.1) mark them undefined, so its pre-tokenizers treat them
# like symbols; Oniguruma in tokenizers 0.23 already knows them. Found by comparing both tables
# over all code points.
UNICODE16_ADDITIONS = (
    (0x0897, 0x0897), (0x1B4E, 0x1B4F), (0x1B7F, 0x1B7F), (0x1C89, 0x1C8A), (0xA7CB, 0xA7CD),
    (0xA7DA, 0xA7DC), (0x105C0, 0x105F3), (0x10D40, 0x10D65), (0x10D69, 0x10D85),
    (0x10EC2, 0x10EC4), (0x10EFC, 0x10EFC), (0x11380, 0x11389), (0x1138B, 0x1138B),
    (0x1138E, 0x1138E), (0x11390, 0x113B5), (0x113B7, 0x113C0), (0x113C2, 0x113C2),
    (0x113C5, 0x113C5), (0x113C7, 0x113CA), (0x113CC, 0x113D5), (0x113D7, 0x113D8),
    (0x113E1, 0x113E2), (0x116D0, 0x116E3), (0x11BC0, 0x11BE1), (0x11BF0, 0x11BF9),
    (0x11F5A, 0x11F5A), (0x13460, 0x143FA), (0x16100, 0x16139), (0x16D40, 0x16D79),
    (0x18CFF, 0x18CFF), (0x1CCF0, 0x1CCF9), (0x1E5D0, 0x1E5FA), (0x1E5FF, 0x1E5FF),
)  # fmt: skip
_U16 = "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in UNICODE16_ADDITIONS)


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
class PreSpec:
    regexes: tuple[str, ...]
    add_bos: bool = False  # llama.cpp's default before tokenizer.ggml.add_bos_token
    ignore_merges: bool = False  # a piece that is itself a token is emitted without merging


_PRE_DEFAULT = PreSpec(_RES_DEFAULT)
_PRE_GPT2 = PreSpec((_RE_GPT2,))
_PRE_QWEN2 = PreSpec((_RE_QWEN2,))
_PRE_QWEN35 = PreSpec((_RE_QWEN35,))
_PRE_LLAMA3 = PreSpec((_RE_LLAMA3,), add_bos=True, ignore_merges=True)
_PRE_LLAMA3_REGEX_ONLY = PreSpec((_RE_LLAMA3,))

# tokenizer.ggml.pre -> spec: the names llama.cpp gives models of the architectures hyserve loads
# (llama, qwen2/qwen3, qwen35, ...), whose llama.cpp behaviour is fully covered here
PRE_TOKENIZERS: dict[str, PreSpec] = {
    "default": _PRE_DEFAULT,
    "gpt-2": _PRE_GPT2,
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "f2llmv2", "megrez"),
        _PRE_QWEN2,
    ),
    "qwen35": _PRE_QWEN35,
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "midm-2.0"),
        _PRE_LLAMA3,
    ),
    "smaug-bpe": _PRE_LLAMA3_REGEX_ONLY,
}


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


GPT2_CHAR_TO_BYTE = _gpt2_byte_table()
