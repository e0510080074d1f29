#!/usr/bin/env python3
"""bench/memory.py — what a process group holds in memory, and how long it takes to answer.

For each model file and group configuration, with the packed-weights cache on (the default: one
shared copy, model/packcache.h) and off (OROCHI_PACK_CACHE=off: every process packs its own), in
interleaved rounds: start the group with `orochi-launch up`, send one greedy completion, and take
from /proc/PID/smaps_rollup of every process of the group (the coordinator and its children) the
proportional set size — Pss split into file pages (the cache mapping, the model file, binaries),
shared memory (the arena) and anonymous memory — plus the seconds from `up` to the first answer.
With the cache on, a round first removes the cache directory once ("first start", which builds
it) and then starts again ("second start", which maps it).

Prints one line per group, then a table per (model, configuration, mode) with the medians;
JSON lines to --json; a bar plot of the PSS per role to --plot when matplotlib is there.

  python3 bench/memory.py --models A.gguf[,B.gguf] [--configs w1=1,w2ls=2:layerskip]
      [--rounds 2] [--threads-per-worker 1] [--json FILE] [--plot FILE.png]

A configuration NAME=W[:SPEC[:SPEC...]]: W CPU workers and the listed speculators (their
orochi-launch --speculator arguments, e.g. layerskip or model:path=D.gguf).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import spec_bench  # noqa: E402  (free_port, post)

LAUNCH = os.path.join(ROOT, "deploy", "orochi-launch")
FIELDS = ("Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Rss")


def rollup(pid):
    out = {}
    try:
        for line in open("/proc/%d/smaps_rollup" % pid):
            k, _, rest = line.partition(":")
            if k in FIELDS:
                out[k] = int(rest.split()[0]) * 1024
    except OSError:
        return None
    return out


def children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def role_of(pid):
    try:
        cmd = open("/proc/%d/cmdline" % pid, "rb").read().split(b"\0")
    except OSError:
        return "?"
    name = os.path.basename(cmd[0].decode())
    args = [c.decode() for c in cmd[1:] if c]
    for flag in ("--index", "--kind", "--id"):
        if flag in args:
            return "%s %s" % (name.replace("orochi-", ""), args[args.index(flag) + 1])
    return name.replace("orochi-", "")


def run_group(a, model, cfg, cache_dir, run_dir):
    env = dict(os.environ, OROCHI_BIN_DIR=a.bin_dir)
    env["OROCHI_PACK_CACHE"] = cache_dir if cache_dir else "off"
    port = spec_bench.free_port()
    cmd = [LAUNCH, "up", "--run-dir", run_dir, "--port", str(port), "--target", model,
           "--workers", "cpu:%d" % cfg["workers"], "--threads-per-worker",
           str(a.threads_per_worker)]
    for s in cfg["specs"]:
        cmd += ["--speculator", s]
    t0 = time.time()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    # the first answer: retried while the group still starts (workers joining)
    url = "http://127.0.0.1:%d/v1/completions" % port
    answer = None
    while time.time() - t0 < a.timeout:
        try:
            answer = spec_bench.post(url, {"prompt": "The first answer", "max_tokens": 4,
                                           "temperature": 0})
            break
        except Exception:  # noqa: BLE001  (not serving yet)
            time.sleep(0.1)
    first = time.time() - t0
    # speculators attach after the workers: give them a moment, then one more request so that
    # every process has run a step
    deadline = time.time() + 30
    while time.time() < deadline:
        st = os.path.join(run_dir, "status")
        status = open(st).read() if os.path.exists(st) else ""
        if status and "not connected" not in status:
            break
        time.sleep(0.2)
    spec_bench.post(url, {"prompt": "Memory of a group", "max_tokens": 16, "temperature": 0})
    coord = int(open(os.path.join(run_dir, "coordinator.pid")).read())
    roles = []
    for pid in [coord] + children(coord):
        r = rollup(pid)
        if r:
            roles.append(dict(r, role=role_of(pid), pid=pid))
    subprocess.run([LAUNCH, "down", "--run-dir", run_dir], env=env, stdout=subprocess.DEVNULL)
    return first, roles, answer is not None


def parse_config(s):
    name, spec = s.split("=", 1)
    parts = spec.split(":")
    specs, cur = [], None
    for p in parts[1:]:  # "model:path=D.gguf" keeps its own colon-separated options
        if "=" in p and cur is not None:
            specs[-1] += ":" + p
        else:
            specs.append(p)
            cur = p
    return {"name": name, "workers": int(parts[0]), "specs": specs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--models", required=True)
    ap.add_argument("--configs", default="w1=1,w2ls=2:layerskip")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads-per-worker", type=int, default=1)
    ap.add_argument("--modes", default="shared,private")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--cache-dir", default="/tmp/orochi-bench-pack-cache")
    ap.add_argument("--run-dir", default="/tmp/orochi-bench-memory")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "memory.jsonl"))
    ap.add_argument("--plot")
    a = ap.parse_args()
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    configs = [parse_config(s) for s in a.configs.split(",")]
    rows = []
    load = os.getloadavg()[0]
    with open(a.json, "a") as out:
        for rnd in range(a.rounds):
            for model in a.models.split(","):
                size = os.path.getsize(model)
                for cfg in configs:
                    for mode in a.modes.split(","):
                        starts = ["first", "second"] if mode == "shared" else ["private"]
                        for start in starts:
                            if start == "first":
                                shutil.rmtree(a.cache_dir, ignore_errors=True)
                            first, roles, ok = run_group(
                                a, model, cfg, a.cache_dir if mode == "shared" else None,
                                a.run_dir)
                            total = sum(r["Pss"] for r in roles)
                            row = {"bench": "memory", "round": rnd, "model": os.path.basename(model),
                                   "file_bytes": size, "config": cfg["name"], "mode": mode,
                                   "start": start, "first_answer_s": round(first, 2),
                                   "answered": ok, "pss_total": total, "roles": roles,
                                   "loadavg": round(os.getloadavg()[0], 2)}
                            rows.append(row)
                            out.write(json.dumps(row) + "\n")
                            out.flush()
                            print("round %d %-22s %-6s %-8s %-7s first answer %6.2f s  PSS %6.0f MB"
                                  " (%.2fx the file): %s" % (
                                      rnd, row["model"], cfg["name"], mode, start, first,
                                      total / 1e6, total / size,
                                      ", ".join("%s %.0f" % (r["role"], r["Pss"] / 1e6)
                                                for r in roles)), flush=True)
    print("\nload average at the start %.2f, at the end %.2f" % (load, os.getloadavg()[0]))
    print("| model | group | weights | start | first answer s | group PSS MB | x file | "
          "coordinator MB | per role (file / anon / shmem MB) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    keys = []
    for r in rows:
        k = (r["model"], r["config"], r["mode"], r["start"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        rs = [r for r in rows if (r["model"], r["config"], r["mode"], r["start"]) == k]
        med = lambda f: statistics.median(f(r) for r in rs)  # noqa: E731
        last = rs[-1]
        coord = [x for x in last["roles"] if x["role"].startswith("coordinator")]
        print("| %s | %s | %s | %s | %.2f | %.0f | %.2f | %.0f | %s |" % (
            k[0], k[1], k[2], k[3], med(lambda r: r["first_answer_s"]),
            med(lambda r: r["pss_total"]) / 1e6, med(lambda r: r["pss_total"]) / last["file_bytes"],
            coord[0]["Pss"] / 1e6 if coord else 0,
            "; ".join("%s %.0f/%.0f/%.0f" % (x["role"], x.get("Pss_File", 0) / 1e6,
                                            x.get("Pss_Anon", 0) / 1e6, x.get("Pss_Shmem", 0) / 1e6)
                      for x in last["roles"])))
    if a.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("no matplotlib: no plot")
            return 0
        fig, ax = plt.subplots(figsize=(10, 4))
        labels = ["%s\n%s %s\n%s" % k for k in keys]
        bottoms = [0.0] * len(keys)
        roles = sorted({x["role"] for r in rows for x in r["roles"]})
        for role in roles:
            vals = []
            for k in keys:
                last = [r for r in rows if (r["model"], r["config"], r["mode"], r["start"]) == k][-1]
                vals.append(sum(x["Pss"] for x in last["roles"] if x["role"] == role) / 1e9)
            ax.bar(range(len(keys)), vals, bottom=bottoms, label=role)
            bottoms = [b + v for b, v in zip(bottoms, vals)]
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(labels, fontsize=6)
        ax.set_ylabel("PSS (GB)")
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        print("plot: %s" % a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
