#!/usr/bin/env bash
# ThreadSanitizer run of the CPU suite, OpenMP parallel regions included. Builds build/tsan with
# clang (OpenMP from LLVM's libomp, never GCC's libgomp: libgomp is not TSan-aware) and runs
# ctest -L cpu with more OpenMP threads than cores, Archer (LLVM's OMPT tool that tells TSan about
# libomp's barriers, locks, tasks and reductions) loaded, and the first race report fatal.
#
#   bash scripts/tsan.sh [--no-model] [--repeat N]
#
#   --no-model   leave out the real-model tests (label model), so no network is needed
#   --repeat N   run each test up to N times (stopping at the first failure): more interleavings
# Environment: DC_TSAN_THREADS (OMP_NUM_THREADS, default 4), DC_ARCHER (path of libarcher.so).
#
# TSAN_OPTIONS: halt_on_error=1 (a race fails the test), second_deadlock_stack=1 (both stacks of a
# lock-order inversion), ignore_noninstrumented_modules=1 (libomp.so itself is not compiled with
# -fsanitize=thread: without this TSan reports races between libomp's own internals, e.g.
# pthread_mutex_init vs pthread_mutex_lock inside libomp, which no code of ours touches; Archer
# prints a warning asking for it. Accesses in our code inside parallel regions are still checked).
# A false positive that survives this goes in scripts/tsan.supp (used when present), one entry per
# line with a comment saying why it is not a real race. Never suppress a race in include/.
set -euo pipefail
cd "$(dirname "$0")/.."

with_model=1
repeat=1
while (($#)); do
  case $1 in
    --no-model) with_model=0 ;;
    --repeat) repeat=${2:?--repeat needs a count}; shift ;;
    *) echo "tsan: unknown argument '$1' (--no-model, --repeat N)" >&2; exit 2 ;;
  esac
  shift
done

bash scripts/setup.sh
# ---- toolchain: clang++ that builds an OpenMP program with -fsanitize=thread against libomp ----
probe() {
  echo 'int main() { int s = 0;
#pragma omp parallel for reduction(+ : s)
for (int i = 0; i < 8; ++i) s += i;
return s == 28 ? 0 : 1; }' |
    clang++ -x c++ -fopenmp=libomp -fsanitize=thread - -o "/tmp/dc_tsan_probe.$$" >/dev/null 2>&1
  local rc=$?
  rm -f "/tmp/dc_tsan_probe.$$"
  return $rc
}
if ! command -v clang++ >/dev/null 2>&1 || ! probe; then
  echo "tsan: installing clang libomp-dev"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq || { echo "tsan: apt-get update failed" >&2; exit 1; }
  $sudo apt-get install -y -qq --no-install-recommends clang libomp-dev ||
    { echo "tsan: could not install clang libomp-dev" >&2; exit 1; }
  probe || { echo "tsan: clang++ still cannot build an OpenMP program with -fsanitize=thread" >&2; exit 1; }
fi

ctest_args=(-L cpu)
if ((with_model)); then
  DC_SMOLLM2_GGUF=$(bash scripts/fetch_model.sh)
  export DC_SMOLLM2_GGUF
else
  ctest_args+=(-LE model)
fi
jobs=$(nproc)
build=build/tsan

echo "== build (TSan, clang) =="
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDC_CUDA=OFF \
  -DDC_SANITIZE=thread -DDC_BUILD_EXAMPLES=OFF -DDC_BUILD_BENCH=OFF
# Keep going past a test that does not compile, so the others still run; it is reported below and
# fails the script. Its stale executable (if any) is removed so ctest cannot run an old build.
build_log="$build/build.log"
build_ok=1
cmake --build "$build" -j "$jobs" -- -k 0 2>&1 | tee "$build_log" || build_ok=0
unbuilt=()
if ((!build_ok)); then
  mapfile -t unbuilt < <(sed -nE 's#^FAILED: tests/(CMakeFiles/)?(test_[A-Za-z0-9_]+)(\.dir/.*)?[[:space:]]*$#\2#p' "$build_log" | sort -u)
  ((${#unbuilt[@]})) || { echo "tsan: the build failed (see $build_log)" >&2; exit 1; }
  for t in "${unbuilt[@]}"; do rm -f "$build/tests/$t"; done
  exclude=$(printf '|cpu\\.%s$' "${unbuilt[@]}")
  ctest_args+=(-E "^(${exclude:1})")
fi

# ---- the OpenMP runtime must be LLVM's libomp, and Archer must come from the same LLVM ----------
# test_hf_parity runs parallel regions with 1 and 2 threads: the runtime and Archer are checked on it.
probe_bin="$build/tests/test_hf_parity"
[ -x "$probe_bin" ] || { echo "tsan: $probe_bin was not built" >&2; exit 1; }
omp_line=$(ldd "$probe_bin" | grep -E 'lib(g?omp|iomp5)[^ ]*\.so' || true)
echo "tsan: $(basename "$probe_bin"): ${omp_line:-no OpenMP runtime linked}"
if ! grep -q 'libomp\.so' <<<"$omp_line" || grep -q 'libgomp' <<<"$omp_line"; then
  echo "tsan: the tests must link LLVM's libomp (not libgomp, not serial); check FindOpenMP" >&2
  exit 1
fi
for t in "$build"/tests/test_*; do
  if [ -f "$t" ] && ldd "$t" | grep -q libgomp; then echo "tsan: $t links libgomp" >&2; exit 1; fi
done
archer=${DC_ARCHER:-}
if [ -z "$archer" ]; then
  omp_dir=$(dirname "$(awk '/libomp\.so/ {print $3; exit}' <<<"$omp_line")")
  for cand in "$omp_dir/libarcher.so" "$(clang++ -print-file-name=libarcher.so)" \
              "$(llvm-config --libdir 2>/dev/null || true)/libarcher.so"; do
    if [ -f "$cand" ] && [ "${cand:0:1}" = / ]; then archer=$cand; break; fi
  done
fi
[ -f "${archer:-}" ] || { echo "tsan: libarcher.so not found (libomp-dev); set DC_ARCHER" >&2; exit 1; }
echo "tsan: archer: $archer"

export OMP_NUM_THREADS=${DC_TSAN_THREADS:-4}
export OMP_TOOL_LIBRARIES=$archer
tsan_options=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1
[ -f scripts/tsan.supp ] && tsan_options+=":suppressions=$(pwd)/scripts/tsan.supp"
export TSAN_OPTIONS=$tsan_options
# LLVM 14's TSan cannot map its shadow memory with more than 28 bits of mmap randomisation
# ("FATAL: ThreadSanitizer: unexpected memory mapping"); run without ASLR there.
launcher=()
if [ "$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)" -gt 28 ]; then
  launcher=(setarch "$(uname -m)" -R)
fi
# Archer must actually be loaded: it says so once libomp starts with ARCHER_OPTIONS=verbose=1.
archer_says=$(ARCHER_OPTIONS=verbose=1 "${launcher[@]}" "$probe_bin" 2>&1 || true)
if ! grep -q "Archer detected OpenMP application" <<<"$archer_says"; then
  echo "tsan: Archer did not load ($archer); check OMP_TOOL_LIBRARIES" >&2
  exit 1
fi

echo "== tests under TSan (OMP_NUM_THREADS=$OMP_NUM_THREADS, TSAN_OPTIONS=$TSAN_OPTIONS) =="
status=0
"${launcher[@]}" ctest --test-dir "$build" --output-on-failure -j "$jobs" --repeat "until-fail:$repeat" \
  "${ctest_args[@]}" || status=1
if ((${#unbuilt[@]})); then
  echo "tsan: NOT BUILT, so not run: ${unbuilt[*]} (compiler errors in $build_log)" >&2
  status=1
fi
exit $status
