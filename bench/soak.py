#!/usr/bin/env python3
"""bench/soak.py — a chaos soak: many clients against one group while its processes are killed.

A group (deploy/orochi-launch: CPU workers and speculators) serves N concurrent clients for
--minutes while a chaos thread, every --kill-every seconds, picks a worker or speculator at random
and either SIGKILLs it or SIGSTOPs it for 0.5-3 s. Clients send completions of a fixed prompt set,
streaming and not, greedy and sampled with a seed, round-robin, each over one connection that it
keeps alive across requests as API clients do (--no-keep-alive: one connection per request, which
costs the server a thread each). At the end it reports and checks:

  lost        requests that did not complete with 200 (errors, resets, timeouts)
  mismatched  completed greedy answers that differ from `orochi run --temp 0` (token ids; streams
              by their text, taken from the undisturbed group before the chaos starts). Sampled
              answers are checked for completion only: with a seed they repeat on a calm group,
              but speculative sampling consumes its random stream along the drafts it is given,
              and which drafts arrive in time depends on load and batching (the count of sampled
              answers that differ from the calm group's is reported as `sampled differ`).
  rss         coordinator memory after warm-up (the first --warmup fraction of the run) and at the
              end: growth in percent of its private resident set (RssAnon: heap and stacks, where
              a leak or allocator retention shows), which the check judges; the whole VmRSS and the
              resident pages of the arena (RssShmem) are reported beside it. The arena is a
              fixed-size shared mapping whose pages become resident in the coordinator as it first
              reads them (wider batches, more sequence slots), so VmRSS can rise by megabytes that
              are neither allocated nor leaked
  leaks       processes of the group still alive after `down`, and the group's shared-memory
              arena (named in RUN_DIR/arena, or in the coordinator's log) left in /dev/shm

Output: a summary table on stdout and one JSON line appended to --json. The exit status is 1 when
anything was lost, mismatched or leaked, or the private RSS grew by more than --max-rss-growth
percent.
`make soak` runs 10 minutes with 8 clients; the ctest `integration_soak` runs a 1-minute version.
"""
import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "integration"))
import spec_bench  # noqa: E402  (Group, free_port: the group helpers)
import group as G  # noqa: E402  (parse_status, pid_alive, sse_events)

ROOT = spec_bench.ROOT
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, there was a little",
    "List three colors:",
    "The meeting was moved to Tuesday. The meeting was moved to Tuesday because",
    "Water boils at",
]
SEEDS = (1, 2)


def log(msg):
    print("soak: %s" % msg, flush=True)


def request(port, body, stream, timeout):
    """POST /v1/completions; (status, token ids or None, text). Streams are read to the end (a
    stream without its [DONE] counts as status 599)."""
    if stream:
        try:
            events, done = G.sse_events("http://127.0.0.1:%d/v1/completions" % port,
                                        dict(body, stream=True), timeout)
        except urllib.error.HTTPError as exc:
            return exc.code, None, ""
        if any("error" in ev for ev in events):
            return 500, None, ""
        text = "".join(c.get("text", "") for ev in events for c in ev.get("choices", []))
        return (200 if done else 599), None, text
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            r.read()
            return r.status, None, ""
        j = json.loads(r.read())
        return 200, j.get("orochi", {}).get("token_ids"), j["choices"][0]["text"]
    finally:
        conn.close()


class KeptConnection:
    """One client's HTTP/1.1 connection, kept alive from request to request as API clients keep
    theirs (the official openai client pools them); opened again after any failure or when the
    server closes it. post() answers like request()."""

    def __init__(self, port, timeout):
        self.port, self.timeout, self.conn = port, timeout, None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def post(self, body, stream):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            self.conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=stream)),
                              {"Content-Type": "application/json"})
            r = self.conn.getresponse()
            answer = self.read(r, stream)
        except BaseException:
            self.close()
            raise
        if r.will_close:  # the server said Connection: close
            self.close()
        return answer

    @staticmethod
    def read(r, stream):
        if r.status != 200:
            r.read()
            return r.status, None, ""
        if not stream:
            j = json.loads(r.read())
            return 200, j.get("orochi", {}).get("token_ids"), j["choices"][0]["text"]
        ctype = r.getheader("Content-Type", "")
        if "text/event-stream" not in ctype:
            raise AssertionError("streaming answer has Content-Type %r" % ctype)
        text, done, error = [], False, False
        while True:  # to the end of the body (past [DONE]), so the connection can be reused
            raw = r.readline()
            if not raw:
                break
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                continue
            ev = json.loads(payload)
            error = error or "error" in ev
            text.extend(c.get("text", "") for c in ev.get("choices", []))
        if error:
            return 500, None, ""
        return (200 if done else 599), None, "".join(text)


def run_ids(bin_dir, model, prompt, n):
    out = subprocess.run([os.path.join(bin_dir, "orochi"), "run", "--model", model, "--prompt",
                          prompt, "-n", str(n), "--temp", "0", "--print-ids"],
                         capture_output=True, text=True, timeout=300, check=True)
    return [int(x) for x in out.stdout.split()]


def rss_kb(pid):
    """(VmRSS, RssAnon, RssShmem) in kB, or None: the whole resident set, its private part (heap,
    stacks: what a leak or allocator retention grows) and the resident pages of shared memory
    (the group's arena, a fixed-size mapping whose pages become resident as they are first read)."""
    got = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                k = line.split(":")[0]
                if k in ("VmRSS", "RssAnon", "RssShmem"):
                    got[k] = int(line.split()[1])
    except OSError:
        pass
    if "VmRSS" not in got:
        return None
    return got["VmRSS"], got.get("RssAnon", got["VmRSS"]), got.get("RssShmem", 0)


def arena_names(run_dir):
    """The group's arena names: RUN_DIR/arena (the launcher writes it), else every arena the
    coordinator's log announced."""
    names = set()
    try:
        with open(os.path.join(run_dir, "arena")) as f:
            names.add(f.readline().strip())
    except OSError:
        pass
    try:
        with open(os.path.join(run_dir, "logs", "coordinator.log"), errors="replace") as f:
            for line in f:
                i = line.find("arena /orochi-")
                if i >= 0:
                    names.add(line[i + 6:].split()[0])
    except OSError:
        pass
    return {n for n in names if n.startswith("/orochi-")}


class Soak:
    def __init__(self, a):
        self.a = a
        self.lock = threading.Lock()
        self.ok = self.lost = self.mismatched = self.sampled_differ = 0
        self.by_mode = {}
        self.failures = []
        self.actions = []
        self.rss = []  # (t, VmRSS kB, RssAnon kB, RssShmem kB)
        self.pids = set()
        self.arenas = set()
        self.stop = threading.Event()

    def note(self, kind, detail):
        with self.lock:
            if len(self.failures) < 20:
                self.failures.append("%s: %s" % (kind, detail))

    def count(self, mode, field):
        with self.lock:
            setattr(self, field, getattr(self, field) + 1)
            self.by_mode.setdefault(mode, {"ok": 0, "lost": 0, "mismatched": 0})[field] += 1

    def references(self, g):
        """{(prompt, seed or None): (ids, text)}: greedy from orochi run (the calm group must agree;
        its text is the streams' reference), sampled from the calm group."""
        a, refs = self.a, {}
        for p in PROMPTS:
            want = run_ids(a.bin_dir, a.model, p, a.max_tokens)
            st, ids, text = request(g.port, {"prompt": p, "max_tokens": a.max_tokens,
                                             "temperature": 0}, False, 300)
            if st != 200 or ids != want:
                raise SystemExit("soak: the undisturbed group does not give orochi run's ids for "
                                 "%r (status %d): %r vs %r" % (p, st, ids, want))
            refs[(p, None)] = (want, text)
            for s in SEEDS:
                body = {"prompt": p, "max_tokens": a.max_tokens, "temperature": 0.8, "seed": s}
                st, ids, text = request(g.port, body, False, 300)
                refs[(p, s)] = (ids, text)
        return refs

    def client(self, idx, port, refs, deadline):
        rng = random.Random(self.a.seed * 1000 + idx)
        i = idx
        kept = KeptConnection(port, self.a.timeout) if self.a.keep_alive else None
        while time.time() < deadline:
            p = PROMPTS[i % len(PROMPTS)]
            seed = None if (i // len(PROMPTS)) % 3 == 0 else SEEDS[i % len(SEEDS)]
            stream = rng.random() < 0.5
            i += 1
            mode = "%s %s" % ("greedy" if seed is None else "sampled", "stream" if stream else "json")
            body = {"prompt": p, "max_tokens": self.a.max_tokens,
                    "temperature": 0 if seed is None else 0.8}
            if seed is not None:
                body["seed"] = seed
            try:
                st, ids, text = (kept.post(body, stream) if kept
                                 else request(port, body, stream, self.a.timeout))
            except (OSError, http.client.HTTPException, ValueError, AssertionError) as exc:
                self.count(mode, "lost")
                self.note("lost", "%s %r: %s" % (mode, p[:30], exc))
                continue
            if st != 200:
                self.count(mode, "lost")
                self.note("lost", "%s %r: status %d" % (mode, p[:30], st))
                continue
            want_ids, want_text = refs[(p, seed)]
            same = text == want_text if stream else ids == want_ids
            if seed is not None:
                self.count(mode, "ok")
                with self.lock:
                    self.sampled_differ += not same
            elif same:
                self.count(mode, "ok")
            else:
                self.count(mode, "mismatched")
                self.note("mismatch", "%s %r: got %r want %r" % (mode, p[:30], (ids, text)[stream],
                                                                (want_ids, want_text)[stream]))

    def chaos(self, g, deadline):
        rng = random.Random(self.a.seed)
        while not self.stop.wait(self.a.kill_every) and time.time() < deadline:
            st = {r: v for r, v in g_status(g).items() if r != "coordinator" and v["pid"]}
            if not st:
                continue
            role = rng.choice(sorted(st))
            pid = st[role]["pid"]
            self.pids.add(pid)
            try:
                if rng.random() < 0.5:
                    os.kill(pid, signal.SIGKILL)
                    self.actions.append(("kill", role))
                else:
                    os.kill(pid, signal.SIGSTOP)
                    time.sleep(rng.uniform(0.5, 3.0))
                    os.kill(pid, signal.SIGCONT)
                    self.actions.append(("stop", role))
            except ProcessLookupError:
                continue
            log("%s %s (pid %d)" % (self.actions[-1][0], role, pid))

    def sample_rss(self, g):
        t0 = time.time()
        while not self.stop.wait(2.0):
            try:
                with open(os.path.join(g.run_dir, "coordinator.pid")) as f:
                    pid = int(f.read().strip())
            except (OSError, ValueError):
                continue
            self.pids.add(pid)
            kb = rss_kb(pid)
            if kb:
                self.rss.append((time.time() - t0,) + kb)
            self.arenas |= arena_names(g.run_dir)


def g_status(g):
    try:
        with open(os.path.join(g.run_dir, "status")) as f:
            return G.parse_status(f.read().splitlines())
    except OSError:
        return {}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--kill-every", type=float, default=5.0, help="seconds between chaos actions")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker")
    ap.add_argument("--speculators", default="ngram,layerskip", help="comma list ('' for none)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take")
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of the run before RSS counts")
    ap.add_argument("--max-rss-growth", type=float, default=1.0, help="percent allowed after warm-up")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep-alive", action=argparse.BooleanOptionalAction, default=True,
                    help="each client keeps one connection across requests (--no-keep-alive: a "
                         "new connection per request, a new server thread each)")
    ap.add_argument("--run-dir", default="/tmp/orochi-soak")
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "soak.jsonl"))
    a = ap.parse_args()
    specs = [s for s in a.speculators.split(",") if s]
    soak = Soak(a)
    log("group: %d workers x %d threads, speculators %s, model %s" % (
        a.workers, a.threads, specs or "none", os.path.basename(a.model)))
    g = spec_bench.Group(a.bin_dir, a.model, a.run_dir, a.workers, a.threads, specs, [])
    try:
        refs = soak.references(g)
        log("references ready (%d prompts, greedy and %d seeds); %d clients for %.1f min, "
            "an action every %.1f s" % (len(PROMPTS), len(SEEDS), a.clients, a.minutes, a.kill_every))
        deadline = time.time() + a.minutes * 60
        threads = [threading.Thread(target=soak.client, args=(i, g.port, refs, deadline))
                   for i in range(a.clients)]
        helpers = [threading.Thread(target=soak.chaos, args=(g, deadline)),
                   threading.Thread(target=soak.sample_rss, args=(g,))]
        for t in threads + helpers:
            t.start()
        for t in threads:
            t.join()
        soak.stop.set()
        for t in helpers:
            t.join()
        for role, v in g_status(g).items():
            if v["pid"]:
                soak.pids.add(v["pid"])
        soak.arenas |= arena_names(g.run_dir)
    finally:
        g.down()
    time.sleep(1.0)
    alive = sorted(p for p in soak.pids if G.pid_alive(p))
    shm_left = sorted(n for n in soak.arenas if os.path.exists("/dev/shm" + n))
    warm_all = [r[1:] for r in soak.rss if r[0] >= a.warmup * a.minutes * 60]
    warm = [r[0] for r in warm_all]      # VmRSS
    anon = [r[1] for r in warm_all]      # RssAnon: what the check judges
    shmem = [r[2] for r in warm_all]
    growth_rss = 100.0 * (warm[-1] - warm[0]) / warm[0] if len(warm) >= 2 else 0.0
    growth = 100.0 * (anon[-1] - anon[0]) / anon[0] if len(anon) >= 2 and anon[0] else 0.0
    load = os.getloadavg()[0]
    kills = sum(1 for k, _ in soak.actions if k == "kill")
    stops = len(soak.actions) - kills
    print()
    print("mode                 ok  lost  mismatched")
    for mode, c in sorted(soak.by_mode.items()):
        print("%-18s %5d %5d %11d" % (mode, c["ok"], c["lost"], c["mismatched"]))
    print("all                %5d %5d %11d   (sampled differ from the calm group: %d)"
          % (soak.ok, soak.lost, soak.mismatched, soak.sampled_differ))
    print("chaos: %d SIGKILL, %d SIGSTOP; load average %.2f" % (kills, stops, load))
    print("coordinator after warm-up: private RSS (RssAnon) %s -> %s kB (%+.2f%%, the check); "
          "whole RSS %s -> %s kB (%+.2f%%), of which arena pages %s -> %s kB"
          % (anon[0] if anon else "?", anon[-1] if anon else "?", growth,
             warm[0] if warm else "?", warm[-1] if warm else "?", growth_rss,
             shmem[0] if shmem else "?", shmem[-1] if shmem else "?"))
    print("leaks: %d processes alive after down %s, %d shared-memory segments left %s"
          % (len(alive), alive, len(shm_left), shm_left))
    for f in soak.failures:
        print("  " + f)
    rec = {"minutes": a.minutes, "clients": a.clients, "kill_every": a.kill_every,
           "keep_alive": a.keep_alive,
           "speculators": specs, "ok": soak.ok, "lost": soak.lost, "mismatched": soak.mismatched,
           "sampled_differ": soak.sampled_differ,
           "kills": kills, "stops": stops, "rss_warm_kb": warm[0] if warm else None,
           "rss_end_kb": warm[-1] if warm else None, "rss_growth_pct": round(growth_rss, 3),
           "anon_warm_kb": anon[0] if anon else None, "anon_end_kb": anon[-1] if anon else None,
           "anon_growth_pct": round(growth, 3), "shmem_warm_kb": shmem[0] if shmem else None,
           "shmem_end_kb": shmem[-1] if shmem else None,
           "procs_left": alive, "shm_left": shm_left, "load1": round(load, 2),
           "by_mode": soak.by_mode, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "a") as f:
        f.write(json.dumps(rec) + "\n")
    bad = soak.lost or soak.mismatched or alive or shm_left or growth > a.max_rss_growth
    print("soak: %s" % ("FAILED" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
