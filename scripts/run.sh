#!/usr/bin/env bash
# The main job: fetches SmolLM2-135M-Instruct (GGUF, cached), builds examples/generate and
# continues a prompt on the CPU. Extra arguments go to generate and override the defaults, e.g.
#   bash scripts/run.sh --prompt "Once upon a time" --temperature 0.8 --seed 1
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
model=$(bash scripts/fetch_model.sh)
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DDC_BUILD_TESTS=OFF -DDC_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j "$(nproc)" --target generate
prompt=(--prompt "The capital of France is")
for a in "$@"; do [[ $a == --prompt || $a == --tokens ]] && prompt=(); done
exec build/release/examples/generate --model "$model" "${prompt[@]}" --max-new-tokens 32 "$@"
