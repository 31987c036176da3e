#!/usr/bin/env python3
"""One policy against the best heuristic on every task cell, from examples/eval --task CSV files.

The issue's target for the learned policy on the RULER-style tasks is an accuracy at each budget
at least the best heuristic's. The evaluator's table lists every policy on its own row; this
joins one or more of its CSV files (e.g. the learned policy run on its own, the heuristics taken
from an earlier run of the same deterministic suite) and prints, per task, length and budget, the
policy's answers, the best heuristic's (and which one), and whether the policy is at least as good.
Cells the full cache itself answers in fewer than half of the samples are marked: there the
comparison says little about what eviction keeps.

    python3 bench/task_vs_best.py new.csv old.csv [...] --policy "distillcache v10" \
        [--heuristics h2o,snapkv,streaming,tova,observed,knorm,expected] [--markdown] \
        [--answers new_answers.csv [--per-task]]

With --answers (examples/eval --answers of a run that holds the policy and some heuristics), the
policy is also compared prompt by prompt with each heuristic in that file (or files: --answers
repeated pools runs on other prompts, such as another --seed's), pooled over the tasks
the full cache answers at least once: the mean paired score difference per prompt and its 95 %
bootstrap interval (10000 resamples of the prompts, a fixed seed, so the interval reproduces).
--per-task adds the same comparison for each task cell on its own (every task, its own seed), which
is what tells a cell's deficit from noise.

With --fidelity (and --answers), the comparison is with the full cache's own answers instead
of the right ones, which is what an eviction policy trained to stay close to the full cache aims
at (a heuristic can score above the full cache: on fwe H2O's eviction of rare words helps the
count): per (length, budget) and every task (those the full cache gets wrong too), each policy's
share of outputs identical to the full cache's (as examples/eval's same_as_full) and its mean
|score - full cache's score| per prompt, then the policy's paired lead on both over each
heuristic (positive: closer to the full cache), with the same intervals; --per-task adds the
task cells.

A (task, length, budget, policy) present in several files is taken from the first file that has
it, so list the newest run first. Rows whose sample counts differ between the policy and a
heuristic are compared as rates and flagged.
"""
import argparse
import csv
import random
import sys
from collections import defaultdict

DEFAULT_HEURISTICS = "h2o,snapkv,streaming,tova,observed,knorm,expected"


def load(paths):
    rows = {}
    for path in paths:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                key = (r["task"], int(r["length"]), float(r["budget"]), r["policy"])
                rows.setdefault(key, r)
    return rows


def answered(r):
    """(the samples' summed score, the sample count): a count of right answers on the needle tasks."""
    samples = int(r["samples"])
    return float(r["accuracy"]) * samples, samples


def shown(score, samples):
    return ("%d/%d" if abs(score - round(score)) < 1e-6 else "%.1f/%d") % (round(score, 1), samples)


def score_sum(r):
    """The sum of the samples' scores (fwe and cwe score a share of the words, so not a count)."""
    return float(r["accuracy"]) * int(r["samples"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="examples/eval --task --csv files, newest first")
    ap.add_argument("--policy", required=True, help="the policy column's value to compare")
    ap.add_argument("--heuristics", default=DEFAULT_HEURISTICS, help="comma-separated policy names")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    ap.add_argument("--answers", action="append",
                    help="an examples/eval --answers file for prompt-by-prompt differences; repeat it to pool runs "
                         "of other prompts (e.g. one file per --seed): each file's samples count as prompts of their own")
    ap.add_argument("--per-task", action="store_true", help="with --answers: also each task cell on its own")
    ap.add_argument("--fidelity", action="store_true",
                    help="with --answers: closeness to the full cache's answers (identical outputs, score difference)")
    args = ap.parse_args()
    if (args.per_task or args.fidelity) and not args.answers:
        sys.exit("task_vs_best: --per-task and --fidelity need --answers")

    rows = load(args.csv)
    heuristics = [h for h in args.heuristics.split(",") if h]
    cells = sorted({(t, l, b) for (t, l, b, p) in rows if p == args.policy},
                   key=lambda c: (c[1], c[0], c[2]))
    if not cells:
        sys.exit(f"task_vs_best: no rows of policy '{args.policy}' in {', '.join(args.csv)}")

    header = ["task", "length", "budget", "full", args.policy, "best heuristic", "which", "at least"]
    out = []
    tally = {"win": 0, "tie": 0, "loss": 0}
    missing = set()
    for task, length, budget in cells:
        mine = rows[(task, length, budget, args.policy)]
        k, n = answered(mine)
        full = rows.get((task, length, budget, "full"))
        full_text = "?" if full is None else shown(*answered(full))
        best, best_names = None, []
        for h in heuristics:
            r = rows.get((task, length, budget, h))
            if r is None:
                missing.add(h)
                continue
            hk, hn = answered(r)
            rate = hk / hn
            if best is None or rate > best[0] + 1e-12:
                best, best_names = (rate, hk, hn), [h]
            elif abs(rate - best[0]) <= 1e-12:
                best_names.append(h)
        if best is None:
            sys.exit(f"task_vs_best: no heuristic rows for {task} L={length} budget {budget}")
        rate = k / n
        verdict = "win" if rate > best[0] + 1e-12 else ("tie" if rate >= best[0] - 1e-12 else "loss")
        tally[verdict] += 1
        flags = ""
        if full is not None and answered(full)[0] * 2 < answered(full)[1]:
            flags += " (full < 1/2)"
        if best[2] != n:
            flags += " (samples differ)"
        out.append([task, str(length), "%g" % budget, full_text, shown(k, n), shown(best[1], best[2]), "+".join(best_names),
                    ("yes" if verdict != "loss" else "**no**") + flags])

    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in out:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in out)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for row in out:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    print(f"\n{args.policy}: {tally['win']} cells ahead of the best heuristic, {tally['tie']} level, "
          f"{tally['loss']} behind (of {len(out)})")
    if missing:
        print("heuristics absent from some cells: " + ", ".join(sorted(missing)))

    # Pooled over the tasks: per (length, budget), the sum of every sample's score over the tasks
    # the full cache answers at least once (about a hundred prompts a cell instead of ten).
    print("\nPooled over the tasks the full cache answers at least once (sum of the samples' scores):")
    # A heuristic missing from some task of a (length, budget) shows "-" there (no partial sums).
    names = [args.policy] + [h for h in heuristics if any((t, l, b, h) in rows for t, l, b in cells)]
    print("length  budget  prompts  " + "  ".join(names))
    for length, budget in sorted({(c[1], c[2]) for c in cells}):
        total = {name: 0.0 for name in names}
        prompts = 0
        for task, l2, b2 in cells:
            if (l2, b2) != (length, budget):
                continue
            full = rows.get((task, length, budget, "full"))
            if full is not None and float(full["accuracy"]) == 0.0:
                continue
            prompts += int(rows[(task, length, budget, args.policy)]["samples"])
            for name in names:
                r = rows.get((task, length, budget, name))
                total[name] += score_sum(r) if r is not None else float("nan")
        best = max((total[h] for h in names[1:] if total[h] == total[h]), default=float("nan"))
        print(f"{length:<6}  {budget:<6g}  {prompts:<7}  " + "  ".join(
            ("-" if total[n] != total[n] else f"{total[n]:.1f}") + ("*" if n != args.policy and total[n] == best else "")
            for n in names))
    print("(* the best heuristic)")
    if args.answers:
        score, output = load_answers(args.answers)
        named = " + ".join(args.answers)
        paired(named, score, args.policy, heuristics, rows, cells)
        if args.per_task:
            paired_per_task(named, score, args.policy, heuristics, cells)
        if args.fidelity:
            fidelity(named, score, output, args.policy, heuristics, cells, args.per_task)


def load_answers(paths):
    """(task, length, budget, (file, sample)) -> {policy: score} and -> {policy: output} from
    examples/eval --answers files: sample s of the i-th file is prompt (i, s), so files of other
    seeds pool as distinct prompts."""
    score, output = defaultdict(dict), defaultdict(dict)
    for i, path in enumerate(paths):
        # errors="replace": files written before examples/eval made its outputs valid UTF-8 can
        # hold a generation cut inside a character (a replaced byte is replaced alike in every
        # policy's output, so identical outputs stay identical).
        with open(path, newline="", errors="replace") as f:
            for r in csv.DictReader(f):
                if r["score"] == "":
                    continue
                key = (r["task"], int(r["length"]), float(r["budget"]), (i, int(r["sample"])))
                score[key][r["policy"]] = float(r["score"])
                output[key][r["policy"]] = r["output"]
    return score, output


def interval(d, rng):
    """'mean [lo, hi] over n prompts (better, worse)': d's mean and its 95 % bootstrap interval."""
    means = sorted(sum(rng.choice(d) for _ in d) / len(d) for _ in range(10000))
    return (f"{sum(d) / len(d):+.3f} [{means[249]:+.3f}, {means[9749]:+.3f}] "
            f"over {len(d)} prompts ({sum(x > 0 for x in d)} better, {sum(x < 0 for x in d)} worse)")


def heuristics_in(score, heuristics):
    """The heuristics the answers file holds, sorted."""
    return sorted({p for s in score.values() for p in s} & set(heuristics))


def paired(path, score, policy, heuristics, rows, cells):
    """Prompt-by-prompt differences of the policy's score minus each heuristic's in one answers file."""
    present = heuristics_in(score, heuristics)
    if not present:
        print(f"\n{path}: no heuristic beside {policy}, no paired comparison")
        return
    print(f"\nPaired, prompt by prompt ({path}): mean of {policy} minus the heuristic per prompt, 95 % bootstrap interval")
    rng = random.Random(0)
    for length, budget in sorted({(c[1], c[2]) for c in cells}):
        tasks = [t for t, l2, b2 in cells if (l2, b2) == (length, budget)
                 and not ((t, length, budget, "full") in rows and float(rows[(t, length, budget, "full")]["accuracy"]) == 0.0)]
        for h in present:
            d = [s[policy] - s[h] for (t, l2, b2, _), s in sorted(score.items())
                 if l2 == length and b2 == budget and t in tasks and policy in s and h in s]
            if d:
                print(f"L={length} budget {budget:g} vs {h}: {interval(d, rng)}")


def paired_per_task(path, score, policy, heuristics, cells):
    """The same per task cell (each with its own seed, so a cell's interval does not depend on the others)."""
    present = heuristics_in(score, heuristics)
    if not present:
        return
    print(f"\nPaired per task cell ({path}):")
    for task, length, budget in cells:
        for h in present:
            d = [s[policy] - s[h] for (t, l2, b2, _), s in sorted(score.items())
                 if (t, l2, b2) == (task, length, budget) and policy in s and h in s]
            if d:
                print(f"{task} L={length} budget {budget:g} vs {h}: {interval(d, random.Random(0))}")


def closeness(score, output, key, policy):
    """(1 if the policy's output is the full cache's, -|its score - the full cache's|) for one
    prompt, or None where the files lack either. The reference is the full cache's row at the same
    budget ("full"; the evaluator writes the same answer there at every budget), else its row of
    budget 1 ("full cache", all that some runs wrote)."""
    s, o = score.get(key, {}), output.get(key, {})
    if policy not in s:
        return None
    if "full" in s:
        ref_score, ref_output = s["full"], o["full"]
    else:
        whole = (key[0], key[1], 1.0, key[3])
        if "full cache" not in score.get(whole, {}):
            return None
        ref_score, ref_output = score[whole]["full cache"], output[whole]["full cache"]
    return float(o[policy] == ref_output), -abs(s[policy] - ref_score)


def fidelity(path, score, output, policy, heuristics, cells, per_task):
    """Closeness to the full cache's answers per (length, budget) over every task, then the
    policy's paired lead over each heuristic; per task cell too with per_task."""
    present = heuristics_in(score, heuristics)
    print(f"\nFidelity to the full cache's answers ({path}), every task: identical outputs, mean |score - full|")
    groups = sorted({(c[1], c[2]) for c in cells})
    keyed = [((l, b), None) for l, b in groups]
    if per_task:
        keyed += [((l, b), t) for t, l, b in sorted(cells, key=lambda c: (c[1], c[2], c[0]))]
    for (length, budget), task in keyed:
        keys = [k for k in sorted(score) if k[1] == length and k[2] == budget and (task is None or k[0] == task)
                and k[0] in {t for t, l2, b2 in cells if (l2, b2) == (length, budget)}]
        where = f"L={length} budget {budget:g}" + ("" if task is None else f" {task}")
        line = []
        for name in [policy] + present:
            c = [x for x in (closeness(score, output, k, name) for k in keys) if x is not None]
            if c:
                line.append(f"{name} {sum(x[0] for x in c) / len(c):.3f} / {sum(-x[1] for x in c) / len(c):.3f}")
        print(f"{where} ({len(keys)} prompts): " + ", ".join(line))
        for h in present:
            both = [(closeness(score, output, k, policy), closeness(score, output, k, h)) for k in keys]
            both = [(m, o) for m, o in both if m is not None and o is not None]
            if not both:
                continue
            rng = random.Random(0)
            print(f"  {policy} - {h}: identical {interval([m[0] - o[0] for m, o in both], rng)}")
            print(f"  {policy} - {h}: closeness {interval([m[1] - o[1] for m, o in both], rng)}")


if __name__ == "__main__":
    main()
