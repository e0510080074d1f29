#!/usr/bin/env python3
"""tests/integration/test_shaping.py — logit_bias, frequency_penalty and presence_penalty act, and
speculation keeps them lossless.

Every row a request chooses a token from is shaped (coordinator/coord_slots.c, engine_slot_shape):
the bias added, each generated token's count times frequency_penalty and, once it occurred,
presence_penalty taken off — in a tree, counting the nodes on the row's path as generated. Checked
on a tiny model, through a group without speculators (plain steps) and one with ngram and layerskip
drafting trees:
  - greedy answers with each setting are equal token for token in both groups;
  - a bias of -100 on the unbiased answer's first token changes the first token, and +100 on
    another token makes it the first;
  - a frequency penalty gives fewer repeated tokens than none;
  - sampling (temperature 1, several seeds) never draws a token biased by -100;
  - bad values are refused with a 400 naming the field; a token id past the vocabulary too.
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()
PROMPTS = ["hello world", "the quick brown fox"]
N = 48


def model():
    return G.mkmodel(layers=4, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32",
                     seed=21)


def repeats(ids):
    return sum(c - 1 for c in collections.Counter(ids).values())


@t.case
def shaping_acts_and_speculation_keeps_it():
    m = model()
    accepted = []  # the speculative group's tokens a step, per shaped request
    with G.Group("shape-plain", m, workers=1) as plain, \
            G.Group("shape-spec", m, workers=2, speculators=["ngram", "layerskip"],
                    extra=["--draft-wait", "fixed", "--draft-wait-ms", "2000"]) as spec:
        for p in PROMPTS:
            base = plain.ids(p, N)
            settings = [
                ("bias -100 on the first token", dict(logit_bias={str(base[0]): -100})),
                ("bias +100 on token 7", dict(logit_bias={"7": 100})),
                ("frequency_penalty 1.5", dict(frequency_penalty=1.5)),
                ("presence_penalty 1 and a bias", dict(presence_penalty=1.0, logit_bias={"3": 4.5})),
                ("negative penalties", dict(frequency_penalty=-0.5, presence_penalty=-0.25)),
            ]
            for what, kw in settings:
                a = plain.ids(p, N, **kw)
                rb = spec.complete(p, N, **kw)
                b = rb["orochi"]["token_ids"]
                accepted.append(rb["orochi"]["mean_accepted"])
                G.check_eq(b, a, "%r, %s: speculative against plain steps" % (p, what))
                if what.startswith("bias -100"):
                    G.check(a[0] != base[0], "%r: the first token %d, biased by -100, came first", p, base[0])
                if what.startswith("bias +100"):
                    G.check_eq(a[0], 7, "%r: the first token with token 7 biased by +100" % p)
                if what.startswith("frequency"):
                    G.check(repeats(a) < repeats(base), "%r: %d repeats with frequency_penalty 1.5, %d without",
                            p, repeats(a), repeats(base))
                G.log("  %-18r %-30s %d tokens, equal with speculation (repeats %d, unshaped %d)"
                      % (p, what, len(a), repeats(a), repeats(base)))
        G.check(max(accepted) > 1.2, "the speculative group verified no drafts worth a token (tokens a "
                "step: %s): the shaped rows of trees went untested", accepted)
        G.log("  tokens a step in the speculative group: %s" % " ".join("%.2f" % x for x in accepted))
        banned = plain.ids(PROMPTS[0], N)[:3]
        for seed in range(4):
            for g in (plain, spec):
                r = g.complete(PROMPTS[0], N, temperature=1.0, seed=seed,
                               logit_bias={str(x): -100 for x in banned})
                ids = r["orochi"]["token_ids"]
                G.check(not set(ids) & set(banned), "seed %d: tokens biased by -100 were drawn: %s", seed,
                        sorted(set(ids) & set(banned)))
        G.log("  sampling, 4 seeds x 2 groups: no token biased by -100 drawn")


@t.case
def bad_shaping_fields_are_refused():
    m = model()
    with G.Group("shape-bad", m, workers=1) as g:
        cases = [
            ({"logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
            ({"logit_bias": {"5": 101}}, "logit_bias", "-100 to 100"),
            ({"logit_bias": [1, 2]}, "logit_bias", "object"),
            ({"frequency_penalty": 2.5}, "frequency_penalty", "-2 to 2"),
            ({"presence_penalty": "x"}, "presence_penalty", "number"),
        ]
        for extra, param, words in cases:
            r = g.http("/v1/completions", "POST", dict(prompt="hi", max_tokens=4, **extra))
            G.check(r.status == 400, "%s: HTTP %d, not 400", extra, r.status)
            err = r.json["error"]
            G.check(err.get("param") == param and words in err.get("message", ""),
                    "%s: the error %r does not name %s (%s)", extra, err, param, words)
        r = g.http("/v1/completions", "POST", dict(prompt="hi", max_tokens=4, logit_bias={"300": 1}))
        G.check(r.status == 400 and "vocabulary has 300" in r.error_message(),
                "a token past the vocabulary: %r", r)
        G.check_eq(len(g.ids("hi", 4)), 4, "a request after the refusals")
        G.log("  %d bad bodies and a token past the vocabulary refused with 400, the group serving on"
              % len(cases))


if __name__ == "__main__":
    t.main()
