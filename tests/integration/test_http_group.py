"""The HTTP API of a real group: errors are clear, the group survives them, streams add up.

Against a running group (coordinator started with a small context, --n-ctx 64): invalid JSON,
wrong field types and out-of-range values answer 400 with an error message naming the problem; a
prompt longer than the context answers 413 with a message about the context; unknown routes 404,
wrong methods 405. After all of that a normal completion still equals `orochi run --temp 0`.
Streaming (`stream: true`) sends SSE chunks whose texts concatenate to the non-streamed text and
whose final chunk carries the same token ids; `orochi generate --print-ids` (a client of the
group) prints those ids too. The streaming and client checks run on the default model when it is
present (real UTF-8 text), else on the tiny model. Requests sent together are each answered as if
alone, and a client hanging up mid-stream does not disturb the next request.
"""
import json
import os
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()


def tiny():
    return G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=21)


def expect(r, status, words, what):
    G.check(r.status == status, "%s: expected HTTP %d, got %r", what, status, r)
    msg = r.error_message()
    G.check(msg, "%s: HTTP %d without an error message: %r", what, status, r)
    for w in words:
        G.check(w.lower() in msg.lower(), "%s: the message %r does not mention %r", what, msg, w)
    G.log("  %-34s -> %d %s" % (what, r.status, msg))


@t.case
def test_http_group_errors_then_serves():
    model = tiny()
    prompt = "http errors"
    want = G.run_ids(model, prompt, 24)
    with G.Group("http-errors", model, workers=2, speculators=["ngram"], extra=["--n-ctx", "64"]) as g:
        G.check_eq(g.ids(prompt, 24), want, "completion before the errors")
        post = lambda body: g.http("/v1/completions", "POST", body)  # noqa: E731
        expect(post(b"{not json"), 400, ["JSON"], "invalid JSON")
        expect(post(b""), 400, [], "empty body")
        expect(post(b"[1, 2]"), 400, ["object"], "a JSON array")
        expect(post({"prompt": 5, "max_tokens": 8}), 400, ["prompt"], "prompt 5")
        expect(post({"prompt": "x", "max_tokens": "x"}), 400, ["max_tokens"], "max_tokens \"x\"")
        expect(post({"prompt": "x", "max_tokens": -3}), 400, ["max_tokens"], "max_tokens -3")
        expect(post({"prompt": "x", "max_tokens": 8, "temperature": "hot"}), 400, ["temperature"],
               "temperature \"hot\"")
        expect(post({"max_tokens": 8}), 400, ["prompt"], "no prompt")
        expect(post({"prompt": "x", "stream": "yes"}), 400, ["stream"], "stream \"yes\"")
        expect(g.http("/v1/chat/completions", "POST", {"messages": "hi"}), 400, ["messages"], "chat messages \"hi\"")
        long_prompt = "a long prompt that will not fit in a context of sixty-four tokens " * 4
        r = post({"prompt": long_prompt, "max_tokens": 8, "temperature": 0})
        expect(r, 413, ["context"], "prompt beyond the context")
        r = g.http("/v1/completions", "POST", {"prompt": long_prompt, "max_tokens": 8, "stream": True})
        G.check(r.status == 413 or (r.status == 200 and b"context" in r.body),
                "streamed prompt beyond the context: %r", r)
        expect(g.http("/v1/nothing-here"), 404, [], "unknown route")
        expect(g.http("/v1/nothing-here", "POST", {"prompt": "x"}), 404, [], "unknown route (POST)")
        expect(g.http("/v1/completions"), 405, [], "GET /v1/completions")
        G.check(G.pid_alive(g.coordinator_pid()), "the coordinator died")
        r = g.complete(prompt, 24)
        G.check_eq(r["orochi"]["token_ids"], want, "completion after the errors")
        # the read-only routes
        h = g.http("/health")
        G.check(h.status == 200, "/health: %r", h)
        m = g.http("/v1/models")
        G.check(m.status == 200 and any(x.get("id") for x in m.json.get("data", [])), "/v1/models: %r", m)
        met = g.http("/metrics")
        G.check(met.status == 200 and b"orochi_requests_total" in met.body, "/metrics: %r", met)
        failed = [line for line in met.body.decode().splitlines() if line.startswith("orochi_requests_failed_total")]
        G.log("  metrics: %s" % (failed[0] if failed else "(no failed counter)"))


def stream_and_client(g, model, prompts, n):
    for p in prompts:
        want = G.run_ids(model, p, n)
        whole = g.complete(p, n)
        G.check_eq(whole["orochi"]["token_ids"], want, "non-streamed %r" % p[:30])
        events, done = G.sse_events(g.url + "/v1/completions",
                                    {"prompt": p, "max_tokens": n, "temperature": 0, "stream": True})
        G.check(done, "the stream did not end with [DONE]")
        G.check(events and all("error" not in e for e in events), "stream events: %r", events[-1:])
        text = "".join(e["choices"][0].get("text") or "" for e in events)
        G.check(text == whole["choices"][0]["text"], "streamed text differs from the non-streamed text:\n"
                "  stream %r\n  whole  %r", text, whole["choices"][0]["text"])
        last = events[-1]
        G.check(last["choices"][0].get("finish_reason") == whole["choices"][0]["finish_reason"],
                "finish_reason %r vs %r", last["choices"][0].get("finish_reason"), whole["choices"][0]["finish_reason"])
        G.check_eq(last["orochi"]["token_ids"], want, "streamed token ids for %r" % p[:30])
        G.check(len(events) >= 2, "only %d events for %d tokens", len(events), n)
        # orochi generate, the CLI client of the group
        r = subprocess.run([G.env()["bin"], "generate", "--url", g.url, "--prompt", p, "-n", str(n), "--temp", "0",
                            "--print-ids"], capture_output=True, text=True, timeout=120)
        G.check(r.returncode == 0, "orochi generate failed (%d): %s", r.returncode, r.stderr)
        G.check_eq([int(x) for x in r.stdout.split()], want, "orochi generate --print-ids for %r" % p[:30])
        r = subprocess.run([G.env()["bin"], "generate", "--url", g.url, "--prompt", p, "-n", str(n), "--temp", "0",
                            "--stream", "--print-ids"], capture_output=True, text=True, timeout=120)
        G.check(r.returncode == 0, "orochi generate --stream failed (%d): %s", r.returncode, r.stderr)
        G.check_eq([int(x) for x in r.stdout.split()], want, "orochi generate --stream --print-ids for %r" % p[:30])
        G.log("  %r: %d events, text and ids agree (whole, stream, generate)" % (p[:30], len(events)))


@t.case
def test_http_group_stream_and_generate_tiny():
    model = tiny()
    with G.Group("http-stream-tiny", model, workers=2, speculators=["ngram"]) as g:
        stream_and_client(g, model, ["hello world", "streaming: one two one two one two"], 40)


@t.case
def test_http_group_stream_and_generate_default_model():
    model = G.default_model()
    if not model:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    with G.Group("http-stream-real", model, workers=2, speculators=["ngram"]) as g:
        stream_and_client(g, model, ["Once upon a time", "List three fruits: apple,"], 32)
        # a stop string cuts the text, in the stream and in the whole answer alike
        p = "Count: one, two, three, four, five, six,"
        whole = g.complete(p, 32, stop=[","])
        events, _ = G.sse_events(g.url + "/v1/completions",
                                 {"prompt": p, "max_tokens": 32, "temperature": 0, "stream": True, "stop": [","]})
        text = "".join(e["choices"][0].get("text") or "" for e in events)
        G.check("," not in whole["choices"][0]["text"], "stop string in the text: %r", whole["choices"][0]["text"])
        G.check(text == whole["choices"][0]["text"], "stop: stream %r vs whole %r", text, whole["choices"][0]["text"])


@t.case
def test_http_group_concurrent_requests_and_client_gone():
    # requests arriving together are served one after another, each exactly as alone; a client
    # that hangs up mid-stream cancels its request without disturbing the next one
    model = G.mkmodel(layers=4, dim=192, ffn=256, heads=6, kv_heads=6, vocab=300, ctx=256, type="f32", seed=2)
    prompts = ["hello world", "one two one two one two", "def f(x): return x", "abc abc abc abc"]
    want = {p: G.run_ids(model, p, 40) for p in prompts}
    with G.Group("http-concurrent", model, workers=2, speculators=["ngram", "layerskip:layers=0-1"]) as g:
        got, errors = {}, []

        def one(p, i):
            try:
                got[(p, i)] = g.ids(p, 40)
            except Exception as e:  # noqa: BLE001 - collected and reported below
                errors.append(repr(e))
        threads = [threading.Thread(target=one, args=(p, i)) for i in range(2) for p in prompts]
        for th in threads:
            th.start()
        for th in threads:
            th.join(180)
        G.check(not errors, "concurrent requests failed: %s", errors)
        for (p, i), ids in sorted(got.items()):
            G.check_eq(ids, want[p], "concurrent request %d for %r" % (i, p))
        G.log("  %d concurrent requests identical to orochi run" % len(got))

        body = json.dumps({"prompt": "hello world", "max_tokens": 200, "temperature": 0, "stream": True}).encode()
        s = socket.create_connection(("127.0.0.1", g.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        head = s.recv(200)
        G.check(head.startswith(b"HTTP/1.1 200"), "streaming answer starts %r", head)
        s.close()
        G.check_eq(g.ids("hello world", 40), want["hello world"], "completion after a client hung up")
        G.check(G.pid_alive(g.coordinator_pid()), "the coordinator died")


if __name__ == "__main__":
    t.main()
