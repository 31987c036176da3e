#!/usr/bin/env python3
"""Summarises an Nsight Compute CSV (`ncu --csv --page raw --metrics gpu__time_duration.sum,
dram__bytes_read.sum,dram__bytes_write.sum`) of one decode step: per kernel (name up to its
template arguments), how many launches, their device time, its share of the step's kernel time,
and the DRAM bytes they moved per second of it. Kernels of the same name are summed.

    python3 bench/ncu_summary.py ncu_full_S1.csv [step_ms]

With step_ms (the step's wall time, from the benchmark), the gap between it and the kernels' sum is
printed too: launch latency and host work the GPU waited for.
"""
import csv
import sys

UNITS = {"ns": 1e-9, "nsecond": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0, "s": 1.0,
         "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1.0}


def short_name(name):
    for cut in ("<", "("):
        if cut in name:
            name = name[: name.index(cut)]
    return name.replace("void ", "").replace("dc::cuda_detail::", "").strip()


def read(path):
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not quoted
    rows = list(csv.reader(lines))
    if not rows:
        return []
    header, kernels, units = rows[0], [], {}
    for row in rows[1:]:
        record = dict(zip(header, row))
        if not record.get("ID", "").strip():  # the units row
            units = record
            continue
        kernels.append(record)
    def value(record, metric):
        text = record.get(metric, "").replace(",", "")
        try:
            return float(text) * UNITS.get(units.get(metric, "").strip(), 1.0)
        except ValueError:
            return 0.0
    return [(short_name(k.get("Kernel Name", "?")), value(k, "gpu__time_duration.sum"),
             value(k, "dram__bytes_read.sum") + value(k, "dram__bytes_write.sum")) for k in kernels]


def main(path, step_ms=None):
    kernels = read(path)
    if not kernels:
        print(f"{path}: no kernels profiled")
        return
    total = sum(t for _, t, _ in kernels)
    by_name = {}
    for name, t, b in kernels:
        entry = by_name.setdefault(name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += t
        entry[2] += b
    print(f"{path}: {len(kernels)} kernels, {total * 1e3:.3f} ms of device time")
    print("| kernel | launches | ms | share | DRAM GB/s |")
    print("|---|---:|---:|---:|---:|")
    for name, (count, t, b) in sorted(by_name.items(), key=lambda item: -item[1][1]):
        print(f"| {name} | {count} | {t * 1e3:.3f} | {t / total:.1%} | {b / t / 1e9 if t > 0 else 0:.0f} |")
    if step_ms:
        print(f"step {step_ms:.3f} ms, kernels {total * 1e3:.3f} ms: {step_ms - total * 1e3:.3f} ms outside kernels")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else None)
