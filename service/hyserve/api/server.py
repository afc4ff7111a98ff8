"""The gRPC server process: `hyserve serve`.

Start-up order: listen first (so health checks answer while the model loads), load the model on a
background thread, warm it up, start the engine, then mark the service ready.

Health (grpc.health.v1), two names for two probes:
- "" is liveness: SERVING from the moment the server listens until the drain has ended, so neither a
  long model load nor a drain gets the process restarted by a liveness probe.
- "hyserve.v1.HyserveService" is readiness: NOT_SERVING until the model is loaded and warmed up,
  SERVING after, NOT_SERVING again the moment shutdown starts (balancers stop sending new work).

Shutdown on SIGTERM/SIGINT: readiness turns NOT_SERVING, new Generate calls get UNAVAILABLE, queued
and running tasks may finish for `--drain-seconds` (Cancel, CacheStats and health keep working
meanwhile), what is left is cancelled, every status turns NOT_SERVING, then the server stops; the
metrics endpoint closes last, letting the scrapes it has accepted finish.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio
import numpy as np
import structlog
from grpc_health.v1 import health as health_module
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from hyserve.api.decode_guard import DecodeGuard
from hyserve.api.limits import (
    DEFAULT_STREAM_STALL_SECONDS,
    add_limit_arguments,
    default_max_prompt_bytes,
    default_max_queued_prompt_tokens,
    receive_limit_bytes,
)
from hyserve.api.metrics_http import MetricsEndpoint
from hyserve.api.raw_codec import add_hyserve_service
from hyserve.api.resume_args import add_resume_arguments, pinned_rates
from hyserve.api.security import Security, SecurityConfig, add_security_arguments
from hyserve.api.servicer import SERVICE_NAME, HyserveServicer, Runtime, model_info
from hyserve.api.shared_cache_args import add_shared_cache_arguments, shared_cache_config
from hyserve.api.tls import is_loopback
from hyserve.api.validation import RequestLimits
from hyserve.device_flags import add_device_arguments, device_request
from hyserve.model.backend.select import DeviceRequest
from hyserve.operator_errors import OperatorError, is_operator_error, model_path_error
from hyserve.spec_flags import add_spec_arguments, spec_config, spec_flag_error

if TYPE_CHECKING:
    from hyserve.engine.resume_rates import PinnedRates
    from hyserve.engine.store_tiers.shared import SharedTierConfig

log = structlog.get_logger(__name__)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # clients ping every 60 s, also during long silent prompt evaluations: accept pings every 10 s
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # ping clients too, so a vanished client's stream (and thus its task) is cancelled
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
]
HEALTH_SERVICE_NAME = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
LIVENESS_SERVICE = ""  # grpc.health.v1's name for the whole server
# how long a scrape accepted at the drain's end may still take (a /metrics response takes milliseconds)
METRICS_CLOSE_MIN_S = 2.0

T = TypeVar("T")


# --swa-cache ring keeps window rings in host memory, which the GPU path does not read
_RING_CPU_ONLY = "--swa-cache ring (ring caches are CPU-only)"


@dataclass(frozen=True)
class ServeConfig:
    model: str = "default"
    chat_template: Path | None = None
    host: str = "127.0.0.1"
    port: int = 50051
    parallel: int = 1
    ctx_size: int = 4096
    queue_size: int = 64
    threads: int | None = None
    default_max_tokens: int = 1024
    prompt_chunk: int = 128
    drain_seconds: float = 30.0
    checkpoint_memory_mib: int = 1024
    checkpoint_interval: int = 1024
    cache_memory_mib: int = 2048
    cache_dir: str | None = None  # the prefix store's disk tier (with cache_disk_bytes)
    cache_disk_bytes: int = 0
    shared_cache: SharedTierConfig | None = None  # the prefix store's shared tier (--cache-redis)
    cache_resume: str = "cheapest"  # resume from the cheapest or the furthest slot / store entry
    cache_resume_rates: PinnedRates | None = None  # None: measured as the engine runs
    replay_memory_mib: int = 1024
    metrics_port: int | None = None
    swa_cache: str = "full"
    replica_id: str | None = None
    http_port: int | None = None  # OpenAI-compatible HTTP front
    device: DeviceRequest = field(default_factory=DeviceRequest)
    max_prompt_bytes: int | None = None  # None: derived from ctx_size (limits.py)
    stream_stall_seconds: float = DEFAULT_STREAM_STALL_SECONDS
    max_queued_prompt_tokens: int | None = None  # None: derived from ctx_size; 0: no limit

    @property
    def prompt_bytes(self) -> int:
        return default_max_prompt_bytes(self.ctx_size) if self.max_prompt_bytes is None else self.max_prompt_bytes

    @property
    def queued_prompt_tokens(self) -> int:
        q = self.max_queued_prompt_tokens
        return default_max_queued_prompt_tokens(self.ctx_size) if q is None else q

    security: SecurityConfig = field(default_factory=SecurityConfig)
    debug: bool = False  # tracebacks for operator errors
    check_invariants: bool = False  # test hook (tests/soak)
    spec: str = "off"  # speculative decoding for every request (--spec)
    spec_max_draft: int = 8
    spec_draft_model: str | None = None  # the draft model of --spec draft
    spec_draft_p_min: float = 0.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeConfig:
        return cls(
            model=args.model,
            chat_template=args.chat_template,
            host=args.host,
            port=args.port,
            parallel=args.parallel,
            ctx_size=args.ctx_size,
            queue_size=args.queue_size,
            threads=args.threads,
            default_max_tokens=args.default_max_tokens,
            prompt_chunk=args.prompt_chunk,
            checkpoint_memory_mib=args.checkpoint_memory,
            checkpoint_interval=args.checkpoint_interval,
            cache_memory_mib=args.cache_memory,
            cache_dir=args.cache_dir,
            cache_disk_bytes=args.cache_disk_bytes,
            shared_cache=shared_cache_config(args),
            cache_resume=args.cache_resume,
            cache_resume_rates=pinned_rates(args),
            replay_memory_mib=args.replay_memory,
            metrics_port=args.metrics_port,
            swa_cache=args.swa_cache,
            drain_seconds=args.drain_seconds,
            replica_id=args.replica_id,
            http_port=args.http_port,
            device=device_request(args, cpu_only=_RING_CPU_ONLY if args.swa_cache == "ring" else None),
            max_prompt_bytes=args.max_prompt_bytes,
            stream_stall_seconds=args.stream_stall_seconds,
            max_queued_prompt_tokens=args.max_queued_prompt_tokens,
            security=SecurityConfig.from_args(args),
            debug=getattr(args, "debug", False),
            check_invariants=args.check_invariants,
            spec=args.spec,
            spec_max_draft=args.spec_max_draft,
            spec_draft_model=args.spec_draft_model,
            spec_draft_p_min=args.spec_draft_p_min,
        )


def add_serve_subcommand(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the CLI's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser("serve", help="run the gRPC server")
    p.add_argument("--model", default="default", help="GGUF path, or 'default' (Gemma 3 270M from PyPI)")
    p.add_argument("--chat-template", type=Path, default=None, help="Jinja file overriding the model's template")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=50051, help="port to listen on (0: any free port, logged)")
    p.add_argument("--parallel", type=int, default=1, help="slots: tasks that run at the same time")
    p.add_argument("--ctx-size", type=int, default=4096, help="context size of each slot, in tokens")
    p.add_argument("--queue-size", type=int, default=64, help="tasks that may wait for a slot")
    p.add_argument("--threads", type=int, default=None, help="kernel threads (default: the kernels' choice)")
    p.add_argument("--default-max-tokens", type=int, default=1024, help="completion limit for requests that set none")
    p.add_argument("--prompt-chunk", type=int, default=128, help="tokens evaluated per step (prompt chunks)")
    p.add_argument("--drain-seconds", type=float, default=30.0, help="how long shutdown lets tasks finish")
    p.add_argument(
        "--checkpoint-memory", type=int, default=1024, metavar="MIB", help="byte budget of all slots' checkpoints"
    )
    p.add_argument(
        "--checkpoint-interval", type=int, default=1024, help="checkpoint every N tokens of a long prompt (0: off)"
    )
    p.add_argument(
        "--cache-memory", type=int, default=2048, metavar="MIB", help="host-memory prefix store budget (0: off)"
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        metavar="PATH",
        help="directory of the prefix store's disk tier (with --cache-disk-bytes)",
    )
    p.add_argument(
        "--cache-disk-bytes",
        type=int,
        default=0,
        metavar="N",
        help="byte budget of the disk tier, least recently used files go first (0: off)",
    )
    add_shared_cache_arguments(p)
    add_resume_arguments(p)
    p.add_argument(
        "--http-port", type=int, default=None, help="also serve the OpenAI-compatible HTTP API on this port (0: any)"
    )
    p.add_argument(
        "--replay-memory",
        type=int,
        default=1024,
        metavar="MIB",
        help="budget of kept per-token recurrent/ring inputs, to resume exactly anywhere in them (0: off)",
    )
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics on this port (0: any)")
    p.add_argument("--replica-id", default=None, help="this replica's name in the metrics' labels (default: hostname)")
    p.add_argument(
        "--swa-cache",
        choices=("full", "ring"),
        default="full",
        help="sliding-window layers: full cache (resume anywhere) or ring buffer + window checkpoints (less memory)",
    )
    p.add_argument(
        "--check-invariants",
        action="store_true",
        help="test hook: verify the cache invariants after every engine step (slow; counts in /metrics)",
    )
    add_spec_arguments(p)
    add_device_arguments(p)
    add_limit_arguments(p)
    add_security_arguments(p)
    p.set_defaults(func=run_serve)
    return p


def run_serve(args: argparse.Namespace) -> int:
    config = ServeConfig.from_args(args)
    spec_problem = spec_flag_error(config.spec, config.spec_draft_model, config.spec_draft_p_min)
    problem = model_path_error(config.model) or spec_problem
    if problem is not None:  # before listening: a wrong path is not worth a health-checked start
        raise OperatorError(problem)
    for name in ("parallel", "ctx_size", "default_max_tokens", "prompt_chunk", "spec_max_draft"):
        if getattr(config, name) < 1:
            raise SystemExit(f"hyserve serve: --{name.replace('_', '-')} must be >= 1")
    for name in (
        "queue_size",
        "checkpoint_memory_mib",
        "checkpoint_interval",
        "cache_memory_mib",
        "replay_memory_mib",
        "cache_disk_bytes",
    ):
        if getattr(config, name) < 0:
            flag = name.removesuffix("_mib").replace("_", "-")
            raise SystemExit(f"hyserve serve: --{flag} must be >= 0")
    if config.prompt_bytes < 1 or not config.stream_stall_seconds > 0:
        raise SystemExit("hyserve serve: --max-prompt-bytes and --stream-stall-seconds must be > 0")
    if 0 < config.queued_prompt_tokens < config.ctx_size:
        raise SystemExit("hyserve serve: --max-queued-prompt-tokens must be 0 (no limit) or >= --ctx-size")
    security = Security.build(config.security)  # SecurityError: one line from the CLI
    refusal = security.bind_refusal(config.host)
    if refusal is not None:
        raise OperatorError(refusal)
    if not is_loopback(config.host) and not security.authenticated:
        log.warning("listening_without_authentication", host=config.host, **security.log_fields())
    # The engine thread drops and retakes the GIL around every kernel call (~170 per token); with
    # the default 5 ms switch interval it can wait that long behind the asyncio thread each time.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    return asyncio.run(serve(config, security))


GIL_SWITCH_INTERVAL_S = 0.0002


async def _in_thread(fn: Callable[[], T]) -> T:
    """Run fn on a daemon thread (unlike asyncio.to_thread, an abandoned one does not block exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        def settle(result: Any = None, error: BaseException | None = None) -> None:
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        try:
            value = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, value)

    threading.Thread(target=target, name="hyserve-load", daemon=True).start()
    return await future


def load_runtime(config: ServeConfig) -> Runtime:
    """Load and warm up the model, start the engine (blocking; runs on a background thread)."""
    import hyserve_kernels

    from hyserve.engine.engine import Engine, EngineConfig
    from hyserve.engine.store_tiers.identity import model_fingerprint
    from hyserve.model.architectures.base import Logits, Segment
    from hyserve.model.loader import load_model

    if config.threads is not None:
        hyserve_kernels.set_num_threads(config.threads)
    model = load_model(config.model, config.chat_template, config.device)
    if config.ctx_size > model.arch.n_ctx_train:
        log.warning("ctx_size_exceeds_training", ctx_size=config.ctx_size, n_ctx_train=model.arch.n_ctx_train)
    start = time.perf_counter()
    warm = [model.tokenizer.bos_id if model.tokenizer.bos_id is not None else 0]
    warm += model.tokenizer.encode("Hello", add_special=False)
    model.arch.forward([Segment(model.arch.new_memory(16), np.asarray(warm, dtype=np.int32), Logits.LAST)])
    log.info("model_warm", seconds=round(time.perf_counter() - start, 3))
    spec = spec_config(
        config.spec,
        config.spec_max_draft,
        config.spec_draft_model,
        model.arch,
        model.tokenizer,
        config.device,
        config.spec_draft_p_min,
    )
    engine = Engine(
        model.arch,
        model.tokenizer,
        EngineConfig(
            n_slots=config.parallel,
            n_ctx=config.ctx_size,
            queue_size=config.queue_size,
            prompt_chunk=config.prompt_chunk,
            checkpoint_memory=config.checkpoint_memory_mib << 20,
            checkpoint_interval=config.checkpoint_interval,
            cache_memory=config.cache_memory_mib << 20,
            cache_dir=config.cache_dir,
            cache_disk_bytes=config.cache_disk_bytes,
            model_identity=model_fingerprint(config.model) if config.cache_dir or config.shared_cache else "",
            shared_cache=config.shared_cache,
            resume_choice=config.cache_resume,
            resume_rates=config.cache_resume_rates,
            replay_memory=config.replay_memory_mib << 20,
            window_ring=config.swa_cache == "ring",
            max_queued_prompt_tokens=config.queued_prompt_tokens,
            check_invariants=config.check_invariants,
            spec=spec,
        ),
    )
    engine.start()
    return Runtime(
        model=model,
        engine=engine,
        chat_template=model.chat_template,
        has_chat_template=model.has_own_template or config.chat_template is not None,
        limits=RequestLimits(config.ctx_size, config.default_max_tokens, config.prompt_bytes),
    )


async def serve(config: ServeConfig, security: Security | None = None) -> int:
    security = security or Security.build(config.security)
    # a message too large to hold an acceptable prompt is refused by grpc before it is parsed
    receive = ("grpc.max_receive_message_length", receive_limit_bytes(config.prompt_bytes))
    interceptors = [*security.interceptors(), DecodeGuard()]  # callers are authenticated first
    server = grpc.aio.server(options=[*SERVER_OPTIONS, receive], interceptors=interceptors)
    servicer = HyserveServicer(security, config.replica_id)
    add_hyserve_service(servicer, server, config.stream_stall_seconds)
    health = health_module.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    await health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    reflection.enable_server_reflection((SERVICE_NAME, HEALTH_SERVICE_NAME, reflection.SERVICE_NAME), server)
    address = f"{config.host}:{config.port}"
    try:
        port = security.add_port(server, address)
    except RuntimeError:  # grpc raises where it used to return 0 (address in use, no such address)
        port = 0
    if port == 0:
        log.error("listen_failed", address=address, hint="is the port in use or the address not on this host?")
        return 1
    await server.start()
    log.info("server_listening", host=config.host, port=port, **security.log_fields())
    http = None
    if config.http_port is not None:  # same loop and engine; answers 503 until the model is loaded
        from hyserve.api.openai_http.app import OpenAIFront

        http = OpenAIFront(security)
        log.info("http_listening", host=config.host, port=await http.start(config.host, config.http_port))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    metrics: MetricsEndpoint | None = None
    loading = asyncio.ensure_future(_in_thread(lambda: load_runtime(config)))
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    runtime: Runtime | None = None
    if loading.done():
        try:
            runtime = loading.result()
        except Exception as exc:
            if config.debug or not is_operator_error(exc):
                log.exception("model_load_failed", model=config.model)
            else:  # the operator's mistake: one line, no traceback (--debug shows it)
                log.error("model_load_failed", model=config.model, error=str(exc))
            stopping.cancel()
            await health.enter_graceful_shutdown()
            await server.stop(grace=1.0)
            return 1
        servicer.runtime = runtime
        if http is not None:
            http.runtime = runtime
        if config.metrics_port is not None:
            from hyserve.api.metrics import ReplicaIdentity, serve_metrics

            identity = ReplicaIdentity.of(config.replica_id, model_info(runtime).model_name, config.parallel)
            metrics = serve_metrics(
                runtime.engine.stats, config.ctx_size, config.host, config.metrics_port, identity, security
            )
            log.info("metrics_listening", host=config.host, port=metrics.port, replica=identity.replica)
        await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        log.info("server_ready", port=port, slots=config.parallel, n_ctx=config.ctx_size)
        await stopping
    else:
        loading.cancel()

    log.info("server_draining", seconds=config.drain_seconds)
    drain_deadline = time.monotonic() + config.drain_seconds
    # readiness only: liveness ("") stays SERVING while tasks drain, so a probe does not kill the pod
    await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    if http is not None:
        http.draining = True
    if runtime is not None:
        engine = runtime.engine
        engine.close()  # new Generate calls: UNAVAILABLE; Cancel, CacheStats and health keep working
        while not engine.idle() and time.monotonic() < drain_deadline:
            await asyncio.sleep(0.05)
        await _in_thread(engine.shutdown)  # cancels whatever is left; their streams get Finished
    await health.enter_graceful_shutdown()
    await server.stop(grace=2.0)  # let the last events reach their clients
    if http is not None:
        await http.stop()
    if metrics is not None:  # last, so scrapes see the whole drain; a scrape it has accepted still ends whole
        log.info("metrics_closing", in_flight=metrics.in_flight)
        grace = max(drain_deadline - time.monotonic(), METRICS_CLOSE_MIN_S)
        if unanswered := await _in_thread(lambda: metrics.close(grace)):
            log.warning("metrics_requests_cut", unanswered=unanswered, waited_s=round(grace, 1))
    log.info("server_stopped")
    return 0
