"""TLS for the gRPC port (grpc's own credentials) and the HTTP ports (ssl contexts), and the rule on
which addresses may be bound without any protection.

One certificate/key pair serves every port. With a client CA, every port asks for and verifies a
client certificate (mutual TLS); the certificate's common name then names the caller when no bearer
tokens are configured (see `ownership.caller_of_grpc`).
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["TlsFiles", "bind_refusal", "is_loopback"]


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: mutual TLS, a client certificate signed by this CA is required

    def server_credentials(self) -> grpc.ServerCredentials:
        ca = self.client_ca.read_bytes() if self.client_ca is not None else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )

    def ssl_context(self) -> ssl.SSLContext:
        """Server-side context for the HTTP ports (OpenAI front, metrics)."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            ctx.load_verify_locations(cafile=self.client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


def is_loopback(host: str) -> bool:
    """True only for addresses that cannot be reached from another machine. Other host names, the
    wildcard addresses (0.0.0.0, ::, empty) and interface addresses are not loopback."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_refusal(host: str, *, tls: bool, auth: bool, insecure: bool) -> str | None:
    """Why binding `host` is refused (None: allowed). Beyond loopback the operator must turn on TLS or
    authentication, or say --insecure explicitly (e.g. inside a container behind its own network)."""
    if is_loopback(host) or tls or auth or insecure:
        return None
    return (
        f"refusing to listen on {host!r} (reachable from other machines) without TLS or authentication: "
        "give --tls-cert/--tls-key and/or --auth-token-file, or --insecure to accept that risk"
    )
