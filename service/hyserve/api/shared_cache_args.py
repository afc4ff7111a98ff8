"""`serve`'s options of the prefix store's shared tier (Redis or Valkey, `--cache-redis`)."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # the engine loads with the model, not with the CLI
    from hyserve.engine.store_tiers.shared import SharedTierConfig

__all__ = ["add_shared_cache_arguments", "shared_cache_config"]


def add_shared_cache_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-redis",
        default=None,
        metavar="URL",
        help="shared prefix-store tier every replica reads: redis://[user:password@]host:port/db, "
        "rediss:// for TLS, unix:///path.sock",
    )
    p.add_argument(
        "--cache-redis-password-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="file holding the Redis password (AUTH), when the URL carries none",
    )
    p.add_argument(
        "--cache-redis-ttl",
        type=int,
        default=86400,
        metavar="SECONDS",
        help="time to live of the shared tier's keys (0: none; the server's maxmemory policy decides)",
    )
    p.add_argument(
        "--cache-redis-timeout-ms",
        type=int,
        default=200,
        metavar="MS",
        help="socket timeout of shared-tier reads; a slower store counts as a miss",
    )
    p.add_argument(
        "--cache-redis-tls-ca-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="rediss://: PEM CA bundle that verifies the store's certificate (default: the system's)",
    )
    p.add_argument(
        "--cache-redis-tls-cert-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="rediss://: PEM client certificate for mutual TLS (with --cache-redis-tls-key-file)",
    )
    p.add_argument(
        "--cache-redis-tls-key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="rediss://: PEM private key of --cache-redis-tls-cert-file",
    )


def shared_cache_config(args: argparse.Namespace) -> SharedTierConfig | None:
    url = getattr(args, "cache_redis", None) or ""
    ca_file, cert_file, key_file = _tls_files(args, url)
    if not url:
        return None
    if args.cache_redis_ttl < 0 or args.cache_redis_timeout_ms < 1:
        raise SystemExit("hyserve serve: --cache-redis-ttl must be >= 0 and --cache-redis-timeout-ms >= 1")
    password = None
    if args.cache_redis_password_file is not None:
        try:
            password = args.cache_redis_password_file.read_text().strip()
        except OSError as exc:
            raise SystemExit(f"hyserve serve: --cache-redis-password-file: {exc}") from None
    from hyserve.engine.store_tiers.shared import SharedTierConfig

    return SharedTierConfig(
        url,
        password,
        args.cache_redis_ttl,
        args.cache_redis_timeout_ms / 1000,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
    )


def _tls_files(args: argparse.Namespace, url: str) -> tuple[str | None, str | None, str | None]:
    """The TLS files, loaded once here: a file that does not load would otherwise show only as
    shared-tier errors once requests come in."""
    ca: Path | None = getattr(args, "cache_redis_tls_ca_file", None)
    cert: Path | None = getattr(args, "cache_redis_tls_cert_file", None)
    key: Path | None = getattr(args, "cache_redis_tls_key_file", None)
    if ca is None and cert is None and key is None:
        return None, None, None
    if urlsplit(url).scheme.lower() != "rediss":
        raise SystemExit("hyserve serve: the --cache-redis-tls-* files need a rediss:// --cache-redis URL (TLS)")
    if (cert is None) != (key is None):
        raise SystemExit("hyserve serve: --cache-redis-tls-cert-file and --cache-redis-tls-key-file go together")
    for option, path in (("ca", ca), ("cert", cert), ("key", key)):
        try:
            if path is not None:
                path.read_bytes()
        except OSError as exc:
            raise SystemExit(f"hyserve serve: --cache-redis-tls-{option}-file: {exc}") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if ca is not None:
            ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise SystemExit(f"hyserve serve: --cache-redis-tls-ca-file {ca}: {exc}") from None
    try:
        if cert is not None and key is not None:
            # an empty password: an encrypted key is refused here, never prompted for
            ctx.load_cert_chain(cert, key, password="")
    except ssl.SSLError as exc:
        raise SystemExit(
            f"hyserve serve: --cache-redis-tls-cert-file {cert} and --cache-redis-tls-key-file {key} "
            f"(PEM, the key unencrypted and of that certificate): {exc}"
        ) from None
    return _text(ca), _text(cert), _text(key)


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)
