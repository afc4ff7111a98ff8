"""The same bearer-token check on the HTTP ports: an aiohttp middleware for the OpenAI-compatible
front and a WSGI wrapper for the Prometheus endpoint (served by `metrics_http`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web

from hyserve.api.auth import TokenStore, bearer_token
from hyserve.api.metrics_http import WsgiApp

__all__ = ["aiohttp_auth_middleware", "wsgi_auth"]

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


def wsgi_auth(app: WsgiApp, store: TokenStore) -> WsgiApp:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if store.authenticate(bearer_token(environ.get("HTTP_AUTHORIZATION"))) is None:
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), *_CHALLENGE.items()])
            return [_MESSAGE.encode() + b"\n"]
        return app(environ, start_response)

    return guarded
