#!/usr/bin/env python3
"""bench/group_vs_run.py — what the process group costs over one process, without speculation.

A group with no speculator decodes the same tokens as `orochi run --temp 0` with the same total
threads; what it adds is the handoff between the coordinator and the workers. This benchmark runs,
per model file and round, one group per configuration (`--workers cpu:W --threads-per-worker T`,
free run on or off) and, for every prompt, a greedy chat completion through the group followed at
once by `orochi run` on the same prompt and threads, so each ratio compares two runs a second
apart. The group's decode rate is the one the coordinator reports (`orochi.timings.decode_tok_s`:
tokens after the first over the time from the first to the last), measured the same way as
`orochi run`'s. Every group answer is checked against `orochi run --print-ids`.

Prints a line per measurement, then per (model, configuration) the median ratio over all prompts
and rounds with the load average; JSON lines to --json.

  python3 bench/group_vs_run.py [--models A.gguf,B.gguf] [--configs free=1x2,cycle=1x2:off,...]
  (a configuration NAME=WxT[:off][:kvheads]: W workers of T threads, free run off, the even split
  by whole KV heads instead of query heads)
                                [--rounds 3] [-n 128]
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import spec_bench  # noqa: E402  (Group, load_prompts, sequential: the shared helpers)

DEFAULT_CONFIGS = "free=1x2,cycle=1x2:off,free2w=2x1,cycle2w=2x1:off"


def parse_config(s):
    """NAME=WxT[:off][:kvheads] (off: --free-run off; kvheads: --kv-dup off, the even split by
    whole KV heads)."""
    name, spec = s.split("=", 1)
    flags = spec.split(":")[1:]
    w, t = spec.split(":")[0].split("x")
    return {"name": name, "workers": int(w), "threads": int(t), "free": "off" not in flags,
            "kv_dup": "kvheads" not in flags}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--models", default=",".join([
        os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        os.path.join(ROOT, "bench", "results", "peer-models", "SmolLM2-135M-Instruct.F16.gguf")]))
    ap.add_argument("--prompts", default=os.path.join(ROOT, "..", "shared", "bench", "prompts.jsonl"))
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=128, help="tokens per request")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "group_vs_run.jsonl"))
    ap.add_argument("--run-dir", default="/tmp/orochi-group-vs-run")
    a = ap.parse_args()
    if not os.path.exists(a.prompts):
        a.prompts = os.path.join(ROOT, "bench", "prompts.jsonl")
    models = [m for m in a.models.split(",") if m]
    missing = [m for m in models if not os.path.exists(m)]
    if missing:
        print("group_vs_run: absent model file(s): %s (make models; F16: orochi quantize)" % ", ".join(missing),
              file=sys.stderr)
        return 2
    configs = [parse_config(c) for c in a.configs.split(",") if c]
    prompts = spec_bench.load_prompts(a.prompts, a.per_category)
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    out = open(a.json, "a")
    ratios = {}
    loads = {}
    t_start = time.time()
    for rnd in range(a.rounds):
        for model in models:
            order = configs if rnd % 2 == 0 else list(reversed(configs))
            for cfg in order:
                key = (os.path.basename(model), cfg["name"])
                extra = ([] if cfg["free"] else ["--free-run", "off"]) + \
                    ([] if cfg["kv_dup"] else ["--kv-dup", "off"])
                g = spec_bench.Group(a.bin_dir, model, a.run_dir, cfg["workers"], cfg["threads"], [], extra)
                try:
                    g.chat("Say hello.", 8)  # warm-up: the first request's pages and caches
                    for p in prompts:
                        r, _ = g.chat(p["prompt"], a.n)
                        gids = r["orochi"]["token_ids"]
                        g_rate = r["orochi"]["timings"]["decode_tok_s"]
                        rids, r_rate, _ = spec_bench.sequential(a.bin_dir, model, p["prompt"], a.n,
                                                                cfg["workers"] * cfg["threads"])
                        if gids != rids:
                            print("group_vs_run: %s %s %s: the group's ids differ from orochi run's" %
                                  (key[0], cfg["name"], p["category"]), file=sys.stderr)
                            return 1
                        load = os.getloadavg()[0]
                        ratio = g_rate / r_rate if r_rate else 0
                        ratios.setdefault(key, []).append(ratio)
                        loads.setdefault(key, []).append(load)
                        row = {"bench": "group_vs_run", "round": rnd, "model": key[0], "config": cfg["name"],
                               "workers": cfg["workers"], "threads": cfg["threads"], "free_run": cfg["free"],
                               "kv_dup": cfg["kv_dup"],
                               "category": p["category"], "tokens": len(gids), "group_tok_s": round(g_rate, 2),
                               "run_tok_s": r_rate, "ratio": round(ratio, 4), "load1": load, "time": time.time()}
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                        print("round %d  %-36s %-8s %-10s group %7.1f  run %7.1f  ratio %.3f  load %.2f" % (
                            rnd, key[0], cfg["name"], p["category"], g_rate, r_rate, ratio, load), flush=True)
                finally:
                    g.down()
    print("\n| model | configuration | workers x threads | free run | median group/run | min | max | n | load (1 min) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (m, name), rs in ratios.items():
        cfg = next(c for c in configs if c["name"] == name)
        ls = loads[(m, name)]
        print("| %s | %s | %dx%d | %s | %.3f | %.3f | %.3f | %d | %.2f-%.2f |" % (
            m, name, cfg["workers"], cfg["threads"], "on" if cfg["free"] else "off", statistics.median(rs),
            min(rs), max(rs), len(rs), min(ls), max(ls)))
    print("\n%d rounds in %.0f s; JSON lines appended to %s" % (a.rounds, time.time() - t_start, a.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
