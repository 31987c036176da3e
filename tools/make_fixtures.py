#!/usr/bin/env python3
"""Generate Hugging Face oracle fixtures for distillcache.

Usage:
    /opt/dcvenv/bin/python tools/make_fixtures.py --out tests/fixtures

Creates three tiny random-weight checkpoints (Mistral fp32, Mistral sliding
window fp16 sharded, Llama tied-embedding bf16), each with an oracle
(`oracle.safetensors`: tokens + fp32 logits from a model reloaded from the
saved folder in fp32 with eager attention), plus op-level oracles in
`ops/ops.safetensors`.

Everything runs on CPU and is deterministic (fixed seeds).  The script also
self-checks the HF logits against an independent plain-torch float64
reference forward, and checks that the sliding window actually changes the
logits for positions >= window.
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
import safetensors
from safetensors.numpy import save_file, load_file
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM)

SEQ_LEN = 24
VOCAB = 256


def versions():
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }


# --------------------------------------------------------------------------
# Checkpoint specs
# --------------------------------------------------------------------------

def mistral_config(sliding_window, rope_theta):
    return MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        sliding_window=sliding_window,
        tie_word_embeddings=False,
        hidden_act="silu",
    )


def llama_config():
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        tie_word_embeddings=True,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
    )


SPECS = [
    dict(name="tiny_mistral", cls=MistralForCausalLM,
         make_config=lambda: mistral_config(None, 10000.0),
         dtype=torch.float32, dtype_name="float32", max_shard_size=None,
         seed=1234,
         description="MistralForCausalLM, 2 layers, hidden 64, 4 heads / 2 KV heads, "
                     "head_dim 16, vocab 256, no sliding window, rope_theta 1e4, "
                     "untied lm_head, fp32 single-file safetensors."),
    dict(name="tiny_mistral_swa", cls=MistralForCausalLM,
         make_config=lambda: mistral_config(8, 1000000.0),
         dtype=torch.float16, dtype_name="float16", max_shard_size="60KB",
         seed=2345,
         description="MistralForCausalLM, same shape as tiny_mistral but sliding_window 8 "
                     "(< seq_len 24), rope_theta 1e6, fp16 weights sharded into several "
                     "safetensors files + model.safetensors.index.json."),
    dict(name="tiny_llama_tied", cls=LlamaForCausalLM,
         make_config=llama_config,
         dtype=torch.bfloat16, dtype_name="bfloat16", max_shard_size=None,
         seed=3456,
         description="LlamaForCausalLM, 2 layers, hidden 64, intermediate 160, 4 heads / "
                     "1 KV head (GQA group 4), head_dim 16, vocab 256, tied embeddings "
                     "(no lm_head.weight stored), rope_theta 5e5, rms_norm_eps 1e-6, "
                     "bf16 single-file safetensors."),
]


def reinit_(model, seed):
    """Re-draw every parameter deterministically (in a fixed name order)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


def make_tokens(seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, size=SEQ_LEN, dtype=np.int64).astype(np.int32)


def hf_logits(folder, cls, tokens, **config_overrides):
    kw = {}
    if config_overrides:
        cfg = cls.config_class.from_pretrained(folder)
        for k, v in config_overrides.items():
            setattr(cfg, k, v)
        kw["config"] = cfg
    # `dtype` is the transformers>=5 name of the old `torch_dtype` argument.
    model = cls.from_pretrained(folder, dtype=torch.float32,
                                attn_implementation="eager", **kw)
    model.eval()
    assert all(p.dtype == torch.float32 for p in model.parameters())
    ids = torch.from_numpy(tokens.astype(np.int64))[None, :]
    pos = torch.arange(SEQ_LEN)[None, :]
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=pos, use_cache=False)
    return out.logits[0].float().numpy().copy(), model


# --------------------------------------------------------------------------
# Independent plain-torch float64 reference forward
# --------------------------------------------------------------------------

def rope_rotate_half(x, pos, theta):
    # x: [T, H, D]
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [D/2]
    ang = pos.double()[:, None] * inv[None, :]                          # [T, D/2]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rope_interleaved(x, pos, theta):
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None, :]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    xe, xo = x[..., 0::2], x[..., 1::2]
    y = torch.empty_like(x)
    y[..., 0::2] = xe * c - xo * s
    y[..., 1::2] = xo * c + xe * s
    return y


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def manual_forward(sd, cfg, tokens, window_rule=None, rope="half"):
    """window_rule: None (full causal), 'lt' (i-j < W) or 'le' (i-j <= W)."""
    sd = {k: v.double() for k, v in sd.items()}
    T = len(tokens)
    H, KV, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    theta = cfg.rope_parameters["rope_theta"]
    eps = cfg.rms_norm_eps
    pos = torch.arange(T)
    rope_fn = rope_rotate_half if rope == "half" else rope_interleaved
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    allowed = j <= i
    W = getattr(cfg, "sliding_window", None)
    if window_rule == "lt":
        allowed &= (i - j) < W
    elif window_rule == "le":
        allowed &= (i - j) <= W
    x = sd["model.embed_tokens.weight"][torch.as_tensor(tokens, dtype=torch.long)]
    for l in range(cfg.num_hidden_layers):
        p = f"model.layers.{l}."
        h = rmsnorm(x, sd[p + "input_layernorm.weight"], eps)
        q = (h @ sd[p + "self_attn.q_proj.weight"].T).view(T, H, D)
        k = (h @ sd[p + "self_attn.k_proj.weight"].T).view(T, KV, D)
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(T, KV, D)
        q, k = rope_fn(q, pos, theta), rope_fn(k, pos, theta)
        rep = H // KV
        k = k.repeat_interleave(rep, dim=1)  # head h uses kv head h // rep
        v = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) / math.sqrt(D)
        s = s.masked_fill(~allowed[None], float("-inf"))
        a = torch.softmax(s, dim=-1)
        o = torch.einsum("hts,shd->thd", a, v).reshape(T, H * D)
        x = x + o @ sd[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, sd[p + "post_attention_layernorm.weight"], eps)
        g = h @ sd[p + "mlp.gate_proj.weight"].T
        u = h @ sd[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ sd[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, sd["model.norm.weight"], eps)
    lm = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return (x @ lm.T).numpy()


def maxabs(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# --------------------------------------------------------------------------
# Checkpoints + oracles
# --------------------------------------------------------------------------

def build_checkpoint(spec, out_root, report):
    name = spec["name"]
    folder = os.path.join(out_root, name)
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)

    torch.manual_seed(spec["seed"])
    cfg = spec["make_config"]()
    model = spec["cls"](cfg).to(torch.float32)
    reinit_(model, spec["seed"])
    model = model.to(spec["dtype"])
    model.config.dtype = spec["dtype"]
    save_kw = dict(safe_serialization=True)
    if spec["max_shard_size"]:
        save_kw["max_shard_size"] = spec["max_shard_size"]
    model.save_pretrained(folder, **save_kw)
    del model

    tokens = make_tokens(spec["seed"])
    logits, ref_model = hf_logits(folder, spec["cls"], tokens)
    save_file({"tokens": tokens, "logits": logits.astype(np.float32)},
              os.path.join(folder, "oracle.safetensors"))

    rep = {"files": sorted(os.listdir(folder))}
    std_per_pos = logits.std(axis=-1)
    rep["logit_std_min"] = float(std_per_pos.min())
    rep["logit_std_mean"] = float(std_per_pos.mean())
    assert std_per_pos.min() > 0.1, f"{name}: degenerate logits"

    # Independent reference forward from the fp32 (upcast) reloaded weights.
    sd = {k: v.detach().clone() for k, v in ref_model.state_dict().items()}
    rcfg = ref_model.config
    W = getattr(rcfg, "sliding_window", None)
    rule = "lt" if W is not None else None
    ref = manual_forward(sd, rcfg, tokens, window_rule=rule, rope="half")
    rep["maxabs_hf_vs_manual_rotate_half"] = maxabs(logits, ref)
    ref_il = manual_forward(sd, rcfg, tokens, window_rule=rule, rope="interleaved")
    rep["maxabs_hf_vs_manual_interleaved"] = maxabs(logits, ref_il)
    assert rep["maxabs_hf_vs_manual_rotate_half"] < 1e-3, rep
    assert rep["maxabs_hf_vs_manual_interleaved"] > 1e-2, rep

    if W is not None:
        le = manual_forward(sd, rcfg, tokens, window_rule="le", rope="half")
        full = manual_forward(sd, rcfg, tokens, window_rule=None, rope="half")
        rep["maxabs_hf_vs_manual_rule_i-j<W"] = rep["maxabs_hf_vs_manual_rotate_half"]
        rep["maxabs_hf_vs_manual_rule_i-j<=W"] = maxabs(logits, le)
        rep["maxabs_hf_vs_manual_no_window"] = maxabs(logits, full)
        # HF with the window disabled, same saved weights.
        nowin, _ = hf_logits(folder, spec["cls"], tokens, sliding_window=None)
        diff = np.abs(nowin.astype(np.float64) - logits).max(axis=-1)
        rep["hf_window_vs_nowindow_maxabs_pos<W"] = float(diff[:W].max())
        rep["hf_window_vs_nowindow_maxabs_pos>=W_min"] = float(diff[W:].min())
        rep["hf_window_vs_nowindow_first_differing_pos"] = int(np.nonzero(diff > 1e-4)[0][0])
        assert diff[:W].max() < 1e-5 and diff[W:].min() > 1e-3, rep
        assert rep["maxabs_hf_vs_manual_rule_i-j<=W"] > 1e-2, rep
        # The mask function itself.
        from transformers.masking_utils import sliding_window_causal_mask_function
        fn = sliding_window_causal_mask_function(W)
        z = torch.tensor(0)
        rep["mask_fn(q=W, kv=0)"] = bool(fn(z, z, torch.tensor(W), torch.tensor(0)))
        rep["mask_fn(q=W-1, kv=0)"] = bool(fn(z, z, torch.tensor(W - 1), torch.tensor(0)))

    meta = {
        "description": spec["description"],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seq_len": SEQ_LEN,
        "model_class": spec["cls"].__name__,
        "dtype_saved": spec["dtype_name"],
        "sliding_window": W,
        "token_seed": spec["seed"],
        "oracle": "logits from from_pretrained(folder, dtype=float32, attn_implementation='eager'), "
                  "eval, no_grad, batch 1, position_ids 0..seq_len-1, one full forward",
    }
    with open(os.path.join(folder, "oracle.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
    report[name] = rep


# --------------------------------------------------------------------------
# Op-level oracles (float64 math, stored as float32)
# --------------------------------------------------------------------------

def build_ops(out_root, report):
    folder = os.path.join(out_root, "ops")
    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(777)
    f64 = torch.float64

    def rnd(*shape):
        # Round inputs to fp32 first so the stored fp32 inputs are exact.
        return torch.randn(*shape, generator=g, dtype=f64).float().double()

    eps, theta, hd = 1e-5, 10000.0, 16
    t = {}
    x = rnd(5, 64)
    w = (1.0 + 0.1 * rnd(64)).float().double()
    t["rmsnorm_x"], t["rmsnorm_w"] = x, w
    t["rmsnorm_y"] = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    pos = torch.tensor([0, 1, 2, 7, 100, 1000], dtype=torch.int32)
    rx = rnd(6, 2, hd)
    t["rope_pos"], t["rope_x"] = pos, rx
    t["rope_half_y"] = rope_rotate_half(rx, pos, theta)
    t["rope_interleaved_y"] = rope_interleaved(rx, pos, theta)
    inv = theta ** (-torch.arange(0, hd, 2, dtype=f64) / hd)
    ang = pos.double()[:, None] * inv[None, :]
    t["rope_cos"], t["rope_sin"] = torch.cos(ang), torch.sin(ang)

    sx = 3.0 * rnd(4, 33)
    sx[0, 5], sx[1, 0], sx[1, 32] = 50.0, 50.0, -50.0
    sx[2, :] = -50.0 + rnd(33)
    sx[3, 10], sx[3, 11] = 50.0, 49.0
    t["softmax_x"], t["softmax_y"] = sx, torch.softmax(sx, dim=-1)

    ga, up = 2.0 * rnd(3, 40), rnd(3, 40)
    t["swiglu_gate"], t["swiglu_up"] = ga, up
    t["swiglu_y"] = ga / (1.0 + torch.exp(-ga)) * up

    # Cross-check the rotate_half oracle against transformers' own RoPE code.
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    cos = torch.cat([torch.cos(ang), torch.cos(ang)], -1)[None]   # [1, T, D]
    sin = torch.cat([torch.sin(ang), torch.sin(ang)], -1)[None]
    q = rx.permute(1, 0, 2)[None]                                  # [1, H, T, D]
    hq, _ = apply_rotary_pos_emb(q, q, cos, sin)
    report["ops_rope_half_vs_transformers_apply_rotary"] = maxabs(
        hq[0].permute(1, 0, 2), t["rope_half_y"])
    report["ops_rope_half_vs_interleaved"] = maxabs(t["rope_half_y"], t["rope_interleaved_y"])

    arrays = {k: (v.numpy().astype(np.int32) if v.dtype == torch.int32
                  else v.numpy().astype(np.float32)) for k, v in t.items()}
    save_file(arrays, os.path.join(folder, "ops.safetensors"))
    meta = {
        "rmsnorm_eps": eps,
        "rope_theta": theta,
        "rope_head_dim": hd,
        "rope_half": "pairs (i, i+8), angle pos*theta^(-2i/16), y_i = x_i cos - x_{i+8} sin, "
                     "y_{i+8} = x_{i+8} cos + x_i sin (HF rotate_half)",
        "rope_interleaved": "pairs (2i, 2i+1), same angle (GPT-J / llama.cpp normal rope)",
        "rope_cos_sin": "cos/sin of angle, shape [6, 8] (pos x pair index)",
        "softmax": "along last axis",
        "swiglu": "silu(gate) * up",
        "precision": "computed in float64 (from the float32 inputs), stored as float32",
        "shapes": {k: list(v.shape) for k, v in arrays.items()},
    }
    with open(os.path.join(folder, "ops.json"), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")


def verify(out_root):
    for spec in SPECS:
        o = load_file(os.path.join(out_root, spec["name"], "oracle.safetensors"))
        assert o["tokens"].dtype == np.int32 and o["tokens"].shape == (SEQ_LEN,)
        assert o["logits"].dtype == np.float32 and o["logits"].shape == (SEQ_LEN, VOCAB)
        assert np.isfinite(o["logits"]).all()
    ops = load_file(os.path.join(out_root, "ops", "ops.safetensors"))
    assert all(np.isfinite(v).all() for v in ops.values())
    return {k: (str(v.dtype), list(v.shape)) for k, v in ops.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    report = {"versions": versions()}
    for spec in SPECS:
        build_checkpoint(spec, args.out, report)
    build_ops(args.out, report)
    report["ops_tensors"] = verify(args.out)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
