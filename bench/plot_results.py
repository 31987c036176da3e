#!/usr/bin/env python3
"""Plots of the committed result tables (bench/results/*.csv) as PNGs next to them.

    bash scripts/plots.sh            # installs matplotlib into .venv, then runs this

KL and top-1 agreement against budget (kl_vs_budget_prefill_head.png): one column per context
length, one line per policy, from the evaluator's CSVs (`examples/eval --csv`:
policy,granularity,budget,kl_mean,top1_agreement,...): the shipped policy against every heuristic
on the same 64 windows of held-out Vim text (SHIPPED_SOURCES says which run measured which rows).
Task accuracy (relative accuracy against budget and a task x policy heatmap at 25 %, one panel
per prompt length, and PREFIX_summary.md with the mean relative accuracies and the full cache's
accuracy per task) comes from the task suite's CSVs (`examples/eval --task ... --csv`), given
with --tasks (repeatable, e.g. one CSV per length).
"""
import argparse
import csv
import math
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# The runs behind the README's figure, per context length: (file, the policies taken from it; None:
# every policy in it). Every one is `examples/eval --text /usr/share/vim/vim90/doc --context L
# --continuation 32 --budget 0.125,0.25,0.5 --granularity head --mode prefill --dtype f32
# --max-contexts 64` (bench/results/README.md has each command): the evaluator is deterministic, so
# the windows, the teacher and a policy's rows are the same in every run (H2O's rows agree to the
# last digit across the runs that hold them).
SHIPPED = "distillcache v10"
SHIPPED_SOURCES = {
    1024: [("eval_v10_L1024_64ctx_prefill_head.csv", {SHIPPED}),
           ("eval_paired_L1024_64ctx_prefill_head.csv", {"h2o"}),
           ("eval_heuristics_L1024_64ctx_prefill_head.csv", None)],
    2048: [("eval_v10_L2048_64ctx_prefill_head.csv", {SHIPPED}),
           ("eval_v4_L2048_64ctx_prefill_head.csv", {"h2o", "h2o:recent=0.75", "observed", "snapkv", "tova"}),
           ("eval_heuristics_L2048_64ctx_prefill_head.csv", None)],
}


def shipped_rows(length):
    """The rows of SHIPPED_SOURCES[length]; a policy measured by two of the files must agree."""
    rows, seen = [], {}
    for name, policies in SHIPPED_SOURCES[length]:
        path = os.path.join(RESULTS, name)
        if not os.path.exists(path):
            print(f"plot_results: no {os.path.relpath(path)}, its rows left out")
            continue
        for r in read_rows(path):
            if policies is not None and r["policy"] not in policies:
                continue
            key = (r["policy"], r["granularity"], r["budget"])
            if key in seen:
                if seen[key] != r["kl_mean"]:
                    raise SystemExit(f"plot_results: {key} has KL {seen[key]} in one file, {r['kl_mean']} in {name}")
                continue
            seen[key] = r["kl_mean"]
            rows.append(r)
    return rows


def kl_series(rows, granularity, column="kl_mean"):
    """{policy: [(budget, value of `column`)]} for one granularity (TOVA's rows are per layer: kept
    as is)."""
    series = defaultdict(list)
    for r in rows:
        if r["policy"] in ("full",):
            continue
        if r["granularity"] != granularity and not (r["policy"] == "tova" and r["granularity"] == "layer"):
            continue
        series[r["policy"]].append((float(r["budget"]), float(r[column])))
    return {p: sorted(v) for p, v in series.items()}


def plot_kl(panels, out_path, title):
    """panels: [(label, {policy: [(budget, kl)]}, {policy: [(budget, top-1)]} or None)]: KL on top
    (log scale), top-1 agreement below where given."""
    rows = 2 if any(top1 for _, _, top1 in panels) else 1
    # One colour per policy in every panel (the panels need not hold the same policies), one legend.
    names = sorted({p for _, kl, _ in panels for p in kl})
    others = [p for p in names if not p.startswith("distillcache")]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {p: palette[i % len(palette)] for i, p in enumerate(others)}
    fig, axes = plt.subplots(rows, len(panels), figsize=(5.4 * len(panels), 4.0 * rows + 0.6), squeeze=False)
    for col, (label, kl, top1) in enumerate(panels):
        for row, (series, ylabel, log) in enumerate(
                [(kl, "KL(full || evicted), nats per token", True),
                 (top1, "top-1 agreement with the full cache", False)][:rows]):
            ax = axes[row][col]
            for policy, points in sorted((series or {}).items()):
                xs = [100 * b for b, _ in points]
                ys = [v for _, v in points]
                learned = policy.startswith("distillcache")
                ax.plot(xs, ys, marker="o", linewidth=2.6 if learned else 1.2,
                        color="black" if learned else color[policy], label=policy, zorder=3 if learned else 2)
            ax.set_xscale("log", base=2)
            if log:
                ax.set_yscale("log")
            ax.set_xticks([12.5, 25, 50])
            ax.set_xticklabels(["12.5 %", "25 %", "50 %"])
            ax.set_xlabel("cache kept (fraction of the prompt)")
            ax.set_ylabel(ylabel)
            ax.set_title(label)
            ax.grid(True, which="both", alpha=0.3)
    handles = {}
    for ax in axes.flat:
        for line in ax.get_lines():
            handles.setdefault(line.get_label(), line)
    order = [p for p in names if p.startswith("distillcache")] + others
    fig.legend([handles[p] for p in order if p in handles], [p for p in order if p in handles], fontsize=9,
               loc="lower center", ncol=min(len(order), 5))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    print(f"plot_results: wrote {os.path.relpath(out_path)}")


def relative_by_length(rows):
    """{length: {policy: {budget: [relative accuracy per task]}}}, from the task suite's columns
    task, length, policy, budget and relative (evicted accuracy over the full cache's; empty or
    nan where the full cache scored 0: those tasks are left out, as in the averages of the notes)."""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in rows:
        if r["policy"] == "full" or r.get("relative", "") in ("", "nan", "n/a"):
            continue
        rel = float(r["relative"])
        if math.isnan(rel):
            continue
        out[int(r["length"])][r["policy"]][float(r["budget"])].append((r["task"], rel))
    return out


def task_plots(rows, out_prefix):
    """Relative accuracy against budget (mean over tasks), one panel per prompt length, and a
    task x policy heatmap at 25 % per length."""
    data = relative_by_length(rows)
    lengths = sorted(data)
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4.2), squeeze=False)
    for ax, length in zip(axes[0], lengths):
        for policy, budgets in sorted(data[length].items()):
            xs = sorted(budgets)
            ys = [sum(v for _, v in budgets[b]) / len(budgets[b]) for b in xs]
            learned = policy.startswith("distillcache")
            ax.plot([100 * x for x in xs], ys, marker="o", linewidth=2.6 if learned else 1.2,
                    color="black" if learned else None, label=policy)
        ax.set_xscale("log", base=2)
        ax.set_xticks([12.5, 25, 50])
        ax.set_xticklabels(["12.5 %", "25 %", "50 %"])
        ax.set_ylim(0.0, 1.05)
        ax.set_xlabel("cache kept (fraction of the prompt)")
        ax.set_ylabel("relative accuracy (evicted / full cache)")
        ax.set_title(f"RULER-style tasks, {length} tokens")
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    path = out_prefix + "_relative_accuracy.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot_results: wrote {os.path.relpath(path)}")

    policies = sorted({p for length in lengths for p in data[length]})
    tasks = sorted({t for length in lengths for p in data[length].values()
                    for b in p.values() for t, _ in b})
    fig, axes = plt.subplots(1, len(lengths), squeeze=False,
                             figsize=((1.1 * len(policies) + 2.5) * len(lengths), 0.45 * len(tasks) + 1.8))
    for ax, length in zip(axes[0], lengths):
        cell = {(t, p): v for p, budgets in data[length].items()
                for b, values in budgets.items() if abs(b - 0.25) < 1e-9 for t, v in values}
        grid = [[cell.get((t, p), float("nan")) for p in policies] for t in tasks]
        im = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(policies)))
        ax.set_xticklabels(policies, rotation=30, ha="right")
        ax.set_yticks(range(len(tasks)))
        ax.set_yticklabels(tasks)
        ax.set_title(f"{length} tokens, 25 % of the prompt")
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                            color="white" if v < 0.5 else "black")
        fig.colorbar(im, ax=ax, label="relative accuracy")
    fig.tight_layout()
    path = out_prefix + "_heatmap_25.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot_results: wrote {os.path.relpath(path)}")


def task_summary(rows):
    """Markdown: mean relative accuracy per (length, policy, budget), and the full cache's
    accuracy per task and length (the denominators)."""
    data = relative_by_length(rows)
    lengths = sorted(data)
    budgets = sorted({b for length in lengths for p in data[length].values() for b in p})
    head = "| policy | " + " | ".join(f"{100 * b:g} % L={length}" for length in lengths for b in budgets) + " |"
    lines = ["Mean relative accuracy (evicted / full cache, mean over the tasks the full cache solves"
             " at least once):", "", head, "|---|" + "---:|" * (len(lengths) * len(budgets))]
    policies = sorted({p for length in lengths for p in data[length]})
    for policy in policies:
        cells = []
        for length in lengths:
            for b in budgets:
                values = [v for _, v in data[length].get(policy, {}).get(b, [])]
                cells.append(f"{sum(values) / len(values):.3f}" if values else "")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    full = {(int(r["length"]), r["task"]): float(r["full_accuracy"]) for r in rows}
    all_lengths = sorted({length for length, _ in full})
    tasks = sorted({t for _, t in full})
    lines += ["", "Full-cache accuracy:", "",
              "| task | " + " | ".join(f"L={length}" for length in all_lengths) + " |",
              "|---|" + "---:|" * len(all_lengths)]
    for t in tasks:
        lines.append(f"| {t} | " + " | ".join(
            f"{full[(length, t)]:.2f}" if (length, t) in full else "" for length in all_lengths) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--tasks", action="append",
                    help="a task-suite CSV (examples/eval --task ... --csv); repeat for several lengths")
    ap.add_argument("--tasks-out", help="prefix of the task plots and summary (default: the first CSV's name)")
    ap.add_argument("--drop-policy", action="append", default=[],
                    help="leave this policy's task rows out (repeatable; e.g. an earlier learned policy "
                         "named as the shipped one in an older CSV)")
    args = ap.parse_args()
    panels = []
    for length in (int(x) for x in args.lengths.split(",")):
        if length not in SHIPPED_SOURCES:
            print(f"plot_results: no runs listed for L = {length} (SHIPPED_SOURCES), left out")
            continue
        rows = shipped_rows(length)
        kl = kl_series(rows, "head")
        top1 = kl_series(rows, "head", "top1_agreement")
        for series in (kl, top1):
            series["distillcache (shipped)"] = series.pop(SHIPPED, [])
            if "tova" in series:  # TOVA's rule is one keep-set per layer (kvpress's TOVAPress)
                series["tova (per layer)"] = series.pop("tova")
        panels.append((f"SmolLM2-135M, L = {length}, prefill, 64 windows", kl, top1))
    if panels:
        plot_kl(panels, os.path.join(RESULTS, "kl_vs_budget_prefill_head.png"),
                "Held-out Vim help text: the shipped policy against every heuristic (per KV head)")
    if args.tasks:
        # A (task, length, budget, policy) held by several files (e.g. the full cache, rerun beside
        # a new policy) is taken from the first file that has it, so that no cell counts twice.
        rows, seen = [], set()
        for path in args.tasks:
            for r in read_rows(path):
                key = (r["task"], r["length"], float(r["budget"]), r["policy"])
                if r["policy"] in args.drop_policy or key in seen:
                    continue
                seen.add(key)
                rows.append(r)
        prefix = args.tasks_out or os.path.splitext(args.tasks[0])[0]
        task_plots(rows, prefix)
        with open(prefix + "_summary.md", "w") as f:
            f.write(task_summary(rows))
        print(f"plot_results: wrote {os.path.relpath(prefix + '_summary.md')}")


if __name__ == "__main__":
    main()
