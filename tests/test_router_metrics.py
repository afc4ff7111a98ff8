"""The gauges routers scrape (`hyserve_num_requests_waiting`, `..._running`, `..._kv_cache_usage_perc`,
`..._prompt_cache_hit_ratio`) on a real server's /metrics: documented names, the replica and model
labels, and values that move under load and come back when it is gone; and every answer names
the replica that gave it (`x-hyserve-replica`), as the metrics do."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.request import urlopen

import grpc
import pytest
from fixtures import make_models
from loopback import REPLICA_HEADER, generate, wait_until
from prometheus_client.parser import text_string_to_metric_families
from server_process import free_port, running_server

from hyserve.api.metrics import ROUTER_GAUGES, prompt_cache_hit_ratio
from hyserve_client import Finished, FinishReason, HyserveClient
from hyserve_client._gen import hyserve_pb2 as pb
from hyserve_client._gen import hyserve_pb2_grpc as pb_grpc

REPLICA = "replica-under-test"
LONG = 1500  # tokens per long task: it is still running while the test looks


def test_prompt_cache_hit_ratio_is_reused_over_received() -> None:
    assert prompt_cache_hit_ratio(0, 0) == 0.0
    assert prompt_cache_hit_ratio(200, 150) == 0.75


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("router-metrics")
    path = make_models.write_model(tmp / "llama.gguf", "llama", qtype="q8_0")
    metrics_port = free_port()
    args = ["--model", str(path), "--parallel", "1", "--ctx-size", "2048", "--threads", "1"]
    args += ["--metrics-port", str(metrics_port), "--replica-id", REPLICA]
    with running_server(tmp / "server.log", *args) as target:
        yield target, f"http://127.0.0.1:{metrics_port}/metrics"


def router_gauges(url: str) -> dict[str, tuple[dict[str, str], float]]:
    with urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        s.name: (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name in ROUTER_GAUGES or s.name == "hyserve_replica_info"
    }


class Task(threading.Thread):
    def __init__(self, target: str, text: str, task_id: str) -> None:
        super().__init__(daemon=True)
        self.target, self.text, self.task_id = target, text, task_id
        self.finished: Finished | None = None

    def run(self) -> None:
        with HyserveClient(self.target, timeout=300) as client:
            _, self.finished = client.generate_text(self.text, task_id=self.task_id, max_tokens=LONG, ignore_eos=True)


def test_router_gauges_have_their_documented_names_and_labels(served: tuple[str, str]) -> None:
    gauges = router_gauges(served[1])
    assert set(ROUTER_GAUGES) <= gauges.keys()
    for name in ROUTER_GAUGES:
        labels, _ = gauges[name]
        assert labels["replica"] == REPLICA and labels["model_name"]
    info_labels, info = gauges["hyserve_replica_info"]
    assert info == 1 and info_labels["replica"] == REPLICA
    assert info_labels["n_slots"] == "1" and info_labels["n_ctx"] == "2048"


def test_router_gauges_move_under_load(served: tuple[str, str]) -> None:
    target, url = served

    def value(name: str) -> float:
        return router_gauges(url)[name][1]

    assert value("hyserve_num_requests_running") == 0 and value("hyserve_num_requests_waiting") == 0
    usage_before = value("hyserve_kv_cache_usage_perc")
    tasks = [Task(target, f"Load test number {i} for the router gauges.", f"load-{i}") for i in range(3)]
    for task in tasks:
        task.start()
    # one slot: one task runs, two wait in the queue
    wait_until("1 running and 2 waiting", lambda: (value("hyserve_num_requests_running"),
                                                   value("hyserve_num_requests_waiting")) == (1, 2))  # fmt: skip
    wait_until("the slot fills", lambda: value("hyserve_kv_cache_usage_perc") > usage_before)
    with HyserveClient(target) as client:
        for task in tasks:
            client.cancel(task.task_id)
    for task in tasks:
        task.join()
        assert task.finished is not None and task.finished.reason in (FinishReason.CANCELLED, FinishReason.MAX_TOKENS)
    wait_until("back to idle", lambda: value("hyserve_num_requests_running") == 0)
    assert value("hyserve_num_requests_waiting") == 0
    # a resend of the same prompt is served from the cache: the hit ratio rises above 0
    ratio_before = value("hyserve_prompt_cache_hit_ratio")
    with HyserveClient(target) as client:
        prompt = "A prompt the cache will see twice, for the hit ratio."
        client.generate_text(prompt, max_tokens=2)
        client.generate_text(prompt, max_tokens=2)
    assert value("hyserve_prompt_cache_hit_ratio") > ratio_before
    assert 0 < value("hyserve_prompt_cache_hit_ratio") <= 1


def test_metrics_docs_name_every_router_gauge() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docker" / "README.md").read_text()
    for name, vllm in ROUTER_GAUGES.items():
        assert f"`{name}`" in doc and f"`{vllm}`" in doc


def test_every_answer_names_its_replica(served: tuple[str, str]) -> None:
    """Streams, unary calls and refusals all carry the replica's own name in their initial metadata
    (what a balancer passes through: right even for a request it redispatched)."""
    target, _ = served
    assert generate(target, "named", token_ids=[5, 6, 7], max_tokens=1).replica == REPLICA
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.HyserveServiceStub(channel)
        _, call = stub.CacheStats.with_call(pb.CacheStatsRequest(), timeout=30)
        assert dict(call.initial_metadata())[REPLICA_HEADER] == REPLICA
        with pytest.raises(grpc.RpcError) as exc:
            stub.Cancel(pb.CancelRequest(task_id=""), timeout=30)
        assert exc.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert dict(exc.value.initial_metadata())[REPLICA_HEADER] == REPLICA
