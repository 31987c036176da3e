#!/usr/bin/env python3
"""Tiny random-weight Gemma 3 checkpoints with Hugging Face oracle logits.

Usage:
    /opt/dcvenv/bin/python tools/make_gemma_fixtures.py --out tests/fixtures

Writes tests/fixtures/tiny_gemma3/ and tests/fixtures/tiny_gemma3_softcap/: config.json,
model.safetensors (fp32), oracle.safetensors (tokens int32 [24], logits float32 [24, 128]) and
oracle.json. The shape is chosen so every Gemma 3 feature changes the logits: 4 layers with
layer_types sliding, sliding, full, sliding (so both kinds occur, each with its own RoPE base),
sliding_window 8 < 24 tokens, 2 query heads sharing 1 KV head (head_dim 32), and
query_pre_attn_scalar 24 != head_dim, so a loader that used 1/sqrt(head_dim) would fail.
The second folder adds final_logit_softcapping 3.0 and stores bf16 weights.

Norm weights are drawn around 0 (Gemma stores w and multiplies by 1 + w), so a loader that
forgot the offset would be badly off. The script checks HF against an independent float64
forward written from the Gemma 3 definition, and that the sliding layers' window and the
per-layer RoPE bases actually change the logits. Deterministic (fixed seeds), CPU only, ~5 s.
"""

import argparse
import json
import math
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.numpy import save_file
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

SEQ_LEN = 24
VOCAB = 128
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]


def make_config(softcap):
    return Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=24,
        sliding_window=8,
        layer_types=LAYER_TYPES,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        final_logit_softcapping=softcap,
        attn_logit_softcapping=None,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=1,
    )


SPECS = [
    dict(name="tiny_gemma3", softcap=None, dtype=torch.float32, seed=4567,
         description="Gemma3ForCausalLM, 4 layers (sliding, sliding, full, sliding), hidden 64, "
                     "intermediate 96, 2 heads / 1 KV head, head_dim 32, vocab 128, "
                     "sliding_window 8, RoPE 1e6 global / 1e4 local, query_pre_attn_scalar 24, "
                     "tied embeddings, fp32 weights."),
    dict(name="tiny_gemma3_softcap", softcap=3.0, dtype=torch.bfloat16, seed=5678,
         description="Same shape as tiny_gemma3 with final_logit_softcapping 3.0 and bf16 weights."),
]


def reinit_(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if "norm" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))  # Gemma: multiplier is 1 + w
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


def hf_logits(folder, tokens, **overrides):
    kw = {}
    if overrides:
        cfg = Gemma3TextConfig.from_pretrained(folder)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        kw["config"] = cfg
    model = Gemma3ForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                              attn_implementation="eager", **kw)
    model.eval()
    ids = torch.from_numpy(tokens.astype(np.int64))[None, :]
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=torch.arange(len(tokens))[None, :], use_cache=False)
    return out.logits[0].float().numpy().copy(), model


# Independent float64 forward, written from the Gemma 3 definition (not from HF's code).
def rope(x, theta):
    t, _, d = x.shape
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def norm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (1.0 + w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def manual_forward(sd, cfg, tokens, window=True, local_theta=None):
    sd = {k: v.double() for k, v in sd.items()}
    T, H, KV, D = len(tokens), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    eps, W = cfg.rms_norm_eps, cfg.sliding_window
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    x = sd["model.embed_tokens.weight"][torch.as_tensor(tokens, dtype=torch.long)]
    x = x * math.sqrt(cfg.hidden_size)
    for l, kind in enumerate(cfg.layer_types):
        p = f"model.layers.{l}."
        sliding = kind == "sliding_attention"
        theta = cfg.rope_parameters[kind]["rope_theta"]
        if sliding and local_theta is not None:
            theta = local_theta
        allowed = (j <= i) & (((i - j) < W) if (sliding and window) else True)
        h = norm(x, sd[p + "input_layernorm.weight"], eps)
        q = norm((h @ sd[p + "self_attn.q_proj.weight"].T).view(T, H, D), sd[p + "self_attn.q_norm.weight"], eps)
        k = norm((h @ sd[p + "self_attn.k_proj.weight"].T).view(T, KV, D), sd[p + "self_attn.k_norm.weight"], eps)
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(T, KV, D)
        q, k = rope(q, theta), rope(k, theta)
        k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) * cfg.query_pre_attn_scalar ** -0.5
        a = torch.softmax(s.masked_fill(~allowed[None], float("-inf")), dim=-1)
        o = torch.einsum("hts,shd->thd", a, v).reshape(T, H * D) @ sd[p + "self_attn.o_proj.weight"].T
        x = x + norm(o, sd[p + "post_attention_layernorm.weight"], eps)
        h = norm(x, sd[p + "pre_feedforward_layernorm.weight"], eps)
        f = (gelu_tanh(h @ sd[p + "mlp.gate_proj.weight"].T) * (h @ sd[p + "mlp.up_proj.weight"].T))
        x = x + norm(f @ sd[p + "mlp.down_proj.weight"].T, sd[p + "post_feedforward_layernorm.weight"], eps)
    logits = norm(x, sd["model.norm.weight"], eps) @ sd["model.embed_tokens.weight"].T
    if cfg.final_logit_softcapping is not None:
        logits = torch.tanh(logits / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
    return logits.numpy()


def maxabs(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def build(spec, out_root, report):
    folder = os.path.join(out_root, spec["name"])
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    torch.manual_seed(spec["seed"])
    model = Gemma3ForCausalLM(make_config(spec["softcap"])).to(torch.float32)
    reinit_(model, spec["seed"])
    model = model.to(spec["dtype"])
    model.config.dtype = spec["dtype"]
    model.save_pretrained(folder, safe_serialization=True)
    del model
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(folder, extra)):
            os.remove(os.path.join(folder, extra))

    rng = np.random.default_rng(spec["seed"])
    tokens = rng.integers(0, VOCAB, size=SEQ_LEN, dtype=np.int64).astype(np.int32)
    logits, ref_model = hf_logits(folder, tokens)
    save_file({"tokens": tokens, "logits": logits.astype(np.float32)},
              os.path.join(folder, "oracle.safetensors"))

    rep = {"files": sorted(os.listdir(folder)), "logit_std_min": float(logits.std(-1).min())}
    assert rep["logit_std_min"] > 0.1, rep
    sd = {k: v.detach().clone() for k, v in ref_model.state_dict().items()}
    cfg = ref_model.config
    rep["maxabs_hf_vs_manual"] = maxabs(logits, manual_forward(sd, cfg, tokens))
    assert rep["maxabs_hf_vs_manual"] < 1e-4, rep
    # Each feature must matter, or the fixture could not catch its absence.
    W = cfg.sliding_window
    nowin = manual_forward(sd, cfg, tokens, window=False)
    diff = np.abs(nowin - logits).max(-1)
    rep["no_window_maxabs_pos<W"], rep["no_window_maxabs_pos>=W_min"] = float(diff[:W].max()), float(diff[W:].min())
    assert diff[:W].max() < 1e-4 and diff[W:].min() > 1e-2, rep
    rep["local_theta_1e6_maxabs"] = maxabs(logits, manual_forward(sd, cfg, tokens, local_theta=1e6))
    assert rep["local_theta_1e6_maxabs"] > 1e-2, rep

    meta = {
        "description": spec["description"],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seq_len": SEQ_LEN,
        "model_class": "Gemma3ForCausalLM",
        "dtype_saved": str(spec["dtype"]).replace("torch.", ""),
        "layer_types": LAYER_TYPES,
        "sliding_window": W,
        "final_logit_softcapping": spec["softcap"],
        "token_seed": spec["seed"],
        "oracle": "logits from from_pretrained(folder, dtype=float32, attn_implementation='eager'), "
                  "eval, no_grad, batch 1, position_ids 0..seq_len-1, one full forward",
    }
    with open(os.path.join(folder, "oracle.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    report[spec["name"]] = rep


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    args = ap.parse_args()
    torch.set_num_threads(1)
    report = {"versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                           "transformers": transformers.__version__}}
    for spec in SPECS:
        build(spec, args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
