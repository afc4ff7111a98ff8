"""One real `hyserve serve` process per test module (--parallel 1), started once its references are
computed, and a client for it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2

from hyserve_client import HyserveClient

from .support import CHAT_TEMPLATE, CTX, QUEUE, REPO, SERVICE, START_TIMEOUT_S, Server, _free_port, _health, _references


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("server")
    template_file = tmp / "chat.jinja"
    template_file.write_text(CHAT_TEMPLATE)
    refs = _references(template_file)

    port = _free_port()
    target = f"127.0.0.1:{port}"
    log_path = tmp / "server.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "service"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "hyserve", "serve", "--model", "default", "--parallel", "1"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--ctx-size", str(CTX), "--queue-size", str(QUEUE)]
    cmd += ["--threads", "1", "--chat-template", str(template_file), "--drain-seconds", "20"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    srv = Server(proc, target, log_path, refs)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{srv.log_tail()}")
            try:
                if _health(target, SERVICE) == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server not SERVING after {START_TIMEOUT_S} s:\n{srv.log_tail()}")
            time.sleep(0.2)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def client(server: Server) -> Iterator[HyserveClient]:
    with HyserveClient(server.target, timeout=120) as c:
        yield c
