"""The aiohttp application of the OpenAI-compatible front, run on the gRPC server's asyncio loop.

Every completion request becomes one engine task through the same path as a gRPC Generate call
(`requests` builds the GenerateRequest, `validation.prepare_generate` checks and renders it,
`tasks.TaskRun` runs it). The runner cancels a handler whose client disconnects
(`handler_cancellation=True`); the handler's `finally` then cancels its own task and no other.
The response and chunk `id` is the task id, so the gRPC Cancel RPC can stop an HTTP request too.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import structlog
from aiohttp import web

from hyserve.api.anthropic_http.handlers import AnthropicFront
from hyserve.api.chat_output import ChatOutput, ParsedCall
from hyserve.api.http_auth import aiohttp_auth_middleware, http_caller
from hyserve.api.limits import receive_limit_bytes
from hyserve.api.openai_http.requests import OpenAIError, OpenAIRequest, parse_chat, parse_completion, validation_param
from hyserve.api.openai_http.responses import (
    Completion,
    chat_chunk,
    chat_delta,
    chat_response,
    completion_chunk,
    completion_response,
    finish_reason,
    logprobs_json,
    usage_json,
)
from hyserve.api.prepare_pool import run_prepare
from hyserve.api.security import Security
from hyserve.api.servicer import Runtime, model_info
from hyserve.api.tasks import SESSION_HEADER, TaskRun
from hyserve.api.validation import PreparedRequest, ValidationError, prepare_generate
from hyserve.engine.engine import DuplicateTaskError, EngineClosedError, QueueFullError
from hyserve.engine.task import DeltaEvent, FailedEvent, FinishedEvent

log = structlog.get_logger(__name__)

__all__ = ["OpenAIFront"]

Kind = Literal["chat", "completion"]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves in OpenAI's shape: {"error": {message, type, param, code}}."""
    try:
        return await handler(request)
    except OpenAIError as exc:
        return web.json_response(exc.body(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        type_ = "not_found_error" if exc.status == 404 else "invalid_request_error"
        err = OpenAIError(f"{exc.reason}: {request.method} {request.path}", status=exc.status, type_=type_)
        return web.json_response(err.body(), status=exc.status)


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body, refused (413) past `limit` bytes (the gRPC receive limit) before it is parsed on the loop."""
    size = request.content_length or 0
    chunks: list[bytes] = []
    if size <= limit:
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                break
            chunks.append(chunk)
    if size > limit:
        raise OpenAIError(f"the request body is larger than this server accepts ({limit} bytes)", status=413)
    return b"".join(chunks)


class OpenAIFront:
    """Owns the aiohttp runner. `runtime` is set once the model is loaded; `draining` at shutdown."""

    def __init__(self, security: Security | None = None) -> None:
        self.security = security or Security()
        self.runtime: Runtime | None = None
        self.draining = False
        self._model_name = ""
        self._created = int(time.time())
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        middlewares: list[Any] = [_errors]
        if self.security.store is not None:  # /health stays open for probes unless protected
            open_paths = frozenset() if self.security.config.protect_health else frozenset({"/health"})
            middlewares.insert(0, aiohttp_auth_middleware(self.security.store, open_paths))
        app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/messages", AnthropicFront(self).messages)
        app.router.add_post("/v1/messages/count_tokens", AnthropicFront(self).count_tokens)
        return app

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the port."""
        runner = web.AppRunner(self.app(), handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        await web.TCPSite(runner, host, port, ssl_context=self.security.ssl_context()).start()
        self._runner = runner
        return int(runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # --- routes ------------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        if self.draining:
            return web.json_response({"status": "draining"}, status=503)
        if self.runtime is None:
            return web.json_response({"status": "loading"}, status=503)
        return web.json_response({"status": "ok"})

    def _model_card(self) -> dict[str, Any]:
        runtime = self._ready()
        return {
            "id": self._model(runtime),
            "object": "model",
            "created": self._created,
            "owned_by": "hyserve",
            "max_model_len": runtime.engine.config.n_ctx,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        card = self._model_card()
        name = request.match_info["model"]
        if name != card["id"]:
            raise OpenAIError(f"model {name!r} is not served here", "model", 404, "not_found_error")
        return web.json_response(card)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    # --- generation --------------------------------------------------------------------------------

    def _ready(self) -> Runtime:
        if self.draining:
            raise OpenAIError("the server is shutting down", status=503, type_="service_unavailable")
        if self.runtime is None:
            raise OpenAIError("the model is still loading; retry later", status=503, type_="service_unavailable")
        return self.runtime

    def _model(self, runtime: Runtime) -> str:
        if not self._model_name:
            self._model_name = model_info(runtime).model_name
        return self._model_name

    async def _prepare(
        self, request: web.Request, kind: Kind, runtime: Runtime
    ) -> tuple[OpenAIRequest, PreparedRequest]:
        try:
            body = json.loads(await _read_body(request, receive_limit_bytes(runtime.limits.prompt_bytes)))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise OpenAIError(f"the request body is not valid JSON: {exc}") from exc
        task_id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
        parsed = parse_chat(body, task_id) if kind == "chat" else parse_completion(body, task_id)
        tok = runtime.model.tokenizer
        try:
            prepared = await run_prepare(
                prepare_generate, parsed.generate, tok, runtime.chat_template, runtime.limits, runtime.engine.grammars
            )
        except ValidationError as exc:
            log.info("http_rejected", task_id=task_id, reason=str(exc))
            raise OpenAIError(str(exc), validation_param(str(exc), kind)) from exc
        return parsed, prepared

    async def _generate(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        runtime = self._ready()
        parsed, prepared = await self._prepare(request, kind, runtime)
        run = TaskRun(runtime.engine, prepared, request.headers.get(SESSION_HEADER, ""))
        caller = http_caller(self.security.identity, request)
        try:
            run.submit()
        except QueueFullError as exc:
            raise OpenAIError(f"{exc}; retry later", status=429, type_="rate_limit_error") from exc
        except EngineClosedError as exc:
            raise OpenAIError(str(exc), status=503, type_="service_unavailable") from exc
        except DuplicateTaskError as exc:
            raise OpenAIError(str(exc), status=409) from exc
        self.security.owners.claim(run.task.id, caller.owner)
        log.info("http_generate", task_id=run.task.id, kind=kind, stream=parsed.stream)
        reply = _Reply(run.task.id, int(time.time()), self._model(runtime), kind, parsed, prepared, runtime)
        try:
            if parsed.stream:
                return await reply.stream(request, run)
            return await reply.collect(run)
        except ConnectionResetError:  # a write found the client gone before the runner noticed
            log.info("http_client_gone", task_id=run.task.id)
            return web.Response(status=499)
        finally:
            run.close()  # the client went away (handler cancelled) or the stream failed: this task only
            self.security.owners.release(run.task.id)


class _Reply:
    """Turns one task's events into the response for its request."""

    def __init__(
        self,
        id_: str,
        created: int,
        model: str,
        kind: Kind,
        parsed: OpenAIRequest,
        prepared: PreparedRequest,
        runtime: Runtime,
    ) -> None:
        self.id, self.created, self.model, self.kind = id_, created, model, kind
        self.parsed, self.prepared = parsed, prepared
        self.token_bytes = runtime.model.tokenizer.token_bytes
        self.output = ChatOutput(prepared.output) if prepared.output is not None else None

    def _logprobs(self, event: DeltaEvent | Completion) -> dict[str, Any] | None:
        if not self.parsed.logprobs:
            return None
        return logprobs_json(event.logprobs, self.token_bytes, self.kind == "chat")

    def _prompt_ids(self) -> tuple[int, ...] | None:
        return self.prepared.prompt if self.parsed.return_token_ids else None

    async def collect(self, run: TaskRun) -> web.Response:
        done = Completion()
        async for event in run.events():
            if isinstance(event, DeltaEvent):
                done.add(event, None if self.output is None else self.output.push(event.text))
            elif isinstance(event, FinishedEvent):
                if self.output is not None:
                    tail, done.calls = self.output.finish()
                    done.add_piece(tail)
                done.finished = event
            elif isinstance(event, FailedEvent):
                raise OpenAIError(event.message, status=500, type_="server_error")
        build = chat_response if self.kind == "chat" else completion_response
        return web.json_response(
            build(self.id, self.created, self.model, done, self._logprobs(done), self._prompt_ids())
        )

    def _chunk(self, text: str | None, finish: str | None = None, extra: dict[str, Any] | None = None) -> bytes:
        if self.kind == "chat":
            delta = {} if text is None else {"content": text}
            return _sse(chat_chunk(self.id, self.created, self.model, delta, finish, extra))
        return _sse(completion_chunk(self.id, self.created, self.model, text or "", finish, extra))

    def _delta_chunk(self, event: DeltaEvent, extra: dict[str, Any]) -> bytes | None:
        """The chunk of one engine delta; None when it carries nothing to send yet."""
        if self.output is None:
            return self._chunk(event.text, extra=extra) if event.text or extra else None
        delta = chat_delta(self.output.push(event.text))
        if not delta and not extra:
            return None
        return _sse(chat_chunk(self.id, self.created, self.model, delta, None, extra))

    async def stream(self, request: web.Request, run: TaskRun) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        if self.kind == "chat":
            first = chat_chunk(self.id, self.created, self.model, {"role": "assistant", "content": ""})
            if self.parsed.return_token_ids:
                first["prompt_token_ids"] = list(self.prepared.prompt)
            await response.write(_sse(first))
        async for event in run.events():
            if isinstance(event, DeltaEvent):
                extra: dict[str, Any] = {}
                if self.parsed.logprobs:
                    extra["logprobs"] = self._logprobs(event)
                if self.parsed.return_token_ids:
                    extra["token_ids"] = list(event.token_ids)
                if (chunk := self._delta_chunk(event, extra)) is not None:
                    await response.write(chunk)
            elif isinstance(event, FinishedEvent):
                calls: tuple[ParsedCall, ...] = ()
                if self.output is not None:
                    tail, calls = self.output.finish()
                    if delta := chat_delta(tail):
                        await response.write(_sse(chat_chunk(self.id, self.created, self.model, delta)))
                await response.write(self._chunk(None, finish_reason(event.reason, calls)))
                if self.parsed.include_usage:
                    usage = {
                        "id": self.id,
                        "object": "chat.completion.chunk" if self.kind == "chat" else "text_completion",
                    }
                    usage |= {"created": self.created, "model": self.model, "choices": []}
                    usage["usage"] = usage_json(event.usage)
                    await response.write(_sse(usage))
            elif isinstance(event, FailedEvent):
                err = OpenAIError(event.message, status=500, type_="server_error")
                await response.write(_sse(err.body()))
        await response.write(_sse("[DONE]"))
        await response.write_eof()
        return response
