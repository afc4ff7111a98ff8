"""A `hyserve serve` process the soak test can stop with SIGTERM and start again on the same port."""

from __future__ import annotations

import http.client
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2
from server_process import REPO, free_port, health

from hyserve_client import HyserveClient, SlotState

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([-+0-9.eEinfa]+)$")


class SoakServer:
    def __init__(self, log_dir: Path, *args: str) -> None:
        self.log_dir = log_dir
        self.args = args
        self.port = free_port()
        self.metrics_port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"server-{self.starts}.log"

    def start(self, timeout_s: float = 180) -> None:
        self.starts += 1
        cmd = [sys.executable, "-m", "hyserve", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--metrics-port", str(self.metrics_port), *self.args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ), cwd=REPO)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if health(self.target) == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready after {timeout_s} s: {self.log_tail()}")
            time.sleep(0.2)

    def sigterm(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout_s: float = 60) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.sigterm()
            try:
                self.wait_exit(30)
            except subprocess.TimeoutExpired:
                pass

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def log_lines(self, word: str) -> list[str]:
        """Lines of every start's log that contain `word`."""
        return [
            line
            for i in range(1, self.starts + 1)
            for line in (self.log_dir / f"server-{i}.log").read_text(errors="replace").splitlines()
            if word in line
        ]

    def metrics(self) -> dict[str, float]:
        """The Prometheus samples, summed over their labels (name -> value)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            m = _SAMPLE.match(line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
        return out

    def metrics_while_stopping(self) -> dict[str, float] | None:
        """metrics() after the SIGTERM: None once the endpoint is gone (the connection refused or reset,
        or a response cut short by the exit). An HTTP error status or a timeout still raises: those are
        failures, not the end of the process."""
        try:
            return self.metrics()
        except urllib.error.HTTPError:
            raise
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionError):
                return None
            raise
        except (ConnectionError, http.client.IncompleteRead):  # RemoteDisconnected is a ConnectionError
            return None

    def wait_idle(self, parallel: int, timeout_s: float = 60) -> tuple[int, int]:
        """Poll CacheStats until every slot is idle and nothing is queued; returns (idle slots, queued)
        as last seen (the caller asserts: a slot still busy when all clients are done is leaked)."""
        deadline = time.monotonic() + timeout_s
        with HyserveClient(self.target) as client:
            while True:
                stats = client.cache_stats(timeout=10)
                idle = sum(1 for s in stats.slots if s.state is SlotState.IDLE)
                queued = int(self.metrics()["hyserve_num_requests_waiting"])
                if (idle == parallel and queued == 0) or time.monotonic() > deadline:
                    return idle, queued
                time.sleep(0.1)
