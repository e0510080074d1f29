#!/usr/bin/env python3
"""bench/http_mutate.py — mutated HTTP bodies against a group, and the coordinator's RSS per pass.

Starts a group (deploy/orochi-launch, CPU workers, no speculators) and sends --passes passes of
--requests POSTs each, from --clients concurrent connections, to /v1/completions and /v1/chat/completions. Every body is a valid request
(max_tokens 1-2, so the model does little) put through one mutation, chosen by a seeded RNG:
bit flips, truncation, deep nesting (up to 100000 levels), NUL bytes inside strings, invalid
UTF-8, thousands of fields, huge numbers, wrong value types, duplicate keys, an empty body, or none
(the valid body). Each answer must be a 2xx or a 4xx with a JSON error body (a 5xx, a reset or a
timeout is a failure), and the group must still answer a plain request after every pass.

After each pass the coordinator's RSS (VmRSS) is read; the report gives RSS per pass and the
growth of the last pass over the first. The exit status is 1 on any failure or when that growth
exceeds --max-growth percent (default 5).
"""
import argparse
import http.client
import json
import os
import random
import sys
import threading
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import spec_bench  # noqa: E402  (Group: the group helpers)
import soak  # noqa: E402  (rss_kb)

ROOT = spec_bench.ROOT

VALID = [
    {"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0},
    {"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0.7, "seed": 3, "top_p": 0.9},
    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
     "max_tokens": 2, "stop": ["\n"], "temperature": 0},
]


def mutate(rng, body):
    """(path, bytes) of one mutated request."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    raw = json.dumps(body).encode()
    kind = rng.randrange(11)
    if kind == 0:  # bit flips
        b = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        raw = bytes(b)
    elif kind == 1:  # truncation
        raw = raw[:rng.randrange(len(raw))]
    elif kind == 2:  # deep nesting
        depth = rng.choice([100, 1000, 100000])
        raw = b'{"prompt": ' + b"[" * depth + b"1" + b"]" * depth + b', "max_tokens": 1}'
    elif kind == 3:  # NUL inside a string
        raw = raw.replace(b'": "', b'": "\\u0000', 1) if rng.random() < 0.5 else \
            raw.replace(b'": "', b'": "\x00', 1)
    elif kind == 4:  # invalid UTF-8
        raw = raw.replace(b'": "', b'": "\xff\xfe\xc3', 1)
    elif kind == 5:  # thousands of fields
        extra = {"f%d" % i: i for i in range(rng.choice([1000, 10000]))}
        raw = json.dumps(dict(body, **extra)).encode()
    elif kind == 6:  # huge and odd numbers
        k = rng.choice(["max_tokens", "temperature", "top_p", "seed", "top_k"])
        v = rng.choice(["1e308", "-1", "99999999999999999999", "NaN", "1.5", "-0"])
        raw = json.dumps(body).encode()[:-1] + (', "%s": %s}' % (k, v)).encode()
    elif kind == 7:  # wrong types
        k = rng.choice(list(body))
        raw = json.dumps(dict(body, **{k: rng.choice([None, [], {}, "x", 3, True])})).encode()
    elif kind == 8:  # duplicate keys
        raw = raw[:-1] + b', "max_tokens": 2, "max_tokens": "x"}'
    elif kind == 9:  # empty body
        raw = b""
    return path, raw


def post(port, path, raw, timeout):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, raw, {"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--requests", type=int, default=2000, help="requests per pass")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--clients", type=int, default=8, help="concurrent connections")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-growth", type=float, default=5.0, help="percent, last pass over first")
    ap.add_argument("--run-dir", default="/tmp/orochi-mutate")
    a = ap.parse_args()
    g = spec_bench.Group(a.bin_dir, a.model, a.run_dir, 2, 1, [], [])
    failures, rss, statuses = [], [], {}
    try:
        with open(os.path.join(a.run_dir, "coordinator.pid")) as f:
            cpid = int(f.read().strip())
        lock = threading.Lock()

        def client(p, c):
            rng = random.Random(a.seed * 100003 + p * 1009 + c)
            for i in range(c, a.requests, a.clients):
                path, raw = mutate(rng, VALID[i % len(VALID)])
                try:
                    st, body = post(g.port, path, raw, 60)
                except (OSError, http.client.HTTPException) as exc:
                    with lock:
                        failures.append("pass %d request %d: %s (%r)" % (p, i, exc, raw[:80]))
                    continue
                bad = None
                if st >= 500:
                    bad = "status %d (%r): %r" % (st, raw[:80], body[:200])
                elif st >= 400:
                    try:
                        json.loads(body)["error"]["message"]
                    except (ValueError, KeyError, TypeError):
                        bad = "%d without a JSON error: %r" % (st, body[:200])
                with lock:
                    statuses[st] = statuses.get(st, 0) + 1
                    if bad:
                        failures.append("pass %d request %d: %s" % (p, i, bad))

        for p in range(a.passes):
            t0 = time.time()
            threads = [threading.Thread(target=client, args=(p, c)) for c in range(a.clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            st, _ = post(g.port, "/v1/completions", json.dumps(VALID[0]).encode(), 60)
            if st != 200:
                failures.append("pass %d: a plain request afterwards got %d" % (p, st))
            rss.append(soak.rss_kb(cpid) or 0)
            print("pass %d: %d requests in %.1f s, coordinator RSS %d kB; statuses so far %s"
                  % (p + 1, a.requests, time.time() - t0, rss[-1], dict(sorted(statuses.items()))),
                  flush=True)
    finally:
        g.down()
    growth = 100.0 * (rss[-1] - rss[0]) / rss[0] if len(rss) >= 2 and rss[0] else 0.0
    print("RSS per pass (kB): %s; last over first %+.2f%% (limit %.1f%%)"
          % (" ".join(map(str, rss)), growth, a.max_growth))
    for f in failures[:20]:
        print("  FAIL " + f)
    bad = failures or growth > a.max_growth
    print("http_mutate: %s (%d failures)" % ("FAILED" if bad else "ok", len(failures)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
