#!/usr/bin/env bash
# Builds the CUDA test and benchmark programs for sm_90 here (nvcc needed, no GPU) and copies them
# into .gpubin/ (git-ignored) with the path of the fixtures they were built against, so a lent GPU
# machine runs them at once instead of spending device time on a build: name .gpubin and .deps in
# the device tool's carry list (bench/fetch_gpu_deps.sh makes .deps: the benchmark library the
# programs link). bench/gpu_check.sh uses .gpubin when its programs start there and builds
# otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(dc_cuda_tests bench_cuda bench_cuda_long)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DDC_WERROR=ON -DDC_BUILD_EXAMPLES=OFF > /dev/null
ninja -C build/gpu "${targets[@]}"
rm -rf .gpubin && mkdir -p .gpubin
cp build/gpu/tests/dc_cuda_tests build/gpu/bench/bench_cuda build/gpu/bench/bench_cuda_long .gpubin/
strip --strip-debug .gpubin/* 2>/dev/null || true
# The OpenMP runtime the programs link, in case that machine has none (gpu_check.sh puts this
# folder last on the library path).
mkdir -p .gpubin/lib && cp -L "$(gcc -print-file-name=libgomp.so.1)" .gpubin/lib/
echo "$PWD" > .gpubin/source_dir  # the tests open fixtures under this path (DC_FIXTURE_DIR)
git rev-parse HEAD > .gpubin/commit
git diff --quiet HEAD -- include tests bench || echo "uncommitted changes" >> .gpubin/commit
du -sh .gpubin
