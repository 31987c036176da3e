#!/usr/bin/env python3
"""The side-by-side table of bench/peers/llama_cpp.sh: llama-bench's JSON and bench_cpu's JSON
(medians of the repetitions) from one run, as markdown on stdout.

    python3 bench/peers/llama_cpp_table.py OUT_DIR
"""
import json
import os
import sys


def llama_rows(path):
    """{(kind, tokens, depth): (tokens/s, stddev)} from llama-bench -o json."""
    with open(path) as f:
        runs = json.load(f)
    rows = {}
    for r in runs:
        if r.get("n_gen", 0) > 0:
            rows[("decode", r["n_gen"], r.get("n_depth", 0))] = (r["avg_ts"], r["stddev_ts"])
        else:
            rows[("prefill", r["n_prompt"], 0)] = (r["avg_ts"], r["stddev_ts"])
    return rows


def ours(path):
    """{run_name: tokens/s (median)} from bench_cpu --benchmark_out."""
    with open(path) as f:
        doc = json.load(f)
    out = {}
    for b in doc["benchmarks"]:
        if b.get("aggregate_name", "median") == "median" and "tokens_per_s" in b:
            out[b["run_name"]] = b["tokens_per_s"]
    return out


def main():
    out_dir = sys.argv[1]
    llama = llama_rows(os.path.join(out_dir, "llama_bench_decode.json"))
    llama.update(llama_rows(os.path.join(out_dir, "llama_bench_prefill.json")))
    mine = ours(os.path.join(out_dir, "distillcache_bench.json"))
    with open(os.path.join(out_dir, "machine.txt")) as f:
        machine = f.read().strip()

    def fmt(v):
        return "—" if v is None else f"{v:.1f}"

    print("| SmolLM2-135M, 2 threads | llama.cpp (Q4_1 + Q8_0) | distillcache fp32 | bf16 | "
          "GGUF blocks (Q4_1 + Q8_0) | GGUF blocks + bf16 KV | best / llama.cpp |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    cases = [("decode at context 512", ("decode", 32, 512), "512"),
             ("decode at context 2048", ("decode", 32, 2048), "2048"),
             ("decode at context 8192", ("decode", 32, 8192), "8191")]
    for label, key, arg in cases:
        ref = llama.get(key, (None, None))[0]
        f32 = mine.get(f"smollm2_decode/{arg}")
        bf16 = mine.get(f"smollm2_decode_bf16/{arg}")
        gguf = mine.get(f"smollm2_decode_gguf/{arg}")
        kv16 = mine.get(f"smollm2_decode_gguf_kv_bf16/{arg}")
        best = max(v for v in (f32, bf16, gguf, kv16, 0.0) if v is not None)
        ratio = f"{best / ref:.2f}x" if best and ref else "—"
        print(f"| {label} | {fmt(ref)} | {fmt(f32)} | {fmt(bf16)} | {fmt(gguf)} | {fmt(kv16)} | {ratio} |")
    for n in (512, 2048):
        ref = llama.get(("prefill", n, 0), (None, None))[0]
        f32 = mine.get(f"smollm2_prefill/{n}/iterations:1")
        gguf = mine.get(f"smollm2_prefill_gguf/{n}/iterations:1")
        best = max(v for v in (f32, gguf, 0.0) if v is not None)
        ratio = f"{best / ref:.2f}x" if best and ref else "—"
        print(f"| prefill {n} | {fmt(ref)} | {fmt(f32)} | — | {fmt(gguf)} | — | {ratio} |")
    print()
    print("Batched decoding: tokens/s of all S sequences together; a 25 % budget of a 2k (8k) context")
    print("is 512 (2048) cached tokens, the full cache 2048 (8191).")
    print()
    print("| weights, KV cache | cached tokens per sequence | S = 1 | S = 4 | S = 16 | llama.cpp, S = 1, full cache |")
    print("|---|---|---:|---:|---:|---:|")
    for label, name in (("GGUF blocks, bf16", "smollm2_decode_batch_gguf_kv_bf16"),
                        ("bf16, fp32", "smollm2_decode_batch_bf16")):
        for cached, depth in ((512, None), (2048, 2048), (8191, 8192)):
            row = [mine.get(f"{name}/sequences:{s}/cached:{cached}") for s in (1, 4, 16)]
            ref = llama.get(("decode", 32, depth), (None, None))[0] if depth else None
            print(f"| {label} | {cached} | " + " | ".join(fmt(v) for v in row) + f" | {fmt(ref)} |")
    print()
    print("Tokens per second (llama-bench: mean of its repetitions, tg32 after a prompt of the given")
    print("depth; bench_cpu: median of 3, one decode step at the given cache length, 8191 for 8192).")
    print()
    print("```")
    print(machine)
    print("```")


if __name__ == "__main__":
    main()
