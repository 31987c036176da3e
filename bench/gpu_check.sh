#!/usr/bin/env bash
# One-call GPU check for a machine with an NVIDIA GPU (run by hand or through the device tool):
# builds for sm_90, runs every test including the gpu-labelled ones, and the CUDA and CPU
# benchmarks, writing logs and JSON into the folder given as $1. Budget: under 8 minutes.
#
#   bash bench/gpu_check.sh /tmp/gpu_out
# Debian -dev packages the build needs: run bench/fetch_gpu_deps.sh beforehand where apt works
# (it unpacks them into .deps/, carried to the GPU machine); this script adds .deps/usr to the
# search paths when present.
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh OUT_DIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
root=$PWD
if [ -d .deps/usr ]; then
  export CMAKE_PREFIX_PATH="$root/.deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export CPATH="$root/.deps/usr/include${CPATH:+:$CPATH}"
  export LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
  export LD_LIBRARY_PATH="$root/.deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export PATH="/usr/local/cuda/bin:$PATH"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  nvcc --version | tail -2
  lscpu | grep -E 'Model name|^CPU\(s\)'
} > "$out/machine.txt" 2>&1

status=0
generator=$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")
timeout 300 cmake -S . -B build/gpu -G "$generator" -DCMAKE_BUILD_TYPE=Release -DDC_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DDC_WERROR=ON > "$out/build.log" 2>&1 &&
  timeout 300 cmake --build build/gpu -j "$(nproc)" >> "$out/build.log" 2>&1 || { echo "build failed"; tail -40 "$out/build.log"; exit 1; }

# The real-model tests need the 98 MB SmolLM2 file, which cannot travel to an offline GPU machine.
model_filter=()
[ -f "${DC_SMOLLM2_GGUF:-$HOME/.cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf}" ] || model_filter=(-LE model)
timeout 180 ctest --test-dir build/gpu --output-on-failure "${model_filter[@]}" > "$out/ctest.log" 2>&1 || status=1
timeout 120 build/gpu/tests/dc_cuda_tests -s -d > "$out/cuda_tests.log" 2>&1 || status=1
timeout 120 build/gpu/bench/bench_cuda --benchmark_format=json --benchmark_out="$out/bench_cuda.json" \
  --benchmark_out_format=json > "$out/bench_cuda.txt" 2>&1 || status=1
timeout 120 build/gpu/bench/bench_cpu --benchmark_filter=tiny --benchmark_out="$out/bench_cpu.json" \
  --benchmark_out_format=json > "$out/bench_cpu.txt" 2>&1 || status=1
tail -15 "$out/ctest.log"; cat "$out/bench_cuda.txt" | tail -20
exit $status
