#!/usr/bin/env bash
# Lints the deployment files that cannot run on these machines (no Docker engine, no Envoy, no
# cluster): hadolint on the Dockerfile, the Kubernetes manifests against the Kubernetes schemas
# (strict: unknown fields fail), compose.yaml against the compose-spec schema, and `haproxy -c` on
# the HAProxy config that tests/test_deploy_loopback.py runs. Tools: the `test` extra + apt haproxy.
set -euo pipefail
cd "$(dirname "$0")/.."
hadolint docker/Dockerfile
kubernetes-validate --strict --quiet -k 1.33.0 docker/k8s/deployment.yaml docker/k8s/service.yaml docker/k8s/pdb.yaml
check-jsonschema --builtin-schema vendor.compose-spec docker/compose.yaml
HYSERVE_R0=127.0.0.1:50061 HYSERVE_R1=127.0.0.1:50062 haproxy -c -q -f docker/haproxy/haproxy.cfg
echo "deploy lint: Dockerfile, k8s manifests, compose.yaml, haproxy.cfg ok"
