#!/usr/bin/env bash
# Trains the shipped policy (policies/smollm2-135m-instruct.dcpolicy) from scratch on this
# machine: SmolLM2-135M-Instruct, the Python 3.11 documentation Debian ships (python3.11-doc,
# disjoint from the Vim help files the evaluation uses), REINFORCE at head granularity on
# 512-token prompts: a warm start that imitates H2O's heavy-hitter score with the newest half of
# the budget always kept (--recent-fraction 0.5), then 20 REINFORCE updates (5 to 7 minutes
# here). The network is small on purpose (policy v3: two hidden layers of 16 and 8, ReLU, 232
# multiply-adds a row): the policy scores every cached row at every eviction, and v2's 32, 32
# SiLU made an eviction 1.4-1.8x H2O's for the same held-out KL (bench/results/README.md). Writes runs/smollm2/{checkpoint,best}.dcpolicy and train_log.csv, then copies the best
# (by held-out KL) into policies/. Extra arguments go to examples/train.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh python3.11-doc
model=$(bash scripts/fetch_model.sh)
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DDC_BUILD_TESTS=OFF -DDC_BUILD_BENCH=OFF >/dev/null
cmake --build build/release -j "$(nproc)" --target train
build/release/examples/train --model "$model" --out runs/smollm2 \
  --text /usr/share/doc/python3.11/html/_sources/library \
  --context 512 --continuation 16 --budget 0.125,0.25,0.5 --rollouts 6 --granularity head \
  --updates 100 --stop-after 20 --warmup 5 --lr 1e-3 --lr-floor 1e-4 --explore-groups 4 \
  --validation-contexts 6 --validate-every 10 --checkpoint-every 10 --window 0 \
  --inputs alpha,value_norm,head_variance,entropy,position,last_alpha \
  --init-target h2o --recent-fraction 0.5 --dtype bf16 --hidden 16,8 --activation relu "$@"
cp runs/smollm2/best.dcpolicy policies/smollm2-135m-instruct.dcpolicy
echo "train_policy: policies/smollm2-135m-instruct.dcpolicy updated"
