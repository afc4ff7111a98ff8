#!/usr/bin/env bash
# What bench/gpu_device_check.sh needs on a GPU machine without network, made here:
# - hyserve-kernels (built from rust_kernels/, abi3, so any CPython >= 3.11 takes it) and the
#   service's pure-Python dependencies that a GPU machine's image usually lacks;
# - llama-cpp-python's source, pruned to what a CUDA or Vulkan build of its library compiles
#   (~6 MB where the release's is 77 MB), which bench/gpu_device_llama.sh builds there with the
#   card's own toolchain: llama.cpp on the same card, side by side with hyserve;
# - for the Vulkan build, Debian's glslc and the Vulkan and SPIR-V headers as .deb files, unpacked
#   there into a folder of their own (a GPU image has the Vulkan loader and driver, rarely the SDK).
#
#   bash bench/gpu_device_wheels.sh WHEELS
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${1:?usage: bash bench/gpu_device_wheels.sh WHEELS}
LLAMA_VERSION=0.3.36  # the version of the oracle the tests use (.ci/install.sh)
mkdir -p "$WHEELS"
WHEELS=$(cd "$WHEELS" && pwd)
CACHE="${HYSERVE_CACHE:-$HOME/.cache/hyserve}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/cargo-target}"
python3 -m pip wheel -q --no-deps -w "$WHEELS" ./rust_kernels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
    -d "$WHEELS" gguf structlog

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --no-binary=:all: -d "$work" "llama-cpp-python==$LLAMA_VERSION"
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src="$work/llama_cpp_python-$LLAMA_VERSION"
vendor="$src/vendor/llama.cpp"
# what neither the library nor its CMake files read: models, docs, tests, tools and examples
# (tools/mtmd is built by llama-cpp-python's default LLAVA_BUILD), other backends
rm -rf "$src"/{.git,.github,docs,examples,tests} \
    "$vendor"/{models,docs,tests,benches,conversion,scripts,examples,pocs,gguf-py,media,.devops,.github}
find "$vendor/tools" -mindepth 1 -maxdepth 1 ! -name mtmd -exec rm -rf {} +
find "$vendor/ggml/src" -mindepth 1 -maxdepth 1 -type d -name 'ggml-*' \
    ! -name ggml-cpu ! -name ggml-cuda ! -name ggml-vulkan -exec rm -rf {} +
tar -czf "$WHEELS/llama-cpp-python-$LLAMA_VERSION-gpu-src.tar.gz" -C "$work" "llama_cpp_python-$LLAMA_VERSION"

# For a Vulkan build: glslc with its libshaderc (this machine's Debian, so that it runs on an older
# C library too) and the Vulkan and SPIR-V headers of Debian 13 (ggml-vulkan needs Vulkan >= 1.3.272)
debs="$WHEELS/vulkan-sdk-debs"
rm -rf "$debs"
mkdir -p "$debs" "$work/lists/partial"
echo "deb http://deb.debian.org/debian trixie main" >"$work/trixie.list"
trixie=(-o "Dir::Etc::SourceList=$work/trixie.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$work/lists")
apt-get "${trixie[@]}" update -qq
(cd "$debs" && apt-get download glslc libshaderc1 >/dev/null && apt-get "${trixie[@]}" download libvulkan-dev spirv-headers >/dev/null)
ls -l "$WHEELS" "$WHEELS/vulkan-sdk-debs"
