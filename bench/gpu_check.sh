#!/usr/bin/env bash
# One-call GPU checks for a machine with an NVIDIA GPU (run by hand or through the device tool),
# in two stages, each one device call of at most 600 s:
#
#   bash bench/gpu_check.sh OUT_DIR        build the CUDA targets for sm_90, run the CUDA tests once
#                                          and bench_cuda (the tiny model, one Mistral layer)
#   bash bench/gpu_check.sh OUT_DIR long   bench_cuda_long: Mistral-7B-v0.3's shape at 32k context,
#                                          S = 1 and 16, full cache against 25 % (builds first if
#                                          the first stage has not; about 95 GB of GPU memory)
#
# Each stage packs its logs into OUT_DIR/gpu_check.tar.gz next to the benchmark JSON and a summary
# (a relative OUT_DIR is taken from the caller's folder).
# Budget: the first stage's internal timeouts add up to 540 s (build 330 s on 16 cores, tests 90 s,
# benchmarks 120 s); the second builds bench_cuda_long alone (one translation unit) and
# gives the benchmark (6 runs of 64 decode steps) what is left of 560 s. Run it right after the first on the same warm machine:
# together they are about 15 minutes at worst.
# -Werror stays off here: CI enforces it with this project's compilers, and an untried host
# compiler's new warning must not cost a device run. The CPU suite is not built: CI runs it.
# Debian -dev packages the build needs: run bench/fetch_gpu_deps.sh beforehand where apt works
# (it unpacks them into .deps/, carried to the GPU machine); this script adds .deps/usr to the
# search paths when present.
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh OUT_DIR [long]}
stage=${2:-quick}
case "$stage" in quick|long) ;; *) echo "gpu_check: unknown stage '$stage' (quick or long)" >&2; exit 2 ;; esac
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
targets="dc_cuda_tests bench_cuda"  # each stage builds only what it runs
[ "$stage" = long ] && targets=bench_cuda_long
generator=$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")
if ! { timeout 60 cmake -S . -B build/gpu -G "$generator" -DCMAKE_BUILD_TYPE=Release -DDC_CUDA=ON \
         -DCMAKE_CUDA_ARCHITECTURES=90 -DDC_WERROR=OFF -DDC_BUILD_EXAMPLES=OFF > "$logs/build.log" 2>&1 &&
       timeout 270 cmake --build build/gpu -j "$(nproc)" --target $targets \
         >> "$logs/build.log" 2>&1; }; then
  echo "gpu_check: build failed" | tee "$out/summary.txt"
  tail -40 "$logs/build.log" | tee -a "$out/summary.txt"
  pack
  exit 1
fi

if [ "$stage" = long ]; then
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$logs/memory_before.txt" 2>&1
  timeout $((560 - SECONDS > 60 ? 560 - SECONDS : 60)) build/gpu/bench/bench_cuda_long --benchmark_out="$out/bench_cuda_long.json" \
    --benchmark_out_format=json > "$logs/bench_cuda_long.txt" 2>&1 || status=1
  {
    echo "gpu_check long: status $status"
    tail -15 "$logs/bench_cuda_long.txt"
    python3 bench/gpu_long_summary.py "$out/bench_cuda_long.json" 2>&1
  } > "$out/summary.txt"
  cat "$out/summary.txt"
  pack
  exit $status
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
