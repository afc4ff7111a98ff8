"""Scale-out as real processes: two `hyserve serve` replicas behind HAProxy (docker/haproxy/haproxy.cfg)
on 127.0.0.1, conversations keyed by the `x-session-id` header.

- affinity: every follow-up of a conversation lands on the replica of its first turn and processes
  only the tokens that replica has not evaluated (tests/cache_ledger.py's minimum);
- a replica killed (SIGKILL) between turns: its conversations continue on the other replica, which
  re-processes what it never saw, with the same answers; the killed one rejoins and gets its share back;
- SIGTERM: the replica's open streams finish, liveness ("") stays SERVING while readiness turns
  NOT_SERVING, the balancer marks it down and its conversations move, no request is lost.

Every turn prints its replica, reused and processed tokens (run with -s to see them). Answers are
compared with a cache-free in-process greedy generation of the same prompt.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cache_ledger import Ledger
from fixtures import make_models
from grpc_health.v1 import health_pb2
from loopback import (
    READY_SERVICE,
    Balancer,
    Replica,
    Turn,
    generate,
    grpc_health_check_request,
    health,
    wait_until,
)

from hyserve.engine.generator import StopRule
from hyserve.engine.generator import generate as generate_in_process
from hyserve.engine.sampling import SamplingParams
from hyserve.model.loader import LoadedModel, load_model
from hyserve_client import FinishReason

GEN = 6  # tokens per turn
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SYSTEM = "You are a terse assistant for a deployment test."
USERS = ["Where is the cache kept?", "And after a restart?", "Which replica holds it?", "Thanks, one more."]

if shutil.which("haproxy") is None:
    if os.environ.get("CI"):
        raise RuntimeError("haproxy is missing: bash .ci/install.sh --test installs it (apt)")
    pytest.skip("haproxy not installed (bash .ci/install.sh --test installs it)", allow_module_level=True)


@dataclass
class Cluster:
    model: LoadedModel
    replicas: dict[str, Replica]
    balancer: Balancer
    ledgers: dict[str, Ledger] = field(default_factory=dict)

    def ensure_up(self) -> None:
        """(Re)start dead replicas (a fresh process has a fresh cache) and wait until the balancer sends to them."""
        for name, replica in self.replicas.items():
            if not replica.alive():
                replica.start()
                self.ledgers[name] = Ledger(self.model)
        for replica in self.replicas.values():
            wait_until(f"{replica.name} ready", replica.ready)
        wait_until("both replicas UP in haproxy", lambda: set(self.balancer.server_states().values()) == {"UP"})

    def reference(self, prompt: list[int], n: int = GEN) -> list[int]:
        stop = StopRule(max_tokens=n, ignore_eos=True)
        return [g.token_id for g in generate_in_process(self.model, prompt, SamplingParams(), stop)]


@dataclass
class Conversation:
    session: str
    replies: list[str] = field(default_factory=list)
    replicas: list[str] = field(default_factory=list)

    def messages(self) -> list[dict[str, str]]:
        out = [{"role": "system", "content": SYSTEM}]
        for i, reply in enumerate(self.replies):
            out += [{"role": "user", "content": f"{self.session}: {USERS[i % len(USERS)]}"}]
            out += [{"role": "assistant", "content": reply}]
        turn = len(self.replies)
        return [*out, {"role": "user", "content": f"{self.session}: {USERS[turn % len(USERS)]}"}]


def take_turn(cluster: Cluster, conv: Conversation, *, retry_unavailable: bool = False) -> Turn:
    """One turn through the balancer; checks the answer and that only the minimum was processed."""
    messages = conv.messages()
    turn = generate(
        cluster.balancer.target, conv.session, messages, max_tokens=GEN, ignore_eos=True,
        retry_unavailable=retry_unavailable,
    )  # fmt: skip
    ledger = cluster.ledgers[turn.replica]
    prompt = ledger.tokens(messages)
    minimum = ledger.minimum(prompt)
    usage = turn.finished.usage
    print(
        f"{conv.session} turn {len(conv.replies) + 1}: replica {turn.replica}, prompt {usage.prompt_tokens},"
        f" reused {turn.accepted.reused_tokens}, processed {usage.processed_prompt_tokens} (minimum {minimum}),"
        f" retries {turn.retries}"
    )
    assert turn.accepted.prompt_tokens == len(prompt)
    assert usage.processed_prompt_tokens == minimum, (conv.session, turn.replica)
    assert turn.tokens == cluster.reference(prompt), "a replica changed an answer"
    ledger.record(prompt, turn.tokens)
    conv.replies.append(cluster.model.tokenizer.decode(turn.tokens))
    conv.replicas.append(turn.replica)
    return turn


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("loopback")
    path = make_models.write_model(tmp / "llama.gguf", "llama", qtype="q8_0")
    args = ["--model", str(path), "--parallel", "2", "--ctx-size", "2048", "--threads", "1"]
    args += ["--prompt-chunk", "64", "--drain-seconds", "120"]
    replicas = {name: Replica(name, args, tmp) for name in ("r0", "r1")}
    balancer = Balancer(list(replicas.values()), tmp)
    c = Cluster(load_model(path), replicas, balancer)
    try:
        c.ensure_up()
        yield c
    finally:
        for replica in replicas.values():
            replica.stop()
        balancer.close()


def conversations(prefix: str, n: int = 6) -> list[Conversation]:
    return [Conversation(f"{prefix}-{i}") for i in range(n)]


def test_haproxy_cfg_sends_the_grpc_health_check_of_the_readiness_service() -> None:
    cfg = (Path(__file__).resolve().parents[1] / "docker" / "haproxy" / "haproxy.cfg").read_text()
    assert f"tcp-check send-binary {grpc_health_check_request(READY_SERVICE).hex()}\n" in cfg


def test_each_conversation_stays_on_its_replica_and_processes_only_new_tokens(cluster: Cluster) -> None:
    cluster.ensure_up()
    convs = conversations("affinity")
    for turn in range(3):
        for conv in convs:
            t = take_turn(cluster, conv)
            if turn:
                assert 0 < t.accepted.reused_tokens < t.accepted.prompt_tokens
    for conv in convs:
        assert len(set(conv.replicas)) == 1, conv
    assert {conv.replicas[0] for conv in convs} == {"r0", "r1"}, "both replicas serve some conversations"


def test_a_killed_replica_s_conversations_continue_on_the_other(cluster: Cluster) -> None:
    cluster.ensure_up()
    convs = conversations("killed")
    for conv in convs:
        take_turn(cluster, conv)
        take_turn(cluster, conv)
    victim = convs[0].replicas[0]
    survivor = next(name for name in cluster.replicas if name != victim)
    # both turns on the victim: its own conversations (a health-check flap could have sent one turn elsewhere)
    moved = [c for c in convs if set(c.replicas) == {victim}]
    assert moved
    cluster.replicas[victim].proc.kill()  # type: ignore[union-attr]
    cluster.replicas[victim].proc.wait()  # type: ignore[union-attr]
    for conv in convs:  # at once: the balancer may not have seen the death yet
        t = take_turn(cluster, conv, retry_unavailable=True)
        assert t.replica == survivor
        if conv in moved:  # the survivor never saw this history: all of it but a shared prefix re-processed
            assert t.finished.usage.processed_prompt_tokens > t.accepted.prompt_tokens // 2
    cluster.ensure_up()  # the victim comes back (empty cache) and gets its conversations back
    for conv in moved:
        t = take_turn(cluster, conv)
        assert t.replica == victim


class Stream(threading.Thread):
    """A long Generate through the balancer, read on a thread."""

    def __init__(self, cluster: Cluster, conv: Conversation, n: int) -> None:
        super().__init__(daemon=True)
        self.cluster, self.conv, self.n = cluster, conv, n
        self.turn: Turn | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.turn = generate(
                self.cluster.balancer.target, self.conv.session, self.conv.messages(), max_tokens=self.n,
                ignore_eos=True,
            )  # fmt: skip
        except BaseException as exc:
            self.error = exc


def test_sigterm_drains_open_streams_and_the_balancer_moves_new_work(cluster: Cluster) -> None:
    cluster.ensure_up()
    convs = conversations("drain")
    for conv in convs:
        take_turn(cluster, conv)
    victim_name = convs[0].replicas[0]
    victim = cluster.replicas[victim_name]
    mine = [c for c in convs if c.replicas[0] == victim_name]
    assert len(mine) >= 3, "the hash must give the victim two conversations to stream and one to move"
    streams = [Stream(cluster, conv, 1500) for conv in mine[:2]]
    for s in streams:
        s.start()
    wait_until("both streams running", lambda: _running(victim) >= len(streams))
    victim.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    # readiness NOT_SERVING at once, liveness still SERVING, while the streams are still open
    wait_until("readiness NOT_SERVING", lambda: health(victim.target, READY_SERVICE) == NOT_SERVING)
    assert health(victim.target, "") == SERVING
    open_streams = [s.is_alive() for s in streams]
    assert health(victim.target, "") == SERVING
    assert any(open_streams), "the streams ended before the drain could be observed: make them longer"
    # work sent before the balancer has noticed: UNAVAILABLE from the draining replica, retried, served
    rest = [c for c in mine if c not in [s.conv for s in streams]]
    if rest:
        t = take_turn(cluster, rest[0], retry_unavailable=True)
        print(f"sent during the drain: served by {t.replica} after {t.retries} UNAVAILABLE answers")
    wait_until(f"haproxy marks {victim_name} DOWN", lambda: cluster.balancer.server_states()[victim_name] != "UP")
    for conv in rest:
        t = take_turn(cluster, conv)
        assert t.replica != victim_name and t.retries == 0
    for s in streams:
        s.join()
        assert s.error is None, s.error
        assert s.turn is not None and s.turn.replica == victim_name
        assert s.turn.finished.reason is FinishReason.MAX_TOKENS, "an open stream was cut short"
        prompt = cluster.ledgers[victim_name].tokens(s.conv.messages())
        assert s.turn.tokens == cluster.reference(prompt, s.n)
        print(f"{s.conv.session}: open stream of {s.n} tokens finished on {victim_name} while it drained")
    assert victim.proc.wait(120) == 0  # type: ignore[union-attr]


def _running(replica: Replica) -> int:
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    with urlopen(f"http://127.0.0.1:{replica.metrics_port}/metrics", timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
    values: list[Any] = [s.value for f in families for s in f.samples if s.name == "hyserve_num_requests_running"]
    return int(values[0])
