"""TLS credentials and bearer tokens for a server run with `--tls-cert`/`--auth-token-file`.

    client = HyserveClient("host:50051", credentials=tls_credentials("ca.pem"), token=os.environ["HYSERVE_TOKEN"])

Mutual TLS: also give the client's certificate and key (`tls_credentials("ca.pem", "me.pem", "me.key")`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import grpc

__all__ = ["AUTH_HEADER", "auth_metadata", "tls_credentials"]

AUTH_HEADER: Final = "authorization"


def tls_credentials(
    ca_file: str | Path | None = None, cert_file: str | Path | None = None, key_file: str | Path | None = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials: `ca_file` verifies the server (default: the system's roots);
    `cert_file` + `key_file` present a client certificate (mutual TLS)."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("a client certificate needs both cert_file and key_file")
    return grpc.ssl_channel_credentials(
        root_certificates=Path(ca_file).read_bytes() if ca_file is not None else None,
        private_key=Path(key_file).read_bytes() if key_file is not None else None,
        certificate_chain=Path(cert_file).read_bytes() if cert_file is not None else None,
    )


def auth_metadata(token: str) -> tuple[str, str]:
    """The metadata pair that carries a bearer token."""
    return (AUTH_HEADER, f"Bearer {token}")
