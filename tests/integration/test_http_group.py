"""The HTTP API of a real group: errors are clear, the group survives them, streams add up.

Against a running group (coordinator started with a small context, --n-ctx 64): invalid JSON,
wrong field types and out-of-range values answer 400 with an error message naming the problem; a
prompt longer than the context answers 400 with code context_length_exceeded, as OpenAI does;
unknown routes 404, wrong methods 405. After all of that a normal completion still equals
`orochi run --temp 0`. OpenAI's shapes: text with a NUL or bytes that are not UTF-8 is refused
naming the field (never cut), an unknown model is 404 model_not_found, the developer role is the
system role, logprobs are answered and their invalid forms (out of range, top_logprobs without
logprobs, logprobs with echo) refused by name, as is n > 1, echo puts the prompt before the text,
stream_options.include_usage adds the usage chunk.
Streaming (`stream: true`) sends SSE chunks whose texts concatenate to the non-streamed text and
whose final chunk carries the same token ids; `orochi generate --print-ids` (a client of the
group) prints those ids too. The streaming and client checks run on the default model when it is
present (real UTF-8 text), else on the tiny model. Requests sent together are each answered as if
alone, and a client hanging up mid-stream does not disturb the next request and is counted as 499
in /metrics. Slowloris: with 1000 idle connections held open a good request is answered within a
second, and the idle ones are closed after the header timeout.
"""
import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()


def tiny():
    return G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=21)


def expect(r, status, words, what, param=None, code=None):
    G.check(r.status == status, "%s: expected HTTP %d, got %r", what, status, r)
    msg = r.error_message()
    G.check(msg, "%s: HTTP %d without an error message: %r", what, status, r)
    for w in words:
        G.check(w.lower() in msg.lower(), "%s: the message %r does not mention %r", what, msg, w)
    err = r.json["error"]
    if param is not None:
        G.check(err.get("param") == param, "%s: param %r, wanted %r", what, err.get("param"), param)
    if code is not None:
        G.check(err.get("code") == code, "%s: code %r, wanted %r", what, err.get("code"), code)
    G.log("  %-34s -> %d %s" % (what, r.status, msg))


def held_ids(g, prompts, n, seconds):
    """Each prompt's generated ids, the requests sent together while the workers are held
    (Group.send_held), and the errors of those that failed."""
    got, errors = {}, []

    def one(p):
        try:
            got[p] = g.ids(p, n)
        except Exception as e:  # noqa: BLE001 - returned for the caller to report
            errors.append(repr(e))
    g.send_held([lambda p=p: one(p) for p in prompts], seconds)
    return got, errors


def metric(g, route, code):
    """The value of orochi_http_requests_total{route, code} (0 when absent)."""
    body = g.http("/metrics").body.decode()
    m = re.search(r'^orochi_http_requests_total\{route="%s",code="%s"\} (\d+)$' % (re.escape(route), code),
                  body, re.M)
    return int(m.group(1)) if m else 0


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
        expect(r, 400, ["context holds 64", "tokens"], "prompt beyond the context", "prompt",
               "context_length_exceeded")
        r = g.http("/v1/completions", "POST", {"prompt": long_prompt, "max_tokens": 8, "stream": True})
        expect(r, 400, ["context"], "streamed prompt beyond the context", "prompt", "context_length_exceeded")
        r = g.http("/v1/chat/completions", "POST", {"messages": [{"role": "user", "content": long_prompt}]})
        expect(r, 400, ["context"], "chat beyond the context", "messages", "context_length_exceeded")
        # a body over the byte limit is still 413
        expect(post({"prompt": "x" * (1 << 20)}), 413, ["limit"], "body over 1 MiB")
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
        # the stream that lost its client is counted as 499, not as 200
        deadline = time.time() + 10
        while metric(g, "/v1/completions", 499) < 1 and time.time() < deadline:
            time.sleep(0.1)
        G.check(metric(g, "/v1/completions", 499) == 1, "the hung-up stream is not counted as 499:\n%s",
                "\n".join(x for x in g.http("/metrics").body.decode().splitlines() if "http_requests" in x))


@t.case
def test_http_group_64_concurrent_with_default_slots():
    # --max-batch auto: a CPU group takes as many sequence slots as half the free memory holds at
    # full context (64 for this small model), says so in its log, and decodes 64 requests sent
    # together in shared steps, each answer equal to the same request sent alone
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=256, type="f32", seed=5)
    with G.Group("http-64", model, workers=1) as g:
        m = re.search(r"sequence slots: (\d+) \(--max-batch auto", g.log("coordinator"))
        G.check(m, "no sequence-slot line in the coordinator's log:\n%s", g.log("coordinator")[-2000:])
        slots = int(m.group(1))
        G.log("  the group chose %d sequence slots" % slots)
        prompts = ["%s %d" % (w, i) for i, w in enumerate(["one two", "abc abc", "x y z", "hello"] * 16)]

        def burst():
            # the worker is held while the 64 arrive (an answer takes ~15 ms here)
            got, errors = held_ids(g, prompts, 120, 1)
            G.check(not errors, "concurrent requests failed: %s", errors[:3])
            return got

        def buckets():
            body = g.http("/metrics").body.decode()
            return body, dict(re.findall(r'orochi_batch_size_bucket\{le="([^"]+)"\} (\d+)', body))

        got = burst()
        body, b = buckets()
        # should a step still never have held more than 16 of them, the burst is sent again, up to
        # twice more
        for attempt in range(2):
            if slots < 16 or int(b["16"]) < int(b["+Inf"]):
                break
            G.log("  burst %d: no step held more than 16 requests (sent again)" % (attempt + 1))
            burst()
            body, b = buckets()
        gauge = dict(re.findall(r"^(orochi_sequence_slots|orochi_kv_bytes_held|orochi_kv_bytes_full) (\d+)$",
                                body, re.M))
        G.check(int(gauge.get("orochi_sequence_slots", -1)) == slots, "orochi_sequence_slots %s, the log %d",
                gauge.get("orochi_sequence_slots"), slots)
        # a slot that served has written a page or more of each K/V region (2 layers x K, V x 2 KV
        # heads), the 120-token answers at most half of the slots' 256-row contexts
        held, full = int(gauge.get("orochi_kv_bytes_held", 0)), int(gauge.get("orochi_kv_bytes_full", 0))
        G.check(2 * 2 * 2 * 4096 <= held <= full / 2, "K/V held %d bytes of %d", held, full)
        G.log("  K/V held after the burst: %.1f MB of %.1f MB at full context" % (held / 1e6, full / 1e6))
        for p in prompts:
            G.check_eq(got[p], g.ids(p, 120), "request %r sent with 63 others and alone" % p)
        if slots < 16:
            G.log("  SKIP the batch-width check: only %d slots fit this machine's free memory" % slots)
            return
        total, le16 = int(b["+Inf"]), int(b["16"])
        G.check(le16 < total, "no step verified more than 16 requests (%d of %d steps at 16 or fewer)",
                le16, total)
        G.log("  64 requests together: %d of %d steps held more than 16 of them; every answer "
              "equal to the request alone" % (total - le16, total))


@t.case
def test_http_group_idle_slots_give_back_kv():
    # --kv-release 1: a slot idle for a second gives its K/V pages back (the held gauge drops to
    # 0, the log says so) and the next request, which can no longer start from the kept rows,
    # computes its prompt again and answers the same
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=256, type="f32", seed=5)
    with G.Group("http-kv-release", model, workers=1, extra=["--kv-release", "1"]) as g:
        first = g.complete("one two three four", 40)
        held = lambda: int(re.search(r"^orochi_kv_bytes_held (\d+)$", g.http("/metrics").body.decode(),  # noqa: E731
                                     re.M).group(1))
        G.check(held() > 0, "no K/V held after a request")
        G.check(g.wait_log("coordinator", "gave back the K/V pages of 1 slot idle for 1 s", 10),
                "no release in the log:\n%s", g.log("coordinator")[-1500:])
        deadline = time.time() + 5
        while held() and time.time() < deadline:
            time.sleep(0.2)
        G.check_eq(held(), 0, "K/V bytes held after the release")
        again = g.complete("one two three four", 40)
        G.check_eq(again["orochi"]["token_ids"], first["orochi"]["token_ids"], "the answer after the release")
        G.log("  a slot idle for 1 s gave its K/V back; the same request answered the same after it")


@t.case
def test_http_group_shared_prefix():
    # --prefix-share (default on in CPU groups): requests whose prompts begin alike read that
    # beginning's K/V rows where the first of them wrote them. Two workers (both read the lend
    # table) and a layerskip drafter reading the target's rows in place: bursts of 8 requests
    # with one long beginning, then 8 with another (the lenders' slots written again while
    # their borrowers live), then the first again mixed with the second: every answer equals
    # `orochi run`; the gauge says rows are lent, and a group with --prefix-share off lends none
    # and holds more. Then idle lenders and borrowers give their pages back and answer the same.
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=1024, type="f32", seed=9)
    head_a = " ".join("alpha%d beta" % i for i in range(40))
    head_b = " ".join("gamma%d delta" % i for i in range(40))
    bursts = [[head_a + " q%d" % i for i in range(8)], [head_b + " r%d" % i for i in range(8)],
              [(head_a if i % 2 else head_b) + " s%d" % i for i in range(8)]]
    want = {p: G.run_ids(model, p, 24) for b in bursts for p in b}
    gauges = {}
    for share in ("on", "off"):
        with G.Group("http-share-" + share, model, workers=2, speculators=["layerskip"],
                     extra=["--max-batch", "8", "--prefix-share", share]) as g:
            for k, burst in enumerate(bursts):
                got, errors = held_ids(g, burst, 24, 0.5)
                G.check(not errors, "--prefix-share %s, burst %d: %s", share, k, errors[:3])
                for p in burst:
                    G.check_eq(got[p], want[p], "--prefix-share %s, burst %d: %r" % (share, k, p[-4:]))
                if k == 0:
                    body = g.http("/metrics").body.decode()
                    gauges[share] = {n: int(v) for n, v in re.findall(
                        r"^(orochi_kv_bytes_held|orochi_kv_bytes_lent) (\d+)$", body, re.M)}
    G.log("  after the first burst: %r" % gauges)
    G.check(gauges["on"]["orochi_kv_bytes_lent"] > 0, "nothing lent with --prefix-share on: %r", gauges)
    G.check_eq(gauges["off"]["orochi_kv_bytes_lent"], 0, "bytes lent with --prefix-share off")
    G.check(gauges["on"]["orochi_kv_bytes_held"] < gauges["off"]["orochi_kv_bytes_held"],
            "sharing holds no less: %r", gauges)
    # idle lenders and borrowers give their pages back (--kv-release 1) and answer the same after
    with G.Group("http-share-release", model, workers=1, extra=["--max-batch", "8", "--kv-release", "1"]) as g:
        for k in range(2):
            got, errors = held_ids(g, bursts[0], 24, 0.5)
            G.check(not errors, "after %d releases: %s", k, errors[:3])
            for p in bursts[0]:
                G.check_eq(got.get(p), want[p], "after %d releases: %r" % (k, p[-4:]))
            if k == 0:
                g.wait_log("coordinator", "gave back the K/V pages of", 15)
                gauge = lambda: sum(int(v) for v in re.findall(  # noqa: E731
                    r"^orochi_kv_bytes_(?:lent|held) (\d+)$", g.http("/metrics").body.decode(), re.M))
                deadline = time.time() + 10
                while gauge() and time.time() < deadline:
                    time.sleep(0.2)
                G.check_eq(gauge(), 0, "K/V bytes held or lent after the idle slots' release")
    G.log("  24 requests in bursts of 8 sharing two beginnings: every answer equal to orochi run, "
          "%.1f kB lent, %.1f kB held (%.1f kB without sharing)" % (
              gauges["on"]["orochi_kv_bytes_lent"] / 1e3, gauges["on"]["orochi_kv_bytes_held"] / 1e3,
              gauges["off"]["orochi_kv_bytes_held"] / 1e3))


@t.case
def test_http_group_openai_shapes():
    model = G.default_model() or tiny()
    with G.Group("http-openai", model, workers=2, speculators=["ngram"]) as g:
        served = g.http("/v1/models").json["data"][0]["id"]
        post = lambda path, body: g.http(path, "POST", body)  # noqa: E731
        chat = "/v1/chat/completions"
        # text arrives whole or is refused by name: never cut at a NUL, never mangled
        expect(post("/v1/completions", {"prompt": "Once\u0000 upon a time", "max_tokens": 4}), 400,
               ["NUL"], "NUL in the prompt", "prompt")
        expect(post(chat, {"messages": [{"role": "user", "content": "Once\u0000 upon a time"}]}), 400,
               ["NUL"], "NUL in a message", "messages[0].content")
        expect(post("/v1/completions", b'{"prompt":"caf\xe9 au lait","max_tokens":4}'), 400,
               ["UTF-8"], "invalid UTF-8 in the prompt", "prompt")
        expect(post(chat, b'{"messages":[{"role":"user","content":"ol\xe9"}]}'), 400, ["UTF-8"],
               "invalid UTF-8 in a message", "messages[0].content")
        # the model: the served name is served, any other is OpenAI's 404 model_not_found
        expect(post("/v1/completions", {"model": "gpt-4o", "prompt": "hi"}), 404, ["does not exist", served],
               "unknown model", "model", "model_not_found")
        expect(post(chat, {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}), 404, [served],
               "unknown model (chat)", "model", "model_not_found")
        G.check(g.complete("hi", 4, model=served)["model"] == served, "the served model name is refused")
        # logprobs as OpenAI takes them (test_logprobs checks the values); what they cannot be is
        # refused by name
        hi = [{"role": "user", "content": "hi"}]
        r = post("/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": 0, "logprobs": 2})
        G.check(r.status == 200 and len(r.json["choices"][0]["logprobs"]["tokens"]) >= 1, "logprobs 2: %r", r)
        r = post(chat, {"messages": hi, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 2})
        G.check(r.status == 200 and len(r.json["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2,
                "chat logprobs: %r", r)
        expect(post("/v1/completions", {"prompt": "hi", "logprobs": 6}), 400, ["0 to 5"], "logprobs 6", "logprobs")
        expect(post("/v1/completions", {"prompt": "hi", "logprobs": 1, "echo": True}), 400, ["echo"],
               "logprobs with echo", "logprobs")
        expect(post(chat, {"messages": hi, "logprobs": 2}), 400, ["true or false"], "chat logprobs 2", "logprobs")
        expect(post(chat, {"messages": hi, "top_logprobs": 2}), 400, ["requires logprobs"],
               "top_logprobs without logprobs", "top_logprobs")
        expect(post(chat, {"messages": hi, "logprobs": True, "top_logprobs": 21}), 400, ["0 to 20"],
               "top_logprobs 21", "top_logprobs")
        # what the server cannot do is refused by name
        expect(post("/v1/completions", {"prompt": "hi", "n": 9}), 400, ["n must be an integer from 1 to 8"],
               "n 9", "n")
        # the developer role is the system role
        conv = lambda role: {"messages": [{"role": role, "content": "Answer in one word."},  # noqa: E731
                                          {"role": "user", "content": "What colour is the sky?"}],
                             "max_tokens": 12, "temperature": 0}
        dev, sys_ = post(chat, conv("developer")), post(chat, conv("system"))
        G.check(dev.status == 200 and sys_.status == 200, "developer / system: %r / %r", dev, sys_)
        G.check_eq(dev.json["orochi"]["token_ids"], sys_.json["orochi"]["token_ids"], "developer role vs system role")
        # echo: the prompt, then the completion
        p = "The capital of France is"
        plain = g.complete(p, 12)
        echoed = g.complete(p, 12, echo=True)
        G.check(echoed["choices"][0]["text"] == p + plain["choices"][0]["text"], "echo: %r vs %r + %r",
                echoed["choices"][0]["text"], p, plain["choices"][0]["text"])
        events, done = G.sse_events(g.url + "/v1/completions", {"prompt": p, "max_tokens": 12, "temperature": 0,
                                                                "stream": True, "echo": True})
        text = "".join(e["choices"][0].get("text") or "" for e in events if e.get("choices"))
        G.check(done and text == echoed["choices"][0]["text"], "streamed echo %r vs %r", text,
                echoed["choices"][0]["text"])
        # stream_options.include_usage: a last chunk with no choices and the usage
        for path, body in (("/v1/completions", {"prompt": p}),
                           (chat, {"messages": [{"role": "user", "content": p}]})):
            body = dict(body, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True})
            events, done = G.sse_events(g.url + path, body)
            G.check(done, "include_usage: no [DONE]")
            last = events[-1]
            G.check(last["choices"] == [] and last["usage"]["completion_tokens"] >= 1, "usage chunk %r", last)
            G.check(all(e.get("usage", "absent") is None for e in events[:-1]),
                    "include_usage: chunks before the last should have usage null: %r", events[:-1])
            whole = g.http(path, "POST", dict(body, stream=False, stream_options=None)).json
            # the same prompt again starts from the K/V the first request left (cached_tokens)
            cached = whole["usage"].pop("prompt_tokens_details")["cached_tokens"]
            G.check(0 < cached < whole["usage"]["prompt_tokens"],
                    "the repeated prompt reuses %r of its %d tokens", cached,
                    whole["usage"]["prompt_tokens"])
            G.check(isinstance(last["usage"].pop("prompt_tokens_details")["cached_tokens"], int),
                    "include_usage: no cached_tokens in %r", last["usage"])
            G.check_eq(last["usage"], whole["usage"], "include_usage: usage of %s" % path)
        G.log("  NUL, UTF-8, model_not_found, logprobs, n, developer, echo, include_usage: as OpenAI")


@t.case
def test_http_group_slowloris_1000_idle_connections():
    # 1000 connections held open, half silent and half with a partial header: a good request is
    # still answered within a second, and the idle ones are closed by the header timeout (10 s)
    n = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n + 200
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            raise G.Skip("this process may open only %d files (hard limit); the test needs %d" % (hard, want))
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    model = tiny()
    prompt = "slowloris"
    want_ids = G.run_ids(model, prompt, 8)
    with G.Group("http-slowloris", model, workers=1) as g:
        idle = []
        t0 = time.time()
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", g.port), timeout=10)
            if i % 2:
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: appl")
            idle.append(s)
        G.log("  %d idle connections opened in %.2f s" % (n, time.time() - t0))
        time.sleep(0.5)
        t1 = time.time()
        r = g.http("/v1/completions", "POST", {"prompt": prompt, "max_tokens": 8, "temperature": 0}, timeout=30)
        took = time.time() - t1
        G.check(r.status == 200, "the good request behind %d idle connections: %r", n, r)
        G.check_eq(r.json["orochi"]["token_ids"], want_ids, "the good request's ids")
        t2 = time.time()
        h = g.http("/health", timeout=30)
        took_health = time.time() - t2
        G.log("  with %d idle connections: completion answered in %.3f s, /health in %.3f s" % (n, took, took_health))
        G.check(took < 1.0 and took_health < 1.0 and h.status == 200,
                "answers took %.3f s / %.3f s with %d idle connections", took, took_health, n)
        body = g.http("/metrics").body.decode()
        m = re.search(r"^orochi_http_open_connections (\d+)$", body, re.M)
        G.check(m and int(m.group(1)) >= n, "open connections in /metrics: %s", m and m.group(1))
        # the header timeout (10 s of quiet) closes them
        deadline = time.time() + 16
        open_ = set(range(n))
        while open_ and time.time() < deadline:
            for i in list(open_):
                try:
                    idle[i].setblocking(False)
                    if idle[i].recv(4096) == b"":
                        open_.discard(i)
                except BlockingIOError:
                    pass
                except OSError:
                    open_.discard(i)
            time.sleep(0.2)
        G.log("  %d of %d idle connections closed by the server %.1f s after they opened" % (
            n - len(open_), n, time.time() - t0))
        G.check(not open_, "%d idle connections still open after the header timeout", len(open_))
        for s in idle:
            s.close()
        G.check_eq(g.ids(prompt, 8), want_ids, "a completion after the idle connections")


if __name__ == "__main__":
    t.main()
