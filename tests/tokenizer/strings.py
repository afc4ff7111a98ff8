"""The strings every tokenizer test encodes: fixed edge cases, long standard-library texts, and seeded
random mixtures of their pieces with the vocabularies' special tokens."""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from fixtures.bpe_vocab import MULTILINGUAL_TEXT, SPECIAL_TOKENS

BPE_PRES = ("qwen2", "qwen35", "llama3", "gpt-2", "default")
GEMMA_SPECIALS = ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<mask>", "<unk>",
                  "<unused0>", "<unused17>", "[multimodal]", "<start_of_image>", "<b>", "</b>", "<table>",
                  "</s>", "<s>")  # fmt: skip
BPE_SPECIALS = tuple(text for text, _ in SPECIAL_TOKENS)
MIN_STRINGS = 300


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
