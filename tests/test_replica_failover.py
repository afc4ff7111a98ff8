"""Two replicas behind HAProxy (docker/haproxy/haproxy.cfg) sharing the prefix store's Redis tier:
a replica killed (SIGKILL) in the middle of a long hybrid conversation (~16k tokens) loses nothing
but its process. The next turn lands on the other replica, which restores the conversation from
Redis and processes only the turn's new tokens, with the answer of a cache-free run.
"""

from __future__ import annotations

import os
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from fixtures import make_models
from loopback import Balancer, Replica, Turn, generate, wait_until
from redis_process import RedisServer, redis_server_binary, running_redis

from hyserve.engine.generator import StopRule
from hyserve.engine.generator import generate as generate_in_process
from hyserve.engine.sampling import SamplingParams
from hyserve.model.loader import LoadedModel, load_model
from hyserve_client import ReuseSource, StoreTier

GEN = 6
HISTORY = 16_000  # tokens of the conversation before the replica dies
GUARD_S = 300.0  # only against a hang

missing = [
    name for name, found in (("haproxy", shutil.which("haproxy")), ("redis-server", redis_server_binary())) if not found
]
if missing:
    if os.environ.get("CI"):
        raise RuntimeError(f"{missing} missing: bash .ci/install.sh --test installs them (apt)")
    pytest.skip(f"{missing} not installed (bash .ci/install.sh --test installs them)", allow_module_level=True)


def take_turn(target: str, session: str, prompt: list[int]) -> Turn:
    """One Generate through the balancer (a replica just killed may answer UNAVAILABLE: retried)."""
    return generate(target, session, token_ids=prompt, max_tokens=GEN, ignore_eos=True, retry_unavailable=True)


def metric(replica: Replica, name: str, tier: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{replica.metrics_port}/metrics", timeout=10).read().decode()
    line = f'{name}{{tier="{tier}"}} '
    return next(float(row.removeprefix(line)) for row in text.splitlines() if row.startswith(line))


@dataclass
class Cluster:
    model: LoadedModel
    store: RedisServer
    replicas: dict[str, Replica]
    balancer: Balancer

    def reference(self, prompt: list[int]) -> list[int]:
        stop = StopRule(max_tokens=GEN, ignore_eos=True)
        return [
            g.token_id for g in generate_in_process(self.model, prompt, SamplingParams(), stop, n_ctx=HISTORY + 512)
        ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("failover")
    path = make_models.write_model(tmp / "qwen35.gguf", "qwen35", qtype="q8_0")
    with running_redis(tmp / "redis.log") as store:
        args = ["--model", str(path), "--parallel", "1", "--ctx-size", str(HISTORY + 512), "--threads", "1"]
        args += ["--prompt-chunk", "256", "--cache-redis", store.url, "--cache-redis-ttl", "3600"]
        replicas = {name: Replica(name, args, tmp) for name in ("r0", "r1")}
        balancer = Balancer(list(replicas.values()), tmp)
        try:
            for replica in replicas.values():
                replica.start()
            for replica in replicas.values():
                wait_until(f"{replica.name} ready", replica.ready)
            wait_until("both replicas UP in haproxy", lambda: set(balancer.server_states().values()) == {"UP"})
            yield Cluster(load_model(path), store, replicas, balancer)
        finally:
            for replica in replicas.values():
                replica.stop()
            balancer.close()


def _poll(what: str, predicate: Callable[[], bool]) -> None:
    wait_until(what, predicate, guard_s=GUARD_S)


def test_a_killed_replica_s_long_conversation_resumes_on_the_other_from_redis(cluster: Cluster) -> None:
    rng = np.random.default_rng(21)
    session = "failover-0"
    prompt = [int(t) for t in rng.integers(10, 400, size=HISTORY)]
    first = take_turn(cluster.balancer.target, session, prompt)
    assert first.tokens == cluster.reference(prompt)
    prompt = prompt + first.tokens + [int(t) for t in rng.integers(10, 400, size=50)]
    second = take_turn(cluster.balancer.target, session, prompt)
    victim = cluster.replicas[second.replica]
    assert second.replica == first.replica  # the balancer's affinity: the slot is still there
    assert second.finished.usage.processed_prompt_tokens == len(prompt) - (HISTORY + GEN - 1)
    # the victim's state after the second turn reaches Redis (written behind the answer)
    _poll("the second turn's state in Redis", lambda: metric(victim, "hyserve_store_tier_writes_total", "shared") >= 2)
    assert victim.proc is not None
    victim.proc.kill()
    victim.proc.wait()
    # Sent before HAProxy marks the victim down, the turn is redispatched after a refused
    # connection, and the replica header may then name the killed replica (seen): the turn goes
    # once the balancer routes the conversation to the survivor by itself.
    _poll(f"haproxy marks {victim.name} down", lambda: cluster.balancer.server_states().get(victim.name) != "UP")
    follow_up = prompt + second.tokens + [int(t) for t in rng.integers(10, 400, size=40)]
    third = take_turn(cluster.balancer.target, session, follow_up)
    survivor = cluster.replicas[third.replica]
    held = len(prompt) + GEN - 1  # the victim's slot: the prompt and the answer less its last token
    print(
        f"turn 3 on {third.replica} after {victim.name} was killed: prompt {third.accepted.prompt_tokens},"
        f" reused {third.accepted.reused_tokens} ({third.accepted.store_tier}),"
        f" processed {third.finished.usage.processed_prompt_tokens}"
    )
    assert survivor is not victim
    assert third.accepted.reuse_source is ReuseSource.PREFIX_STORE and third.accepted.store_tier is StoreTier.SHARED
    assert third.accepted.reused_tokens == held
    assert third.finished.usage.processed_prompt_tokens == len(follow_up) - held  # only the new tokens
    assert third.tokens == cluster.reference(follow_up)
    assert metric(survivor, "hyserve_store_tier_hits_total", "shared") == 1
    assert metric(survivor, "hyserve_store_tier_read_seconds_total", "shared") > 0
    assert metric(survivor, "hyserve_store_tier_errors_total", "shared") == 0
