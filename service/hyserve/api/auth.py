"""Bearer-token authentication for every port (`hyserve serve --auth-token-file FILE`).

The token file holds one principal per line, `NAME SHA256-HEX [admin]`, `#` comments allowed: the
SHA-256 of the token, never the token itself (`hyserve hash-token` prints a new token and its line).
A caller sends `authorization: Bearer TOKEN` (gRPC metadata or HTTP header). The presented token is
hashed and compared with every stored hash by `hmac.compare_digest`, so the time taken does not say
which entry, or how much of one, matched.

Health checks and reflection stay open unless the operator protects them: probes and balancers
usually cannot send a token, and neither reveals anything a caller could use.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

__all__ = [
    "AUTH_HEADER",
    "HEALTH_PREFIX",
    "REFLECTION_PREFIXES",
    "AuthInterceptor",
    "Principal",
    "TokenStore",
    "bearer_token",
    "hash_token",
    "new_token_line",
]

AUTH_HEADER = "authorization"
HEALTH_PREFIX = "/grpc.health.v1.Health/"
REFLECTION_PREFIXES = ("/grpc.reflection.v1alpha.ServerReflection/", "/grpc.reflection.v1.ServerReflection/")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9_.@:-]{1,128}")


@dataclass(frozen=True)
class Principal:
    name: str
    admin: bool = False


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token_line(name: str, admin: bool = False) -> tuple[str, str]:
    """A fresh random token and the token-file line that admits it."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"principal name {name!r}: use 1-128 of A-Z a-z 0-9 _ . @ : -")
    # A prefix: one bare URL-safe base64 token in 64 starts with "-", which a command line then
    # reads as an option (`hyserve generate --token -x...` failed). Not hex: 64 hex digits would
    # pass for a hash, and a token pasted into the token file by mistake would go unnoticed.
    token = "hys_" + secrets.token_urlsafe(32)
    return token, f"{name} {hash_token(token)}" + (" admin" if admin else "")


def bearer_token(value: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` value (scheme case-insensitive), else None."""
    if not value:
        return None
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class TokenStore:
    def __init__(self, entries: Iterable[tuple[str, str, bool]]) -> None:
        """entries: (principal name, sha256 hex of its token, admin)."""
        self._entries = [(Principal(name, admin), bytes.fromhex(digest)) for name, digest, admin in entries]
        if not self._entries:
            raise ValueError("the token file admits nobody (no principal lines)")

    @classmethod
    def parse(cls, text: str, where: str = "token file") -> TokenStore:
        entries = []
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            ok = len(fields) in (2, 3) and _NAME.fullmatch(fields[0]) and _HEX64.fullmatch(fields[1].lower())
            if not ok or (len(fields) == 3 and fields[2] != "admin"):
                raise ValueError(f"{where}:{n}: expected 'NAME SHA256-HEX [admin]' (the token's hash, not the token)")
            entries.append((fields[0], fields[1].lower(), len(fields) == 3))
        return cls(entries)

    @classmethod
    def load(cls, path: Path) -> TokenStore:
        return cls.parse(path.read_text(), str(path))

    def authenticate(self, token: str | None) -> Principal | None:
        if token is None:
            return None
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for principal, stored in self._entries:  # compare with all: no early exit to time
            if hmac.compare_digest(stored, digest):
                found = principal
        return found


def metadata_value(metadata: Iterable[Any] | None, key: str) -> str | None:
    for item in metadata or ():
        k, v = item[0], item[1]
        if k == key:
            return v.decode() if isinstance(v, bytes) else str(v)
    return None


def is_open_method(method: str, protect_health: bool, protect_reflection: bool) -> bool:
    """Whether a gRPC method needs no token."""
    if method.startswith(HEALTH_PREFIX):
        return not protect_health
    if method.startswith(REFLECTION_PREFIXES):
        return not protect_reflection
    return False


_DENIED = "a valid bearer token is required (metadata 'authorization: Bearer TOKEN')"


def _denied_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that answers UNAUTHENTICATED."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _DENIED)
        yield  # an async generator, as the streaming shapes expect

    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, des, ser)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, des, ser)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, des, ser)
    return grpc.unary_unary_rpc_method_handler(unary, des, ser)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for every call without a valid token, except the open methods."""

    def __init__(self, store: TokenStore, protect_health: bool = False, protect_reflection: bool = False) -> None:
        self.store = store
        self.protect_health = protect_health
        self.protect_reflection = protect_reflection

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = str(handler_call_details.method)  # type: ignore[attr-defined]
        handler = await continuation(handler_call_details)
        if handler is None or is_open_method(method, self.protect_health, self.protect_reflection):
            return handler
        metadata = handler_call_details.invocation_metadata  # type: ignore[attr-defined]
        if self.store.authenticate(bearer_token(metadata_value(metadata, AUTH_HEADER))) is None:
            return _denied_handler(handler)
        return handler
