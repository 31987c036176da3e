#!/usr/bin/env python3
"""Fixtures for the Q5_0 / Q4_K / Q6_K dequantizers (tests/cpu/test_gguf_kquants.cpp).

Usage:
    /opt/dcvenv/bin/python tools/make_kquant_fixtures.py --out tests/fixtures/gguf \
        [--gemma ~/.cache/distillcache/gemma-3-270m-q4_k_m.gguf]

The oracle is gguf-py's reference dequantizer, gguf.quants.dequantize. gguf-py cannot quantize
to the k-quants, so the blocks are written as raw bytes: random where the format allows any byte
(packed scales, quants), with the fp16 super-block factors chosen, plus edge blocks. Writes:

* kquants.gguf: tensors "q4_k" and "q6_k" (ne [512, 3]: six 256-element super-blocks each) and
  "q5_0" (ne [64, 4]: eight 32-element blocks), stored with their raw type.
* kquants_expected.safetensors: the same names, gguf.quants.dequantize of the stored bytes as
  float32 [rows, cols].
* gemma_kquants.json (with --gemma): for every Q4_K, Q6_K and Q5_0 tensor of the real Gemma 3
  270M file (scripts/fetch_gemma.sh) its type, shape and the CRC-32 (zlib.crc32) of all its
  dequantized float32 values, little-endian, row-major; and for a few of them the first 16 values
  and the sum of the first row (math.fsum, exactly rounded), as a readable cross-check.

Per k-quant tensor the six super-blocks are: two random (normal fp16 factors), one of extremes
(all bytes 0xff: every 6-bit scale and min 63, every quant at its maximum, factors +-65504), one
with subnormal fp16 factors, one all zero, one non-finite (Q4_K: d = +inf, dmin = -inf; Q6_K:
d = +inf with some sub-block scales 0, so inf * 0 = NaN). Q5_0 gets the same idea per block
(its non-finite block has d = NaN).

Deterministic: a fixed seed; two runs give byte-identical files.
"""

import argparse
import json
import math
import os
import zlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

F16_MAX = 65504.0
F16_MIN_SUBNORMAL = 2.0**-24


def f16_bytes(x):
    return np.array([x], dtype=np.float16).view(np.uint8)


def q4_k_blocks(rng):
    """Six 144-byte blocks: fp16 d, fp16 dmin, u8 scales[12], u8 qs[128]."""
    blocks = []
    factors = [(0.013, 0.004), (-0.02, 0.031)]  # random blocks; a negative d is allowed
    for d, dmin in factors:
        blocks.append(np.concatenate([f16_bytes(d), f16_bytes(dmin), rng.integers(0, 256, 140, dtype=np.uint8)]))
    blocks.append(np.concatenate([f16_bytes(F16_MAX), f16_bytes(-F16_MAX), np.full(140, 0xFF, np.uint8)]))
    blocks.append(np.concatenate([f16_bytes(F16_MIN_SUBNORMAL * 3), f16_bytes(F16_MIN_SUBNORMAL),
                                  rng.integers(0, 256, 140, dtype=np.uint8)]))
    blocks.append(np.zeros(144, np.uint8))
    nonfinite = rng.integers(0, 256, 140, dtype=np.uint8)
    nonfinite[0] = 0  # sub-block 0: scale 0 (and inf * 0 = NaN)
    blocks.append(np.concatenate([f16_bytes(np.inf), f16_bytes(-np.inf), nonfinite]))
    return np.stack(blocks)


def q6_k_blocks(rng):
    """Six 210-byte blocks: u8 ql[128], u8 qh[64], int8 scales[16], fp16 d."""
    def block(d, scales=None, quants=None):
        q = rng.integers(0, 256, 192, dtype=np.uint8) if quants is None else quants
        s = rng.integers(-128, 128, 16).astype(np.int8).view(np.uint8) if scales is None else scales
        return np.concatenate([q, s, f16_bytes(d)])

    edge_scales = np.array([-128, 127, 0, -1, 1] + [0] * 11, dtype=np.int8).view(np.uint8)
    nonfinite_scales = rng.integers(-128, 128, 16).astype(np.int8).view(np.uint8)
    nonfinite_scales[3] = 0
    return np.stack([
        block(0.0021),
        block(-0.0007),
        block(F16_MAX, np.full(16, 0x80, np.uint8), np.full(192, 0xFF, np.uint8)),  # scales -128
        block(F16_MIN_SUBNORMAL * 5, edge_scales),
        np.zeros(210, np.uint8),
        block(np.inf, nonfinite_scales),
    ])


def q5_0_blocks(rng):
    """Eight 22-byte blocks: fp16 d, u32 qh, u8 qs[16]."""
    def block(d, rest=None):
        return np.concatenate([f16_bytes(d), rng.integers(0, 256, 20, dtype=np.uint8) if rest is None else rest])

    return np.stack([
        block(0.05), block(-0.125), block(1.0), block(0.0003),
        block(F16_MAX, np.full(20, 0xFF, np.uint8)),
        block(F16_MIN_SUBNORMAL),
        np.zeros(22, np.uint8),
        block(np.nan),
    ])


def write_synthetic(out, rng):
    specs = [("q4_k", QT.Q4_K, q4_k_blocks(rng), 2), ("q6_k", QT.Q6_K, q6_k_blocks(rng), 2),
             ("q5_0", QT.Q5_0, q5_0_blocks(rng), 2)]
    path = os.path.join(out, "kquants.gguf")
    w = gguf.GGUFWriter(path, "test")
    expected = {}
    for name, qtype, blocks, blocks_per_row in specs:
        block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
        assert blocks.shape[1] == type_size, (name, blocks.shape)
        raw = np.ascontiguousarray(blocks.reshape(-1, blocks_per_row * type_size))
        w.add_tensor(name, raw, raw_dtype=qtype)
        with np.errstate(invalid="ignore", over="ignore"):
            values = gguf.quants.dequantize(raw, qtype)
        assert values.shape == (raw.shape[0], blocks_per_row * block_size), values.shape
        expected[name] = np.ascontiguousarray(values.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    save_file(expected, os.path.join(out, "kquants_expected.safetensors"))

    # Read back with the reference reader: the types and shapes we meant to write.
    r = gguf.GGUFReader(path)
    assert [t.name for t in r.tensors] == ["q4_k", "q6_k", "q5_0"]
    assert [list(map(int, t.shape)) for t in r.tensors] == [[512, 3], [512, 3], [64, 4]]
    for t, (_, qtype, _, _) in zip(r.tensors, specs):
        assert t.tensor_type == qtype
    # The edge blocks produce the values they are meant to.
    assert np.isnan(expected["q4_k"][2, 256:]).any() and np.isinf(expected["q4_k"][2, 256:]).any()
    assert np.isnan(expected["q6_k"][2, 256:]).any()
    assert (expected["q4_k"][2, :256] == 0).all() and (expected["q6_k"][2, :256] == 0).all()
    assert np.abs(expected["q4_k"][1, :256]).max() == 65504.0 * 63 * 15 + 65504.0 * 63
    return {k: v.shape for k, v in expected.items()}


GEMMA_DETAIL = ["blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.0.attn_q.weight",
                "blk.17.ffn_down.weight", "blk.17.attn_output.weight"]


def write_gemma(out, gemma):
    r = gguf.GGUFReader(gemma)
    tensors = []
    counts = {}
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        if t.tensor_type not in (QT.Q4_K, QT.Q6_K, QT.Q5_0):
            continue
        values = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(t.shape)]  # row-major, slowest first
        values = values.reshape(shape)
        assert np.isfinite(values).all(), t.name
        entry = {"name": t.name, "type": t.tensor_type.name, "shape": shape,
                 "crc32": zlib.crc32(np.ascontiguousarray(values).astype("<f4").tobytes())}
        if t.name in GEMMA_DETAIL:
            entry["first16"] = [float(v) for v in values[0, :16]]
            entry["row0_sum"] = math.fsum(float(v) for v in values[0])
        tensors.append(entry)
    doc = {
        "description": "Dequantized Q4_K / Q6_K / Q5_0 tensors of gemma-3-270m-q4_k_m.gguf "
                       "(scripts/fetch_gemma.sh) per gguf.quants.dequantize: CRC-32 of all float32 "
                       "values (little-endian, row-major); first16 = row 0's first 16 values, "
                       "row0_sum = math.fsum of row 0 (tools/make_kquant_fixtures.py).",
        "gguf_package": _gguf_version(),
        "tensor_types": counts,
        "tensors": tensors,
    }
    # One line per tensor keeps the file small and its diffs readable.
    head = json.dumps({k: v for k, v in doc.items() if k != "tensors"}, indent=1)[:-2]
    rows = ",\n  ".join(json.dumps(t) for t in tensors)
    with open(os.path.join(out, "gemma_kquants.json"), "w") as f:
        f.write(head + ',\n "tensors": [\n  ' + rows + "\n ]\n}\n")
    return counts


def _gguf_version():
    from importlib.metadata import version
    return version("gguf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "gguf"))
    ap.add_argument("--gemma", help="gemma-3-270m-q4_k_m.gguf (scripts/fetch_gemma.sh); omit to skip")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"synthetic": {k: list(v) for k, v in write_synthetic(args.out, np.random.default_rng(20250613)).items()}}
    if args.gemma:
        report["gemma_tensor_types"] = write_gemma(args.out, args.gemma)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
