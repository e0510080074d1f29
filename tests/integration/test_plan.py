"""ARCA: `orochi profile` writes a valid plan, and a group follows it.

- profile on the default model (layerskip + ngram, small settings): the plan file parses, has
  version 1, increasing buckets whose width is one of the profiled widths and whose tree fits the
  width, the step-time curve and per-category acceptance; the tables are printed;
- bad input: widths that do not start with 1, a missing prompt file, an unknown speculator kind
  exit 2 with one line naming the problem;
- a group started with `--plan` (guard on, as in production; the profile given the group's devices,
  so the plan also holds their partition, its devices and why) answers greedy requests exactly like
  `orochi run --temp 0`, shows the plan in its status, and picks up a rewritten plan without a
  restart; a plan whose tree shape is a chain keeps the output lossless; a plan that is not a
  plan, or whose tree is malformed, is refused at start with the reason;
- the profile's `--search-rounds N` stops its partition search after N rounds;
- `orochi bench --plans --search PLAN` puts a partition for two parts into a plan (its other keys
  kept), every kind's shares summing to 1, the devices it was found for and why they were chosen
  (the coordinator logs the reason), and a group of two workers following that plan answers
  exactly like `orochi run --temp 0`; the same partition marked as found for gpu,cpu is refused
  by a group of CPU workers, naming the worker.
- `orochi bench --plans --prompt P` times a P-token prompt (chunks of 64 from position 0) per plan
  on two CPU parts: one JSON line a plan with its tokens/s the prompt over its time, the table's
  line; --prompt 0, --prompt with --search, --search-rounds without --search and out of range
  are refused, naming the problem.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

PROFILE_ARGS = ["--widths", "1,2,4", "--ctx", "64,256", "--per-category", "1", "-n", "12",
                "--reps", "2", "--depth", "4", "--threads", "1"]


def model_or_skip():
    m = G.default_model()
    if not m:
        raise G.Skip("the default model is absent (make models)")
    return m


def profile(model, out, *extra):
    e = G.env()
    cmd = [e["bin"], "profile", "--model", model, "--out", out,
           "--prompts", os.path.join(e["source"], "bench", "prompts.jsonl")] + PROFILE_ARGS + list(extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@t.case
def profile_writes_a_valid_plan():
    model = model_or_skip()
    out = os.path.join(G.env()["tmp"], "plan-%d.json" % os.getpid())
    r = profile(model, out)
    G.check(r.returncode == 0, "orochi profile failed (%d): %s", r.returncode, r.stderr[-2000:])
    for table in ("step time (ms) by width", "tokens per step by width", "plan ("):
        G.check(table in r.stdout, "the output lacks the table %r:\n%s", table, r.stdout)
    plan = json.load(open(out))
    G.check_eq(plan["orochi_plan"], 1, "plan version")
    G.check_eq(plan["widths"], [1, 2, 4], "profiled widths")
    ctx = [b["ctx"] for b in plan["buckets"]]
    G.check_eq(ctx, [64, 256], "bucket contexts")
    for b in plan["buckets"]:
        G.check(b["width"] in (1, 2, 4), "bucket width %r", b["width"])
        G.check(isinstance(b["speculate"], bool), "speculate %r", b["speculate"])
        G.check(len(b["tree"]) <= b["width"] - 1, "tree of %d nodes in width %d", len(b["tree"]), b["width"])
        for i, (parent, rank) in enumerate(b["tree"]):
            G.check(0 <= parent <= i and rank >= 0, "tree node %d: parent %r rank %r", i + 1, parent, rank)
    steps = plan["curves"]["step_ms"]
    G.check(set(steps) == {"64", "256"} and all(len(v) == 3 and all(x > 0 for x in v) for v in steps.values()),
            "step curves %r", steps)
    sp = plan["curves"]["speculators"]
    G.check(set(sp) == {"layerskip", "ngram"}, "speculators %r", list(sp))
    for kind, x in sp.items():
        cats = x["tokens_per_step_by_category"]
        G.check({"chat", "code", "math", "summarize"} <= set(cats), "%s categories %r", kind, list(cats))
        for v in cats.values():
            G.check(all(1.0 <= y <= 5.0 for y in v[1:]), "%s tokens per step %r", kind, v)
    G.log("  plan: %s" % [(b["ctx"], b["width"], b["length"], b["speculate"]) for b in plan["buckets"]])


@t.case
def profile_rejects_bad_input():
    model = model_or_skip()
    e = G.env()
    out = os.path.join(e["tmp"], "plan-bad-%d.json" % os.getpid())
    cases = [
        (["--widths", "2,4"], "must start with 1"),
        (["--prompts", "/nonexistent/prompts.jsonl"], "cannot read the prompt file"),
        (["--speculator", "oracle"], "unknown speculator kind 'oracle'"),
    ]
    for extra, want in cases:
        r = subprocess.run([e["bin"], "profile", "--model", model, "--out", out] + extra,
                           capture_output=True, text=True, timeout=120)
        G.check(r.returncode == 2, "%s: exit %d, want 2", extra, r.returncode)
        G.check(want in r.stderr, "%s: stderr %r lacks %r", extra, r.stderr, want)


@t.case
def group_follows_the_plan_and_rereads_it():
    model = model_or_skip()
    tmp = G.env()["tmp"]
    plan_path = os.path.join(tmp, "plan-group-%d.json" % os.getpid())
    # the group's two workers named: the profile also searches their partition and chooses them
    # (2 rounds of the search: its 12 take minutes in the sanitizer build)
    r = profile(model, plan_path, "--devices", "cpu,cpu", "--search-rounds", "2")
    G.check(r.returncode == 0, "orochi profile failed: %s", r.stderr[-2000:])
    G.check("partition search: 2 parts, 2 rounds" in r.stdout,
            "the search did not stop after --search-rounds 2:\n%s", r.stdout[-1500:])
    part = json.load(open(plan_path)).get("partition", {})
    G.check(part.get("parts") == 2 and part.get("devices") == ["cpu", "cpu"] and part.get("why"),
            "the profile with --devices cpu,cpu wrote no partition with its devices and why: %s", part)
    G.check("devices: " in r.stdout, "the profile did not print its choice of devices:\n%s", r.stdout[-1500:])
    prompts = ["Write a Python function that adds two numbers.", "Summarize: the cat sat on the mat. The cat sat."]
    with G.Group("plan", model, workers=2, speculators=["layerskip", "ngram"], guard=True,
                 extra=["--plan", plan_path]) as g:
        for p in prompts:
            G.check_eq(g.ids(p, max_tokens=24), G.run_ids(model, p, 24), "token ids with the plan for %r" % p)
        status = open(g.path("status")).read()
        G.check("plan %s" % plan_path in status, "status does not name the plan:\n%s", status)
        # a rewritten plan: one bucket, width 3, is picked up without a restart
        plan = json.load(open(plan_path))
        plan["buckets"] = [dict(plan["buckets"][0], ctx=100000, width=3, length=2, speculate=True)]
        time.sleep(1.1)  # a new modification time
        with open(plan_path + ".tmp", "w") as f:
            json.dump(plan, f)
        os.replace(plan_path + ".tmp", plan_path)
        g.wait_log("coordinator", "up to 100000 tokens: width 3", timeout=10)
        G.check_eq(g.ids(prompts[0], max_tokens=24), G.run_ids(model, prompts[0], 24), "token ids after reload")
        deadline = time.time() + 10
        while "controllers      width 3 " not in open(g.path("status")).read() and time.time() < deadline:
            time.sleep(0.1)
        G.check("controllers      width 3 " in open(g.path("status")).read(), "the status does not show width 3:\n%s",
                open(g.path("status")).read())
    # a plan whose tree shape is one chain of best candidates: still lossless
    plan = json.load(open(plan_path))
    plan["buckets"] = [dict(plan["buckets"][0], ctx=100000, width=4, length=3, speculate=True,
                            tree=[[0, 0], [1, 0], [2, 0]])]
    chain_path = os.path.join(tmp, "plan-chain-%d.json" % os.getpid())
    with open(chain_path, "w") as f:
        json.dump(plan, f)
    with G.Group("plan-chain", model, workers=2, speculators=["ngram"], guard=False,
                 extra=["--plan", chain_path]) as g:
        for p in prompts:
            G.check_eq(g.ids(p, max_tokens=24), G.run_ids(model, p, 24), "token ids with a chain tree for %r" % p)
    bad = os.path.join(tmp, "plan-not-%d.json" % os.getpid())
    with open(bad, "w") as f:
        f.write('{"buckets": []}')
    g = G.Group("plan-bad", model, workers=1, extra=["--plan", bad])
    r = g.launch(*g.up_args(), timeout=60, check=False)
    G.check(r.returncode != 0, "a group with a bad plan started")
    G.check('lacks "orochi_plan": 1' in (r.stdout + r.stderr + g.log("coordinator")),
            "the refusal does not say why:\n%s%s", r.stdout, r.stderr)
    with open(bad, "w") as f:
        json.dump({"orochi_plan": 1, "buckets": [{"ctx": 256, "width": 4, "length": 2, "tree": [[3, 0]]}]}, f)
    g = G.Group("plan-badtree", model, workers=1, extra=["--plan", bad])
    r = g.launch(*g.up_args(), timeout=60, check=False)
    G.check(r.returncode != 0, "a group with a malformed plan tree started")
    G.check("tree must be [[parent, rank]" in (r.stdout + r.stderr + g.log("coordinator")),
            "the refusal does not say why:\n%s%s", r.stdout, r.stderr)


@t.case
def partition_search_writes_the_plan_a_group_follows():
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=256, type="q4_1")
    e = G.env()
    path = G.write_plan(os.path.join(e["tmp"], "plan-search-%d.json" % os.getpid()), [1, 1.2, 1.5, 2, 3], 1)
    r = subprocess.run([e["bin"], "bench", "--plans", "--model", model, "--search", path, "--parts", "2",
                        "--widths", "1,4", "--reps", "2", "--ctx", "32"],
                       capture_output=True, text=True, timeout=600)
    G.check(r.returncode == 0, "the search failed (%d):\n%s%s", r.returncode, r.stdout, r.stderr[-2000:])
    G.check("partition search: 2 parts" in r.stdout and "alone:" in r.stderr,
            "the search did not report:\n%s%s", r.stdout, r.stderr[-2000:])
    with open(path) as f:
        plan = json.load(f)
    G.check(plan.get("orochi_plan") == 1 and "buckets" in plan, "the plan's own keys were lost: %s", plan)
    part = plan.get("partition", {})
    G.check(part.get("parts") == 2 and part.get("style") == "hcmp", "no partition for 2 parts: %s", part)
    for kind in ("qkv", "wo", "ffn_up", "ffn_down", "lm_head", "attention_dense", "attention_sparse"):
        v = part.get(kind)
        G.check(isinstance(v, list) and len(v) == 2 and min(v) >= 0 and abs(sum(v) - 1) < 2e-3,
                "the %s shares are not two that sum to 1: %s", kind, v)
    G.check(part.get("devices") == ["cpu", "cpu"] and "alone" in part.get("why", ""),
            "the partition does not say its devices and why: %s", part)
    G.check("devices: " in r.stdout, "the search did not print its choice of devices:\n%s", r.stdout)
    prompts = ["one two three four", "the cat sat on"]
    want = {p: G.run_ids(model, p, 20) for p in prompts}
    with G.Group("plan-search", model, workers=2, extra=["--plan", path]) as g:
        for p in prompts:
            G.check_eq(g.ids(p, 20), want[p], "a group on the searched partition, prompt %r" % p)
        G.check("the plan's devices: " + part["why"] in g.log("coordinator"),
                "the coordinator did not log the plan's reason:\n%s", g.log("coordinator")[-1500:])
    # a partition found for a GPU worker first is refused by a group of CPU workers
    part["devices"] = ["gpu", "cpu"]
    with open(path, "w") as f:
        json.dump(plan, f)
    g = G.Group("plan-devices", model, workers=2, extra=["--plan", path])
    r = g.launch(*g.up_args(), timeout=60, check=False)
    G.check(r.returncode != 0, "a group of CPU workers started on a partition found for gpu,cpu")
    G.check("found for worker 0 on the gpu, and this group's worker 0 runs on the cpu" in
            (r.stdout + r.stderr + g.log("coordinator")), "the refusal does not say why:\n%s%s", r.stdout,
            r.stderr)


@t.case
def bench_plans_times_a_prompt():
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=512, type="q4_1")
    e = G.env()
    js = os.path.join(e["tmp"], "plans-prompt-%d.jsonl" % os.getpid())
    if os.path.exists(js):
        os.remove(js)
    # 130 tokens: chunks of 64, 64 and 2, past the context of 32 the widths are timed at
    r = subprocess.run([e["bin"], "bench", "--plans", "--model", model, "--parts", "2", "--widths", "1,4",
                        "--reps", "2", "--ctx", "32", "--prompt", "130", "--plan", "hcmp:even",
                        "--plan", "megatron:even", "--json", js],
                       capture_output=True, text=True, timeout=300)
    G.check(r.returncode == 0, "bench --prompt failed (%d):\n%s%s", r.returncode, r.stdout, r.stderr[-2000:])
    G.check("a 130-token prompt from position 0 in chunks of 64" in r.stdout,
            "no prompt table:\n%s", r.stdout)
    with open(js) as f:
        rows = [json.loads(line) for line in f]
    prompt = [x for x in rows if x["bench"] == "plans_prompt"]
    G.check([x["plan"] for x in prompt] == ["hcmp:even", "megatron:even"], "the prompt's rows: %r", prompt)
    for x in prompt:
        G.check(x["prompt"] == 130 and x["ms"] > 0 and abs(x["tok_s"] - 130 / (x["ms"] / 1e3)) < 0.01 * x["tok_s"]
                and x["tc_share"] == 0 and x["parts"] == 2, "a prompt row: %r", x)
    G.check(len([x for x in rows if x["bench"] == "plans"]) == 4, "the widths' rows: %r", rows)
    for extra, says in ((["--prompt", "0"], "--prompt expects an integer in [1, 16384], got '0'"),
                        (["--prompt", "8", "--search", js + ".plan"], "--prompt times plans; --search finds one"),
                        (["--search-rounds", "3"], "--search-rounds is for --search"),
                        (["--search", js + ".plan", "--search-rounds", "0"],
                         "--search-rounds expects an integer in [1, 100], got '0'")):
        r = subprocess.run([e["bin"], "bench", "--plans", "--model", model] + extra,
                           capture_output=True, text=True, timeout=60)
        G.check(r.returncode == 2 and says in r.stderr, "%r was not refused (%d): %s", extra, r.returncode, r.stderr)


if __name__ == "__main__":
    t.main()
