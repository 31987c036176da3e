#!/usr/bin/env python3
"""Paired comparison of policies on the same contexts, from examples/eval --per-context CSV files.

The evaluator's tables give each policy's KL averaged over a handful of windows; whether one
policy is ahead of another by more than the windows' own spread needs the differences taken
context by context (every policy sees the same prompts and continuations). For each budget this
prints every policy's mean KL and, against the reference policy, the
mean paired difference with a 95 % interval (Student's t over the contexts), the median paired
difference and how many contexts each one wins. KL per window is heavy-tailed (on 64 Python-docs
windows at 12.5 %, two windows moved a policy's mean by 0.018 while it won 42 of 64), so a mean and
a median of opposite signs say that a few windows decide the mean.

    python3 bench/paired_kl.py per_context.csv [more.csv ...] --reference "distillcache (head)"

Several files are joined (e.g. the learned policy and the baselines run separately on the same
--text, --context, --continuation and --max-contexts); a context is compared only where both
policies have it.
"""
import argparse
import csv
import math
from collections import defaultdict

# Two-sided 97.5 % quantiles of Student's t for 1..30 degrees of freedom; 1.96 beyond.
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042]


def t975(dof):
    return T975[dof - 1] if 1 <= dof <= len(T975) else 1.96


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return float("nan")
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def load(paths):
    """{budget: {"policy (granularity)": {context: kl}}}: a policy whose rule caps the granularity
    (TOVA runs per layer) is compared at the granularity it ran at."""
    table = defaultdict(lambda: defaultdict(dict))
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                name = f"{row['policy']} ({row['granularity']})"
                table[float(row["budget"])][name][int(row["context"])] = float(row["kl_mean"])
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", help="examples/eval --per-context files")
    parser.add_argument("--reference", default="distillcache (head)",
                        help="the policy the others are compared with, as 'name (granularity)'")
    args = parser.parse_args()
    table = load(args.csv)
    for budget, policies in sorted(table.items()):
        ref = policies.get(args.reference)
        print(f"\nbudget {budget:g}: KL, and the paired difference (policy - {args.reference})")
        print("| policy | contexts | mean KL | difference | 95 % interval | median difference | contexts it wins |")
        print("|---|---:|---:|---:|---|---:|---:|")
        for name, kl in sorted(policies.items(), key=lambda item: sum(item[1].values()) / len(item[1])):
            mean = sum(kl.values()) / len(kl)
            if ref is None or name == args.reference:
                print(f"| {name} | {len(kl)} | {mean:.4f} | | | | |")
                continue
            shared = sorted(set(kl) & set(ref))
            diffs = [kl[c] - ref[c] for c in shared]
            n = len(diffs)
            d = sum(diffs) / n if n else float("nan")
            sd = math.sqrt(sum((x - d) ** 2 for x in diffs) / (n - 1)) if n > 1 else float("nan")
            half = t975(n - 1) * sd / math.sqrt(n) if n > 1 else float("nan")
            wins = sum(1 for x in diffs if x < 0)
            print(f"| {name} | {n} | {mean:.4f} | {d:+.4f} | [{d - half:+.4f}, {d + half:+.4f}] | "
                  f"{median(diffs):+.4f} | {wins}/{n} |")


if __name__ == "__main__":
    main()
