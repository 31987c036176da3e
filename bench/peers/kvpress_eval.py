#!/usr/bin/env python3
"""Peer measurement: NVIDIA kvpress prefill presses on SmolLM2-135M-Instruct (Q4_1 GGUF, fp32, CPU).

For every context window (prompt = L tokens, continuation = T tokens) the full-cache model (teacher)
and a kvpress-compressed cache (student) are teacher-forced through the same continuation, and the
next-token distributions are compared: KL(P_t || Q_t), top-1 agreement and the perplexity ratio.
See bench/peers/README.md for the protocol, the context rule and the results.

Speed: kvpress compresses each layer's cache in a forward hook *after* that layer's attention has
been computed with the full cache, so the prefill's activations do not depend on the press. This
script therefore runs ONE prefill per context and attention implementation and calls kvpress's own
`forward_hook` once per (press, budget) on a private "shadow" cache holding that layer's full keys
and values (the fast path). `--selftest` checks that this gives bit-identical compressed caches and
student logits to the documented `with press(model): model(prompt, cache=cache)` path, and that
compression_ratio 0 (budget 1.0) reproduces the teacher.
"""

from __future__ import annotations

import argparse
import csv
import glob
import hashlib
import math
import os
import platform
import sys
import time
from contextlib import contextmanager

import torch

from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import kvpress
from kvpress import (
    ExpectedAttentionPress,
    KnormPress,
    ObservedAttentionPress,
    RandomPress,
    SnapKVPress,
    StreamingLLMPress,
    TOVAPress,
)
from kvpress.presses.base_press import BasePress

# --------------------------------------------------------------------------------------------------
# Compatibility shim. kvpress 0.5.5 pins transformers<5.3; here transformers is 5.24, whose attention
# layers receive the cache as kwarg `cache` (was `past_key_values`) and no longer receive
# `cache_position`. kvpress's BasePress.forward_hook reads both, so we supply them: the cache object
# under the old name, and cache_position = the absolute cache indices of this forward's tokens
# (cache length after the update minus q_len ... cache length - 1), which is what transformers used
# to pass. kvpress only uses it in is_prefilling(): cache_position[-1] + 1 == q_len.
# --------------------------------------------------------------------------------------------------
_kvpress_forward_hook = BasePress.forward_hook


def _compat_kwargs(module, kwargs):
    if "past_key_values" in kwargs and "cache_position" in kwargs:
        return kwargs
    kwargs = dict(kwargs)
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    kwargs["past_key_values"] = cache
    q_len = kwargs["hidden_states"].shape[1]
    n = cache.get_seq_length(module.layer_idx)  # after this layer's cache.update
    kwargs["cache_position"] = torch.arange(n - q_len, n)
    return kwargs


def _compat_forward_hook(self, module, input, kwargs, output):
    return _kvpress_forward_hook(self, module, input, _compat_kwargs(module, kwargs), output)


BasePress.forward_hook = _compat_forward_hook

PRESSES = {
    # name on the CLI: (class, extra constructor args, attention implementation needed in prefill)
    "streaming": (StreamingLLMPress, {"n_sink": 4}, "sdpa"),
    "h2o": (ObservedAttentionPress, {}, "eager"),
    "snapkv": (SnapKVPress, {"window_size": 64, "kernel_size": 5}, "sdpa"),
    "tova": (TOVAPress, {}, "sdpa"),
    "knorm": (KnormPress, {}, "sdpa"),
    # ExpectedAttentionPress with kvpress 0.5.5's defaults (n_future_positions=512, n_sink=4,
    # use_covariance=True, use_vnorm=True, epsilon=0). Its score() needs the attention module's input
    # `hidden_states` (pre-RoPE queries via module.q_proj) and module.rotary_emb / config / head_dim;
    # the shadow hook passes the layer's real kwargs, and shadow_presses sets rotary_emb as
    # BasePress.__call__ does.
    "expected": (ExpectedAttentionPress, {}, "sdpa"),
    # RandomPress with a fixed seed. kvpress re-seeds its generator on every score() call, so every
    # layer draws the same [kv_heads, L] scores (same keep set per KV head in all layers).
    "random": (RandomPress, {"seed": 0}, "sdpa"),
}


def make_press(name, budget):
    cls, extra, _ = PRESSES[name]
    return cls(compression_ratio=1.0 - budget, **extra)


# --------------------------------------------------------------------------------------------------
# Contexts
# --------------------------------------------------------------------------------------------------
def make_windows(tok, text_dir, L, T, max_contexts, cache):
    """Files *.txt in text_dir sorted by file name (Python str order = byte order for these names);
    each file read as UTF-8 (invalid bytes -> U+FFFD), tokenized whole without special tokens; windows
    [k*(L+T), (k+1)*(L+T)) for k = 0, 1, ... while they fit; files in order until max_contexts."""
    out = []
    for path in sorted(glob.glob(os.path.join(text_dir, "*.txt")), key=os.path.basename):
        if len(out) >= max_contexts:
            break
        if path not in cache:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
            cache[path] = tok(text, add_special_tokens=False)["input_ids"]
        ids = cache[path]
        k = 0
        while (k + 1) * (L + T) <= len(ids) and len(out) < max_contexts:
            out.append((os.path.basename(path), k, ids[k * (L + T) : (k + 1) * (L + T)]))
            k += 1
    return out


# --------------------------------------------------------------------------------------------------
# Model passes
# --------------------------------------------------------------------------------------------------
@contextmanager
def shadow_presses(model, presses):
    """One prefill feeds several presses: after each attention layer, copy the layer's (full) keys and
    values into one shadow DynamicCache per press and run kvpress's forward_hook on it, so that the
    press compresses its shadow exactly as it would compress the real cache. The real cache is not
    touched. Yields {key: shadow cache}."""
    shadows = {key: DynamicCache(config=model.config) for key in presses}
    for press in presses.values():
        press.post_init_from_model(model)

    def hook(module, input, kwargs, output):
        kwargs = _compat_kwargs(module, kwargs)
        li = module.layer_idx
        real = kwargs["past_key_values"].layers[li]
        for key, press in presses.items():
            shadow = shadows[key]
            shadow.layers[li].lazy_initialization(real.keys, real.values)
            shadow.layers[li].keys, shadow.layers[li].values = real.keys, real.values
            kw = dict(kwargs)
            kw["past_key_values"] = shadow
            press.forward_hook(module, input, kw, output)
        return output

    lm = model.model
    hooks = []
    try:
        for layer in lm.layers:
            layer.self_attn.rotary_emb = lm.rotary_emb  # as BasePress.__call__ does
            hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
        yield shadows
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()
def prefill(model, prompt, attn, presses=None, press_ctx=None):
    model.set_attn_implementation(attn)
    cache = DynamicCache(config=model.config)
    shadows = {}
    if presses:
        with shadow_presses(model, presses) as shadows:
            out = model(input_ids=prompt, cache=cache, logits_to_keep=1)
    elif press_ctx is not None:
        with press_ctx(model):
            out = model(input_ids=prompt, cache=cache, logits_to_keep=1)
    else:
        out = model(input_ids=prompt, cache=cache, logits_to_keep=1)
    return out.logits[0, -1].double(), cache, shadows


@torch.no_grad()
def continue_forced(model, cache, cont, L, first_logits):
    """Teacher-force the continuation over the (possibly compressed) cache, positions L..L+T-1 (the
    original positions, as kvpress's pipeline does). Returns [T, V] float64 logits: row t predicts
    continuation token t (row 0 = the prefill's last row)."""
    model.set_attn_implementation("sdpa")
    T = cont.shape[1]
    pos = torch.arange(L, L + T).unsqueeze(0)
    out = model(input_ids=cont, cache=cache, position_ids=pos)
    return torch.cat([first_logits[None], out.logits[0, :-1].double()], 0)


def compare(p_logits, q_logits, target):
    lp = torch.log_softmax(p_logits, -1)
    lq = torch.log_softmax(q_logits, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)  # [T]
    agree = (p_logits.argmax(-1) == q_logits.argmax(-1)).double()
    nll_p = -lp.gather(-1, target[:, None])[:, 0]
    nll_q = -lq.gather(-1, target[:, None])[:, 0]
    return kl, agree, nll_p, nll_q


class Acc:
    def __init__(self, T):
        self.kl = torch.zeros(T, dtype=torch.float64)
        self.agree = torch.zeros(T, dtype=torch.float64)
        self.nll_p = 0.0
        self.nll_q = 0.0
        self.n_ctx = 0
        self.kept = set()

    def add(self, kl, agree, nll_p, nll_q):
        self.kl += kl
        self.agree += agree
        self.nll_p += float(nll_p.sum())
        self.nll_q += float(nll_q.sum())
        self.n_ctx += 1


def build_cache(model, shadow):
    c = DynamicCache(config=model.config)
    for li, layer in enumerate(shadow.layers):
        c.update(layer.keys, layer.values, li)
    return c


# --------------------------------------------------------------------------------------------------
# Self-test
# --------------------------------------------------------------------------------------------------
def selftest(model, window, L, T, press_names, budgets, rows):
    ids = torch.tensor(window[2])[None]
    prompt, cont = ids[:, :L], ids[:, L:]
    target = cont[0]
    p0, tcache, _ = prefill(model, prompt, "sdpa")
    P = continue_forced(model, tcache, cont, L, p0)
    ok = True
    # (a) budget 1.0 (compression_ratio 0) through the documented context manager path
    for name in press_names:
        press = make_press(name, 1.0)
        q0, cache, _ = prefill(model, prompt, PRESSES[name][2], press_ctx=press)
        n_kept = cache.get_seq_length(0)
        Q = continue_forced(model, cache, cont, L, q0)
        kl, agree, _, _ = compare(P, Q, target)
        rows.append(["budget1.0_vs_teacher", name, 1.0, L, float(kl.max()), float(agree.mean()),
                     float((P - Q).abs().max()), n_kept])
        ok &= n_kept == L and float(kl.max()) < 1e-6 and float(agree.mean()) == 1.0
    # (b) fast (shadow) path == documented path, bit for bit
    for name in press_names:
        attn = PRESSES[name][2]
        presses = {b: make_press(name, b) for b in budgets}
        s0, _, shadows = prefill(model, prompt, attn, presses=presses)
        for b in budgets:
            d0, dcache, _ = prefill(model, prompt, attn, press_ctx=make_press(name, b))
            kdiff = max(float((dcache.layers[i].keys - shadows[b].layers[i].keys).abs().max())
                        for i in range(len(dcache.layers)))
            vdiff = max(float((dcache.layers[i].values - shadows[b].layers[i].values).abs().max())
                        for i in range(len(dcache.layers)))
            n_kept = dcache.get_seq_length(0)
            Qd = continue_forced(model, dcache, cont, L, d0)
            Qs = continue_forced(model, build_cache(model, shadows[b]), cont, L, s0)
            ldiff = float((Qd - Qs).abs().max())
            rows.append(["shadow_vs_contextmanager", name, b, L, max(kdiff, vdiff), float("nan"), ldiff, n_kept])
            ok &= kdiff == 0 and vdiff == 0 and ldiff == 0
    return ok


# --------------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", default="/root/.cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--text-dir", default="/usr/share/vim/vim90/doc")
    ap.add_argument("--contexts", default="1024,2048", help="prompt lengths L, comma-separated")
    ap.add_argument("--continuation", type=int, default=32, help="continuation length T")
    ap.add_argument("--budgets", default="0.125,0.25,0.5", help="fractions of the prompt kept")
    ap.add_argument("--presses", default="streaming,h2o,snapkv,tova,knorm",
                    help="comma-separated, from: " + ",".join(PRESSES))
    ap.add_argument("--max-contexts", type=int, default=8, help="windows per prompt length L")
    ap.add_argument("--out", default="bench/peers/results/kvpress_smollm2.csv")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--selftest", action="store_true",
                    help="also run the budget-1.0 and fast-path equivalence checks on the first window")
    ap.add_argument("--selftest-context", type=int, default=512, help="prompt length for --selftest")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    Ls = [int(x) for x in args.contexts.split(",")]
    T = args.continuation
    budgets = [float(x) for x in args.budgets.split(",")]
    press_names = args.presses.split(",")
    for n in press_names:
        if n not in PRESSES:
            sys.exit(f"unknown press {n!r}; known: {','.join(PRESSES)}")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(args.out)[0]

    t_start = time.perf_counter()
    folder, name = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    t_load = time.perf_counter() - t_start
    log = lambda *a: print(f"[{time.perf_counter() - t_start:7.1f}s]", *a, file=sys.stderr, flush=True)
    log(f"loaded {name} in {t_load:.1f}s; torch {torch.__version__}, transformers "
        f"{__import__('transformers').__version__}, kvpress {kvpress_version()}")

    tok_cache = {}
    if args.selftest:
        Ls_st = args.selftest_context
        w = make_windows(tok, args.text_dir, Ls_st, T, 1, tok_cache)[0]
        rows = []
        ok = selftest(model, w, Ls_st, T, press_names, budgets, rows)
        with open(stem + "_selftest.csv", "w", newline="") as f:
            cw = csv.writer(f)
            cw.writerow(["check", "method", "budget", "context", "max_kl_or_max_kv_absdiff",
                         "top1_agreement", "max_logit_absdiff", "n_kept"])
            cw.writerows(rows)
        log(f"selftest {'PASSED' if ok else 'FAILED'} ({len(rows)} checks) -> {stem}_selftest.csv")
        if not ok:
            sys.exit(1)

    accs = {}  # (method, budget, L) -> Acc
    ctx_rows = []
    for L in Ls:
        windows = make_windows(tok, args.text_dir, L, T, args.max_contexts, tok_cache)
        if len(windows) < args.max_contexts:
            log(f"L={L}: only {len(windows)} windows available")
        for wi, (fname, k, ids_list) in enumerate(windows):
            ids = torch.tensor(ids_list)[None]
            prompt, cont = ids[:, :L], ids[:, L:]
            target = cont[0]
            ctx_rows.append([L, wi, fname, k, k * (L + T),
                             hashlib.sha256(",".join(map(str, ids_list)).encode()).hexdigest()[:16],
                             " ".join(map(str, ids_list[:8]))])
            by_attn = {}
            for n in press_names:
                by_attn.setdefault(PRESSES[n][2], {}).update({(n, b): make_press(n, b) for b in budgets})
            # teacher + sdpa presses (+ an identity shadow: the `full` sanity row) from one sdpa prefill
            sd = dict(by_attn.get("sdpa", {}))
            sd[("full", 1.0)] = None
            presses_sdpa = {k2: v for k2, v in sd.items() if v is not None}
            p0, tcache, shadows = prefill(model, prompt, "sdpa", presses=presses_sdpa)
            full_copy = build_cache(model, tcache)  # before the teacher continuation extends tcache
            P = continue_forced(model, tcache, cont, L, p0)
            shadows[("full", 1.0)] = full_copy
            students = [(key, p0, sh) for key, sh in shadows.items()]
            if "eager" in by_attn:
                e0, _, esh = prefill(model, prompt, "eager", presses=by_attn["eager"])
                students += [(key, e0, sh) for key, sh in esh.items()]
            for key, q0, sh in students:
                kept = sh.get_seq_length(0)
                Q = continue_forced(model, build_cache(model, sh) if key[0] != "full" else sh, cont, L, q0)
                acc = accs.setdefault((key[0], key[1], L), Acc(T))
                acc.add(*compare(P, Q, target))
                acc.kept.add(kept)
            log(f"L={L} window {wi + 1}/{len(windows)} ({fname} #{k}) done")

    methods = ["full"] + press_names
    rows, step_rows = [], []
    for L in Ls:
        for m in methods:
            for b in ([1.0] if m == "full" else budgets):
                a = accs.get((m, b, L))
                if a is None:
                    continue
                n_steps = a.n_ctx * T
                rows.append([m, b, L, float(a.kl.sum()) / n_steps, float(a.agree.sum()) / n_steps,
                             math.exp((a.nll_q - a.nll_p) / n_steps), a.n_ctx, n_steps])
                for t in range(T):
                    step_rows.append([m, b, L, t, float(a.kl[t]) / a.n_ctx, float(a.agree[t]) / a.n_ctx,
                                      a.n_ctx, "/".join(map(str, sorted(a.kept)))])
    with open(args.out, "w", newline="") as f:
        cw = csv.writer(f)
        cw.writerow(["method", "budget", "context", "kl_mean", "top1_agreement", "ppl_ratio", "n_contexts", "n_steps"])
        for r in rows:
            cw.writerow([r[0], r[1], r[2], f"{r[3]:.6g}", f"{r[4]:.6f}", f"{r[5]:.6f}", r[6], r[7]])
    with open(stem + "_steps.csv", "w", newline="") as f:
        cw = csv.writer(f)
        cw.writerow(["method", "budget", "context", "step", "kl_mean", "top1_agreement", "n_contexts", "n_kept"])
        for r in step_rows:
            cw.writerow([r[0], r[1], r[2], r[3], f"{r[4]:.6g}", f"{r[5]:.6f}", r[6], r[7]])
    with open(stem + "_contexts.csv", "w", newline="") as f:
        cw = csv.writer(f)
        cw.writerow(["context", "window", "file", "k", "token_offset", "sha256_16_of_ids", "first_8_ids"])
        cw.writerows(ctx_rows)
    wall = time.perf_counter() - t_start
    log(f"wrote {args.out} (+ _steps, _contexts); wall {wall:.1f}s; {platform.node()} "
        f"{os.cpu_count()} cpus, {torch.get_num_threads()} threads")
    for r in rows:
        print(",".join(map(str, r)))


def kvpress_version():
    from importlib.metadata import version
    return version("kvpress")


if __name__ == "__main__":
    main()
