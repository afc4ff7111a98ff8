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
