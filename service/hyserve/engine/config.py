"""The engine's configuration (sizes and byte budgets; validated on construction)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hyserve.engine.resume_rates import PinnedRates
from hyserve.engine.speculative import SpecConfig
from hyserve.engine.store_tiers.shared import SharedTierConfig

__all__ = ["EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    n_slots: int = 1
    n_ctx: int = 4096  # per slot
    queue_size: int = 64  # waiting tasks (running ones not counted)
    prompt_chunk: int = 128  # token budget of one forward call (prompt chunks + decode tokens)
    ended_task_retention_s: float = 600.0  # how long a late Cancel still answers ALREADY_FINISHED
    ended_task_max: int = 100_000
    checkpoint_memory: int = 1 << 30  # bytes for all slots' checkpoints
    checkpoint_interval: int = 1024  # also checkpoint every this many tokens of a long prompt (0: off)
    cache_memory: int = 2 << 30  # bytes of the host-memory prefix store (0: off)
    replay_memory: int = 1 << 30  # bytes of kept per-token inputs of all slots, for exact resumes (0: off)
    cache_dir: str | None = None  # the prefix store's disk tier (None: off)
    cache_disk_bytes: int = 0  # byte budget of the disk tier's files (0: off)
    model_identity: str = ""  # names the model file and build in stored entries (store_tiers.format)
    shared_cache: SharedTierConfig | None = None  # the prefix store's shared tier on Redis (None: off)
    # a prompt resumes from the cheapest of a free slot and the store entries ("cheapest": reading
    # an entry is priced against evaluating the tokens it saves) or from the furthest ("furthest")
    resume_choice: str = "cheapest"
    resume_rates: PinnedRates | None = None  # the rates it prices with (None: measured as the engine runs)
    window_ring: bool = False  # sliding-window layers as ring buffers (with window checkpoints)
    max_queued_prompt_tokens: int = 0  # prompt tokens all waiting tasks may hold together (0: no limit)
    check_invariants: bool = False  # test hook: verify I1-I3 after every iteration (doubles the model work)
    # where grammar masks are computed: "background" (while the forward runs), "inline" (on the
    # engine thread), "auto" (background when the forward leaves a CPU idle: constraints.mask_mode)
    constraint_masks: str = "auto"
    # speculative decoding of every unconstrained task (method "off": plain decoding only)
    spec: SpecConfig = field(default_factory=lambda: SpecConfig(method="off"))

    def __post_init__(self) -> None:
        if self.n_slots < 1:
            raise ValueError("n_slots must be >= 1")
        if self.n_ctx < 2:
            raise ValueError("n_ctx must be >= 2")
        if self.queue_size < 0:
            raise ValueError("queue_size must be >= 0")
        if self.prompt_chunk < 1:
            raise ValueError("prompt_chunk must be >= 1")
        if min(self.checkpoint_memory, self.cache_memory, self.checkpoint_interval, self.replay_memory) < 0:
            raise ValueError("checkpoint_memory, cache_memory, checkpoint_interval and replay_memory must be >= 0")
        if self.cache_disk_bytes < 0:
            raise ValueError("cache_disk_bytes must be >= 0")
        if self.resume_choice not in ("cheapest", "furthest"):
            raise ValueError("resume_choice must be cheapest or furthest")
        if self.constraint_masks not in ("auto", "background", "inline"):
            raise ValueError("constraint_masks must be auto, background or inline")
