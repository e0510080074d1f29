#!/usr/bin/env python3
"""Summarise an Nsight Compute CSV of one GPU forward run (bench/gpu-profile.sh writes it): per
kernel and launch shape, the launches, the summed and mean device time, the share of the whole and
the DRAM bytes read over the time (GB/s); then the sum per kernel name, and per forward step where
the embedding kernel (once a step) counts the steps.

    bench/gpu_profile.py PROFILE.csv [--title TEXT]

The CSV is `ncu --csv --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum`.
"""
import csv
import sys
from collections import defaultdict


def short(name):
    """A kernel's name without its parameter list (templates kept)."""
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            return name[:i]
    return name


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: gpu_profile.py PROFILE.csv [--title TEXT]")
    title = sys.argv[sys.argv.index("--title") + 1] if "--title" in sys.argv else sys.argv[1]
    launches = {}
    with open(sys.argv[1], newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    head = next((i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Name" in r), None)
    if head is None:
        sys.exit("%s: no ncu CSV header (Kernel Name, Metric Name) found" % sys.argv[1])
    cols = {k: i for i, k in enumerate(rows[head])}
    for r in rows[head + 1:]:
        if len(r) < len(cols):
            continue
        key = r[cols["ID"]]
        e = launches.setdefault(key, {"name": short(r[cols["Kernel Name"]]), "grid": r[cols["Grid Size"]],
                                      "block": r[cols["Block Size"]]})
        try:
            e[r[cols["Metric Name"]]] = float(r[cols["Metric Value"]].replace(",", ""))
        except ValueError:
            pass
    if not launches:
        sys.exit("%s: no kernel launches in the profile" % sys.argv[1])
    by_shape = defaultdict(lambda: [0, 0.0, 0.0])
    by_name = defaultdict(lambda: [0, 0.0, 0.0])
    for e in launches.values():
        ns, rd = e.get("gpu__time_duration.sum", 0.0), e.get("dram__bytes_read.sum", 0.0)
        for agg, k in ((by_shape, (e["name"], e["grid"], e["block"])), (by_name, e["name"])):
            agg[k][0] += 1
            agg[k][1] += ns
            agg[k][2] += rd
    total = sum(v[1] for v in by_name.values())
    steps = max((v[0] for k, v in by_name.items() if "embed" in k), default=0)
    print("== %s: %d launches, %.3f ms of kernel time%s" % (
        title, len(launches), total / 1e6,
        ", %d steps: %.3f ms a step" % (steps, total / 1e6 / steps) if steps else ""))
    print("%-34s %-16s %7s %10s %9s %6s %8s" % ("kernel", "grid", "launches", "total ms", "mean us",
                                                 "share", "GB/s"))
    for (name, grid, block), (n, ns, rd) in sorted(by_shape.items(), key=lambda kv: -kv[1][1])[:24]:
        print("%-34s %-16s %7d %10.3f %9.2f %5.1f%% %8.1f" % (name[:34], grid[:16], n, ns / 1e6, ns / n / 1e3,
                                                            100 * ns / total, rd / ns if ns else 0))
    print("by kernel:")
    for name, (n, ns, rd) in sorted(by_name.items(), key=lambda kv: -kv[1][1]):
        print("  %-40s %7d launches %10.3f ms %5.1f%% %8.1f GB/s" % (name[:40], n, ns / 1e6, 100 * ns / total,
                                                                    rd / ns if ns else 0))


if __name__ == "__main__":
    main()
