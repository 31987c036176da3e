#!/usr/bin/env bash
# llama.cpp beside distillcache, in one run, on the same GGUF and the same 2 threads.
#
#   bash bench/peers/llama_cpp.sh [OUT_DIR]     (default bench/results/peers_llama_cpp)
#
# 1. Builds llama.cpp's llama-bench (CPU, GGML_NATIVE) from the sources that PyPI's
#    llama-cpp-python vendors (no other network source is reachable here), once, under
#    $DC_PEERS_CACHE (default ~/.cache/distillcache/peers).
# 2. Runs llama-bench on SmolLM2-135M-Instruct.Q4_1.gguf: decode (tg32) at depths 0/512/2048/8192
#    and prefill (pp512, pp2048), 3 repetitions, JSON.
# 3. Runs bench_cpu's matching benchmarks (fp32, bf16 and the GGUF's own blocks), JSON.
# 4. Writes OUT_DIR/side_by_side.md from both (bench/peers/llama_cpp_table.py).
# Needs: pip, cmake, ninja or make, a C++ compiler, and build/bench/bench/bench_cpu (or $DC_BENCH_CPU; configure
# with -DDC_BUILD_BENCH=ON, Release). Takes about 15 minutes to build llama-bench on 2 cores, and
# about as long to run both.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$repo/bench/results/peers_llama_cpp}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
version=0.3.36
cache="${DC_PEERS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/distillcache/peers}"
model="${DC_SMOLLM2_GGUF:-${XDG_CACHE_HOME:-$HOME/.cache}/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf}"
bench_cpu="${DC_BENCH_CPU:-$repo/build/bench/bench/bench_cpu}"  # or any Release build's bench_cpu
threads=2

[[ -f "$model" ]] || { echo "llama_cpp.sh: no model at $model (bash scripts/fetch_model.sh)" >&2; exit 1; }
[[ -x "$bench_cpu" ]] || { echo "llama_cpp.sh: no $bench_cpu (cmake -S . -B build/bench -DCMAKE_BUILD_TYPE=Release -DDC_BUILD_BENCH=ON && cmake --build build/bench --target bench_cpu)" >&2; exit 1; }

llama_bench="$cache/llama.cpp-$version/build/bin/llama-bench"
if [[ ! -x "$llama_bench" ]]; then
  mkdir -p "$cache"
  echo "== fetching llama-cpp-python $version (sdist) for its vendored llama.cpp"
  python3 -m pip download "llama-cpp-python==$version" --no-deps --no-binary :all: -d "$cache" >/dev/null
  rm -rf "$cache/llama_cpp_python-$version" "$cache/llama.cpp-$version"
  tar -xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
  mv "$cache/llama_cpp_python-$version/vendor/llama.cpp" "$cache/llama.cpp-$version"
  rm -rf "$cache/llama_cpp_python-$version"
  # Not GGML_NATIVE: on this machine (Sapphire Rapids in a VM) the CPU reports AMX, which ggml's
  # native build then uses, and the sandbox does not grant it (llama-bench dies with SIGILL). The
  # vector extensions are named instead: AVX2, FMA, F16C, AVX-512 with VNNI, VBMI and BF16.
  echo "== building llama-bench (CPU: AVX2, AVX-512 VNNI/VBMI/BF16, no AMX)"
  cmake -S "$cache/llama.cpp-$version" -B "$cache/llama.cpp-$version/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_TOOLS=ON >"$cache/llama_cpp_build.log" 2>&1
  cmake --build "$cache/llama.cpp-$version/build" --target llama-bench -j "$threads" >>"$cache/llama_cpp_build.log" 2>&1
fi

{
  echo "date: $(date -u +%FT%TZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "cores: $(nproc), threads used: $threads"
  echo "model: $(basename "$model") ($(stat -c %s "$model") bytes)"
  echo "llama.cpp: vendored in llama-cpp-python $version, $("$llama_bench" --version 2>&1 | head -1 || true)"
  echo "distillcache: $(git -C "$repo" rev-parse --short HEAD)"
} >"$out/machine.txt"

echo "== llama-bench (decode tg32 at depths 0,512,2048,8192; prefill pp512, pp2048)"
"$llama_bench" -m "$model" -t "$threads" -p 0 -n 32 -d 0,512,2048,8192 -r 3 -o json >"$out/llama_bench_decode.json"
"$llama_bench" -m "$model" -t "$threads" -p 512,2048 -n 0 -r 2 -o json >"$out/llama_bench_prefill.json"

echo "== distillcache bench_cpu (same machine, same run)"
OMP_NUM_THREADS=$threads "$bench_cpu" \
  --benchmark_filter='smollm2_(decode|decode_bf16|decode_gguf|decode_gguf_kv_bf16)/(512|2048|8191)$|smollm2_decode_batch_gguf_kv_bf16/|smollm2_decode_batch_bf16/|smollm2_prefill(_gguf)?/(512|2048)/' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/distillcache_bench.json" --benchmark_out_format=json >/dev/null

python3 "$repo/bench/peers/llama_cpp_table.py" "$out" >"$out/side_by_side.md"
cat "$out/side_by_side.md"
