"""The public API without the model: proto contract, generated code, client library and CLI.

The client tests talk to a stub servicer on 127.0.0.1 (canned responses), so they need no model.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import fields
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from hyserve.api import codegen
from hyserve.api.gen import hyserve_pb2 as server_pb
from hyserve_client import (
    Accepted,
    AsyncHyserveClient,
    CacheStats,
    CancelStatus,
    Delta,
    Finished,
    FinishReason,
    GenerateStream,
    HyserveClient,
    HyserveError,
    MemoryKind,
    Message,
    ModelInfo,
    ReuseSource,
    build_generate_request,
    channel_options,
)
from hyserve_client import cli as client_cli
from hyserve_client import types as client_types
from hyserve_client._gen import hyserve_pb2 as pb
from hyserve_client._gen import hyserve_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]
PROTO = REPO / "proto" / "hyserve" / "v1" / "hyserve.proto"


# --- generated code ------------------------------------------------------------------------------


def test_codegen_check_passes(capsys: pytest.CaptureFixture[str]) -> None:
    rc = codegen.main(["--check"])
    out, err = capsys.readouterr()
    assert rc == 0, f"generated code is stale; run `PYTHONPATH=service python -m hyserve.api.codegen`\n{err}"
    assert "up to date" in out


def test_codegen_check_reports_a_stale_copy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "gen"
    assert codegen.main(["--out", str(out_dir)]) == 0
    assert codegen.main(["--check", "--out", str(out_dir)]) == 0
    pb2 = out_dir / "hyserve_pb2_grpc.py"
    pb2.write_text(pb2.read_text() + "# edited by hand\n")
    (out_dir / "old_pb2.py").write_text("")
    capsys.readouterr()
    assert codegen.main(["--check", "--out", str(out_dir)]) == 1
    err = capsys.readouterr().err
    assert "hyserve_pb2_grpc.py: differs" in err and "+# edited by hand" not in err  # regenerated lacks it
    assert "-# edited by hand" in err
    assert "old_pb2.py: stale file" in err
    assert "python -m hyserve.api.codegen" in err
    assert codegen.main(["--out", str(out_dir)]) == 0  # rewriting repairs it and drops the stale file
    assert not (out_dir / "old_pb2.py").exists()
    assert codegen.main(["--check", "--out", str(out_dir)]) == 0


def test_generated_imports_are_relative_and_copies_identical() -> None:
    for out_dir in codegen.DEFAULT_OUTPUTS:
        grpc_code = (out_dir / "hyserve_pb2_grpc.py").read_text()
        assert "from . import hyserve_pb2 as" in grpc_code
        assert "from hyserve.v1" not in grpc_code
    server_copy, client_copy = (
        {p.name: p.read_text() for p in d.iterdir() if p.is_file()} for d in codegen.DEFAULT_OUTPUTS
    )
    assert server_copy == client_copy
    # Both copies load in one process: the descriptor pool accepts the identical file twice.
    assert server_pb.DESCRIPTOR.serialized_pb == pb.DESCRIPTOR.serialized_pb
    msg = server_pb.GenerateRequest(task_id="t")
    assert pb.GenerateRequest.FromString(msg.SerializeToString()).task_id == "t"


def test_codegen_runs_as_a_module() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "service"), str(REPO / "clients" / "python")])}
    proc = subprocess.run(
        [sys.executable, "-m", "hyserve.api.codegen", "--check"], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr


# --- the proto contract --------------------------------------------------------------------------


def _message(name: str) -> Any:
    return pb.DESCRIPTOR.message_types_by_name[name]


def _fields(name: str) -> dict[str, FieldDescriptor]:
    return dict(_message(name).fields_by_name)


def test_package_and_service() -> None:
    assert pb.DESCRIPTOR.package == "hyserve.v1"
    assert pb.DESCRIPTOR.name == "hyserve/v1/hyserve.proto"
    service = pb.DESCRIPTOR.services_by_name["HyserveService"]
    methods = {m.name: m for m in service.methods}
    assert set(methods) == {"Generate", "Cancel", "CacheStats", "ModelInfo"}
    assert methods["Generate"].server_streaming and not methods["Generate"].client_streaming
    for name in ("Cancel", "CacheStats", "ModelInfo"):
        assert not methods[name].server_streaming and not methods[name].client_streaming
    for name, method in methods.items():
        assert method.input_type.name == f"{name}Request"
        assert method.output_type.name == f"{name}Response"


def test_generate_request_fields() -> None:
    req = _fields("GenerateRequest")
    assert req["task_id"].type == FieldDescriptor.TYPE_STRING
    oneof = _message("GenerateRequest").oneofs_by_name["input"]
    assert {f.name for f in oneof.fields} == {"text", "tokens", "chat"}
    assert _fields("TokenInput")["token_ids"].is_repeated
    assert {"role", "content"} <= set(_fields("ChatMessage"))
    chat = _fields("ChatInput")
    assert chat["add_generation_prompt"].has_presence
    assert chat["chat_template_kwargs"].message_type.full_name == "google.protobuf.Struct"
    assert _fields("TextInput")["add_special"].has_presence
    sampling = _fields("SamplingParams")
    expected = {
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "seed",
    }
    assert set(sampling) == expected
    assert all(f.has_presence for f in sampling.values()), "every sampling field must be `optional`"
    stopping = _fields("StoppingCriteria")
    assert {"max_tokens", "stop_strings", "stop_token_ids", "ignore_eos"} <= set(stopping)
    assert stopping["max_tokens"].has_presence
    assert {"logprobs", "top_logprobs", "cache"} <= set(req)
    cache = _fields("CacheOptions")
    assert cache["cache_prompt"].has_presence
    assert cache["checkpoint_offsets"].is_repeated and cache["checkpoint_offsets"].type == FieldDescriptor.TYPE_UINT32


def test_generate_response_events() -> None:
    oneof = _message("GenerateResponse").oneofs_by_name["event"]
    assert [f.name for f in oneof.fields] == ["accepted", "delta", "finished"]
    assert {"task_id", "slot_index", "prompt_tokens", "reused_tokens", "reuse_source", "matched_tokens"} <= set(
        _fields("Accepted")
    )
    assert {"token_ids", "text", "logprobs"} <= set(_fields("Delta"))
    assert {"token_id", "logprob", "top_logprobs"} <= set(_fields("TokenLogprob"))
    assert {"reason", "stop_string", "usage", "timings"} <= set(_fields("Finished"))
    assert set(_fields("Usage")) == {
        "prompt_tokens",
        "cached_prompt_tokens",
        "processed_prompt_tokens",
        "completion_tokens",
    }
    assert set(_fields("Timings")) == {"queue_ms", "prompt_ms", "generation_ms", "time_to_first_token_ms"}


def _enum_values(name: str) -> list[str]:
    return [v.name for v in pb.DESCRIPTOR.enum_types_by_name[name].values]


def test_enums() -> None:
    assert _enum_values("FinishReason") == [
        "FINISH_REASON_UNSPECIFIED",
        "FINISH_REASON_EOS",
        "FINISH_REASON_STOP_STRING",
        "FINISH_REASON_STOP_TOKEN",
        "FINISH_REASON_MAX_TOKENS",
        "FINISH_REASON_CONTEXT_FULL",
        "FINISH_REASON_CANCELLED",
    ]
    assert _enum_values("ReuseSource")[1:] == [
        "REUSE_SOURCE_NONE",
        "REUSE_SOURCE_SLOT_LIVE",
        "REUSE_SOURCE_CHECKPOINT",
        "REUSE_SOURCE_PREFIX_STORE",
    ]
    assert _enum_values("CancelStatus") == [
        "CANCEL_STATUS_UNSPECIFIED",
        "CANCEL_STATUS_CANCELLED",
        "CANCEL_STATUS_ALREADY_FINISHED",
        "CANCEL_STATUS_PENDING",
    ]
    assert _enum_values("MemoryKind")[1:] == [
        "MEMORY_KIND_ATTENTION_ONLY",
        "MEMORY_KIND_SLIDING_WINDOW",
        "MEMORY_KIND_RECURRENT",
        "MEMORY_KIND_HYBRID",
    ]
    for enum in pb.DESCRIPTOR.enum_types_by_name.values():
        prefix = "".join(f"_{c}" if c.isupper() else c.upper() for c in enum.name).lstrip("_") + "_"
        assert enum.values[0].name == f"{prefix}UNSPECIFIED" and enum.values[0].number == 0
        assert all(v.name.startswith(prefix) for v in enum.values)


def test_cache_stats_and_model_info_fields() -> None:
    assert set(_fields("CacheStatsResponse")) == {"slots", "prefix_store", "counters", "memory"}
    assert set(_fields("MemoryUsage")) == {"device_bytes", "host_bytes"}
    assert {"index", "state", "task_id", "cached_tokens", "checkpoints"} <= set(_fields("SlotStats"))
    assert {"position", "kind", "bytes"} <= set(_fields("CheckpointInfo"))
    assert {"entries", "bytes"} <= set(_fields("PrefixStoreStats"))
    counters = _fields("CacheCounters")
    assert {
        "prompt_tokens_received",
        "prompt_tokens_reused",
        "prompt_tokens_processed",
        "restores",
        "full_reprocess_by_reason",
        "checkpoints_created",
        "checkpoints_evicted",
        "checkpoints_invalidated",
        "prefix_store_hits",
        "prefix_store_misses",
    } <= set(counters)
    assert counters["full_reprocess_by_reason"].message_type.GetOptions().map_entry
    assert {
        "model_path",
        "model_name",
        "architecture",
        "vocab_size",
        "context_size",
        "n_ctx_train",
        "parallel_slots",
        "bos_token_id",
        "eos_token_ids",
        "has_chat_template",
        "memory_kind",
        "server_version",
    } <= set(_fields("ModelInfoResponse"))
    assert set(_fields("CancelRequest")) == {"task_id"}
    assert set(_fields("CancelResponse")) == {"status"}


def _source_info() -> descriptor_pb2.FileDescriptorProto:
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        well_known = Path(protoc.__file__).parent / "_proto"
        args = ["protoc", f"-I{REPO / 'proto'}", f"-I{well_known}", "--include_source_info"]
        assert protoc.main([*args, f"--descriptor_set_out={out}", "hyserve/v1/hyserve.proto"]) == 0
        fds = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return fds.file[0]


def test_every_element_is_documented() -> None:
    """Same rule as buf's COMMENTS category, so it holds even where buf is not installed."""
    fd = _source_info()
    comments = {tuple(loc.path): loc.leading_comments.strip() for loc in fd.source_code_info.location}
    missing: list[str] = []

    def need(path: tuple[int, ...], what: str) -> None:
        if not comments.get(path):
            missing.append(what)

    def walk_message(msg: descriptor_pb2.DescriptorProto, path: tuple[int, ...], name: str) -> None:
        need(path, name)
        for i, f in enumerate(msg.field):
            need((*path, 2, i), f"{name}.{f.name}")
        for i, o in enumerate(msg.oneof_decl):
            if not o.name.startswith("_"):  # synthetic oneofs of `optional` fields
                need((*path, 8, i), f"{name}.{o.name} (oneof)")
        for i, nested in enumerate(msg.nested_type):
            if not nested.options.map_entry:
                walk_message(nested, (*path, 3, i), f"{name}.{nested.name}")

    for i, msg in enumerate(fd.message_type):
        walk_message(msg, (4, i), msg.name)
    for i, enum in enumerate(fd.enum_type):
        need((5, i), enum.name)
        for j, value in enumerate(enum.value):
            need((5, i, 2, j), value.name)
    for i, service in enumerate(fd.service):
        need((6, i), service.name)
        for j, method in enumerate(service.method):
            need((6, i, 2, j), f"{service.name}.{method.name}")
    assert not missing, f"undocumented proto elements: {missing}"


def _find_buf() -> str | None:
    found = shutil.which("buf")
    if found:
        return found
    gopath_bin = Path(os.environ.get("GOBIN") or Path(os.environ.get("GOPATH") or Path.home() / "go") / "bin")
    candidate = gopath_bin / "buf"
    return str(candidate) if candidate.is_file() else None


def test_buf_lint() -> None:
    buf = _find_buf()
    if buf is None:
        pytest.skip("buf not installed (go install github.com/bufbuild/buf/cmd/buf@v1.50.0)")
    proc = subprocess.run([buf, "lint", "proto"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, f"buf lint failed:\n{proc.stdout}{proc.stderr}"


# --- client: request building --------------------------------------------------------------------


def test_request_text_with_options() -> None:
    req = build_generate_request(
        "Hello",
        task_id="job-1",
        add_special=False,
        temperature=0.0,
        top_k=40,
        seed=7,
        max_tokens=16,
        stop="\n\n",
        stop_token_ids=[1, 106],
        ignore_eos=True,
        top_logprobs=3,
        cache_prompt=False,
        checkpoint_offsets=[12, 40],
    )
    assert req.task_id == "job-1"
    assert req.WhichOneof("input") == "text"
    assert req.text.text == "Hello"
    assert req.text.HasField("add_special") and not req.text.add_special
    assert not req.text.HasField("parse_special")
    assert req.sampling.HasField("temperature") and req.sampling.temperature == 0.0  # explicit zero kept
    assert req.sampling.top_k == 40 and req.sampling.seed == 7
    assert not req.sampling.HasField("top_p") and not req.sampling.HasField("min_p")
    assert req.stopping.max_tokens == 16
    assert list(req.stopping.stop_strings) == ["\n\n"]
    assert list(req.stopping.stop_token_ids) == [1, 106]
    assert req.stopping.ignore_eos
    assert req.top_logprobs == 3 and not req.logprobs
    assert req.cache.HasField("cache_prompt") and not req.cache.cache_prompt
    assert list(req.cache.checkpoint_offsets) == [12, 40]


def test_request_defaults_leave_everything_unset() -> None:
    req = build_generate_request("Hi")
    assert req.task_id == ""
    assert not req.HasField("sampling") and not req.HasField("stopping") and not req.HasField("cache")
    assert not req.text.HasField("add_special")


def test_request_tokens_and_chat() -> None:
    req = build_generate_request(token_ids=[2, 651, 1234], stop=["a", "b"])
    assert req.WhichOneof("input") == "tokens"
    assert list(req.tokens.token_ids) == [2, 651, 1234]
    assert list(req.stopping.stop_strings) == ["a", "b"]
    assert build_generate_request(token_ids=[]).WhichOneof("input") == "tokens"  # the server rejects it

    req = build_generate_request(
        messages=[
            Message("system", "Be brief."),
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello", "reasoning_content": "greet back"},
        ],
        add_generation_prompt=True,
        chat_template_kwargs={"enable_thinking": False, "tools": [{"name": "f"}]},
    )
    assert req.WhichOneof("input") == "chat"
    assert [(m.role, m.content) for m in req.chat.messages] == [
        ("system", "Be brief."),
        ("user", "Hi"),
        ("assistant", "Hello"),
    ]
    assert req.chat.messages[2].reasoning_content == "greet back"
    assert not req.chat.messages[0].HasField("name")
    assert req.chat.add_generation_prompt
    kwargs = req.chat.chat_template_kwargs
    assert kwargs.fields["enable_thinking"].WhichOneof("kind") == "bool_value"  # a bool, not the string "false"
    assert kwargs.fields["tools"].list_value.values[0].struct_value.fields["name"].string_value == "f"


@pytest.mark.parametrize(
    ("args", "kwargs", "error"),
    [
        ((), {}, ValueError),
        (("a",), {"token_ids": [1]}, ValueError),
        ((), {"token_ids": [1], "add_special": True}, ValueError),
        (("a",), {"add_generation_prompt": True}, ValueError),
        (("a",), {"temprature": 0.5}, TypeError),
        ((), {"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, ValueError),
    ],
)
def test_request_rejects_client_mistakes(args: tuple[Any, ...], kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        build_generate_request(*args, **kwargs)


def test_request_wire_compatible_with_server_copy() -> None:
    req = build_generate_request("x", temperature=0.5)
    parsed = server_pb.GenerateRequest.FromString(req.SerializeToString())
    assert parsed.sampling.HasField("temperature") and parsed.sampling.temperature == 0.5
    assert not parsed.sampling.HasField("top_p")


# --- client: typed views -------------------------------------------------------------------------


def test_typed_views_cover_every_proto_field() -> None:
    """Each result dataclass has exactly the fields of its message: adding a proto field needs a view."""
    pairs = {
        client_types.Accepted: "Accepted",
        client_types.Delta: "Delta",
        client_types.TokenLogprob: "TokenLogprob",
        client_types.TopLogprob: "TopLogprob",
        client_types.Finished: "Finished",
        client_types.Usage: "Usage",
        client_types.Timings: "Timings",
        client_types.CacheStats: "CacheStatsResponse",
        client_types.SlotStats: "SlotStats",
        client_types.CheckpointInfo: "CheckpointInfo",
        client_types.PrefixStoreStats: "PrefixStoreStats",
        client_types.CacheCounters: "CacheCounters",
        client_types.ModelInfo: "ModelInfoResponse",
    }
    for cls, message in pairs.items():
        assert {f.name for f in fields(cls)} == set(_fields(message)), cls.__name__
    python_enums = {
        client_types.ReuseSource: "ReuseSource",
        client_types.FinishReason: "FinishReason",
        client_types.CancelStatus: "CancelStatus",
        client_types.SlotState: "SlotState",
        client_types.CheckpointKind: "CheckpointKind",
        client_types.MemoryKind: "MemoryKind",
    }
    for cls, enum_name in python_enums.items():
        values = pb.DESCRIPTOR.enum_types_by_name[enum_name].values
        prefix = values[0].name.removesuffix("UNSPECIFIED")
        assert [client_types.enum_from_proto(cls, v.number).name for v in values] == [
            v.name.removeprefix(prefix) for v in values
        ], cls.__name__


def test_events_from_proto() -> None:
    accepted = client_types.event_from_proto(
        pb.GenerateResponse(
            accepted=pb.Accepted(
                task_id="t", slot_index=1, prompt_tokens=10, reused_tokens=8, reuse_source=3, matched_tokens=9
            )
        )
    )
    assert accepted == Accepted("t", 1, 10, 8, ReuseSource.CHECKPOINT, 9)
    delta = client_types.event_from_proto(
        pb.GenerateResponse(
            delta=pb.Delta(
                token_ids=[5],
                text="é",
                logprobs=[
                    pb.TokenLogprob(
                        token_id=5, logprob=-0.5, piece=b"\xc3", top_logprobs=[pb.TopLogprob(token_id=6, logprob=-1.0)]
                    )
                ],
            )
        )
    )
    assert isinstance(delta, Delta) and delta.token_ids == (5,) and delta.text == "é"
    assert delta.logprobs[0].piece == b"\xc3" and delta.logprobs[0].top_logprobs[0].token_id == 6
    finished = client_types.event_from_proto(
        pb.GenerateResponse(finished=pb.Finished(reason=pb.FINISH_REASON_STOP_STRING, stop_string="END"))
    )
    assert isinstance(finished, Finished)
    assert finished.reason is FinishReason.STOP_STRING and finished.stop_string == "END"
    assert finished.stop_token_id is None
    assert client_types.event_from_proto(pb.GenerateResponse()) is None
    # A value added to the enum by a newer server reads as UNSPECIFIED instead of failing.
    assert client_types.enum_from_proto(client_types.FinishReason, 99) is FinishReason.UNSPECIFIED


def test_channel_options() -> None:
    opts = dict(channel_options())
    assert opts["grpc.max_receive_message_length"] == 64 * 1024 * 1024
    assert opts["grpc.keepalive_time_ms"] == 60_000
    assert opts["grpc.http2.max_pings_without_data"] == 0
    assert dict(channel_options(extra=[("grpc.keepalive_time_ms", 300_000)]))["grpc.keepalive_time_ms"] == 300_000


# --- client against a stub servicer --------------------------------------------------------------


class StubServicer(pb_grpc.HyserveServiceServicer):
    """Canned answers; records the requests it got."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.cancelled: list[str] = []

    def Generate(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.requests.append(request)
        if request.WhichOneof("input") is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no input")
        task_id = request.task_id or "server-uuid"
        if task_id == "slow":  # wait for the client to cancel the call
            try:
                yield pb.GenerateResponse(accepted=pb.Accepted(task_id=task_id, reuse_source=pb.REUSE_SOURCE_NONE))
                while context.is_active():
                    time.sleep(0.01)
            finally:
                # a cancel that lands while the generator waits at its yield closes it there instead
                self.cancelled.append(task_id)
            return
        yield pb.GenerateResponse(
            accepted=pb.Accepted(task_id=task_id, prompt_tokens=3, reuse_source=pb.REUSE_SOURCE_NONE)
        )
        for token, text in ((10, "Hel"), (11, "lo")):
            yield pb.GenerateResponse(delta=pb.Delta(token_ids=[token], text=text))
        yield pb.GenerateResponse(
            finished=pb.Finished(
                reason=pb.FINISH_REASON_MAX_TOKENS,
                usage=pb.Usage(prompt_tokens=3, processed_prompt_tokens=3, completion_tokens=2),
                timings=pb.Timings(time_to_first_token_ms=12.5, generation_ms=4.0),
            )
        )

    def Cancel(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.task_id == "done":
            return pb.CancelResponse(status=pb.CANCEL_STATUS_ALREADY_FINISHED)
        if request.task_id == "live":
            return pb.CancelResponse(status=pb.CANCEL_STATUS_CANCELLED)
        if request.task_id == "later":
            return pb.CancelResponse(status=pb.CANCEL_STATUS_PENDING)
        context.abort(grpc.StatusCode.NOT_FOUND, f"unknown task {request.task_id!r}")

    def CacheStats(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.CacheStatsResponse(
            slots=[
                pb.SlotStats(
                    index=0,
                    state=pb.SLOT_STATE_IDLE,
                    cached_tokens=42,
                    checkpoints=[pb.CheckpointInfo(position=40, kind=pb.CHECKPOINT_KIND_PROMPT_END, bytes=1024)],
                )
            ],
            prefix_store=pb.PrefixStoreStats(entries=1, bytes=2048),
            counters=pb.CacheCounters(prompt_tokens_received=100, full_reprocess_by_reason={"cold_slot": 2}),
        )

    def ModelInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.ModelInfoResponse(
            model_name="stub",
            vocab_size=262144,
            context_size=4096,
            parallel_slots=2,
            bos_token_id=2,
            eos_token_ids=[1, 106],
            memory_kind=pb.MEMORY_KIND_SLIDING_WINDOW,
        )


@pytest.fixture(scope="module")
def stub_server() -> Iterator[tuple[str, StubServicer]]:
    servicer = StubServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_HyserveServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


def test_sync_client(stub_server: tuple[str, StubServicer]) -> None:
    target, servicer = stub_server
    with HyserveClient(target, timeout=10) as client:
        client.wait_ready(timeout=10)
        with client.generate("Hi", max_tokens=2, task_id="abc") as stream:
            events = list(stream)
        assert isinstance(events[0], Accepted) and stream.task_id == "abc"
        assert [e.text for e in events if isinstance(e, Delta)] == ["Hel", "lo"]
        assert isinstance(events[-1], Finished) and stream.finished is events[-1]
        assert servicer.requests[-1].stopping.max_tokens == 2

        text, finished = client.generate_text(token_ids=[1, 2, 3])
        assert text == "Hello" and finished.reason is FinishReason.MAX_TOKENS
        assert finished.usage.completion_tokens == 2 and finished.timings.time_to_first_token_ms == 12.5

        assert client.cancel("done") is CancelStatus.ALREADY_FINISHED
        assert client.cancel("live") is CancelStatus.CANCELLED
        assert client.cancel("later") is CancelStatus.PENDING
        with pytest.raises(HyserveError) as info:
            client.cancel("nope")
        assert info.value.code is grpc.StatusCode.NOT_FOUND and "nope" in info.value.details
        assert not info.value.retryable

        stats = client.cache_stats()
        assert isinstance(stats, CacheStats)
        assert stats.slots[0].checkpoints[0].position == 40
        assert stats.counters.full_reprocess_by_reason == {"cold_slot": 2}
        info_ = client.model_info()
        assert isinstance(info_, ModelInfo)
        assert info_.bos_token_id == 2 and info_.eos_token_ids == (1, 106)
        assert info_.memory_kind is MemoryKind.SLIDING_WINDOW


def test_sync_stream_error_is_hyserve_error(stub_server: tuple[str, StubServicer]) -> None:
    target, _ = stub_server
    with HyserveClient(target, timeout=10) as client:
        stream = GenerateStream(client._stub.Generate(pb.GenerateRequest(), timeout=10))  # no input: aborted
        with pytest.raises(HyserveError) as info:
            list(stream)
        assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_cancelling_a_stream_ends_it_quietly(stub_server: tuple[str, StubServicer]) -> None:
    target, servicer = stub_server
    with HyserveClient(target, timeout=10) as client:
        stream = client.generate("x", task_id="slow")
        assert isinstance(next(stream), Accepted)
        stream.cancel()
        assert list(stream) == [] and stream.finished is None
    deadline = time.monotonic() + 30  # the sync stub server notices the cancel by polling
    while "slow" not in servicer.cancelled and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "slow" in servicer.cancelled  # the server saw the call end

    async def run() -> None:
        async with AsyncHyserveClient(target, timeout=10) as client:
            stream = client.generate("x", task_id="slow")
            assert isinstance(await anext(stream), Accepted)
            stream.cancel()
            assert [event async for event in stream] == []

    asyncio.run(run())


def test_unreachable_server_is_unavailable() -> None:
    with HyserveClient("127.0.0.1:1", timeout=5) as client:
        with pytest.raises(HyserveError) as info:
            client.model_info()
        assert info.value.code is grpc.StatusCode.UNAVAILABLE and info.value.retryable


def test_async_client(stub_server: tuple[str, StubServicer]) -> None:
    target, _ = stub_server

    async def run() -> None:
        async with AsyncHyserveClient(target, timeout=10) as client:
            await client.wait_ready(timeout=10)
            stream = client.generate("Hi")
            events = [event async for event in stream]
            assert isinstance(events[0], Accepted) and events[0].task_id == "server-uuid"
            assert isinstance(events[-1], Finished)
            text, finished = await client.generate_text(messages=[Message("user", "Hi")])
            assert text == "Hello" and finished.reason is FinishReason.MAX_TOKENS
            assert await client.cancel("done") is CancelStatus.ALREADY_FINISHED
            assert await client.cancel("later") is CancelStatus.PENDING
            with pytest.raises(HyserveError) as info:
                await client.cancel("nope")
            assert info.value.code is grpc.StatusCode.NOT_FOUND
            assert (await client.cache_stats()).prefix_store.entries == 1
            assert (await client.model_info()).parallel_slots == 2

    asyncio.run(run())


# --- CLI -----------------------------------------------------------------------------------------


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = client_cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_cli_against_stub(stub_server: tuple[str, StubServicer]) -> None:
    target, servicer = stub_server
    rc, out, err = _cli(["generate", "Hi", "--target", target, "--max-tokens", "2", "--temperature", "0"])
    assert rc == 0 and out == "Hello\n"
    assert "finish: max_tokens" in err and "task server-uuid" in err
    sent = servicer.requests[-1]
    assert sent.sampling.HasField("temperature") and not sent.sampling.HasField("top_k")

    rc, out, _ = _cli(["generate", "--chat", "Hi", "--template-kwarg", "enable_thinking=false", "--target", target])
    assert rc == 0
    kwargs = servicer.requests[-1].chat.chat_template_kwargs
    assert kwargs.fields["enable_thinking"].bool_value is False
    assert kwargs.fields["enable_thinking"].WhichOneof("kind") == "bool_value"

    rc, out, _ = _cli(["generate", "--tokens", "1,2", "--json", "--target", target])
    assert rc == 0 and out.splitlines()[0].startswith('{"accepted": {"task_id": "server-uuid"')

    rc, out, _ = _cli(["cancel", "done", "--target", target])
    assert rc == 0 and out.strip() == "already_finished"
    rc, out, err = _cli(["cancel", "later", "--target", target])
    assert rc == 0 and out.strip() == "pending" and "if it registers within 10 s" in err
    rc, _, err = _cli(["cancel", "nope", "--target", target])
    assert rc == 1 and "NOT_FOUND" in err
    rc, out, _ = _cli(["stats", "--target", target])
    assert rc == 0 and '"cached_tokens": 42' in out and '"kind": "prompt_end"' in out
    rc, out, _ = _cli(["model-info", "--target", target])
    assert rc == 0 and '"memory_kind": "sliding_window"' in out


def test_cli_embeds_in_another_parser() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="hyserve")
    sub = parser.add_subparsers(dest="command", required=True)
    client_cli.add_subcommands(sub, prefix="remote-")
    args = parser.parse_args(["remote-generate", "hi", "--max-tokens", "3", "--stop", "x", "--stop", "y"])
    assert args.max_tokens == 3 and args.stop == ["x", "y"] and callable(args.func)
    args = parser.parse_args(["remote-model-info", "--target", "h:1"])
    assert args.target == "h:1"
    rc, _, err = _cli(["generate", "hi", "--system", "s", "--target", "127.0.0.1:1"])
    assert rc == 2 and "--chat" in err
