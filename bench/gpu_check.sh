#!/usr/bin/env bash
# One-call GPU check for a machine with an NVIDIA GPU (run by hand or through the device tool):
# builds only the CUDA targets for sm_90, runs the CUDA tests once and the CUDA benchmarks, and
# packs every log into OUT_DIR/gpu_check.tar.gz next to the benchmark JSON and a summary.
#
#   bash bench/gpu_check.sh /tmp/gpu_out      (a relative OUT_DIR is taken from the caller's folder)
#
# Budget: the internal timeouts add up to 540 s, under the 600 s one device call allows (build
# 330 s on 16 cores, tests 90 s, benchmarks 120 s). -Werror stays off here: CI enforces it with
# this project's compilers, and an untried host compiler's new warning must not cost a device
# run. The CPU suite is not built: CI runs it. Debian -dev packages the build needs: run
# bench/fetch_gpu_deps.sh beforehand where apt works (it unpacks them into .deps/, carried to the
# GPU machine); this script adds .deps/usr to the search paths when present.
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute before the cd below
cd "$(dirname "$0")/.."
root=$PWD
logs=$(mktemp -d)
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
} > "$logs/machine.txt" 2>&1

pack() {  # one archive of the logs, plus the summary and JSON as plain files
  cp "$logs/machine.txt" "$out/" 2>/dev/null
  tar -czf "$out/gpu_check.tar.gz" -C "$logs" . 2>/dev/null
}

status=0
generator=$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")
if ! { timeout 60 cmake -S . -B build/gpu -G "$generator" -DCMAKE_BUILD_TYPE=Release -DDC_CUDA=ON \
         -DCMAKE_CUDA_ARCHITECTURES=90 -DDC_WERROR=OFF -DDC_BUILD_EXAMPLES=OFF > "$logs/build.log" 2>&1 &&
       timeout 270 cmake --build build/gpu -j "$(nproc)" --target dc_cuda_tests bench_cuda \
         >> "$logs/build.log" 2>&1; }; then
  echo "gpu_check: build failed" | tee "$out/summary.txt"
  tail -40 "$logs/build.log" | tee -a "$out/summary.txt"
  pack
  exit 1
fi

timeout 90 build/gpu/tests/dc_cuda_tests -s -d > "$logs/cuda_tests.log" 2>&1 || status=1
timeout 120 build/gpu/bench/bench_cuda --benchmark_out="$out/bench_cuda.json" \
  --benchmark_out_format=json > "$logs/bench_cuda.txt" 2>&1 || status=1
{
  echo "gpu_check: status $status"
  grep -E "test cases|assertions|SKIPPED|ERROR|FAILED" "$logs/cuda_tests.log" | tail -20
  tail -25 "$logs/bench_cuda.txt"
} > "$out/summary.txt"
cat "$out/summary.txt"
pack
exit $status
