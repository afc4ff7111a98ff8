"""`serve`'s options of the prefix store's shared tier (Redis or Valkey, `--cache-redis`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine loads with the model, not with the CLI
    from hyserve.engine.store_tiers.shared import SharedTierConfig

__all__ = ["add_shared_cache_arguments", "shared_cache_config"]


def add_shared_cache_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache-redis",
        default=None,
        metavar="URL",
        help="shared prefix-store tier every replica reads: redis://[user:password@]host:port/db, "
        "rediss:// for TLS (ssl_ca_certs=... in the query), unix:///path.sock",
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


def shared_cache_config(args: argparse.Namespace) -> SharedTierConfig | None:
    url = getattr(args, "cache_redis", None)
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

    return SharedTierConfig(url, password, args.cache_redis_ttl, args.cache_redis_timeout_ms / 1000)
