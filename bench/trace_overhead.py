#!/usr/bin/env python3
"""bench/trace_overhead.py — what the step timeline costs a group under load.

One group (deploy/orochi-launch: --workers CPU workers, the --speculator set) serves --clients
clients sending greedy completions back to back. The run alternates windows of --seconds without
and with `orochi-launch trace` running (--rounds pairs, the order flipped every round so drift in
the machine's load falls on both sides), and counts the tokens completed in each window. It prints
a table (tok/s off and on per round, the ratio, trace size and events per second, the one-minute
load average at each window) and the overall ratio, appends one JSON line per window to --json,
and with --plot OUT.png renders the last trace's timeline (tools/trace_tool.py plot).

  usage: bench/trace_overhead.py [--model M] [--workers 2] [--speculator ngram]...
                                 [--clients 4] [--seconds 10] [--rounds 3] [--plot OUT.png]
                                 [--coord-opts "--draft-wait fixed"]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import spec_bench  # noqa: E402  (Group, post)

ROOT = spec_bench.ROOT
PROMPTS = ["Once upon a time, there was a little", "The history of the printing press begins",
           "def fibonacci(n):\n", "List three colors:"]


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


class Clients:
    """Clients sending completions back to back; done holds (end time, completion tokens)."""

    def __init__(self, g, n, max_tokens):
        self.stop = threading.Event()
        self.done, self.errors = [], 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(g, i, max_tokens), daemon=True)
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def run(self, g, i, max_tokens):
        k = i
        while not self.stop.is_set():
            try:
                r, _ = g.complete(PROMPTS[k % len(PROMPTS)], max_tokens)
                with self.lock:
                    self.done.append((time.time(), r["usage"]["completion_tokens"]))
            except Exception:  # noqa: BLE001 - counted; the window's figure says the rest
                self.errors += 1
            k += 1

    def tokens(self, t0, t1):
        with self.lock:
            return sum(n for t, n in self.done if t0 <= t < t1)

    def end(self):
        self.stop.set()
        for t in self.threads:
            t.join(300)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--speculator", action="append", default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "trace_overhead.jsonl"))
    ap.add_argument("--coord-opts", default="",
                    help="more coordinator options, one string (e.g. \"--draft-wait fixed\")")
    ap.add_argument("--plot", help="render the last trace's timeline to this PNG")
    ap.add_argument("--plot-ms", type=float, default=250, help="the plot's window (ms)")
    a = ap.parse_args()
    specs = a.speculator if a.speculator is not None else ["ngram", "layerskip"]
    if not os.path.isfile(a.model):
        sys.exit("trace_overhead: no model %s (make models)" % a.model)
    work = tempfile.mkdtemp(prefix="orochi-trace-bench-")
    run_dir = os.path.join(work, "run")
    g = spec_bench.Group(a.bin_dir, a.model, run_dir, a.workers, 1, specs, a.coord_opts.split())
    env = dict(os.environ, OROCHI_BIN_DIR=a.bin_dir)
    launch = os.path.join(ROOT, "deploy", "orochi-launch")
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    rows, last_trace = [], None
    clients = Clients(g, a.clients, a.max_tokens)
    try:
        time.sleep(2)  # warm-up: every client has a request in flight
        print("%-6s %-6s %10s %8s %10s %12s %6s" % ("round", "trace", "tok/s", "reqs", "MB",
                                                   "events/s", "load"))
        for r in range(a.rounds):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                out = os.path.join(work, "trace-%d.json" % r)
                proc = None
                if on:
                    proc = subprocess.Popen([launch, "trace", "--run-dir", run_dir, "--seconds",
                                             str(a.seconds), "--out", out], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                            text=True)
                    time.sleep(0.15)  # the coordinator picks the request up within 100 ms
                t0 = time.time()
                time.sleep(a.seconds)
                t1 = time.time()
                tok = clients.tokens(t0, t1)
                n_req = sum(1 for t, _ in clients.done if t0 <= t < t1)
                size = events = 0
                if proc:
                    _, err = proc.communicate(timeout=120)
                    if proc.returncode != 0:
                        sys.exit("trace_overhead: the trace failed: %s" % err.strip())
                    size = os.path.getsize(out)
                    with open(out) as f:
                        events = len(json.load(f)["traceEvents"])
                    last_trace = out
                row = {"bench": "trace_overhead", "round": r, "trace": on, "seconds": t1 - t0,
                       "tokens": tok, "tok_s": tok / (t1 - t0), "requests": n_req,
                       "trace_bytes": size, "events_per_s": events / (t1 - t0) if on else 0,
                       "clients": a.clients, "workers": a.workers, "speculators": specs,
                       "model": os.path.basename(a.model), "load_avg_1m": loadavg()}
                rows.append(row)
                with open(a.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print("%-6d %-6s %10.1f %8d %10.2f %12.0f %6.2f" % (
                    r, "on" if on else "off", row["tok_s"], n_req, size / 1e6,
                    row["events_per_s"], row["load_avg_1m"]), flush=True)
    finally:
        clients.end()
        g.down()
    off = sum(x["tokens"] for x in rows if not x["trace"]) / sum(x["seconds"] for x in rows
                                                                 if not x["trace"])
    on = sum(x["tokens"] for x in rows if x["trace"]) / sum(x["seconds"] for x in rows if x["trace"])
    print("tracing on / off: %.1f / %.1f tok/s = %.3f (%d clients, %d errors)" % (
        on, off, on / off if off else 0, a.clients, clients.errors))
    if a.plot and last_trace:
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "trace_tool.py"), "plot",
                        last_trace, a.plot, "--window-ms", str(a.plot_ms)], check=True)
        print("timeline: %s (from %s)" % (a.plot, last_trace))


if __name__ == "__main__":
    main()
