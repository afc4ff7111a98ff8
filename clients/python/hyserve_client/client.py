"""Synchronous and asyncio clients for the hyserve.v1 API.

    with HyserveClient("localhost:50051", timeout=60) as client:
        for event in client.generate("Once upon a time", max_tokens=32):
            if isinstance(event, Delta):
                print(event.text, end="", flush=True)

    async with AsyncHyserveClient("localhost:50051") as client:
        text, finished = await client.generate_text(messages=[Message("user", "Hi")])

Channel settings, chosen deliberately (override any of them with `options=`):
- Keepalive pings every 60 s (timeout 20 s), also while a call sends no data
  (`grpc.http2.max_pings_without_data=0`): a long prompt evaluation can keep a Generate stream silent
  for minutes, and the ping is what tells a dead server or a dropped NAT/proxy mapping apart from a
  slow one. Once a minute is the most gRPC's keepalive guide recommends, and the hyserve server
  accepts pings every 10 s; a server left at gRPC's default (at most one ping per 5 minutes without
  data) answers faster pings with GOAWAY "too_many_pings", so raise `grpc.keepalive_time_ms` to
  300000 for such servers. Idle channels are not pinged (`keepalive_permit_without_calls=0`): most
  servers reject that, and an idle channel simply reconnects on the next call.
- Send and receive limits of 64 MiB instead of gRPC's 4 MiB receive default: long token-id prompts and
  the cache statistics of many slots can exceed 4 MiB.

Every gRPC failure is raised as HyserveError (status code + details). A deadline (`timeout`) covers
the whole call, a Generate stream included; when it passes, or when a stream is cancelled, the server
cancels the task.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Final, Literal, Unpack

import grpc
import grpc.aio

from hyserve_client._gen import hyserve_pb2 as pb
from hyserve_client._gen import hyserve_pb2_grpc as pb_grpc
from hyserve_client._version import __version__
from hyserve_client.requests import GenerateParams, Message, build_generate_request
from hyserve_client.security import auth_metadata
from hyserve_client.types import (
    Accepted,
    CacheStats,
    CancelStatus,
    Delta,
    Event,
    Finished,
    ModelInfo,
    enum_from_proto,
    event_from_proto,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "SESSION_HEADER",
    "AsyncGenerateStream",
    "AsyncHyserveClient",
    "GenerateStream",
    "HyserveClient",
    "HyserveError",
    "channel_options",
]

DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
KEEPALIVE_TIME_MS: Final = 60_000
KEEPALIVE_TIMEOUT_MS: Final = 20_000
RETRYABLE_CODES: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})

ChatMessages = Sequence[Message | Mapping[str, Any]]


class _Unset(enum.Enum):
    UNSET = enum.auto()


UNSET: Final = _Unset.UNSET
Timeout = float | None | Literal[_Unset.UNSET]
"""Per-call deadline in seconds: None = no deadline; UNSET = the client's default."""


class HyserveError(Exception):
    """A gRPC call failed; `code` is the gRPC status code, `details` the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @property
    def retryable(self) -> bool:
        """True for transient failures (UNAVAILABLE, RESOURCE_EXHAUSTED) worth retrying later."""
        return self.code in RETRYABLE_CODES

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> HyserveError:
        """Wrap a failed call (a sync grpc.Call or a grpc.aio.AioRpcError)."""
        details = getattr(error, "details", None)
        text = details() if callable(details) else None
        return cls(_status_code(error), text or str(error))


def _status_code(error: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(error, "code", None)
    value = code() if callable(code) else None
    return value if isinstance(value, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def channel_options(
    *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, extra: Sequence[tuple[str, Any]] = ()
) -> list[tuple[str, Any]]:
    """The client's channel arguments (see the module docstring for why), `extra` taking precedence."""
    options: dict[str, Any] = {
        "grpc.max_send_message_length": max_message_bytes,
        "grpc.max_receive_message_length": max_message_bytes,
        "grpc.keepalive_time_ms": KEEPALIVE_TIME_MS,
        "grpc.keepalive_timeout_ms": KEEPALIVE_TIMEOUT_MS,
        "grpc.keepalive_permit_without_calls": 0,
        "grpc.http2.max_pings_without_data": 0,
        "grpc.primary_user_agent": f"hyserve-client-python/{__version__}",
    }
    options.update(dict(extra))
    return list(options.items())


class GenerateStream(Iterator[Event]):
    """The events of one Generate call: Accepted, then Delta..., then Finished.

    Iterating raises HyserveError on a gRPC failure. `cancel()` (or leaving a `with` block before
    the end) cancels the call, which makes the server cancel the task; iteration then just stops.
    """

    def __init__(self, call: Any) -> None:
        self._call = call
        self._cancelled = False
        self.accepted: Accepted | None = None
        self.finished: Finished | None = None

    @property
    def task_id(self) -> str | None:
        """The task id, once the Accepted event has been read."""
        return self.accepted.task_id if self.accepted else None

    def __iter__(self) -> GenerateStream:
        return self

    def __next__(self) -> Event:
        while True:
            try:
                message = next(self._call)
            except grpc.RpcError as exc:
                if self._cancelled and _status_code(exc) is grpc.StatusCode.CANCELLED:
                    raise StopIteration from None
                raise HyserveError.from_rpc_error(exc) from exc
            event = _record(self, message)
            if event is not None:
                return event

    def cancel(self) -> None:
        """Cancel the call (a no-op once it has ended)."""
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> GenerateStream:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.finished is None:
            self.cancel()


class AsyncGenerateStream(AsyncIterator[Event]):
    """The asyncio counterpart of GenerateStream (`async for event in stream`)."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._cancelled = False
        self.accepted: Accepted | None = None
        self.finished: Finished | None = None

    @property
    def task_id(self) -> str | None:
        """The task id, once the Accepted event has been read."""
        return self.accepted.task_id if self.accepted else None

    def __aiter__(self) -> AsyncGenerateStream:
        return self

    async def __anext__(self) -> Event:
        while True:
            try:
                message = await self._call.read()
            except asyncio.CancelledError:
                if self._cancelled:
                    raise StopAsyncIteration from None
                raise
            except grpc.RpcError as exc:
                if self._cancelled and _status_code(exc) is grpc.StatusCode.CANCELLED:
                    raise StopAsyncIteration from None
                raise HyserveError.from_rpc_error(exc) from exc
            if message is grpc.aio.EOF:
                raise StopAsyncIteration
            event = _record(self, message)
            if event is not None:
                return event

    def cancel(self) -> None:
        """Cancel the call (a no-op once it has ended)."""
        self._cancelled = True
        self._call.cancel()

    async def __aenter__(self) -> AsyncGenerateStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.finished is None:
            self.cancel()


def _record(stream: GenerateStream | AsyncGenerateStream, message: pb.GenerateResponse) -> Event | None:
    event = event_from_proto(message)
    if isinstance(event, Accepted):
        stream.accepted = event
    elif isinstance(event, Finished):
        stream.finished = event
    return event


def _new_stub(channel: grpc.Channel | grpc.aio.Channel) -> Any:
    """The generated stub (untyped code; the methods below give its calls their types)."""
    return pb_grpc.HyserveServiceStub(channel)  # type: ignore[no-untyped-call]


def _no_finished() -> HyserveError:
    return HyserveError(grpc.StatusCode.UNKNOWN, "the Generate stream ended without a Finished event")


SESSION_HEADER: Final = "x-session-id"


class _ClientBase:
    def __init__(
        self, target: str, timeout: float | None, wait_for_ready: bool, session_id: str | None, token: str | None
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.wait_for_ready = wait_for_ready
        self.session_id = session_id
        self._metadata: tuple[tuple[str, str], ...] = ((SESSION_HEADER, session_id),) if session_id else ()
        if token:
            self._metadata += (auth_metadata(token),)

    def _call_kwargs(self, timeout: Timeout) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "timeout": self.timeout if timeout is UNSET else timeout,
            "wait_for_ready": self.wait_for_ready,
        }
        if self._metadata:
            kwargs["metadata"] = self._metadata
        return kwargs


class HyserveClient(_ClientBase):
    """Blocking client over one gRPC channel; safe to share between threads.

    `timeout` is the default deadline in seconds of every call (None = none); `wait_for_ready`
    makes calls wait for the server to come up instead of failing with UNAVAILABLE; `credentials`
    selects TLS (default: plaintext); `options` override the channel arguments of channel_options();
    `session_id` is sent as `x-session-id` metadata on every call, for a balancer's affinity;
    `token` as `authorization: Bearer TOKEN` (servers run with --auth-token-file; see `security`).
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        wait_for_ready: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        options: Sequence[tuple[str, Any]] = (),
        session_id: str | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(target, timeout, wait_for_ready, session_id, token)
        opts = channel_options(max_message_bytes=max_message_bytes, extra=options)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=opts)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=opts)
        self._stub = _new_stub(self._channel)

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self) -> HyserveClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the channel is connected; HyserveError(UNAVAILABLE) after `timeout` seconds."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            raise HyserveError(grpc.StatusCode.UNAVAILABLE, f"{self.target} not ready after {timeout} s") from None

    def generate(
        self,
        text: str | None = None,
        *,
        token_ids: Sequence[int] | None = None,
        messages: ChatMessages | None = None,
        timeout: Timeout = UNSET,
        **params: Unpack[GenerateParams],
    ) -> GenerateStream:
        """Start a task and return its event stream. Exactly one of text, token_ids, messages."""
        request = build_generate_request(text, token_ids=token_ids, messages=messages, **params)
        return GenerateStream(self._stub.Generate(request, **self._call_kwargs(timeout)))

    def generate_text(
        self,
        text: str | None = None,
        *,
        token_ids: Sequence[int] | None = None,
        messages: ChatMessages | None = None,
        timeout: Timeout = UNSET,
        **params: Unpack[GenerateParams],
    ) -> tuple[str, Finished]:
        """Run a task to the end; return its completion text and its Finished event."""
        with self.generate(text, token_ids=token_ids, messages=messages, timeout=timeout, **params) as stream:
            parts = [event.text for event in stream if isinstance(event, Delta)]
        if stream.finished is None:
            raise _no_finished()
        return "".join(parts), stream.finished

    def cancel(self, task_id: str, *, timeout: Timeout = UNSET) -> CancelStatus:
        """Cancel a task by id. PENDING when no task has this id yet (the server applies the cancel if one
        registers within 10 s); HyserveError(NOT_FOUND) for an id no task can have (malformed, or
        unknown while the server drains)."""
        try:
            response = self._stub.Cancel(pb.CancelRequest(task_id=task_id), **self._call_kwargs(timeout))
        except grpc.RpcError as exc:
            raise HyserveError.from_rpc_error(exc) from exc
        return enum_from_proto(CancelStatus, response.status)

    def cache_stats(self, *, timeout: Timeout = UNSET) -> CacheStats:
        """Snapshot of the slots, the prefix store and the cache counters."""
        try:
            response = self._stub.CacheStats(pb.CacheStatsRequest(), **self._call_kwargs(timeout))
        except grpc.RpcError as exc:
            raise HyserveError.from_rpc_error(exc) from exc
        return CacheStats.from_proto(response)

    def model_info(self, *, timeout: Timeout = UNSET) -> ModelInfo:
        """Description of the loaded model and the server."""
        try:
            response = self._stub.ModelInfo(pb.ModelInfoRequest(), **self._call_kwargs(timeout))
        except grpc.RpcError as exc:
            raise HyserveError.from_rpc_error(exc) from exc
        return ModelInfo.from_proto(response)


class AsyncHyserveClient(_ClientBase):
    """asyncio client (grpc.aio); create and use it inside one running event loop.

    Arguments as for HyserveClient.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        wait_for_ready: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        options: Sequence[tuple[str, Any]] = (),
        session_id: str | None = None,
        token: str | None = None,
    ) -> None:
        super().__init__(target, timeout, wait_for_ready, session_id, token)
        opts = channel_options(max_message_bytes=max_message_bytes, extra=options)
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target, options=opts)
        else:
            self._channel = grpc.aio.secure_channel(target, credentials, options=opts)
        self._stub = _new_stub(self._channel)

    async def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> AsyncHyserveClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the channel is connected; HyserveError(UNAVAILABLE) after `timeout` seconds."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            raise HyserveError(grpc.StatusCode.UNAVAILABLE, f"{self.target} not ready after {timeout} s") from None

    def generate(
        self,
        text: str | None = None,
        *,
        token_ids: Sequence[int] | None = None,
        messages: ChatMessages | None = None,
        timeout: Timeout = UNSET,
        **params: Unpack[GenerateParams],
    ) -> AsyncGenerateStream:
        """Start a task and return its event stream (iterate with `async for`)."""
        request = build_generate_request(text, token_ids=token_ids, messages=messages, **params)
        return AsyncGenerateStream(self._stub.Generate(request, **self._call_kwargs(timeout)))

    async def generate_text(
        self,
        text: str | None = None,
        *,
        token_ids: Sequence[int] | None = None,
        messages: ChatMessages | None = None,
        timeout: Timeout = UNSET,
        **params: Unpack[GenerateParams],
    ) -> tuple[str, Finished]:
        """Run a task to the end; return its completion text and its Finished event."""
        parts: list[str] = []
        async with self.generate(text, token_ids=token_ids, messages=messages, timeout=timeout, **params) as stream:
            async for event in stream:
                if isinstance(event, Delta):
                    parts.append(event.text)
        if stream.finished is None:
            raise _no_finished()
        return "".join(parts), stream.finished

    async def cancel(self, task_id: str, *, timeout: Timeout = UNSET) -> CancelStatus:
        """Cancel a task by id. PENDING when no task has this id yet (the server applies the cancel if one
        registers within 10 s); HyserveError(NOT_FOUND) for an id no task can have (malformed, or
        unknown while the server drains)."""
        try:
            response = await self._stub.Cancel(pb.CancelRequest(task_id=task_id), **self._call_kwargs(timeout))
        except grpc.RpcError as exc:
            raise HyserveError.from_rpc_error(exc) from exc
        return enum_from_proto(CancelStatus, response.status)

    async def cache_stats(self, *, timeout: Timeout = UNSET) -> CacheStats:
        """Snapshot of the slots, the prefix store and the cache counters."""
        try:
            response = await self._stub.CacheStats(pb.CacheStatsRequest(), **self._call_kwargs(timeout))
        except grpc.RpcError as exc:
            raise HyserveError.from_rpc_error(exc) from exc
        return CacheStats.from_proto(response)

    async def model_info(self, *, timeout: Timeout = UNSET) -> ModelInfo:
        """Description of the loaded model and the server."""
        try:
            response = await self._stub.ModelInfo(pb.ModelInfoRequest(), **self._call_kwargs(timeout))
        except grpc.RpcError as exc:
            raise HyserveError.from_rpc_error(exc) from exc
        return ModelInfo.from_proto(response)
