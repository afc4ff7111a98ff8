"""The CacheStats numbers on a Prometheus endpoint (`hyserve serve --metrics-port N`).

A custom collector reads one `Engine.stats()` snapshot per scrape, so the endpoint and the
CacheStats RPC always agree. Names follow the vLLM/GIE conventions where one exists
(`..._num_requests_running`, `..._num_requests_waiting`, `..._kv_cache_usage_perc`). The gauges a
router scrapes (ROUTER_GAUGES) carry `model_name` and `replica` labels, as vLLM's carry `model_name`;
`hyserve_replica_info` states the replica's identity and shape once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hyserve.api.metrics_http import MetricsEndpoint, WsgiApp, start_metrics_endpoint
from hyserve.api.tasks import replica_name
from hyserve.engine.cache_plan import ResumeCosts
from hyserve.engine.engine import EngineStats, SlotState

if TYPE_CHECKING:
    from hyserve.api.security import Security

__all__ = [
    "ROUTER_GAUGES",
    "SPEC_COUNTERS",
    "ReplicaIdentity",
    "StatsCollector",
    "prompt_cache_hit_ratio",
    "serve_metrics",
]

PREFIX = "hyserve"
# name -> the vLLM metric with the same semantics (what a router's flags point at)
ROUTER_GAUGES = {
    f"{PREFIX}_num_requests_waiting": "vllm:num_requests_waiting",
    f"{PREFIX}_num_requests_running": "vllm:num_requests_running",
    f"{PREFIX}_kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
    f"{PREFIX}_prompt_cache_hit_ratio": "sglang:cache_hit_rate",
}
# speculative decoding's counters -> vLLM's counters of the same meaning
SPEC_COUNTERS = {
    f"{PREFIX}_spec_decode_num_drafts": "vllm:spec_decode_num_drafts",
    f"{PREFIX}_spec_decode_num_draft_tokens": "vllm:spec_decode_num_draft_tokens",
    f"{PREFIX}_spec_decode_num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}


@dataclass(frozen=True)
class ReplicaIdentity:
    replica: str
    model_name: str
    n_slots: int

    @classmethod
    def of(cls, replica_id: str | None, model_name: str, n_slots: int) -> ReplicaIdentity:
        return cls(replica_name(replica_id), model_name, n_slots)


def prompt_cache_hit_ratio(received: int, reused: int) -> float:
    """Share of all prompt tokens received whose state came from the cache (0 before any request)."""
    return reused / received if received else 0.0


class StatsCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats], n_ctx: int, identity: ReplicaIdentity | None = None) -> None:
        self._stats = stats
        self._n_ctx = n_ctx
        self._identity = identity or ReplicaIdentity.of(None, "", 0)

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        c = s.counters
        me = self._identity

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        def router_gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["model_name", "replica"])
            family.add_metric([me.model_name, me.replica], value)
            return family

        info = GaugeMetricFamily(
            f"{PREFIX}_replica_info",
            "This replica: name, model, slots, context per slot.",
            labels=["replica", "model_name", "n_slots", "n_ctx"],
        )
        info.add_metric([me.replica, me.model_name, str(me.n_slots), str(self._n_ctx)], 1)
        yield info
        running = sum(1 for slot in s.slots if slot.state is not SlotState.IDLE)
        yield router_gauge("num_requests_running", "Tasks holding a slot.", running)
        yield router_gauge("num_requests_waiting", "Tasks waiting in the queue.", s.queued)
        cached = sum(slot.cached_tokens for slot in s.slots)
        usage = cached / max(1, len(s.slots) * self._n_ctx)
        yield router_gauge("kv_cache_usage_perc", "Slot memory in use, 0-1.", usage)
        ratio = prompt_cache_hit_ratio(c.prompt_tokens_received, c.prompt_tokens_reused)
        yield router_gauge("prompt_cache_hit_ratio", "Prompt tokens reused / received since start, 0-1.", ratio)
        per_slot = GaugeMetricFamily(f"{PREFIX}_slot_cached_tokens", "Tokens in a slot's memory.", labels=["slot"])
        cps = GaugeMetricFamily(f"{PREFIX}_slot_checkpoints", "Checkpoints a slot holds.", labels=["slot"])
        cp_bytes = GaugeMetricFamily(
            f"{PREFIX}_slot_checkpoint_bytes", "Bytes of a slot's checkpoints.", labels=["slot"]
        )
        for slot in s.slots:
            per_slot.add_metric([str(slot.index)], slot.cached_tokens)
            cps.add_metric([str(slot.index)], len(slot.checkpoints))
            cp_bytes.add_metric([str(slot.index)], sum(cp.nbytes for cp in slot.checkpoints))
        yield per_slot
        yield cps
        yield cp_bytes
        yield counter("prompt_tokens_received", "Prompt tokens of admitted tasks.", c.prompt_tokens_received)
        yield counter("prompt_tokens_reused", "Prompt tokens whose state came from the cache.", c.prompt_tokens_reused)
        yield counter("prompt_tokens_processed", "Prompt tokens evaluated by the model.", c.prompt_tokens_processed)
        yield counter("cache_restores", "Checkpoints or store entries restored into a slot.", c.restores)
        full = CounterMetricFamily(f"{PREFIX}_full_reprocess", "Prompts evaluated from scratch.", labels=["reason"])
        for reason, n in sorted(c.full_reprocess_by_reason.items()):
            full.add_metric([reason], n)
        yield full
        again = CounterMetricFamily(
            f"{PREFIX}_reprocessed_tokens", "Cached prompt tokens evaluated again.", labels=["reason"]
        )
        for reason, n in sorted(c.reprocessed_tokens_by_reason.items()):
            again.add_metric([reason], n)
        yield again
        yield counter("checkpoints_created", "Checkpoints created.", c.checkpoints_created)
        yield counter("checkpoints_evicted", "Checkpoints dropped for the byte budget.", c.checkpoints_evicted)
        yield counter(
            "checkpoints_invalidated", "Checkpoints that stopped describing a prefix.", c.checkpoints_invalidated
        )
        yield gauge("prefix_store_entries", "Entries in the prefix store.", s.store.entries)
        yield gauge("prefix_store_bytes", "Bytes used by the prefix store.", s.store.nbytes)
        yield gauge("prefix_store_budget_bytes", "Byte budget of the prefix store.", s.store.budget)
        yield counter("prefix_store_hits", "Store lookups that found a usable entry.", c.prefix_store_hits)
        yield counter("prefix_store_misses", "Store lookups that found nothing usable.", c.prefix_store_misses)
        yield counter("prefix_store_evicted", "Store entries dropped for the byte budget.", c.prefix_store_evicted)
        yield counter("disk_cache_hits", "Disk-tier entries restored into a slot.", c.disk_cache_hits)
        yield counter("disk_cache_writes", "Entries written to the disk tier.", c.disk_cache_writes)
        yield counter(
            "disk_cache_evicted", "Disk-tier files deleted for the byte budget or subsumed.", c.disk_cache_evicted
        )
        yield counter(
            "disk_cache_rejected",
            "Disk-tier files skipped: corrupt, truncated, another format version or another model.",
            c.disk_cache_rejected,
        )
        # per tier of the prefix store: hyserve_store_tier_hits_total{tier="shared"} and so on
        for what, doc in (
            ("hits", "Entries restored into a slot from this prefix-store tier."),
            ("misses", "Lookups or loads that found nothing usable in this tier."),
            ("writes", "Entries written to this tier."),
            ("bytes_read", "Bytes read from this tier."),
            ("bytes_written", "Bytes written to this tier."),
            ("errors", "Tier failures (unreachable, timed out, full, rejected entries); no request fails."),
            ("dropped", "Entries not written because the tier's writer was behind."),
            ("read_seconds", "Seconds spent reading this tier: lookups, loads and restores into slots."),
            ("passed_over", "Entries of this tier not taken: reading them cost more than the prefill they save."),
        ):
            family = CounterMetricFamily(f"{PREFIX}_store_tier_{what}", doc, labels=["tier"])
            for tier, counts in c.tiers.items():
                family.add_metric([tier], getattr(counts, what))
            yield family
        yield from resume_cost_gauges(s.resume_costs)
        yield counter("cache_replays", "Resumes that replayed kept per-token inputs.", c.replays)
        yield counter("cache_replayed_tokens", "Positions reached by replays (no forward pass).", c.replayed_tokens)
        yield counter(
            "input_blocks_evicted", "Blocks of kept per-token inputs dropped for the budget.", c.input_blocks_evicted
        )
        # speculative decoding (--spec), as vLLM's spec_decode counters
        yield counter("spec_decode_num_drafts", "Drafts verified (one multi-token row each).", c.spec_drafts)
        yield counter("spec_decode_num_draft_tokens", "Tokens drafted.", c.spec_draft_tokens)
        yield counter(
            "spec_decode_num_accepted_tokens",
            "Drafted tokens accepted: the model sampled them.",
            c.spec_accepted_tokens,
        )
        # only with --check-invariants (a test hook): both stay 0 otherwise
        yield counter("invariant_checks", "Slot/entry checks of the cache invariants I1-I3.", c.invariant_checks)
        yield counter("invariant_violations", "Cache invariant violations found.", c.invariant_violations)


def resume_cost_gauges(costs: ResumeCosts | None) -> Iterator[Metric]:
    """The rates the admission plan prices resumes with (pinned, or measured as the server runs:
    what an operator would pin with --cache-resume-rates); no samples while it takes the
    furthest resume."""
    prefill = GaugeMetricFamily(
        f"{PREFIX}_resume_prefill_seconds_per_token", "Seconds per prompt token evaluated, as resumes are priced."
    )
    read = GaugeMetricFamily(
        f"{PREFIX}_resume_read_seconds_per_byte",
        "Seconds per byte of a prefix-store entry read and restored into a slot, as resumes are priced.",
        labels=["tier"],
    )
    if costs is not None:
        prefill.add_metric([], costs.prefill_s_per_token)
        for tier, rate in sorted(costs.read_s_per_byte.items()):
            read.add_metric([tier], rate)
    yield prefill
    yield read


def serve_metrics(
    stats: Callable[[], EngineStats],
    n_ctx: int,
    host: str,
    port: int,
    identity: ReplicaIdentity | None = None,
    security: Security | None = None,
) -> MetricsEndpoint:
    """Start the HTTP endpoint on a daemon thread (port 0: any free one); the server closes it last
    in its drain. With `security` using TLS or tokens, the endpoint asks for the same (`http_auth`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(stats, n_ctx, identity))
    app: WsgiApp = make_wsgi_app(registry)
    if security is not None and security.store is not None:
        from hyserve.api.http_auth import wsgi_auth

        app = wsgi_auth(app, security.store)
    return start_metrics_endpoint(app, host, port, security.ssl_context() if security is not None else None)
