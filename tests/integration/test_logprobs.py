"""logprobs / top_logprobs of a real group, against an independent reference.

For greedy requests (the default model when present, else a tiny random one) on a plain group (no
speculators) and a speculative one (ngram, and the target drafting for itself, so that steps
accept several tokens of a verified path): the generated ids equal `orochi run --temp 0`; in every
answer the chosen token is the top alternative with the same logprob, logprobs are <= 0 and the
alternatives are sorted, most likely first; the values equal the log-softmax of the logits that
`orochi eval` computes for the prompt plus the generated ids (teacher forced, in this process)
within 1e-3; the plain and the speculative group agree within 1e-4 (tree logits are bit-identical
to sequential ones). A seeded sampled request (temperature 0.7, top_k 20) reports the target's
distribution at temperature 1: the same reference holds for its ids. Streamed answers put
together equal the plain ones (completions and chat). The chat shape carries the tokens' bytes.
A stop string that begins inside a token cuts the reported tokens: that token is the last one
reported, none after it, streamed or not.
"""
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

try:
    import numpy as np
except ImportError:  # the reference is computed in plain Python then
    np = None

t = G.Tests()

N = 16  # tokens generated per request
TOL_REF = 1e-3  # against `orochi eval` in this process
TOL_SPEC = 1e-4  # plain group against speculative group
# every step waits for the drafts (not only while its measurements say they pay), so the verified
# paths do not depend on the machine's speed (an ASan build's self-drafting is slow)
WAIT = ["--draft-wait", "fixed", "--draft-wait-ms", "5000"]


def model_and_prompts():
    m = G.default_model()
    if m:
        return m, ["The capital of France is", "Once upon a time, there was a"]
    m = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=21)
    return m, ["hello world", "one two one two one two"]


def speculators(model):
    """ngram, and the target drafting for itself: its drafts are all accepted, so every step emits
    several tokens from the rows of one verified path."""
    return ["ngram", "model:draft=%s" % model]


def tokenize(model, text):
    r = subprocess.run([G.env()["bin"], "tokenize", "--model", model, "--ids-only", text], capture_output=True,
                       text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError("orochi tokenize failed (%d): %s" % (r.returncode, r.stderr.strip()))
    return [int(x) for x in r.stdout.split()]


def eval_logprobs(model, prompt_ids, gen_ids):
    """Log-softmax (temperature 1) of the rows that chose gen_ids, from `orochi eval`: a list of
    (logprob of gen_ids[j], the vocabulary's logprobs as a list or array) per generated token."""
    ids = prompt_ids + gen_ids[:-1]
    with tempfile.NamedTemporaryFile(suffix=".f32", dir=G.env()["tmp"]) as f:
        r = subprocess.run([G.env()["bin"], "eval", "--model", model, "--ids", " ".join(map(str, ids)),
                            "--out", f.name], capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError("orochi eval failed (%d): %s" % (r.returncode, r.stderr.strip()))
        raw = open(f.name, "rb").read()
    vocab = len(raw) // 4 // len(ids)
    G.check(vocab * 4 * len(ids) == len(raw), "orochi eval wrote %d bytes for %d ids", len(raw), len(ids))
    out = []
    for j, tok in enumerate(gen_ids):
        row_at = (len(prompt_ids) - 1 + j) * vocab * 4
        if np is not None:
            x = np.frombuffer(raw, dtype="<f4", count=vocab, offset=row_at).astype(np.float64)
            m = x.max()
            lp = x - (m + np.log(np.exp(x - m).sum()))
        else:
            import math
            x = struct.unpack_from("<%df" % vocab, raw, row_at)
            m = max(x)
            lse = m + math.log(sum(math.exp(v - m) for v in x))
            lp = [v - lse for v in x]
        out.append((float(lp[tok]), lp))
    return out


def sorted_desc(values):
    return all(values[i] >= values[i + 1] for i in range(len(values) - 1))


def reported(answer):
    """The ids the logprobs cover: all generated ids but the end-of-sequence token (with no stop
    strings, finish_reason "stop" means the last id is one)."""
    ids = answer["orochi"]["token_ids"]
    return ids[:-1] if answer["choices"][0]["finish_reason"] == "stop" else ids


def check_completion(ans, k, what):
    """Shape and self-consistency of a completions answer with logprobs k; returns its logprobs."""
    lp = ans["choices"][0]["logprobs"]
    G.check(isinstance(lp, dict) and set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"},
            "%s: logprobs %r", what, lp)
    n = len(lp["tokens"])
    G.check(len(lp["token_logprobs"]) == n and len(lp["top_logprobs"]) == n and len(lp["text_offset"]) == n,
            "%s: arrays of different lengths: %r", what, lp)
    G.check(n == len(reported(ans)), "%s: %d tokens reported for %d ids", what, n, len(reported(ans)))
    text = ans["choices"][0]["text"]
    G.check(sorted_desc([-o for o in lp["text_offset"]]) and all(0 <= o <= len(text) for o in lp["text_offset"]),
            "%s: text_offset %r for a text of %d characters", what, lp["text_offset"], len(text))
    for i in range(n):
        tok, val, top = lp["tokens"][i], lp["token_logprobs"][i], lp["top_logprobs"][i]
        G.check(val <= 0, "%s: token %d logprob %r > 0", what, i, val)
        if not tok.startswith("bytes:") and not (tok.startswith("<|") and tok.endswith("|>")):  # special
            G.check(text[lp["text_offset"][i]:].startswith(tok),
                    "%s: token %d %r is not at text_offset %d of %r", what, i, tok, lp["text_offset"][i], text)
        G.check(len(top) == k, "%s: token %d has %d alternatives, wanted %d (greedy: the chosen is one)",
                what, i, len(top), k)
        items = list(top.items())
        G.check(items[0] == (tok, val), "%s: token %d %r %r is not the top alternative %r", what, i, tok, val,
                items[0])
        G.check(sorted_desc([v for _, v in items]) and all(v <= 0 for _, v in items),
                "%s: token %d alternatives %r", what, i, items)
    return lp


def check_chat(ans, k, what):
    """Shape and self-consistency of a chat answer with logprobs true, top_logprobs k."""
    lp = ans["choices"][0]["logprobs"]
    G.check(isinstance(lp, dict) and lp.get("refusal", "absent") is None and isinstance(lp.get("content"), list),
            "%s: logprobs %r", what, lp)
    content = lp["content"]
    G.check(len(content) == len(reported(ans)), "%s: %d tokens for %d ids", what, len(content), len(reported(ans)))
    joined = b""
    for i, e in enumerate(content):
        G.check(set(e) == {"token", "logprob", "bytes", "top_logprobs"}, "%s: entry %d %r", what, i, e)
        G.check(e["logprob"] <= 0 and all(0 <= b <= 255 for b in e["bytes"]), "%s: entry %d %r", what, i, e)
        if not e["token"].startswith("bytes:"):
            G.check(e["token"].encode() == bytes(e["bytes"]), "%s: entry %d token %r vs bytes %r", what, i,
                    e["token"], e["bytes"])
        joined += bytes(e["bytes"])
        top = e["top_logprobs"]
        G.check(len(top) == k and all(set(a) == {"token", "logprob", "bytes"} for a in top),
                "%s: entry %d alternatives %r", what, i, top)
        G.check((top[0]["token"], top[0]["logprob"], top[0]["bytes"]) == (e["token"], e["logprob"], e["bytes"]),
                "%s: entry %d %r is not its top alternative %r", what, i, e, top[0])
        G.check(sorted_desc([a["logprob"] for a in top]), "%s: entry %d alternatives unsorted %r", what, i, top)
    text = ans["choices"][0]["message"]["content"]
    G.check(joined.decode("utf-8", "replace") == text, "%s: the tokens' bytes %r do not make the text %r", what,
            joined, text)
    return content


def stream_logprobs(g, path, body):
    """The chunks' logprobs put together (completions: the four arrays; chat: content), the text, and
    whether every text chunk carried its logprobs."""
    events, done = G.sse_events(g.url + path, dict(body, stream=True))
    G.check(done, "%s: no [DONE]", path)
    merged, text, each = {}, "", True
    for e in events:
        ch = e["choices"][0]
        piece = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
        lp = ch.get("logprobs")
        if piece:
            text += piece
            each &= isinstance(lp, dict)
        for key, arr in (lp or {}).items():
            if isinstance(arr, list):
                merged.setdefault(key, []).extend(arr)
    return merged, text, each


@t.case
def test_logprobs_greedy():
    model, prompts = model_and_prompts()
    chat = "/v1/chat/completions"
    answers = {}
    for name, spec in (("plain", []), ("spec", speculators(model))):
        with G.Group("lp-" + name, model, workers=2, speculators=spec, max_draft=6, extra=WAIT) as g:
            for p in prompts:
                comp = g.complete(p, N, logprobs=5)
                check_completion(comp, 5, "%s %r" % (name, p))
                msgs = [{"role": "user", "content": p}]
                r = g.http(chat, "POST", {"messages": msgs, "max_tokens": N, "temperature": 0, "logprobs": True,
                                          "top_logprobs": 4})
                G.check(r.status == 200, "chat: %r", r)
                check_chat(r.json, 4, "%s chat %r" % (name, p))
                answers[name, p] = comp, r.json
                # streamed == plain, for both shapes
                merged, text, each = stream_logprobs(g, "/v1/completions", {"prompt": p, "max_tokens": N,
                                                                            "temperature": 0, "logprobs": 5})
                G.check(each, "a completions chunk with text came without logprobs")
                G.check(text == comp["choices"][0]["text"], "streamed text %r vs %r", text, comp["choices"][0]["text"])
                G.check_eq(merged, comp["choices"][0]["logprobs"], "streamed completions logprobs of %r" % p)
                merged, text, each = stream_logprobs(g, chat, {"messages": msgs, "max_tokens": N, "temperature": 0,
                                                               "logprobs": True, "top_logprobs": 4})
                G.check(each, "a chat chunk with text came without logprobs")
                G.check_eq(merged, {"content": r.json["choices"][0]["logprobs"]["content"]},
                           "streamed chat logprobs of %r" % p)
            if name == "spec":
                sampled = {p: g.complete(p, N, temperature=0.7, top_k=20, seed=11, logprobs=1) for p in prompts}
    for p in prompts:
        plain, spec = answers["plain", p][0], answers["spec", p][0]
        ids = spec["orochi"]["token_ids"]
        G.check_eq(ids, G.run_ids(model, p, N), "speculative ids of %r against orochi run" % p)
        G.check_eq(plain["orochi"]["token_ids"], ids, "plain ids of %r" % p)
        a, b = plain["choices"][0]["logprobs"], spec["choices"][0]["logprobs"]
        G.check_eq(a["tokens"], b["tokens"], "tokens plain vs speculative")
        G.check_eq(a["text_offset"], b["text_offset"], "text_offset plain vs speculative")
        worst = max(abs(x - y) for x, y in zip(a["token_logprobs"], b["token_logprobs"]))
        for ta, tb in zip(a["top_logprobs"], b["top_logprobs"]):
            G.check_eq(list(ta), list(tb), "alternatives plain vs speculative")
            worst = max([worst] + [abs(ta[k] - tb[k]) for k in ta])
        ca, cb = answers["plain", p][1], answers["spec", p][1]
        for ea, eb in zip(ca["choices"][0]["logprobs"]["content"], cb["choices"][0]["logprobs"]["content"]):
            G.check(ea["token"] == eb["token"], "chat token plain %r vs speculative %r", ea, eb)
            worst = max([worst, abs(ea["logprob"] - eb["logprob"])] +
                        [abs(x["logprob"] - y["logprob"]) for x, y in zip(ea["top_logprobs"], eb["top_logprobs"])])
        G.check(worst <= TOL_SPEC, "%r: plain and speculative logprobs differ by %g", p, worst)
        # the reference: log-softmax of `orochi eval`'s logits for the prompt and the ids
        prompt_ids = tokenize(model, p)
        G.check(len(prompt_ids) == spec["usage"]["prompt_tokens"], "tokenize gave %d ids, the group %d",
                len(prompt_ids), spec["usage"]["prompt_tokens"])
        n_rep = len(b["token_logprobs"])
        ref = eval_logprobs(model, prompt_ids, ids[:n_rep])
        err = 0.0
        for j in range(n_rep):
            # the chosen token's value, and the five alternatives' against the five largest
            best = sorted(ref[j][1].tolist() if np is not None else ref[j][1], reverse=True)[:5]
            err = max([err, abs(b["token_logprobs"][j] - ref[j][0])] +
                      [abs(x - y) for x, y in zip(b["top_logprobs"][j].values(), best)])
        G.check(err <= TOL_REF, "%r: logprobs differ from orochi eval's by %g", p, err)
        # sampled: the reported values are the temperature-1 distribution of the ids drawn
        s = sampled[p]
        sl = check_sampled(s, "sampled %r" % p)
        s_ids = s["orochi"]["token_ids"][:len(sl["token_logprobs"])]
        sref = eval_logprobs(model, prompt_ids, s_ids)
        serr = max(abs(x - r[0]) for x, r in zip(sl["token_logprobs"], sref))
        G.check(serr <= TOL_REF, "%r sampled: logprobs differ from orochi eval's by %g", p, serr)
        G.check(spec["orochi"]["mean_accepted"] > 1.5, "%r: drafts were not accepted: %r", p, spec["orochi"])
        G.log("  %r: %d tokens (%.2f per step); plain vs speculative %.2g, vs orochi eval %.2g (sampled %.2g)"
              % (p, n_rep, spec["orochi"]["mean_accepted"], worst, err, serr))


def check_sampled(ans, what):
    lp = ans["choices"][0]["logprobs"]
    n = len(lp["tokens"])
    G.check(n == len(reported(ans)), "%s: %d tokens for %d ids", what, n, len(reported(ans)))
    for i in range(n):
        top = lp["top_logprobs"][i]
        G.check(1 <= len(top) <= 2 and lp["tokens"][i] in top, "%s: token %d alternatives %r", what, i, top)
        G.check(top[lp["tokens"][i]] == lp["token_logprobs"][i], "%s: token %d %r", what, i, top)
        G.check(all(v <= 0 for v in top.values()), "%s: token %d alternatives %r", what, i, top)
    return lp


@t.case
def test_logprobs_stop_string():
    model, prompts = model_and_prompts()
    with G.Group("lp-stop", model, workers=2, speculators=speculators(model), max_draft=6, extra=WAIT) as g:
        p = prompts[0]
        full = g.complete(p, N, logprobs=2)
        lp = full["choices"][0]["logprobs"]
        text = full["choices"][0]["text"]
        # a stop string that begins inside a token (after its first character) and first occurs there
        cut = None
        for i in range(1, len(lp["tokens"]) - 1):
            start, end = lp["text_offset"][i], lp["text_offset"][i + 1]
            if end - start >= 2 and not lp["tokens"][i].startswith("bytes:"):
                stop = text[start + 1:start + 4]
                if len(stop) >= 2 and text.find(stop) == start + 1:
                    cut, last = start + 1, i
                    break
        if cut is None:
            G.skip("no token of %r suits a stop string" % text)
        body = {"prompt": p, "max_tokens": N, "temperature": 0, "logprobs": 2, "stop": [stop]}
        r = g.http("/v1/completions", "POST", body)
        G.check(r.status == 200, "stop: %r", r)
        got = r.json["choices"][0]
        G.check(got["text"] == text[:cut] and got["finish_reason"] == "stop", "stop %r: text %r, wanted %r", stop,
                got["text"], text[:cut])
        want = {key: arr[:last + 1] for key, arr in lp.items()}
        G.check_eq(got["logprobs"], want, "logprobs cut by the stop string %r" % stop)
        merged, stext, _ = stream_logprobs(g, "/v1/completions", body)
        G.check(stext == got["text"], "streamed text %r vs %r", stext, got["text"])
        G.check_eq(merged, want, "streamed logprobs cut by the stop string %r" % stop)
        G.log("  stop %r inside token %d %r: tokens 0..%d reported, streamed too" % (stop, last, lp["tokens"][last],
                                                                                    last))


if __name__ == "__main__":
    t.main()
