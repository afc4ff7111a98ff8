#!/usr/bin/env bash
# Lints the deployment files that cannot run on these machines (no Docker engine, no Envoy, no
# cluster): hadolint on the Dockerfile, the Kubernetes manifests against the Kubernetes schemas
# (strict: unknown fields fail), compose.yaml against the compose-spec schema, envoy.yaml and the
# Gateway API manifests against Envoy's and the Gateway APIs' Go types (docker/lint), and `haproxy -c`
# on the HAProxy config that tests/test_deploy_loopback.py runs. Tools: the `test` extra, apt haproxy,
# and deploylint, all installed by .ci/install.sh --test.
set -euo pipefail
cd "$(dirname "$0")/.."
hadolint docker/Dockerfile
kubernetes-validate --strict --quiet -k 1.33.0 docker/k8s/deployment.yaml docker/k8s/service.yaml docker/k8s/pdb.yaml docker/k8s/valkey.yaml
check-jsonschema --builtin-schema vendor.compose-spec docker/compose.yaml
# built by .ci/install.sh --test from docker/lint (Envoy's and the Gateway APIs' own Go types)
DEPLOYLINT="${HYSERVE_CACHE:-$HOME/.cache/hyserve}/bin/deploylint"
[ -x "$DEPLOYLINT" ] || { echo "$DEPLOYLINT missing: bash .ci/install.sh --test builds it (needs Go)" >&2; exit 1; }
"$DEPLOYLINT" envoy docker/envoy.yaml
"$DEPLOYLINT" gateway docker/k8s/gateway/gateway.yaml
HYSERVE_R0=127.0.0.1:50061 HYSERVE_R1=127.0.0.1:50062 haproxy -c -q -f docker/haproxy/haproxy.cfg
echo "deploy lint: Dockerfile, k8s manifests, compose.yaml, envoy.yaml, gateway manifests, haproxy.cfg ok"
