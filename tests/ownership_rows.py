"""The cross-owner rules, run against a real server by real clients: every row with two
owners (`alice`, `bob`) and an admin. Shared by the token, mutual-TLS and auth-off server tests.

`--parallel 2` is assumed: alice and bob each hold a slot while the rows run."""

from __future__ import annotations

import time
import uuid

from hyserve_client import Accepted, CancelStatus, Delta, FinishReason, GenerateStream, HyserveClient

LONG = {"max_tokens": 3000, "ignore_eos": True}  # fits --ctx-size 4096; cancelled long before


def start_long(client: HyserveClient, prompt: str = "Count slowly from one to a thousand:") -> GenerateStream:
    """A generation that runs until cancelled; returns once it has produced a token."""
    stream = client.generate(prompt, **LONG)  # type: ignore[arg-type]
    for event in stream:
        if isinstance(event, Delta) and event.token_ids:
            assert stream.task_id
            return stream
        assert isinstance(event, Accepted)
    raise AssertionError("the stream ended before its first token")


def visible_ids(client: HyserveClient) -> set[str]:
    return {s.task_id for s in client.cache_stats().slots if s.task_id}


def busy_slots(client: HyserveClient) -> int:
    return sum(1 for s in client.cache_stats().slots if s.state.name != "IDLE")


def assert_like_unknown(client: HyserveClient, task_id: str) -> None:
    """Cancel(task_id) answers exactly as Cancel of an id never used: PENDING (a cancel remembered for
    a task of the caller's own with that id, should one register)."""
    unknown = f"never-used-{uuid.uuid4().hex}"
    got, ref = client.cancel(task_id), client.cancel(unknown)
    assert got is ref is CancelStatus.PENDING, (got, ref)


def finish_reason(stream: GenerateStream) -> FinishReason:
    for _ in stream:
        pass
    assert stream.finished is not None
    return stream.finished.reason


def still_generating(stream: GenerateStream, n: int = 3) -> None:
    got = 0
    for event in stream:
        if isinstance(event, Delta):
            got += len(event.token_ids)
        if got >= n:
            return
    raise AssertionError(f"the stream ended ({stream.finished}) instead of going on")


def wait_idle(client: HyserveClient, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while busy_slots(client):
        assert time.monotonic() < deadline, "the slots did not become idle"
        time.sleep(0.05)


def check_cross_owner_rows(alice: HyserveClient, bob: HyserveClient, admin: HyserveClient | None) -> None:
    """admin None: no admin can be set up (the rows an admin takes part in are left out)."""
    a, b = start_long(alice), start_long(bob, "Name every country of the world, one per line:")
    a_id, b_id = str(a.task_id), str(b.task_id)
    try:
        # CacheStats: every caller sees both slots busy, ids only of its own tasks; the admin all
        assert busy_slots(alice) == busy_slots(bob) == 2
        assert visible_ids(alice) == {a_id}
        assert visible_ids(bob) == {b_id}
        if admin is not None:
            assert visible_ids(admin) == {a_id, b_id}

        # Cancel of another owner's running task: PENDING like an unknown id, and nothing happens
        assert_like_unknown(bob, a_id)
        assert_like_unknown(alice, b_id)
        still_generating(a)
        still_generating(b)

        # the owner cancels its own task
        assert alice.cancel(a_id) is CancelStatus.CANCELLED
        assert finish_reason(a) is FinishReason.CANCELLED
        # a finished task: ALREADY_FINISHED for its owner and the admin, PENDING for anyone else
        assert alice.cancel(a_id) is CancelStatus.ALREADY_FINISHED
        if admin is not None:
            assert admin.cancel(a_id) is CancelStatus.ALREADY_FINISHED
        assert_like_unknown(bob, a_id)

        # the admin may cancel anybody's running task
        assert (admin or bob).cancel(b_id) is CancelStatus.CANCELLED
        assert finish_reason(b) is FinishReason.CANCELLED
        assert bob.cancel(b_id) is CancelStatus.ALREADY_FINISHED
        assert_like_unknown(alice, b_id)
    finally:
        a.cancel()
        b.cancel()
    wait_idle(admin or alice)
