"""Free-running decode: greedy requests are decoded by the workers themselves.

With no speculator connected, the coordinator rings one step (a token per request) and the workers
go on: each takes the argmax of every row's logits over its own columns, they merge the parts'
bests at their barrier, commit the rows and run the next step of the same requests, while the coordinator takes the tokens a few at a
time (coordinator/coord_freerun.c, engine_run_free; workers/worker.c, worker_run). Checked here:
- the token ids equal `orochi run --temp 0` with 1 and 2 workers, across more tokens than one run
  may make (RT_RUN_MAX = 256), and equal a group with `--free-run off`; the metric
  orochi_free_run_tokens_total says which way the tokens were made;
- a stop string ends a free run with the same text and finish_reason as a group without it, alone
  and in a batch whose other request goes on exactly;
- a second request arriving during a free run is taken in: both answers are exact, steps verified
  two requests together, and the first one decoded a token in each step of the second's prompt;
- a batch of three requests of different lengths runs free together (one row each per step):
  every answer exact with 1 and 2 workers, most tokens made free-running;
- with a speculator that the guard switches off, the plain decoding between its probes runs free,
  and the answers stay exact;
- with ngram the only speculator and a plan with a step-time curve, the workers draft by prompt
  lookup inside the free run: alone and in a batch of three, 1 and 2 workers, every answer exact
  and every request's mean accepted above 1 on a cheap curve; no drafts on a curve where a token
  more costs a whole step; without a plan the group measures its own curve and runs the same way;
  --lookup-run off exact too.
"""
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

RUN_MAX = 256  # group/runtime.h RT_RUN_MAX


def model():
    # ctx 640: a prompt and 320 generated tokens, more than one run can make
    return G.mkmodel(layers=3, dim=192, ffn=384, heads=6, kv_heads=6, vocab=300, ctx=640, type="f32",
                     seed=11)


def metric(g, name):
    body = g.http("/metrics").body.decode()
    m = re.search(r"^%s (\d+)" % name, body, re.M)
    G.check(m is not None, "/metrics has no %s", name)
    return int(m.group(1))


def latency(g, name):
    """A latency histogram of /metrics: (count, sum, {bound: cumulative count}), checked to be one:
    cumulative buckets that never fall and end at the count."""
    body = g.http("/metrics").body.decode()
    buckets = [(float(le), int(v)) for le, v in
               re.findall(r'^%s_bucket\{le="([0-9.e+-]+|\+Inf)"\} (\d+)' % name, body, re.M)]
    count = metric(g, name + "_count")
    total = float(re.search(r"^%s_sum (\S+)" % name, body, re.M).group(1))
    G.check(buckets and buckets[-1][0] == float("inf") and buckets[-1][1] == count,
            "%s: the +Inf bucket is not the count (%d): %s", name, count, buckets[-3:])
    G.check(all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), "%s: buckets fall: %s", name, buckets)
    return count, total, dict(buckets)


def batch_steps(g, size):
    """Verification steps that carried `size` requests (the batch-size histogram's bucket)."""
    body = g.http("/metrics").body.decode()
    le = {int(k): int(v) for k, v in re.findall(r'^orochi_batch_size_bucket\{le="(\d+)"\} (\d+)', body, re.M)}
    return le.get(size, 0) - le.get(size - 1, 0)


def at_once(g, jobs, hold=False):
    """Send every (prompt, max_tokens) of jobs at the same time; the completions in job order.
    hold: the workers are stopped while the requests arrive and go on 0.5 s later (Group.send_held),
    so all of them are in the group before its first step."""
    got = [None] * len(jobs)

    def one(i):
        got[i] = g.complete(jobs[i][0], jobs[i][1])
    if hold:
        g.send_held([lambda i=i: one(i) for i in range(len(jobs))], 0.5)
        return got
    th = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for x in th:
        x.start()
    for x in th:
        x.join()
    return got


@t.case
def test_free_run_identical_across_runs():
    m = model()
    prompts = ["hello world", "The quick brown fox"]
    want = {p: G.run_ids(m, p, 320) for p in prompts}
    longest = max(len(v) for v in want.values())
    G.log("  orochi run: %s tokens" % [len(v) for v in want.values()])
    G.check(longest > RUN_MAX, "no prompt makes more than %d tokens (%d): the test would not cross "
            "from one run to the next", RUN_MAX, longest)
    for workers in (1, 2):
        with G.Group("free%d" % workers, m, workers=workers) as g:
            for p in prompts:
                r = g.complete(p, 320)
                G.check_eq(r["orochi"]["token_ids"], want[p], "%d worker(s), %r" % (workers, p))
            free = metric(g, "orochi_free_run_tokens_total")
            G.check(free >= sum(len(v) for v in want.values()) - 2 * len(prompts),
                    "%d worker(s): only %d tokens were made free-running", workers, free)
            G.log("  %d worker(s): identical, %d tokens free-running" % (workers, free))
            # the latency histograms: a first token per request, every later token one inter-token
            # observation (the free run's tokens included)
            n_ttft, s_ttft, _ = latency(g, "orochi_time_to_first_token_seconds")
            n_itl, s_itl, _ = latency(g, "orochi_inter_token_latency_seconds")
            G.check_eq(n_ttft, len(prompts), "%d worker(s): time-to-first-token observations" % workers)
            G.check_eq(n_itl, sum(len(v) for v in want.values()) - len(prompts),
                       "%d worker(s): inter-token observations" % workers)
            G.check(0 < s_ttft < 60 and 0 < s_itl < 60, "%d worker(s): latency sums %.3f s, %.3f s",
                    workers, s_ttft, s_itl)
            G.log("  %d worker(s): time to first token %.1f ms, inter-token %.2f ms (means)"
                  % (workers, 1e3 * s_ttft / n_ttft, 1e3 * s_itl / n_itl))
    with G.Group("free-off", m, workers=2, extra=["--free-run", "off"]) as g:
        for p in prompts:
            G.check_eq(g.ids(p, 320), want[p], "--free-run off, %r" % p)
        G.check_eq(metric(g, "orochi_free_run_tokens_total"), 0, "free-running tokens with --free-run off")
        G.log("  --free-run off: identical, every token through a verification cycle")


@t.case
def test_free_run_stop_string():
    m = G.default_model()  # real text (a random model's pieces are mostly invalid UTF-8)
    if not m:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    prompt = "The history of the city of Paris"
    with G.Group("free-stop-off", m, workers=2, extra=["--free-run", "off"]) as g:
        full = g.complete(prompt, 120)["choices"][0]["text"]
        # a word from the middle of the text that does not occur before it
        cut = None
        for w in re.finditer(r"[A-Za-z]{4,}", full):
            if w.start() > 60 and full.find(w.group()) == w.start():
                cut = w.group()
                break
        G.check(cut is not None, "no usable stop string in %r", full)
        off = g.complete(prompt, 120, stop=[cut])
    with G.Group("free-stop", m, workers=2) as g:
        on = g.complete(prompt, 120, stop=[cut])
        G.check(metric(g, "orochi_free_run_tokens_total") > 0, "the request was not decoded free-running")
    G.check_eq(on["choices"][0]["text"], off["choices"][0]["text"], "text up to the stop string %r" % cut)
    G.check_eq(on["choices"][0]["finish_reason"], "stop", "finish_reason")
    G.check_eq(on["choices"][0]["text"], full[:full.find(cut)], "the text cut at the stop string")
    G.log("  stopped at %r after %d characters, as without free running" % (cut, len(on["choices"][0]["text"])))


@t.case
def test_free_run_batch_stop_string():
    # a batch running free where one request meets its stop string: it ends with the text a
    # group without free running gives, the other goes on and equals `orochi run`
    m = G.default_model()
    if not m:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    prompt, other = "The history of the city of Paris", "Write a short story about a lighthouse"
    want = G.run_ids(m, other, 120)
    with G.Group("free-bstop-off", m, workers=2, extra=["--free-run", "off"]) as g:
        full = g.complete(prompt, 120)["choices"][0]["text"]
        cut = next((w.group() for w in re.finditer(r"[A-Za-z]{4,}", full)
                    if w.start() > 60 and full.find(w.group()) == w.start()), None)
        G.check(cut is not None, "no usable stop string in %r", full)
        off = g.complete(prompt, 120, stop=[cut])
    with G.Group("free-bstop", m, workers=2) as g:
        got = {}
        th = [threading.Thread(target=lambda: got.__setitem__("stop", g.complete(prompt, 120, stop=[cut]))),
              threading.Thread(target=lambda: got.__setitem__("ids", g.ids(other, 120)))]
        for x in th:
            x.start()
        for x in th:
            x.join()
        two = batch_steps(g, 2)
    G.check_eq(got["stop"]["choices"][0]["text"], off["choices"][0]["text"], "text up to %r" % cut)
    G.check_eq(got["stop"]["choices"][0]["finish_reason"], "stop", "finish_reason")
    G.check_eq(got["ids"], want, "the other request's ids")
    G.check(two > 0, "no step carried both requests")
    G.log("  stopped at %r; the other request exact; %d steps carried both" % (cut, two))


@t.case
def test_free_run_second_request_joins():
    m = G.mkmodel(layers=8, dim=512, ffn=1024, heads=8, kv_heads=2, vocab=300, ctx=512, type="f32", seed=7)
    first, second = "a long first request", "a second one"
    want1, want2 = G.run_ids(m, first, 400), G.run_ids(m, second, 24)
    with G.Group("free-join", m, workers=2) as g:
        bg = G.Background(g, first, 400)
        bg.wait_started()
        got2 = g.ids(second, 24)
        still = not bg.finished.is_set()
        G.check_eq(bg.result(), want1, "the first request's ids")
        G.check_eq(got2, want2, "the second request's ids")
        G.check(still, "the first request ended before the second was answered: nothing overlapped")
        two = batch_steps(g, 2)
        G.check(two > 0, "no step verified both requests: the free run did not let the second in")
        pig = metric(g, "orochi_prefill_piggyback_tokens_total")
        G.check(pig > 0, "the first request made no token during the second one's prompt")
        G.log("  %d steps carried both requests; %d tokens free-running, %d made in the second's "
              "prompt steps" % (two, metric(g, "orochi_free_run_tokens_total"), pig))


@t.case
def test_sampled_request_decodes_during_a_prompt():
    # a sampled request (no seed) running while a long prompt arrives takes a token in each of
    # the prompt's steps, as greedy ones do; one that samples with a seed is left out of them (its
    # output must not depend on when prompts arrive) and gives the same answer with or without
    # the prompt beside it
    m = model()
    long_prompt = " ".join(["word%d" % (i % 50) for i in range(100)])
    with G.Group("pig-sampled", m, workers=1, max_width=4) as g:
        got = {}

        def run(key, **kw):
            got[key] = g.complete("hello world", 300, **kw)

        # an unseeded answer may end (its end-of-text drawn) before the long prompt is admitted on
        # a loaded machine (150 tokens, none beside the prompt, in one run of the suite): it is
        # tried up to 5 times, and fails only if none made a token in the prompt's steps
        tries = [("unseeded", dict(temperature=0.9))] * 5 + [("seeded", dict(temperature=0.9, seed=5))]
        made = 0
        for key, kw in tries:
            if key == "unseeded" and made:
                continue
            before = metric(g, "orochi_prefill_piggyback_tokens_total")
            admitted = metric(g, "orochi_requests_total")
            th = threading.Thread(target=run, args=(key,), kwargs=kw)
            th.start()
            while metric(g, "orochi_requests_total") == admitted:  # it is being served
                time.sleep(0.002)
            other = g.complete(long_prompt, 2)
            th.join()
            pig = metric(g, "orochi_prefill_piggyback_tokens_total") - before
            r = got[key]
            G.check(r["choices"][0]["finish_reason"] in ("stop", "length"), "%s: %r", key, r)
            G.check(other["choices"][0]["finish_reason"] in ("stop", "length"), "the long prompt: %r", other)
            G.log("  %s sampled request: %d tokens, %d made in the long prompt's steps"
                  % (key, len(r["orochi"]["token_ids"]), pig))
            if key == "unseeded":
                made += pig
            else:
                G.check(made > 0, "the sampled request made no token during the long prompt's steps "
                        "in 5 tries")
                G.check_eq(pig, 0, "tokens a seeded request made in another prompt's steps")
        alone = g.complete("hello world", 300, temperature=0.9, seed=5)
        G.check_eq(alone["orochi"]["token_ids"], got["seeded"]["orochi"]["token_ids"],
                   "the seeded request's answer alone and beside a long prompt")


@t.case
def test_free_run_of_a_batch():
    # three greedy requests at once decode free-running together (one row each per step): they end
    # at different lengths, the run ends with the first to finish and the others go on in the
    # next one; every answer equals `orochi run`, with 1 and 2 workers (the shortest is 200 tokens:
    # 40 were over in a few milliseconds on a fast machine, and 120 once under the full suite's
    # load, before the last request had arrived)
    m = model()
    jobs = [("hello world", 320), ("The quick brown fox", 260), ("a third prompt", 200)]
    want = [G.run_ids(m, p, n) for p, n in jobs]
    for workers in (1, 2):
        with G.Group("free-batch%d" % workers, m, workers=workers) as g:
            # the three must overlap: the workers are held while they arrive (at_once, hold)
            got = [r["orochi"]["token_ids"] for r in at_once(g, jobs, hold=True)]
            free, three = metric(g, "orochi_free_run_tokens_total"), batch_steps(g, 3)
        for i, ids in enumerate(got):
            G.check_eq(ids, want[i], "request %d (%d tokens) of the batch, %d workers" % (
                i, jobs[i][1], workers))
        G.check(three > 0, "no step carried all three requests (%d workers)", workers)
        G.check(free > sum(len(w) for w in want) // 2,
                "only %d of %d tokens were made free-running (%d workers)", free,
                sum(len(w) for w in want), workers)
        G.log("  %d workers: identical; %d steps carried all three, %d of %d tokens free-running" % (
            workers, three, free, sum(len(w) for w in want)))


@t.case
def test_free_run_while_the_guard_keeps_speculation_off():
    # a layerskip drafter on a tiny model costs more than it brings: the guard switches speculation
    # off, and the plain decoding in between its probes is a free run (16 tokens at a time)
    m = model()
    prompt = "hello world"
    want = G.run_ids(m, prompt, 300)
    with G.Group("free-guard", m, workers=2, speculators=["layerskip"], guard=True) as g:
        got = [g.ids(prompt, 300) for _ in range(2)]
        body = g.http("/metrics").body.decode()
        free = metric(g, "orochi_free_run_tokens_total")
    for i, ids in enumerate(got):
        G.check_eq(ids, want, "request %d with the guard on" % i)
    G.check(free > 0, "no free run while the guard kept speculation off:\n%s",
            "\n".join(l for l in body.splitlines() if "guard" in l or "free" in l))
    G.log("  identical; %d of %d tokens free-running between the guard's probes" % (free, 2 * len(want)))



@t.case
def test_free_run_with_prompt_lookup():
    # with ngram the only speculator and a plan that has a step-time curve, the workers draft by
    # prompt lookup inside the free run: each answer equals `orochi run`, alone and in a batch of
    # three, with 1 and 2 workers; drafts were accepted (mean accepted > 1 for every request when
    # the curve makes drafting cheap); with a curve where a token more costs a whole step, no
    # request drafts; --lookup-run off sends ngram through verification cycles, still exact
    m = model()
    jobs = [("hello world", 200), ("The quick brown fox", 120), ("a third prompt", 60)]
    want = [G.run_ids(m, p, n) for p, n in jobs]
    cheap, dear = os.path.join(G.env()["tmp"], "plan-cheap.json"), os.path.join(G.env()["tmp"], "plan-dear.json")
    G.write_plan(cheap, [1.0, 1.01, 1.02, 1.04, 1.08])
    G.write_plan(dear, [1.0, 2.0, 4.0, 8.0, 16.0])

    for workers in (1, 2):
        with G.Group("lookup%d" % workers, m, workers=workers, speculators=["ngram"],
                     extra=["--plan", cheap]) as g:
            alone = g.complete(jobs[0][0], jobs[0][1])
            got = at_once(g, jobs)
            free = metric(g, "orochi_free_run_tokens_total")
        G.check_eq(alone["orochi"]["token_ids"], want[0], "alone, %d workers" % workers)
        for i, r in enumerate(got):
            G.check_eq(r["orochi"]["token_ids"], want[i], "request %d of the batch, %d workers" % (i, workers))
        means = [r["orochi"]["mean_accepted"] for r in [alone] + got]
        G.check(all(x > 1 for x in means), "mean accepted per request %s: not every one drafted", means)
        G.check(free >= sum(len(w) for w in want) // 2, "only %d tokens free-running", free)
        G.log("  %d workers, cheap curve: identical; mean accepted %s; %d tokens free-running" % (
            workers, " ".join("%.2f" % x for x in means), free))
    with G.Group("lookup-dear", m, workers=2, speculators=["ngram"], extra=["--plan", dear]) as g:
        got = at_once(g, jobs)
    for i, r in enumerate(got):
        G.check_eq(r["orochi"]["token_ids"], want[i], "request %d, dear curve" % i)
        G.check_eq(r["orochi"]["mean_accepted"], 1.0, "mean accepted of request %d with a dear curve" % i)
    G.log("  dear curve: identical, no drafts")
    with G.Group("lookup-noplan", m, workers=2, speculators=["ngram"]) as g:
        got = at_once(g, jobs)
        free = metric(g, "orochi_free_run_tokens_total")
        G.check("prompt lookup: no plan curve" in g.log("coordinator"),
                "without a plan the group did not measure its own step-time curve")
    for i, r in enumerate(got):
        G.check_eq(r["orochi"]["token_ids"], want[i], "request %d, no plan" % i)
    G.check(free >= sum(len(w) for w in want) // 2, "no plan: only %d tokens free-running", free)
    G.log("  no plan: its own curve measured; identical; %d tokens free-running" % free)
    with G.Group("lookup-off", m, workers=2, speculators=["ngram"],
                 extra=["--plan", cheap, "--lookup-run", "off"]) as g:
        got = at_once(g, jobs)
        free = metric(g, "orochi_free_run_tokens_total")
    for i, r in enumerate(got):
        G.check_eq(r["orochi"]["token_ids"], want[i], "request %d, --lookup-run off" % i)
    G.log("  --lookup-run off: identical; %d tokens free-running" % free)


if __name__ == "__main__":
    t.main()
