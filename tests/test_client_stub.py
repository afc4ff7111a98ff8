"""The Python client library and CLI against a stub servicer on 127.0.0.1 (canned responses), so
they need no model."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import grpc
import pytest

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
)
from hyserve_client import cli as client_cli
from hyserve_client._gen import hyserve_pb2 as pb
from hyserve_client._gen import hyserve_pb2_grpc as pb_grpc


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
        if task_id == "tools":  # a thinking model calling a tool
            yield from self._tool_answer()
            return
        for token, text in ((10, "Hel"), (11, "lo")):
            yield pb.GenerateResponse(delta=pb.Delta(token_ids=[token], text=text))
        yield pb.GenerateResponse(
            finished=pb.Finished(
                reason=pb.FINISH_REASON_MAX_TOKENS,
                usage=pb.Usage(prompt_tokens=3, processed_prompt_tokens=3, completion_tokens=2),
                timings=pb.Timings(time_to_first_token_ms=12.5, generation_ms=4.0),
            )
        )

    @staticmethod
    def _tool_answer() -> Iterator[Any]:
        yield pb.GenerateResponse(delta=pb.Delta(token_ids=[20], reasoning="The user wants"))
        yield pb.GenerateResponse(delta=pb.Delta(token_ids=[21], reasoning=" the weather."))
        yield pb.GenerateResponse(delta=pb.Delta(token_ids=[22], text="Let me check."))
        call = pb.ToolCallDelta(index=0, id="call_1", name="get_weather", arguments_fragment='{"city": ')
        yield pb.GenerateResponse(delta=pb.Delta(token_ids=[23], tool_calls=[call]))
        call = pb.ToolCallDelta(index=0, arguments_fragment='"Paris"}')
        yield pb.GenerateResponse(delta=pb.Delta(token_ids=[24], tool_calls=[call]))
        yield pb.GenerateResponse(
            finished=pb.Finished(
                reason=pb.FINISH_REASON_TOOL_CALLS,
                tool_calls=[pb.ToolCall(id="call_1", name="get_weather", arguments_json='{"city": "Paris"}')],
                usage=pb.Usage(prompt_tokens=3, completion_tokens=5),
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


def test_cli_constraints_and_tools(stub_server: tuple[str, StubServicer], tmp_path: Path) -> None:
    target, servicer = stub_server
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    grammar = tmp_path / "yes_no.lark"
    grammar.write_text('start: "yes" | "no"\n')
    for flags, kind, value in (
        (["--json-schema", str(schema)], "json_schema", {"type": "object"}),
        (["--json-schema", '{"type": "array"}'], "json_schema", {"type": "array"}),
        (["--json-object"], "json_object", True),
        (["--regex", "[0-9]+"], "regex", "[0-9]+"),
        (["--grammar", str(grammar)], "grammar", 'start: "yes" | "no"\n'),
    ):
        rc, out, _ = _cli(["generate", "Hi", "--target", target, *flags])
        assert rc == 0 and out == "Hello\n"
        constraint = servicer.requests[-1].sampling.constraint
        assert constraint.WhichOneof("kind") == kind
        sent = getattr(constraint, kind)
        assert (json.loads(sent) if kind == "json_schema" else sent) == value
    with pytest.raises(SystemExit):  # one constraint at most
        _cli(["generate", "Hi", "--target", target, "--json-object", "--regex", "a"])

    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]))
    argv = ["generate", "--chat", "Weather in Paris?", "--task-id", "tools", "--target", target]
    rc, out, err = _cli([*argv, "--tools", str(tools), "--tool-choice", "get_weather", "--no-parallel-tool-calls"])
    assert rc == 0
    chat = servicer.requests[-1].chat
    assert [t.name for t in chat.tools] == ["get_weather"] and chat.tool_choice.function == "get_weather"
    assert chat.HasField("parallel_tool_calls") and not chat.parallel_tool_calls
    assert not chat.HasField("parse_output")
    # the answer's text, then its calls as JSON lines on stdout; the reasoning on stderr
    lines = out.splitlines()
    assert lines[0] == "Let me check."
    assert json.loads(lines[1]) == {"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}
    assert err.startswith("The user wants the weather.\n") and "finish: tool_calls" in err

    rc, out, err = _cli([*argv, "--tool-choice", "required", "--no-parse-output", "-q"])
    chat = servicer.requests[-1].chat
    assert rc == 0 and chat.tool_choice.mode == pb.TOOL_CHOICE_MODE_REQUIRED and not chat.parse_output
    assert err == ""  # quiet: neither reasoning nor summary
    rc, out, _ = _cli([*argv, "--json"])
    events = [json.loads(line) for line in out.splitlines()]
    assert events[1]["delta"]["reasoning"] == "The user wants"
    assert events[4]["delta"]["tool_calls"] == [
        {"index": 0, "id": "call_1", "name": "get_weather", "arguments_fragment": '{"city": '}
    ]
    assert events[-1]["finished"]["reason"] == "tool_calls"
    assert events[-1]["finished"]["tool_calls"][0]["arguments_json"] == '{"city": "Paris"}'

    rc, _, err = _cli(["generate", "Hi", "--tools", '[{"name": "f"}]', "--target", target])
    assert rc == 2 and "--chat" in err
    rc, _, err = _cli(["generate", "--chat", "Hi", "--tools", '{"name": "f"}', "--target", target])
    assert rc == 2 and "JSON list" in err
    rc, _, err = _cli(["generate", "--chat", "Hi", "--tools", '[{"type": "x"}]', "--target", target])
    assert rc == 2 and "tool" in err


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
