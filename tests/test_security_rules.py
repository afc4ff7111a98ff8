"""The pure decisions behind authentication and ownership (the servers are tested in test_auth_*)."""

from __future__ import annotations

import pytest

from hyserve.api.auth import TokenStore, bearer_token, hash_token, is_open_method, new_token_line
from hyserve.api.ownership import Caller, TaskOwners, may_see, peer_owner
from hyserve.api.tls import bind_refusal, is_loopback


def test_a_token_file_admits_exactly_its_tokens() -> None:
    alice, alice_line = new_token_line("alice")
    root, root_line = new_token_line("root", admin=True)
    store = TokenStore.parse(f"# comment\n\n{alice_line}  # trailing comment\n{root_line}\n")
    assert store.authenticate(alice) is not None and store.authenticate(alice).name == "alice"  # type: ignore[union-attr]
    principal = store.authenticate(root)
    assert principal is not None and principal.admin
    for wrong in (None, "", alice[:-1], alice + "x", hash_token(alice), root.upper()):
        assert store.authenticate(wrong) is None


def test_a_new_token_never_reads_as_a_command_line_option() -> None:
    """`hyserve generate --token TOKEN` must take every token hyserve makes (a random URL-safe
    base64 token starts with "-" one time in 64)."""
    tokens = [new_token_line("alice")[0] for _ in range(1000)]
    assert not [t for t in tokens if t.startswith("-")]
    assert len(set(tokens)) == len(tokens) and min(len(t) for t in tokens) >= 43  # >= 256 random bits


@pytest.mark.parametrize(
    "line",
    [
        "alice",  # no hash
        "alice secret-token",  # the token instead of its hash
        f"alice {hash_token('x')} root",  # unknown role
        f"al ice {hash_token('x')}",  # a space in the name
        f"alice {hash_token('x')[:-1]}",  # short hash
    ],
)
def test_a_malformed_token_line_is_refused_with_its_line_number(line: str) -> None:
    with pytest.raises(ValueError, match=r"tokens:2:"):
        TokenStore.parse(f"# header\n{line}\n", "tokens")


def test_an_empty_token_file_is_refused() -> None:
    with pytest.raises(ValueError, match="nobody"):
        TokenStore.parse("# nothing\n")


@pytest.mark.parametrize(
    ("value", "token"),
    [("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None), ("Bearer", None), ("", None), (None, None)],
)
def test_bearer_token(value: str | None, token: str | None) -> None:
    assert bearer_token(value) == token


def test_health_and_reflection_are_open_unless_protected() -> None:
    health, reflection = (
        "/grpc.health.v1.Health/Check",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    )
    assert is_open_method(health, False, False) and is_open_method(reflection, False, False)
    assert not is_open_method(health, True, False) and not is_open_method(reflection, False, True)
    assert not is_open_method("/hyserve.v1.HyserveService/ModelInfo", False, False)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("my-host.example", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_bind_refusal_needs_tls_or_auth_or_insecure_beyond_loopback() -> None:
    assert bind_refusal("127.0.0.1", tls=False, auth=False, insecure=False) is None
    assert bind_refusal("0.0.0.0", tls=False, auth=False, insecure=False) is not None
    for kwargs in ({"tls": True}, {"auth": True}, {"insecure": True}):
        flags = {"tls": False, "auth": False, "insecure": False} | kwargs
        assert bind_refusal("0.0.0.0", **flags) is None


@pytest.mark.parametrize(
    ("peer", "owner"),
    [
        ("ipv4:127.0.0.1:5000", "peer:127.0.0.1"),
        ("ipv6:[::1]:5000", "peer:::1"),
        ("ipv6:[::ffff:10.1.2.3]:80", "peer:10.1.2.3"),
        ("unix:/tmp/s", "peer:unix:/tmp/s"),
    ],
)
def test_peer_owner_drops_the_port(peer: str, owner: str) -> None:
    assert peer_owner(peer) == owner


def test_may_see() -> None:
    assert may_see("alice", Caller("alice"))
    assert not may_see("alice", Caller("bob"))
    assert may_see("alice", Caller("root", admin=True))
    assert not may_see(None, Caller("root", admin=True))  # an unknown id stays unknown


def test_task_owners_keep_an_ended_task_for_the_retention_then_forget_it() -> None:
    owners = TaskOwners(retention_s=3600, max_ended=2)
    for task_id in ("t1", "t2", "t3"):
        owners.claim(task_id, "alice")
    assert owners.owner_of("t1") == "alice"
    for task_id in ("t1", "t2", "t3"):
        owners.release(task_id)
    assert owners.owner_of("t1") is None  # beyond max_ended
    assert owners.owner_of("t3") == "alice"
    owners.claim("t3", "bob")  # the id used again by someone else: the new task's owner counts
    assert owners.owner_of("t3") == "bob"
    expired = TaskOwners(retention_s=-1, max_ended=10)  # every ended entry is past its retention
    expired.claim("x", "alice")
    expired.release("x")
    assert expired.owner_of("x") is None
