#!/usr/bin/env bash
# The wheels bench/gpu_device_check.sh installs on a GPU machine without network, made here:
# hyserve-kernels (built from rust_kernels/, abi3, so any CPython >= 3.11 takes it) and the
# service's pure-Python dependencies that a GPU machine's image usually lacks. A GPU build of
# llama-cpp-python, if one was made (`CMAKE_ARGS="-DGGML_VULKAN=ON" pip wheel llama-cpp-python`,
# with Debian's glslc and libvulkan-dev), goes into the same folder by hand.
#
#   bash bench/gpu_device_wheels.sh WHEELS
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${1:?usage: bash bench/gpu_device_wheels.sh WHEELS}
mkdir -p "$WHEELS"
CACHE="${HYSERVE_CACHE:-$HOME/.cache/hyserve}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/cargo-target}"
python3 -m pip wheel -q --no-deps -w "$WHEELS" ./rust_kernels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
    -d "$WHEELS" gguf structlog
ls -l "$WHEELS"
