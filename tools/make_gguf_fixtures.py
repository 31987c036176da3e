#!/usr/bin/env python3
"""Generate GGUF oracle fixtures for distillcache's GGUF reader (tests/cpu/test_gguf*.cpp).

Usage:
    /opt/dcvenv/bin/python tools/make_gguf_fixtures.py --out tests/fixtures/gguf \
        [--smollm2 ~/.cache/distillcache/SmolLM2-135M-Instruct.Q4_1.gguf]

Writes, with the reference writer/quantizer (PyPI `gguf`) as the oracle:

* types_<t>.gguf for t in f32, f16, bf16, q8_0, q4_0, q4_1: tensors "a" (numpy [3, 64]) and
  "b" (numpy [2, 3, 32]) of random values stored as that type, plus metadata of every GGUF
  value type (metadata.json lists each key, its type and its value). types_q8_0.gguf uses
  general.alignment = 64 instead of the default 32.
* expected.safetensors: "<t>.a", "<t>.b" = gguf.quants.dequantize of the stored bytes (fp32).
* tiny_llama_tied.gguf: tests/fixtures/tiny_llama_tied (HF LlamaForCausalLM, bf16) converted the
  way llama.cpp's convert_hf_to_gguf.py does (Q/K rows permuted per head by LlamaModel.permute),
  stored as BF16 -- lossless, since the checkpoint is bf16 -- so its logits must equal that
  folder's oracle.safetensors. The script cross-checks by loading the GGUF back with
  transformers (AutoModelForCausalLM.from_pretrained(..., gguf_file=...)).
* smollm2_rows.safetensors (with --smollm2): a few dequantized rows of the real model's
  token_embd.weight (Q8_0) and blk.0.attn_q.weight (Q4_1), in the file's (permuted) row order,
  output_norm.weight, and Hugging Face's logits for the prompt "The capital of France is"
  (token ids looked up in the GGUF's own token list) at a few vocabulary ids.

Deterministic: fixed seeds; two runs give byte-identical files.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT, GGUFValueType as VT
from safetensors.numpy import save_file, load_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

TYPES = {
    "f32": QT.F32,
    "f16": QT.F16,
    "bf16": QT.BF16,
    "q8_0": QT.Q8_0,
    "q4_0": QT.Q4_0,
    "q4_1": QT.Q4_1,
}

# (key, value type, value, element type for arrays). Every GGUF value type appears at least once,
# scalars at or near their range limits; arrays of numbers, bools, strings and arrays.
METADATA = [
    ("test.u8", VT.UINT8, 200, None),
    ("test.i8", VT.INT8, -100, None),
    ("test.u16", VT.UINT16, 60000, None),
    ("test.i16", VT.INT16, -30000, None),
    ("test.u32", VT.UINT32, 4000000000, None),
    ("test.i32", VT.INT32, -2000000000, None),
    ("test.u64", VT.UINT64, 2**40 + 3, None),
    ("test.u64_max", VT.UINT64, 2**64 - 1, None),
    ("test.i64", VT.INT64, -(2**62) + 7, None),
    ("test.f32", VT.FLOAT32, float(np.float32(3.14159)), None),
    ("test.f64", VT.FLOAT64, 2.718281828459045, None),
    ("test.bool_true", VT.BOOL, True, None),
    ("test.bool_false", VT.BOOL, False, None),
    ("test.string", VT.STRING, "h\u00e9llo w\u00f6rld \u2713", None),
    ("test.empty_string", VT.STRING, "", None),
    ("test.arr_u8", VT.ARRAY, [0, 1, 255], VT.UINT8),
    ("test.arr_i16", VT.ARRAY, [-32768, 0, 32767], VT.INT16),
    ("test.arr_i32", VT.ARRAY, [1, -2, 3, 2147483647], VT.INT32),
    ("test.arr_u32", VT.ARRAY, [0, 4294967295], VT.UINT32),
    ("test.arr_i64", VT.ARRAY, [-(2**63), 2**63 - 1], VT.INT64),
    ("test.arr_u64", VT.ARRAY, [0, 2**50], VT.UINT64),
    ("test.arr_f32", VT.ARRAY, [float(np.float32(v)) for v in (0.5, -1.25, 1e-3, 3.0e38)], VT.FLOAT32),
    ("test.arr_f64", VT.ARRAY, [1e-300, -2.5, 1e300], VT.FLOAT64),
    ("test.arr_bool", VT.ARRAY, [True, False, True], VT.BOOL),
    ("test.arr_string", VT.ARRAY, ["a", "", "\u00fcn\u00ef", "multi word"], VT.STRING),
    ("test.arr_nested_i32", VT.ARRAY, [[1, 2, 3], [4, 5]], VT.ARRAY),
    ("test.arr_nested_string", VT.ARRAY, [["x"], ["y", "z"]], VT.ARRAY),
]


def add_metadata(w):
    for key, vtype, value, sub in METADATA:
        if vtype == VT.ARRAY:
            w.add_key_value(key, value, VT.ARRAY, sub_type=sub)
        else:
            w.add_key_value(key, value, vtype)


def metadata_json(path):
    entries = []
    for key, vtype, value, sub in METADATA:
        e = {"key": key, "type": vtype.name}
        if vtype == VT.ARRAY:
            e["element_type"] = sub.name
            if sub == VT.ARRAY:
                e["inner_type"] = VT.get_type(value[0][0]).name
        e["value"] = value
        entries.append(e)
    doc = {
        "description": "Metadata written into every types_*.gguf by tools/make_gguf_fixtures.py "
                       "(besides general.architecture = 'test' and, in types_q8_0.gguf only, "
                       "general.alignment = 64).",
        "gguf_version": gguf.constants.GGUF_VERSION,
        "gguf_package": _gguf_version(),
        "entries": entries,
        "alignment": {k: (64 if k == "q8_0" else 32) for k in TYPES},
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


def _gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # pragma: no cover
        return "?"


def random_tensors(rng, tname):
    a = rng.standard_normal((3, 64)).astype(np.float32)
    b = (rng.standard_normal((2, 3, 32)) * 4).astype(np.float32)
    if tname in ("q8_0", "q4_0", "q4_1"):
        a[1, 32:] = 0.0  # an all-zero block: scale 0
        b[1, 2, :] = 7.0  # a constant block: max == min for Q4_1
    if tname in ("f16", "bf16"):
        # Special values the converters must carry: +-0, +-inf, NaN, extremes, subnormals.
        specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, -65504.0, 6e-8, -3e-7, 1e-40,
                    3.0e38, 1.0 / 3.0]
        a[0, : len(specials)] = np.array(specials, dtype=np.float32)
    return {"a": a, "b": b}


def write_type_files(out, rng):
    expected = {}
    for tname, qtype in TYPES.items():
        path = os.path.join(out, f"types_{tname}.gguf")
        w = gguf.GGUFWriter(path, "test")
        if tname == "q8_0":
            w.add_custom_alignment(64)
        add_metadata(w)
        for name, x in random_tensors(rng, tname).items():
            with np.errstate(over="ignore", invalid="ignore"):
                q = gguf.quants.quantize(x, qtype)
            if qtype in (QT.F32, QT.F16):
                w.add_tensor(name, q)
            else:
                w.add_tensor(name, q, raw_dtype=qtype)
            deq = gguf.quants.dequantize(q.view(np.uint8) if qtype not in (QT.F32, QT.F16) else q, qtype)
            expected[f"{tname}.{name}"] = np.ascontiguousarray(deq.reshape(x.shape).astype(np.float32))
        _finish(w)
        # Read back with the reference reader: the tensors and dims we meant to write.
        r = gguf.GGUFReader(path)
        names = [t.name for t in r.tensors]
        assert names == ["a", "b"], names
        assert list(r.tensors[0].shape) == [64, 3] and list(r.tensors[1].shape) == [32, 3, 2]
        assert r.tensors[0].tensor_type == qtype
    save_file(expected, os.path.join(out, "expected.safetensors"))
    return expected


def _finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ------------------------------------------------------------------------------------------
# tiny_llama_tied -> GGUF, the way convert_hf_to_gguf.py does it
# ------------------------------------------------------------------------------------------

def llama_permute(weights, n_head, n_head_kv):
    """LlamaModel.permute from llama.cpp's convert_hf_to_gguf.py (rotate-half -> interleaved)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def bf16_bits_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def write_tiny_llama(out):
    src = os.path.join(REPO, "tests", "fixtures", "tiny_llama_tied")
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    import torch
    from safetensors.torch import load_file as load_torch
    sd = {k: v.to(torch.float32).numpy() for k, v in load_torch(os.path.join(src, "model.safetensors")).items()}

    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, head_dim = cfg["hidden_size"], cfg["head_dim"]
    assert head_dim * n_head == d
    path = os.path.join(out, "tiny_llama_tied.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny_llama_tied")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(d)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    # No llama.vocab_size (older converters do not write it): the vocabulary size must come
    # from the token list, as in many published GGUF files.
    vocab = cfg["vocab_size"]
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(vocab)])
    w.add_token_scores([0.0] * vocab)
    w.add_token_types([1] * vocab)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    def add(name, x):
        # BF16 is lossless here: every value came from a bf16 checkpoint.
        q = gguf.quants.quantize(np.ascontiguousarray(x, dtype=np.float32), QT.BF16)
        assert np.array_equal(gguf.quants.dequantize(q, QT.BF16).reshape(x.shape), x)
        w.add_tensor(name, q, raw_dtype=QT.BF16)

    add("token_embd.weight", sd["model.embed_tokens.weight"])
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        add(f"blk.{l}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        add(f"blk.{l}.attn_q.weight", llama_permute(sd[p + "self_attn.q_proj.weight"], n_head, n_head))
        add(f"blk.{l}.attn_k.weight", llama_permute(sd[p + "self_attn.k_proj.weight"], n_head, n_kv))
        add(f"blk.{l}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        add(f"blk.{l}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        add(f"blk.{l}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        add(f"blk.{l}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        add(f"blk.{l}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        add(f"blk.{l}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    add("output_norm.weight", sd["model.norm.weight"])
    assert cfg["tie_word_embeddings"] and "lm_head.weight" not in sd  # tied: no output.weight
    _finish(w)
    return path, src


def hf_cross_check(gguf_path, src):
    """Loads the GGUF with transformers (its own reverse permutation) and compares with the
    folder's oracle logits."""
    import torch
    from transformers import AutoModelForCausalLM
    oracle = load_file(os.path.join(src, "oracle.safetensors"))
    tokens = torch.from_numpy(oracle["tokens"].astype(np.int64))[None]
    result = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            import shutil
            shutil.copy(gguf_path, tmp)
            model = AutoModelForCausalLM.from_pretrained(
                tmp, gguf_file=os.path.basename(gguf_path), dtype=torch.float32,
                attn_implementation="eager")
            model.eval()
            with torch.no_grad():
                logits = model(tokens, position_ids=torch.arange(tokens.shape[1])[None]).logits[0]
        err = float((logits.numpy() - oracle["logits"]).__abs__().max())
        result = {"loaded": True, "class": type(model).__name__, "max_abs_err_vs_oracle": err,
                  "tie_word_embeddings": bool(model.config.tie_word_embeddings)}
    except Exception as e:  # report, do not fail: the C++ test is the proof
        result = {"loaded": False, "error": f"{type(e).__name__}: {e}"}
    return result


# ------------------------------------------------------------------------------------------
# SmolLM2 rows
# ------------------------------------------------------------------------------------------

SMOL_EMBD_ROWS = [0, 1, 2, 1000, 49151]
SMOL_Q_ROWS = [0, 1, 575]


def write_smollm2_rows(out, model_path):
    r = gguf.GGUFReader(model_path)
    t = {x.name: x for x in r.tensors}

    def rows(name, idx):
        info = t[name]
        raw = np.asarray(info.data)  # [rows, bytes per row] for quantized types
        deq = gguf.quants.dequantize(raw[idx], info.tensor_type)
        return np.ascontiguousarray(deq.astype(np.float32))

    emb = t["token_embd.weight"]
    q = t["blk.0.attn_q.weight"]
    assert emb.tensor_type == QT.Q8_0 and q.tensor_type == QT.Q4_1
    data = {
        "token_embd_rows": np.array(SMOL_EMBD_ROWS, dtype=np.int32),
        "token_embd": rows("token_embd.weight", SMOL_EMBD_ROWS),
        "attn_q0_rows": np.array(SMOL_Q_ROWS, dtype=np.int32),
        "attn_q0": rows("blk.0.attn_q.weight", SMOL_Q_ROWS),
        "output_norm": np.ascontiguousarray(np.asarray(t["output_norm.weight"].data, dtype=np.float32)),
    }
    data.update(smollm2_hf_logits(model_path, r))
    save_file(data, os.path.join(out, "smollm2_rows.safetensors"))


SMOL_WORDS = ["The", "\u0120capital", "\u0120of", "\u0120France", "\u0120is"]


def smollm2_hf_logits(model_path, reader):
    """Hugging Face's logits for a short prompt (transformers dequantizes the GGUF itself and
    undoes the Q/K permutation with its own code), kept only at a few vocabulary ids: the top 8
    of every position plus 24 fixed random ids."""
    import torch
    from transformers import AutoModelForCausalLM
    field = reader.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    tokens = [1] + [vocab.index(w) for w in SMOL_WORDS]  # the file's bos_token_id, then the words
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(model_path), gguf_file=os.path.basename(model_path), dtype=torch.float32,
        attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].numpy()
    ids = set(np.argsort(-logits, axis=1)[:, :8].ravel().tolist())
    ids |= set(np.random.default_rng(7).choice(len(vocab), 24, replace=False).tolist())
    ids = np.array(sorted(ids), dtype=np.int32)
    return {
        "hf_tokens": np.array(tokens, dtype=np.int32),
        "hf_vocab_ids": ids,
        "hf_logits": np.ascontiguousarray(logits[:, ids].astype(np.float32)),
        "hf_argmax": logits.argmax(axis=1).astype(np.int32),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "gguf"))
    default_smol = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                "distillcache", "SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--smollm2", default=default_smol)
    ap.add_argument("--no-hf-check", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    rng = np.random.default_rng(20240607)
    write_type_files(args.out, rng)
    metadata_json(os.path.join(args.out, "metadata.json"))
    gguf_path, src = write_tiny_llama(args.out)
    report = {"gguf_package": _gguf_version(), "tiny_llama_tied.gguf": os.path.getsize(gguf_path)}
    if not args.no_hf_check:
        report["hf_cross_check"] = hf_cross_check(gguf_path, src)
    if os.path.exists(args.smollm2):
        write_smollm2_rows(args.out, args.smollm2)
        report["smollm2_rows"] = "written"
    else:
        report["smollm2_rows"] = f"skipped: {args.smollm2} missing (run scripts/fetch_model.sh)"
    report["total_bytes"] = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))
    json.dump(report, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
