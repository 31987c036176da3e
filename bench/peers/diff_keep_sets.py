#!/usr/bin/env python3
"""Where distillcache's kept sets differ from kvpress's, and whether each difference is a tie.

Inputs: kvpress_keep_sets.py's two CSVs (kept positions and every token's score per press,
context, layer and KV head) and examples/eval --keep-sets output (policy,granularity,budget,
context,layer,kv_head,positions). For every (press, context, layer, head) it counts the positions
kept by one side only and, from kvpress's own scores, the relative gap between the lowest score
kept by kvpress and the highest score it dropped at the same cut: a difference where that gap is
below --tie (or zero: exact ties) is a near-tie that summation order alone can flip. Standard
library only.

  python3 bench/peers/diff_keep_sets.py \
      --kvpress-keep bench/peers/results/kvpress_keep_sets_L1024_b0.125.csv \
      --kvpress-scores bench/peers/results/kvpress_scores_L1024_b0.125.csv \
      --ours bench/peers/results/distillcache_keep_sets_L1024_b0.125.csv --budget 0.125
"""
import argparse
import csv
import sys

PAIRS = {"snapkv": "snapkv", "knorm": "knorm", "h2o": "observed", "streaming": "streaming",
         "tova": "tova", "expected": "expected"}


def positions(text):
    return set(int(x) for x in text.split()) if text else set()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvpress-keep", required=True)
    ap.add_argument("--kvpress-scores", required=True)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--budget", type=float, required=True)
    ap.add_argument("--tie", type=float, default=1e-5, help="relative score gap counted as a tie")
    args = ap.parse_args()
    csv.field_size_limit(sys.maxsize)

    theirs = {}
    with open(args.kvpress_keep, newline="") as f:
        for r in csv.DictReader(f):
            theirs[(r["press"], int(r["context"]), int(r["layer"]), int(r["kv_head"]))] = positions(r["positions"])
    ours = {}
    with open(args.ours, newline="") as f:
        for r in csv.DictReader(f):
            if abs(float(r["budget"]) - args.budget) > 1e-9:
                continue
            ours[(r["policy"], int(r["context"]), int(r["layer"]), int(r["kv_head"]))] = positions(r["positions"])

    summary = {}  # press -> [rows, rows differing, positions differing, differing rows at a tie]
    examples = []
    with open(args.kvpress_scores, newline="") as f:
        for r in csv.DictReader(f):
            press = r["press"]
            key = (press, int(r["context"]), int(r["layer"]), int(r["kv_head"]))
            mine = ours.get((PAIRS[press],) + key[1:])
            if mine is None or key not in theirs:
                continue
            kept = theirs[key]
            scores = [float(x) for x in r["scores"].split()]
            s = summary.setdefault(press, [0, 0, 0, 0])
            s[0] += 1
            only = kept ^ mine
            if not only:
                continue
            lowest_kept = min(scores[p] for p in kept)
            highest_dropped = max(scores[p] for p in range(len(scores)) if p not in kept)
            gap = (lowest_kept - highest_dropped) / max(abs(lowest_kept), 1e-30)
            s[1] += 1
            s[2] += len(only) // 2
            tie = gap <= args.tie
            s[3] += tie
            if len(examples) < 12:
                examples.append((press, key[1:], len(only) // 2, gap, tie))

    print("| press | (context, layer, head) rows | rows that differ | positions swapped | "
          "of the differing rows, at a tie (gap <= %g) |" % args.tie)
    print("|---|---:|---:|---:|---:|")
    for press, (rows, differ, swapped, ties) in sorted(summary.items()):
        print(f"| {press} | {rows} | {differ} | {swapped} | {ties} |")
    print("\nFirst differing rows: press, (context, layer, kv head), positions swapped, relative gap "
          "at kvpress's cut (lowest kept - highest dropped score)")
    for press, key, swapped, gap, tie in examples:
        print(f"- {press} {key}: {swapped} swapped, gap {gap:.2e}{' (tie)' if tie else ''}")


if __name__ == "__main__":
    main()
