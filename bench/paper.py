#!/usr/bin/env python3
"""bench/paper.py — the three papers' tables and figures, measured on this machine with orochi.

    /usr/bin/python3 bench/paper.py [--quick] [--heads H.gguf] [--sections S,...]
        [--bin-dir build/bin] [--model M.gguf] [--prompts bench/prompts.jsonl]
        [--threads T] [--rounds R] [-n TOKENS] [--per-category N] [--calibrate CAT]
        [--json bench/results/paper.jsonl] [--img-dir docs/img] [--doc docs/paper-parity.md]

Each section mirrors one published table or figure (docs/paper-parity.md puts them side by side
with the published numbers):

  table1   Ghidorah Table I: acceptance length (tokens per verification step, the target's own
           token included) against verification width, per prompt category, with trees
           calibrated on one category (--calibrate, default chat: the mixed, MT-bench-like one)
           and applied to all; for the Medusa heads (--heads) and every other speculator kind.
           From `orochi profile`: exact for greedy decoding (rank paths on the target's own
           continuations), no timing involved.
  fig9     Ghidorah Fig. 9: decode speed against width, normalised to sequential decoding. A CPU
           group (2 workers) with the Medusa heads verifies the profile's calibrated tree of each
           width (a plan per width, guard off, so the width is what is measured), beside the
           same group without speculators; the profile's predicted speed-up is printed too.
           The HCMP (CPU + GPU) column needs a lent GPU and is left out here.
  fig10b   Ghidorah Fig. 10(b): tree attention, naive sparse vs the engine's sparse kernels vs
           treating the tree as dense (`orochi bench --tree-attention`).
  llmcad   LLMCad's ablation with the layerskip drafter: chain vs tree, the self-adaptive
           fallback (alpha) on vs off, speculative generation (drafting during verification)
           on vs off.
  minions  Minions: one speculator vs weighted-majority vote vs union (ngram + layerskip),
           adaptive speculation length on vs off, pipeline (drafting ahead) on vs off, and
           throughput against concurrent requests.

Speeds are decode tokens/s through a real process group (the prompt excluded: the time of a
1-token request is subtracted), as a ratio to the group without speculators measured in the same
round; configurations are interleaved round by round and every greedy output is compared token
for token with `orochi run --temp 0` (a mismatch is printed and makes the exit status 1).
The load average is recorded beside every measurement.

Output: a markdown table per section (stdout, and into docs/paper-parity.md between the markers
`<!-- paper:NAME -->` and `<!-- /paper:NAME -->`), JSON lines (--json), and plots
(docs/img/paper-NAME.png, matplotlib). --quick (one prompt per category, 64 tokens, widths up to
16 for the group runs; 3 rounds as always) regenerates everything in about 10 minutes.

The group sections measure the techniques while speculating (SPECULATE below: every step waits
for the drafts, guard off); with the defaults the controllers would switch off the drafters that
do not pay here, and every row would decode plainly.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import spec_bench as sb  # noqa: E402

SECTIONS = ["table1", "fig9", "fig10b", "llmcad", "minions"]

# The ablations measure the techniques while speculating: every step waits for the drafts (up to
# 300 ms) and the guard is off. With the defaults (measured draft wait, guard on) the coordinator
# stops waiting for, or feeding, drafters that do not pay on this machine, and every configuration
# then decodes plainly at about the same speed, which would say nothing about the techniques.
SPECULATE = ["--guard", "off", "--draft-wait", "fixed", "--draft-wait-ms", "300"]

# published numbers, for the side-by-side tables (docs/paper-parity.md explains their setups)
GHIDORAH_TABLE1 = {  # Vicuna-7B + Medusa heads (5), trees calibrated on MT-bench
    "widths": [1, 2, 4, 8, 16, 32, 64],
    "MT-bench": [1, 1.72, 2.28, 2.59, 2.93, 3.19, 3.34],
    "GSM8K": [1, 1.76, 2.43, 2.69, 3.08, 3.34, 3.56],
    "MBPP": [1, 1.78, 2.54, 2.89, 3.27, 3.55, 3.74],
    "Human-eval": [1, 1.77, 2.49, 2.80, 3.19, 3.48, 3.71],
}


def log(msg):
    print("paper: " + msg, file=sys.stderr, flush=True)


def loadavg():
    return round(os.getloadavg()[0], 2)


class Run:
    """Common state: options, prompts, the sequential reference ids, the JSON output."""

    def __init__(self, a):
        self.a = a
        self.orochi = os.path.join(a.bin_dir, "orochi")
        self.prompts = sb.load_prompts(a.prompts, a.per_category)
        self.cats = sorted({p["category"] for p in self.prompts})
        self.out = open(a.json, "a")
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.ok = True
        self.base = None
        self.work = os.path.join(a.work_dir)
        os.makedirs(self.work, exist_ok=True)
        self.docs = {}

    def emit(self, row):
        row = dict(row, run=self.started)
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()

    def reference(self):
        """orochi run --temp 0 ids for every prompt (computed once)."""
        if self.base is None:
            log("reference outputs: orochi run --chat --temp 0, %d prompts" % len(self.prompts))
            self.base = {}
            for p in self.prompts:
                ids, _, _ = sb.sequential(self.a.bin_dir, self.a.model, p["prompt"], self.a.max_tokens,
                                          self.a.threads)
                self.base[p["id"]] = ids
        return self.base


# ===== group measurements =====

def measure_group(run, label, specs, coord_flags):
    """Decode tok/s and tokens per step per prompt through a group; checks losslessness."""
    base = run.reference()
    a = run.a
    g = sb.Group(a.bin_dir, a.model, os.path.join(run.work, "group"), 2, max(1, a.threads // 2), specs, [],
                 ["--"] + coord_flags if coord_flags else [])
    rows = []
    try:
        g.chat(sb.WARM_PROMPT, 16)
        for p in run.prompts:
            o, tps, dt = sb.group_decode(g, p["prompt"], a.max_tokens)
            ids = o["token_ids"]
            same = ids == base[p["id"]][: len(ids)]
            if not same:
                run.ok = False
                print("MISMATCH %s %s: the group's output differs from orochi run" % (label, p["id"]))
            rows.append({"category": p["category"], "id": p["id"], "tok_s": tps, "tokens": len(ids),
                         "tok_step": o.get("mean_accepted", 1.0), "lossless": same, "loadavg": loadavg()})
    finally:
        g.down()
    return rows


def by_category(rows, key):
    out = {}
    for c in sorted({r["category"] for r in rows}):
        v = [r[key] for r in rows if r["category"] == c]
        out[c] = sum(v) / len(v)
    v = [r[key] for r in rows]
    out["all"] = sum(v) / len(v)
    return out


def rounds_of(run, configs):
    """configs: [(label, specs, coord_flags)], plus the baseline 'none'; interleaved rounds.
    Returns {label: {"speedup": {cat: median}, "tok_step": {cat: mean}, "tok_s": {cat: median}}}."""
    res = {label: [] for label, _, _ in configs}
    base_rounds = []
    for r in range(run.a.rounds):
        order = [("none", [], [])] + list(configs)
        if r % 2:
            order = order[::-1]
        per = {}
        for label, specs, flags in order:
            log("round %d/%d: %s" % (r + 1, run.a.rounds, label))
            per[label] = measure_group(run, label, specs, flags)
        base = by_category(per["none"], "tok_s")
        base_rounds.append(base)
        for label, _, _ in configs:
            tps = by_category(per[label], "tok_s")
            res[label].append({"tok_s": tps, "speedup": {c: tps[c] / base[c] for c in tps},
                               "tok_step": by_category(per[label], "tok_step"),
                               "load": max(x["loadavg"] for x in per[label])})
            run.emit({"bench": "paper", "label": label, "round": r, "tok_s": tps, "base_tok_s": base,
                      "tok_step": by_category(per[label], "tok_step"), "loadavg": res[label][-1]["load"]})

    def med(v):
        v = sorted(v)
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    out = {}
    for label in res:
        cats = res[label][0]["speedup"].keys()
        out[label] = {k: {c: med([x[k][c] for x in res[label]]) for c in cats}
                      for k in ("speedup", "tok_step", "tok_s")}
        out[label]["load"] = max(x["load"] for x in res[label])
    cats = base_rounds[0].keys()
    out["none"] = {"tok_s": {c: med([b[c] for b in base_rounds]) for c in cats}}
    return out


def speed_table(run, res, labels, title):
    cats = run.cats + ["all"]
    lines = ["%s (decode speed over the group without speculators, median of %d round(s); tokens "
             "per step in brackets; max load average %.2f)" % (title, run.a.rounds,
                                                               max(res[l]["load"] for l in labels)),
             "", "| configuration | " + " | ".join(cats) + " |",
             "| --- | " + " | ".join("---" for _ in cats) + " |"]
    lines.append("| no speculators (tok/s) | " + " | ".join("%.1f" % res["none"]["tok_s"][c] for c in cats) + " |")
    for l in labels:
        lines.append("| %s | " % l + " | ".join("%.2f× (%.2f)" % (res[l]["speedup"][c], res[l]["tok_step"][c])
                                               for c in cats) + " |")
    return "\n".join(lines)


# ===== sections =====

def profile(run, widths, specs, tag):
    a = run.a
    out = os.path.join(run.work, "plan-%s.json" % tag)
    # the profile is cheap (no timing in the acceptance part): every prompt of the file, 96 tokens,
    # candidates up to rank 10 (Medusa's best trees are wide at depth 1), whatever --quick says
    cmd = [run.orochi, "profile", "--model", a.model, "--threads", str(a.threads), "--widths",
           ",".join(map(str, widths)), "--ctx", "256", "--calibrate", a.calibrate, "--per-category",
           "1000", "-n", "96", "--ranks", "10", "--prompts", a.prompts, "--out", out]
    for s in specs:
        cmd += ["--speculator", s]
    log(" ".join(cmd))
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.load(open(out)), out


def spec_kinds(run):
    kinds = []
    if run.a.heads:
        kinds.append("medusa:heads=" + run.a.heads)
    kinds += ["ngram", "layerskip"]
    return kinds


def section_table1(run):
    widths = [1, 2, 4, 8, 16, 32, 64]
    plan, _ = profile(run, widths, spec_kinds(run), "table1")
    sp = plan["curves"]["speculators"]
    lines = ["Acceptance length (tokens per verification step) against verification width; trees "
             "calibrated on '%s', applied to every category (`orochi profile`, every prompt of the "
             "file, 96 greedy tokens each, candidates up to rank 10):" % plan["calibrated_on"],
             "", "| speculator | category | " + " | ".join("W=%d" % w for w in widths) + " |",
             "| --- | --- | " + " | ".join("---" for _ in widths) + " |"]
    for kind, x in sp.items():
        for c, v in x["tokens_per_step_by_category"].items():
            cal = " (calibration)" if c == plan["calibrated_on"] else ""
            lines.append("| %s | %s%s | " % (kind, c, cal) + " | ".join(
                "%.2f" % (t if w > 1 else 1.0) for w, t in zip(widths, v)) + " |")
            run.emit({"bench": "paper-table1", "speculator": kind, "category": c, "widths": widths,
                      "tokens_per_step": v, "calibrated_on": plan["calibrated_on"]})
    lines += ["", "Published (Ghidorah Table I, Vicuna-7B with Medusa heads, calibrated on MT-bench):", "",
              "| dataset | " + " | ".join("W=%d" % w for w in GHIDORAH_TABLE1["widths"]) + " |",
              "| --- | " + " | ".join("---" for _ in GHIDORAH_TABLE1["widths"]) + " |"]
    for k in ("MT-bench", "GSM8K", "MBPP", "Human-eval"):
        lines.append("| %s | " % k + " | ".join("%.2f" % v for v in GHIDORAH_TABLE1[k]) + " |")
    plot_table1(run, widths, sp, plan["calibrated_on"])
    return "\n".join(lines), plan


def tree_depth(tree):
    """The depth of a plan tree [[parent, rank], ...] (node i + 1 below node parent, 0 the root)."""
    dep = [0]
    for parent, _ in tree:
        dep.append(dep[parent] + 1)
    return max(dep)


def section_fig9(run, plan_t1):
    a = run.a
    if not a.heads:
        return "(no --heads: the Medusa runs of this figure were skipped)"
    widths = [2, 4, 8, 16] if a.quick else [2, 4, 8, 16, 32, 64]
    allw = plan_t1["widths"]
    med = next(x for k, x in plan_t1["curves"]["speculators"].items() if k == "medusa")
    step = plan_t1["curves"]["step_ms"]["256"]
    t1 = step[allw.index(1)]
    configs = []
    for w in widths:
        tree = med["trees"][allw.index(w)]
        depth = tree_depth(tree)
        pf = os.path.join(run.work, "plan-fig9-w%d.json" % w)
        json.dump({"orochi_plan": 1, "target": a.model, "threads": a.threads, "calibrated_on": plan_t1["calibrated_on"],
                   "buckets": [{"ctx": 1 << 20, "width": w, "length": depth, "speculate": True,
                                "speculator": "medusa", "tree": tree}]}, open(pf, "w"))
        tmpl = "-".join(["4"] * max(1, depth))
        configs.append(("medusa W=%d" % w, ["medusa:heads=%s,template=%s" % (a.heads, tmpl)],
                        ["--plan", pf, "--adaptive", "off", "--max-width", "64",
                         "--max-draft", str(max(depth, 1))] + SPECULATE))
    res = rounds_of(run, configs)
    lines = [speed_table(run, res, [c[0] for c in configs],
                         "Decode speed against verification width, Medusa heads, CPU only (the calibrated tree of each "
                         "width, every step waits for the heads' draft, guard and adaptive length off)"), "",
             "Predicted by the profile (tokens per step at the calibration category / (t(W) + depth x "
             "head time), over 1 / t(1)):", "", "| width | t(W) ms | tokens per step | predicted × |",
             "| --- | --- | --- | --- |"]
    pred = {}
    for w in widths:
        i = allw.index(w)
        cost = step[i] + tree_depth(med["trees"][i]) * med["draft_ms"][0]
        pred[w] = med["tokens_per_step"][i] / cost * t1
        lines.append("| %d | %.2f | %.2f | %.2f |" % (w, step[i], med["tokens_per_step"][i], pred[w]))
    run.emit({"bench": "paper-fig9-predicted", "widths": widths, "predicted": [pred[w] for w in widths]})
    plot_fig9(run, widths, res, pred)
    return "\n".join(lines)


def section_fig10b(run):
    js = os.path.join(run.work, "tree_attention.jsonl")
    if os.path.exists(js):
        os.remove(js)
    reps = "30" if run.a.quick else "200"
    cmd = [run.orochi, "bench", "--tree-attention", "--widths", "4,8,16,32,64", "--reps", reps, "--json", js]
    log(" ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        run.ok = False
        return "`orochi bench --tree-attention` failed: %s" % (p.stderr.strip() or p.stdout.strip())
    rows = [json.loads(l) for l in open(js) if l.strip()]
    for r in rows:
        run.emit(dict(r, bench="paper-fig10b"))
    strategies = []
    for r in rows:
        if r["strategy"] not in strategies:
            strategies.append(r["strategy"])
    widths = sorted({r["width"] for r in rows})
    us = {(r["width"], r["strategy"]): r["us"] for r in rows}
    lines = ["Tree attention over the token tree only, one thread, µs per verification (all nodes, "
             "all %d heads; load average %.2f):" % (rows[0].get("heads", 0), rows[0].get("loadavg", 0)), "",
             "| width | " + " | ".join(strategies) + " |", "| --- | " + " | ".join("---" for _ in strategies) + " |"]
    for w in widths:
        lines.append("| %d | " % w + " | ".join("%.1f" % us.get((w, s), float("nan")) for s in strategies) + " |")
    lines += ["", "Full output of the command:", "", "```", p.stdout.strip(), "```"]
    plot_fig10b(run, widths, strategies, us)
    return "\n".join(lines)


def section_llmcad(run):
    ls = "layerskip"
    configs = [
        ("chain (no tree)", [ls + ":work-ahead=0"], ["--tree", "off"] + SPECULATE),
        ("tree", [ls + ":work-ahead=0"], SPECULATE),
        ("tree, fallback off", [ls + ":work-ahead=0,alpha=off"], SPECULATE),
        ("tree + speculative generation", [ls + ":work-ahead=1"], SPECULATE),
    ]
    res = rounds_of(run, configs)
    plot_bars(run, "llmcad", res, [c[0] for c in configs], "LLMCad ablation (layerskip drafter)")
    return speed_table(run, res, [c[0] for c in configs], "LLMCad's techniques, layerskip drafter (every step waits for the draft, guard off)")


def section_minions(run):
    both = ["layerskip:work-ahead=0", "ngram"]
    configs = [
        ("ngram alone", ["ngram"], SPECULATE),
        ("layerskip alone", ["layerskip:work-ahead=0"], SPECULATE),
        ("majority vote", both, ["--vote", "majority"] + SPECULATE),
        ("union", both, ["--vote", "union"] + SPECULATE),
        ("majority, fixed length", both, ["--vote", "majority", "--adaptive", "off"] + SPECULATE),
        ("majority + pipeline", ["layerskip:work-ahead=1", "ngram"], ["--vote", "majority"] + SPECULATE),
    ]
    res = rounds_of(run, configs)
    text = speed_table(run, res, [c[0] for c in configs], "Minions' techniques, ngram + layerskip (every step waits for the drafts, guard off)")
    plot_bars(run, "minions", res, [c[0] for c in configs], "Minions ablation (ngram + layerskip)")
    return text + "\n\n" + concurrency(run)


def concurrency(run):
    a = run.a
    levels = [1, 2, 4, 8]
    g = sb.Group(a.bin_dir, a.model, os.path.join(run.work, "group-conc"), 2, max(1, a.threads // 2), ["ngram"], [],
                 ["--", "--max-batch", "8"])
    jobs = [run.prompts[i % len(run.prompts)] for i in range(8)]
    rows = []
    try:
        g.chat(sb.WARM_PROMPT, 16)
        one = None
        for n in levels:
            res, wall = sb.in_waves(g, jobs, n, a.max_tokens)
            toks = sum(len(r[0]["orochi"]["token_ids"]) for r in res)
            acc = sum(r[0]["orochi"]["mean_accepted"] for r in res) / len(res)
            one = one or toks / wall
            rows.append((n, toks / wall, toks / wall / one, acc, loadavg()))
            run.emit({"bench": "paper-concurrency", "requests": n, "tok_s": toks / wall, "x_one": toks / wall / one,
                      "mean_accepted": acc, "loadavg": rows[-1][-1]})
    finally:
        g.down()
    lines = ["Throughput against requests in flight (ngram, the same 8 requests in waves of N, prompt "
             "processing included):", "", "| requests at once | tok/s | × one at a time | mean tokens per step | load |",
             "| --- | --- | --- | --- | --- |"]
    lines += ["| %d | %.1f | %.2f | %.2f | %.2f |" % r for r in rows]
    return "\n".join(lines)


# ===== plots =====

def plt_or_none():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except Exception as e:  # noqa: BLE001
        log("no plots: matplotlib is not importable (%s)" % e)
        return None


def img(run, name):
    os.makedirs(run.a.img_dir, exist_ok=True)
    return os.path.join(run.a.img_dir, "paper-%s.png" % name)


def finish(run, fig, ax, name, xlabel, ylabel, legend=8, logx=True):
    """The common end of every plot: axes, legend, file."""
    if logx:
        ax.set_xscale("log", base=2)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=legend)
    fig.tight_layout()
    fig.savefig(img(run, name), dpi=110)
    plt_or_none().close(fig)


def plot_table1(run, widths, sp, calib):
    plt = plt_or_none()
    if not plt:
        return
    fig, axes = plt.subplots(1, len(sp) + 1, figsize=(4 * (len(sp) + 1), 3.4), sharey=True)
    for ax, (kind, x) in zip(axes, sp.items()):
        for c, v in x["tokens_per_step_by_category"].items():
            ax.plot(widths, [t if w > 1 else 1 for w, t in zip(widths, v)], marker="o",
                    label=c + (" (calib.)" if c == calib else ""))
        ax.set_xscale("log", base=2)
        ax.set_title("orochi: " + kind)
        ax.set_xlabel("verification width")
        ax.legend(fontsize=7)
    ax = axes[-1]
    for k in ("MT-bench", "GSM8K", "MBPP", "Human-eval"):
        ax.plot(GHIDORAH_TABLE1["widths"], GHIDORAH_TABLE1[k], marker="s", linestyle="--", label=k)
    ax.set_title("Ghidorah Table I (Vicuna-7B)")
    axes[0].set_ylabel("tokens per step")
    finish(run, fig, ax, "table1", "verification width", "", legend=7)


def plot_fig9(run, widths, res, pred):
    plt = plt_or_none()
    if not plt:
        return
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.axhline(1.0, color="gray", label="sequential (group, no speculators)")
    ax.plot(widths, [res["medusa W=%d" % w]["speedup"]["all"] for w in widths], marker="o",
            label="Medusa, CPU only (measured)")
    ax.plot(widths, [pred[w] for w in widths], marker="x", linestyle="--", label="Medusa, CPU only (profile)")
    finish(run, fig, ax, "fig9", "verification width", "decode speed / sequential")


def plot_fig10b(run, widths, strategies, us):
    plt = plt_or_none()
    if not plt:
        return
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for s in strategies:
        ax.plot(widths, [us.get((w, s)) for w in widths], marker="o", label=s)
    ax.set_yscale("log")
    finish(run, fig, ax, "fig10b", "tree width (nodes)", "µs per verification (1 thread)")


def plot_bars(run, name, res, labels, title):
    plt = plt_or_none()
    if not plt:
        return
    cats = run.cats + ["all"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    wbar = 0.8 / len(labels)
    for i, l in enumerate(labels):
        ax.bar([j + i * wbar for j in range(len(cats))], [res[l]["speedup"][c] for c in cats], wbar, label=l)
    ax.axhline(1.0, color="gray")
    ax.set_xticks([j + 0.4 - wbar / 2 for j in range(len(cats))])
    ax.set_xticklabels(cats)
    ax.set_title(title)
    finish(run, fig, ax, name, None, "decode speed / no speculators", legend=7, logx=False)


# ===== the document =====

def write_doc(path, blocks):
    """Replace each <!-- paper:NAME --> ... <!-- /paper:NAME --> block's body in the document."""
    if not os.path.exists(path):
        log("%s is absent: the tables are only printed" % path)
        return
    text = open(path).read()
    for name, body in blocks.items():
        pat = re.compile(r"(<!-- paper:%s -->\n).*?(<!-- /paper:%s -->)" % (name, name), re.S)
        if not pat.search(text):
            log("%s has no <!-- paper:%s --> block: that table is only printed" % (path, name))
            continue
        text = pat.sub(lambda m: m.group(1) + body.rstrip() + "\n" + m.group(2), text)
    open(path, "w").write(text)
    log("updated %s" % path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 prompt per category, 64 tokens, group widths to 16")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--heads", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.medusa.gguf"),
                    help="Medusa heads (make medusa-heads); absent: the Medusa rows are skipped")
    ap.add_argument("--prompts", default=os.path.join(ROOT, "bench", "prompts.jsonl"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("-n", "--max-tokens", type=int, default=0)
    ap.add_argument("--per-category", type=int, default=0)
    ap.add_argument("--calibrate", default="chat")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "paper.jsonl"))
    ap.add_argument("--img-dir", default=os.path.join(ROOT, "docs", "img"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "paper-parity.md"))
    ap.add_argument("--work-dir", default="/tmp/orochi-paper")
    a = ap.parse_args()
    a.rounds = a.rounds or 3
    a.max_tokens = a.max_tokens or (64 if a.quick else 96)
    a.per_category = a.per_category or (1 if a.quick else 3)
    sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        print("paper.py: unknown section(s) %s (have: %s)" % (",".join(bad), ",".join(SECTIONS)), file=sys.stderr)
        return 2
    for f, what in ((a.model, "model"), (a.prompts, "prompt file"), (os.path.join(a.bin_dir, "orochi"), "orochi binary")):
        if not os.path.exists(f):
            print("paper.py: the %s %s is absent" % (what, f), file=sys.stderr)
            return 2
    if a.heads and not os.path.exists(a.heads):
        log("no Medusa heads at %s (make medusa-heads): Medusa rows skipped" % a.heads)
        a.heads = ""
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    run = Run(a)
    t0 = time.time()
    blocks = {}
    plan_t1 = None
    for s in sections:
        log("section %s (%.0f s so far, load average %.2f)" % (s, time.time() - t0, loadavg()))
        if s == "table1":
            blocks[s], plan_t1 = section_table1(run)
        elif s == "fig9":
            if plan_t1 is None:
                plan_t1, _ = profile(run, [1, 2, 4, 8, 16, 32, 64], spec_kinds(run), "table1")
            blocks[s] = section_fig9(run, plan_t1)
        elif s == "fig10b":
            blocks[s] = section_fig10b(run)
        elif s == "llmcad":
            blocks[s] = section_llmcad(run)
        elif s == "minions":
            blocks[s] = section_minions(run)
        stamp = "_%s, `bench/paper.py%s`, %s UTC, %.0f s in; load average %.2f_" % (
            s, " --quick" if a.quick else "", time.strftime("%Y-%m-%d %H:%M", time.gmtime()), time.time() - t0, loadavg())
        blocks[s] = stamp + "\n\n" + blocks[s]
        print("\n## %s\n\n%s\n" % (s, blocks[s]), flush=True)
    write_doc(a.doc, blocks)
    log("done in %.0f s%s" % (time.time() - t0, "" if run.ok else " -- SOME OUTPUTS WERE NOT LOSSLESS"))
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
