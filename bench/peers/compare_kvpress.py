#!/usr/bin/env python3
"""Side by side: kvpress's presses against distillcache's baselines of the same rule.

Reads kvpress_eval.py's results (results/kvpress_smollm2.csv: method,budget,context,kl_mean,...)
and examples/eval's CSVs (policy,granularity,budget,kl_mean,..., one file per context length L),
pairs each press with the distillcache policy that follows its rule, and prints a markdown table
with both KLs, their difference and both top-1 agreements. Standard library only.

  python3 bench/peers/compare_kvpress.py --kvpress bench/peers/results/kvpress_smollm2.csv \
      --kvpress bench/peers/results/kvpress_smollm2_expected.csv \
      --ours 1024=bench/results/eval_smollm2_L1024_prefill_head.csv \
      --ours 2048=bench/results/eval_smollm2_L2048_prefill_head.csv
"""
import argparse
import csv
import sys

# kvpress press name in kvpress_eval.py -> distillcache policy name with the same rule.
PAIRS = [
    ("streaming", "streaming"),  # StreamingLLMPress: 4 sinks + recent
    ("h2o", "observed"),  # ObservedAttentionPress: mean attention received, no recent window
    ("snapkv", "snapkv"),  # SnapKVPress: window 64, kernel 5, average pooling
    ("tova", "tova"),  # TOVAPress: newest query, mean over a layer's heads
    ("knorm", "knorm"),  # KnormPress: lowest key norm
    ("expected", "expected"),  # ExpectedAttentionPress: defaults (512 future positions, 4 sinks)
]


def read_kvpress(path):
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows[(r["method"], int(r["context"]), round(float(r["budget"]), 6))] = r
    return rows


def read_ours(spec):
    length, path = spec.split("=", 1)
    rows = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows[(r["policy"], round(float(r["budget"]), 6))] = r
    return int(length), rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvpress", action="append", required=True, help="a kvpress_eval.py CSV")
    ap.add_argument("--ours", action="append", required=True, help="L=path of an eval CSV")
    ap.add_argument("--tolerance", type=float, default=5e-4,
                    help="|KL difference| counted as agreement (three decimals)")
    args = ap.parse_args()
    kvpress = {}
    for path in args.kvpress:
        kvpress.update(read_kvpress(path))
    ours = dict(read_ours(s) for s in args.ours)

    print("| press (kvpress) | distillcache | granularity | L | budget | KL kvpress | KL ours "
          "| difference | top-1 kvpress | top-1 ours | agree |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    agree = total = 0
    for length in sorted(ours):
        for press, policy in PAIRS:
            for budget in (0.125, 0.25, 0.5):
                k = kvpress.get((press, length, budget))
                o = ours[length].get((policy, budget))
                if k is None or o is None:
                    print(f"missing: {press}/{policy} L={length} budget={budget}", file=sys.stderr)
                    continue
                kl_k, kl_o = float(k["kl_mean"]), float(o["kl_mean"])
                ok = abs(kl_k - kl_o) <= args.tolerance
                agree += ok
                total += 1
                print(f"| {press} | {policy} | {o['granularity']} | {length} | {budget} | {kl_k:.4f} "
                      f"| {kl_o:.4f} | {kl_o - kl_k:+.4f} | {float(k['top1_agreement']):.3f} "
                      f"| {float(o['top1_agreement']):.3f} | {'yes' if ok else 'no'} |")
    print(f"\n{agree} of {total} pairs agree within {args.tolerance} nats of KL.")


if __name__ == "__main__":
    main()
