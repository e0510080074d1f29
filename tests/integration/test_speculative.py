"""Speculative greedy decoding equals sequential greedy decoding, for every speculator kind.

A group drafts with ngram (prompt lookup), layerskip (the target with layers skipped), model (a
separate draft GGUF sharing the vocabulary) or several speculators at once, and verifies the drafts
with the workers; at temperature 0 the token ids must be exactly those of
`orochi run --temp 0 --print-ids`. Drafts that are always right (a layerskip speculator keeping
every layer, a model speculator whose draft is the target itself, or a replay speculator fed the
target's own answers) must also be accepted: mean accepted tokens per verification step well
above 1. The default model is checked with prompts of
different kinds (code, chat, repetitive text to summarise) when it is present. The precisions a
group can be started with are checked the same way against `orochi run` with the same flag:
`--act-bits 8`, and `--kv f16` (the arena's K/V cache in half precision, read in place by a
layerskip drafter).
"""
import json
import os
import re
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

TINY_PROMPTS = [
    "hello world",
    "for i in range(10): print(i)\nfor i in range(10): print(i)\nfor i in range(10):",
    "one two three four one two three four one two three four one two",
]
N = 48

REAL_PROMPTS = [
    # code
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    # chat-like
    "User: What are three good reasons to learn a second language?\nAssistant:",
    # summarisation of repetitive text: the answer repeats the input, which ngram drafts well
    "The meeting was moved to Tuesday. The meeting was moved to Tuesday because the room was booked. "
    "Summary: The meeting",
]


def tiny():
    return G.mkmodel(layers=4, dim=192, ffn=256, heads=6, kv_heads=6, vocab=300, ctx=256, type="f32", seed=2)


def check_answer(r, want, what):
    G.check_eq(r["orochi"]["token_ids"], want, what + ": token ids")
    G.check(r["usage"]["completion_tokens"] == len(want), "%s: usage.completion_tokens %r for %d "
            "token ids", what, r["usage"]["completion_tokens"], len(want))
    o = r["orochi"]
    G.check(isinstance(o.get("draft_kinds"), list), "%s: draft_kinds is not a list: %r", what, o.get("draft_kinds"))
    G.check(all(isinstance(k, str) for k in o["draft_kinds"]), "%s: draft_kinds %r", what, o["draft_kinds"])
    G.check(isinstance(o.get("mean_accepted"), (int, float)), "%s: mean_accepted %r is not a number",
            what, o.get("mean_accepted"))
    G.check(isinstance(o.get("steps"), int) and 1 <= o["steps"] <= len(want),
            "%s: steps %r for %d tokens", what, o.get("steps"), len(want))


def speculative_equals_run(model, speculators, prompts, n, name, kinds=None, min_mean=None, run_extra=(),
                           **group_kw):
    want = {p: G.run_ids(model, p, n, extra=run_extra) for p in prompts}
    with G.Group(name, model, speculators=speculators, **group_kw) as g:
        st = g.status()
        for s in speculators:
            kind = s.split(":")[0]
            G.check(any(v["kind"] == kind and v["connected"] for v in st.values()),
                    "speculator %s not connected: %r", kind, {k: v["line"] for k, v in st.items()})
        means, used = [], set()
        for p in prompts:
            r = g.complete(p, n)
            check_answer(r, want[p], "%s, prompt %r" % (name, p[:40]))
            means.append(r["orochi"]["mean_accepted"])
            used.update(r["orochi"]["draft_kinds"])
        G.log("  %s: identical on %d prompts; mean accepted %s; kinds used %s" % (
            name, len(prompts), ", ".join("%.2f" % m for m in means), sorted(used)))
        if kinds is not None:
            G.check(used <= set(kinds), "%s: draft_kinds %r outside %r", name, sorted(used), kinds)
        if min_mean is not None:
            G.check(max(means) >= min_mean, "%s: mean accepted %r, expected at least %.2f on some prompt",
                    name, means, min_mean)
        return g, used


@t.case
def test_speculative_ngram():
    _, used = speculative_equals_run(tiny(), ["ngram"], TINY_PROMPTS, N, "ngram", kinds=["ngram"])


@t.case
def test_speculative_layerskip():
    speculative_equals_run(tiny(), ["layerskip:layers=0-1"], TINY_PROMPTS, N, "layerskip", kinds=["layerskip"])


@t.case
def test_speculative_layerskip_all_layers_accepted():
    # keeping every layer makes the draft the target itself: drafts must be accepted. The draft
    # wait is fixed, as for the model drafter below: under ASan the drafter's first draft, which
    # also measures its placement, came late enough that the measured wait stopped waiting for it
    # (mean accepted 1.27 and 1 in one run of the suite)
    _, used = speculative_equals_run(tiny(), ["layerskip:layers=0-3"], TINY_PROMPTS[:2], N,
                                     "layerskip-full", kinds=["layerskip"], min_mean=2.0,
                                     extra=["--draft-wait", "fixed"])
    G.check(used == {"layerskip"}, "perfect drafts were never used: draft_kinds %r", sorted(used))


@t.case
def test_speculative_model_draft():
    draft = G.mkmodel(layers=2, dim=64, ffn=128, heads=2, kv_heads=2, vocab=300, ctx=256, type="f32", seed=9)
    speculative_equals_run(tiny(), ["model:draft=%s" % draft], TINY_PROMPTS, N, "model", kinds=["model"])


@t.case
def test_speculative_model_placement():
    """A model drafter that takes turns with the workers (2 workers x 1 thread + the drafter are
    more threads than cores, where this machine has 2) measures its step on 1 thread and on every
    core — while the cores are idle before any request, or else at its first draft request — and
    says what it chose with the figures and when it measured, in its log, the coordinator's and
    the status line; with threads given it says so instead."""
    cores = os.cpu_count() or 1
    if cores < 2:
        raise G.Skip("one core: nothing to choose between")
    model = tiny()
    draft = G.quantized(model, "Q8_0")
    for spec, want in (("model:draft=%s" % draft, r"placement: (1 thread|%d threads), taking turns "
                        r"with the workers: a draft step \(4 tokens, then 1\) took [0-9.]+ ms on 1 "
                        r"thread and [0-9.]+ ms on %d \(measured (at the first draft|while the cores were idle)\)"
                        % (cores, cores)),
                       ("model:draft=%s,threads=1" % draft, r"placement: 1 thread, .*\(--threads given\)")):
        with G.Group("model-placement", model, speculators=[spec],
                     threads=max(1, cores // 2) if cores > 2 else 1) as g:
            g.complete(TINY_PROMPTS[0], 8)
            g.wait_log("coordinator", "model placement:")
            for where, text in (("model log", g.log("model")), ("coordinator log", g.log("coordinator"))):
                G.check(re.search(want, text), "%s: no placement line like %r in:\n%s", where, want,
                        "\n".join(l for l in text.splitlines() if "placement" in l) or text[-600:])
            g.wait_status(lambda st: any(re.search(want, v["line"]) for v in st.values()), 10,
                          "a status line with a placement like %r" % want)


@t.case
def test_speculative_model_placement_when_idle():
    """With no request at all, a model drafter that takes turns with the workers measures its
    placement once the cores were idle for a poll interval, so the first request does not pay
    for it; it says so. A machine busy the whole time (other tests running beside this one)
    leaves the measurement to the first draft: then this case skips, naming the load."""
    cores = os.cpu_count() or 1
    if cores < 2:
        raise G.Skip("one core: nothing to choose between")
    model = tiny()
    draft = G.quantized(model, "Q8_0")
    with G.Group("model-placement-idle", model, speculators=["model:draft=%s" % draft],
                 threads=max(1, cores // 2) if cores > 2 else 1) as g:
        deadline = time.time() + 20
        while time.time() < deadline and "model placement:" not in g.log("coordinator"):
            time.sleep(0.2)
        text = g.log("model")
        if "placement:" not in text:
            raise G.Skip("no idle moment in 20 s (load average %.2f on %d cores): the drafter "
                         "measures at its first draft instead" % (os.getloadavg()[0], cores))
        G.check("(measured while the cores were idle)" in text,
                "placed before any request, yet not while idle:\n%s", text[-600:])
        # the group serves as before, the measurement done: greedy, as `orochi run`
        G.check_eq(g.ids(TINY_PROMPTS[0], 8), G.run_ids(model, TINY_PROMPTS[0], 8),
                   "the answer after placement")


@t.case
def test_speculative_model_draft_is_target():
    # the draft wait is fixed, as below: with the wait by measured latency a loaded machine (CI's
    # parallel tests) let the coordinator verify without these perfect drafts (mean 1.38, then 1)
    model = tiny()
    _, used = speculative_equals_run(model, ["model:draft=%s" % model], TINY_PROMPTS[:2], N, "model-self",
                                     kinds=["model"], min_mean=2.0, extra=["--draft-wait", "fixed"])
    G.check(used == {"model"}, "perfect drafts were never used: draft_kinds %r", sorted(used))


@t.case
def test_speculative_model_reads_target_kv():
    # a re-quantized copy of the target as drafter reads the target's committed K/V in the arena
    # (--target-kv auto): lossless, its drafts accepted, and it says so when it joins; off keeps a
    # private prefix (also lossless); `on` with a drafter of another shape is refused by name
    # (the draft wait is fixed: on a model this small whether a draft is worth waiting for is a
    # matter of microseconds, and this test is about what the drafts are)
    model = tiny()
    copy = G.quantized(model, "Q8_0")
    fixed = ["--draft-wait", "fixed"]
    for mode, shared in (("auto", True), ("off", False)):
        g, used = speculative_equals_run(model, ["model:draft=%s,target-kv=%s" % (copy, mode)], TINY_PROMPTS, N,
                                         "model-copy-kv-" + mode, kinds=["model"], min_mean=2.0, extra=fixed)
        G.check(("reading the target's K/V" in g.log("model")) == shared,
                "target-kv=%s: the join line says %r", mode,
                [l for l in g.log("model").splitlines() if "joined" in l])
    # drafting ahead while the target verifies: the confirmed rest of the chain keeps its rows
    g, used = speculative_equals_run(model, ["model:draft=%s,target-kv=on,work-ahead=1,trace=1" % copy],
                                     TINY_PROMPTS, N, "model-copy-kv-ahead", kinds=["model"], min_mean=2.0,
                                     workers=1, extra=fixed)
    ahead = [l for l in g.log("model").splitlines() if "draft of" in l and "(0 drafted ahead" not in l]
    G.check(ahead, "drafting ahead never gave a draft a head start: %r", g.log("model")[-1500:])
    G.check("draft model:" not in g.log("model"), "the drafter reported an error: %r",
            [l for l in g.log("model").splitlines() if "draft model:" in l][:3])
    other = G.mkmodel(layers=2, dim=64, ffn=128, heads=2, kv_heads=2, vocab=300, ctx=256, type="f32", seed=9)
    with G.Group("model-kv-refused", model, speculators=["model:draft=%s,target-kv=on" % other],
                 wait_speculators=False) as g:
        g.wait_log("model", "--target-kv on: the draft model's layers/attention", timeout=20)


@t.case
def test_speculative_layerskip_reads_target_kv():
    # layerskip keeping the target's first layers reads the target's K/V (its layers 0..n-1 see
    # the target's inputs, so the rows are its own): lossless, and with every layer kept the
    # drafts are the target's and accepted; a list that skips a layer keeps a private prefix, and
    # `on` with it is refused by name
    model = tiny()
    for spec, shared, min_mean in (("layerskip:layers=0-3", True, 2.0), ("layerskip:layers=0-1", True, None),
                                   ("layerskip:layers=1-3", False, None)):
        # every step waits for the draft (up to 2 s), so the acceptance does not depend on how
        # busy the machine is (an ASan build beside other tests drafts slowly)
        g, _ = speculative_equals_run(model, [spec], TINY_PROMPTS[:2], N, "layerskip-kv-" + spec.split("=")[1],
                                      kinds=["layerskip"], min_mean=min_mean,
                                      extra=["--draft-wait", "fixed", "--draft-wait-ms", "2000"])
        G.check(("reading the target's K/V" in g.log("layerskip")) == shared,
                "%s: the join line says %r", spec, [l for l in g.log("layerskip").splitlines() if "joined" in l])
    with G.Group("layerskip-kv-refused", model, speculators=["layerskip:layers=1-3,target-kv=on"],
                 wait_speculators=False) as g:
        g.wait_log("layerskip", "--target-kv on: --layers must be the target's first layers", timeout=20)


@t.case
def test_speculative_every_request_batched():
    """A model drafter drafts for every request in flight, one batched growth for all of them:
    layerskip reading the target's K/V, and a `model` drafter with K/V rows of its own (a slot per
    request, caught up together). With every layer kept (or the target as the draft) the drafts are
    the target's, so three requests at once each accept >= 2 tokens a step of --max-draft 3
    (drafting for the oldest only left the other two at 1.00), every answer equal to `orochi run`;
    the coordinator says it feeds the drafter every request."""
    model = tiny()
    want = {p: G.run_ids(model, p, N) for p in TINY_PROMPTS[:3]}
    for spec in ("layerskip:layers=0-3", "model:draft=%s,target-kv=off" % model):
        every_request_case(model, spec, want)


def every_request_case(model, spec, want):
    kind = spec.split(":")[0]
    with G.Group("every-" + kind, model, workers=1, speculators=[spec],
                 max_width=4, max_draft=3,
                 extra=["--free-run", "off", "--draft-wait", "fixed", "--draft-wait-ms", "2000"]) as g:
        for p in TINY_PROMPTS[:1]:  # one alone first: its draft tells the coordinator
            check_answer(g.complete(p, N), want[p], "%s alone, prompt %r" % (kind, p[:40]))
        g.wait_log("coordinator", "drafts for every request (batched)", timeout=20)
        for rnd in range(2):
            got = {}
            g.send_held([lambda p=p: got.__setitem__(p, g.complete(p, N)) for p in want], 0.5)
            means = []
            for p in want:
                check_answer(got[p], want[p], "%s, three at once, prompt %r" % (kind, p[:40]))
                means.append(got[p]["orochi"]["mean_accepted"])
            G.log("  %s, three at once (round %d): identical; mean accepted %s" % (
                kind, rnd + 1, ", ".join("%.2f" % m for m in means)))
        G.check(min(means) >= 2.0, "the %s drafter did not draft for every request: mean accepted "
                "%s (want >= 2.0 each)", kind, means)


@t.case
def test_speculative_drafter_shares_beginning():
    """A drafter with K/V rows of its own holds a beginning its requests share once: three prompts
    with one long beginning sent together, the target itself as a `model` drafter with
    target-kv=off (its drafts are the target's as long as its rows are right). The later requests'
    slots borrow the beginning's rows from the first's (its log says so) and still draft the
    target's tokens (>= 2 accepted a step each); every answer equal to `orochi run`."""
    model = tiny()
    head = "one two three four five six seven eight nine ten " * 4
    prompts = [head + tail for tail in ("alpha", "beta gamma", "delta")]
    want = {p: G.run_ids(model, p, N) for p in prompts}
    with G.Group("drafter-shares", model, workers=1, speculators=["model:draft=%s,target-kv=off" % model],
                 max_width=4, max_draft=3,
                 extra=["--free-run", "off", "--draft-wait", "fixed", "--draft-wait-ms", "2000"]) as g:
        check_answer(g.complete(TINY_PROMPTS[0], N), G.run_ids(model, TINY_PROMPTS[0], N), "alone")
        g.wait_log("coordinator", "drafts for every request (batched)", timeout=20)
        got = {}
        g.send_held([lambda p=p: got.__setitem__(p, g.complete(p, N)) for p in prompts], 0.5)
        means = []
        for p in prompts:
            check_answer(got[p], want[p], "three with one beginning, prompt %r" % p[-12:])
            means.append(got[p]["orochi"]["mean_accepted"])
        lines = [l for l in g.log("model").splitlines() if "borrowed from another request's" in l]
        G.check(lines, "no request's slot borrowed the shared beginning: %r", g.log("model")[-1500:])
        G.check(min(means) >= 2.0, "drafts off the target's after borrowing: mean accepted %s", means)
        G.check("draft model:" not in g.log("model"), "the drafter reported an error: %r",
                [l for l in g.log("model").splitlines() if "draft model:" in l][:3])
        G.log("  three prompts with one beginning: %s; mean accepted %s" % (
            lines[0].split(": ", 1)[-1], ", ".join("%.2f" % m for m in means)))


@t.case
def test_speculative_length_per_request():
    """With several requests in flight each has its own speculation length, hill-climbed on its
    share of each cycle's time per token it yielded: a replay drafter right for two prompts and
    wrong for the third (a corpus of other ids) keeps the two at long drafts while the third's
    length falls (its rejected rows cost it alone); every answer equal to `orochi run`."""
    model = tiny()
    good, bad = TINY_PROMPTS[:2], TINY_PROMPTS[2]
    n_good, n_bad = 150, 16  # the wrong one ends while the two are still in flight
    want = {p: G.run_ids(model, p, n_good) for p in good}
    want[bad] = G.run_ids(model, bad, n_bad)
    corpus = os.path.join(G.env()["tmp"], "length-corpus.txt")
    with open(corpus, "w") as f:
        for p in good + [bad]:
            r = subprocess.run([G.env()["bin"], "tokenize", "--model", model, "--ids-only", p],
                               capture_output=True, text=True, timeout=60, check=True)
            # the wrong one: each of its tokens followed by another, so every lookup drafts and
            # every draft is rejected at its first token
            ids = want[p] if p in good else [y for x in want[p] for y in (x, (x * 7 + 3) % 300)][1:]
            f.write("%s %s\n" % (r.stdout.strip(), " ".join(map(str, ids))))
    with G.Group("length-per-request", model, workers=1, speculators=["replay:corpus=%s" % corpus],
                 max_width=8, max_draft=7,
                 extra=["--free-run", "off", "--decision-threshold", "4", "--draft-wait", "fixed"]) as g:
        got = {}
        g.send_held([lambda p=p: got.__setitem__(p, g.complete(p, n_good if p in good else n_bad))
                     for p in good + [bad]], 0.5)
        for p in want:
            check_answer(got[p], want[p], "length per request, prompt %r" % p[:40])
        lens = {p: got[p]["orochi"]["speculation_length"] for p in want}
        G.log("  speculation length per request: %s; mean accepted %s" % (
            [lens[p] for p in want], ["%.2f" % got[p]["orochi"]["mean_accepted"] for p in want]))
        G.check(got[bad]["orochi"]["steps"] < min(got[p]["orochi"]["steps"] for p in good),
                "the wrong one did not end inside the batch: steps %r",
                [got[p]["orochi"]["steps"] for p in want])
        G.check(lens[bad] <= 2 and min(lens[p] for p in good) >= 5,
                "the lengths did not follow each request's drafts: %s for the two right, %s for "
                "the wrong one (want >= 5 and <= 2)", [lens[p] for p in good], lens[bad])


@t.case
def test_speculative_kv_f16():
    # --kv f16 puts the arena's K/V cache in half precision for every role: the group's greedy
    # output equals `orochi run --kv f16`, plain (free run) and with a layerskip drafter that
    # reads the target's f16 rows in the arena (every layer kept: its drafts are the target's)
    model = tiny()
    f16 = ["--kv", "f16"]
    g, _ = speculative_equals_run(model, [], TINY_PROMPTS, N, "kv-f16-plain", run_extra=f16, extra=f16)
    for w in range(2):
        G.check("f16 K/V" in g.log("worker-%d" % w), "worker-%d does not say it runs f16 K/V", w)
    g, _ = speculative_equals_run(model, ["layerskip:layers=0-3"], TINY_PROMPTS[:2], N, "kv-f16-layerskip",
                                  kinds=["layerskip"], min_mean=2.0, run_extra=f16,
                                  extra=f16 + ["--draft-wait", "fixed", "--draft-wait-ms", "2000"])
    G.check("reading the target's K/V" in g.log("layerskip"), "layerskip did not read the target's K/V: %r",
            [l for l in g.log("layerskip").splitlines() if "joined" in l])


@t.case
def test_speculative_ngram_and_layerskip():
    speculative_equals_run(tiny(), ["ngram", "layerskip:layers=0-1"], TINY_PROMPTS, N, "ngram+layerskip",
                           kinds=["ngram", "layerskip"])


@t.case
def test_speculative_all_kinds_wide():
    # three speculators, a wider verification and longer drafts, 3 workers
    draft = G.mkmodel(layers=2, dim=64, ffn=128, heads=2, kv_heads=2, vocab=300, ctx=256, type="f32", seed=9)
    speculative_equals_run(tiny(), ["ngram", "layerskip:layers=0-2", "model:draft=%s" % draft], TINY_PROMPTS,
                           N, "all-kinds", workers=3, max_width=12, max_draft=8,
                           kinds=["ngram", "layerskip", "model"])


@t.case
def test_speculative_default_model():
    model = G.default_model()
    if not model:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    n = 32
    want = {p: G.run_ids(model, p, n) for p in REAL_PROMPTS}
    for specs, name in ((["ngram"], "real-ngram"), (["layerskip:layers=0-14"], "real-layerskip"),
                        (["ngram", "layerskip:layers=0-14"], "real-ngram+layerskip")):
        with G.Group(name, model, speculators=specs) as g:
            means = []
            for p in REAL_PROMPTS:
                r = g.complete(p, n)
                check_answer(r, want[p], "%s, prompt %r" % (name, p[:40]))
                means.append(r["orochi"]["mean_accepted"])
            G.log("  %s: identical on %d prompts; mean accepted %s" % (
                name, len(REAL_PROMPTS), ", ".join("%.2f" % m for m in means)))


@t.case
def test_speculative_act8():
    """--act-bits 8 reaches every worker, and the group's greedy output with ngram and layerskip
    drafts equals `orochi run --act-bits 8` token for token (each width computes a token the same
    way under 8-bit activations too)."""
    model = G.default_model()
    if not model:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    n = 32
    want = {p: G.run_ids(model, p, n, extra=["--act-bits", "8"]) for p in REAL_PROMPTS}
    with G.Group("act8", model, speculators=["ngram", "layerskip:layers=0-14"],
                 extra=["--act-bits", "8"]) as g:
        for w in range(2):
            g.wait_log("worker-%d" % w, "activations 8,")
        means = []
        for p in REAL_PROMPTS:
            r = g.complete(p, n)
            check_answer(r, want[p], "act8, prompt %r" % p[:40])
            means.append(r["orochi"]["mean_accepted"])
        G.log("  act8: identical to orochi run --act-bits 8 on %d prompts; mean accepted %s" % (
            len(REAL_PROMPTS), ", ".join("%.2f" % m for m in means)))


@t.case
def test_speculative_replay_perfect_drafter():
    """The replay speculator fed the target's own greedy answers (prompt ids and answer, one line
    each) is a perfect drafter: every answer equals `orochi run --temp 0` token for token and its
    chains are accepted whole (mean accepted >= 3 with --max-draft 4, where one token a step is
    plain decoding), also with three requests in one batch (each with its own width's room:
    mean accepted >= 2.0 at --max-width 4); fed unrelated ids instead, the answers stay identical. A replay speculator
    without --corpus, with a corpus holding no ids, or with a stray character is refused naming
    it."""
    model = G.default_model()
    if not model:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    n = 32
    want = {p: G.run_ids(model, p, n) for p in REAL_PROMPTS}
    corpus = os.path.join(G.env()["tmp"], "replay-corpus.txt")
    wrong = os.path.join(G.env()["tmp"], "replay-wrong.txt")
    with open(corpus, "w") as f, open(wrong, "w") as g:
        for p in REAL_PROMPTS:
            r = subprocess.run([G.env()["bin"], "tokenize", "--model", model, "--ids-only", p],
                               capture_output=True, text=True, timeout=60, check=True)
            f.write("%s %s\n" % (r.stdout.strip(), " ".join(map(str, want[p]))))
            g.write(" ".join(str((x * 7 + 3) % 1000) for x in want[p]) + "\n")
    for name, path, floor in (("replay", corpus, 3.0), ("replay-wrong", wrong, None)):
        with G.Group(name, model, speculators=["replay:corpus=%s" % path], max_draft=4) as g:
            means = []
            for p in REAL_PROMPTS:
                r = g.complete(p, n)
                check_answer(r, want[p], "%s, prompt %r" % (name, p[:40]))
                means.append(r["orochi"]["mean_accepted"])
            G.log("  %s: identical on %d prompts; mean accepted %s" % (
                name, len(REAL_PROMPTS), ", ".join("%.2f" % m for m in means)))
            if floor:
                G.check(min(means) >= floor, "the perfect drafter's chains were not accepted "
                        "whole: mean accepted %s (want >= %.1f)", means, floor)
    # the three at once, each with the room for its tree it has alone: --max-width 4 is each
    # request's (a fixed 4 in all would leave one drafted node for the three)
    with G.Group("replay-batch", model, workers=1, speculators=["replay:corpus=%s" % corpus],
                 max_width=4, max_draft=3, extra=["--free-run", "off"]) as g:
        got = {}
        g.send_held([lambda p=p: got.__setitem__(p, g.complete(p, n)) for p in REAL_PROMPTS], 0.5)
        means = []
        for p in REAL_PROMPTS:
            check_answer(got[p], want[p], "replay, three at once, prompt %r" % p[:40])
            means.append(got[p]["orochi"]["mean_accepted"])
        G.log("  replay, three at once: identical; mean accepted %s" % ", ".join("%.2f" % m for m in means))
        G.check(min(means) >= 2.0, "three requests at once had no room for their trees: mean accepted %s "
                "(want >= 2.0 of the 4 rows each; 1.24-1.41 when the three shared 4)", means)
    spec = os.path.join(os.path.dirname(G.env()["bin"]), "orochi-speculator")
    bad = os.path.join(G.env()["tmp"], "replay-bad.txt")
    with open(bad, "w") as f:
        f.write("1 2 3\n4 x 5\n")
    empty = os.path.join(G.env()["tmp"], "replay-empty.txt")
    open(empty, "w").close()
    for args, text in (([], "--kind replay needs --corpus"),
                       (["--corpus", bad], "line 2: 'x' is not part of a token id"),
                       (["--corpus", empty], "holds no token ids")):
        r = subprocess.run([spec, "--run-dir", G.env()["tmp"], "--kind", "replay"] + args,
                           capture_output=True, text=True, timeout=30)
        G.check(r.returncode == 2 and text in r.stderr, "orochi-speculator --kind replay %s: "
                "status %d, %r (want 2 and %r)", " ".join(args), r.returncode, r.stderr, text)


@t.case
def test_speculative_families():
    """Each family (docs/models.md) served by a group, drafted by a 2-layer file of the same family
    through the model speculator, and by the target itself (every draft accepted: its trees are
    verified): completions and a chat answer equal `orochi run --temp 0` (with --chat for the
    chat) token for token."""
    for arch in ("qwen2", "qwen3", "llama31"):
        shape = dict(dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=256, type="f32", arch=arch)
        target = G.mkmodel(layers=4, seed=21, **shape)
        draft = G.mkmodel(layers=2, seed=22, **shape)
        g, _ = speculative_equals_run(target, ["model:draft=%s" % draft], TINY_PROMPTS[:2], 32,
                                      "model-" + arch, kinds=["model"])
        # the target drafting for itself: every draft right, so trees are verified and accepted
        speculative_equals_run(target, ["model:draft=%s" % target], TINY_PROMPTS[:1], 32,
                               "model-self-" + arch, kinds=["model"], min_mean=2.0,
                               extra=["--draft-wait", "fixed"])
        q = "one two three"
        want = G.run_ids(target, q, 24, chat=True)
        with G.Group("chat-" + arch, target, speculators=["model:draft=%s" % draft]) as g:
            r = g.http("/v1/chat/completions", "POST",
                       {"messages": [{"role": "user", "content": q}], "max_tokens": 24,
                        "temperature": 0})
            G.check(r.status == 200, "%s chat completion: %r", arch, r)
            check_answer(r.json, want, "%s chat %r" % (arch, q))


@t.case
def test_chat_template_override():
    """A group started with --chat-template FILE (Gemma 2's real template) renders chats with it:
    the answer equals `orochi run --chat --chat-template FILE`; a system message, which that
    template refuses with raise_exception, is a 400 carrying the template's message."""
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=256, seed=5)
    tmpl = os.path.join(G.env()["source"], "tests", "data", "templates", "google-gemma-2-2b-it.jinja")
    q = "one two three"
    want = G.run_ids(model, q, 16, chat=True, extra=["--chat-template", tmpl])
    with G.Group("chat-template", model, extra=["--chat-template", tmpl]) as g:
        r = g.http("/v1/chat/completions", "POST",
                   {"messages": [{"role": "user", "content": q}], "max_tokens": 16,
                    "temperature": 0})
        G.check(r.status == 200, "chat completion: %r", r)
        check_answer(r.json, want, "gemma template chat")
        r = g.http("/v1/chat/completions", "POST",
                   {"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": q}], "max_tokens": 4})
        G.check(r.status == 400 and "System role not supported" in r.error_message(),
                "a system message under Gemma's template: %r", r)
        G.log("  the template's refusal: %s" % r.error_message())


@t.case
def test_multi_turn_chat_prompt_is_the_rendering():
    """A multi-turn chat (system, user, assistant, user) through /v1/chat/completions under Qwen3's
    real template: its prompt is the template's rendering (`orochi tokenize --render-chat`, itself
    checked against jinja2 by reference_chat_template) — the same number of prompt tokens, and the
    answer equals `orochi run` on that text."""
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=256, seed=5)
    tmpl = os.path.join(G.env()["source"], "tests", "data", "templates", "Qwen-Qwen3-0.6B.jinja")
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one two"},
            {"role": "assistant", "content": "three four"}, {"role": "user", "content": "five six"}]
    path = os.path.join(G.env()["tmp"], "multi-turn.json")
    with open(path, "w") as f:
        json.dump(msgs, f)
    r = subprocess.run([G.env()["bin"], "tokenize", "--model", model, "--chat-template", tmpl,
                        "--render-chat", path], capture_output=True, text=True, timeout=60)
    G.check(r.returncode == 0, "render-chat: %s", r.stderr)
    text = r.stdout
    ids = subprocess.run([G.env()["bin"], "tokenize", "--model", model, "--ids-only", "--", text],
                         capture_output=True, text=True, timeout=60).stdout.split()
    want = G.run_ids(model, text, 12)
    with G.Group("multi-turn", model, extra=["--chat-template", tmpl]) as g:
        r = g.http("/v1/chat/completions", "POST",
                   {"messages": msgs, "max_tokens": 12, "temperature": 0})
        G.check(r.status == 200, "chat completion: %r", r)
        G.check(r.json["usage"]["prompt_tokens"] == len(ids),
                "prompt tokens %d, the rendering has %d", r.json["usage"]["prompt_tokens"], len(ids))
        check_answer(r.json, want, "multi-turn chat under Qwen3's template")
        G.log("  %d prompt tokens, the rendering's; the answer equals orochi run's" % len(ids))


@t.case
def test_speculative_default_model_chat():
    model = G.default_model()
    if not model:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    q = "Name three primary colors."
    want = G.run_ids(model, q, 32, chat=True)
    with G.Group("real-chat", model, speculators=["ngram"]) as g:
        r = g.http("/v1/chat/completions", "POST",
                   {"messages": [{"role": "user", "content": q}], "max_tokens": 32, "temperature": 0})
        G.check(r.status == 200, "chat completion: %r", r)
        check_answer(r.json, want, "chat %r" % q)
        G.check(r.json["choices"][0]["message"]["role"] == "assistant", "chat answer %r", r.json["choices"][0])


@t.case
def test_prompt_prefix_reuse():
    """Chat prompts begin with the template's system turn: a request whose prompt begins with
    tokens a slot has already committed starts from their K/V (copied from an active slot, or
    left in place by the slot's last request) and reports them as usage.prompt_tokens_details.
    cached_tokens; every answer still equals `orochi run --chat` token for token, with layerskip
    reading the target's K/V and ngram drafting, one request at a time and two at once."""
    model = G.default_model()
    if not model:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    qs = ["Name three primary colors.", "What is the capital of Italy?",
          "Write one sentence about rain."]
    want = {q: G.run_ids(model, q, 24, chat=True) for q in qs}

    def ask(g, q):
        r = g.http("/v1/chat/completions", "POST",
                   {"messages": [{"role": "user", "content": q}], "max_tokens": 24,
                    "temperature": 0})
        G.check(r.status == 200, "chat completion: %r", r)
        check_answer(r.json, want[q], "chat %r" % q)
        return r.json["usage"]["prompt_tokens_details"]["cached_tokens"], r.json["usage"]["prompt_tokens"]

    with G.Group("reuse", model, speculators=["ngram", "layerskip:layers=0-14"],
                 extra=["--max-batch", "2"]) as g:
        cached = [ask(g, q) for q in qs]
        G.check(cached[0][0] == 0, "the first request reports %d cached tokens", cached[0][0])
        for c, n in cached[1:]:
            G.check(20 <= c < n, "a later request reuses %d of its %d prompt tokens", c, n)
        both = {}
        threads = [threading.Thread(target=lambda q=q: both.__setitem__(q, ask(g, q)))
                   for q in qs[:2]]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        G.check(len(both) == 2, "the two requests at once did not both answer")
        G.log("  prefix reuse: cached tokens %s one at a time, %s two at once; every answer equal "
              "to orochi run --chat" % ([c for c, _ in cached], [both[q][0] for q in qs[:2]]))


@t.case
def test_speculative_eos_inside_a_draft():
    # the target drafting for itself: every draft is right, so the end of sequence is accepted in
    # the middle of a verified path; the tokens verified past it are neither returned nor counted
    model = G.default_model()
    if not model:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    q = "Say hello."  # a 30-token answer whose end lies inside a 6-token draft
    want = G.run_ids(model, q, 48, chat=True)
    G.check(len(want) < 48, "the reference answer never ends (%d tokens): no eos to test", len(want))
    # every step waits for the draft: on a loaded machine (the sanitizer build) the drafter's
    # reply can take longer than the measured wait allows, and the step would go on without it
    with G.Group("eos-draft", model, speculators=["model:draft=%s" % model], max_draft=6,
                 extra=["--draft-wait", "fixed", "--draft-wait-ms", "5000"]) as g:
        r = g.http("/v1/chat/completions", "POST",
                   {"messages": [{"role": "user", "content": q}], "max_tokens": 48, "temperature": 0})
        G.check(r.status == 200, "chat completion: %r", r)
        check_answer(r.json, want, "chat %r with perfect drafts" % q)
        G.check(r.json["orochi"]["mean_accepted"] > 1.5, "drafts were not accepted: %r",
                r.json["orochi"])


if __name__ == "__main__":
    t.main()
