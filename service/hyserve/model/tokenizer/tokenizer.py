"""Tokenizer built from the vocabulary in a GGUF file's metadata, matching llama.cpp's token ids.

Two vocabulary kinds are supported, as ``tokenizer.ggml.model`` names them:

``llama`` (SentencePiece with scores, e.g. Gemma 3)
    llama.cpp merges adjacent symbols by the *score* of the token they form (highest first, ties to
    the left), starting from UTF-8 characters, after replacing every space with ``▁``; characters
    that never became part of a token are emitted as ``<0xXX>`` byte tokens. The Hugging Face
    ``tokenizers`` library has no score-priority mode, so this runs in the kernel wheel
    (``hyserve_kernels.SpmVocab``, the same algorithm, GIL released). It needs only the vocabulary's
    text -> (id, score) map, which takes tens of milliseconds to build, so nothing is cached.

``gpt2`` (byte-level BPE, e.g. Qwen, Llama 3)
    The text is split with the regex list of ``tokenizer.ggml.pre``, each piece's UTF-8 bytes are
    mapped through the GPT-2 byte-to-unicode table and merged by merge rank. This is a ``BPE``
    model behind a ``Split(regex) + ByteLevel`` pre-tokenizer with no normalizer (llama.cpp does
    not apply NFC). llama.cpp evaluates these regexes with its own Unicode tables (Unicode 15.1),
    while Oniguruma inside ``tokenizers`` 0.23 knows Unicode 16.0; the code points that Unicode 16
    added to letters, digits, marks and punctuation are removed from those classes so that both
    agree (see ``UNICODE16_ADDITIONS``).

Special tokens are not handed to ``tokenizers``: the text is first split at special tokens exactly
as llama.cpp's ``tokenizer_st_partition`` does (longest token text first; CONTROL and UNKNOWN
tokens only when ``parse_special``, USER_DEFINED always), and only the
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from hyserve_kernels import SpmVocab
from tokenizers import Tokenizer as _HFTokenizer

from hyserve.model.tokenizer.errors import TokenizerError
from hyserve.model.tokenizer.hf_build import load_or_build
from hyserve.model.tokenizer.pretokenizers import GPT2_CHAR_TO_BYTE
from hyserve.model.tokenizer.vocabulary import (
    ATTR_BYTE,
    ATTR_HIDDEN,
    ATTR_NORMAL,
    ATTR_SPECIAL,
    ATTR_USER_DEFINED,
    Vocab,
    analyze,
)

__all__ = ["IncrementalDecoder", "Tokenizer"]

SPACE_MARK = "\u2581"  # ▁

# One piece of raw text (no special tokens) -> token ids and the character offset each starts at
PieceEncoder = Callable[[str], tuple[list[int], list[int]]]


def _hf_piece_encoder(hf: _HFTokenizer) -> PieceEncoder:
    encode = hf.encode_batch  # unlike encode, it releases the GIL: other threads (streams) run meanwhile

    def piece(text: str) -> tuple[list[int], list[int]]:
        try:
            enc = encode([text], add_special_tokens=False)[0]
        except TypeError:
            text.encode("utf-8")  # lone surrogates: raises UnicodeEncodeError (a ValueError)
            raise
        return enc.ids, [a for a, _ in enc.offsets]

    return piece


def _spm_byte_tokens(vocab: Vocab) -> list[int]:
    """llama.cpp's SPM byte fallback per byte: ``<0xXX>``, else the one-byte token, else unknown (-1: none)."""
    unk = vocab.special["unk"]
    table = []
    for byte in range(256):
        tid = vocab.token_ids.get(f"<0x{byte:02X}>")
        if tid is None and byte < 0x80:
            tid = vocab.token_ids.get(chr(byte))
        table.append((unk if unk is not None else -1) if tid is None else tid)
    return table


def _spm_piece_encoder(vocab: Vocab) -> PieceEncoder:
    if vocab.scores is None:
        raise TokenizerError("a SentencePiece vocabulary without scores")
    scores = np.ascontiguousarray(vocab.scores, dtype=np.float32)
    encode = SpmVocab(vocab.token_ids, scores, _spm_byte_tokens(vocab)).encode

    def piece(text: str) -> tuple[list[int], list[int]]:
        try:
            return encode(text)
        except UnicodeEncodeError:
            raise  # lone surrogates (a ValueError, as for BPE)
        except ValueError as exc:
            raise TokenizerError(str(exc)) from exc

    return piece


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

    def __init__(self, vocab: Vocab, encode_piece: PieceEncoder) -> None:
        self._vocab = vocab
        self._encode_piece = encode_piece
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
        self._init_specials()

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], cache_dir: Path | None = None) -> Tokenizer:
        """Build the tokenizer for a GGUF file's metadata (key -> value, arrays as list/numpy).

        A byte-level BPE vocabulary's `tokenizers` model is cached as JSON under ``cache_dir``
        (default ``~/.cache/hyserve/tokenizers``), keyed by a hash of the vocabulary; a
        SentencePiece one is built directly (see the module docstring).
        """
        vocab = analyze(metadata)
        if vocab.kind == "spm":
            return cls(vocab, _spm_piece_encoder(vocab))
        return cls(vocab, _hf_piece_encoder(load_or_build(vocab, cache_dir)))

    # ---- special-token partitioning --------------------------------------------------------

    def _init_specials(self) -> None:
        ids = np.flatnonzero(self._attrs & ATTR_SPECIAL).tolist()
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
                if not parse_special and attr & ATTR_HIDDEN:
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
        for special, tid, _ in self._special_candidates(text, parse_special):
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
                    if match > pos:
                        out.append((pos, match, -1))
                    pos = match + size
                    out.append((match, pos, tid))
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
        encode_piece = self._encode_piece
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
                piece = piece.replace(" ", SPACE_MARK)
            prev_special = False
            piece_ids, piece_offsets = encode_piece(piece)
            ids.extend(piece_ids)
            if want_offsets:
                offsets.extend(max(a + shift, start) for a in piece_offsets)
        if add_special and self.add_eos:
            if self.eos_id is None:
                raise TokenizerError("the vocabulary asks for an EOS token but has none")
            ids.append(self.eos_id)
            offsets.append(len(text))
        return ids, offsets

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
        if attr & (ATTR_HIDDEN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            if self.kind == "spm":
                return text.replace(SPACE_MARK, " ").encode("utf-8")
            table = GPT2_CHAR_TO_BYTE
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
        return bool(self._attrs[token_id] & ATTR_HIDDEN)

    def _render(self, token_id: int, skip_special: bool, first: bool) -> bytes:
        if skip_special and self._attrs[token_id] & ATTR_HIDDEN:
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
