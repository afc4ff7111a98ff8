"""The generated Python code of the public API: `hyserve.api.codegen` writes both copies (server and
client) from one protoc run, and `--check` finds a stale one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyserve.api import codegen
from hyserve.api.gen import hyserve_pb2 as server_pb
from hyserve_client._gen import hyserve_pb2 as pb

REPO = Path(__file__).resolve().parents[1]


def test_codegen_check_passes(capsys: pytest.CaptureFixture[str]) -> None:
    rc = codegen.main(["--check"])
    out, err = capsys.readouterr()
    assert rc == 0, f"generated code is stale; run `PYTHONPATH=service python -m hyserve.api.codegen`\n{err}"
    assert "up to date" in out


def test_codegen_check_reports_a_stale_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "gen"
    assert codegen.main(["--out", str(out_dir)]) == 0
    assert codegen.main(["--check", "--out", str(out_dir)]) == 0
    pb2 = out_dir / "hyserve_pb2_grpc.py"
    pb2.write_text(pb2.read_text() + "# edited by hand\n")
    (out_dir / "old_pb2.py").write_text("")
    capsys.readouterr()
    assert codegen.main(["--check", "--out", str(out_dir)]) == 1
    err = capsys.readouterr().err
    assert "hyserve_pb2_grpc.py: differs" in err and "+# edited by hand" not in err  # regenerated lacks it
    assert "-# edited by hand" in err
    assert "old_pb2.py: stale file" in err
    assert "python -m hyserve.api.codegen" in err
    assert codegen.main(["--out", str(out_dir)]) == 0  # rewriting repairs it and drops the stale file
    assert not (out_dir / "old_pb2.py").exists()
    assert codegen.main(["--check", "--out", str(out_dir)]) == 0


def test_generated_imports_are_relative_and_copies_identical() -> None:
    for out_dir in codegen.DEFAULT_OUTPUTS:
        grpc_code = (out_dir / "hyserve_pb2_grpc.py").read_text()
        assert "from . import hyserve_pb2 as" in grpc_code
        assert "from hyserve.v1" not in grpc_code
    server_copy, client_copy = (
        {p.name: p.read_text() for p in d.iterdir() if p.is_file()} for d in codegen.DEFAULT_OUTPUTS
    )
    assert server_copy == client_copy
    # Both copies load in one process: the descriptor pool accepts the identical file twice.
    assert server_pb.DESCRIPTOR.serialized_pb == pb.DESCRIPTOR.serialized_pb
    msg = server_pb.GenerateRequest(task_id="t")
    assert pb.GenerateRequest.FromString(msg.SerializeToString()).task_id == "t"


def test_codegen_runs_as_a_module() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "service"), str(REPO / "clients" / "python")])}
    proc = subprocess.run(
        [sys.executable, "-m", "hyserve.api.codegen", "--check"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr
