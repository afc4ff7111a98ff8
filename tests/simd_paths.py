"""Running a test on one kernel path (scalar, AVX2, AVX-512 VNNI: all give the same bits)."""

from __future__ import annotations

from collections.abc import Iterator

import hyserve_kernels as hk
import pytest


def run_on_simd_path(path: str) -> Iterator[str]:
    """For a fixture: cap the kernels at `path` (skipped where the CPU lacks it), lift it after."""
    running = hk.set_simd_ceiling(path)
    try:
        if running != path:
            pytest.skip(f"CPU has no {path} path")
        yield path
    finally:
        hk.set_force_scalar(False)
