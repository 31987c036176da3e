#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, seeds their corpora from tests/fixtures and
# runs each target for a while.
#
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]      default: 60 s each, all five targets
#
# Targets: gguf safetensors hf_config tokenizer policy_checkpoint. Environment:
#   DC_FUZZ_JOBS=N     targets run N at a time (default 1; each is one process on one core)
#   DC_FUZZ_BUILD=DIR  build directory (default fuzz/build; the corpora live in DIR/corpus)
#   DC_SMOLLM2_GGUF    the SmolLM2 GGUF the tokenizer target loads (default: fetch_model.sh cache)
#   FUZZ_ARGS          extra libFuzzer flags for every target
# A crash, leak, timeout or out-of-memory input is written to fuzz/findings/<target>/ (and the
# script exits 1); reproduce it with  fuzz/build/fuzz_<target> fuzz/findings/<target>/<file>,
# fix the library, then commit the input to tests/fixtures/fuzz/<target>/ as a regression test.
# Each run's log, with libFuzzer's final stats, is in DIR/logs/<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

seconds=${1:-60}
shift || true
all_targets=(gguf safetensors hf_config tokenizer policy_checkpoint)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  case " ${all_targets[*]} " in *" $t "*) ;; *) echo "fuzz: unknown target '$t' (${all_targets[*]})" >&2; exit 2 ;; esac
done
build=${DC_FUZZ_BUILD:-$root/fuzz/build}
jobs=${DC_FUZZ_JOBS:-1}

# ---- toolchain: clang with libFuzzer and the sanitizer runtimes ----------------------------------
find_clang() {
  for c in clang++ clang++-19 clang++-18 clang++-17 clang++-16 clang++-15 clang++-14; do
    if command -v "$c" >/dev/null 2>&1 &&
       echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
         "$c" -x c++ -fsanitize=fuzzer,address,undefined - -o /tmp/dc_fuzz_probe.$$ >/dev/null 2>&1; then
      rm -f /tmp/dc_fuzz_probe.$$
      echo "$c"
      return 0
    fi
  done
  rm -f /tmp/dc_fuzz_probe.$$
  return 1
}
if ! cxx=$(find_clang); then
  echo "fuzz: no clang with libFuzzer found; installing clang, libclang-rt-14-dev and llvm"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq clang libclang-rt-14-dev llvm ||
    $sudo apt-get install -y -qq clang llvm  # older releases ship libFuzzer in libclang-common
  cxx=$(find_clang) || { echo "fuzz: clang still cannot build a libFuzzer target" >&2; exit 1; }
fi
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja) || gen=()

echo "== build ($cxx) =="
CXX=$cxx cmake -S fuzz -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")

# ---- corpora: fixtures + hand-made seeds + every committed regression input -----------------------
python3 fuzz/make_seeds.py "$build/seeds" >/dev/null
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t" "fuzz/findings/$t"
  if [ -d "tests/fixtures/fuzz/$t" ]; then
    cp -n "tests/fixtures/fuzz/$t"/* "$build/seeds/$t/" 2>/dev/null || true
  fi
done

declare -A max_len=([gguf]=32768 [safetensors]=32768 [hf_config]=4096 [tokenizer]=4096 [policy_checkpoint]=16384)

run_target() {
  local t=$1 log="$build/logs/$1.log"
  local before
  before=$(find "fuzz/findings/$t" -type f | wc -l)
  # -malloc_limit_mb: a single allocation past 1 GiB is a finding (files here are < 32 KiB);
  # -timeout: an input that takes 10 s is a finding (e.g. a quadratic tokenizer path).
  "$build/fuzz_$t" "$build/corpus/$t" "$build/seeds/$t" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -max_len="${max_len[$t]}" -dict="fuzz/dicts/$t.dict" -use_value_profile=1 \
    -artifact_prefix="fuzz/findings/$t/" -print_final_stats=1 ${FUZZ_ARGS:-} >"$log" 2>&1 || true
  local after
  after=$(find "fuzz/findings/$t" -type f | wc -l)
  local last
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  echo "$t: $last"
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$log" | sed "s/^/$t: /" || true
  if [ "$after" -gt "$before" ]; then
    echo "$t: NEW FINDINGS in fuzz/findings/$t/ -- see $log"
    grep -E 'ERROR: |SUMMARY: |Test unit written' "$log" | sed "s/^/$t: /" || true
    return 1
  fi
}

mkdir -p "$build/logs"
echo "== fuzzing ${targets[*]} for ${seconds}s each, $jobs at a time =="
status=0
pids=()
for t in "${targets[@]}"; do
  run_target "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || status=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
[ $status -eq 0 ] && echo "fuzz: no findings" || echo "fuzz: findings above"
exit $status
