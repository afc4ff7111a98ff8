"""Seeded random texts for the fidelity fuzz: prose, non-Latin scripts, emoji (with ZWJ
sequences and modifiers), whitespace runs, code, digits and punctuation, mixed in one text."""

from __future__ import annotations

import random

WORDS = (
    "the of and to in is that for it as with was on be by this are or from at which but not have "
    "model token cache layer state vector kernel matrix stream server request memory thread value"
).split()
SCRIPTS = {
    "cyrillic": (0x0410, 0x044F),
    "greek": (0x0391, 0x03C9),
    "cjk": (0x4E00, 0x4FFF),
    "arabic": (0x0621, 0x064A),
    "devanagari": (0x0905, 0x0939),
    "hangul": (0xAC00, 0xAD00),
    "hiragana": (0x3041, 0x3096),
    "thai": (0x0E01, 0x0E2E),
}
GERMAN = "Größe Übermaß straße Fähigkeit Äpfel Öl müssen heißt Gebührenordnung zuverlässig".split()
EMOJI = ["😀", "🚀", "👍🏽", "👩‍💻", "🇩🇪", "❤️", "🧪", "🐍", "👨‍👩‍👧‍👦", "✨", "🤖"]
WHITESPACE = [" ", "  ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "        \n"]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }\n",
    'if err != nil {\n\treturn fmt.Errorf("read: %w", err)\n}\n',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;\n",
    '{"key": [1, 2.5, -3e-4], "ok": true, "s": "\\u00e9"}\n',
    "let v: Vec<u8> = (0..255).map(|b| b ^ 0x5a).collect();\n",
    '#include <stdio.h>\nint main(void) { printf("%d\\n", 42); }\n',
]
PUNCT = list(".,;:!?()[]{}<>\"'`~@#$%^&*-_=+|/\\…–—«»„“”")


def _script_word(rng: random.Random) -> str:
    lo, hi = SCRIPTS[rng.choice(sorted(SCRIPTS))]
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6)))


def _piece(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.35:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))).capitalize() + rng.choice(".,!? ")
    if kind < 0.5:
        return " ".join(_script_word(rng) for _ in range(rng.randint(1, 6)))
    if kind < 0.58:
        return " ".join(rng.choice(GERMAN) for _ in range(rng.randint(1, 5)))
    if kind < 0.68:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if kind < 0.78:
        return rng.choice(WHITESPACE) * rng.randint(1, 4)
    if kind < 0.9:
        return rng.choice(CODE)
    if kind < 0.95:
        return str(rng.randint(0, 10 ** rng.randint(1, 12))) + rng.choice(["", ".", ",", " ", "%"])
    return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 5)))


def random_text(rng: random.Random, n_chars: int) -> str:
    """A text of about n_chars characters mixing every kind of piece."""
    parts: list[str] = []
    size = 0
    while size < n_chars:
        p = _piece(rng)
        sep = rng.choice(["", " ", " ", "\n"])
        parts.append(p + sep)
        size += len(p) + len(sep)
    return "".join(parts)
