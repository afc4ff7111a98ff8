"""The public API's proto contract without the model (package, service, fields, enums, comments on
every element, buf lint), and the Python client's typed views of every message."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from hyserve_client import types as client_types
from hyserve_client._gen import hyserve_pb2 as pb

REPO = Path(__file__).resolve().parents[1]
PROTO = REPO / "proto" / "hyserve" / "v1" / "hyserve.proto"


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
    assert set(sampling) == expected | {"constraint"}
    scalars = [f for name, f in sampling.items() if name != "constraint"]
    assert all(f.has_presence for f in scalars), "every sampling scalar must be `optional`"
    kinds = _message("Constraint").oneofs_by_name["kind"]
    assert {f.name for f in kinds.fields} == {"json_schema", "json_object", "regex", "grammar"}
    assert {"tools", "tool_choice", "parallel_tool_calls", "parse_output"} <= set(chat)
    assert {"tool_calls", "tool_call_id"} <= set(_fields("ChatMessage"))
    assert set(_fields("ToolCall")) == {"id", "name", "arguments_json"}
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
    assert {"token_ids", "text", "logprobs", "reasoning", "tool_calls"} <= set(_fields("Delta"))
    assert set(_fields("ToolCallDelta")) == {"index", "id", "name", "arguments_fragment"}
    assert {"token_id", "logprob", "top_logprobs"} <= set(_fields("TokenLogprob"))
    assert {"reason", "stop_string", "usage", "timings", "tool_calls"} <= set(_fields("Finished"))
    assert set(_fields("Usage")) == {
        "prompt_tokens",
        "cached_prompt_tokens",
        "processed_prompt_tokens",
        "completion_tokens",
        "draft_tokens",
        "accepted_draft_tokens",
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
        "FINISH_REASON_TOOL_CALLS",
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


def test_typed_views_cover_every_proto_field() -> None:
    """Each result dataclass has exactly the fields of its message: adding a proto field needs a view."""
    pairs = {
        client_types.Accepted: "Accepted",
        client_types.Delta: "Delta",
        client_types.ToolCallDelta: "ToolCallDelta",
        client_types.ToolCall: "ToolCall",
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
