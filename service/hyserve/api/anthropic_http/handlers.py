"""The Messages API routes, served by the OpenAI front's aiohttp application on the same port.

A /v1/messages request becomes one engine task through the same path as a gRPC Generate call
(`requests` builds the GenerateRequest, `validation.prepare_generate` checks and renders it,
`tasks.TaskRun` runs it); the answer's text goes through `chat_output.ChatOutput` into content
blocks. The message `id` is the task id, so the gRPC Cancel RPC can stop it too. Every error leaves
in Anthropic's shape, including those the OpenAI front's helpers raise.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from hyserve.api.anthropic_http.errors import AnthropicError, field_message
from hyserve.api.anthropic_http.requests import MessagesRequest, parse_count_tokens, parse_messages
from hyserve.api.anthropic_http.responses import (
    ContentBlocks,
    Event,
    MessageContent,
    final_usage,
    message_json,
    sse,
    stop_reason,
    usage_json,
)
from hyserve.api.chat_output import ChatOutput, OutputSpec, ParsedCall
from hyserve.api.http_auth import http_caller
from hyserve.api.limits import receive_limit_bytes
from hyserve.api.openai_http.errors import OpenAIError
from hyserve.api.prepare_pool import run_prepare
from hyserve.api.servicer import Runtime
from hyserve.api.tasks import SESSION_HEADER, StreamStalledError, TaskRun
from hyserve.api.validation import PreparedRequest, ValidationError, build_prompt, prepare_generate
from hyserve.engine.engine import DuplicateTaskError, EngineClosedError, QueueFullError
from hyserve.engine.task import AcceptedEvent, DeltaEvent, FailedEvent, FinishedEvent

if TYPE_CHECKING:
    from hyserve.api.openai_http.app import OpenAIFront

log = structlog.get_logger(__name__)

__all__ = ["AnthropicFront"]

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _anthropic_errors(route: Route) -> Route:
    """Errors raised by a route (its own, the OpenAI front's helpers', aiohttp's) in Anthropic's shape."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        try:
            return await route(request)
        except AnthropicError as exc:
            return web.json_response(exc.body(), status=exc.status)
        except OpenAIError as exc:
            return web.json_response(AnthropicError(exc.message, exc.status).body(), status=exc.status)

    return wrapped


async def _json_body(request: web.Request, limit: int) -> Any:
    """The decoded body, refused (413) past `limit` bytes before it is parsed."""
    if (request.content_length or 0) > limit:
        raise AnthropicError(f"the request body is larger than this server accepts ({limit} bytes)", 413)
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise AnthropicError(f"the request body is larger than this server accepts ({limit} bytes)", 413)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise AnthropicError(f"the request body is not valid JSON: {exc}") from exc


class AnthropicFront:
    """The handlers of /v1/messages and /v1/messages/count_tokens for one `OpenAIFront`."""

    def __init__(self, front: OpenAIFront) -> None:
        self.front = front
        self.messages = _anthropic_errors(self._messages)
        self.count_tokens = _anthropic_errors(self._count_tokens)

    async def _count_tokens(self, request: web.Request) -> web.Response:
        runtime = self.front._ready()
        body = await _json_body(request, receive_limit_bytes(runtime.limits.prompt_bytes))
        generate = parse_count_tokens(body)
        try:
            prompt = await run_prepare(build_prompt, generate, runtime.model.tokenizer, runtime.chat_template)
        except ValidationError as exc:
            raise AnthropicError(field_message(str(exc))) from exc
        return web.json_response({"input_tokens": len(prompt.ids)})

    async def _prepare(self, request: web.Request, runtime: Runtime) -> tuple[MessagesRequest, PreparedRequest]:
        body = await _json_body(request, receive_limit_bytes(runtime.limits.prompt_bytes))
        parsed = parse_messages(body, "msg_" + uuid.uuid4().hex)
        tok = runtime.model.tokenizer
        try:
            prepared = await run_prepare(
                prepare_generate, parsed.generate, tok, runtime.chat_template, runtime.limits, runtime.engine.grammars
            )
        except ValidationError as exc:
            log.info("http_rejected", task_id=parsed.generate.task_id, reason=str(exc))
            raise AnthropicError(field_message(str(exc))) from exc
        return parsed, prepared

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        runtime = self.front._ready()
        parsed, prepared = await self._prepare(request, runtime)
        run = TaskRun(runtime.engine, prepared, request.headers.get(SESSION_HEADER, ""))
        caller = http_caller(self.front.security.identity, request)
        try:
            run.submit()
        except QueueFullError as exc:
            raise AnthropicError(f"{exc}; retry later", 529) from exc
        except EngineClosedError as exc:
            raise AnthropicError(str(exc), 503) from exc
        except DuplicateTaskError as exc:
            raise AnthropicError(str(exc), 409) from exc
        self.front.security.owners.claim(run.task.id, caller.owner)
        log.info("http_generate", task_id=run.task.id, kind="messages", stream=parsed.stream)
        reply = _Reply(run, self.front._model(runtime), prepared)
        try:
            return await (reply.stream(request) if parsed.stream else reply.collect())
        except ConnectionResetError:  # a write found the client gone before the runner noticed
            log.info("http_client_gone", task_id=run.task.id)
            return web.Response(status=499)
        finally:
            run.close()  # the client went away (handler cancelled) or the stream failed: this task only
            self.front.security.owners.release(run.task.id)


class _Reply:
    """Turns one task's events into the message for its request."""

    def __init__(self, run: TaskRun, model: str, prepared: PreparedRequest) -> None:
        self.run, self.model, self.prepared = run, model, prepared
        self.output = ChatOutput(prepared.output or OutputSpec())
        self.blocks = ContentBlocks()
        self.calls: tuple[ParsedCall, ...] = ()  # the complete calls, once finished

    def _end(self, event: FinishedEvent) -> tuple[list[Event], str, str | None]:
        """The last block events, the stop reason and the stop sequence."""
        piece, calls = self.output.finish()
        self.calls = calls
        events = self.blocks.finish(piece, calls)
        reason = stop_reason(event.reason, bool(calls))
        return events, reason, event.stop_string if reason == "stop_sequence" else None

    async def collect(self) -> web.Response:
        content = MessageContent()
        async for event in self.run.events():
            if isinstance(event, DeltaEvent):
                content.add(self.blocks.push(self.output.push(event.text)))
            elif isinstance(event, FinishedEvent):
                events, reason, sequence = self._end(event)
                content.add(events)
                body = message_json(
                    self.run.task.id, self.model, content.result(self.calls), reason, sequence, final_usage(event.usage)
                )
                return web.json_response(body)
            elif isinstance(event, FailedEvent):
                raise AnthropicError(event.message, 500)
        raise AnthropicError("the task ended without an answer", 500)

    def _start(self, cached: int) -> bytes:
        usage = usage_json(len(self.prepared.prompt), cached, 0)
        return sse(
            "message_start",
            {"type": "message_start", "message": message_json(self.run.task.id, self.model, [], None, None, usage)},
        )

    async def stream(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        started = False
        try:
            async for event in self.run.events():
                if not started:
                    cached = event.reused_tokens if isinstance(event, AcceptedEvent) else 0
                    await response.write(self._start(cached))
                    started = True
                if isinstance(event, DeltaEvent):
                    for name, data in self.blocks.push(self.output.push(event.text)):
                        await response.write(sse(name, data))
                elif isinstance(event, FinishedEvent):
                    await self._write_end(response, event)
                elif isinstance(event, FailedEvent):
                    await response.write(sse("error", AnthropicError(event.message, 500).body()))
        except StreamStalledError as exc:
            await response.write(sse("error", AnthropicError(str(exc), 429).body()))
        await response.write_eof()
        return response

    async def _write_end(self, response: web.StreamResponse, event: FinishedEvent) -> None:
        events, reason, sequence = self._end(event)
        for name, data in events:
            await response.write(sse(name, data))
        usage = final_usage(event.usage)
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": usage}
        await response.write(sse("message_delta", delta))
        await response.write(sse("message_stop", {"type": "message_stop"}))
