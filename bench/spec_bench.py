#!/usr/bin/env python3
"""bench/spec_bench.py — speculative decoding through a real process group, against sequential.

For each configuration (a group of CPU workers with some speculators, started with
deploy/orochi-launch) it sends every prompt of a prompt file as a greedy chat completion and
records tokens/s, mean tokens accepted per verification step and the draft kinds used. In the
same run it measures the sequential baseline, `orochi run --chat --temp 0 --threads T` in one
process, so the speedup column compares like with like. Every speculative output is checked
token for token against the sequential output (a mismatch is reported loudly and makes the exit
status 1): speculation must be lossless.

Modes:
  --demo            the `make demo` job: the same few prompts on two warm groups of 2 workers x 1
                    thread, one with layerskip + ngram and one without speculators, the generated
                    text printed, then per category the speedup of the first over the second
                    beside its tokens per step (which bound it)
  (default)         the configurations of --configs over the whole prompt file, a table per
                    category, JSON lines to --json; per --rounds round all the configurations'
                    groups are up at once and each prompt runs on each of them back to back
                    (rotating the order), so a ratio between two groups compares figures taken
                    seconds apart

Configurations are named: seq-group (2 workers, no speculator: the process-split overhead),
ngram, layerskip, both (layerskip + ngram), model (--draft FILE), replay (the `replay` speculator
fed the sequential baseline's own answers, prompt ids and all: a perfect drafter, so its speedup is
what speculation can give this group at most; with --extra "--max-draft D").

  --sweep-width 1,2,4,...   acceptance length vs verification width, per category and draft kind
                            (like Ghidorah's Table I): one group per (kind, width)
  --ablation                chain -> tree -> +vote -> +adaptive -> +pipeline with layerskip+ngram,
                            speedup over sequential per category, all checked lossless
  --repeat N        fresh groups N times (each round starts every configuration's group anew, and
                    seq-group, the same group without speculators, is added): per configuration
                    the min / median / max of its speedup over seq-group, and how many runs reached
                    1.0x, so that one lucky run does not stand for the product. --draft FILE adds
                    the `model` configuration (a separate draft model). A second group without
                    speculators, seq-group-2, runs beside them (--no-noise leaves it out): its
                    ratios are the host's noise between two identical groups, the band within
                    which a configuration is not told apart from plain decoding.
  --concurrency 1,2,4,8     throughput with N requests in flight at once (batched verification):
                            the same requests at every level; --concurrency-mode closed (default)
                            keeps N in flight while any of --concurrency-jobs (default 3 x the
                            largest level) is left, waves sends N at a time and waits for the
                            longest of each; the group's speculators: --concurrency-spec ngram
                            (default; none: no speculator; replay: a perfect drafter, the
                            sequential answers); --rounds R repeats the levels
                            interleaved, medians of the per-round ratios to one request
"""
import argparse
import json
import statistics
import threading
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "deploy", "orochi-launch")

CONFIGS = {
    "seq-group": [],
    "seq-group-2": [],  # --repeat: a second group without speculators (the noise between two)
    "ngram": ["ngram"],
    "layerskip": ["layerskip"],
    "both": ["layerskip", "ngram"],
    "model": ["model:draft=%DRAFT%"],  # --draft FILE: a separate draft model
    "replay": ["replay:corpus=%CORPUS%"],  # the sequential answers replayed: a perfect drafter
}

# --config-extra NAME=OPTIONS: coordinator options of that configuration's group alone
CONFIG_EXTRA = {}

# the warm-up request of every group in the default mode (not one of the measured prompts)
WARM_PROMPT = "List the planets of the solar system in order, with one fact about each."

# the Minions-style ablation: each step adds one technique (coordinator flags, speculator flags)
ABLATION = [
    ("chain", ["--tree", "off", "--vote", "off", "--adaptive", "off"], "work-ahead=0"),
    ("tree", ["--tree", "on", "--vote", "off", "--adaptive", "off"], "work-ahead=0"),
    ("+vote", ["--tree", "on", "--vote", "majority", "--adaptive", "off"], "work-ahead=0"),
    ("+adaptive", ["--tree", "on", "--vote", "majority", "--adaptive", "on"], "work-ahead=0"),
    ("+pipeline", ["--tree", "on", "--vote", "majority", "--adaptive", "on"], "work-ahead=1"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def extra_value(a, flag):
    """The value of a coordinator option among --extra, or None (--act-bits and --kv: the
    sequential reference must compute the same way)."""
    ex = a.extra.split()
    return ex[ex.index(flag) + 1] if flag in ex[:-1] else None


def sequential(bin_dir, model, prompt, n, threads, act_bits=None, kv=None):
    """orochi run in-process: (ids, decode tok/s, total tok/s); act_bits and kv as the group's
    --act-bits and --kv (the reference must compute the same way)."""
    t0 = time.time()
    p = subprocess.run([os.path.join(bin_dir, "orochi"), "run", "--model", model, "--chat", "--prompt", prompt,
                        "-n", str(n), "--temp", "0", "--threads", str(threads), "--print-ids"] +
                       (["--act-bits", act_bits] if act_bits else []) + (["--kv", kv] if kv else []),
                       capture_output=True, text=True, check=True)
    wall = time.time() - t0
    ids = [int(x) for x in p.stdout.split()]
    m = re.search(r"([0-9.]+) decode tok/s", p.stderr)
    return ids, float(m.group(1)) if m else 0.0, wall


class Group:
    def __init__(self, bin_dir, model, run_dir, workers, threads, specs, extra, ctl=()):
        self.env = dict(os.environ, OROCHI_BIN_DIR=bin_dir)
        self.run_dir = run_dir
        self.port = free_port()
        cmd = [LAUNCH, "up", "--run-dir", run_dir, "--port", str(self.port), "--target", model,
               "--workers", "cpu:%d" % workers, "--threads-per-worker", str(threads)]
        for s in specs:
            cmd += ["--speculator", s]
        # ctl: orochi-launch options, then perhaps "--" and coordinator options; extra: more
        # coordinator options (one "--" in all: the coordinator stops reading at a second one)
        ctl = list(ctl)
        coord = ctl[ctl.index("--") + 1:] if "--" in ctl else []
        cmd += ctl[:ctl.index("--")] if "--" in ctl else ctl
        coord += list(extra)
        if coord:
            cmd += ["--"] + coord
        subprocess.run(cmd, env=self.env, check=True, stdout=subprocess.DEVNULL)
        # speculators join shortly after the workers: give them a moment
        deadline = time.time() + 30
        while time.time() < deadline:
            status = open(os.path.join(run_dir, "status")).read() if os.path.exists(os.path.join(run_dir, "status")) else ""
            if status and "not connected" not in status:
                break
            time.sleep(0.2)
        self.url = "http://127.0.0.1:%d" % self.port

    def chat(self, prompt, n):
        t0 = time.time()
        r = post(self.url + "/v1/chat/completions",
                 {"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0})
        return r, time.time() - t0

    def complete(self, prompt, n):
        t0 = time.time()
        r = post(self.url + "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0})
        return r, time.time() - t0

    def down(self):
        subprocess.run([LAUNCH, "down", "--run-dir", self.run_dir], env=self.env, stdout=subprocess.DEVNULL)


def group_decode(g, prompt, n):
    """Greedy chat completion through a group; decode tok/s excludes the prompt: the wall time of
    a 1-token request (prompt + first token) is subtracted. A first request warms the group, so
    that neither timed request pays for the first touch of the prompt's path (a cold 1-token
    request made the subtraction too large: at -n 16, rates of thousands of tok/s)."""
    g.chat(prompt, 1)
    _, wall1 = g.chat(prompt, 1)
    r, wall = g.chat(prompt, n)
    o = r["orochi"]
    k = len(o["token_ids"])
    dt = wall - wall1
    return o, (k - 1) / dt if k > 1 and dt > 0 else k / wall, dt if k > 1 and dt > 0 else wall


def load_prompts(path, limit_per_cat):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    seen = {}
    out = []
    for r in rows:
        c = r.get("category", "all")
        if seen.get(c, 0) < limit_per_cat:
            seen[c] = seen.get(c, 0) + 1
            out.append(r)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", default=os.path.join(ROOT, "bench", "prompts.jsonl"))
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--categories", default="", help="only these prompt categories (comma list)")
    ap.add_argument("-n", "--max-tokens", type=int, default=0, help="override the prompts' max_tokens")
    ap.add_argument("--configs", default="seq-group,ngram,layerskip,both")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads-per-worker", type=int, default=1)
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "spec_bench.jsonl"))
    ap.add_argument("--run-dir", default="/tmp/orochi-bench-run")
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--extra", default="", help="extra coordinator options (space separated)")
    ap.add_argument("--sweep-width", default="", help="widths, e.g. 1,2,4,8,16,32,64")
    ap.add_argument("--kinds", default="ngram,layerskip", help="draft kinds for --sweep-width")
    ap.add_argument("--ablation", action="store_true")
    ap.add_argument("--concurrency", default="", help="requests in flight, e.g. 1,2,4,8")
    ap.add_argument("--concurrency-spec", default="ngram",
                    help="speculators of the --concurrency group (comma list; none: plain decoding)")
    ap.add_argument("--concurrency-mode", choices=("closed", "waves"), default="closed",
                    help="closed: n requests kept in flight while jobs remain; waves: n at a time, "
                         "each batch waiting for its longest")
    ap.add_argument("--concurrency-jobs", type=int, default=0,
                    help="requests per level (closed: default 3 x the largest level; waves: the "
                         "largest level)")
    ap.add_argument("--draft", default="", help="the draft model of the `model` configuration")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=SPEC[+SPEC...]",
                    help="a configuration of your own: NAME runs a group with these launcher "
                         "speculator specs (e.g. model-t2=model:draft=D.gguf,threads=2); name it "
                         "in --configs")
    ap.add_argument("--config-extra", action="append", default=[], metavar="NAME=OPTIONS",
                    help="coordinator options of one configuration's group (space separated; the rounds and --repeat modes), "
                         "beside --extra's; e.g. layerskip-noguard=\"--guard off\"")
    ap.add_argument("--no-noise", action="store_true",
                    help="--repeat without seq-group-2, the second group without speculators")
    ap.add_argument("--repeat", type=int, default=0,
                    help="fresh groups N times (rounds, seq-group added), and per configuration the "
                         "min / median / max of its speedup over the group without speculators")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of the configurations (default mode; all groups up at once, each prompt on "
                         "each group back to back); with seq-group among them, "
                         "each speculative group is also compared with it per round and category; "
                         "--concurrency: rounds of every level, interleaved")
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print("spec_bench: model %s is absent (run make models)" % a.model, file=sys.stderr)
        return 2
    if a.demo:
        # the same requests on two warm groups of the same shape, one without speculators: the
        # speedup is speculation's alone (not a process start or a model load)
        a.configs, a.per_category, a.rounds = "seq-group,both", 1, 3
        a.max_tokens = a.max_tokens or 64
    if a.repeat:
        a.rounds = a.repeat
        if "seq-group" not in a.configs.split(","):
            a.configs = "seq-group," + a.configs
        if not a.no_noise and "seq-group-2" not in a.configs.split(","):
            a.configs += ",seq-group-2"
    if "model" in a.configs.split(","):
        if not a.draft:
            print("spec_bench: the model configuration needs --draft FILE", file=sys.stderr)
            return 2
        CONFIGS["model"] = ["model:draft=%s" % a.draft]
    for c in a.config:
        name, eq, specs = c.partition("=")
        if not eq or not name:
            print("spec_bench: --config takes NAME=SPEC[+SPEC...], got %r" % c, file=sys.stderr)
            return 2
        CONFIGS[name] = [x for x in specs.split("+") if x]
    for c in a.config_extra:
        name, eq, opts = c.partition("=")
        if not eq or name not in CONFIGS:
            print("spec_bench: --config-extra takes NAME=OPTIONS of a named configuration, got %r"
                  % c, file=sys.stderr)
            return 2
        CONFIG_EXTRA[name] = opts.split()
    unknown = [c for c in a.configs.split(",") if c and c not in CONFIGS]
    if unknown:
        print("spec_bench: unknown configuration(s) %s (%s, or --config NAME=...)" % (
            ",".join(unknown), ",".join(CONFIGS)), file=sys.stderr)
        return 2
    prompts = load_prompts(a.prompts, a.per_category)
    if a.categories:
        prompts = [p for p in prompts if p["category"] in a.categories.split(",")]
        if not prompts:
            print("spec_bench: no prompts of categories %s in %s" % (a.categories, a.prompts), file=sys.stderr)
            return 2
    configs = [c for c in a.configs.split(",") if c]
    threads = a.workers * a.threads_per_worker
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    out = open(a.json, "a")

    # the sequential baseline, same process-count of cores
    print("sequential baseline: orochi run --threads %d, %d prompts..." % (threads, len(prompts)), file=sys.stderr)
    base = {}
    for p in prompts:
        n = a.max_tokens or p.get("max_tokens", 96)
        ids, dec_tps, wall = sequential(a.bin_dir, a.model, p["prompt"], n, threads,
                                           extra_value(a, "--act-bits"), extra_value(a, "--kv"))
        base[p["id"]] = {"ids": ids, "tok_s": len(ids) / wall, "decode_tok_s": dec_tps}

    if "replay" in configs or "replay" in a.concurrency_spec.split(","):
        corpus = os.path.join(os.path.dirname(a.json), "replay-corpus.txt")
        with open(corpus, "w") as f:
            for p in prompts:
                t = subprocess.run([os.path.join(a.bin_dir, "orochi"), "tokenize", "--model", a.model,
                                    "--chat", "--ids-only", p["prompt"]],
                                   capture_output=True, text=True, check=True)
                f.write("%s %s\n" % (t.stdout.strip(), " ".join(map(str, base[p["id"]]["ids"]))))
        CONFIGS["replay"] = ["replay:corpus=%s" % corpus]

    if a.sweep_width:
        return sweep_width(a, prompts, base, out)
    if a.ablation:
        return ablation(a, prompts, base, out)
    if a.concurrency:
        return concurrency(a, prompts, base, out)

    rows = []
    split = []
    failures = 0

    def run_prompt(g, cfg, p, rnd):
        nonlocal failures
        n = a.max_tokens or p.get("max_tokens", 96)
        r, wall = g.chat(p["prompt"], n)
        o = r["orochi"]
        ids = o["token_ids"]
        same = ids == base[p["id"]]["ids"]
        if not same:
            failures += 1
            print("MISMATCH %s %s: speculative %s vs sequential %s" % (cfg, p["id"], ids[:12], base[p["id"]]["ids"][:12]),
                  file=sys.stderr)
        if a.demo and cfg != "seq-group" and rnd == 0:
            print("\n[%s] %s\n%s" % (p["category"], p["prompt"], r["choices"][0]["message"]["content"]))
        if cfg == "seq-group" and rnd == 0:
            # decode rate of the group: the time of a 1-token request (prompt + first token)
            # subtracted from the full one
            _, wall1 = g.chat(p["prompt"], 1)
            if len(ids) >= 16 and wall > wall1:  # a few tokens say nothing about the rate
                split.append((len(ids) - 1, wall - wall1, (len(ids) - 1) / base[p["id"]]["decode_tok_s"]))
        row = {"bench": "spec", "config": cfg, "id": p["id"], "category": p["category"], "tokens": len(ids),
               "tok_s": len(ids) / wall, "mean_accepted": o["mean_accepted"], "steps": o["steps"],
               "draft_kinds": o["draft_kinds"], "seq_tok_s": base[p["id"]]["tok_s"],
               "speedup": (len(ids) / wall) / base[p["id"]]["tok_s"], "lossless": same,
               "workers": a.workers, "threads_per_worker": a.threads_per_worker, "round": rnd + 1,
               "loadavg": os.getloadavg()[0]}
        rows.append(row)
        out.write(json.dumps(row) + "\n")

    for rnd in range(a.rounds):
        # every configuration's group is up at once (an idle group's processes sleep), and each
        # prompt runs on all of them back to back, in an order that rotates: the figures a ratio
        # compares are seconds apart, so the machine's slow and fast spells hit both alike
        groups = {}
        try:
            for cfg in configs:
                print("round %d, group %s: %d workers x %d threads, speculators %s (load %.2f)..." % (
                    rnd + 1, cfg, a.workers, a.threads_per_worker, ",".join(CONFIGS[cfg]) or "none",
                    os.getloadavg()[0]), file=sys.stderr)
                groups[cfg] = Group(a.bin_dir, a.model, "%s-%s-r%d" % (a.run_dir, cfg, rnd + 1), a.workers,
                                    a.threads_per_worker, CONFIGS[cfg],
                                    a.extra.split() + CONFIG_EXTRA.get(cfg, []))
                # warm the group: the first touch of the weights' pages, and the controllers' first
                # measurements (the guard's plain baseline, each speculator's first replies) — a
                # cost of the group's start, not of the category that happens to come first
                groups[cfg].chat(WARM_PROMPT, 48)
            for j, p in enumerate(prompts[rnd % len(prompts):] + prompts[:rnd % len(prompts)]):
                k = (j + rnd) % len(configs)
                for cfg in configs[k:] + configs[:k]:
                    run_prompt(groups[cfg], cfg, p, rnd)
        finally:
            for g in groups.values():
                g.down()

    if a.demo:
        return demo_table(rows, configs, failures)
    # the table: per config and category
    print("\n%-10s %-10s %8s %10s %10s %9s %9s" % ("config", "category", "tokens", "tok/s", "seq tok/s",
                                                  "accepted", "speedup"))
    cats = sorted({r["category"] for r in rows})
    for cfg in configs:
        for cat in cats + ["all"]:
            sel = [r for r in rows if r["config"] == cfg and (cat == "all" or r["category"] == cat)]
            if not sel:
                continue
            toks = sum(r["tokens"] for r in sel)
            t_spec = sum(r["tokens"] / r["tok_s"] for r in sel)
            t_seq = sum(r["tokens"] / r["seq_tok_s"] for r in sel)
            acc = sum(r["mean_accepted"] * r["steps"] for r in sel) / max(1, sum(r["steps"] for r in sel))
            print("%-10s %-10s %8d %10.1f %10.1f %9.2f %8.2fx%s" % (cfg, cat, toks, toks / t_spec, toks / t_seq, acc,
                  t_seq / t_spec, "" if all(r["lossless"] for r in sel) else "  NOT LOSSLESS"))
    if "seq-group" in configs and len(configs) > 1:
        # each speculative group against the same group without speculators, round by round (each
        # prompt ran on both seconds apart), and pooled over all rounds (total tokens / total time)
        print("\nagainst the group without speculators (per round; median; pooled over the rounds)")
        print("%-11s %-10s %s" % ("config", "category", "x seq-group"))
        def rate(c, cat, rnd=None):
            """tok/s of config c over category cat (or all), in round rnd or pooled over all."""
            sel = [r for r in rows if r["config"] == c and (rnd is None or r["round"] == rnd) and
                   (cat == "all" or r["category"] == cat)]
            t = sum(r["tokens"] / r["tok_s"] for r in sel)
            return sum(r["tokens"] for r in sel) / t if sel and t > 0 else None

        for cfg in configs:
            if cfg == "seq-group":
                continue
            for cat in cats + ["all"]:
                ratios = []
                for rnd in range(1, a.rounds + 1):
                    spec, plain = rate(cfg, cat, rnd), rate("seq-group", cat, rnd)
                    if spec and plain:
                        ratios.append(spec / plain)
                if ratios:
                    med = statistics.median(ratios)
                    pool = rate(cfg, cat) / rate("seq-group", cat)
                    print("%-11s %-10s %s   min %.2fx  median %.2fx  max %.2fx  pooled %.3fx" % (
                        cfg, cat, " ".join("%.2f" % x for x in ratios), min(ratios), med,
                        max(ratios), pool))
                    out.write(json.dumps({"bench": "spec-vs-group", "config": cfg, "category": cat,
                                          "ratios": ratios, "min": min(ratios), "median": med,
                                          "max": max(ratios), "pooled": pool,
                                          "loadavg": os.getloadavg()[0]}) + "\n")
                    if a.repeat and cat == "all":
                        print("%-11s %-10s %d fresh runs: min %.2fx, median %.2fx, max %.2fx "
                              "(%d of %d at or above 1.0x)%s" % (
                                  cfg, "repeat", len(ratios), min(ratios), med, max(ratios),
                                  sum(x >= 1.0 for x in ratios), len(ratios),
                                  ": the noise between two identical groups"
                                  if cfg == "seq-group-2" else ""))
    seq_dec = sum(b["decode_tok_s"] for b in base.values()) / max(1, len(base))
    print("\nsequential decode (orochi run --threads %d): %.1f tok/s; JSON lines in %s" % (threads, seq_dec, a.json))
    if split:
        g_dec = sum(x[0] for x in split) / sum(x[1] for x in split)  # ratios of sums
        r_dec = sum(x[0] for x in split) / sum(x[2] for x in split)
        print("process split: %d workers x %d thread decode %.1f tok/s vs orochi run --threads %d %.1f tok/s: "
              "ratio %.3f" % (a.workers, a.threads_per_worker, g_dec, threads, r_dec, g_dec / r_dec))
        out.write(json.dumps({"bench": "split", "workers": a.workers, "threads_per_worker": a.threads_per_worker,
                              "group_decode_tok_s": g_dec, "run_decode_tok_s": r_dec, "ratio": g_dec / r_dec}) + "\n")
    if failures:
        print("spec_bench: %d outputs differ from sequential decoding" % failures, file=sys.stderr)
        return 1
    return 0


def demo_table(rows, configs, failures):
    """`make demo`'s table: per category, the group with speculators against the same group
    without, on the same requests, both warm; a speedup above the tokens per step is impossible
    for a step that costs at least a plain one, and is flagged."""
    spec_cfg = [c for c in configs if c != "seq-group"][0]
    print("\nspeculation (%s) against the same group without speculators (%s), the same requests,"
          " both groups warm:" % ("+".join(CONFIGS[spec_cfg]), "seq-group"))
    print("%-10s %7s %12s %12s %14s %9s" % ("category", "tokens", "plain tok/s", "spec tok/s",
                                           "tokens/step", "speedup"))
    cats = sorted({r["category"] for r in rows})
    suspect = 0
    for cat in cats + ["all"]:
        sel = {c: [r for r in rows if r["config"] == c and (cat == "all" or r["category"] == cat)]
               for c in ("seq-group", spec_cfg)}
        if not sel["seq-group"] or not sel[spec_cfg]:
            continue
        rate = {c: sum(r["tokens"] for r in v) / sum(r["tokens"] / r["tok_s"] for r in v)
                for c, v in sel.items()}
        toks = sum(r["tokens"] for r in sel[spec_cfg])
        per_step = toks / max(1, sum(r["steps"] for r in sel[spec_cfg]))
        speedup = rate[spec_cfg] / rate["seq-group"]
        flag = ""
        if speedup > per_step * 1.05:
            flag = "  (more than its tokens per step allow: a noisy measurement)"
            suspect += 1
        print("%-10s %7d %12.1f %12.1f %14.2f %8.2fx%s" % (cat, toks, rate["seq-group"],
                                                          rate[spec_cfg], per_step, speedup, flag))
    print("every answer %s `orochi run --temp 0` token for token" % (
        "equals" if not failures else "does NOT equal"))
    return 1 if failures else 0


def run_config(a, prompts, base, out, label, specs, ctl, tag, extra=()):
    """One group; every prompt greedily; returns rows (checked lossless against base)."""
    run_dir = "%s-%s" % (a.run_dir, re.sub(r"[^a-z0-9]+", "-", label.lower()))
    g = Group(a.bin_dir, a.model, run_dir, a.workers, a.threads_per_worker, specs, a.extra.split() + list(extra), ctl)
    rows = []
    try:
        for p in prompts:
            n = a.max_tokens or p.get("max_tokens", 96)
            r, wall = g.chat(p["prompt"], n)
            o = r["orochi"]
            same = o["token_ids"] == base[p["id"]]["ids"]
            if not same:
                print("MISMATCH %s %s" % (label, p["id"]), file=sys.stderr)
            row = dict(tag, bench=tag.get("bench", "spec"), label=label, id=p["id"], category=p["category"],
                       tokens=len(o["token_ids"]), tok_s=len(o["token_ids"]) / wall, steps=o["steps"],
                       mean_accepted=o["mean_accepted"], seq_tok_s=base[p["id"]]["tok_s"],
                       speedup=(len(o["token_ids"]) / wall) / base[p["id"]]["tok_s"], lossless=same)
            rows.append(row)
            out.write(json.dumps(row) + "\n")
    finally:
        g.down()
    return rows


def summarize(rows, key):
    """Per key value and category: tokens, tok/s, accepted per step, speedup (time-weighted)."""
    table = {}
    for r in rows:
        for cat in (r["category"], "all"):
            t = table.setdefault((r[key], cat), {"tok": 0, "t": 0.0, "tseq": 0.0, "acc": 0.0, "steps": 0, "ok": True})
            t["tok"] += r["tokens"]
            t["t"] += r["tokens"] / r["tok_s"]
            t["tseq"] += r["tokens"] / r["seq_tok_s"]
            t["acc"] += r["mean_accepted"] * r["steps"]
            t["steps"] += r["steps"]
            t["ok"] &= r["lossless"]
    return table


def sweep_width(a, prompts, base, out):
    widths = [int(w) for w in a.sweep_width.split(",")]
    rows = []
    for kind in a.kinds.split(","):
        for w in widths:
            print("sweep: %s at width %d..." % (kind, w), file=sys.stderr)
            # vote off: the speculator's whole tree is verified (majority would keep one chain)
            ctl = ["--max-width", str(max(8, w)), "--width", str(w), "--adaptive", "off", "--vote", "off",
                   "--max-draft", str(max(1, min(w - 1, 16)))]
            # acceptance is what this table measures: wait for every draft, however long it takes
            # (a fixed wait: the measured one would skip a drafter too slow to pay for itself)
            rows += run_config(a, prompts, base, out, "%s-w%d" % (kind, w), [kind], ctl,
                               {"bench": "width", "kind": kind, "width": w},
                               extra=["--draft-wait", "fixed", "--draft-wait-ms", "30000"])
            done_rows = [r for r in rows if r["kind"] == kind and r["width"] == w]
            steps = sum(r["steps"] for r in done_rows)
            print("  %s width %d: mean accepted %.2f" % (kind, w, sum(r["mean_accepted"] * r["steps"] for r in done_rows)
                                                          / max(1, steps)), file=sys.stderr, flush=True)
    cats = sorted({r["category"] for r in rows}) + ["all"]
    print("\nmean tokens accepted per verification step (incl. the correction token)")
    print("%-10s %-6s " % ("kind", "width") + " ".join("%10s" % c for c in cats))
    for kind in a.kinds.split(","):
        for w in widths:
            sel = [r for r in rows if r["kind"] == kind and r["width"] == w]
            cells = []
            for c in cats:
                cs = [r for r in sel if c == "all" or r["category"] == c]
                steps = sum(r["steps"] for r in cs)
                cells.append("%10.2f" % (sum(r["mean_accepted"] * r["steps"] for r in cs) / max(1, steps)))
            print("%-10s %-6d " % (kind, w) + " ".join(cells))
    return 0 if all(r["lossless"] for r in rows) else 1


def ablation(a, prompts, base, out):
    rows = []
    for label, ctl, spec_opt in ABLATION:
        print("ablation: %s..." % label, file=sys.stderr)
        specs = ["layerskip:" + spec_opt, "ngram"]
        rows += run_config(a, prompts, base, out, label, specs, ctl, {"bench": "ablation", "step": label})
    table = summarize(rows, "label")
    cats = sorted({r["category"] for r in rows}) + ["all"]
    print("\nspeedup over sequential (orochi run, same run), mean accepted per step in brackets")
    print("%-10s " % "config" + " ".join("%16s" % c for c in cats))
    for label, _, _ in ABLATION:
        cells = []
        for c in cats:
            t = table.get((label, c))
            cells.append("%9.2fx (%4.2f)" % (t["tseq"] / t["t"], t["acc"] / max(1, t["steps"])) if t else "%16s" % "-")
        print("%-10s " % label + " ".join(cells) + ("" if all(table[(label, c)]["ok"] for c in cats if (label, c) in table) else "  NOT LOSSLESS"))
    return 0 if all(r["lossless"] for r in rows) else 1


def in_waves(g, jobs, n, max_tokens):
    """Every job (a prompt row) as a greedy chat completion, n at once: ([(response, seconds)], the
    summed wall time of the waves)."""
    res, wall = [None] * len(jobs), 0.0
    for w0 in range(0, len(jobs), n):
        wave = list(range(w0, min(w0 + n, len(jobs))))

        def one(i):
            res[i] = g.chat(jobs[i]["prompt"], max_tokens)

        t0 = time.time()
        th = [threading.Thread(target=one, args=(i,)) for i in wave]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall += time.time() - t0
    return res, wall


def closed_loop_run(n_jobs, n, one, more=()):
    """n client threads take the next of n_jobs jobs from one queue as soon as their last is done:
    one(i) does job i and returns its result; `more` are other threads run beside them. ([result
    per job], wall time from the first job to the last result)."""
    res, lock, nxt = [None] * n_jobs, threading.Lock(), [0]

    def client():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n_jobs:
                return
            res[i] = one(i)

    t0 = time.time()
    th = [threading.Thread(target=client) for _ in range(n)] + [threading.Thread(target=f) for f in more]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return res, time.time() - t0


def closed_loop(g, jobs, n, max_tokens):
    """Every job as a greedy chat completion with n requests in flight for as long as jobs remain.
    ([(response, seconds)], wall time from the first request to the last answer)."""
    return closed_loop_run(len(jobs), n, lambda i: g.chat(jobs[i]["prompt"], max_tokens))


def concurrency(a, prompts, base, out):
    """Aggregate tok/s with n requests in flight for each level of --concurrency, --rounds times
    with the levels interleaved (a round runs every level once, in turn): per level the median
    tok/s and the median over rounds of its ratio to level 1 of the same round."""
    levels = [int(x) for x in a.concurrency.split(",")]
    run_dir = a.run_dir + "-concurrency"
    # a configuration's name (replay: the sequential answers, a perfect drafter) or speculators
    specs = [s for k in a.concurrency_spec.split(",") if k and k != "none" for s in CONFIGS.get(k, [k])]
    g = Group(a.bin_dir, a.model, run_dir, a.workers, a.threads_per_worker, specs, a.extra.split(),
              ["--", "--max-batch", str(max(levels))])
    ok = True
    rows = {n: [] for n in levels}  # per level, per round: (tokens, seconds, mean accepted list)
    try:
        g.chat(prompts[0]["prompt"], 8)  # warm the group
        # every level serves the same requests: level 1 is those requests one after the other, so
        # the ratios compare like work. closed: --concurrency-jobs of them (default 3 x the
        # largest level), n kept in flight; waves: as many as the largest level, n at a time, each
        # wave waiting for its longest answer
        n_jobs = a.concurrency_jobs or (max(levels) if a.concurrency_mode == "waves" else 3 * max(levels))
        jobs = [prompts[i % len(prompts)] for i in range(n_jobs)]
        run = in_waves if a.concurrency_mode == "waves" else closed_loop
        print("concurrency: %d requests per level, %s" % (len(jobs), a.concurrency_mode), file=sys.stderr)
        for rnd in range(a.rounds):
            for n in levels:
                res, wall = run(g, jobs, n, a.max_tokens or 64)
                toks = sum(len(r[0]["orochi"]["token_ids"]) for r in res)
                for i in range(len(jobs)):
                    got = res[i][0]["orochi"]["token_ids"]
                    want = base[jobs[i]["id"]]["ids"][: len(got)]
                    if got != want:
                        at = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
                                  min(len(got), len(want)))
                        print("concurrency %d: %s differs from its sequential output at token %d "
                              "(%d tokens, sequential %d)" % (n, jobs[i]["id"], at, len(got),
                                                              len(base[jobs[i]["id"]]["ids"])),
                              file=sys.stderr)
                        ok = False
                rows[n].append((toks, wall, [r[0]["orochi"]["mean_accepted"] for r in res]))
                print("round %d/%d: %d at once: %.1f tok/s" % (rnd + 1, a.rounds, n, toks / wall),
                      file=sys.stderr)
    finally:
        g.down()
    print("\n%-12s %10s %12s %10s %16s  %s" % ("concurrent", "tokens", "tok/s", "x one",
                                              "x one per round", "mean accepted per request"))
    base_level = levels[0]
    for n in levels:
        tps = [t / w for t, w, _ in rows[n]]
        ratios = [(t / w) / (t1 / w1) for (t, w, _), (t1, w1, _) in zip(rows[n], rows[base_level])]
        acc = rows[n][-1][2]
        print("%-12d %10d %12.1f %9.2fx %16s  %s" % (
            n, rows[n][-1][0], statistics.median(tps), statistics.median(ratios),
            " ".join("%.2f" % r for r in ratios), " ".join("%.2f" % x for x in acc)))
        out.write(json.dumps({"bench": "concurrency", "requests": n, "rounds": a.rounds,
                              "mode": a.concurrency_mode, "jobs": len(jobs),
                              "tokens": rows[n][-1][0], "tok_s": statistics.median(tps),
                              "x_one": statistics.median(ratios), "x_one_rounds": ratios,
                              "mean_accepted": acc, "extra": a.extra,
                              "workers": a.workers, "threads_per_worker": a.threads_per_worker,
                              "loadavg": os.getloadavg()[0]}) + "\n")
    if not ok:
        print("concurrency: some outputs differ from their single-request output", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
