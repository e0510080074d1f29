"""Token trees, voting, adaptive length, Medusa, batching and back-pressure through real groups.

Every speculative configuration is checked the one way that matters: greedy token ids equal
`orochi run --temp 0 --print-ids`. Configurations: trees on/off, every vote mode with two
speculators, adaptive length on/off, a Medusa speculator with random heads, and six concurrent
requests batched into shared verification steps (each equal to its single-request output). Also:
drafts that are always right are accepted as trees (mean accepted well above 1), sampling requests
complete through tree verification, and the draft pool stays bounded under a slow target (one
draft per committed context per speculator, never a backlog).
"""
import json
import os
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

PROMPTS = [
    "hello world",
    "for i in range(10): print(i)\nfor i in range(10): print(i)\nfor i in range(10):",
    "one two three four one two three four one two",
]
N = 40


def tiny():
    return G.mkmodel(layers=4, dim=192, ffn=256, heads=6, kv_heads=6, vocab=300, ctx=256, type="q8_0", seed=4)


def check_lossless(g, model, prompts=PROMPTS, n=N):
    accepted = []
    for p in prompts:
        r = g.complete(p, max_tokens=n)
        o = r["orochi"]
        G.check_eq(o["token_ids"], G.run_ids(model, p, n), "token ids for %r" % p)
        accepted.append(o["mean_accepted"])
    return accepted


@t.case
def tree_and_vote_modes_lossless():
    model = tiny()
    configs = [
        ["--tree", "on", "--vote", "majority"],
        ["--tree", "on", "--vote", "union"],
        ["--tree", "on", "--vote", "off"],
        ["--tree", "off", "--vote", "majority"],
        ["--adaptive", "off", "--vote", "union"],
    ]
    for extra in configs:
        with G.Group("vote", model, workers=2, speculators=["layerskip:layers=0-1", "ngram"],
                     extra=extra + ["--width", "8"]) as g:
            check_lossless(g, model)
            st = g.status()
            G.check(any("acr" in line for line in open(g.path("status")).read().splitlines()),
                    "status shows no speculator acceptance rate (%s)", extra)
            G.log("  %s: ok" % " ".join(extra))


@t.case
def perfect_drafts_are_accepted_as_trees():
    """layerskip keeping every layer drafts exactly the target's choices: with trees and a wide
    budget the verified paths must be long. (The draft wait is fixed: whether a draft of this tiny
    model is worth waiting for is a matter of microseconds, which a loaded machine tips either way,
    and this test is about what the drafts are.)"""
    model = tiny()
    with G.Group("perfect", model, workers=1, speculators=["layerskip:layers=0-3"], max_width=16,
                 max_draft=8, extra=["--width", "16", "--tree", "on", "--adaptive", "off",
                                     "--draft-wait", "fixed"]) as g:
        acc = check_lossless(g, model)
        G.check(max(acc) > 3.0, "perfect drafts gave mean accepted %r (want > 3)", acc)


@t.case
def adaptive_length_moves_and_stays_lossless():
    """With the adaptive length on and a decision every 2 cycles, the length moves (the hill-climb
    measures a neighbour as soon as it has a figure for its own length, so some decision must move
    it within the requests' many cycles: orochi_speculation_length_changes_total > 0), the status
    and /metrics report it, and every answer stays equal to `orochi run`. With --adaptive off it
    never moves."""
    model = tiny()
    for mode in ("on", "off"):
        with G.Group("adaptive-" + mode, model, workers=2, speculators=["ngram"],
                     extra=["--adaptive", mode, "--decision-threshold", "2", "--lookup-run", "off"]) as g:
            check_lossless(g, model, prompts=PROMPTS * 2)
            text = open(g.path("status")).read()
            G.check("speculation length" in text, "status lacks the speculation length:\n%s", text)
            metrics = g.http("/metrics").body.decode()
            changes = [float(l.split()[1]) for l in metrics.splitlines()
                       if l.startswith("orochi_speculation_length_changes_total ")]
            G.check(changes and (changes[0] > 0) == (mode == "on"),
                    "--adaptive %s: orochi_speculation_length_changes_total %r", mode, changes)
            G.log("  --adaptive %s: the length moved %d times" % (mode, changes[0] if changes else -1))


@t.case
def medusa_random_heads_lossless():
    model = tiny()
    heads = os.path.join(G.env()["tmp"], "models", "medusa-tiny.gguf")
    subprocess.run([G.env()["bin"], "mkmedusa", "--target", model, "--out", heads, "--heads", "3",
                    "--seed", "5"], check=True, capture_output=True)
    # the draft wait is fixed: on a model this small, whether a draft is worth waiting for is a
    # matter of microseconds, and this test is about verifying what the heads draft
    with G.Group("medusa", model, workers=2, speculators=["medusa:heads=%s,template=3-2-1" % heads],
                 extra=["--draft-wait", "fixed"]) as g:
        check_lossless(g, model)
        r = g.complete(PROMPTS[0], max_tokens=N)
        G.check("medusa" in r["orochi"]["draft_kinds"],
                "the random heads' drafts were never verified: %r", r["orochi"])


@t.case
def medusa_drafts_for_every_request():
    """The coordinator publishes the target's hidden state for every sequence slot, so a Medusa
    drafter is fed and drafts for every request in flight, not only the oldest: a long request
    first, then two short ones while it runs; the heads' drafts are verified for all three (they
    were for the oldest only before) and every answer equals `orochi run`."""
    model = tiny()
    heads = os.path.join(G.env()["tmp"], "models", "medusa-tiny.gguf")
    subprocess.run([G.env()["bin"], "mkmedusa", "--target", model, "--out", heads, "--heads", "3",
                    "--seed", "5"], check=True, capture_output=True)
    long_p, short = PROMPTS[0], PROMPTS[1:3]
    want = {long_p: G.run_ids(model, long_p, 200)}
    want.update({p: G.run_ids(model, p, 16) for p in short})
    with G.Group("medusa-every", model, workers=1, speculators=["medusa:heads=%s,template=3-2-1" % heads],
                 extra=["--draft-wait", "fixed", "--free-run", "off"]) as g:
        first = G.Background(g, long_p, 200)
        first.wait_started()
        got = {}
        th = [threading.Thread(target=lambda p=p: got.__setitem__(p, g.complete(p, max_tokens=16)))
              for p in short]
        for x in th:
            x.start()
        for x in th:
            x.join(120)
        G.check_eq(first.result(), want[long_p], "the long request's ids")
        kinds = {long_p: first.orochi["draft_kinds"]}
        for p in short:
            G.check_eq(got[p]["orochi"]["token_ids"], want[p], "ids of %r beside the long one" % p)
            kinds[p] = got[p]["orochi"]["draft_kinds"]
        G.log("  draft kinds verified per request: %s" % [kinds[p] for p in want])
        G.check(all("medusa" in kinds[p] for p in want),
                "the heads did not draft for every request in flight: draft_kinds %r", kinds)


@t.case
def six_concurrent_requests_equal_single():
    model = tiny()
    prompts = PROMPTS + ["the quick brown fox", "int main(void) {", "a b c d e f"]
    want = {p: G.run_ids(model, p, N) for p in prompts}
    with G.Group("batch", model, workers=2, speculators=["ngram"], extra=["--max-batch", "4"]) as g:
        got = {}

        def one(p):
            got[p] = g.complete(p, max_tokens=N)["orochi"]["token_ids"]

        th = [threading.Thread(target=one, args=(p,)) for p in prompts]
        for x in th:
            x.start()
        for x in th:
            x.join()
        for p in prompts:
            G.check_eq(got.get(p), want[p], "concurrent output for %r" % p)
        metrics = g.http("/metrics").body.decode()
        hist = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
                if line.startswith("orochi_batch_size_bucket")}
        G.check(hist.get('orochi_batch_size_bucket{le="1"}', 0) < hist.get('orochi_batch_size_bucket{le="+Inf"}', 0),
                "no step verified more than one request: %r", hist)


@t.case
def sampling_through_trees_completes():
    model = tiny()
    with G.Group("sample", model, workers=2, speculators=["layerskip:layers=0-3", "ngram"],
                 extra=["--tree", "on"]) as g:
        outs = []
        for seed in (1, 2):
            r = g.complete(PROMPTS[1], max_tokens=24, temperature=0.8, seed=seed, top_k=20)
            o = r["orochi"]
            G.check(len(o["token_ids"]) == 24 or r["choices"][0]["finish_reason"] == "stop",
                    "seed %d: %d tokens of 24, finish %r", seed, len(o["token_ids"]),
                    r["choices"][0]["finish_reason"])
            G.check(o["draft_kinds"], "seed %d: no draft was verified while sampling: %r", seed, o)
            outs.append(o["token_ids"])
        G.check(outs[0] != outs[1], "seeds 1 and 2 sampled the same %d tokens", len(outs[0]))
        a = g.complete(PROMPTS[1], max_tokens=24, temperature=0.8, seed=7)["orochi"]["token_ids"]
        b = g.complete(PROMPTS[1], max_tokens=24, temperature=0.8, seed=7)["orochi"]["token_ids"]
        G.check_eq(a, b, "same seed, same sampled output")


@t.case
def draft_pool_bounded_under_slow_target():
    """A slow target (a bigger model, one worker) while ngram drafts instantly: the speculator
    publishes one draft per committed context and then waits, so its draft count stays within the
    number of verification steps (plus the request start) — no backlog builds up."""
    model = G.mkmodel(layers=6, dim=512, ffn=1024, heads=8, kv_heads=8, vocab=300, ctx=256, type="f32", seed=6)
    with G.Group("pool", model, workers=1, speculators=["ngram"]) as g:
        r = g.complete(PROMPTS[2], max_tokens=48)
        steps = r["orochi"]["steps"]
        G.check_eq(r["orochi"]["token_ids"], G.run_ids(model, PROMPTS[2], 48), "token ids")
        st = g.status()
        drafts = next(v["steps"] for k, v in st.items() if v.get("kind") == "ngram")
        G.check(drafts <= steps + 2, "ngram published %d drafts for %d steps: the pool is not bounded",
                drafts, steps)


if __name__ == "__main__":
    t.main()
