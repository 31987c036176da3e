#!/usr/bin/env bash
# The main job: builds examples/generate and continues a prompt with the bundled tiny Mistral
# checkpoint (random weights, Hugging Face format). Extra arguments go to generate, e.g.
#   bash scripts/run.sh --temperature 0.8 --seed 1
# The real SmolLM2 model becomes the default once the GGUF loader lands.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DDC_BUILD_TESTS=OFF -DDC_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j "$(nproc)" --target generate
exec build/release/examples/generate --model tests/fixtures/tiny_mistral --tokens 1,17,42,99 \
  --max-new-tokens 32 "$@"
