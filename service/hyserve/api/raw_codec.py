"""Registers HyserveService on a grpc.aio server with request parsing and stream writing that no
client can turn into a server error or a stuck slot.

- Requests arrive as raw bytes (no deserializer, which could only fail as UNKNOWN) and are parsed
  here: garbage, invalid UTF-8 in a string field or nesting beyond the decoder's limit is answered
  INVALID_ARGUMENT.
- Generate's responses are written one at a time with a deadline: when the client has read nothing
  for `stall_seconds` (every transport buffer full), the stream's task is cancelled (its slot goes
  to the next task) and the call ends RESOURCE_EXHAUSTED. The same status ends a stream whose task
  was cancelled because too many events waited (`tasks.StreamStalledError`).

The servicer's methods keep their generated signatures (a parsed message and the context).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio
import structlog
from google.protobuf.message import DecodeError, Message

from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.api.gen import hyserve_pb2_grpc as pb_grpc
from hyserve.api.tasks import StreamStalledError

__all__ = ["add_hyserve_service", "parse_request"]

log = structlog.get_logger(__name__)

M = TypeVar("M", bound=Message)
SERVICE = "hyserve.v1.HyserveService"


async def parse_request(raw: bytes, message_type: type[M], context: grpc.aio.ServicerContext) -> M:
    """The parsed request, or the call ends INVALID_ARGUMENT."""
    try:
        return message_type.FromString(raw)
    except (DecodeError, RecursionError, ValueError) as exc:
        name = message_type.DESCRIPTOR.name
        log.info("request_malformed", message=name, bytes=len(raw), reason=str(exc))
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {name}: {exc}")
        raise AssertionError("unreachable") from exc  # context.abort raises


def _unary(
    method: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Message]], message_type: type[Message]
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[Message]]:
    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> Message:
        return await method(await parse_request(raw, message_type, context), context)

    return handler


def _stream(
    method: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Message]],
    message_type: type[Message],
    stall_seconds: float,
) -> Callable[[bytes, grpc.aio.ServicerContext], Awaitable[None]]:
    async def handler(raw: bytes, context: grpc.aio.ServicerContext) -> None:
        request = await parse_request(raw, message_type, context)
        responses = method(request, context)
        try:
            async for response in responses:
                try:
                    async with asyncio.timeout(stall_seconds):
                        await context.write(response)
                except TimeoutError:
                    await responses.aclose()  # the servicer's cleanup cancels its task, freeing the slot
                    log.warning("stream_stalled", task_id=getattr(request, "task_id", ""), stall_seconds=stall_seconds)
                    await context.abort(
                        grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"the client read nothing from its stream for {stall_seconds:g} s (--stream-stall-seconds); "
                        "the task was cancelled",
                    )
        except StreamStalledError as exc:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        finally:
            await responses.aclose()

    return handler


def add_hyserve_service(
    servicer: pb_grpc.HyserveServiceServicer, server: grpc.aio.Server, stall_seconds: float
) -> None:
    """What `add_HyserveServiceServicer_to_server` does, with the parsing and writing above."""
    handlers = {
        "Generate": grpc.unary_stream_rpc_method_handler(
            _stream(servicer.Generate, pb.GenerateRequest, stall_seconds),
            response_serializer=pb.GenerateResponse.SerializeToString,
        ),
        "Cancel": grpc.unary_unary_rpc_method_handler(
            _unary(servicer.Cancel, pb.CancelRequest), response_serializer=pb.CancelResponse.SerializeToString
        ),
        "CacheStats": grpc.unary_unary_rpc_method_handler(
            _unary(servicer.CacheStats, pb.CacheStatsRequest),
            response_serializer=pb.CacheStatsResponse.SerializeToString,
        ),
        "ModelInfo": grpc.unary_unary_rpc_method_handler(
            _unary(servicer.ModelInfo, pb.ModelInfoRequest),
            response_serializer=pb.ModelInfoResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)
