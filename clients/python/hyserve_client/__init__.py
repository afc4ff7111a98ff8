"""Typed Python client for the hyserve gRPC API (hyserve.v1).

Blocking: `HyserveClient`; asyncio: `AsyncHyserveClient`. Generate streams typed events
(`Accepted`, then `Delta`..., then `Finished`); errors are raised as `HyserveError`. The command line
is `python -m hyserve_client` (see hyserve_client.cli). The protobuf/gRPC code generated from
proto/hyserve/v1 is vendored under hyserve_client._gen.
"""

from hyserve_client._version import __version__
from hyserve_client.client import (
    DEFAULT_MAX_MESSAGE_BYTES,
    SESSION_HEADER,
    UNSET,
    AsyncGenerateStream,
    AsyncHyserveClient,
    GenerateStream,
    HyserveClient,
    HyserveError,
    channel_options,
)
from hyserve_client.requests import GenerateParams, Message, build_generate_request
from hyserve_client.security import tls_credentials
from hyserve_client.tools import Tool, ToolCall, ToolCallDelta, ToolChoiceSpec
from hyserve_client.types import (
    Accepted,
    CacheCounters,
    CacheStats,
    CancelStatus,
    CheckpointInfo,
    CheckpointKind,
    Delta,
    Event,
    Finished,
    FinishReason,
    MemoryKind,
    MemoryUsage,
    ModelInfo,
    PrefixStoreStats,
    ReuseSource,
    SlotState,
    SlotStats,
    StoreTier,
    TierCounters,
    Timings,
    TokenLogprob,
    TopLogprob,
    Usage,
)

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "SESSION_HEADER",
    "UNSET",
    "Accepted",
    "AsyncGenerateStream",
    "AsyncHyserveClient",
    "CacheCounters",
    "CacheStats",
    "CancelStatus",
    "CheckpointInfo",
    "CheckpointKind",
    "Delta",
    "Event",
    "FinishReason",
    "Finished",
    "GenerateParams",
    "GenerateStream",
    "HyserveClient",
    "HyserveError",
    "MemoryKind",
    "MemoryUsage",
    "Message",
    "ModelInfo",
    "PrefixStoreStats",
    "ReuseSource",
    "SlotState",
    "SlotStats",
    "StoreTier",
    "TierCounters",
    "Timings",
    "TokenLogprob",
    "Tool",
    "ToolCall",
    "ToolCallDelta",
    "ToolChoiceSpec",
    "TopLogprob",
    "Usage",
    "__version__",
    "build_generate_request",
    "channel_options",
    "tls_credentials",
]
