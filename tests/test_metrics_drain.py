"""The /metrics endpoint at shutdown: a scrape the server has accepted gets its whole response, and
after the close a scrape is refused, never cut mid-body (`api/metrics_http.py`).

The mechanism is tested in-process; the last test drives a real `hyserve serve` through its drain
with a scrape in flight (the old endpoint died with the process and cut that scrape off)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import grpc
import pytest
from fixtures import make_models
from grpc_health.v1 import health_pb2
from loopback import wait_until
from server_process import REPO, free_port, health

from hyserve.api.metrics_http import MetricsEndpoint, start_metrics_endpoint

BODY = b"hyserve_test_metric 1\n" * 200


def blocking_app(entered: threading.Event, release: threading.Event) -> Any:
    """A WSGI app that answers BODY once `release` is set."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        entered.set()
        release.wait(60)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))])
        return [BODY]

    return app


def read_response(sock: socket.socket) -> tuple[bytes, dict[str, str], bytes]:
    """(status line, headers, body) of one HTTP/1.0 response read to EOF."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.decode().partition(":") for ln in lines)}
    return status, headers, body


def test_close_lets_an_accepted_request_finish() -> None:
    entered, release = threading.Event(), threading.Event()
    endpoint = start_metrics_endpoint(blocking_app(entered, release), "127.0.0.1", 0, None)
    answers: list[bytes] = []
    client = threading.Thread(
        target=lambda: answers.append(urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=60).read())
    )
    client.start()
    assert entered.wait(30)
    closed: list[int] = []
    closing = threading.Thread(target=lambda: closed.append(endpoint.close(60)))
    closing.start()
    closing.join(0.5)
    assert closing.is_alive(), "close returned while a request it had accepted was unanswered"
    release.set()
    closing.join(60)
    client.join(60)
    assert closed == [0]
    assert answers == [BODY]


def test_close_is_bounded_by_a_client_that_never_sends_its_request() -> None:
    endpoint = start_metrics_endpoint(blocking_app(threading.Event(), threading.Event()), "127.0.0.1", 0, None)
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=30):
        wait_until("the connection is accepted", lambda: endpoint.in_flight == 1)
        assert endpoint.close(0.2) == 1


def test_a_closed_endpoint_refuses_connections() -> None:
    endpoint: MetricsEndpoint = start_metrics_endpoint(
        blocking_app(threading.Event(), threading.Event()), "127.0.0.1", 0, None
    )
    assert endpoint.close(5) == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", endpoint.port), timeout=30).close()


def test_a_scrape_in_flight_during_the_drain_gets_a_whole_response(tmp_path: Path) -> None:
    model = make_models.write_model(tmp_path / "llama.gguf", "llama", qtype="q8_0")
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "hyserve", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--model", str(model), "--parallel", "1", "--ctx-size", "256", "--threads", "1"]
    # the close waits for an accepted scrape until the drain's deadline: far beyond this test's steps
    cmd += ["--metrics-port", str(metrics_port), "--drain-seconds", "60"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ), cwd=REPO)
    try:
        wait_until("the server is ready", lambda: _ready(f"127.0.0.1:{port}", proc), guard_s=180)
        with socket.create_connection(("127.0.0.1", metrics_port), timeout=30) as scrape:
            # the request line only: the server has accepted the scrape and waits for the rest
            scrape.sendall(b"GET /metrics HTTP/1.0\r\n")
            proc.send_signal(signal.SIGTERM)
            wait_until(
                "the server closes its metrics endpoint or exits",
                lambda: proc.poll() is not None or "metrics_closing" in log_path.read_text(errors="replace"),
                guard_s=60,
            )
            try:
                scrape.sendall(b"Host: 127.0.0.1\r\n\r\n")
                status, headers, body = read_response(scrape)
            except ConnectionError as exc:
                pytest.fail(f"the scrape was cut off by the shutdown: {exc!r}")
        assert status.startswith(b"HTTP/1.") and b" 200 " in status, (status, log_path.read_text()[-3000:])
        assert int(headers["content-length"]) == len(body)
        assert b"hyserve_num_requests_running" in body
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ready(target: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"server exited with {proc.returncode}")
    try:
        return health(target) == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:  # not listening yet
        return False
