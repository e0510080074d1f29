#!/usr/bin/env python3
"""bench/placement.py — where the roles of a speculative group should run on shared cores.

On a small machine the target's workers and a model speculator compete for the same cores and the
same memory bandwidth. This benchmark runs one target/drafter pair (default: the F16 target and its
Q4_1 copy as `model` drafter) under several placements — threads per worker, speculator threads,
CPU pinning, spinning versus sleeping while idle — on the same prompts, in interleaved rounds, and
prints tokens/s, mean tokens accepted per step and the speedup over sequential decoding measured in
the same round (`orochi run --temp 0` with the same total threads as the group's workers). Every
output is checked token for token against the sequential one.

A placement is NAME=WORKERSxTHREADS+SPECTHREADS[,pin][,nospin], e.g. `2t+1=1x2+1`:
  - WORKERSxTHREADS: `--workers cpu:WORKERS --threads-per-worker THREADS`;
  - SPECTHREADS: the model speculator's threads;
  - pin: workers pinned to CPU 0.. in order, the speculator to the last CPU (taskset);
  - nospin: OROCHI_POOL_SPIN=0 (pool threads sleep as soon as a job ends).
Results: a table per round and the medians; JSON lines to --json.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import spec_bench  # noqa: E402  (shared helpers: Group, sequential, load_prompts, group_decode)

DEFAULT_PLACEMENTS = "1x2+1=1x2+1,1x2+2=1x2+2,1x1+1=1x1+1,1x1+1pin=1x1+1,pin,2x1+1=2x1+1,1x2+1nospin=1x2+1,nospin"


def parse_placement(s):
    """NAME=WxT+S (the flags that may follow it in the comma list are set by the caller)."""
    name, spec = s.split("=", 1)
    wt, st = spec.split("+")
    w, t = wt.split("x")
    return {"name": name, "workers": int(w), "threads": int(t), "spec_threads": int(st),
            "pin": False, "nospin": False}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--target", required=True, help="target GGUF (e.g. an F16 file from orochi quantize)")
    ap.add_argument("--draft", required=True, help="draft GGUF with the same vocabulary (e.g. the Q4_1 file)")
    ap.add_argument("--placements", default=DEFAULT_PLACEMENTS)
    ap.add_argument("--prompts", default=os.path.join(ROOT, "..", "shared", "bench", "prompts.jsonl"))
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "placement.jsonl"))
    ap.add_argument("--run-dir", default="/tmp/orochi-placement")
    a = ap.parse_args()
    # flags (pin, nospin) follow their placement in the comma list
    raw = a.placements.split(",")
    places, cur = [], None
    for tok in raw:
        if tok in ("pin", "nospin"):
            cur[tok] = True
            continue
        cur = parse_placement(tok)
        places.append(cur)
    prompts = spec_bench.load_prompts(a.prompts, a.per_category)
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    out = open(a.json, "a")
    ncpu = os.cpu_count() or 2
    rows = []
    for rnd in range(1, a.rounds + 1):
        for pl in places:
            total = pl["workers"] * pl["threads"]
            print("round %d/%d: %s: sequential at %d threads ..." % (rnd, a.rounds, pl["name"], total),
                  file=sys.stderr, flush=True)
            seq = {}
            for p in prompts:
                ids, dec, _ = spec_bench.sequential(a.bin_dir, a.target, p["prompt"], a.n, total)
                seq[p["id"]] = (ids, dec)
            seq_tps = statistics.mean(v[1] for v in seq.values())
            env = {}
            if pl["nospin"]:
                env["OROCHI_POOL_SPIN"] = "0"
            if pl["pin"]:
                env["OROCHI_PIN_WORKERS"] = ",".join(str(i % ncpu) for i in range(pl["workers"]))
                env["OROCHI_PIN_SPECULATOR"] = str(ncpu - 1)
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            print("round %d/%d: %s: group ..." % (rnd, a.rounds, pl["name"]), file=sys.stderr, flush=True)
            g = spec_bench.Group(a.bin_dir, a.target, a.run_dir, pl["workers"], pl["threads"],
                                 ["model:draft=%s,threads=%d" % (a.draft, pl["spec_threads"])], [])
            try:
                tps, acc, same = [], [], True
                for p in prompts:
                    o, t, _ = spec_bench.group_decode(g, p["prompt"], a.n)
                    tps.append(t)
                    acc.append(o["mean_accepted"])
                    if o["token_ids"] != seq[p["id"]][0]:
                        same = False
                        print("MISMATCH %s %s: speculative output differs from orochi run --temp 0"
                              % (pl["name"], p["id"]), file=sys.stderr, flush=True)
            finally:
                g.down()
                for k, v in old.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            row = {"bench": "placement", "round": rnd, "placement": pl["name"], "workers": pl["workers"],
                   "threads": pl["threads"], "spec_threads": pl["spec_threads"], "pin": pl["pin"],
                   "nospin": pl["nospin"], "tok_s": statistics.mean(tps), "accepted": statistics.mean(acc),
                   "seq_tok_s": seq_tps, "x_seq": statistics.mean(tps) / seq_tps, "lossless": same,
                   "loadavg": os.getloadavg()[0]}
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print("round %d  %-14s %7.1f tok/s  acc %.2f  seq %7.1f  x%.2f  load %.2f%s"
                  % (rnd, pl["name"], row["tok_s"], row["accepted"], seq_tps, row["x_seq"], row["loadavg"],
                     "" if same else "  MISMATCH"), flush=True)
    print("\nmedians over %d rounds (target %s, draft %s, %d prompts x %d tokens)"
          % (a.rounds, os.path.basename(a.target), os.path.basename(a.draft), len(prompts), a.n))
    print("%-14s %9s %9s %9s %7s" % ("placement", "tok/s", "accepted", "seq tok/s", "x seq"))
    for pl in places:
        sel = [r for r in rows if r["placement"] == pl["name"]]
        print("%-14s %9.1f %9.2f %9.1f %7.2f" % (pl["name"], statistics.median(r["tok_s"] for r in sel),
                                                 statistics.median(r["accepted"] for r in sel),
                                                 statistics.median(r["seq_tok_s"] for r in sel),
                                                 statistics.median(r["x_seq"] for r in sel)))
    return 0 if all(r["lossless"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
