"""A server interceptor that answers malformed request bytes INVALID_ARGUMENT for every method with
a single request (grpc.health.v1 and the like), where grpc's own deserializer would fail as UNKNOWN.

HyserveService registers itself without a deserializer and parses in its handlers (raw_codec.py);
methods without a deserializer, and client-streaming ones (reflection), pass through unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

__all__ = ["DecodeGuard"]

Handler = grpc.RpcMethodHandler


class DecodeGuard(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]], details: grpc.HandlerCallDetails
    ) -> Handler:
        handler = await continuation(details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        return _guarded(handler, details.method)


def _guarded(handler: Handler, method: str) -> Handler:
    deserialize = handler.request_deserializer

    async def parse(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            return deserialize(raw)
        except Exception as exc:  # any decoder failure is the request's fault
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request for {method}: {exc}")

    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
            result = unary(await parse(raw, context), context)
            return await result if inspect.isawaitable(result) else result

        return grpc.unary_unary_rpc_method_handler(unary_unary, response_serializer=handler.response_serializer)

    stream = handler.unary_stream
    if inspect.isasyncgenfunction(stream):

        async def unary_stream_gen(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for response in stream(await parse(raw, context), context):
                yield response

        return grpc.unary_stream_rpc_method_handler(unary_stream_gen, response_serializer=handler.response_serializer)

    async def unary_stream(raw: bytes, context: grpc.aio.ServicerContext) -> None:  # writes with context.write
        result = stream(await parse(raw, context), context)
        if inspect.isawaitable(result):
            await result

    return grpc.unary_stream_rpc_method_handler(unary_stream, response_serializer=handler.response_serializer)
