#!/usr/bin/env python3
"""Summarise an Nsight Compute CSV of one GPU forward run (bench/gpu-profile.sh writes it): per
kernel and launch shape, the launches, the summed and mean device time, the share of the whole and
the DRAM bytes read over the time (GB/s), and, where the CSV has them, what bounds the kernel (the
time-weighted mean over its launches: the registers a thread, then % of the peak: achieved
occupancy, issue slots, L1, L2 and DRAM throughput; a latency-bound kernel is low in all); then the sum per kernel name, and per
forward step where the embedding kernel (once a step) counts the steps; and, where the CSV has the
warp stall metrics (smsp__average_warps_issue_stalled_REASON_per_issue_active.ratio, any reasons),
per kernel name the warps that waited for each reason per instruction issued (time-weighted), the
largest first: what a kernel low in every bound waits on (long_scoreboard: its loads from
memory; barrier: __syncthreads; wait: fixed latencies between dependent instructions;
math_pipe_throttle: a busy unit, which is an issue bound).

    bench/gpu_profile.py PROFILE.csv [--title TEXT]

The CSV is `ncu --csv --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum`
with, optionally, the metrics of BOUNDS (bench/gpu-profile.sh asks for them all).
"""
import csv
import re
import sys
from collections import defaultdict


# what bounds a kernel: (column, ncu metric), each a % of its peak but the registers a thread
# (which, times the block's threads, cap the blocks a multiprocessor holds)
BOUNDS = (
    ("regs", "launch__registers_per_thread"),
    ("occ%", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("issue%", "sm__inst_issued.avg.pct_of_peak_sustained_active"),
    ("L1%", "l1tex__throughput.avg.pct_of_peak_sustained_active"),
    ("L2%", "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("DRAM%", "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
)


# a warp stall metric: the warps that waited for REASON per instruction issued
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
STALLS_SHOWN = 4


def stall_lines(launches, names):
    """Per kernel name of `names` (in their order), its stall reasons' time-weighted means, largest
    first (the first STALLS_SHOWN); none without stall metrics."""
    wsum = defaultdict(lambda: defaultdict(float))  # name: reason: mean times ns
    wns = defaultdict(lambda: defaultdict(float))   # name: reason: the ns it covers
    for e in launches.values():
        ns = e.get("gpu__time_duration.sum", 0.0)
        for m, x in e.items():
            st = STALL.match(m) if isinstance(x, float) else None
            if st:
                wsum[e["name"]][st.group(1)] += x * ns
                wns[e["name"]][st.group(1)] += ns
    lines = []
    for name in names:
        mean = {r: wsum[name][r] / wns[name][r] for r in wsum[name] if wns[name][r]}
        if not mean:
            continue
        top = sorted(mean.items(), key=lambda kv: -kv[1])[:STALLS_SHOWN]
        lines.append("  %-40s %s" % (name[:40], "  ".join("%s %.2f" % kv for kv in top)))
    return lines


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
    bounds = [(col, m) for col, m in BOUNDS if any(m in e for e in launches.values())]
    # per key: launches, ns, bytes read, then each bound's ns-weighted sum and the ns it covers
    by_shape = defaultdict(lambda: [0, 0.0, 0.0] + [0.0] * (2 * len(bounds)))
    by_name = defaultdict(lambda: [0, 0.0, 0.0] + [0.0] * (2 * len(bounds)))
    for e in launches.values():
        ns, rd = e.get("gpu__time_duration.sum", 0.0), e.get("dram__bytes_read.sum", 0.0)
        for agg, k in ((by_shape, (e["name"], e["grid"], e["block"])), (by_name, e["name"])):
            v = agg[k]
            v[0] += 1
            v[1] += ns
            v[2] += rd
            for i, (_, m) in enumerate(bounds):
                if m in e:
                    v[3 + 2 * i] += e[m] * ns
                    v[4 + 2 * i] += ns

    def bound_cols(v):
        return "".join(" %6s" % ("%.0f" % (v[3 + 2 * i] / v[4 + 2 * i]) if v[4 + 2 * i] else "-")
                       for i in range(len(bounds)))

    heads = "".join(" %6s" % col for col, _ in bounds)
    total = sum(v[1] for v in by_name.values())
    steps = max((v[0] for k, v in by_name.items() if "embed" in k), default=0)
    print("== %s: %d launches, %.3f ms of kernel time%s" % (
        title, len(launches), total / 1e6,
        ", %d steps: %.3f ms a step" % (steps, total / 1e6 / steps) if steps else ""))
    print("%-34s %-16s %7s %10s %9s %6s %8s%s" % ("kernel", "grid", "launches", "total ms", "mean us",
                                                   "share", "GB/s", heads))
    for (name, grid, block), v in sorted(by_shape.items(), key=lambda kv: -kv[1][1])[:24]:
        n, ns, rd = v[:3]
        print("%-34s %-16s %7d %10.3f %9.2f %5.1f%% %8.1f%s" % (
            name[:34], grid[:16], n, ns / 1e6, ns / n / 1e3, 100 * ns / total, rd / ns if ns else 0,
            bound_cols(v)))
    print("by kernel:")
    names = sorted(by_name, key=lambda k: -by_name[k][1])  # the longest first
    for name in names:
        v = by_name[name]
        n, ns, rd = v[:3]
        print("  %-40s %7d launches %10.3f ms %5.1f%% %8.1f GB/s%s" % (
            name[:40], n, ns / 1e6, 100 * ns / total, rd / ns if ns else 0, bound_cols(v)))
    stalls = stall_lines(launches, names)
    if stalls:
        print("warps stalled per instruction issued, by reason (the largest %d):" % STALLS_SHOWN)
        print("\n".join(stalls))


if __name__ == "__main__":
    main()
