"""Typed, immutable views of the hyserve.v1 messages the client returns.

Field names match the proto (proto/hyserve/v1/hyserve.proto), which documents each one. Enum values
are lower-case strings of the proto value names without their prefix (FINISH_REASON_EOS -> "eos"); a
value this client does not know yet reads as UNSPECIFIED.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from hyserve_client._gen import hyserve_pb2 as pb
from hyserve_client.tools import ToolCall, ToolCallDelta

__all__ = [
    "Accepted",
    "CacheCounters",
    "CacheStats",
    "CancelStatus",
    "CheckpointInfo",
    "CheckpointKind",
    "Delta",
    "Event",
    "FinishReason",
    "Finished",
    "MemoryKind",
    "MemoryUsage",
    "ModelInfo",
    "PrefixStoreStats",
    "ReuseSource",
    "SlotState",
    "SlotStats",
    "StoreTier",
    "TierCounters",
    "Timings",
    "TokenLogprob",
    "ToolCall",
    "ToolCallDelta",
    "TopLogprob",
    "Usage",
    "enum_from_proto",
    "event_from_proto",
]


class ReuseSource(StrEnum):
    """Where the reused prompt state came from (proto ReuseSource)."""

    UNSPECIFIED = "unspecified"
    NONE = "none"
    SLOT_LIVE = "slot_live"
    CHECKPOINT = "checkpoint"
    PREFIX_STORE = "prefix_store"


class StoreTier(StrEnum):
    """The prefix-store tier a resume's entry came from (proto StoreTier)."""

    UNSPECIFIED = "unspecified"
    MEMORY = "memory"
    DISK = "disk"
    SHARED = "shared"


class FinishReason(StrEnum):
    """Why generation ended (proto FinishReason)."""

    UNSPECIFIED = "unspecified"
    EOS = "eos"
    STOP_STRING = "stop_string"
    STOP_TOKEN = "stop_token"
    MAX_TOKENS = "max_tokens"
    CONTEXT_FULL = "context_full"
    CANCELLED = "cancelled"
    TOOL_CALLS = "tool_calls"  # the answer is the calls in Finished.tool_calls


class CancelStatus(StrEnum):
    """Outcome of a Cancel (proto CancelStatus)."""

    UNSPECIFIED = "unspecified"
    CANCELLED = "cancelled"
    ALREADY_FINISHED = "already_finished"
    PENDING = "pending"  # no such task yet: remembered, and applied if it registers within 10 s


class SlotState(StrEnum):
    """What a slot is doing (proto SlotState)."""

    UNSPECIFIED = "unspecified"
    IDLE = "idle"
    PROCESSING_PROMPT = "processing_prompt"
    GENERATING = "generating"


class CheckpointKind(StrEnum):
    """Why a checkpoint was taken (proto CheckpointKind)."""

    UNSPECIFIED = "unspecified"
    MESSAGE_START = "message_start"
    PROMPT_END = "prompt_end"
    CLIENT_REQUESTED = "client_requested"
    INTERVAL = "interval"


class MemoryKind(StrEnum):
    """Kind of per-sequence memory of the model (proto MemoryKind)."""

    UNSPECIFIED = "unspecified"
    ATTENTION_ONLY = "attention_only"
    SLIDING_WINDOW = "sliding_window"
    RECURRENT = "recurrent"
    HYBRID = "hybrid"


_E = TypeVar("_E", bound=StrEnum)

# Python enum -> proto enum; proto value names are the Python member names behind a common prefix.
_PROTO_ENUMS: dict[type[StrEnum], Any] = {
    ReuseSource: pb.ReuseSource,
    FinishReason: pb.FinishReason,
    CancelStatus: pb.CancelStatus,
    SlotState: pb.SlotState,
    CheckpointKind: pb.CheckpointKind,
    MemoryKind: pb.MemoryKind,
    StoreTier: pb.StoreTier,
}


def enum_from_proto(cls: type[_E], value: int) -> _E:
    """Map a proto enum number to the Python enum `cls`; unknown numbers give UNSPECIFIED."""
    wrapper = _PROTO_ENUMS[cls]
    prefix = wrapper.DESCRIPTOR.values[0].name.removesuffix("UNSPECIFIED")
    try:
        name = wrapper.Name(value)
    except ValueError:
        return cls["UNSPECIFIED"]
    member = name.removeprefix(prefix)
    return cls[member] if member in cls.__members__ else cls["UNSPECIFIED"]


@dataclass(frozen=True, slots=True)
class Accepted:
    """First event of a stream: the task got a slot; how much of its prompt came from the cache."""

    task_id: str
    slot_index: int
    prompt_tokens: int
    reused_tokens: int
    reuse_source: ReuseSource
    matched_tokens: int
    reprocess_reason: str = ""  # why matched tokens were evaluated again (empty: they were not)
    store_tier: StoreTier = StoreTier.UNSPECIFIED  # with PREFIX_STORE: the tier the entry came from

    @classmethod
    def from_proto(cls, m: pb.Accepted) -> Accepted:
        return cls(
            task_id=m.task_id,
            slot_index=m.slot_index,
            prompt_tokens=m.prompt_tokens,
            reused_tokens=m.reused_tokens,
            reuse_source=enum_from_proto(ReuseSource, m.reuse_source),
            matched_tokens=m.matched_tokens,
            reprocess_reason=m.reprocess_reason,
            store_tier=enum_from_proto(StoreTier, m.store_tier),
        )


@dataclass(frozen=True, slots=True)
class TopLogprob:
    """One alternative token at a position."""

    token_id: int
    logprob: float
    piece: bytes

    @classmethod
    def from_proto(cls, m: pb.TopLogprob) -> TopLogprob:
        return cls(token_id=m.token_id, logprob=m.logprob, piece=m.piece)


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """Log-probability of a sampled token, with the most likely alternatives when asked for."""

    token_id: int
    logprob: float
    piece: bytes
    top_logprobs: tuple[TopLogprob, ...] = ()

    @classmethod
    def from_proto(cls, m: pb.TokenLogprob) -> TokenLogprob:
        return cls(
            token_id=m.token_id,
            logprob=m.logprob,
            piece=m.piece,
            top_logprobs=tuple(TopLogprob.from_proto(t) for t in m.top_logprobs),
        )


@dataclass(frozen=True, slots=True)
class Delta:
    """New tokens and the text they completed (text may lag the tokens; see the proto).

    With chat input and parse_output (the default), reasoning and tool calls are split out of `text`
    into `reasoning` and `tool_calls`.
    """

    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()

    @classmethod
    def from_proto(cls, m: pb.Delta) -> Delta:
        return cls(
            token_ids=tuple(m.token_ids),
            text=m.text,
            logprobs=tuple(TokenLogprob.from_proto(t) for t in m.logprobs),
            reasoning=m.reasoning,
            tool_calls=tuple(ToolCallDelta.from_proto(t) for t in m.tool_calls),
        )


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one task."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    processed_prompt_tokens: int = 0
    completion_tokens: int = 0
    draft_tokens: int = 0  # speculative decoding: tokens drafted, and those the model agreed with
    accepted_draft_tokens: int = 0

    @classmethod
    def from_proto(cls, m: pb.Usage) -> Usage:
        return cls(
            prompt_tokens=m.prompt_tokens,
            cached_prompt_tokens=m.cached_prompt_tokens,
            processed_prompt_tokens=m.processed_prompt_tokens,
            completion_tokens=m.completion_tokens,
            draft_tokens=m.draft_tokens,
            accepted_draft_tokens=m.accepted_draft_tokens,
        )


@dataclass(frozen=True, slots=True)
class Timings:
    """Wall-clock durations of one task, in milliseconds."""

    queue_ms: float = 0.0
    prompt_ms: float = 0.0
    generation_ms: float = 0.0
    time_to_first_token_ms: float = 0.0

    @classmethod
    def from_proto(cls, m: pb.Timings) -> Timings:
        return cls(
            queue_ms=m.queue_ms,
            prompt_ms=m.prompt_ms,
            generation_ms=m.generation_ms,
            time_to_first_token_ms=m.time_to_first_token_ms,
        )


@dataclass(frozen=True, slots=True)
class Finished:
    """Last event of a stream: why the task ended, its token counts and timings, the tool calls made."""

    reason: FinishReason
    stop_string: str = ""
    stop_token_id: int | None = None
    usage: Usage = field(default_factory=Usage)
    timings: Timings = field(default_factory=Timings)
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def from_proto(cls, m: pb.Finished) -> Finished:
        return cls(
            reason=enum_from_proto(FinishReason, m.reason),
            stop_string=m.stop_string,
            stop_token_id=m.stop_token_id if m.HasField("stop_token_id") else None,
            usage=Usage.from_proto(m.usage),
            timings=Timings.from_proto(m.timings),
            tool_calls=tuple(ToolCall.from_proto(c) for c in m.tool_calls),
        )


Event = Accepted | Delta | Finished


def event_from_proto(m: pb.GenerateResponse) -> Event | None:
    """The typed event of one GenerateResponse; None for an event kind this client does not know."""
    kind = m.WhichOneof("event")
    if kind == "accepted":
        return Accepted.from_proto(m.accepted)
    if kind == "delta":
        return Delta.from_proto(m.delta)
    if kind == "finished":
        return Finished.from_proto(m.finished)
    return None


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A saved copy of a slot's non-truncatable state after `position` tokens."""

    position: int
    kind: CheckpointKind
    bytes: int
    has_logits: bool

    @classmethod
    def from_proto(cls, m: pb.CheckpointInfo) -> CheckpointInfo:
        return cls(
            position=m.position,
            kind=enum_from_proto(CheckpointKind, m.kind),
            bytes=m.bytes,
            has_logits=m.has_logits,
        )


@dataclass(frozen=True, slots=True)
class SlotStats:
    """One slot: its state, task and cached tokens."""

    index: int
    state: SlotState
    task_id: str
    cached_tokens: int
    checkpoints: tuple[CheckpointInfo, ...] = ()

    @classmethod
    def from_proto(cls, m: pb.SlotStats) -> SlotStats:
        return cls(
            index=m.index,
            state=enum_from_proto(SlotState, m.state),
            task_id=m.task_id,
            cached_tokens=m.cached_tokens,
            checkpoints=tuple(CheckpointInfo.from_proto(c) for c in m.checkpoints),
        )


@dataclass(frozen=True, slots=True)
class PrefixStoreStats:
    """The shared host-memory prefix store."""

    entries: int = 0
    bytes: int = 0
    budget_bytes: int = 0

    @classmethod
    def from_proto(cls, m: pb.PrefixStoreStats) -> PrefixStoreStats:
        return cls(entries=m.entries, bytes=m.bytes, budget_bytes=m.budget_bytes)


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """Bytes the slots and the prompt cache hold: on the GPU device, and in host memory."""

    device_bytes: int = 0
    host_bytes: int = 0

    @classmethod
    def from_proto(cls, m: pb.MemoryUsage) -> MemoryUsage:
        return cls(device_bytes=m.device_bytes, host_bytes=m.host_bytes)


@dataclass(frozen=True, slots=True)
class TierCounters:
    """Cumulative counters of one prefix-store tier."""

    tier: StoreTier = StoreTier.UNSPECIFIED
    hits: int = 0
    misses: int = 0
    writes: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    errors: int = 0
    dropped: int = 0
    read_seconds: float = 0.0

    @classmethod
    def from_proto(cls, m: pb.TierCounters) -> TierCounters:
        return cls(
            tier=enum_from_proto(StoreTier, m.tier),
            hits=m.hits,
            misses=m.misses,
            writes=m.writes,
            bytes_read=m.bytes_read,
            bytes_written=m.bytes_written,
            errors=m.errors,
            dropped=m.dropped,
            read_seconds=m.read_seconds,
        )


@dataclass(frozen=True, slots=True)
class CacheCounters:
    """Cumulative cache counters since the server started."""

    prompt_tokens_received: int = 0
    prompt_tokens_reused: int = 0
    prompt_tokens_processed: int = 0
    restores: int = 0
    full_reprocess_by_reason: dict[str, int] = field(default_factory=dict)
    checkpoints_created: int = 0
    checkpoints_evicted: int = 0
    checkpoints_invalidated: int = 0
    prefix_store_hits: int = 0
    prefix_store_misses: int = 0
    reprocessed_tokens_by_reason: dict[str, int] = field(default_factory=dict)
    prefix_store_evicted: int = 0
    replays: int = 0
    replayed_tokens: int = 0
    input_blocks_evicted: int = 0
    tiers: tuple[TierCounters, ...] = ()

    @classmethod
    def from_proto(cls, m: pb.CacheCounters) -> CacheCounters:
        return cls(
            prompt_tokens_received=m.prompt_tokens_received,
            prompt_tokens_reused=m.prompt_tokens_reused,
            prompt_tokens_processed=m.prompt_tokens_processed,
            restores=m.restores,
            full_reprocess_by_reason=dict(sorted(m.full_reprocess_by_reason.items())),
            checkpoints_created=m.checkpoints_created,
            checkpoints_evicted=m.checkpoints_evicted,
            checkpoints_invalidated=m.checkpoints_invalidated,
            prefix_store_hits=m.prefix_store_hits,
            prefix_store_misses=m.prefix_store_misses,
            reprocessed_tokens_by_reason=dict(sorted(m.reprocessed_tokens_by_reason.items())),
            prefix_store_evicted=m.prefix_store_evicted,
            replays=m.replays,
            replayed_tokens=m.replayed_tokens,
            input_blocks_evicted=m.input_blocks_evicted,
            tiers=tuple(TierCounters.from_proto(t) for t in m.tiers),
        )


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the prompt cache (CacheStatsResponse)."""

    slots: tuple[SlotStats, ...]
    prefix_store: PrefixStoreStats
    counters: CacheCounters
    memory: MemoryUsage

    @classmethod
    def from_proto(cls, m: pb.CacheStatsResponse) -> CacheStats:
        return cls(
            slots=tuple(SlotStats.from_proto(s) for s in m.slots),
            prefix_store=PrefixStoreStats.from_proto(m.prefix_store),
            counters=CacheCounters.from_proto(m.counters),
            memory=MemoryUsage.from_proto(m.memory),
        )


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """The loaded model and the server (ModelInfoResponse)."""

    model_path: str
    model_name: str
    architecture: str
    vocab_size: int
    context_size: int
    n_ctx_train: int
    parallel_slots: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    has_chat_template: bool
    memory_kind: MemoryKind
    server_version: str
    device: str  # "cpu" or "gpu"
    device_name: str
    gpu_numerics: str  # "fast" or "exact" on a GPU, "" on the CPU

    @classmethod
    def from_proto(cls, m: pb.ModelInfoResponse) -> ModelInfo:
        return cls(
            model_path=m.model_path,
            model_name=m.model_name,
            architecture=m.architecture,
            vocab_size=m.vocab_size,
            context_size=m.context_size,
            n_ctx_train=m.n_ctx_train,
            parallel_slots=m.parallel_slots,
            bos_token_id=m.bos_token_id if m.HasField("bos_token_id") else None,
            eos_token_ids=tuple(m.eos_token_ids),
            has_chat_template=m.has_chat_template,
            memory_kind=enum_from_proto(MemoryKind, m.memory_kind),
            server_version=m.server_version,
            device=m.device,
            device_name=m.device_name,
            gpu_numerics=m.gpu_numerics,
        )
