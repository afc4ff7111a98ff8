"""`hyserve serve` security flags, and the objects built from them that the servers share."""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from hyserve.api.auth import AuthInterceptor, TokenStore
from hyserve.api.ownership import Identity, TaskOwners
from hyserve.api.tls import TlsFiles, bind_refusal

__all__ = ["Security", "SecurityConfig", "SecurityError", "add_security_arguments"]


class SecurityError(ValueError):
    """An operator error in the security flags or files."""


@dataclass(frozen=True)
class SecurityConfig:
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    auth_token_file: Path | None = None
    admin_principals: tuple[str, ...] = ()
    protect_health: bool = False
    protect_reflection: bool = False
    insecure: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SecurityConfig:
        return cls(
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            tls_client_ca=args.tls_client_ca,
            auth_token_file=args.auth_token_file,
            admin_principals=tuple(args.admin_principal or ()),
            protect_health=args.auth_protect_health,
            protect_reflection=args.auth_protect_reflection,
            insecure=args.insecure,
        )


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (see README 'Security')")
    g.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate chain: serve TLS on every port")
    g.add_argument("--tls-key", type=Path, default=None, help="PEM private key of --tls-cert")
    g.add_argument(
        "--tls-client-ca", type=Path, default=None, help="PEM CA: require client certificates it signed (mutual TLS)"
    )
    g.add_argument(
        "--auth-token-file",
        type=Path,
        default=None,
        help="lines 'NAME SHA256-OF-TOKEN [admin]': require 'authorization: Bearer TOKEN' (see hyserve hash-token)",
    )
    g.add_argument(
        "--admin-principal",
        action="append",
        metavar="NAME",
        help="a principal that sees and may cancel every task (repeatable; cert:CN for a client certificate)",
    )
    g.add_argument("--auth-protect-health", action="store_true", help="require a token for health checks too")
    g.add_argument("--auth-protect-reflection", action="store_true", help="require a token for reflection too")
    g.add_argument(
        "--insecure",
        action="store_true",
        help="allow listening beyond loopback without TLS or authentication (logged as a warning)",
    )


@dataclass
class Security:
    """What the gRPC server, the servicer and the HTTP fronts need, built once from SecurityConfig."""

    config: SecurityConfig = field(default_factory=SecurityConfig)
    tls: TlsFiles | None = None
    store: TokenStore | None = None
    identity: Identity = field(default_factory=Identity)
    owners: TaskOwners = field(default_factory=TaskOwners)

    @classmethod
    def build(cls, config: SecurityConfig) -> Security:
        """Reads the files; SecurityError with one clear line for any operator error."""
        if (config.tls_cert is None) != (config.tls_key is None):
            raise SecurityError("--tls-cert and --tls-key go together")
        if config.tls_client_ca is not None and config.tls_cert is None:
            raise SecurityError("--tls-client-ca needs --tls-cert and --tls-key")
        tls = None
        if config.tls_cert is not None and config.tls_key is not None:
            tls = TlsFiles(config.tls_cert, config.tls_key, config.tls_client_ca)
            try:
                tls.server_credentials()
                tls.ssl_context()
            except (OSError, ssl.SSLError) as exc:
                raise SecurityError(f"TLS files: {exc}") from exc
        store = None
        if config.auth_token_file is not None:
            try:
                store = TokenStore.load(config.auth_token_file)
            except (OSError, ValueError) as exc:
                raise SecurityError(f"--auth-token-file: {exc}") from exc
        identity = Identity(store, frozenset(config.admin_principals))
        return cls(config, tls, store, identity)

    @property
    def authenticated(self) -> bool:
        """Callers prove who they are (tokens or client certificates)."""
        return self.store is not None or (self.tls is not None and self.tls.client_ca is not None)

    def bind_refusal(self, host: str) -> str | None:
        return bind_refusal(host, tls=self.tls is not None, auth=self.authenticated, insecure=self.config.insecure)

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        if self.store is None:
            return []
        return [AuthInterceptor(self.store, self.config.protect_health, self.config.protect_reflection)]

    def add_port(self, server: grpc.aio.Server, address: str) -> int:
        if self.tls is None:
            return int(server.add_insecure_port(address))
        return int(server.add_secure_port(address, self.tls.server_credentials()))

    def ssl_context(self) -> ssl.SSLContext | None:
        return self.tls.ssl_context() if self.tls is not None else None

    def log_fields(self) -> dict[str, Any]:
        return {
            "tls": self.tls is not None,
            "mutual_tls": self.tls is not None and self.tls.client_ca is not None,
            "auth": self.store is not None,
        }
