"""Who a caller is, and which tasks are theirs.

A caller's owner name is, in this order:
- with bearer tokens on (`--auth-token-file`): the token's principal name;
- else with mutual TLS (`--tls-client-ca`): `cert:` + the client certificate's common name;
- else `peer:` + the caller's IP address, without the port. Every connection from one host is one
  owner: a client may cancel over a second channel (a new connection, another port), and so may any
  other process on that host. With auth off on loopback all local clients are one owner, and behind
  a proxy all its clients are; callers that must not touch each other's tasks need tokens or client
  certificates (a forwarded-for header is not trusted: any client could write it).

A task belongs to the owner that submitted it. `Cancel` of a task that is not the caller's answers
exactly as for an id never used (NOT_FOUND, same message), and `CacheStats` shows a running task's
id only to its owner; other callers see the slot busy with an empty task id. Admin principals
(`--admin-principal NAME`, or `admin` in the token file) see and may cancel every task.

All methods run on the server's asyncio loop (gRPC servicer and HTTP front share it): no locks.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import grpc.aio

from hyserve.api.auth import AUTH_HEADER, TokenStore, bearer_token, metadata_value

__all__ = ["Caller", "Identity", "TaskOwners", "may_see", "peer_owner"]


@dataclass(frozen=True)
class Caller:
    owner: str
    admin: bool = False


def may_see(task_owner: str | None, caller: Caller) -> bool:
    """Whether `caller` may see (and cancel) a task owned by `task_owner` (None: unknown task)."""
    return task_owner is not None and (caller.admin or task_owner == caller.owner)


def _address(text: str) -> str:
    try:
        ip = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return text
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:a.b.c.d is the IPv4 host a.b.c.d
    return str(mapped or ip)


def peer_owner(peer: str) -> str:
    """Owner name of a gRPC peer string (`ipv4:1.2.3.4:5678`, `ipv6:[::1]:5678`, `unix:/path`)."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host = rest.rsplit(":", 1)[0]
        return f"peer:{_address(host)}"
    return f"peer:{peer}"


class Identity:
    """Resolves the caller of a gRPC call or an HTTP request."""

    def __init__(self, store: TokenStore | None = None, admins: frozenset[str] = frozenset()) -> None:
        self.store = store
        self.admins = admins

    def _caller(self, token: str | None, cert_cn: str | None, peer: str) -> Caller:
        if self.store is not None:
            principal = self.store.authenticate(token)
            name = principal.name if principal is not None else "anonymous"  # only on open methods
            return Caller(name, (principal is not None and principal.admin) or name in self.admins)
        owner = f"cert:{cert_cn}" if cert_cn else peer
        return Caller(owner, owner in self.admins)

    def of_grpc(self, context: grpc.aio.ServicerContext) -> Caller:
        token = bearer_token(metadata_value(context.invocation_metadata(), AUTH_HEADER))
        cns = (context.auth_context() or {}).get("x509_common_name") or []
        cn = cns[0].decode() if cns else None
        return self._caller(token, cn, peer_owner(context.peer()))

    def of_http(self, token: str | None, peercert: dict[str, Any] | None, remote: str | None) -> Caller:
        cn = None
        for rdn in (peercert or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
        return self._caller(token, cn, f"peer:{_address(remote or 'unknown')}")


class TaskOwners:
    """task id -> owner, kept while the task lives and `retention_s` after (so that the owner's Cancel
    of a just-finished task still answers ALREADY_FINISHED), at most `max_ended` ended ones."""

    def __init__(self, retention_s: float = 600.0, max_ended: int = 100_000) -> None:
        self.retention_s = retention_s
        self.max_ended = max_ended
        self._live: dict[str, str] = {}
        self._ended: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def claim(self, task_id: str, owner: str) -> None:
        self._ended.pop(task_id, None)
        self._live[task_id] = owner

    def release(self, task_id: str) -> None:
        owner = self._live.pop(task_id, None)
        if owner is None:
            return
        now = time.monotonic()
        self._ended[task_id] = (owner, now)
        self._ended.move_to_end(task_id)
        self._prune(now)

    def owner_of(self, task_id: str) -> str | None:
        owner = self._live.get(task_id)
        if owner is not None:
            return owner
        self._prune(time.monotonic())
        ended = self._ended.get(task_id)
        return ended[0] if ended is not None else None

    def _prune(self, now: float) -> None:
        horizon = now - self.retention_s
        while self._ended:
            _, (_, at) = next(iter(self._ended.items()))
            if at >= horizon and len(self._ended) <= self.max_ended:
                break
            self._ended.popitem(last=False)
