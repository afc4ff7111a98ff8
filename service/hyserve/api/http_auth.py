"""The same bearer-token check on the HTTP ports: an aiohttp middleware for the OpenAI-compatible
front and a WSGI wrapper for the Prometheus endpoint (which then runs on its own TLS-capable server)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from aiohttp import web
from prometheus_client import CollectorRegistry, make_wsgi_app

from hyserve.api.auth import TokenStore, bearer_token

__all__ = ["aiohttp_auth_middleware", "serve_wsgi", "wsgi_auth"]

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="hyserve"'}
_MESSAGE = "a valid bearer token is required (header 'Authorization: Bearer TOKEN')"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def aiohttp_auth_middleware(store: TokenStore, open_paths: frozenset[str]) -> Any:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = bearer_token(request.headers.get("Authorization"))
        if request.path not in open_paths and store.authenticate(token) is None:
            body = {"error": {"message": _MESSAGE, "type": "authentication_error", "param": None, "code": None}}
            return web.json_response(body, status=401, headers=_CHALLENGE)
        return await handler(request)

    return auth


WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def wsgi_auth(app: WsgiApp, store: TokenStore) -> WsgiApp:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if store.authenticate(bearer_token(environ.get("HTTP_AUTHORIZATION"))) is None:
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), *_CHALLENGE.items()])
            return [_MESSAGE.encode() + b"\n"]
        return app(environ, start_response)

    return guarded


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # scrapes every few seconds would flood the log


def serve_wsgi(
    registry: CollectorRegistry, host: str, port: int, store: TokenStore | None, context: ssl.SSLContext | None
) -> int:
    """Serve the registry's metrics on a daemon thread; returns the bound port."""
    app: WsgiApp = make_wsgi_app(registry)
    if store is not None:
        app = wsgi_auth(app, store)
    server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
    server = make_server(host.strip("[]"), port, app, server_class, handler_class=_QuietHandler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="hyserve-metrics", daemon=True).start()
    return int(server.server_address[1])
