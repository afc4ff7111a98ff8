"""Start a real `hyserve serve` process on a free 127.0.0.1 port and wait until it is ready."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

REPO = Path(__file__).resolve().parents[1]
READY_SERVICE = "hyserve.v1.HyserveService"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(target: str, service: str = READY_SERVICE) -> int:
    with grpc.insecure_channel(target) as channel:
        return (
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
        )


@contextmanager
def running_server(
    log_path: Path, *args: str, timeout_s: float = 180, probe: Callable[[str], int] = health
) -> Iterator[str]:
    """Yields the server's target ("127.0.0.1:PORT") once `probe` (default: a plaintext health check)
    reports SERVING; SIGTERM after."""
    target = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "hyserve", "serve", "--host", "127.0.0.1", "--port", target.split(":")[1], *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ), cwd=REPO)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
            try:
                if probe(target) == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready after {timeout_s} s: {log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield target
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
