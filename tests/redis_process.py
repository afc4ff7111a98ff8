"""A real `redis-server` on a free 127.0.0.1 port, with no persistence, for the prefix store's
shared tier (Debian's package; `.ci/install.sh --test` installs it), in plaintext or over TLS."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from certs import Pair
from server_process import free_port

__all__ = ["RedisServer", "TlsFiles", "redis_server_binary", "running_redis"]

READY_GUARD_S = 60.0  # only against a hang


def redis_server_binary() -> str | None:
    debian = "/usr/bin/redis-server"
    return shutil.which("redis-server") or (debian if os.path.exists(debian) else None)


@dataclass(frozen=True)
class TlsFiles:
    """The server's certificate (for 127.0.0.1), the CA that signed it and the clients' ones, and
    the client certificate `RedisServer.client` presents."""

    ca: Path
    server: Pair
    client: Pair
    auth_clients: bool = True  # mutual TLS: a client without a certificate the CA signed is refused

    def server_arguments(self) -> list[str]:
        return [
            *("--tls-cert-file", str(self.server.cert), "--tls-key-file", str(self.server.key)),
            *("--tls-ca-cert-file", str(self.ca), "--tls-auth-clients", "yes" if self.auth_clients else "no"),
        ]


@dataclass
class RedisServer:
    proc: subprocess.Popen[bytes]
    port: int
    password: str | None = None
    tls: TlsFiles | None = None

    @property
    def url(self) -> str:
        """rediss:// over TLS, with no TLS files in the query: they are given as options."""
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        tls: dict[str, object] = {}
        if self.tls is not None:
            tls = {"ssl": True, "ssl_ca_certs": str(self.tls.ca)}
            tls |= {"ssl_certfile": str(self.tls.client.cert), "ssl_keyfile": str(self.tls.client.key)}
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=10, **tls)

    def pause(self) -> None:
        """SIGSTOP: the server accepts connections and answers nothing (a stalled store)."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@contextmanager
def running_redis(
    log_path: Path, *extra: str, password: str | None = None, tls: TlsFiles | None = None
) -> Iterator[RedisServer]:
    """A redis-server that keeps nothing on disk; yields once it answers PING, killed after. With
    `tls` it listens only for TLS (Debian's build has it)."""
    binary = redis_server_binary()
    if binary is None:
        raise RuntimeError("redis-server is missing: bash .ci/install.sh --test installs it (apt)")
    port = free_port()
    args = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(log_path.parent)]
    if tls is None:
        args += ["--port", str(port)]
    else:
        args += ["--port", "0", "--tls-port", str(port), *tls.server_arguments()]
    if password:
        args += ["--requirepass", password]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*args, *extra], stdout=log, stderr=subprocess.STDOUT)
    server = RedisServer(proc, port, password, tls)
    try:
        deadline = time.monotonic() + READY_GUARD_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
            try:
                if server.client().ping():
                    break
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server not ready: {log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        yield server
    finally:
        server.kill()
