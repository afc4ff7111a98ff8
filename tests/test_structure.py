"""Structural rules that keep the layers honest: what a module may load, and how tests import our code."""

from __future__ import annotations

import ast
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


SERVICE = TESTS.parent / "service" / "hyserve"


def test_no_assert_statements_in_the_service() -> None:
    """Invariant checks must survive `python -O`, which strips `assert` statements."""
    found = []
    for path in sorted(SERVICE.rglob("*.py")):
        if "gen" in path.relative_to(SERVICE).parts:
            continue
        tree = ast.parse(path.read_text(), str(path))
        asserts = [node for node in ast.walk(tree) if isinstance(node, ast.Assert)]
        found += [f"{path.relative_to(SERVICE)}:{node.lineno}" for node in asserts]
    assert found == []


def test_slot_invariant_holds_under_python_O() -> None:
    """Under -O, a slot whose tokens and memory disagree after a commit still raises (I1)."""
    code = (
        "from hyserve.engine.slot import Slot\n"
        "from hyserve.engine.invariants import InvariantError\n"
        "from hyserve.model.memory import SequenceMemory\n"
        "slot = Slot(0, SequenceMemory(8, {}))\n"
        "try:\n"
        "    slot.commit([1, 2])\n"
        "except InvariantError as exc:\n"
        "    print('raised', exc)\n"
    )
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("raised slot 0: 2 tokens but memory holds 0")
