"""The hyserve.v1.HyserveService servicer (grpc.aio): translates between proto messages and the
engine, and maps failures to status codes. It decides nothing about scheduling or caching.

Each Generate call owns one task (`tasks.TaskRun`, shared with the OpenAI HTTP front) and streams
its events until Finished. When the call ends for any other reason (the client cancelled it, its
deadline passed, the server stops), the call cancels its own task, and only that one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

import grpc
import grpc.aio
import structlog

import hyserve
from hyserve.api.chat_output import ChatOutput
from hyserve.api.early_cancel import EarlyCancels
from hyserve.api.gen import hyserve_pb2 as pb
from hyserve.api.gen import hyserve_pb2_grpc as pb_grpc
from hyserve.api.ownership import may_see
from hyserve.api.prepare_pool import run_prepare
from hyserve.api.proto_events import ProtoEvents
from hyserve.api.security import Security
from hyserve.api.tasks import REPLICA_HEADER, SESSION_HEADER, TaskRun, replica_name
from hyserve.api.validation import RequestLimits, ValidationError, is_task_id, prepare_generate
from hyserve.engine.cache_plan import CheckpointKind
from hyserve.engine.cancel import CancelSource
from hyserve.engine.engine import (
    CancelOutcome,
    DuplicateTaskError,
    Engine,
    EngineClosedError,
    QueueFullError,
    SlotState,
)
from hyserve.engine.task import (
    FailedEvent,
)
from hyserve.model.architectures.base import Architecture
from hyserve.model.chat_template import ChatTemplate
from hyserve.model.loader import LoadedModel

log = structlog.get_logger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["HyserveService"].full_name

_SLOT_STATE = {
    SlotState.IDLE: pb.SLOT_STATE_IDLE,
    SlotState.PROCESSING_PROMPT: pb.SLOT_STATE_PROCESSING_PROMPT,
    SlotState.GENERATING: pb.SLOT_STATE_GENERATING,
}
_TIER_PB = {"memory": pb.STORE_TIER_MEMORY, "disk": pb.STORE_TIER_DISK, "shared": pb.STORE_TIER_SHARED}
_CHECKPOINT_KIND = {
    CheckpointKind.MESSAGE_START: pb.CHECKPOINT_KIND_MESSAGE_START,
    CheckpointKind.PROMPT_END: pb.CHECKPOINT_KIND_PROMPT_END,
    CheckpointKind.CLIENT_REQUESTED: pb.CHECKPOINT_KIND_CLIENT_REQUESTED,
    CheckpointKind.INTERVAL: pb.CHECKPOINT_KIND_INTERVAL,
}


_SUBMIT_ERRORS: dict[type[Exception], grpc.StatusCode] = {
    DuplicateTaskError: grpc.StatusCode.ALREADY_EXISTS,
    QueueFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    EngineClosedError: grpc.StatusCode.UNAVAILABLE,
}


@dataclass(frozen=True)
class Runtime:
    """Everything the servicer needs once the model is loaded."""

    model: LoadedModel
    engine: Engine
    chat_template: ChatTemplate  # the model's, --chat-template's, or the fallback (loader.py)
    has_chat_template: bool  # the model ships one or --chat-template gave one
    limits: RequestLimits


def memory_kind(arch: Architecture) -> int:
    """The proto MemoryKind of an architecture's sequence memory."""
    declared = getattr(arch, "memory_kind", None)
    if isinstance(declared, int):
        return declared
    memory = arch.new_memory(1)
    if memory.recurrent:
        return pb.MEMORY_KIND_HYBRID if memory.has_attention else pb.MEMORY_KIND_RECURRENT
    if arch.sliding_windows():
        # hyserve keeps the full history of sliding-window layers: resumable anywhere
        return pb.MEMORY_KIND_SLIDING_WINDOW
    return pb.MEMORY_KIND_ATTENTION_ONLY


class HyserveServicer(pb_grpc.HyserveServiceServicer):
    def __init__(self, security: Security | None = None, replica_id: str | None = None) -> None:
        self.runtime: Runtime | None = None  # set by the server once the model is loaded and warm
        self.replica = ((REPLICA_HEADER, replica_name(replica_id)),)  # sent first on every call
        self.security = security or Security()  # who calls, and which tasks are theirs (ownership.py)
        self.early_cancels = EarlyCancels()  # Cancels that came before their Generate's task

    def _owner(self, context: grpc.aio.ServicerContext) -> str:
        """Who a remembered early Cancel belongs to: one caller's Cancel never touches another's task."""
        return self.security.identity.of_grpc(context).owner

    async def _ready(self, context: grpc.aio.ServicerContext) -> Runtime:
        """The loaded model (or UNAVAILABLE while it loads), after naming this replica in the
        call's initial metadata: every RPC of the service starts here."""
        await context.send_initial_metadata(self.replica)
        runtime = self.runtime
        if runtime is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the model is still loading; retry later")
            raise AssertionError("unreachable")  # context.abort raises
        return runtime

    # --- Generate --------------------------------------------------------------------------------

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        runtime = await self._ready(context)
        model = runtime.model
        try:
            prepared = await run_prepare(
                prepare_generate,
                request,
                model.tokenizer,
                runtime.chat_template,
                runtime.limits,
                runtime.engine.grammars,
            )
        except ValidationError as exc:
            log.info("generate_rejected", task_id=request.task_id, code="INVALID_ARGUMENT", reason=str(exc))
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            return

        session = next((str(v) for k, v in context.invocation_metadata() or () if k == SESSION_HEADER), "")
        run = TaskRun(runtime.engine, prepared, session)
        # a Cancel that came first: flagged before the engine can admit it, ended once it is queued
        early = bool(request.task_id) and self.early_cancels.take(run.task.id, self._owner(context))
        if early:
            run.task.request_cancel()
        try:
            run.submit()
        except (DuplicateTaskError, QueueFullError, EngineClosedError) as exc:
            code, details = _SUBMIT_ERRORS[type(exc)], str(exc)
            if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                details += "; retry later"
            log.info("generate_rejected", task_id=run.task.id, code=code.name, reason=details)
            await context.abort(code, details)
        owners = self.security.owners
        owners.claim(run.task.id, self.security.identity.of_grpc(context).owner)
        if early:
            runtime.engine.cancel_task(run.task, CancelSource.RPC)

        output = ChatOutput(prepared.output) if prepared.output is not None else None
        convert = ProtoEvents(model.tokenizer.token_bytes, output)
        try:
            async for event in run.events():
                if isinstance(event, FailedEvent):
                    await context.abort(grpc.StatusCode.INTERNAL, event.message)
                for response in convert.responses(event):
                    yield response
        finally:
            # the call ended before the task did (client cancel, deadline, shutdown): cancel it
            run.close()
            owners.release(run.task.id)

    # --- Cancel ----------------------------------------------------------------------------------

    async def Cancel(self, request: pb.CancelRequest, context: grpc.aio.ServicerContext) -> pb.CancelResponse:
        runtime = await self._ready(context)
        task_id = request.task_id
        if not task_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_id: must not be empty")
        caller = self.security.identity.of_grpc(context)
        outcome = CancelOutcome.NOT_FOUND  # another owner's task answers as an unknown id: no oracle
        if may_see(self.security.owners.owner_of(task_id), caller):
            outcome = runtime.engine.cancel(task_id, CancelSource.RPC)
        if outcome is CancelOutcome.NOT_FOUND and is_task_id(task_id) and runtime.engine.accepting():
            # its Generate may still be on its way: applied if it registers in time (early_cancel.py)
            self.early_cancels.remember(task_id, caller.owner)
            log.info("cancel", task_id=task_id, outcome="pending", caller=caller.owner)
            return pb.CancelResponse(status=pb.CANCEL_STATUS_PENDING)
        log.info("cancel", task_id=task_id, outcome=outcome.value, caller=caller.owner)
        if outcome is CancelOutcome.NOT_FOUND:  # malformed, or nothing can register any more (draining)
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no task {task_id!r} is known to this server")
        status = pb.CANCEL_STATUS_CANCELLED if outcome is CancelOutcome.CANCELLED else pb.CANCEL_STATUS_ALREADY_FINISHED
        return pb.CancelResponse(status=status)

    # --- CacheStats ------------------------------------------------------------------------------

    async def CacheStats(
        self, request: pb.CacheStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CacheStatsResponse:
        runtime = await self._ready(context)
        stats = runtime.engine.stats()
        c = stats.counters
        caller = self.security.identity.of_grpc(context)
        owner_of = self.security.owners.owner_of
        return pb.CacheStatsResponse(
            slots=[
                pb.SlotStats(
                    index=s.index,
                    state=_SLOT_STATE[s.state],
                    task_id=s.task_id if may_see(owner_of(s.task_id), caller) else "",  # others: busy, no id
                    cached_tokens=s.cached_tokens,
                    checkpoints=[
                        pb.CheckpointInfo(
                            position=cp.position,
                            kind=_CHECKPOINT_KIND[cp.kind],
                            bytes=cp.nbytes,
                            has_logits=cp.has_logits,
                        )
                        for cp in s.checkpoints
                    ],
                )
                for s in stats.slots
            ],
            prefix_store=pb.PrefixStoreStats(
                entries=stats.store.entries, bytes=stats.store.nbytes, budget_bytes=stats.store.budget
            ),
            memory=pb.MemoryUsage(device_bytes=stats.memory.device_bytes, host_bytes=stats.memory.host_bytes),
            counters=pb.CacheCounters(
                prompt_tokens_received=c.prompt_tokens_received,
                prompt_tokens_reused=c.prompt_tokens_reused,
                prompt_tokens_processed=c.prompt_tokens_processed,
                restores=c.restores,
                full_reprocess_by_reason=c.full_reprocess_by_reason,
                checkpoints_created=c.checkpoints_created,
                checkpoints_evicted=c.checkpoints_evicted,
                checkpoints_invalidated=c.checkpoints_invalidated,
                prefix_store_hits=c.prefix_store_hits,
                prefix_store_misses=c.prefix_store_misses,
                reprocessed_tokens_by_reason=c.reprocessed_tokens_by_reason,
                prefix_store_evicted=c.prefix_store_evicted,
                replays=c.replays,
                replayed_tokens=c.replayed_tokens,
                input_blocks_evicted=c.input_blocks_evicted,
                tiers=[pb.TierCounters(tier=_TIER_PB[name], **asdict(t)) for name, t in c.tiers.items()],
            ),
        )

    # --- ModelInfo -------------------------------------------------------------------------------

    async def ModelInfo(self, request: pb.ModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfoResponse:
        runtime = await self._ready(context)
        return model_info(runtime)


def model_info(runtime: Runtime) -> pb.ModelInfoResponse:
    model, tok = runtime.model, runtime.model.tokenizer
    name: Any = model.gguf.metadata.get("general.name")
    eos = [tok.eos_id] if tok.eos_id is not None else []
    eos += sorted(t for t in tok.eog_ids if t != tok.eos_id)
    info = pb.ModelInfoResponse(
        model_path=model.path.name,  # the file name only: the server's directories are nobody's business
        model_name=name if isinstance(name, str) and name else model.path.name,
        architecture=str(model.gguf.architecture),
        vocab_size=tok.vocab_size,
        context_size=runtime.engine.config.n_ctx,
        n_ctx_train=int(model.arch.n_ctx_train),
        parallel_slots=runtime.engine.config.n_slots,
        eos_token_ids=eos,
        has_chat_template=runtime.has_chat_template,
        memory_kind=memory_kind(model.arch),
        server_version=hyserve.__version__,
        device=model.arch.ops.name,
        device_name=model.arch.ops.description,
        gpu_numerics=model.arch.ops.numerics,
    )
    if tok.bos_id is not None:
        info.bos_token_id = tok.bos_id
    return info
