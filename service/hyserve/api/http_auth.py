"""The same bearer-token check on the HTTP ports: an aiohttp middleware for the OpenAI-compatible
front (and the Anthropic Messages API on its port) and a WSGI wrapper for the Prometheus endpoint
(served by `metrics_http`). On the front, Anthropic's clients send the token as `x-api-key`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiohttp import web

from hyserve.api.auth import TokenStore, bearer_token
from hyserve.api.metrics_http import WsgiApp
from hyserve.api.ownership import Caller, Identity

__all__ = ["API_KEY_HEADER", "aiohttp_auth_middleware", "http_caller", "http_token", "wsgi_auth"]

API_KEY_HEADER = "x-api-key"
_MESSAGES_PATH = "/v1/messages"

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="hyserve"'}
_MESSAGE = "a valid bearer token is required (header 'Authorization: Bearer TOKEN')"
_API_KEY_MESSAGE = "a valid token is required (header 'x-api-key: TOKEN' or 'Authorization: Bearer TOKEN')"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def http_token(headers: Mapping[str, str]) -> str | None:
    """The token of `Authorization: Bearer TOKEN`, else of `x-api-key: TOKEN`; None without either."""
    token = bearer_token(headers.get("Authorization"))
    if token is None:
        token = (headers.get(API_KEY_HEADER) or "").strip() or None
    return token


def http_caller(identity: Identity, request: web.Request) -> Caller:
    """Who sent an HTTP request: its token, its client certificate's name, or its address."""
    peercert = request.transport.get_extra_info("peercert") if request.transport else None
    return identity.of_http(http_token(request.headers), peercert, request.remote)


def _denied_body(path: str) -> dict[str, Any]:
    """A 401 body in the shape of the API the path belongs to (Anthropic's or OpenAI's)."""
    if path == _MESSAGES_PATH or path.startswith(_MESSAGES_PATH + "/"):
        return {"type": "error", "error": {"type": "authentication_error", "message": _API_KEY_MESSAGE}}
    return {"error": {"message": _MESSAGE, "type": "authentication_error", "param": None, "code": None}}


def aiohttp_auth_middleware(store: TokenStore, open_paths: frozenset[str]) -> Any:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in open_paths and store.authenticate(http_token(request.headers)) is None:
            return web.json_response(_denied_body(request.path), status=401, headers=_CHALLENGE)
        return await handler(request)

    return auth


def wsgi_auth(app: WsgiApp, store: TokenStore) -> WsgiApp:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if store.authenticate(bearer_token(environ.get("HTTP_AUTHORIZATION"))) is None:
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), *_CHALLENGE.items()])
            return [_MESSAGE.encode() + b"\n"]
        return app(environ, start_response)

    return guarded
