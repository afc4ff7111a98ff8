"""The HTTP server behind `/metrics`: one thread per request, optionally TLS, and a close that lets
the requests it has accepted finish.

prometheus_client's own server runs its request threads as daemons and is never stopped, so a scrape
that arrived while the process shut down was cut off mid-body when the interpreter exited (the
scraper read a short body). `MetricsEndpoint.close` stops accepting, waits (bounded) for the requests
already accepted, then closes the listening socket: a scraper gets a whole response or a refused
(or reset, if it was still in the listen backlog) connection, never part of a body.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

__all__ = ["MetricsEndpoint", "WsgiApp", "start_metrics_endpoint"]

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _CountingServer(ThreadingMixIn, WSGIServer):
    """A thread per request that counts the requests it has accepted and not yet answered."""

    # a client that connects and never sends its request must not hold the exit past close's bound
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._idle = threading.Condition()
        self._in_flight = 0
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        # counted before the thread starts, so a close that follows an accept always sees it
        with self._idle:
            self._in_flight += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._finished()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._finished()

    def _finished(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    @property
    def in_flight(self) -> int:
        with self._idle:
            return self._in_flight

    def wait_idle(self, timeout_s: float) -> int:
        """Wait until no accepted request is left or `timeout_s` has passed; returns how many are left."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._idle.wait(left)
            return self._in_flight


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every few seconds would flood the log


class MetricsEndpoint:
    """A running `/metrics` server: its port, the requests it is answering, and its close."""

    def __init__(self, server: _CountingServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port = int(server.server_address[1])

    @property
    def in_flight(self) -> int:
        return self._server.in_flight

    def close(self, grace_s: float) -> int:
        """Stop accepting, let the accepted requests finish for up to `grace_s`, close the socket.
        Returns how many requests were still unanswered (their threads die with the process)."""
        self._server.shutdown()  # serve_forever returns: nothing new is accepted
        left = self._server.wait_idle(grace_s)
        self._server.server_close()
        self._thread.join()
        return left


def _server_class(host: str, port: int) -> tuple[type[_CountingServer], str]:
    """The address family that `host` resolves to first (as prometheus_client's own server picks it)."""
    infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]

    class Server(_CountingServer):
        address_family = family

    return Server, str(sockaddr[0])


def start_metrics_endpoint(app: WsgiApp, host: str, port: int, context: ssl.SSLContext | None) -> MetricsEndpoint:
    """Serve `app` on host:port (port 0: any free one) from a daemon thread."""
    server_class, address = _server_class(host, port)
    server = make_server(address, port, app, server_class, handler_class=_QuietHandler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="hyserve-metrics", daemon=True)
    thread.start()
    return MetricsEndpoint(server, thread)
