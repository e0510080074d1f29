#!/usr/bin/env python3
"""bench/plot_plan.py PLAN.json OUT.png — the plot of a plan `orochi profile` wrote: step time
against verification width per context bucket (left), tokens per step against width per
speculator and category (right; the trees calibrated on one category)."""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    plan = json.load(open(sys.argv[1]))
    ws = plan["widths"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for ctx, ms in plan["curves"]["step_ms"].items():
        a.plot(ws, ms, marker="o", label="context %s" % ctx)
    a.set_xscale("log", base=2)
    a.set_xlabel("verification width W")
    a.set_ylabel("step time t(W), ms")
    a.set_title("target step time, %d threads" % plan["threads"])
    a.legend()
    for kind, sp in plan["curves"]["speculators"].items():
        for cat, tok in sp["tokens_per_step_by_category"].items():
            calib = cat == plan["calibrated_on"]
            b.plot(ws, [1.0] + tok[1:], marker="o" if calib else ".", lw=2 if calib else 1,
                   label="%s / %s%s" % (kind, cat, " (calibration)" if calib else ""))
    b.set_xscale("log", base=2)
    b.set_xlabel("verification width W")
    b.set_ylabel("tokens per step")
    b.set_title("acceptance by width")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
