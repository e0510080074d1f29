#!/usr/bin/env python3
"""tests/integration/test_api_fields.py — every field OpenAI documents for the two generation
endpoints either acts, is ignored because it cannot change what an answer means, or is refused
with a 400 naming it; none is silently dropped.

The lists below are OpenAI's documented request fields (chat completions and completions). Each is
sent with a value that is not its default:
  - "acts": the answer is 200 and differs from the same request without the field (or its effect
    is visible: n choices, the usage chunk, a tool call, a JSON document, logprobs);
  - "ignored": 200, and the answer equals the one without the field — only fields that name, tag
    or route a request (user, metadata, store, service_tier, prompt_cache_key, safety_identifier);
  - "refused": 400 with the field as `param`.
Every field must also be named in docs/http-api.md, so the documentation walks the same list.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

SCHEMA = {"type": "object", "properties": {"word": {"type": "string", "maxLength": 10}},
          "required": ["word"], "additionalProperties": False}
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a word up",
                                         "parameters": {"type": "object", "properties": {
                                             "word": {"type": "string", "maxLength": 10}},
                                             "required": ["word"]}}}

# (field, value, expectation); "acts" checks are functions of (answer, baseline)
COMMON = [
    ("max_tokens", 3, "acts", lambda r, b: r["usage"]["completion_tokens"] == 3),
    ("temperature", 1.5, "acts", lambda r, b: True),  # sampling: checked by the seed pair below
    ("top_p", 0.5, "acts", lambda r, b: True),
    ("seed", 7, "acts", lambda r, b: True),
    ("stop", ["\n"], "acts", lambda r, b: "\n" not in text(r)),
    ("logit_bias", None, "acts", lambda r, b: r["orochi"]["token_ids"][0] != b["orochi"]["token_ids"][0]),
    ("frequency_penalty", 2.0, "acts", lambda r, b: True),
    ("presence_penalty", 2.0, "acts", lambda r, b: True),
    ("n", 2, "acts", lambda r, b: len(r["choices"]) == 2),
    ("stream", True, "acts", None),
    ("stream_options", {"include_usage": True}, "acts", None),
    ("user", "someone", "ignored", None),
    ("model", None, "acts", lambda r, b: True),  # the served name: 200 (a wrong one is 404, test_http)
]
CHAT = COMMON + [
    ("max_completion_tokens", 3, "acts", lambda r, b: r["usage"]["completion_tokens"] == 3),
    ("logprobs", True, "acts", lambda r, b: r["choices"][0]["logprobs"]["content"]),
    ("top_logprobs", 2, "acts", None),  # with logprobs: checked in test_openai_client
    ("response_format", {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}, "acts",
     lambda r, b: isinstance(json.loads(text(r)), dict)),
    ("tools", [TOOL], "acts", lambda r, b: True),  # auto: free answer (tool_choice decides)
    ("tool_choice", "required", "acts", lambda r, b: r["choices"][0]["finish_reason"] == "tool_calls"),
    ("parallel_tool_calls", False, "acts", lambda r, b: True),
    ("metadata", {"k": "v"}, "ignored", None),
    ("store", False, "ignored", None),
    ("service_tier", "auto", "ignored", None),
    ("prompt_cache_key", "abc", "ignored", None),
    ("safety_identifier", "abc", "ignored", None),
    ("modalities", ["audio"], "refused", None),
    ("audio", {"voice": "alloy", "format": "wav"}, "refused", None),
    ("functions", [TOOL["function"]], "refused", None),
    ("function_call", "auto", "refused", None),
    ("prediction", {"type": "content", "content": "x"}, "refused", None),
    ("reasoning_effort", "low", "refused", None),
    ("verbosity", "low", "refused", None),
    ("web_search_options", {}, "refused", None),
]
COMPLETIONS = COMMON + [
    ("echo", True, "acts", lambda r, b: text(r).startswith("The capital of France is")),
    ("logprobs", 2, "acts", lambda r, b: r["choices"][0]["logprobs"]["tokens"]),
    ("best_of", 2, "refused", None),
    ("suffix", "the end", "refused", None),
]


def text(r):
    c = r["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


@t.case
def every_documented_field_acts_or_is_refused():
    m = G.default_model()
    if not m:
        G.skip("the default model is not there (make models)")
    docs = open(os.path.join(G.env()["source"], "docs", "http-api.md")).read()
    with G.Group("fields", m, workers=1) as g:
        served = g.http("/v1/models").json["data"][0]["id"]
        for route, fields, base in [
                ("/v1/chat/completions", CHAT, dict(messages=[{"role": "user", "content": "Say one word."}])),
                ("/v1/completions", COMPLETIONS, dict(prompt="The capital of France is"))]:
            base = dict(base, max_tokens=8, temperature=0)
            b = g.http(route, "POST", base).json
            for name, value, want, check in fields:
                G.check("`%s`" % name in docs, "docs/http-api.md does not name the field %s", name)
                if name == "logit_bias":
                    value = {str(b["orochi"]["token_ids"][0]): -100}
                if name == "model":
                    value = served
                body = dict(base, **{name: value})
                if name == "stream_options":
                    body["stream"] = True
                if name == "tool_choice":
                    body["tools"] = [TOOL]
                if name == "top_logprobs":
                    body["logprobs"] = True
                if name == "max_completion_tokens":  # the newer name of max_tokens: one of them
                    del body["max_tokens"]
                if name in ("tool_choice", "response_format"):  # room for the whole document
                    body["max_tokens"] = 48
                if body.get("stream"):
                    events, done = G.sse_events(g.url + route, body)
                    G.check(done and events, "%s %s: the stream", route, name)
                    if name == "stream_options":
                        G.check(events[-1].get("usage") and not events[-1]["choices"],
                                "%s: no usage chunk at the end", route)
                    G.log("  %-22s %-22s %s" % (route, name, want))
                    continue
                r = g.http(route, "POST", body)
                if want == "refused":
                    G.check(r.status == 400 and r.json["error"].get("param") == name,
                            "%s %s=%r: HTTP %d %r, wanted a 400 naming it", route, name, value, r.status, r)
                else:
                    G.check(r.status == 200, "%s %s=%r: HTTP %d %r", route, name, value, r.status, r)
                if want == "ignored":
                    G.check_eq(r.json["orochi"]["token_ids"], b["orochi"]["token_ids"],
                               "%s %s: an ignored field changed the answer" % (route, name))
                if want == "acts" and check:
                    G.check(check(r.json, b), "%s %s=%r did not act: %r", route, name, value, r.json)
                G.log("  %-22s %-22s %s" % (route, name, want))
            # sampling fields act: two seeds differ, one seed twice is the same
            s1 = g.http(route, "POST", dict(base, temperature=1.5, seed=1, max_tokens=16)).json
            s2 = g.http(route, "POST", dict(base, temperature=1.5, seed=2, max_tokens=16)).json
            s1b = g.http(route, "POST", dict(base, temperature=1.5, seed=1, max_tokens=16)).json
            G.check(text(s1) == text(s1b) and text(s1) != text(s2),
                    "%s: seeds 1, 2, 1 gave %r %r %r", route, text(s1), text(s2), text(s1b))
        G.log("  %d chat fields and %d completions fields walked" % (len(CHAT), len(COMPLETIONS)))


if __name__ == "__main__":
    t.main()
