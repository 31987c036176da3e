#!/usr/bin/env bash
# The main job: SmolLM2-135M-Instruct (GGUF, fetched once) reads the first 1024 tokens of a Vim
# help file, keeps 25 % of its KV cache with the shipped learned policy (policies/) and with the
# best heuristic at that budget (H2O, one keep-set per layer and KV head), and prints for each the
# cache bytes saved (and still reserved) and its KL, top-1 agreement and perplexity ratio against
# the full cache on 64 generated tokens, then the text each generates (examples/infer). Extra
# arguments go to infer and override the defaults, e.g.
#   bash scripts/run.sh --budget 0.125 --policy distillcache,h2o,snapkv
#   bash scripts/run.sh --prompt "The capital of France is" --max-new-tokens 16
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh vim-runtime
model=$(bash scripts/fetch_model.sh)
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DDC_BUILD_TESTS=OFF -DDC_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j "$(nproc)" --target infer
text=(--text /usr/share/vim/vim90/doc/usr_02.txt)
for a in "$@"; do [[ $a == --prompt || $a == --text ]] && text=(); done
exec build/release/examples/infer --model "$model" "${text[@]}" --context 1024 --budget 0.25 \
  --policy distillcache,h2o --granularity head --max-new-tokens 64 "$@"
