#!/usr/bin/env python3
"""Peer measurement: NVIDIA kvpress's presses on distillcache's RULER-style task prompts.

`run` answers every prompt that `examples/eval --task ... --task-prompts FILE` wrote, with the same
token ids (read from the file, not re-tokenised), on SmolLM2-135M-Instruct (the Q4_1 GGUF dequantized
to fp32, as kvpress_eval.py loads it), CPU:

  query-aware protocol - the whole prompt (context + question) is prefilled with the press active
  (kvpress compresses each layer in a forward hook after that layer's attention, so the first answer
  token comes from the full-cache prefill, as in distillcache's TaskSuite), then greedy decoding
  over the compressed cache with no further compression, at the true positions n, n+1, ..., until a
  stop token (not part of the answer) or the task's output budget.

Budget: distillcache keeps ceil(budget * n) of an n-token prompt (cache/budget.hpp), kvpress
int(n * (1 - compression_ratio)); with `--kept-rule ceil` (the default) each press gets the
compression ratio that makes kvpress keep the same count as distillcache, `--kept-rule kvpress`
passes 1 - budget.

Fast path, as in kvpress_eval.py: one sdpa prefill (full cache, streaming, snapkv, tova, knorm) and
one eager prefill (observed) per prompt, each press's own forward_hook compressing a shadow copy of
every layer's keys and values; `--check-paths N` checks on the first N prompts that the documented
`with press(model): model(...)` path generates the same ids.

`compare` joins the result with distillcache's `--answers` file of the same prompts and writes the
side-by-side markdown table. See bench/peers/README.md ("RULER-style tasks against kvpress").
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import math
import os
import platform
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvpress_eval as ke  # noqa: E402  (applies kvpress's transformers-compat shim on import)
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

# distillcache policy -> kvpress_eval.PRESSES key (bench/peers/README.md: the pairs and parameters).
PRESS_OF = {"streaming": "streaming", "snapkv": "snapkv", "tova": "tova", "observed": "h2o", "knorm": "knorm"}


# --------------------------------------------------------------------------------------------------
# Scoring: a mirror of include/distillcache/eval/tasks/scoring.hpp, exactly (RULER's
# postprocess_pred + string_match_all / string_match_part): every control character U+0000..U+001F
# becomes a line break, then the C++ whitespace set ' \n\t\r\f\v' is trimmed at both ends;
# match_all = fraction of expected strings that occur in the cleaned output, match_part = 1 if any
# does; the comparison lowers ASCII A-Z only (as ascii_lower, not str.lower()).
# --------------------------------------------------------------------------------------------------
_ASCII_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}


def clean_output(out: str) -> str:
    s = "".join("\n" if ord(c) < 0x20 else c for c in out)
    return s.strip(" \n\t\r\f\v")


def score_output(output: str, expected: list[str], scoring: str) -> float:
    if not expected:
        return 0.0
    cleaned = clean_output(output).translate(_ASCII_LOWER)
    found = sum(e.translate(_ASCII_LOWER) in cleaned for e in expected)
    if scoring == "string_match_part":
        return 1.0 if found > 0 else 0.0
    assert scoring == "string_match_all", scoring
    return found / len(expected)


def wilson(successes: float, trials: float, z: float = 1.959963984540054):
    """95 % Wilson interval, as dc::wilson_interval (eval/metrics.hpp), fractional successes included."""
    p, z2n = successes / trials, z * z / trials
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * math.sqrt(p * (1.0 - p) / trials + z2n / (4.0 * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


# --------------------------------------------------------------------------------------------------
# Prompts (examples/eval --task-prompts)
# --------------------------------------------------------------------------------------------------
def read_prompts(path, tasks=None, samples=None):
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if tasks and r["task"] not in tasks:
                continue
            if samples is not None and int(r["sample"]) >= samples:
                continue
            out.append({
                "task": r["task"], "length": int(r["length"]), "sample": int(r["sample"]),
                "scoring": r["scoring"], "max_new_tokens": int(r["max_new_tokens"]),
                "stop": [int(x) for x in r["stop_ids"].split()], "context_tokens": int(r["context_tokens"]),
                "answers": r["answers"].split("|"), "ids": [int(x) for x in r["prompt_ids"].split()],
            })
    return out


def n_kept_of(n, budget, rule):
    return math.ceil(budget * n) if rule == "ceil" else max(1, int(n * budget))


def make_press(name, budget, n, rule):
    """kvpress press for distillcache policy `name`, keeping n_kept_of(n, budget, rule) of n tokens."""
    cls, extra, attn = ke.PRESSES[PRESS_OF[name]]
    k = n_kept_of(n, budget, rule)
    ratio = 1.0 - (k + 0.5) / n if rule == "ceil" else 1.0 - budget
    assert max(1, int(n * (1 - ratio))) == k, (n, budget, ratio, k)
    if name == "streaming":  # StreamingLLMPress prunes n - int(n * (1 - ratio)): the same count
        assert n - int(n * (1 - ratio)) == n - k
    return cls(compression_ratio=ratio, **extra), attn, k


@torch.no_grad()
def greedy(model, caches, first_logits, n, max_new, stop):
    """Greedy answers over caches of one length (prompts of n tokens prefilled, maybe compressed to
    the same count), decoded as one batch: the weights are read once per step for all of them (the
    step is memory-bound). Token t of every answer is fed at position n + t; an answer stops at a stop
    token (excluded) or after max_new tokens; a finished row is fed a dummy token until all are done
    (rows do not interact). Returns one id list per cache."""
    model.set_attn_implementation("sdpa")
    lengths = {c.layers[li].keys.shape[2] for c in caches for li in range(len(c.layers))}
    assert len(lengths) == 1, lengths
    if len(caches) == 1:
        cache = caches[0]
    else:
        cache = DynamicCache(config=model.config)
        for li in range(len(caches[0].layers)):
            cache.update(torch.cat([c.layers[li].keys for c in caches]),
                         torch.cat([c.layers[li].values for c in caches]), li)
    logits = torch.stack([x.float() for x in first_logits])  # [S, V]
    out, done = [[] for _ in caches], [False] * len(caches)
    for step in range(max_new):
        for i, t in enumerate(logits.argmax(-1).tolist()):
            if done[i]:
                continue
            if t in stop:
                done[i] = True
                continue
            out[i].append(t)
            done[i] = len(out[i]) == max_new
        if all(done):
            break
        feed = torch.tensor([[o[-1] if o else 0] for o in out])
        o = model(input_ids=feed, cache=cache, position_ids=torch.full((len(caches), 1), n + step))
        logits = o.logits[:, -1]
    return out


def answer_fast(model, p, policies, budgets, rule):
    """{(policy, budget): (ids, n_kept)}, full cache under ("full", 1.0); one prefill per attention
    implementation, the answers of one budget decoded as one batch."""
    prompt = torch.tensor(p["ids"])[None]
    n = prompt.shape[1]
    by_attn, kept = defaultdict(dict), {}
    for name in policies:
        for b in budgets:
            press, attn, k = make_press(name, b, n, rule)
            by_attn[attn][(name, b)] = press
            kept[(name, b)] = k
    p0, cache, shadows = ke.prefill(model, prompt, "sdpa", presses=by_attn.get("sdpa"))
    students = [(key, p0, sh) for key, sh in shadows.items()]
    if "eager" in by_attn:
        e0, _, esh = ke.prefill(model, prompt, "eager", presses=by_attn["eager"])
        students += [(key, e0, sh) for key, sh in esh.items()]
    res = {}
    for b in budgets:
        group = [(key, q0, sh) for key, q0, sh in students if key[1] == b]
        for key, _, sh in group:
            assert sh.get_seq_length(0) == kept[key], (key, sh.get_seq_length(0), kept[key])
        ids = greedy(model, [sh for _, _, sh in group], [q0 for _, q0, _ in group], n, p["max_new_tokens"], p["stop"])
        res.update({key: (a, kept[key]) for (key, _, _), a in zip(group, ids)})
    res[("full", 1.0)] = (greedy(model, [cache], [p0], n, p["max_new_tokens"], p["stop"])[0], n)
    return res


def answer_documented(model, p, policies, budgets, rule):
    """The same through kvpress's documented `with press(model): model(...)` path, one prefill each."""
    prompt = torch.tensor(p["ids"])[None]
    n = prompt.shape[1]
    res = {}
    for name in policies:
        for b in budgets:
            press, attn, k = make_press(name, b, n, rule)
            q0, cache, _ = ke.prefill(model, prompt, attn, press_ctx=press)
            assert cache.get_seq_length(0) == k
            res[(name, b)] = (greedy(model, [cache], [q0], n, p["max_new_tokens"], p["stop"])[0], k)
    p0, cache, _ = ke.prefill(model, prompt, "sdpa")
    res[("full", 1.0)] = (greedy(model, [cache], [p0], n, p["max_new_tokens"], p["stop"])[0], n)
    return res


def decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def cmd_run(args):
    torch.set_num_threads(args.threads)
    policies = [x for x in args.policies.split(",") if x]
    for x in policies:
        if x not in PRESS_OF:
            sys.exit(f"unknown policy {x!r}; known: {','.join(PRESS_OF)}")
    budgets = [float(x) for x in args.budgets.split(",")]
    prompts = read_prompts(args.prompts, set(args.tasks.split(",")) if args.tasks else None, args.samples)
    if not prompts:
        sys.exit(f"no prompt selected from {args.prompts}")
    t0 = time.perf_counter()
    log = lambda *a: print(f"[{time.perf_counter() - t0:7.1f}s]", *a, file=sys.stderr, flush=True)
    tok, model = load_model(args.gguf)
    log(f"loaded {os.path.basename(args.gguf)}; torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
        f"kvpress {ke.kvpress_version()}; {len(prompts)} prompts from {args.prompts} "
        f"(sha256 {hashlib.sha256(open(args.prompts, 'rb').read()).hexdigest()[:16]})")

    # Our ids are fed as they are. Cheap consistency check of the two tokenizers on a few prompts:
    # HF's decode of our ids re-encodes (no special tokens added) to the same ids.
    for p in prompts[: args.tokenizer_checks]:
        again = tok(decode(tok, p["ids"]), add_special_tokens=False)["input_ids"]
        ok = again == p["ids"]
        log(f"tokenizer check {p['task']} #{p['sample']}: HF encode(decode(ids)) == ids: {ok}")
        if not ok:
            i = next((j for j, (a, b) in enumerate(zip(again, p["ids"])) if a != b), min(len(again), len(p["ids"])))
            sys.exit(f"tokenizer check failed at index {i}: ours {p['ids'][i:i + 8]}, HF {again[i:i + 8]}")

    # Rows go out as each prompt finishes (prompt order: task, length, sample), so a run that is cut
    # short leaves every finished prompt behind; the aggregate is written at the end.
    f_out = open(args.out, "w", newline="")
    w_out = csv.writer(f_out)
    w_out.writerow(HEADER)
    order = {name: j for j, name in enumerate(["full"] + policies)}
    rows = []
    for i, p in enumerate(prompts):
        res = answer_fast(model, p, policies, budgets, args.kept_rule)
        if i < args.check_paths:
            doc = answer_documented(model, p, policies, budgets, args.kept_rule)
            same = all(doc[k][0] == res[k][0] for k in res)
            log(f"path check {p['task']} #{p['sample']}: documented path == fast path for all "
                f"{len(res)} answers: {same}")
            if not same:  # logged, not fatal: a batched step can round differently from a single one
                log("MISMATCH (fast vs documented): " + ", ".join(
                    f"{k}: {res[k][0]} vs {doc[k][0]}" for k in res if doc[k][0] != res[k][0]))
        for (name, b), (ids, k) in sorted(res.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
            text = decode(tok, ids)
            rows.append([p["task"], p["length"], p["sample"], name,
                         "none" if name == "full" else ke.PRESSES[PRESS_OF[name]][0].__name__, b, len(p["ids"]), k,
                         score_output(text, p["answers"], p["scoring"]), " ".join(map(str, ids)), text])
        w_out.writerows(rows[-len(res):])
        f_out.flush()
        log(f"{i + 1}/{len(prompts)} {p['task']} #{p['sample']} n={len(p['ids'])}: " + " ".join(
            f"{r[3]}@{r[5]}={r[8]:.2f}" for r in rows[-len(res):]))
    f_out.close()
    summary = write_summary(rows, args.out)
    log(f"wrote {args.out} and {summary}; wall {time.perf_counter() - t0:.1f}s; {platform.node()} "
        f"{os.cpu_count()} cpus, {torch.get_num_threads()} threads")


HEADER = ["task", "length", "sample", "policy", "press", "budget", "prompt_tokens", "n_kept", "score",
          "generated_ids", "text"]


def write_summary(rows, out):
    """Accuracy per (task, length, policy, budget) with its 95 % Wilson interval -> OUT_summary.csv."""
    order = {name: j for j, name in enumerate(["full"] + list(PRESS_OF))}
    agg = defaultdict(list)
    for r in rows:
        agg[(r[0], int(r[1]), r[3], float(r[5]))].append(float(r[8]))
    summary = os.path.splitext(out)[0] + "_summary.csv"
    with open(summary, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "length", "policy", "budget", "samples", "accuracy", "accuracy_lo", "accuracy_hi",
                    "full_accuracy"])
        for (task, length, name, b), s in sorted(agg.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                              order[kv[0][2]], kv[0][3])):
            full = agg[(task, length, "full", 1.0)]
            lo, hi = wilson(sum(s), len(s))
            w.writerow([task, length, name, b, len(s), f"{sum(s) / len(s):.6g}", f"{lo:.6g}", f"{hi:.6g}",
                        f"{sum(full) / len(full):.6g}"])
    return summary


def cmd_merge(args):
    """Concatenate per-prompt CSVs of `run` (parts run in parallel over tasks) and re-aggregate."""
    rows = []
    for path in args.parts:
        with open(path, newline="") as f:
            r = list(csv.reader(f))
            assert r[0] == HEADER, (path, r[0])
            rows += r[1:]
    keys = [tuple(r[:4]) + (r[5],) for r in rows]
    assert len(keys) == len(set(keys)), "the parts overlap"
    with open(args.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)
    print(f"wrote {args.out} ({len(rows)} rows) and {write_summary(rows, args.out)}")


# --------------------------------------------------------------------------------------------------
# compare: distillcache's --answers against this script's output, on the same prompts
# --------------------------------------------------------------------------------------------------
def cmd_compare(args):
    prompts = {(p["task"], p["length"], p["sample"]): p for p in read_prompts(args.prompts)}
    ours, theirs = {}, {}
    with open(args.ours, newline="") as f:
        for r in csv.DictReader(f):
            key = (r["task"], int(r["length"]), int(r["sample"]))
            if key not in prompts:
                continue
            # The answers file's expected strings (space-joined) must be this prompt's: the prompts
            # file and the answers come from the same run.
            assert r["expected"] == " ".join(prompts[key]["answers"]), (key, r["expected"])
            pol = "full" if r["policy"] == "full cache" else r["policy"]
            b = 1.0 if pol == "full" else float(r["budget"])
            if r["policy"] == "full":
                continue  # the full-cache student: the teacher's answer again
            ours[key + (pol, b)] = (float(r["score"]), r["output"])
    with open(args.kvpress, newline="") as f:
        for r in csv.DictReader(f):
            key = (r["task"], int(r["length"]), int(r["sample"]))
            theirs[key + (r["policy"], float(r["budget"]))] = (float(r["score"]), r["text"], int(r["n_kept"]))
    # Our scores recomputed from our text with the mirrored scorer must be our scores (the answers
    # file prints them with 6 significant digits).
    for k, (s, text) in ours.items():
        assert abs(score_output(text, prompts[k[:3]]["answers"], prompts[k[:3]]["scoring"]) - s) < 1e-5, k
    cells = defaultdict(list)
    for k in sorted(set(ours) & set(theirs)):
        cells[(k[0], k[1], k[3], k[4])].append(k)
    # Our policies without a press (the learned policy): reported next to the presses, not matched.
    unpaired = sorted({k[3] for k in ours if k[3] != "full" and k[3] not in PRESS_OF})
    missing = sorted(k for k in set(ours) ^ set(theirs) if k[3] not in unpaired)
    groups = sorted({(t, L) for (t, L, _, _) in cells})
    rules = ["full"] + [x for x in PRESS_OF if any(c[2] == x for c in cells)]
    budgets = sorted({c[3] for c in cells if c[2] != "full"})

    def fmt(v):
        return f"{v:.3f}"

    def line(label, keys):
        so = [ours[k][0] for k in keys]
        st = [theirs[k][0] for k in keys]
        n = len(keys)
        lo_o, hi_o = wilson(sum(so), n)
        lo_t, hi_t = wilson(sum(st), n)
        overlap = lo_o <= hi_t and lo_t <= hi_o
        same_score = sum(abs(a - b) < 1e-5 for a, b in zip(so, st))  # ours: 6 digits
        same_text = sum(ours[k][1] == theirs[k][1] for k in keys)
        return (f"| {label} | {n} | {fmt(sum(so) / n)} [{fmt(lo_o)}, {fmt(hi_o)}] | "
                f"{fmt(sum(st) / n)} [{fmt(lo_t)}, {fmt(hi_t)}] | {'yes' if overlap else '**no**'} | "
                f"{same_score}/{n} | {same_text}/{n} |")

    out = [f"# distillcache vs kvpress {ke.kvpress_version()} on RULER-style tasks",
           "",
           f"Same prompts (token ids from `{os.path.basename(args.prompts)}`), query-aware, head granularity, "
           "greedy answers scored as examples/eval scores them (scoring.hpp, mirrored in kvpress_tasks.py). "
           "Accuracy [95 % Wilson interval]; "
           "'same score' / 'same text': prompts where both sides scored / answered identically. "
           f"distillcache: `{os.path.basename(args.ours)}`; kvpress: `{os.path.basename(args.kvpress)}`.",
           ""]
    header = ("| {} | n | distillcache | kvpress | CIs overlap | same score | same text |\n"
              "|---|---|---|---|---|---|---|")
    out += ["## Headline: all tasks pooled", "", header.format("rule @ budget")]
    for rule in rules:
        for b in ([1.0] if rule == "full" else budgets):
            keys = [k for (t, L, r, bb), ks in cells.items() if r == rule and bb == b for k in ks]
            if keys:
                out.append(line(f"{rule} @ {b:g}", keys))
    out.append("")
    for b in [1.0] + budgets:
        out.append(f"## {'Full cache (sanity check)' if b == 1.0 else f'Budget {b:g}'}")
        out.append("")
        out.append(header.format("task" if b == 1.0 else "rule: task"))
        for rule in (["full"] if b == 1.0 else rules[1:]):
            everything = []
            for t, L in groups:
                keys = cells.get((t, L, rule, b), [])
                if keys:
                    out.append(line(f"{rule}: {t} (L={L})" if b != 1.0 else f"{t} (L={L})", keys))
                    everything += keys
            if everything:
                out.append(line(f"**{rule}: all tasks**" if b != 1.0 else "**all tasks**", everything))
        out.append("")
    for name in unpaired:
        out.append(f"## {name} (no kvpress counterpart) next to kvpress's presses")
        out.append("")
        out.append("Accuracy [95 % Wilson interval] on the same prompts; the presses' column is kvpress's run.")
        out.append("")
        for b in budgets:
            presses = [x for x in rules[1:]]
            out.append(f"| task @ {b:g} | n | {name} | " + " | ".join(f"{x} (kvpress)" for x in presses) + " |")
            out.append("|---|---|---|" + "---|" * len(presses))
            for label, tl in [(f"{t} (L={L})", [(t, L)]) for t, L in groups] + [("**all tasks**", groups)]:
                mine = [v[0] for k, v in ours.items() if k[3] == name and k[4] == b and k[:2] in tl]
                if not mine:
                    continue
                lo, hi = wilson(sum(mine), len(mine))
                cols = []
                for x in presses:
                    st = [v[0] for k, v in theirs.items() if k[3] == x and k[4] == b and k[:2] in tl]
                    cols.append(f"{sum(st) / len(st):.3f}" if st else "-")
                out.append(f"| {label} | {len(mine)} | {sum(mine) / len(mine):.3f} [{lo:.3f}, {hi:.3f}] | "
                           + " | ".join(cols) + " |")
            out.append("")
    if missing:
        out.append(f"Unmatched (only one side has them): {len(missing)}, e.g. {missing[:5]}")
        out.append("")
    kept = sorted({v[2] - n_kept_of(len(prompts[k[:3]]["ids"]), k[4], "ceil")
                   for k, v in theirs.items() if k[3] != "full"})
    out.append(f"kvpress's kept count minus distillcache's ceil(budget * n): {kept} (0 = the same count).")
    with open(args.out, "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))


# --------------------------------------------------------------------------------------------------
# keep-sets: one prompt's kept positions, kvpress's against distillcache's (to explain disagreements)
# --------------------------------------------------------------------------------------------------
def load_model(gguf):
    folder, name = os.path.split(os.path.abspath(gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    return tok, model


def cmd_keep_sets(args):
    """`--write-text FILE`: the prompt's text followed by its first expected answer, for
    `examples/eval --text FILE --context n --continuation 1 --mode prefill --granularity head --keep-sets`
    (which compresses the first n tokens of FILE exactly as the task suite compresses the prompt;
    the first n ids must be the prompt's, checked here with HF's tokenizer). `--ours CSV`: compare
    those keep-sets with kvpress's for the same prompt, per (layer, KV head)."""
    from kvpress_keep_sets import capture_scores  # the score capture of the windows' keep-set dump
    torch.set_num_threads(args.threads)
    p = next(q for q in read_prompts(args.prompts, {args.task}) if q["sample"] == args.sample)
    n = len(p["ids"])
    tok, model = load_model(args.gguf)
    if args.write_text:
        text = decode(tok, p["ids"]) + " " + p["answers"][0] + "."
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids[:n] == p["ids"], "the text does not re-tokenise to the prompt's ids"
        with open(args.write_text, "w") as f:
            f.write(text)
        print(f"wrote {args.write_text}: use --context {n} --continuation {len(ids) - n}")
        return
    ours = defaultdict(dict)
    with open(args.ours, newline="") as f:
        for r in csv.DictReader(f):
            if abs(float(r["budget"]) - args.budget) < 1e-9:
                ours[r["policy"]][(int(r["layer"]), int(r["kv_head"]))] = set(map(int, r["positions"].split()))
    prompt = torch.tensor(p["ids"])[None]
    for name in [x for x in args.policies.split(",") if x]:
        press, attn, k = make_press(name, args.budget, n, "ceil")
        store = {}
        capture_scores(press, store)
        ke.prefill(model, prompt, attn, presses={name: press})
        differ, moved, at_ties, total = 0, 0, 0, 0
        examples = []
        for li in sorted(store):
            scores = store[li][0][0].double()  # [kv_heads, n]
            for h in range(scores.shape[0]):
                theirs = set(scores[h].topk(k).indices.tolist())  # ScorerPress.compress's top-k
                mine = ours[name][(li, h)]
                total += 1
                if mine == theirs:
                    continue
                differ += 1
                only_mine, only_theirs = sorted(mine - theirs), sorted(theirs - mine)
                moved += len(only_mine)
                cut = float(scores[h].sort(descending=True).values[k - 1])
                tie = all(abs(float(scores[h][j]) - cut) <= 1e-5 * max(abs(cut), 1e-30)
                          for j in only_mine + only_theirs)
                at_ties += tie
                if len(examples) < args.examples:
                    examples.append(f"layer {li} head {h}: only ours {only_mine[:8]}, only kvpress "
                                    f"{only_theirs[:8]}, kvpress's cut {cut:.6g}, ours there "
                                    f"{[round(float(scores[h][j]), 8) for j in only_mine[:4]]}"
                                    f"{' (tie)' if tie else ''}")
        print(f"{p['task']} #{p['sample']} n={n} {name} @ {args.budget:g} (k={k}): {differ}/{total} (layer, head) "
              f"sets differ, {moved} positions swapped in all, {at_ties} of the differing sets only at ties")
        for e in examples:
            print("   ", e)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="answer the prompts with kvpress's presses")
    r.add_argument("--prompts", required=True, help="examples/eval --task-prompts CSV")
    r.add_argument("--gguf", default="/root/.cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf")
    r.add_argument("--policies", default="streaming,snapkv,tova,observed,knorm",
                   help="distillcache names of the presses (the full cache always runs): " + ",".join(PRESS_OF))
    r.add_argument("--budgets", default="0.25", help="kept fractions of the prompt")
    r.add_argument("--kept-rule", choices=["ceil", "kvpress"], default="ceil",
                   help="ceil: keep ceil(budget*n) as distillcache does; kvpress: compression_ratio = 1 - budget")
    r.add_argument("--tasks", default="", help="only these tasks (comma-separated)")
    r.add_argument("--samples", type=int, default=None, help="only samples 0..N-1")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--tokenizer-checks", type=int, default=2, help="prompts whose ids HF's tokenizer must round-trip")
    r.add_argument("--check-paths", type=int, default=0, help="prompts also answered through the documented path")
    r.add_argument("--out", required=True, help="per-prompt CSV (the aggregate goes to *_summary.csv)")
    c = sub.add_parser("compare", help="side-by-side table against distillcache's --answers")
    c.add_argument("--prompts", required=True)
    c.add_argument("--ours", required=True, help="examples/eval --answers CSV of the same prompts")
    c.add_argument("--kvpress", required=True, help="`run --out` CSV")
    c.add_argument("--out", required=True, help="markdown table")
    m = sub.add_parser("merge", help="concatenate `run` outputs of disjoint prompt sets, re-aggregate")
    m.add_argument("parts", nargs="+")
    m.add_argument("--out", required=True)
    k = sub.add_parser("keep-sets", help="one prompt's keep-sets, kvpress's against distillcache's")
    k.add_argument("--prompts", required=True)
    k.add_argument("--task", required=True)
    k.add_argument("--sample", type=int, required=True)
    k.add_argument("--gguf", default="/root/.cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf")
    k.add_argument("--policies", default="streaming,snapkv,tova,observed,knorm")
    k.add_argument("--budget", type=float, default=0.25)
    k.add_argument("--write-text", default="", help="write the prompt as text for examples/eval --text, and stop")
    k.add_argument("--ours", default="", help="examples/eval --keep-sets CSV of that text")
    k.add_argument("--examples", type=int, default=3, help="differing sets printed per policy")
    k.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    {"run": cmd_run, "compare": cmd_compare, "merge": cmd_merge, "keep-sets": cmd_keep_sets}[args.cmd](args)


if __name__ == "__main__":
    main()
