#!/usr/bin/env bash
# Builds llama.cpp's GPU backends on the GPU machine itself, from the pruned llama-cpp-python
# source bench/gpu_device_wheels.sh put into WHEELS: a CUDA build where nvcc is at hand (for this
# card's compute capability only), a Vulkan build where glslc and the Vulkan headers are (WHEELS's
# Debian packages, unpacked into a folder of their own). Both at once,
# each installed into DEST/<backend>/site (for `gpu_bench.py --llama-build <backend>=...`); each
# build's log is DEST/<backend>.log. A backend whose build fails or runs past LIMIT seconds is
# left out. Offline: the build tools come from the machine (cmake, ninja, scikit-build-core).
#
#   bash bench/gpu_device_llama.sh WHEELS DEST [LIMIT]
set -uo pipefail
WHEELS=$(cd "${1:?usage: bash bench/gpu_device_llama.sh WHEELS DEST [LIMIT]}" && pwd)
DEST=${2:?usage: bash bench/gpu_device_llama.sh WHEELS DEST [LIMIT]}
LIMIT=${3:-420}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
tarball=$(ls "$WHEELS"/llama-cpp-python-*-gpu-src.tar.gz 2>/dev/null | head -n 1)
[ -n "$tarball" ] || { echo "no llama-cpp-python source in $WHEELS (bench/gpu_device_wheels.sh)"; exit 2; }
jobs=$(nproc)
# the CPU side as .ci/install.sh builds it: a -march=native build crashed on AMX/AVX-512 VMs
cpu_flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"

# Builds one backend from its own copy of the source: build BACKEND CMAKE_ARGS...
build() {
    local backend=$1
    shift
    local work="$DEST/$backend.src"
    rm -rf "$work" "$DEST/$backend"
    mkdir -p "$work" "$DEST/$backend"
    tar -xzf "$tarball" -C "$work"
    CMAKE_ARGS="$cpu_flags $*" CMAKE_BUILD_PARALLEL_LEVEL=$jobs timeout "$LIMIT" \
        python3 -m pip wheel -q --no-deps --no-build-isolation -w "$DEST/$backend/wheel" "$work"/llama_cpp_python-* \
        && python3 -m pip install -q --no-index --no-deps --no-compile --target "$DEST/$backend/site" \
            "$DEST/$backend"/wheel/*.whl \
        || { rm -rf "$DEST/$backend"; return 1; }
}

pids=()
if command -v nvcc >/dev/null 2>&1; then
    cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d .)
    (build cuda -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${cap:-native}" >"$DEST/cuda.log" 2>&1) &
    pids+=($!)
fi
# the carried SDK packages even where the machine has its own (its headers may be too old)
if [ -d "$WHEELS/vulkan-sdk-debs" ]; then
    sdk="$DEST/vulkan-sdk"
    for deb in "$WHEELS"/vulkan-sdk-debs/*.deb; do dpkg -x "$deb" "$sdk"; done
    # VULKAN_SDK: where ggml-vulkan looks for SPIRV-Headers' CMake files
    export PATH="$sdk/usr/bin:$PATH" LD_LIBRARY_PATH="$sdk/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}" VULKAN_SDK="$sdk/usr"
    vulkan_args="-DVulkan_INCLUDE_DIR=$sdk/usr/include -DVulkan_GLSLC_EXECUTABLE=$sdk/usr/bin/glslc"
fi
loader=$(ldconfig -p | awk '/libvulkan\.so\.1 .*x86-64/ {print $NF; exit}')
if command -v glslc >/dev/null 2>&1 && [ -n "$loader" ]; then
    # shellcheck disable=SC2086  # vulkan_args is a list of arguments
    (build vulkan -DGGML_VULKAN=ON "-DVulkan_LIBRARY=$loader" ${vulkan_args:-} >"$DEST/vulkan.log" 2>&1) &
    pids+=($!)
fi
[ ${#pids[@]} -gt 0 ] || { echo "neither nvcc nor glslc with a Vulkan loader: no GPU build of llama.cpp"; exit 2; }
wait "${pids[@]}"
for backend in cuda vulkan; do
    [ -d "$DEST/$backend/site" ] && echo "$backend: $DEST/$backend/site" || echo "$backend: not built"
done
exit 0
