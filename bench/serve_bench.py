#!/usr/bin/env python3
"""bench/serve_bench.py — many users at once: an orochi group against llama-server, same file.

Each server gets the same load in the same run, rounds interleaved: --concurrency N client threads,
each sending streamed greedy chat completions (the prompts of --prompts, or completions of random
text with --completions) one after the other until --requests are answered. Per server and level:

  tok/s      completion tokens of all answers / wall time from the first request to the last answer
  ttft       time to the first streamed content (p50, p95 over the requests)
  itl        a request's mean time per token after its first: (last - first content) / (tokens - 1)
             (p50, p95 over the requests)
  gap        the longest wait between two content chunks of a request (p50, p95 over the requests):
             what a reader of the stream sees as a stall
  latency    the whole answer (p50, p95)

--long-prompt T adds, once the clients run, one request whose prompt is T tokens long (random
words), and reports the others' gap and itl while it is in flight next to the same figures of a
round without it: what a long prompt arriving costs the requests already decoding.

Servers: "orochi" (deploy/orochi-launch: --workers W x --threads-per-worker, --speculator ...,
--extra coordinator options) and, with --llama-server BIN, llama.cpp's llama-server started as
`llama-server -m FILE -t THREADS -np N -c CTX*N --cont-batching` (N: --peer-slots, default the
clients, like the group's slots; the group gets `--max-batch` = the clients, and a prompt step
as wide past 16, unless --group-defaults leaves both at the group's defaults). --configs names
more orochi groups, e.g. "plain=,ngram=ngram"; a spec beginning with "--" is a coordinator option
of that group ("noshare=--prefix-share=off"). --system-words N begins every request with the same
N words (a shared system prompt). Results: a table (with the peak of /dev/shm above its level
before each load: an orochi group's K/V pages as written; the group's K/V gauges go to the JSON),
JSON lines (--json), every answer checked to be complete (finish_reason stop or length). The load
average is printed before every round.

Example (the 1B shape, 32 users, 2 threads each side):
  python3 bench/serve_bench.py --model shape-1b.Q4_K_M.gguf --completions --concurrency 32 \\
      --requests 64 --max-tokens 64 --threads 2 --llama-server /tmp/llama.cpp/build/bin/llama-server
"""
import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spec_bench import Group, closed_loop_run, free_port, load_prompts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def stream(port, path, body, timeout=900):
    """POST a streamed request; returns (times of the chunks that brought tokens, completion tokens,
    finish reason, wall seconds). The usage is asked for (stream_options.include_usage)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.time()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:300]))
    times, tokens, finish = [], None, None
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            tokens = ev["usage"].get("completion_tokens")
        for ch in ev.get("choices") or []:
            piece = (ch.get("delta") or {}).get("content") if "delta" in ch else ch.get("text")
            # a chunk of text, or of a token without text yet (llama-server sends one per token,
            # empty while a character's bytes are incomplete): tokens arrived
            if piece or not ch.get("finish_reason"):
                times.append(time.time() - t0)
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    conn.close()
    return times, tokens, finish, time.time() - t0


class LlamaServer:
    def __init__(self, binary, model, threads, slots, ctx):
        self.port = free_port()
        self.proc = subprocess.Popen([binary, "-m", model, "-t", str(threads), "-tb", str(threads),
                                      "-np", str(slots), "-c", str(ctx * slots), "--cont-batching",
                                      "--port", str(self.port), "--host", "127.0.0.1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("llama-server exited (%d)" % self.proc.returncode)
            time.sleep(0.5)
        raise RuntimeError("llama-server did not come up")

    def down(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def random_text(rng, words):
    vocab = ("time year people way day man thing woman life child world school state family student "
             "group country problem hand part place case week company system program question work "
             "government number night point home water room mother area money story fact month lot "
             "right study book eye job word business issue side kind head house service friend").split()
    return " ".join(rng.choice(vocab) for _ in range(words))


def load(port, jobs, n_clients, a, long_job=None):
    """Closed loop: n_clients threads take the next job as soon as their last answer is back.
    Returns (per-request records, wall seconds, the long request's record or None)."""
    path = "/v1/completions" if a.completions else "/v1/chat/completions"

    def body(prompt, n):
        b = {"max_tokens": n, "temperature": 0}
        if a.completions:
            b["prompt"] = (a.system_text + "\n" if a.system_text else "") + prompt
        else:
            b["messages"] = ([{"role": "system", "content": a.system_text}] if a.system_text else []) + \
                [{"role": "user", "content": prompt}]
        return b

    def one(i):
        t_start = time.time()
        try:
            times, tokens, finish, wall = stream(port, path, body(jobs[i], a.max_tokens))
        except (OSError, RuntimeError, ValueError) as e:  # counted as failed, the reason shown
            print("request %d: %s" % (i, e), file=sys.stderr)
            return None
        return dict(start=t_start, times=times, tokens=tokens, finish=finish, wall=wall)

    long_rec = []

    def long_client():
        time.sleep(a.long_delay)
        t_start = time.time()
        times, tokens, finish, wall = stream(port, path, body(long_job, 1))
        long_rec.append(dict(start=t_start, end=t_start + wall, ttft=times[0] if times else wall))

    res, wall = closed_loop_run(len(jobs), n_clients, one, [long_client] if long_job else [])
    return res, wall, (long_rec[0] if long_rec else None)


class ShmPeak:
    """The most /dev/shm held above what it held when sampling began, sampled every 20 ms while
    a load runs (one server at a time: the orochi group's arena pages as its requests write
    them)."""

    def __init__(self):
        self.base = self.used()
        self.peak = 0
        self.stop = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    @staticmethod
    def used():
        st = os.statvfs("/dev/shm")
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def run(self):
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, self.used() - self.base)

    def done(self):
        self.stop.set()
        self.th.join()
        return self.peak


def summarize(res, wall, window=None):
    """The figures of one load; with window (start, end), gap and itl only of the requests
    streaming during it (their chunks inside it)."""
    bad = [r for r in res if r is None or r["finish"] not in ("stop", "length") or not r["times"]]
    ok = [r for r in res if r not in bad]
    toks = sum(r["tokens"] or len(r["times"]) for r in ok)
    ttft = [r["times"][0] for r in ok]
    itl, gaps = [], []
    for r in ok:
        ts = [r["start"] + t for t in r["times"]]
        if window:
            ts = [t for t in ts if window[0] <= t <= window[1]]
        n = r["tokens"] or len(r["times"])
        if len(ts) >= 2:
            gaps.append(max(b - a for a, b in zip(ts, ts[1:])))
            if not window and n > 1:
                itl.append((ts[-1] - ts[0]) / (n - 1))
            elif window:
                itl.append(statistics.mean(b - a for a, b in zip(ts, ts[1:])))
    lat = [r["wall"] for r in ok]
    return dict(requests=len(res), failed=len(bad), tokens=toks, tok_s=toks / wall if wall else 0,
                ttft_p50=pct(ttft, .5), ttft_p95=pct(ttft, .95), itl_p50=pct(itl, .5), itl_p95=pct(itl, .95),
                gap_p50=pct(gaps, .5), gap_p95=pct(gaps, .95), lat_p50=pct(lat, .5), lat_p95=pct(lat, .95))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--threads", type=int, default=2, help="threads of each server")
    ap.add_argument("--workers", type=int, default=1, help="orochi workers (threads split among them)")
    ap.add_argument("--configs", default="orochi=", help="orochi groups: NAME=SPEC[+SPEC...] comma list")
    ap.add_argument("--extra", default="", help="coordinator options of every orochi group")
    ap.add_argument("--group-defaults", action="store_true",
                    help="orochi groups with their own sequence slots and prompt step width "
                         "(--max-batch auto, --prefill-width 12) instead of one slot per client")
    ap.add_argument("--llama-server", default="", help="llama-server binary (none: orochi only)")
    ap.add_argument("--peer-slots", type=int, default=0, help="llama-server -np (default: the clients)")
    ap.add_argument("--concurrency", default="8", help="clients, e.g. 8,32 (each level in every round)")
    ap.add_argument("--requests", type=int, default=0, help="answers per level (default 2 x clients)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--completions", action="store_true", help="/v1/completions of random text")
    ap.add_argument("--prompts", default=os.path.join(ROOT, "bench", "prompts.jsonl"))
    ap.add_argument("--ctx", type=int, default=0, help="context per request (default: what the prompts need)")
    ap.add_argument("--long-prompt", type=int, default=0, help="words of one long prompt sent into the load")
    ap.add_argument("--long-delay", type=float, default=0.3, help="seconds into the load it is sent")
    ap.add_argument("--system-words", type=int, default=0,
                    help="every request begins with the same N words (a chat's system message; a "
                         "completion's first line): a common beginning, as many users of one app send")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    rng = random.Random(7)
    if a.completions:
        pool = [random_text(rng, 24) for _ in range(64)]
    else:
        pool = [p["prompt"] for p in load_prompts(a.prompts, 99)]
    a.system_text = random_text(random.Random(11), a.system_words) if a.system_words else ""
    ctx = a.ctx or (a.max_tokens + 256 + (a.long_prompt * 2 if a.long_prompt else 0) + 2 * a.system_words)
    long_job = random_text(rng, a.long_prompt) if a.long_prompt else None
    servers = []
    opts = {}  # per orochi group: the coordinator options among its specs (--opt=value)
    for spec in a.configs.split(","):
        name, _, sp = spec.partition("=")
        name = "orochi" if name == "" else name
        items = [s for s in sp.split("+") if s]
        servers.append((name, [s for s in items if not s.startswith("--")]))
        opts[name] = [s for s in items if s.startswith("--")]
    if a.llama_server:
        servers.append(("llama-server", None))
    out = open(a.json, "a") if a.json else None
    rows = []
    for rnd in range(a.rounds):
        order = servers if rnd % 2 == 0 else servers[::-1]
        for name, specs in order:
            n_max = max(levels)
            if specs is None:
                srv = LlamaServer(a.llama_server, a.model, a.threads, a.peer_slots or n_max, ctx)
                port = srv.port
            else:
                # the group's sequence slots: as many as the clients, up to its most (RT_MAX_SEQ,
                # 64; --max-batch auto would give 64 here), and a prompt's steps as wide as the
                # slots past 16 (more prompt rows a step: the measurements of docs/performance.md)
                slots = min(n_max, 64)
                extra = ["--n-ctx", str(ctx)]
                if not a.group_defaults:
                    extra += ["--max-batch", str(slots)]
                    if slots > 16:
                        extra += ["--prefill-width", str(slots)]
                extra += a.extra.split() + opts[name]
                srv = Group(a.bin_dir, a.model, "/tmp/orochi-serve-%s-r%d" % (name, rnd), a.workers,
                            max(1, a.threads // a.workers), specs, extra)
                port = srv.port
            try:
                stream(port, "/v1/completions" if a.completions else "/v1/chat/completions",
                       {"max_tokens": 4, "temperature": 0, **({"prompt": "warm up"} if a.completions else
                                                                {"messages": [{"role": "user", "content": "hi"}]})})
                for n in levels:
                    jobs = [pool[i % len(pool)] for i in range(a.requests or 2 * n)]
                    load_avg = os.getloadavg()[0]
                    shm = ShmPeak()
                    res, wall, _ = load(port, jobs, n, a)
                    row = dict(bench="serve", round=rnd + 1, server=name, clients=n, load=load_avg,
                               shm_peak=shm.done(), system_words=a.system_words, **summarize(res, wall))
                    if specs is not None:  # the group's own K/V gauges after the load
                        body = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                        body.request("GET", "/metrics")
                        text = body.getresponse().read().decode()
                        for g in ("orochi_kv_bytes_held", "orochi_kv_bytes_lent"):
                            m = re.search(r"^%s (\d+)$" % g, text, re.M)
                            row[g[len("orochi_"):]] = int(m.group(1)) if m else None
                    if long_job:
                        res2, wall2, lr = load(port, jobs, n, a, long_job)
                        w = (lr["start"], lr["start"] + lr["ttft"]) if lr else None
                        s2 = summarize(res2, wall2, w)
                        row.update(long_words=a.long_prompt, long_ttft=lr["ttft"] if lr else None,
                                   during_gap_p95=s2["gap_p95"], during_itl_p95=s2["itl_p95"],
                                   during_failed=s2["failed"])
                    rows.append(row)
                    if out:
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                    print("round %d %-14s %3d clients: %7.1f tok/s, ttft p50/p95 %.3f/%.3f s, itl %.1f/%.1f ms, "
                          "latency p95 %.2f s, /dev/shm peak +%.1f MB, failed %d (load %.2f)"
                          % (rnd + 1, name, n, row["tok_s"], row["ttft_p50"], row["ttft_p95"], 1e3 * row["itl_p50"],
                             1e3 * row["itl_p95"], row["lat_p95"], row["shm_peak"] / 1e6, row["failed"], load_avg),
                          file=sys.stderr)
            finally:
                srv.down()
    print("\n%-14s %7s %9s %9s %9s %9s %9s %9s %9s %9s" % ("server", "clients", "tok/s", "ttft p50", "ttft p95",
                                                             "itl p50", "itl p95", "gap p95", "lat p95", "shm peak"))
    failed = 0
    for name, _ in servers:
        for n in levels:
            rs = [r for r in rows if r["server"] == name and r["clients"] == n]
            med = lambda k: statistics.median(r[k] for r in rs)  # noqa: E731
            failed += sum(r["failed"] for r in rs)
            print("%-14s %7d %9.1f %8.3fs %8.3fs %7.1fms %7.1fms %7.1fms %8.2fs %7.1fMB"
                  % (name, n, med("tok_s"), med("ttft_p50"), med("ttft_p95"), 1e3 * med("itl_p50"),
                     1e3 * med("itl_p95"), 1e3 * med("gap_p95"), med("lat_p95"), med("shm_peak") / 1e6))
            if long_job:
                print("%-14s %7s a %d-word prompt in flight: others' gap p95 %.1f ms, itl p95 %.1f ms "
                      "(without: %.1f, %.1f ms)" % ("", "", a.long_prompt, 1e3 * med("during_gap_p95"),
                                                   1e3 * med("during_itl_p95"), 1e3 * med("gap_p95"),
                                                   1e3 * med("itl_p95")))
    if len(servers) > 1:
        base = servers[-1][0]
        for name, _ in servers[:-1]:
            for n in levels:
                ours = statistics.median(r["tok_s"] for r in rows if r["server"] == name and r["clients"] == n)
                theirs = statistics.median(r["tok_s"] for r in rows if r["server"] == base and r["clients"] == n)
                print("%s / %s at %d clients: %.2fx tok/s" % (name, base, n, ours / theirs if theirs else 0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
