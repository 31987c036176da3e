#!/usr/bin/env bash
# GPU checks for a machine with an NVIDIA GPU (run by hand or through the device tool):
#
#   bash bench/gpu_check.sh OUT_DIR [STAGE]
#
#   quick     every CUDA test once (CPU oracles) and bench_cuda (the tiny model, one Mistral layer)
#   long      bench_cuda_long: Mistral-7B-v0.3's shape at 32k context, S = 1 and 16, full cache
#             against 25 % (the full cache at S = 16 needs about 93 GB of GPU memory: on an
#             80 GB H100 that row reports so and the others run), then bench/gpu_long_summary.py
#   profile   one decode step of bench_cuda_long (full cache, S = 1 and 16; 25 % at S = 1) and one
#             in-place eviction under
#             Nsight Compute: every kernel's device time and DRAM bytes, bench/ncu_summary.py
#   sanitize  the CUDA tests under compute-sanitizer's memcheck
#   all       quick, long, profile, then sanitize, each with what is left of the budget (the
#             default: one device call)
#
# The programs come from .gpubin/ when bench/gpu_prebuild.sh made them elsewhere (nvcc without a
# GPU is enough) and they start here; otherwise they are built for sm_90 with every core (about
# 5 minutes of a lent device's time, which the prebuilt path saves). GPU_CHECK_BUDGET (seconds,
# default 540) bounds the whole run: each step gets a timeout and what is left goes to the long
# benchmark, whose JSON is read even when the timeout cuts it short. Logs are packed into
# OUT_DIR/gpu_check.tar.gz next to the benchmark JSON and summary.txt (a relative OUT_DIR is taken
# from the caller's folder).
# -Werror stays off for a build here: CI enforces it with this project's compilers, and an untried
# host compiler's new warning must not cost a device run. The CPU suite is not built: CI runs it.
# Debian -dev packages the build needs: bench/fetch_gpu_deps.sh unpacks them into .deps/ where apt
# works (carry it to the GPU machine); this script adds .deps/usr to the search paths.
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh OUT_DIR [quick|long|profile|sanitize|all]}
stage=${2:-all}
case "$stage" in quick|long|profile|sanitize|all) ;; *) echo "gpu_check: unknown stage '$stage'" >&2; exit 2 ;; esac
budget=${GPU_CHECK_BUDGET:-540}
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
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1
  nvcc --version | tail -2
  lscpu | grep -E 'Model name|^CPU\(s\)'
} > "$logs/machine.txt" 2>&1

left() { echo $((budget - SECONDS)); }
step_timeout() {  # the smaller of the step's share and what is left, never below 20 s
  local t=$(( $1 < $(left) ? $1 : $(left) ))
  echo $(( t > 20 ? t : 20 ))
}
pack() {  # one archive of the logs, plus the summary and JSON as plain files
  cp "$logs/machine.txt" "$out/" 2>/dev/null
  tar -czf "$out/gpu_check.tar.gz" -C "$logs" . 2>/dev/null
}
summary() { tee -a "$out/summary.txt"; }
: > "$out/summary.txt"

# The programs: prebuilt ones if they start here, else a build.
bin=""
if [ -x .gpubin/dc_cuda_tests ] && [ -x .gpubin/bench_cuda ] && [ -x .gpubin/bench_cuda_long ]; then
  built_in=$(cat .gpubin/source_dir 2>/dev/null || echo "$root")
  # The tests open their fixtures under the folder they were built in: point it here.
  if [ "$built_in" != "$root" ] && [ ! -e "$built_in/tests/fixtures" ]; then
    mkdir -p "$(dirname "$built_in")" && ln -sfn "$root" "$built_in"
  fi
  # Where the CUDA libraries may live on that machine, then the OpenMP runtime prebuild copied.
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib "$root/.gpubin/lib"; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
  done
  timeout 60 .gpubin/dc_cuda_tests --list-test-cases > "$logs/list.txt" 2>&1
  listed=$?  # 0, or 77 where no device is usable: either way the program started
  if ldd .gpubin/dc_cuda_tests .gpubin/bench_cuda .gpubin/bench_cuda_long > "$logs/ldd.txt" 2>&1 && ! grep -q "not found" "$logs/ldd.txt" &&
     { [ $listed = 0 ] || [ $listed = 77 ]; }; then
    bin="$root/.gpubin"
    echo "programs: prebuilt ($(tr '\n' ' ' < .gpubin/commit))" | summary
  else
    echo "programs: the prebuilt ones do not start here (ldd.txt, list.txt in the archive); building" | summary
  fi
fi
if [ -z "$bin" ]; then
  targets="dc_cuda_tests bench_cuda"  # build only what the stage runs
  case "$stage" in long|profile) targets=bench_cuda_long ;; all) targets="$targets bench_cuda_long" ;; esac
  generator=$(command -v ninja >/dev/null && echo Ninja || echo "Unix Makefiles")
  if ! { timeout 60 cmake -S . -B build/gpu -G "$generator" -DCMAKE_BUILD_TYPE=Release -DDC_CUDA=ON \
           -DCMAKE_CUDA_ARCHITECTURES=90 -DDC_WERROR=OFF -DDC_BUILD_EXAMPLES=OFF > "$logs/build.log" 2>&1 &&
         timeout "$(step_timeout 330)" cmake --build build/gpu -j "$(nproc)" --target $targets \
           >> "$logs/build.log" 2>&1; }; then
    echo "gpu_check: build failed" | summary
    tail -40 "$logs/build.log" | summary
    pack
    exit 1
  fi
  mkdir -p build/gpu/bin
  for t in $targets; do  # the test program is under tests/, the benchmarks under bench/
    for dir in tests bench; do [ -x "build/gpu/$dir/$t" ] && cp "build/gpu/$dir/$t" build/gpu/bin/; done
  done
  bin="$root/build/gpu/bin"
  echo "programs: built here in ${SECONDS} s" | summary
fi

status=0
if [ "$stage" = quick ] || [ "$stage" = all ]; then
  timeout "$(step_timeout 100)" "$bin/dc_cuda_tests" -d > "$logs/cuda_tests.log" 2>&1
  tests_rc=$?
  [ $tests_rc = 0 ] || status=1
  {
    echo "== dc_cuda_tests: exit status $tests_rc"
    grep -E "test cases|assertions|SKIPPED|ERROR|FAILED|CHECK|REQUIRE|TEST CASE|values:" "$logs/cuda_tests.log" | head -60
    tail -3 "$logs/cuda_tests.log"
  } | summary
  timeout "$(step_timeout 100)" "$bin/bench_cuda" --benchmark_out="$out/bench_cuda.json" \
    --benchmark_out_format=json > "$logs/bench_cuda.txt" 2>&1 || status=1
  { echo "== bench_cuda"; tail -30 "$logs/bench_cuda.txt"; } | summary
fi
if [ "$stage" = long ] || [ "$stage" = all ]; then
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv > "$logs/memory_before.txt" 2>&1
  timeout "$(step_timeout 240)" "$bin/bench_cuda_long" --benchmark_out="$out/bench_cuda_long.json" \
    --benchmark_out_format=json > "$logs/bench_cuda_long.txt" 2>&1 || status=1
  {
    echo "== bench_cuda_long"
    tail -12 "$logs/bench_cuda_long.txt"
    python3 bench/gpu_long_summary.py "$out/bench_cuda_long.json" 2>&1
  } | summary
fi
if [ "$stage" = profile ] || [ "$stage" = all ]; then
  # Each benchmark brackets its second step with cudaProfilerStart/Stop: one step's kernels
  # (evict_phases: its second in-place eviction).
  for filter in "full/S:1/" "full/S:16/" "once/S:1/" "evict_phases"; do
    name=$(echo "$filter" | tr -d '/:' | tr '%' 'p')
    [ "$(left)" -gt 40 ] || { echo "profile $filter: no time left" | summary; break; }
    if ! command -v ncu > /dev/null; then echo "profile: ncu not found" | summary; break; fi
    timeout "$(step_timeout 120)" ncu --profile-from-start off --clock-control none \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
      --log-file "$logs/ncu_$name.csv" "$bin/bench_cuda_long" --benchmark_filter="$filter" \
      > "$logs/ncu_$name.txt" 2>&1 || status=1
    { echo "== profile $filter"; python3 bench/ncu_summary.py "$logs/ncu_$name.csv" 2>&1 | head -40; } | summary
  done
fi
if [ "$stage" = sanitize ] || { [ "$stage" = all ] && [ "$(left)" -gt 90 ]; }; then
  timeout "$(step_timeout 500)" compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 \
    "$bin/dc_cuda_tests" > "$logs/memcheck.log" 2>&1 || status=1
  { echo "== memcheck"; grep -E "ERROR SUMMARY|Invalid|test cases|assertions" "$logs/memcheck.log" | head -30; tail -5 "$logs/memcheck.log"; } | summary
fi
echo "gpu_check $stage: status $status after ${SECONDS} s" | summary
pack
exit $status
