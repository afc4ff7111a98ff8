"""Bench scripts print only JSON on stdout (logs go to stderr), so `bench/x.py > result.json` works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import make_models

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_resume_cost_prints_one_json_document(tmp_path: Path) -> None:
    model = make_models.write_model(tmp_path / "qwen35.gguf", "qwen35")
    run = subprocess.run(
        [sys.executable, str(BENCH / "resume_cost.py"), "--model", str(model), "--tokens", "16", "--repeats", "1"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=300,
    )
    assert json.loads(run.stdout)["tokens"] == 16
    assert "model_loaded" in run.stderr  # the log line is there, on stderr


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_bench_scripts_send_their_logs_to_stderr(script: str) -> None:
    """Every script that loads a model in its own process configures logging (to stderr) first;
    kernel_ab.py runs its models in worker processes whose stdout it reads itself, report.py loads
    nothing, and llama_gpu_side.py runs only llama.cpp (quiet, verbose=False)."""
    text = (BENCH / script).read_text()
    assert script in ("kernel_ab.py", "report.py", "llama_gpu_side.py") or "configure_logging()" in text
