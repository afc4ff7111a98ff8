"""Real hyserve replicas behind a real HAProxy on 127.0.0.1 (docker/haproxy/haproxy.cfg).

Replica: one `hyserve serve` process on a fixed port (so the balancer's config names it, and a
restarted replica comes back at the same address). Balancer: `haproxy -f docker/haproxy/haproxy.cfg`
with the replicas' addresses in its environment and its admin socket read for server states.
Conversation: one session id sent as `x-session-id` metadata on every request, as every client must.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hyserve_client import Accepted, Delta, Finished, build_generate_request
from hyserve_client._gen import hyserve_pb2_grpc as pb_grpc
from hyserve_client.types import event_from_proto

REPO = Path(__file__).resolve().parents[1]
HAPROXY_CFG = REPO / "docker" / "haproxy" / "haproxy.cfg"
READY_SERVICE = "hyserve.v1.HyserveService"
SESSION_HEADER = "x-session-id"
REPLICA_HEADER = "x-hyserve-replica"
HANG_GUARD_S = 120.0  # only against a hang; nothing below waits on a time to be correct


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        return int(health_pb2_grpc.HealthStub(channel).Check(request, timeout=5).status)


def wait_until(what: str, predicate: Any, guard_s: float = HANG_GUARD_S) -> None:
    deadline = time.monotonic() + guard_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


# --- the balancer's gRPC health check --------------------------------------------------------------


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _hpack_string(value: bytes) -> bytes:
    assert len(value) < 127, "one-byte length prefix only"
    return bytes([len(value)]) + value


def grpc_health_check_request(service: str) -> bytes:
    """The bytes a client writes to call grpc.health.v1.Health/Check(service) over h2c.

    Client preface, empty SETTINGS, HEADERS on stream 1 (HPACK: indexed :method POST and :scheme http,
    literals without indexing for :path, :authority, content-type and te), then DATA ending the
    stream with the length-prefixed HealthCheckRequest (field 1, the service name).
    """
    name = service.encode()
    message = b"\x0a" + bytes([len(name)]) + name
    grpc_message = b"\x00" + len(message).to_bytes(4, "big") + message
    headers = b"\x83\x86"  # :method POST, :scheme http (static table 3 and 6)
    headers += b"\x04" + _hpack_string(b"/grpc.health.v1.Health/Check")  # :path (static name 4)
    headers += b"\x01" + _hpack_string(b"hyserve")  # :authority (static name 1)
    headers += b"\x0f\x10" + _hpack_string(b"application/grpc")  # content-type (static name 31)
    headers += b"\x00" + _hpack_string(b"te") + _hpack_string(b"trailers")
    return (
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + _h2_frame(0x4, 0, 0, b"")  # SETTINGS
        + _h2_frame(0x1, 0x4, 1, headers)  # HEADERS, END_HEADERS
        + _h2_frame(0x0, 0x1, 1, grpc_message)  # DATA, END_STREAM
    )


# --- processes -------------------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    args: Sequence[str]
    log_dir: Path
    port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        cmd = [sys.executable, "-m", "hyserve", "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--metrics-port", str(self.metrics_port), "--replica-id", self.name, *self.args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ), cwd=REPO)

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            return health(self.target, READY_SERVICE) == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Balancer:
    """haproxy -f docker/haproxy/haproxy.cfg with the replicas' addresses in its environment."""

    def __init__(self, replicas: Sequence[Replica], work_dir: Path) -> None:
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.port = free_port()
        self.socket_path = work_dir / "haproxy.sock"
        env = dict(os.environ)
        env.update({f"HYSERVE_R{i}": r.target for i, r in enumerate(replicas)})
        env.update(HYSERVE_LB_BIND=f"127.0.0.1:{self.port}", HYSERVE_LB_STATS=str(self.socket_path))
        self.log_path = work_dir / "haproxy.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [haproxy, "-db", "-f", str(HAPROXY_CFG)], stdout=log, stderr=subprocess.STDOUT, env=env
            )

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def server_states(self) -> dict[str, str]:
        """Server name -> HAProxy status ("UP", "DOWN", ...) from the admin socket's `show stat`."""
        if not self.socket_path.exists():
            return {}
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.socket_path))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
        return {row["svname"]: row["status"] for row in rows if row["pxname"] == "hyserve" and row["svname"]}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


# --- conversations through the balancer -----------------------------------------------------------


@dataclass
class Turn:
    replica: str
    accepted: Accepted
    tokens: list[int]
    finished: Finished
    retries: int  # UNAVAILABLE answers retried before this one was served


def generate(
    target: str,
    session: str,
    messages: Sequence[Mapping[str, Any]] | None = None,
    *,
    retry_unavailable: bool = False,
    **params: Any,
) -> Turn:
    """One Generate call (messages, or `token_ids=` among the params) with the session header;
    retries UNAVAILABLE (as clients should: a replica just killed may not be marked down yet)
    if asked, until the hang guard."""
    request = build_generate_request(messages=messages, **params)
    retries, deadline = 0, time.monotonic() + HANG_GUARD_S
    while True:
        with grpc.insecure_channel(target) as channel:
            call = pb_grpc.HyserveServiceStub(channel).Generate(
                request, metadata=((SESSION_HEADER, session),), timeout=HANG_GUARD_S
            )
            try:
                events = [event_from_proto(m) for m in call]
            except grpc.RpcError as exc:
                unavailable = exc.code() is grpc.StatusCode.UNAVAILABLE
                if retry_unavailable and unavailable and time.monotonic() < deadline:
                    retries += 1
                    time.sleep(0.1)
                    continue
                raise
            replica = dict(call.initial_metadata()).get(REPLICA_HEADER, "?")
        accepted, finished = events[0], events[-1]
        assert isinstance(accepted, Accepted) and isinstance(finished, Finished)
        tokens = [t for e in events if isinstance(e, Delta) for t in e.token_ids]
        return Turn(str(replica), accepted, tokens, finished, retries)
