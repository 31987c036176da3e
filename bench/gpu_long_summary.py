#!/usr/bin/env python3
"""Summarises bench_cuda_long's JSON: per S, ms per step, tokens/s, achieved HBM bandwidth and its
fraction of the peak for the full cache and 25 %, and the eviction overhead per token
((25%/evict - 25%/once) per step / S), and the phases of one eviction, against the throughput issue's targets (>= 80 % of the peak
at S = 1, <= 20 us of eviction per token).

    python3 bench/gpu_long_summary.py bench_cuda_long.json
"""
import json
import sys


def load_runs(path):
    """The benchmark runs of the JSON; of a file cut short (the benchmark killed by its timeout
    before Google Benchmark closed the array) the runs that were written in full."""
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)["benchmarks"]
    except (json.JSONDecodeError, KeyError):
        runs, decoder = [], json.JSONDecoder()
        start = text.find('"benchmarks"')
        at = text.find("{", start) if start >= 0 else -1
        while at >= 0:
            try:
                run, end = decoder.raw_decode(text, at)
            except json.JSONDecodeError:
                break
            runs.append(run)
            at = text.find("{", end)
        print(f"{path}: incomplete JSON, {len(runs)} complete runs read")
        return runs


def main(path):
    try:
        runs = [b for b in load_runs(path) if b.get("run_type", "iteration") == "iteration"]
    except OSError as e:
        print(f"no benchmark results: {e}")
        return
    by_key = {}
    for b in runs:
        if b.get("error_occurred"):
            print(f"{b['name']}: error: {b.get('error_message')}")
            continue
        if "evict_phases" in b["name"]:
            phases = ", ".join(f"{k[:-3]} {b[k]:.2f} ms" for k in ("gather_ms", "score_ms", "select_ms", "compact_ms"))
            print(f"one eviction, {b['slots_before']:.0f} -> {b['slots_after']:.0f} slots per (layer, KV head): "
                  f"{phases}; {b['per_token_us']:.0f} us per token at chunk {b['chunk']:.0f}; "
                  f"in place on the device {b.get('in_place_ms', float('nan')):.2f} ms, "
                  f"{b.get('in_place_per_token_us', float('nan')):.1f} us per token")
            continue
        # e.g. "mistral7b_32k/25%/evict/S:16/evicting:1/iterations:128/real_time" -> "25%/evict"
        config = b["name"].split("/S:")[0].split("/", 1)[1]
        sequences = int(b["sequences"])
        by_key[(sequences, config)] = b
    print("| S | cache | cached tokens | ms / step | tokens/s | HBM GB/s | of peak | decode evictions |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for (sequences, config), b in sorted(by_key.items()):
        ms = b["real_time"]  # per step; the benchmark reports milliseconds
        print(f"| {sequences} | {config} | {b['cached_tokens']:.0f} | {ms:.2f} | {b['tokens/s']:.1f} | "
              f"{b['HBM_bytes/s'] / 1e9:.0f} | {b['HBM_bytes/s'] / b['peak_HBM_bytes/s']:.1%} | "
              f"{b.get('evictions', 0):.0f} |")
    for sequences in sorted({s for s, _ in by_key}):
        full, once, evict = (by_key.get((sequences, c)) for c in ("full", "25%/once", "25%/evict"))
        if full and evict:
            print(f"S = {sequences}: 25 % with evictions decodes {full['real_time'] / evict['real_time']:.2f}x "
                  f"as fast as the full cache")
        if once and evict:
            per_token_us = (evict["real_time"] - once["real_time"]) * 1e3 / sequences  # ms per step -> us per token
            print(f"S = {sequences}: eviction overhead {per_token_us:.1f} us per token (target <= 20)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench_cuda_long.json")
