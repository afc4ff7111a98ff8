"""SentencePiece against llama.cpp: a small Llama-2 style vocabulary (add_space_prefix and add_eos
on) and merges with equal scores."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hyserve.model.gguf_file import GGUFFile
from hyserve.model.tokenizer import Tokenizer

from .checks import compare_with_llama, llama_detokenize, stream
from .strings import GEMMA_SPECIALS, MIN_STRINGS, make_strings

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
