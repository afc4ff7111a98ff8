from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolChoiceMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_MODE_UNSPECIFIED: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_AUTO: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_NONE: _ClassVar[ToolChoiceMode]
    TOOL_CHOICE_MODE_REQUIRED: _ClassVar[ToolChoiceMode]

class StoreTier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STORE_TIER_UNSPECIFIED: _ClassVar[StoreTier]
    STORE_TIER_MEMORY: _ClassVar[StoreTier]
    STORE_TIER_DISK: _ClassVar[StoreTier]
    STORE_TIER_SHARED: _ClassVar[StoreTier]

class ReuseSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REUSE_SOURCE_UNSPECIFIED: _ClassVar[ReuseSource]
    REUSE_SOURCE_NONE: _ClassVar[ReuseSource]
    REUSE_SOURCE_SLOT_LIVE: _ClassVar[ReuseSource]
    REUSE_SOURCE_CHECKPOINT: _ClassVar[ReuseSource]
    REUSE_SOURCE_PREFIX_STORE: _ClassVar[ReuseSource]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_STOP_STRING: _ClassVar[FinishReason]
    FINISH_REASON_STOP_TOKEN: _ClassVar[FinishReason]
    FINISH_REASON_MAX_TOKENS: _ClassVar[FinishReason]
    FINISH_REASON_CONTEXT_FULL: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_TOOL_CALLS: _ClassVar[FinishReason]

class CancelStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCEL_STATUS_UNSPECIFIED: _ClassVar[CancelStatus]
    CANCEL_STATUS_CANCELLED: _ClassVar[CancelStatus]
    CANCEL_STATUS_ALREADY_FINISHED: _ClassVar[CancelStatus]
    CANCEL_STATUS_PENDING: _ClassVar[CancelStatus]

class SlotState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SLOT_STATE_UNSPECIFIED: _ClassVar[SlotState]
    SLOT_STATE_IDLE: _ClassVar[SlotState]
    SLOT_STATE_PROCESSING_PROMPT: _ClassVar[SlotState]
    SLOT_STATE_GENERATING: _ClassVar[SlotState]

class CheckpointKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKPOINT_KIND_UNSPECIFIED: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_MESSAGE_START: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_PROMPT_END: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_CLIENT_REQUESTED: _ClassVar[CheckpointKind]
    CHECKPOINT_KIND_INTERVAL: _ClassVar[CheckpointKind]

class MemoryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMORY_KIND_UNSPECIFIED: _ClassVar[MemoryKind]
    MEMORY_KIND_ATTENTION_ONLY: _ClassVar[MemoryKind]
    MEMORY_KIND_SLIDING_WINDOW: _ClassVar[MemoryKind]
    MEMORY_KIND_RECURRENT: _ClassVar[MemoryKind]
    MEMORY_KIND_HYBRID: _ClassVar[MemoryKind]
TOOL_CHOICE_MODE_UNSPECIFIED: ToolChoiceMode
TOOL_CHOICE_MODE_AUTO: ToolChoiceMode
TOOL_CHOICE_MODE_NONE: ToolChoiceMode
TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode
STORE_TIER_UNSPECIFIED: StoreTier
STORE_TIER_MEMORY: StoreTier
STORE_TIER_DISK: StoreTier
STORE_TIER_SHARED: StoreTier
REUSE_SOURCE_UNSPECIFIED: ReuseSource
REUSE_SOURCE_NONE: ReuseSource
REUSE_SOURCE_SLOT_LIVE: ReuseSource
REUSE_SOURCE_CHECKPOINT: ReuseSource
REUSE_SOURCE_PREFIX_STORE: ReuseSource
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_STOP_STRING: FinishReason
FINISH_REASON_STOP_TOKEN: FinishReason
FINISH_REASON_MAX_TOKENS: FinishReason
FINISH_REASON_CONTEXT_FULL: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_TOOL_CALLS: FinishReason
CANCEL_STATUS_UNSPECIFIED: CancelStatus
CANCEL_STATUS_CANCELLED: CancelStatus
CANCEL_STATUS_ALREADY_FINISHED: CancelStatus
CANCEL_STATUS_PENDING: CancelStatus
SLOT_STATE_UNSPECIFIED: SlotState
SLOT_STATE_IDLE: SlotState
SLOT_STATE_PROCESSING_PROMPT: SlotState
SLOT_STATE_GENERATING: SlotState
CHECKPOINT_KIND_UNSPECIFIED: CheckpointKind
CHECKPOINT_KIND_MESSAGE_START: CheckpointKind
CHECKPOINT_KIND_PROMPT_END: CheckpointKind
CHECKPOINT_KIND_CLIENT_REQUESTED: CheckpointKind
CHECKPOINT_KIND_INTERVAL: CheckpointKind
MEMORY_KIND_UNSPECIFIED: MemoryKind
MEMORY_KIND_ATTENTION_ONLY: MemoryKind
MEMORY_KIND_SLIDING_WINDOW: MemoryKind
MEMORY_KIND_RECURRENT: MemoryKind
MEMORY_KIND_HYBRID: MemoryKind

class GenerateRequest(_message.Message):
    __slots__ = ("task_id", "text", "tokens", "chat", "sampling", "stopping", "logprobs", "top_logprobs", "cache", "speculative")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    text: TextInput
    tokens: TokenInput
    chat: ChatInput
    sampling: SamplingParams
    stopping: StoppingCriteria
    logprobs: bool
    top_logprobs: int
    cache: CacheOptions
    speculative: SpeculativeOptions
    def __init__(self, task_id: _Optional[str] = ..., text: _Optional[_Union[TextInput, _Mapping]] = ..., tokens: _Optional[_Union[TokenInput, _Mapping]] = ..., chat: _Optional[_Union[ChatInput, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., stopping: _Optional[_Union[StoppingCriteria, _Mapping]] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ..., cache: _Optional[_Union[CacheOptions, _Mapping]] = ..., speculative: _Optional[_Union[SpeculativeOptions, _Mapping]] = ...) -> None: ...

class SpeculativeOptions(_message.Message):
    __slots__ = ("enabled", "max_draft")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    max_draft: int
    def __init__(self, enabled: _Optional[bool] = ..., max_draft: _Optional[int] = ...) -> None: ...

class TextInput(_message.Message):
    __slots__ = ("text", "add_special", "parse_special")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    PARSE_SPECIAL_FIELD_NUMBER: _ClassVar[int]
    text: str
    add_special: bool
    parse_special: bool
    def __init__(self, text: _Optional[str] = ..., add_special: _Optional[bool] = ..., parse_special: _Optional[bool] = ...) -> None: ...

class TokenInput(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatInput(_message.Message):
    __slots__ = ("messages", "add_generation_prompt", "chat_template_kwargs", "tools", "tool_choice", "parallel_tool_calls", "parse_output")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    PARSE_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    add_generation_prompt: bool
    chat_template_kwargs: _struct_pb2.Struct
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    parallel_tool_calls: bool
    parse_output: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., add_generation_prompt: _Optional[bool] = ..., chat_template_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., parse_output: _Optional[bool] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoiceMode
    function: str
    def __init__(self, mode: _Optional[_Union[ToolChoiceMode, str]] = ..., function: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "name", "reasoning_content", "tool_calls", "tool_call_id")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    reasoning_content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ..., reasoning_content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "constraint")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int
    constraint: Constraint
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "grammar")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    grammar: str
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., grammar: _Optional[str] = ...) -> None: ...

class StoppingCriteria(_message.Message):
    __slots__ = ("max_tokens", "stop_strings", "stop_token_ids", "ignore_eos")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_STRINGS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    stop_strings: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    def __init__(self, max_tokens: _Optional[int] = ..., stop_strings: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class CacheOptions(_message.Message):
    __slots__ = ("cache_prompt", "checkpoint_offsets")
    CACHE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    cache_prompt: bool
    checkpoint_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cache_prompt: _Optional[bool] = ..., checkpoint_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("accepted", "delta", "finished")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    accepted: Accepted
    delta: Delta
    finished: Finished
    def __init__(self, accepted: _Optional[_Union[Accepted, _Mapping]] = ..., delta: _Optional[_Union[Delta, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ...) -> None: ...

class Accepted(_message.Message):
    __slots__ = ("task_id", "slot_index", "prompt_tokens", "reused_tokens", "reuse_source", "matched_tokens", "reprocess_reason", "store_tier")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SLOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSE_SOURCE_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPROCESS_REASON_FIELD_NUMBER: _ClassVar[int]
    STORE_TIER_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    slot_index: int
    prompt_tokens: int
    reused_tokens: int
    reuse_source: ReuseSource
    matched_tokens: int
    reprocess_reason: str
    store_tier: StoreTier
    def __init__(self, task_id: _Optional[str] = ..., slot_index: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., reused_tokens: _Optional[int] = ..., reuse_source: _Optional[_Union[ReuseSource, str]] = ..., matched_tokens: _Optional[int] = ..., reprocess_reason: _Optional[str] = ..., store_tier: _Optional[_Union[StoreTier, str]] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("token_ids", "text", "logprobs", "reasoning", "tool_calls")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    reasoning: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., reasoning: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments_fragment")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FRAGMENT_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments_fragment: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_fragment: _Optional[str] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "piece", "top_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    piece: bytes
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., piece: _Optional[bytes] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "piece")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    piece: bytes
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., piece: _Optional[bytes] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("reason", "stop_string", "stop_token_id", "usage", "timings", "tool_calls")
    REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    reason: FinishReason
    stop_string: str
    stop_token_id: int
    usage: Usage
    timings: Timings
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, reason: _Optional[_Union[FinishReason, str]] = ..., stop_string: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "cached_prompt_tokens", "processed_prompt_tokens", "completion_tokens", "draft_tokens", "accepted_draft_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROCESSED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    cached_prompt_tokens: int
    processed_prompt_tokens: int
    completion_tokens: int
    draft_tokens: int
    accepted_draft_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., processed_prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., draft_tokens: _Optional[int] = ..., accepted_draft_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "prompt_ms", "generation_ms", "time_to_first_token_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_MS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_MS_FIELD_NUMBER: _ClassVar[int]
    TIME_TO_FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    prompt_ms: float
    generation_ms: float
    time_to_first_token_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., prompt_ms: _Optional[float] = ..., generation_ms: _Optional[float] = ..., time_to_first_token_ms: _Optional[float] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("status",)
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: CancelStatus
    def __init__(self, status: _Optional[_Union[CancelStatus, str]] = ...) -> None: ...

class CacheStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CacheStatsResponse(_message.Message):
    __slots__ = ("slots", "prefix_store", "counters", "memory")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_STORE_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedCompositeFieldContainer[SlotStats]
    prefix_store: PrefixStoreStats
    counters: CacheCounters
    memory: MemoryUsage
    def __init__(self, slots: _Optional[_Iterable[_Union[SlotStats, _Mapping]]] = ..., prefix_store: _Optional[_Union[PrefixStoreStats, _Mapping]] = ..., counters: _Optional[_Union[CacheCounters, _Mapping]] = ..., memory: _Optional[_Union[MemoryUsage, _Mapping]] = ...) -> None: ...

class MemoryUsage(_message.Message):
    __slots__ = ("device_bytes", "host_bytes")
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    device_bytes: int
    host_bytes: int
    def __init__(self, device_bytes: _Optional[int] = ..., host_bytes: _Optional[int] = ...) -> None: ...

class SlotStats(_message.Message):
    __slots__ = ("index", "state", "task_id", "cached_tokens", "checkpoints")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    state: SlotState
    task_id: str
    cached_tokens: int
    checkpoints: _containers.RepeatedCompositeFieldContainer[CheckpointInfo]
    def __init__(self, index: _Optional[int] = ..., state: _Optional[_Union[SlotState, str]] = ..., task_id: _Optional[str] = ..., cached_tokens: _Optional[int] = ..., checkpoints: _Optional[_Iterable[_Union[CheckpointInfo, _Mapping]]] = ...) -> None: ...

class CheckpointInfo(_message.Message):
    __slots__ = ("position", "kind", "bytes", "has_logits")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HAS_LOGITS_FIELD_NUMBER: _ClassVar[int]
    position: int
    kind: CheckpointKind
    bytes: int
    has_logits: bool
    def __init__(self, position: _Optional[int] = ..., kind: _Optional[_Union[CheckpointKind, str]] = ..., bytes: _Optional[int] = ..., has_logits: _Optional[bool] = ...) -> None: ...

class PrefixStoreStats(_message.Message):
    __slots__ = ("entries", "bytes", "budget_bytes")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    entries: int
    bytes: int
    budget_bytes: int
    def __init__(self, entries: _Optional[int] = ..., bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ...) -> None: ...

class CacheCounters(_message.Message):
    __slots__ = ("prompt_tokens_received", "prompt_tokens_reused", "prompt_tokens_processed", "restores", "full_reprocess_by_reason", "checkpoints_created", "checkpoints_evicted", "checkpoints_invalidated", "prefix_store_hits", "prefix_store_misses", "reprocessed_tokens_by_reason", "prefix_store_evicted", "replays", "replayed_tokens", "input_blocks_evicted", "tiers")
    class FullReprocessByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ReprocessedTokensByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PROMPT_TOKENS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_REUSED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_PROCESSED_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FIELD_NUMBER: _ClassVar[int]
    FULL_REPROCESS_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_CREATED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_EVICTED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_INVALIDATED_FIELD_NUMBER: _ClassVar[int]
    PREFIX_STORE_HITS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_STORE_MISSES_FIELD_NUMBER: _ClassVar[int]
    REPROCESSED_TOKENS_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    PREFIX_STORE_EVICTED_FIELD_NUMBER: _ClassVar[int]
    REPLAYS_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INPUT_BLOCKS_EVICTED_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens_received: int
    prompt_tokens_reused: int
    prompt_tokens_processed: int
    restores: int
    full_reprocess_by_reason: _containers.ScalarMap[str, int]
    checkpoints_created: int
    checkpoints_evicted: int
    checkpoints_invalidated: int
    prefix_store_hits: int
    prefix_store_misses: int
    reprocessed_tokens_by_reason: _containers.ScalarMap[str, int]
    prefix_store_evicted: int
    replays: int
    replayed_tokens: int
    input_blocks_evicted: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierCounters]
    def __init__(self, prompt_tokens_received: _Optional[int] = ..., prompt_tokens_reused: _Optional[int] = ..., prompt_tokens_processed: _Optional[int] = ..., restores: _Optional[int] = ..., full_reprocess_by_reason: _Optional[_Mapping[str, int]] = ..., checkpoints_created: _Optional[int] = ..., checkpoints_evicted: _Optional[int] = ..., checkpoints_invalidated: _Optional[int] = ..., prefix_store_hits: _Optional[int] = ..., prefix_store_misses: _Optional[int] = ..., reprocessed_tokens_by_reason: _Optional[_Mapping[str, int]] = ..., prefix_store_evicted: _Optional[int] = ..., replays: _Optional[int] = ..., replayed_tokens: _Optional[int] = ..., input_blocks_evicted: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierCounters, _Mapping]]] = ...) -> None: ...

class TierCounters(_message.Message):
    __slots__ = ("tier", "hits", "misses", "writes", "bytes_read", "bytes_written", "errors", "dropped", "read_seconds", "passed_over")
    TIER_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    READ_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PASSED_OVER_FIELD_NUMBER: _ClassVar[int]
    tier: StoreTier
    hits: int
    misses: int
    writes: int
    bytes_read: int
    bytes_written: int
    errors: int
    dropped: int
    read_seconds: float
    passed_over: int
    def __init__(self, tier: _Optional[_Union[StoreTier, str]] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., writes: _Optional[int] = ..., bytes_read: _Optional[int] = ..., bytes_written: _Optional[int] = ..., errors: _Optional[int] = ..., dropped: _Optional[int] = ..., read_seconds: _Optional[float] = ..., passed_over: _Optional[int] = ...) -> None: ...

class ModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfoResponse(_message.Message):
    __slots__ = ("model_path", "model_name", "architecture", "vocab_size", "context_size", "n_ctx_train", "parallel_slots", "bos_token_id", "eos_token_ids", "has_chat_template", "memory_kind", "server_version", "device", "device_name", "gpu_numerics")
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SIZE_FIELD_NUMBER: _ClassVar[int]
    N_CTX_TRAIN_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_SLOTS_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    HAS_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_KIND_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_NUMERICS_FIELD_NUMBER: _ClassVar[int]
    model_path: str
    model_name: str
    architecture: str
    vocab_size: int
    context_size: int
    n_ctx_train: int
    parallel_slots: int
    bos_token_id: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    has_chat_template: bool
    memory_kind: MemoryKind
    server_version: str
    device: str
    device_name: str
    gpu_numerics: str
    def __init__(self, model_path: _Optional[str] = ..., model_name: _Optional[str] = ..., architecture: _Optional[str] = ..., vocab_size: _Optional[int] = ..., context_size: _Optional[int] = ..., n_ctx_train: _Optional[int] = ..., parallel_slots: _Optional[int] = ..., bos_token_id: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., has_chat_template: _Optional[bool] = ..., memory_kind: _Optional[_Union[MemoryKind, str]] = ..., server_version: _Optional[str] = ..., device: _Optional[str] = ..., device_name: _Optional[str] = ..., gpu_numerics: _Optional[str] = ...) -> None: ...
