#!/usr/bin/env python3
"""Dump kvpress's kept positions and scores per (layer, KV head) for SnapKVPress and KnormPress
(default), or any other sdpa-path press of kvpress_eval.PRESSES (e.g. --presses expected).

Same model, windows, shim and shadow-cache path as kvpress_eval.py (imported from this folder): for
each of the first --max-contexts windows of --text-dir (prompt L tokens, continuation T, the rule of
kvpress_eval.py), one sdpa prefill of the prompt runs kvpress's own forward_hook of each press on a
shadow copy of every layer's full keys/values. The press's `score()` output is captured inside that
call (ScorerPress.compress calls self.score, then scores.topk(n_kept, dim=-1)), so the recorded
scores are exactly what kvpress ranks. The kept positions are `scores.topk(n_kept).indices` (the
same call on the same tensor), sorted; they are checked against the shadow cache: the compressed
keys/values that kvpress wrote must equal the full keys/values gathered at those indices, bit for
bit.

Outputs (in --out-dir):
  kvpress_keep_sets_L{L}_b{budget}.csv  press,context,layer,kv_head,positions   (sorted, space-joined)
  kvpress_scores_L{L}_b{budget}.csv     press,context,layer,kv_head,scores      (L values, %.9g)
(or the paths given by --keep-sets-out / --scores-out).
context = window index 0..7 (as `window` in results/kvpress_smollm2_contexts.csv).

  OMP_NUM_THREADS=1 /opt/dcvenv/bin/python bench/peers/kvpress_keep_sets.py
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import kvpress_eval as ke  # noqa: E402  (applies the transformers-5.24 hook shim on import)
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from kvpress.utils import compute_n_kept  # noqa: E402


def capture_scores(press, store):
    """Wrap this press instance's score() so every call's result is appended to store (by layer)."""
    orig = press.score

    def score(module, hidden_states, keys, values, attentions, kwargs):
        s = orig(module, hidden_states, keys, values, attentions, kwargs)
        store[module.layer_idx] = (s.detach().clone(), keys.detach().clone(), values.detach().clone())
        return s

    press.score = score  # instance attribute shadows the class method; compress calls self.score


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default="/root/.cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--text-dir", default="/usr/share/vim/vim90/doc")
    ap.add_argument("--context", type=int, default=1024, help="prompt length L")
    ap.add_argument("--continuation", type=int, default=32, help="continuation length T (window rule)")
    ap.add_argument("--budget", type=float, default=0.125, help="fraction of the prompt kept")
    ap.add_argument("--presses", default="snapkv,knorm")
    ap.add_argument("--max-contexts", type=int, default=8)
    ap.add_argument("--contexts-csv", default="bench/peers/results/kvpress_smollm2_contexts.csv",
                    help="check each window's first 8 ids against this file ('' to skip)")
    ap.add_argument("--out-dir", default="bench/peers/results")
    ap.add_argument("--keep-sets-out", default="",
                    help="keep-set CSV path (default: OUT_DIR/kvpress_keep_sets_L{L}_b{budget}.csv)")
    ap.add_argument("--scores-out", default="",
                    help="scores CSV path (default: OUT_DIR/kvpress_scores_L{L}_b{budget}.csv)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    L, T, b = args.context, args.continuation, args.budget
    names = args.presses.split(",")
    for n in names:
        if n not in ke.PRESSES:
            sys.exit(f"unknown press {n!r}; known: {','.join(ke.PRESSES)}")
        if ke.PRESSES[n][2] != "sdpa":
            sys.exit(f"press {n}: only sdpa-path presses are handled here")
    t0 = time.perf_counter()
    log = lambda *a: print(f"[{time.perf_counter() - t0:7.1f}s]", *a, file=sys.stderr, flush=True)

    folder, name = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    log(f"loaded {name}; torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
        f"kvpress {ke.kvpress_version()}, threads {torch.get_num_threads()}")

    windows = ke.make_windows(tok, args.text_dir, L, T, args.max_contexts, {})
    if args.contexts_csv:
        with open(args.contexts_csv, newline="") as f:
            ref = {int(r["window"]): r for r in csv.DictReader(f) if int(r["context"]) == L}
        for wi, (fname, k, ids) in enumerate(windows):
            r = ref[wi]
            got = " ".join(map(str, ids[:8]))
            if got != r["first_8_ids"] or fname != r["file"] or k != int(r["k"]):
                sys.exit(f"window {wi}: ({fname}, {k}, {got}) != contexts.csv ({r['file']}, {r['k']}, "
                         f"{r['first_8_ids']})")
        log(f"{len(windows)} windows: first 8 ids, file and k match {args.contexts_csv}")

    tag = f"L{L}_b{b:g}"
    keep_path = args.keep_sets_out or os.path.join(args.out_dir, f"kvpress_keep_sets_{tag}.csv")
    score_path = args.scores_out or os.path.join(args.out_dir, f"kvpress_scores_{tag}.csv")
    for p in (keep_path, score_path):
        os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    n_kept_expected = compute_n_kept(L, 1.0 - b)
    keep_rows, score_rows = [], []
    n_layers = model.config.num_hidden_layers
    n_kv = model.config.num_key_value_heads

    for wi, (fname, k, ids_list) in enumerate(windows):
        prompt = torch.tensor(ids_list[:L])[None]
        presses, stores = {}, {}
        for n in names:
            presses[n] = ke.make_press(n, b)
            stores[n] = {}
            capture_scores(presses[n], stores[n])
        _, _, shadows = ke.prefill(model, prompt, "sdpa", presses=presses)
        for n in names:
            assert sorted(stores[n]) == list(range(n_layers)), (n, sorted(stores[n]))
            for li in range(n_layers):
                scores, keys, values = stores[n][li]
                assert scores.shape == (1, n_kv, L), scores.shape
                idx = scores.topk(n_kept_expected, dim=-1).indices  # exactly ScorerPress.compress
                g = idx.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1])
                sh = shadows[n].layers[li]
                assert sh.keys.shape[2] == n_kept_expected, (n, li, sh.keys.shape)
                assert torch.equal(keys.gather(2, g), sh.keys) and torch.equal(values.gather(2, g), sh.values), \
                    f"{n} layer {li}: recomputed top-k does not reproduce kvpress's compressed cache"
                for h in range(n_kv):
                    pos = sorted(idx[0, h].tolist())
                    assert len(pos) == len(set(pos)) == n_kept_expected and 0 <= pos[0] and pos[-1] < L
                    keep_rows.append([n, wi, li, h, " ".join(map(str, pos))])
                    sc = scores[0, h].to(torch.float64).tolist()
                    score_rows.append([n, wi, li, h, " ".join(f"{x:.9g}" for x in sc)])
        log(f"window {wi + 1}/{len(windows)} ({fname} #{k}) done")

    hdr = ["press", "context", "layer", "kv_head"]
    with open(keep_path, "w", newline="") as f:
        cw = csv.writer(f)
        cw.writerow(hdr + ["positions"])
        cw.writerows(keep_rows)
    with open(score_path, "w", newline="") as f:
        cw = csv.writer(f)
        cw.writerow(hdr + ["scores"])
        cw.writerows(score_rows)
    log(f"wrote {keep_path} ({len(keep_rows)} rows), {score_path}; n_kept {n_kept_expected}; "
        f"wall {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
