"""Structural rules that keep the layers honest: what a module may load, and how tests import our code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# modules that mean a model, a tokenizer or the kernel wheel was loaded
HEAVY = ("hyserve.model", "hyserve_kernels", "tokenizers", "hyserve.engine.generator", "hyserve.engine.engine")


def loaded_after_import(module: str) -> list[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return out.split()


def test_cache_plan_loads_no_model_tokenizer_or_kernel() -> None:
    """cache_plan promises "no model, no memory, no threads": importing it must not load them."""
    loaded = loaded_after_import("hyserve.engine.cache_plan")
    assert "hyserve.engine.cache_plan" in loaded
    heavy = [m for m in loaded if m.startswith(HEAVY)]
    assert heavy == [], f"importing cache_plan loaded {heavy}"


def test_stop_rules_load_no_model_tokenizer_or_kernel() -> None:
    loaded = loaded_after_import("hyserve.engine.stop")
    assert [m for m in loaded if m.startswith(HEAVY)] == []


def test_tests_import_our_own_code_for_real() -> None:
    """A broken fixture builder (or any module of ours) must fail the tests, not skip them."""
    ours = re.compile(r"importorskip\(\s*[\"'](fixtures|hyserve|llama_oracle|server_process|loopback)\b")
    offenders = [
        f"{path.name}:{n}"
        for path in sorted(TESTS.glob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if ours.search(line)
    ]
    assert offenders == []
