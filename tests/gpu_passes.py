"""Compute passes per kernel name while some GPU work is recorded (timestamp queries): what a test
of a fused pass counts."""

from __future__ import annotations

from collections.abc import Callable

import hyserve_kernels as hk
import pytest


def passes_while(device, record: Callable[[], object]) -> dict[str, int]:  # device: hk.GpuDevice
    """Passes per kernel name (buffer copies left out) of the work `record()` records and runs;
    skips the test on an adapter without timestamp queries. Every pass is timed."""
    ts = hk.GpuTimestamps(device)
    if not ts.supported:
        pytest.skip("the adapter has no timestamp queries")
    device.flush()
    ts.start()
    try:
        ts.take()
        record()
        totals, untimed = ts.take()
    finally:
        ts.stop()
    assert untimed == 0
    return {name: n for name, (_, n) in totals.items() if name != "copy"}
