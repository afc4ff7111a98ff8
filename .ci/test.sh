#!/usr/bin/env bash
# The project's test command (README): install, lint, Rust tests, Python tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/install.sh --test
CACHE="${HYSERVE_CACHE:-$HOME/.cache/hyserve}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/cargo-target}"
PY="${PYTHON:-python3}"
# wgpu's Vulkan loader wants a private runtime dir (harmless warnings otherwise)
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"

"$PY" -m ruff check service tests bench clients
"$PY" -m ruff format --check service tests bench clients
bash .ci/lint-deploy.sh
(cd rust_kernels && cargo clippy --all-targets -q -- -D warnings && cargo test -q --release)
# documentation: the generators' lint, and the site (into a temp dir); tests/test_docs.py checks the generated pages
"$PY" -m ruff check docs/gen && "$PY" -m ruff format --check docs/gen
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict -f mkdocs.yml -d "$(mktemp -d)"
"$PY" -m pytest -q -rs -p no:cacheprovider --durations=20 tests "$@"
