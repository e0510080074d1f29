"""Partition plans in a running group (the plan's "partition": docs/speculation.md, "The plan").

- 4 CPU workers on the default model (3 KV heads: more workers than heads) under an uneven plan,
  0.1/0.2/0.3/0.4 for every linear kind, with each head's dense (prefix) and sparse (tree)
  attention on different workers (merged by online softmax), speculating with ngram: greedy
  answers equal `orochi run --temp 0` token for token, and every worker reports its part;
- the plan file rewritten while requests are being answered back to back: the coordinator sends
  a Reconfigure, the workers apply it at a step boundary inside a request (their logs say when),
  and every answer, before, across and after the swap, equals `orochi run` token for token;
- a Megatron-style plan (the second linear of each pair by input columns, partial sums reduced
  through the arena) on 3 workers with uneven reduce shares: the same tokens as `orochi run`;
- refusals: 4 workers without a partition, an unknown style, a partition whose part count differs from the group's,
  a negative share: the group does not start and the coordinator's log says why.
"""
import calendar
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

BUCKETS = [{"ctx": 100000, "width": 6, "length": 4, "speculate": True}]
UNEVEN = {"parts": 4, "all": [0.1, 0.2, 0.3, 0.4],
          "attention_dense": [0.4, 0.3, 0.2, 0.1], "attention_sparse": [0.1, 0.2, 0.3, 0.4]}
PROMPTS = ["Write a Python function that adds two numbers.",
           "Summarize: the cat sat on the mat. The cat sat on the mat again."]


def model_or_skip():
    m = G.default_model()
    if not m:
        raise G.Skip("the default model is absent (make models)")
    return m


def write_plan(path, partition):
    plan = {"orochi_plan": 1, "buckets": BUCKETS}
    if partition is not None:
        plan["partition"] = partition
    with open(path + ".tmp", "w") as f:
        json.dump(plan, f)
    os.replace(path + ".tmp", path)


@t.case
def uneven_plan_on_four_workers_equals_run():
    model = model_or_skip()
    plan = os.path.join(G.env()["tmp"], "plan-part-%d.json" % os.getpid())
    write_plan(plan, UNEVEN)
    with G.Group("part4", model, workers=4, speculators=["ngram"], extra=["--plan", plan]) as g:
        for p in PROMPTS:
            G.check_eq(g.ids(p, max_tokens=48), G.run_ids(model, p, 48), "token ids under the plan for %r" % p)
        for i in range(4):
            G.check("joined: part %d of 4" % i in g.log("worker-%d" % i), "worker-%d's log:\n%s", i,
                    g.log("worker-%d" % i)[-2000:])
        G.check("partition (generation 1): qkv 0.1/0.2/0.3/0.4" in g.log("coordinator"),
                "the coordinator does not report the partition:\n%s", g.log("coordinator")[-3000:])


@t.case
def megatron_plan_equals_run():
    model = model_or_skip()
    plan = os.path.join(G.env()["tmp"], "plan-megatron-%d.json" % os.getpid())
    write_plan(plan, {"parts": 3, "style": "megatron", "qkv": [1, 1, 1], "all": [0.2, 0.3, 0.5]})
    with G.Group("partmeg", model, workers=3, speculators=["ngram"], extra=["--plan", plan]) as g:
        for p in PROMPTS:
            G.check_eq(g.ids(p, max_tokens=48), G.run_ids(model, p, 48), "token ids under megatron for %r" % p)
        G.check("partition (generation 1), megatron:" in g.log("coordinator"),
                "the coordinator does not report the megatron partition:\n%s", g.log("coordinator")[-3000:])


def applied_at(log, gen):
    """When a worker's log says it applied partition generation `gen` (seconds since the epoch)."""
    for line in log.splitlines():
        if "partition generation %d applied" % gen in line:
            stamp = line.split(" ", 1)[0]
            return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) + float(stamp[19:23])
    return None


@t.case
def plan_swapped_mid_request_keeps_the_output():
    model = model_or_skip()
    plan = os.path.join(G.env()["tmp"], "plan-swap-%d.json" % os.getpid())
    write_plan(plan, UNEVEN)
    n = 96
    refs = {p: G.run_ids(model, p, n) for p in PROMPTS}
    with G.Group("partswap", model, workers=4, speculators=["ngram"], extra=["--plan", plan]) as g:
        spans, stop, failures = [], threading.Event(), []

        def ask():  # requests back to back, so the swap lands inside one
            k = 0
            while not stop.is_set() and k < 200:
                p = PROMPTS[k % len(PROMPTS)]
                t0 = time.time()
                got = g.ids(p, max_tokens=n)
                spans.append((t0, time.time()))
                if got != refs[p]:
                    failures.append((p, got))
                k += 1

        th = threading.Thread(target=ask)
        th.start()
        time.sleep(1.0)  # requests are being answered (and the plan file gets a new mtime)
        write_plan(plan, {"parts": 4, "all": [0.4, 0.3, 0.2, 0.1], "attention_sparse": [0, 0, 1, 1]})
        try:
            g.wait_log("coordinator", "partition (generation 2)", timeout=30)
            for i in range(4):
                g.wait_log("worker-%d" % i, "partition generation 2 applied", timeout=30)
            # a request started after the swap must finish too (slow builds take seconds for one)
            at = applied_at(g.log("worker-0"), 2)
            deadline = time.time() + 120
            while not any(a > at for a, b in spans) and time.time() < deadline and th.is_alive():
                time.sleep(0.2)
        finally:
            stop.set()
            th.join(timeout=300)
        G.check(not th.is_alive(), "the requests did not finish")
        G.check(not failures, "token ids differ from orochi run across the swap: %r", failures[:2])
        at = applied_at(g.log("worker-0"), 2)
        G.check(at is not None, "no time for the swap in worker-0's log")
        G.check(any(a - 0.05 <= at <= b + 0.05 for a, b in spans),
                "the swap at %.3f fell between requests %r", at, spans)
        G.check(sum(1 for a, b in spans if a > at) >= 1, "no request ran after the swap")
        G.log("  %d requests, all equal to orochi run; the swap at +%.2fs landed inside one" %
              (len(spans), at - spans[0][0]))


@t.case
def bad_partitions_are_refused():
    model = model_or_skip()
    tmp = G.env()["tmp"]
    cases = [
        (4, None, "the even split takes at most 3"),  # with --kv-dup off (below)
        (2, {"parts": 2, "style": "tensor"}, 'the partition\'s "style" must be "hcmp" or "megatron"'),
        (2, {"parts": 3, "all": [1, 1, 1]}, '"partition" needs "parts": the group\'s worker count (2)'),
        (2, {"parts": 2, "wo": [1, -1]}, "the wo share of part 1 is -1"),
        (2, {"parts": 2, "qkv": [1]}, "the partition's qkv shares must be 2 numbers"),
    ]
    for k, (workers, part, want) in enumerate(cases):
        plan = os.path.join(tmp, "plan-badpart-%d-%d.json" % (os.getpid(), k))
        write_plan(plan, part)
        extra = ["--plan", plan] + (["--kv-dup", "off"] if part is None else [])
        g = G.Group("partbad%d" % k, model, workers=workers, extra=extra)
        r = g.launch(*g.up_args(), timeout=60, check=False)
        g.down()
        said = r.stdout + r.stderr + g.log("coordinator")
        G.check(r.returncode != 0, "case %d: a group with a bad partition started", k)
        G.check(want in said, "case %d: the refusal does not say %r:\n%s", k, want, said[-3000:])


if __name__ == "__main__":
    t.main()
