"""glibc heap settings for long prompts (`hyserve.model.heap`)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from hyserve.model.heap import wants_tuning

SERVICE = Path(__file__).resolve().parents[1] / "service"


def test_only_glibc_and_only_unless_switched_off() -> None:
    assert wants_tuning({}, "glibc")
    assert wants_tuning({"HYSERVE_MALLOC_TUNING": "1"}, "glibc")
    assert not wants_tuning({"HYSERVE_MALLOC_TUNING": "0"}, "glibc")
    assert not wants_tuning({}, "")  # musl, macOS, Windows: mallopt's parameters differ or are missing


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
@pytest.mark.parametrize(("setting", "applied"), [(None, "True"), ("0", "False")])
def test_settings_take_effect_once_per_process(setting: str | None, applied: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HYSERVE_MALLOC_TUNING"}
    if setting is not None:
        env["HYSERVE_MALLOC_TUNING"] = setting
    env["PYTHONPATH"] = os.pathsep.join([str(SERVICE), env.get("PYTHONPATH", "")])
    code = "from hyserve.model.heap import keep_freed_buffers as k; print('applied', k(), k())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    result = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("applied ")]
    assert result == [[applied, applied]]


BIG_BUFFER_FAULTS = """
import resource, threading
import numpy as np
from hyserve.model.heap import keep_freed_buffers
keep_freed_buffers()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
def forward_like():  # on a thread of its own, as the engine's forward calls run
    for _ in range(3):
        before = faults()
        buffer = np.ones(64 << 18, np.float32)  # 64 MiB: over glibc's largest mmap threshold
        del buffer
        counts.append(faults() - before)
worker = threading.Thread(target=forward_like)
worker.start()
worker.join()
print("faults", *counts)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
@pytest.mark.parametrize(("setting", "reused"), [(None, True), ("0", False)])
def test_buffers_over_the_mmap_threshold_are_reused_without_page_faults(setting: str | None, reused: bool) -> None:
    """A 64 MiB buffer allocated, touched and freed three times: with the settings the 2nd and 3rd
    reuse the heap's pages (no page faults); with glibc's defaults each is mapped afresh (at least
    32 faults: numpy asks for 2 MiB pages; 16384 in 4 KiB pages, as the kernels' own buffers)."""
    env = {k: v for k, v in os.environ.items() if k != "HYSERVE_MALLOC_TUNING"}
    if setting is not None:
        env["HYSERVE_MALLOC_TUNING"] = setting
    env["PYTHONPATH"] = os.pathsep.join([str(SERVICE), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", BIG_BUFFER_FAULTS], env=env, capture_output=True, text=True, check=True)
    counts = [int(c) for line in out.stdout.splitlines() if line.startswith("faults ") for c in line.split()[1:]]
    assert len(counts) == 3 and counts[0] >= 32, counts  # the first one maps its pages either way
    if reused:
        assert max(counts[1:]) <= 4, counts
    else:
        assert min(counts[1:]) >= 32, counts
