"""A draft model with another vocabulary is refused with a clear error; the group keeps serving.

A `model` speculator drafts token ids; if its vocabulary is not the target's, its ids mean other
strings and every draft is garbage (or worse, out of range). The speculator announces its
vocabulary (size and a hash of the token strings) in Hello and the coordinator refuses a mismatch:
the speculator's log must say so in words ("vocabulary" ... "differs"), the coordinator's log too,
the speculator must never show as connected, and the group must keep serving output identical to
`orochi run --temp 0`. Also checked: the refused speculator is not respawned in a tight loop, the
default model with a tiny draft, and a refused speculator attached by hand beside a good one whose
drafts keep being used. (Equal sizes with other token strings, caught by the hash, are exercised
over the raw control socket in test_control.py.)
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

PROMPT = "vocabulary check: one two one two one two"
N = 32


def target():
    return G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=11)


def check_refused(g, role, want):
    g.wait_log(role, "vocabulary", timeout=20)
    slog = g.log(role)
    lines = [line for line in slog.splitlines() if "vocabulary" in line]
    G.check(any("differs" in line for line in lines), "%s.log mentions the vocabulary but not that it "
            "differs:\n%s", role, slog[-2000:])
    G.log("  %s.log: %s" % (role, lines[0].strip()))
    clog = g.log("coordinator")
    G.check("refused a peer" in clog and "differs" in clog, "coordinator.log does not report the refusal")
    st = g.status()
    G.check(not st.get(role, {}).get("connected"), "the refused speculator shows as connected: %s",
            st.get(role, {}).get("line"))
    # the group serves, without drafts from the refused speculator
    for _ in range(2):
        r = g.complete(PROMPT, N)
        G.check_eq(r["orochi"]["token_ids"], want, "completion beside a refused speculator")
        G.check(r["orochi"]["draft_kinds"] == [], "drafts were used although the only speculator was "
                "refused: %r", r["orochi"]["draft_kinds"])
    G.check(G.pid_alive(g.coordinator_pid()), "the coordinator died")


def refusals(g, role):
    return g.log(role).count("refused us")


@t.case
def test_vocab_model_speculator_other_vocab_refused():
    model = target()
    draft = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=400, ctx=256, type="f32", seed=11)
    want = G.run_ids(model, PROMPT, N)
    with G.Group("vocab", model, workers=2, speculators=["model:draft=%s" % draft], wait_speculators=False) as g:
        check_refused(g, "model", want)


@t.case
def test_vocab_refused_speculator_not_respawned_in_a_loop():
    # A speculator the coordinator refuses exits; being the coordinator's child it is spawned again.
    # It can never join, so it must not be respawned at a fixed short interval forever (each
    # attempt maps the draft model again): back off, or give up, within a few seconds.
    model = target()
    draft = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=400, ctx=256, type="f32", seed=11)
    with G.Group("vocab-loop", model, workers=1, speculators=["model:draft=%s" % draft],
                 wait_speculators=False) as g:
        g.wait_log("model", "refused us", timeout=20)
        time.sleep(2.0)
        n1 = refusals(g, "model")
        time.sleep(4.0)
        n2 = refusals(g, "model")
        st = g.status().get("model", {}).get("line", "(absent)").strip()
        G.log("  refusals: %d in the first ~2s, %d more in the next 4s; status: %s" % (n1, n2 - n1, st))
        G.check(n2 - n1 <= 3, "the refused speculator was spawned and refused %d times in 4 seconds "
                "(%d in total): a respawn loop with no back-off", n2 - n1, n2)


@t.case
def test_vocab_default_model_tiny_draft_refused():
    # the real target (49152 tokens) with a tiny mkmodel draft (300 tokens)
    real = G.default_model()
    if not real:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    draft = target()
    prompt = "The vocabulary of a draft model"
    want = G.run_ids(real, prompt, 16)
    with G.Group("vocab-real", real, workers=1, speculators=["model:draft=%s" % draft],
                 wait_speculators=False) as g:
        g.wait_log("model", "vocabulary", timeout=20)
        G.check("differs" in g.log("model"), "model.log: %s", g.log("model")[-1500:])
        G.check_eq(g.ids(prompt, 16), want, "completion on the default model beside a refused draft")


@t.case
def test_vocab_attached_refused_and_good_speculator_still_used():
    model = target()
    draft = G.mkmodel(layers=2, dim=64, ffn=128, heads=2, kv_heads=2, vocab=400, ctx=256, type="f32", seed=12)
    want = G.run_ids(model, PROMPT, N)
    # a good draft: the target itself, so its drafts are accepted and visibly used
    # (every step waits for its draft: a loaded sanitizer run could otherwise go on without it)
    with G.Group("vocab-attach", model, workers=2, speculators=["model:draft=%s" % model],
                 extra=["--draft-wait", "fixed", "--draft-wait-ms", "5000"]) as g:
        r = g.launch("attach-speculator", "--kind", "model", "--id", "bad-draft", "--draft", draft,
                     timeout=60, check=False)
        G.check(r.returncode != 0, "attach-speculator of a draft with another vocabulary succeeded: %s", r.stdout)
        msg = r.stdout + r.stderr
        G.check("vocabulary" in msg and "differs" in msg, "attach-speculator's error does not explain "
                "the refusal:\n%s", msg)
        G.log("  attach-speculator refused: %s" % [line for line in msg.splitlines() if "differs" in line][0][:160])
        G.check("bad-draft" not in g.status(), "the refused speculator is in status")
        out = g.launch("status").stdout
        G.check("bad-draft" not in out, "orochi-launch status still lists the refused speculator:\n%s", out)
        r = g.complete(PROMPT, N)
        G.check_eq(r["orochi"]["token_ids"], want, "completion with a good and a refused speculator")
        G.check(r["orochi"]["draft_kinds"] == ["model"] and r["orochi"]["mean_accepted"] > 1,
                "the good speculator's drafts were not used: %r", r["orochi"])


if __name__ == "__main__":
    t.main()
