"""Operator tools against a real server: every grpcurl recipe in clients/grpcurl.md (through
reflection) and the `hyserve` client subcommands."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import REPO, running_server

RECIPES = REPO / "clients" / "grpcurl.md"
GRPCURL = shutil.which("grpcurl") or str(Path.home() / "go" / "bin" / "grpcurl")
INSTALL = "GOBIN=$HOME/go/bin go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3"


def recipe_commands() -> list[str]:
    """The grpcurl command lines of the markdown's bash blocks (the install block excluded)."""
    blocks = re.findall(r"```bash\n(.*?)```", RECIPES.read_text(), flags=re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("grpcurl ")]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not os.access(GRPCURL, os.X_OK):
        pytest.skip(
            "grpcurl not installed: GOBIN=$HOME/go/bin go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3"
        )
    log = tmp_path_factory.mktemp("grpcurl") / "server.log"
    with running_server(log, "--model", "default", "--parallel", "1", "--ctx-size", "512", "--threads", "2") as t:
        yield t


def run(command: str, target: str) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(command.replace("localhost:50051", target))
    argv[0] = GRPCURL
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_recipes_are_all_exercised() -> None:
    commands = recipe_commands()
    for rpc in ("list", "describe", "Health/Check", "/ModelInfo", "/Generate", "/Cancel", "/CacheStats"):
        assert any(rpc in c for c in commands), rpc


def test_every_recipe_runs(target: str) -> None:
    outputs = {}
    for command in recipe_commands():
        done = run(command, target)
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        outputs[command] = done.stdout
    listed = next(out for cmd, out in outputs.items() if cmd.endswith(" list"))
    assert {"hyserve.v1.HyserveService", "grpc.health.v1.Health"} <= set(listed.split())
    assert '"SERVING"' in next(out for cmd, out in outputs.items() if "Health/Check" in cmd)
    generated = [out for cmd, out in outputs.items() if "/Generate" in cmd]
    for out in generated:
        events = [json.loads(chunk) for chunk in re.findall(r"^\{.*?^\}", out, flags=re.S | re.M)]
        assert "accepted" in events[0] and "finished" in events[-1]
        assert all("delta" in e for e in events[1:-1]) and len(events) > 2
    cancelled = next(out for cmd, out in outputs.items() if "/Cancel" in cmd)
    assert "ALREADY_FINISHED" in cancelled


def test_unknown_task_cancel_is_pending_and_a_malformed_id_not_found(target: str) -> None:
    def cancel(task_id: str) -> subprocess.CompletedProcess[str]:
        request = json.dumps({"task_id": task_id})
        return run(f"grpcurl -plaintext -d '{request}' {target} hyserve.v1.HyserveService/Cancel", target)

    pending = cancel("no-such-task")
    assert pending.returncode == 0 and "CANCEL_STATUS_PENDING" in pending.stdout, pending.stderr
    malformed = cancel("no such task")
    assert malformed.returncode != 0 and "NotFound" in malformed.stderr


def hyserve_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hyserve", *args], capture_output=True, text=True, timeout=120)


def test_hyserve_cli_subcommands_talk_to_the_server(target: str) -> None:
    """`hyserve generate|stats|model-info|cancel` are the client CLI, pointed at a running server."""
    done = hyserve_cli("generate", "Once upon a time", "--max-tokens", "6", "--target", target)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    info = json.loads(hyserve_cli("model-info", "--target", target).stdout)
    assert info["architecture"] == "gemma3"
    stats = json.loads(hyserve_cli("stats", "--target", target).stdout)
    assert "slots" in stats
    pending = hyserve_cli("cancel", "no-such-task-cli", "--target", target)
    assert pending.returncode == 0 and pending.stdout.strip() == "pending", pending.stderr
    missing = hyserve_cli("cancel", "no such task", "--target", target)
    assert missing.returncode != 0 and "NOT_FOUND" in missing.stderr.upper().replace(" ", "_")
