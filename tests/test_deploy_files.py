"""The deployment files agree with each other, with the server's flags and with the measured memory:
what their linters cannot see (.ci/lint-deploy.sh checks each file against its own schema)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from loopback import HAPROXY_CFG, SESSION_HEADER

from hyserve.api.servicer import SERVICE_NAME
from hyserve.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
STOP_GRACE_S = 2  # server.stop(grace=2.0) after the drain


def serve_args(args: list[str]) -> Any:
    """Parse `hyserve serve ARGS` with the real CLI parser (exits on an unknown flag)."""
    return build_parser().parse_args(["serve", *args])


def dockerfile_instruction(name: str) -> list[str]:
    text = (DOCKER / "Dockerfile").read_text()
    match = re.search(rf"^{name} (\[.*\])$", text, re.M)
    assert match, name
    return list(json.loads(match.group(1)))


def deployment() -> dict[str, Any]:
    return dict(yaml.safe_load((DOCKER / "k8s" / "deployment.yaml").read_text()))


def compose_service() -> dict[str, Any]:
    return dict(yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["hyserve"])


def test_the_image_s_command_is_a_valid_serve_command_on_the_exposed_ports() -> None:
    entry = dockerfile_instruction("ENTRYPOINT")
    assert entry[:2] == ["hyserve", "serve"]
    args = serve_args([*entry[2:], *dockerfile_instruction("CMD")])
    exposed = re.search(r"^EXPOSE (.*)$", (DOCKER / "Dockerfile").read_text(), re.M)
    assert exposed and {str(args.port), str(args.metrics_port)} == set(exposed.group(1).split())
    assert args.host == "0.0.0.0"
    assert args.insecure, "beyond loopback without TLS or tokens, serve refuses to start unless --insecure"


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_the_drain_fits_in_the_grace_period(where: str) -> None:
    if where == "compose":
        service = compose_service()
        args = serve_args(service["command"])
        grace = int(str(service["stop_grace_period"]).removesuffix("s"))
    else:
        pod = deployment()["spec"]["template"]["spec"]
        args = serve_args([a.replace("$(POD_NAME)", "pod-0") for a in pod["containers"][0]["args"]])
        grace = int(pod["terminationGracePeriodSeconds"])
    assert grace > args.drain_seconds + STOP_GRACE_S


def test_k8s_probes_use_liveness_and_readiness_names_on_the_grpc_port() -> None:
    container = deployment()["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    entry = serve_args(dockerfile_instruction("ENTRYPOINT")[2:])
    assert ports == {"grpc": entry.port, "metrics": entry.metrics_port}
    assert container["livenessProbe"]["grpc"] == {"port": entry.port, "service": ""}
    assert container["readinessProbe"]["grpc"] == {"port": entry.port, "service": SERVICE_NAME}


def test_every_balancer_hashes_the_same_header_and_checks_readiness() -> None:
    envoy = (DOCKER / "envoy.yaml").read_text()
    assert f"header_name: {SESSION_HEADER}" in envoy and f"service_name: {SERVICE_NAME}" in envoy
    assert f"balance hdr({SESSION_HEADER})" in HAPROXY_CFG.read_text()
    gateway = (DOCKER / "k8s" / "gateway" / "gateway.yaml").read_text()
    assert f"name: {SESSION_HEADER}" in gateway and f"service: {SERVICE_NAME}" in gateway


def test_memory_limits_hold_the_measured_replica() -> None:
    """limit >= base + 18 KiB per token of every slot's context + both byte budgets (docker/README.md, "Memory")."""
    measured = json.loads((REPO / "bench" / "results" / "replica_memory_gemma3_270m.json").read_text())
    base_mib = max(s["idle_kib"]["VmRSS"] for s in measured["shapes"]) / 1024
    assert max(s["kib_per_token"] for s in measured["shapes"]) <= 18  # the KV size per token bounds the growth
    pod = deployment()["spec"]["template"]["spec"]["containers"][0]
    k8s_args = serve_args([a.replace("$(POD_NAME)", "pod-0") for a in pod["args"]])
    service = compose_service()
    for args, limit in (
        (k8s_args, pod["resources"]["limits"]["memory"]),
        (serve_args(service["command"]), service["deploy"]["resources"]["limits"]["memory"]),
    ):
        need = base_mib + args.parallel * args.ctx_size * 18 / 1024 + args.checkpoint_memory + args.cache_memory
        assert int(re.sub(r"Mi?$", "", str(limit))) >= need, (limit, need)


def test_readme_deploy_commands_name_existing_files() -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Deploy") :]
    block = section[section.index("```bash") : section.index("```", section.index("```bash") + 3)]
    paths = {w for line in block.splitlines() for w in shlex.split(line.split("#")[0]) if w.startswith("docker/")}
    assert {"docker/Dockerfile", "docker/compose.yaml", "docker/k8s/", "docker/haproxy/haproxy.cfg"} <= paths
    for path in paths:
        assert (REPO / path).exists(), path
