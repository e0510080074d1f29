"""The group through the official `openai` Python client, the way most users will talk to it.

Completions and chat completions, streamed and not, with greedy settings: every answer parses into
the client's types, and its id, object, created, model, choices[].index, finish_reason and usage
are what OpenAI would send; the text equals what the plain HTTP path (urllib, as the other tests
use) answers for the same request, and the generated ids equal `orochi run --temp 0`. Streams
with stream_options.include_usage end with the usage chunk; the developer role works; logprobs
requested through the client parse into its types (completions: tokens, token_logprobs,
top_logprobs, text_offset; chat: content[] with token, logprob, bytes, top_logprobs), streamed and
not, the chosen token first among its alternatives; the errors the client maps to exceptions
(unknown model, prompt beyond the context, top_logprobs without logprobs, logprobs with echo)
arrive as NotFoundError / BadRequestError with OpenAI's codes.

The client is not a Debian package. When `import openai` fails for the python running this test,
the test is skipped, and says so and why (ctest reports it as skipped): install it with
`python3 -m pip install openai` (Debian's python needs --break-system-packages, or a venv whose
python runs the test).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

try:
    import openai
except ImportError as e:  # skipped out loud, with the reason
    G.skip("the openai client is not importable by %s (%s); install it with "
           "`%s -m pip install openai` to run this test" % (sys.executable, e, sys.executable))


def model_and_prompts():
    m = G.default_model()
    if m:
        return m, ["Once upon a time", "The capital of France is"], 24
    m = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=21)
    return m, ["hello world", "one two one two one two"], 24


def client_for(g):
    return openai.OpenAI(base_url=g.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def check_envelope(r, obj, served, what, t0):
    G.check(r.object == obj, "%s: object %r, wanted %r", what, r.object, obj)
    prefix = "chatcmpl-" if obj.startswith("chat") else "cmpl-"
    G.check(isinstance(r.id, str) and r.id.startswith(prefix), "%s: id %r", what, r.id)
    G.check(isinstance(r.created, int) and t0 - 5 <= r.created <= time.time() + 5, "%s: created %r", what,
            r.created)
    G.check(r.model == served, "%s: model %r, wanted %r", what, r.model, served)
    G.check(len(r.choices) == 1 and r.choices[0].index == 0, "%s: choices %r", what, r.choices)


def check_usage(u, n_ids, what):
    G.check(u is not None and u.prompt_tokens > 0 and u.completion_tokens == n_ids and
            u.total_tokens == u.prompt_tokens + u.completion_tokens, "%s: usage %r (%d ids)", what, u, n_ids)


@t.case
def test_openai_client_completions():
    model, prompts, n = model_and_prompts()
    with G.Group("openai-completions", model, workers=2, speculators=["ngram"]) as g:
        c = client_for(g)
        served = c.models.list().data[0].id
        for p in prompts:
            want_ids = G.run_ids(model, p, n)
            plain = g.complete(p, n)
            t0 = time.time()
            r = c.completions.create(model=served, prompt=p, max_tokens=n, temperature=0)
            check_envelope(r, "text_completion", served, "completion", t0)
            ch = r.choices[0]
            G.check(ch.finish_reason in ("stop", "length"), "finish_reason %r", ch.finish_reason)
            G.check(ch.finish_reason == plain["choices"][0]["finish_reason"], "finish_reason %r vs %r",
                    ch.finish_reason, plain["choices"][0]["finish_reason"])
            G.check(ch.text == plain["choices"][0]["text"], "text through the client %r vs plain HTTP %r",
                    ch.text, plain["choices"][0]["text"])
            ids = (r.model_extra or {}).get("orochi", {}).get("token_ids")
            G.check_eq(ids, want_ids, "completion ids through the client for %r" % p)
            check_usage(r.usage, len(ids), "completion")

            # streamed, with the usage chunk at the end
            t0 = time.time()
            chunks = list(c.completions.create(model=served, prompt=p, max_tokens=n, temperature=0, stream=True,
                                               stream_options={"include_usage": True}))
            G.check(len(chunks) >= 3, "only %d chunks", len(chunks))
            text_chunks, usage_chunk = chunks[:-1], chunks[-1]
            for k in text_chunks:
                check_envelope(k, "text_completion", served, "completion chunk", t0)
                G.check(k.id == text_chunks[0].id, "chunk ids differ: %r vs %r", k.id, text_chunks[0].id)
            text = "".join(k.choices[0].text for k in text_chunks)
            G.check(text == ch.text, "streamed text %r vs %r", text, ch.text)
            G.check(text_chunks[-1].choices[0].finish_reason == ch.finish_reason, "streamed finish_reason %r",
                    text_chunks[-1].choices[0].finish_reason)
            G.check(all(k.choices[0].finish_reason is None for k in text_chunks[:-1]),
                    "finish_reason before the last chunk")
            G.check(usage_chunk.choices == [], "the usage chunk has choices %r", usage_chunk.choices)
            check_usage(usage_chunk.usage, len(ids), "streamed usage")
            G.check(usage_chunk.usage.prompt_tokens == r.usage.prompt_tokens, "prompt tokens %d vs %d",
                    usage_chunk.usage.prompt_tokens, r.usage.prompt_tokens)

            # echo through the client
            e = c.completions.create(model=served, prompt=p, max_tokens=n, temperature=0, echo=True)
            G.check(e.choices[0].text == p + ch.text, "echo %r", e.choices[0].text)

            # logprobs through the client: OpenAI's completions shape, the chosen token first among
            # its alternatives (greedy), the same tokens streamed
            lr = c.completions.create(model=served, prompt=p, max_tokens=n, temperature=0, logprobs=3)
            G.check(lr.choices[0].text == ch.text, "text with logprobs %r vs %r", lr.choices[0].text, ch.text)
            lp = lr.choices[0].logprobs
            n_rep = len(ids) - (ch.finish_reason == "stop")  # the end-of-sequence token is not reported
            G.check(lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) ==
                    len(lp.text_offset) == n_rep, "completion logprobs %r (%d tokens reported)", lp, n_rep)
            for tok, val, top, off in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset):
                G.check(isinstance(tok, str) and val <= 0 and isinstance(off, int) and isinstance(top, dict) and
                        len(top) == 3 and next(iter(top.items())) == (tok, val),
                        "token %r logprob %r alternatives %r offset %r", tok, val, top, off)
            streamed = list(c.completions.create(model=served, prompt=p, max_tokens=n, temperature=0, logprobs=3,
                                                 stream=True))
            G.check(sum((k.choices[0].logprobs.tokens for k in streamed if k.choices[0].logprobs), []) == lp.tokens,
                    "streamed logprobs tokens differ from %r", lp.tokens)
            G.log("  %r: client, stream and plain HTTP agree (%d tokens, %d chunks)" % (p, len(ids), len(chunks)))


@t.case
def test_openai_client_chat():
    model, prompts, n = model_and_prompts()
    with G.Group("openai-chat", model, workers=2, speculators=["ngram"]) as g:
        c = client_for(g)
        served = c.models.list().data[0].id
        for p in prompts:
            msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": p}]
            plain = g.http("/v1/chat/completions", "POST", {"messages": msgs, "max_tokens": n, "temperature": 0})
            G.check(plain.status == 200, "plain chat: %r", plain)
            t0 = time.time()
            r = c.chat.completions.create(model=served, messages=msgs, max_tokens=n, temperature=0)
            check_envelope(r, "chat.completion", served, "chat", t0)
            ch = r.choices[0]
            G.check(ch.message.role == "assistant", "role %r", ch.message.role)
            G.check(ch.message.content == plain.json["choices"][0]["message"]["content"],
                    "chat text through the client %r vs plain HTTP %r", ch.message.content,
                    plain.json["choices"][0]["message"]["content"])
            G.check(ch.finish_reason == plain.json["choices"][0]["finish_reason"], "finish_reason %r",
                    ch.finish_reason)
            ids = (r.model_extra or {}).get("orochi", {}).get("token_ids")
            G.check_eq(ids, plain.json["orochi"]["token_ids"], "chat ids through the client")
            check_usage(r.usage, len(ids), "chat")

            # the developer role is the system role
            dev = [{"role": "developer", "content": "You are brief."}, {"role": "user", "content": p}]
            d = c.chat.completions.create(model=served, messages=dev, max_tokens=n, temperature=0)
            G.check(d.choices[0].message.content == ch.message.content, "developer %r vs system %r",
                    d.choices[0].message.content, ch.message.content)

            # streamed: role first, then content deltas, finish_reason last; then the usage chunk
            t0 = time.time()
            chunks = list(c.chat.completions.create(model=served, messages=msgs, max_tokens=n, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))
            text_chunks, usage_chunk = chunks[:-1], chunks[-1]
            for k in text_chunks:
                check_envelope(k, "chat.completion.chunk", served, "chat chunk", t0)
            G.check(text_chunks[0].choices[0].delta.role == "assistant", "first delta %r",
                    text_chunks[0].choices[0].delta)
            text = "".join(k.choices[0].delta.content or "" for k in text_chunks)
            G.check(text == ch.message.content, "streamed chat text %r vs %r", text, ch.message.content)
            G.check(text_chunks[-1].choices[0].finish_reason == ch.finish_reason, "streamed finish_reason %r",
                    text_chunks[-1].choices[0].finish_reason)
            G.check(usage_chunk.choices == [], "the usage chunk has choices %r", usage_chunk.choices)
            check_usage(usage_chunk.usage, len(ids), "streamed chat usage")

            # streamed without stream_options: the last chunk still ends the stream cleanly
            plain_stream = list(c.chat.completions.create(model=served, messages=msgs, max_tokens=n,
                                                          temperature=0, stream=True))
            G.check("".join(k.choices[0].delta.content or "" for k in plain_stream if k.choices) == text,
                    "stream without stream_options differs")

            # logprobs through the client: content[] of token, logprob, bytes, top_logprobs
            lr = c.chat.completions.create(model=served, messages=msgs, max_tokens=n, temperature=0,
                                           logprobs=True, top_logprobs=2)
            content = lr.choices[0].logprobs.content
            n_rep = len(ids) - (ch.finish_reason == "stop")  # the end-of-sequence token is not reported
            G.check(len(content) == n_rep and lr.choices[0].logprobs.refusal is None,
                    "chat logprobs %r (%d tokens reported)", lr.choices[0].logprobs, n_rep)
            for e in content:
                G.check(isinstance(e.token, str) and e.logprob <= 0 and isinstance(e.bytes, list) and
                        len(e.top_logprobs) == 2 and (e.top_logprobs[0].token, e.top_logprobs[0].logprob,
                                                      e.top_logprobs[0].bytes) == (e.token, e.logprob, e.bytes) and
                        e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob, "chat logprobs entry %r", e)
            joined = b"".join(bytes(e.bytes) for e in content)
            try:
                G.check(joined.decode() == lr.choices[0].message.content, "the tokens' bytes %r vs the text %r",
                        joined, lr.choices[0].message.content)
            except UnicodeDecodeError:  # a tiny model's bytes: the text shows U+FFFD for them
                pass
            streamed = list(c.chat.completions.create(model=served, messages=msgs, max_tokens=n, temperature=0,
                                                      logprobs=True, top_logprobs=2, stream=True))
            G.check([e.token for k in streamed if k.choices[0].logprobs for e in k.choices[0].logprobs.content] ==
                    [e.token for e in content], "streamed chat logprobs differ")
            G.log("  %r: chat through the client, streamed and plain HTTP agree (%d tokens)" % (p, len(ids)))


@t.case
def test_openai_client_errors():
    model, _, _ = model_and_prompts()
    with G.Group("openai-errors", model, workers=1, extra=["--n-ctx", "64"]) as g:
        c = client_for(g)
        served = c.models.list().data[0].id
        try:
            c.completions.create(model="gpt-4o", prompt="hi", max_tokens=4)
            raise AssertionError("an unknown model was served")
        except openai.NotFoundError as e:
            G.check(e.code == "model_not_found" and e.param == "model", "unknown model: %r %r", e.code, e.param)
        try:
            c.chat.completions.create(model=served, messages=[{"role": "user", "content": "word " * 200}],
                                      max_tokens=4)
            raise AssertionError("a prompt beyond the context was served")
        except openai.BadRequestError as e:
            G.check(e.code == "context_length_exceeded" and e.param == "messages", "context: %r %r %s",
                    e.code, e.param, e)
            G.check("64" in str(e), "the context length is not in the message: %s", e)
        try:
            c.chat.completions.create(model=served, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                      top_logprobs=2)
            raise AssertionError("top_logprobs without logprobs was served")
        except openai.BadRequestError as e:
            G.check(e.param == "top_logprobs", "top_logprobs: param %r", e.param)
        try:
            c.completions.create(model=served, prompt="hi", max_tokens=4, logprobs=1, echo=True)
            raise AssertionError("logprobs with echo were served")
        except openai.BadRequestError as e:
            G.check(e.param == "logprobs" and "echo" in str(e), "logprobs with echo: %r %s", e.param, e)
        r = c.completions.create(model=served, prompt="hi", max_tokens=4, temperature=0)
        G.check(r.choices[0].finish_reason in ("stop", "length"), "after the errors: %r", r)
        G.log("  NotFoundError model_not_found, BadRequestError context_length_exceeded, top_logprobs and "
              "logprobs with echo")


if __name__ == "__main__":
    t.main()
