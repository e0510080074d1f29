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
  --demo            the `make demo` job: 2 workers x 1 thread + layerskip + ngram, a few prompts,
                    the generated text printed, then the table
  (default)         the configurations of --configs over the whole prompt file, a table per
                    category, JSON lines to --json

Configurations are named: seq-group (2 workers, no speculator: the process-split overhead),
ngram, layerskip, both (layerskip + ngram).
"""
import argparse
import json
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
    "ngram": ["ngram"],
    "layerskip": ["layerskip"],
    "both": ["layerskip", "ngram"],
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout=600):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def sequential(bin_dir, model, prompt, n, threads):
    """orochi run in-process: (ids, decode tok/s, total tok/s)."""
    t0 = time.time()
    p = subprocess.run([os.path.join(bin_dir, "orochi"), "run", "--model", model, "--chat", "--prompt", prompt,
                        "-n", str(n), "--temp", "0", "--threads", str(threads), "--print-ids"],
                       capture_output=True, text=True, check=True)
    wall = time.time() - t0
    ids = [int(x) for x in p.stdout.split()]
    m = re.search(r"([0-9.]+) decode tok/s", p.stderr)
    return ids, float(m.group(1)) if m else 0.0, wall


class Group:
    def __init__(self, bin_dir, model, run_dir, workers, threads, specs, extra):
        self.env = dict(os.environ, OROCHI_BIN_DIR=bin_dir)
        self.run_dir = run_dir
        self.port = free_port()
        cmd = [LAUNCH, "up", "--run-dir", run_dir, "--port", str(self.port), "--target", model,
               "--workers", "cpu:%d" % workers, "--threads-per-worker", str(threads)]
        for s in specs:
            cmd += ["--speculator", s]
        if extra:
            cmd += ["--"] + extra
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

    def down(self):
        subprocess.run([LAUNCH, "down", "--run-dir", self.run_dir], env=self.env, stdout=subprocess.DEVNULL)


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
    ap.add_argument("-n", "--max-tokens", type=int, default=0, help="override the prompts' max_tokens")
    ap.add_argument("--configs", default="seq-group,ngram,layerskip,both")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads-per-worker", type=int, default=1)
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "spec_bench.jsonl"))
    ap.add_argument("--run-dir", default="/tmp/orochi-bench-run")
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--extra", default="", help="extra coordinator options (space separated)")
    a = ap.parse_args()
    if not os.path.exists(a.model):
        print("spec_bench: model %s is absent (run make models)" % a.model, file=sys.stderr)
        return 2
    if a.demo:
        a.configs, a.per_category = "both", 1
        a.max_tokens = a.max_tokens or 64
    prompts = load_prompts(a.prompts, a.per_category)
    configs = [c for c in a.configs.split(",") if c]
    threads = a.workers * a.threads_per_worker
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    out = open(a.json, "a")

    # the sequential baseline, same process-count of cores
    print("sequential baseline: orochi run --threads %d, %d prompts..." % (threads, len(prompts)), file=sys.stderr)
    base = {}
    for p in prompts:
        n = a.max_tokens or p.get("max_tokens", 96)
        ids, dec_tps, wall = sequential(a.bin_dir, a.model, p["prompt"], n, threads)
        base[p["id"]] = {"ids": ids, "tok_s": len(ids) / wall, "decode_tok_s": dec_tps}

    rows = []
    split = []
    failures = 0
    for cfg in configs:
        run_dir = "%s-%s" % (a.run_dir, cfg)
        print("group %s: %d workers x %d threads, speculators %s..." % (cfg, a.workers, a.threads_per_worker,
              ",".join(CONFIGS[cfg]) or "none"), file=sys.stderr)
        g = Group(a.bin_dir, a.model, run_dir, a.workers, a.threads_per_worker, CONFIGS[cfg], a.extra.split())
        try:
            for p in prompts:
                n = a.max_tokens or p.get("max_tokens", 96)
                r, wall = g.chat(p["prompt"], n)
                o = r["orochi"]
                ids = o["token_ids"]
                same = ids == base[p["id"]]["ids"]
                if not same:
                    failures += 1
                    print("MISMATCH %s %s: speculative %s vs sequential %s" % (cfg, p["id"], ids[:12], base[p["id"]]["ids"][:12]),
                          file=sys.stderr)
                if a.demo:
                    print("\n[%s] %s\n%s" % (p["category"], p["prompt"], r["choices"][0]["message"]["content"]))
                if cfg == "seq-group":
                    # decode rate of the group: the time of a 1-token request (prompt + first token)
                    # subtracted from the full one
                    _, wall1 = g.chat(p["prompt"], 1)
                    split.append(((len(ids) - 1) / max(1e-9, wall - wall1), base[p["id"]]["decode_tok_s"]))
                row = {"bench": "spec", "config": cfg, "id": p["id"], "category": p["category"], "tokens": len(ids),
                       "tok_s": len(ids) / wall, "mean_accepted": o["mean_accepted"], "steps": o["steps"],
                       "draft_kinds": o["draft_kinds"], "seq_tok_s": base[p["id"]]["tok_s"],
                       "speedup": (len(ids) / wall) / base[p["id"]]["tok_s"], "lossless": same,
                       "workers": a.workers, "threads_per_worker": a.threads_per_worker}
                rows.append(row)
                out.write(json.dumps(row) + "\n")
        finally:
            g.down()

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
    seq_dec = sum(b["decode_tok_s"] for b in base.values()) / max(1, len(base))
    print("\nsequential decode (orochi run --threads %d): %.1f tok/s; JSON lines in %s" % (threads, seq_dec, a.json))
    if split:
        g_dec = sum(x[0] for x in split) / len(split)
        r_dec = sum(x[1] for x in split) / len(split)
        print("process split: %d workers x %d thread decode %.1f tok/s vs orochi run --threads %d %.1f tok/s: "
              "ratio %.3f" % (a.workers, a.threads_per_worker, g_dec, threads, r_dec, g_dec / r_dec))
        out.write(json.dumps({"bench": "split", "workers": a.workers, "threads_per_worker": a.threads_per_worker,
                              "group_decode_tok_s": g_dec, "run_decode_tok_s": r_dec, "ratio": g_dec / r_dec}) + "\n")
    if failures:
        print("spec_bench: %d outputs differ from sequential decoding" % failures, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
