#!/usr/bin/env python3
"""Seeds the fuzz corpora: copies the small test fixtures and writes a few hand-made inputs.

    python3 fuzz/make_seeds.py OUT_DIR     -> OUT_DIR/{gguf,safetensors,hf_config,tokenizer,policy_checkpoint}/

Standard library only. Inputs larger than a target's -max_len (see scripts/fuzz.sh) are skipped:
libFuzzer would only truncate them.
"""
import hashlib
import json
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
MAX_LEN = {"gguf": 32768, "safetensors": 32768, "hf_config": 4096, "tokenizer": 4096,
           "policy_checkpoint": 16384}


def put(out: Path, target: str, data: bytes, name: str = "") -> None:
    if len(data) > MAX_LEN[target]:
        return
    d = out / target
    d.mkdir(parents=True, exist_ok=True)
    (d / (name or hashlib.sha1(data).hexdigest()[:16])).write_bytes(data)


# ---- GGUF ----------------------------------------------------------------------------------

def gstr(s) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gval(v):
    """(type id, payload) of a Python value."""
    if isinstance(v, bool):
        return 7, struct.pack("<B", v)
    if isinstance(v, int):
        return 4, struct.pack("<I", v)
    if isinstance(v, float):
        return 6, struct.pack("<f", v)
    if isinstance(v, (str, bytes)):
        return 8, gstr(v)
    if isinstance(v, tuple) and v[0] == "i32":
        return 5, struct.pack("<i", v[1])
    if isinstance(v, list):
        if all(isinstance(x, str) for x in v):
            return 9, struct.pack("<IQ", 8, len(v)) + b"".join(gstr(x) for x in v)
        if all(isinstance(x, float) for x in v):
            return 9, struct.pack("<IQ", 6, len(v)) + b"".join(struct.pack("<f", x) for x in v)
        return 9, struct.pack("<IQ", 5, len(v)) + b"".join(struct.pack("<i", x) for x in v)
    raise TypeError(v)


def gguf(kv: dict, tensors: list, align: int = 32) -> bytes:
    """tensors: (name, ne, ggml type, raw bytes)."""
    b = struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kv))
    for k, v in kv.items():
        t, p = gval(v)
        b += gstr(k) + struct.pack("<I", t) + p
    off, offsets = 0, []
    for name, ne, typ, raw in tensors:
        offsets.append(off)
        b += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        b += struct.pack("<IQ", typ, off)
        off = (off + len(raw) + align - 1) // align * align
    b += b"\0" * (-len(b) % align)
    for (_, _, _, raw), o in zip(tensors, offsets):
        b += raw + b"\0" * (-len(raw) % align)
    return b


def f32(n, scale=0.01):
    return struct.pack(f"<{n}f", *[(i % 7 - 3) * scale for i in range(n)])


def f16(n):
    return struct.pack(f"<{n}e", *[(i % 5 - 2) * 0.125 for i in range(n)])


def q8_0(blocks):
    return b"".join(struct.pack("<e", 0.5) + bytes((i * 7) % 256 for i in range(32)) for _ in range(blocks))


def tiny_model(tokenizer_kv: dict, vocab: int) -> bytes:
    d, ff = 4, 4  # 2 heads of 2, 1 KV head
    kv = {
        "general.architecture": "llama",
        "general.alignment": 32,
        "llama.block_count": 1,
        "llama.context_length": 16,
        "llama.embedding_length": d,
        "llama.feed_forward_length": ff,
        "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 1,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.freq_base": 10000.0,
        "llama.rope.dimension_count": 2,
    }
    kv.update(tokenizer_kv)
    t = [
        ("token_embd.weight", [d, vocab], 0, f32(d * vocab)),
        ("blk.0.attn_norm.weight", [d], 0, f32(d, 1.0)),
        ("blk.0.attn_q.weight", [d, d], 1, f16(d * d)),
        ("blk.0.attn_k.weight", [d, 2], 0, f32(2 * d)),
        ("blk.0.attn_v.weight", [d, 2], 30, f16(2 * d)),  # BF16 bytes need not be meaningful
        ("blk.0.attn_output.weight", [d, d], 0, f32(d * d)),
        ("blk.0.ffn_norm.weight", [d], 0, f32(d, 1.0)),
        ("blk.0.ffn_gate.weight", [d, ff], 0, f32(d * ff)),
        ("blk.0.ffn_up.weight", [d, ff], 0, f32(d * ff)),
        ("blk.0.ffn_down.weight", [ff, d], 0, f32(d * ff)),
        ("output_norm.weight", [d], 0, f32(d, 1.0)),
    ]
    return gguf(kv, t)


def gguf_seeds(out: Path) -> None:
    for p in sorted((FIX / "gguf").glob("*.gguf")) + [FIX / "tokenizer" / "spm_tiny.gguf"]:
        put(out, "gguf", p.read_bytes(), p.stem)
    spm_tokens = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "\u2581a", "<0x41>", "<sep>"]
    spm = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": spm_tokens,
        "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -1.5, 0.0, 0.0],
        "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 6, 4],
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
    }
    put(out, "gguf", tiny_model(spm, len(spm_tokens)), "tiny_model_spm")
    gpt2_tokens = ["a", "b", "ab", "\u0120", "\u0120ab", "<|end|>"]
    gpt2 = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": gpt2_tokens,
        "tokenizer.ggml.token_type": [1, 1, 1, 1, 1, 3],
        "tokenizer.ggml.merges": ["a b", "\u0120 ab"],
        "tokenizer.ggml.eos_token_id": 5,
    }
    put(out, "gguf", tiny_model(gpt2, len(gpt2_tokens)), "tiny_model_gpt2")
    # Every metadata value type, nested arrays, and a Q8_0 tensor.
    nested = struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 4, 1) + struct.pack("<I", 7) + struct.pack("<IQ", 8, 1) + gstr("x")
    b = struct.pack("<IIQQ", 0x46554747, 3, 1, 8)
    for k, t, p in [("u8", 0, b"\x07"), ("i16", 3, struct.pack("<h", -3)), ("u64", 10, struct.pack("<Q", 2**63 + 1)),
                    ("i64", 11, struct.pack("<q", -5)), ("f64", 12, struct.pack("<d", 1e300)),
                    ("b", 7, b"\x01"), ("nested", 9, nested), ("bools", 9, struct.pack("<IQ", 7, 3) + b"\x00\x01\x00")]:
        b += gstr(k) + struct.pack("<I", t) + p
    b += gstr("q") + struct.pack("<I", 2) + struct.pack("<QQ", 32, 2) + struct.pack("<IQ", 8, 0)
    b += b"\0" * (-len(b) % 32) + q8_0(2)
    put(out, "gguf", b, "all_value_types")


# ---- safetensors ---------------------------------------------------------------------------

def safetensors(entries: dict, data: bytes, metadata=None) -> bytes:
    header = dict(entries)
    if metadata is not None:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds(out: Path) -> None:
    for p in sorted(FIX.rglob("*.safetensors")):
        put(out, "safetensors", p.read_bytes(), p.parent.name + "_" + p.stem)
    data = f32(6) + f16(4) + f16(2) + struct.pack("<3q", 1, -2, 2**31 - 1) + struct.pack("<2i", 7, -7) + b"\x01\x02"
    o = 0
    ent = {}
    for name, dtype, shape, n in [("w", "F32", [2, 3], 24), ("h", "F16", [4], 8), ("bf", "BF16", [1, 2], 4),
                                  ("ids", "I64", [3], 24), ("i32", "I32", [2], 8), ("u8", "U8", [2], 2)]:
        ent[name] = {"dtype": dtype, "shape": shape, "data_offsets": [o, o + n]}
        o += n
    ent["empty"] = {"dtype": "F32", "shape": [0, 5], "data_offsets": [o, o]}
    ent["scalar"] = {"dtype": "I32", "shape": [], "data_offsets": [16 + 24 + 8 + 4 + 8 + 4, 16 + 24 + 8 + 4 + 8 + 4 + 4]}
    put(out, "safetensors", safetensors(ent, data, {"format": "pt"}), "all_dtypes")


# ---- config.json ---------------------------------------------------------------------------

def hf_config_seeds(out: Path) -> None:
    for p in sorted(FIX.glob("*/config.json")):
        put(out, "hf_config", p.read_bytes(), p.parent.name)
        j = json.loads(p.read_text())
        theta = j.pop("rope_theta", 10000.0)
        j["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
        put(out, "hf_config", json.dumps(j).encode(), p.parent.name + "_rope_parameters")
        j["head_dim"] = 16
        j["rope_scaling"] = None
        j["sliding_window"] = None
        put(out, "hf_config", json.dumps(j, indent=1).encode(), p.parent.name + "_head_dim")


# ---- tokenizer -----------------------------------------------------------------------------

def tokenizer_seeds(out: Path) -> None:
    # Byte 0 is the mode (tests/support/fuzz_entry_points.hpp): vocabulary in bits 0-1,
    # decode in bit 2, add_special in bit 3, parse_special in bit 4.
    for fixture, vocabs in (("smollm2_cases.json", (0, 1)), ("spm_cases.json", (2,))):
        doc = json.loads((FIX / "tokenizer" / fixture).read_text())
        for c in doc["cases"]:
            text = c["text"].encode()
            for v in vocabs:
                put(out, "tokenizer", bytes([v | 16]) + text, f"{v}_{c['name']}")
            put(out, "tokenizer", bytes([vocabs[0] | 8]) + text, f"{vocabs[0]}_{c['name']}_plain")
            ids = c["ids"][:64]
            put(out, "tokenizer", bytes([vocabs[0] | 4]) + struct.pack(f"<{len(ids)}i", *ids),
                f"{vocabs[0]}_{c['name']}_decode")


# ---- policy checkpoints --------------------------------------------------------------------

def fnv1a64(b: bytes) -> int:
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def policy(meta: dict, tensors: list, version: int = 1) -> bytes:
    """A policy checkpoint (include/distillcache/io/policy_checkpoint.hpp); tensors: (name, floats),
    laid out back to back."""
    table, data = [], b""
    for name, values in tensors:
        table.append({"name": name, "shape": [len(values)], "offset": len(data)})
        data += struct.pack(f"<{len(values)}f", *values)
    text = json.dumps(dict(meta, tensors=table)).encode()
    b = b"DCPOLICY" + struct.pack("<IQ", version, len(text)) + text + data
    return b + struct.pack("<Q", fnv1a64(b))


def mlp_params(inputs: int, hidden: list) -> int:
    n, prev = 0, inputs
    for h in hidden + [1]:
        n, prev = n + (prev + 1) * h, h
    return n


def policy_checkpoint_seeds(out: Path) -> None:
    features = ["alpha", "value_norm", "head_variance", "entropy", "position"]
    for name, inputs, hidden, act, state, trainer in [
        ("one_input", features[:1], [1], "relu", False, None),
        ("tiny_tanh_adam", features[:2], [2], "tanh", True, {"step": 3}),
        ("five_features", features, [8, 4], "silu", True,
         {"step": 1200, "rng": {"seed": 7, "counter": 99}, "best_validation": -0.0625}),
        ("unknown_features", ["foo", "bar.baz", "q:1/x-y"], [3], "silu", False, None),
    ]:
        n = mlp_params(len(inputs), hidden)
        tensors = [("weights", [((i * 37) % 11 - 5) * 0.125 for i in range(n)])]
        if state:
            tensors += [("adam_m", [0.01] * n), ("adam_v", [1e-4] * n), ("empty", [])]
        meta = {"feature_normalisation": "scale_free_v1", "inputs": inputs, "hidden": hidden,
                "activation": act, "extra": {"command": "train --budget 0.25", "budgets": [0.1, 0.25]}}
        if trainer is not None:
            meta["trainer"] = trainer
        put(out, "policy_checkpoint", policy(meta, tensors), name)


def main() -> None:
    out = Path(sys.argv[1])
    gguf_seeds(out)
    safetensors_seeds(out)
    hf_config_seeds(out)
    tokenizer_seeds(out)
    policy_checkpoint_seeds(out)
    for t in MAX_LEN:
        print(f"seeds: {t}: {len(list((out / t).iterdir()))} files")


if __name__ == "__main__":
    main()
