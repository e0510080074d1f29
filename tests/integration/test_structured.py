#!/usr/bin/env python3
"""tests/integration/test_structured.py — structured output and tools through grammar-constrained
decoding, lossless under speculation.

On the default model, through a group without speculators (plain steps, the grammar's forced text
still drafted) and one with ngram and layerskip drafting trees:
  - a grammar of the "grammar" extension field: every answer is a sentence of it, greedy answers
    equal token for token in both groups;
  - response_format json_schema: the content parses and validates against the schema (checked
    with python3-jsonschema, an independent validator), equal in both groups, streamed and plain
    alike; json_object parses as an object; sampling (temperature 1, several seeds) still gives
    valid documents;
  - tools with tool_choice "required" and a named function: tool_calls of that function whose
    arguments parse and validate against its parameters, finish_reason "tool_calls", streamed and
    plain alike; a conversation with the assistant's call and a tool turn is answered;
  - through the official openai client when it is importable (else that part says why it is
    skipped): a json_schema answer parses, tool_choice "required" returns the named call;
  - bad grammars and schemas are refused with a 400 naming what is wrong, the group serving on.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

try:
    import jsonschema
except ImportError:  # Debian python3-jsonschema (deploy/install-deps.sh); said out loud below
    jsonschema = None
    print("test_structured: python3-jsonschema is not importable: the JSON answers are parsed, "
          "not validated against their schemas", flush=True)

t = G.Tests()

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"]},
    },
}


def validate(doc, schema, what):
    if jsonschema is not None:
        try:
            jsonschema.validate(doc, schema)
        except jsonschema.ValidationError as e:
            raise AssertionError("%s: %r does not validate: %s" % (what, doc, e.message))


def chat(g, messages, n=80, **kw):
    body = dict(messages=messages, max_tokens=n, temperature=kw.pop("temperature", 0), **kw)
    r = g.http("/v1/chat/completions", "POST", body, timeout=240)
    G.check(r.status == 200, "chat %r: HTTP %d %r", kw, r.status, r)
    return r.json


def chat_stream(g, messages, n=80, **kw):
    body = dict(messages=messages, max_tokens=n, temperature=0, stream=True, **kw)
    events, done = G.sse_events(g.url + "/v1/chat/completions", body, timeout=240)
    G.check(done, "the stream ended without [DONE]")
    content, calls, finish = "", [], None
    for ev in events:
        for ch in ev.get("choices", []):
            d = ch.get("delta", {})
            content += d.get("content") or ""
            calls += d.get("tool_calls") or []
            finish = ch.get("finish_reason") or finish
    return content, calls, finish


def model():
    m = G.default_model()
    if not m:
        G.skip("the default model is not there (make models)")
    return m


def groups(m):
    return (G.Group("struct-plain", m, workers=1),
            G.Group("struct-spec", m, workers=2, speculators=["ngram", "layerskip"],
                    extra=["--draft-wait", "fixed", "--draft-wait-ms", "2000"]))


@t.case
def grammar_and_json_schema_are_lossless():
    m = model()
    plain, spec = groups(m)
    with plain, spec:
        # the extension field: a grammar of the client's own
        gram = 'root ::= "The answer is " [0-9]{1,3} "." ( " " [A-Z] [a-z]{1,12} "." )?'
        for p in ["What is 6 times 7?", "How many legs has a spider?"]:
            a = plain.complete(p, 24, grammar=gram)
            b = spec.complete(p, 24, grammar=gram)
            G.check_eq(b["orochi"]["token_ids"], a["orochi"]["token_ids"], "%r: grammar, spec vs plain" % p)
            text = a["choices"][0]["text"]
            G.check(re.fullmatch(r"The answer is [0-9]{1,3}\.( [A-Z][a-z]{1,12}\.)?", text),
                    "%r: %r is not a sentence of the grammar", p, text)
            G.log("  grammar: %r -> %r (%s tokens a step with speculation)"
                  % (p, text, b["orochi"]["mean_accepted"]))
        # json_schema: parses, validates, lossless, streamed = plain
        rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        accepted = []
        for q in ["Describe a person who lives in Paris as JSON.", "Invent a character for a novel."]:
            msgs = [{"role": "user", "content": q}]
            a = chat(plain, msgs, 96, response_format=rf)
            b = chat(spec, msgs, 96, response_format=rf)
            G.check_eq(b["orochi"]["token_ids"], a["orochi"]["token_ids"], "%r: json_schema, spec vs plain" % q)
            accepted.append(b["orochi"]["mean_accepted"])
            content = a["choices"][0]["message"]["content"]
            G.check(a["choices"][0]["finish_reason"] == "stop", "%r: finish %r (max_tokens too small?)",
                    q, a["choices"][0]["finish_reason"])
            doc = json.loads(content)
            validate(doc, PERSON, q)
            streamed, _, finish = chat_stream(plain, msgs, 96, response_format=rf)
            G.check_eq(streamed, content, "%r: the streamed content" % q)
            G.log("  json_schema: %r -> %s" % (q, content))
        G.check(max(accepted) > 1.3, "speculation verified little (tokens a step %s)", accepted)
        # json_object, and sampling keeps every document valid
        for seed in range(3):
            r = chat(plain, [{"role": "user", "content": "Give me a JSON object about cats."}], 64,
                     response_format={"type": "json_object"}, temperature=1.0, seed=seed)
            c = r["choices"][0]
            if c["finish_reason"] == "stop":
                G.check(isinstance(json.loads(c["message"]["content"]), dict), "seed %d: %r", seed, c)
            r = chat(spec, [{"role": "user", "content": "Describe a person."}], 96, response_format=rf,
                     temperature=1.0, seed=seed)
            c = r["choices"][0]
            if c["finish_reason"] == "stop":
                validate(json.loads(c["message"]["content"]), PERSON, "sampled, seed %d" % seed)
        G.log("  sampling, 3 seeds: json_object and json_schema answers parse and validate")


@t.case
def tools_are_called():
    m = model()
    plain, spec = groups(m)
    with plain, spec:
        msgs = [{"role": "user", "content": "What is the weather like in Tokyo?"}]
        for choice, want in [("required", None),
                             ({"type": "function", "function": {"name": "get_time"}}, "get_time")]:
            a = chat(plain, msgs, 64, tools=[WEATHER, TIME], tool_choice=choice)
            b = chat(spec, msgs, 64, tools=[WEATHER, TIME], tool_choice=choice)
            G.check_eq(b["orochi"]["token_ids"], a["orochi"]["token_ids"], "tool_choice %r, spec vs plain" % choice)
            c = a["choices"][0]
            G.check(c["finish_reason"] == "tool_calls" and c["message"]["content"] is None,
                    "tool_choice %r: %r", choice, c)
            call = c["message"]["tool_calls"][0]
            name = call["function"]["name"]
            G.check(want is None and name in ("get_weather", "get_time") or name == want,
                    "tool_choice %r called %r", choice, name)
            params = (WEATHER if name == "get_weather" else TIME)["function"]["parameters"]
            validate(json.loads(call["function"]["arguments"]), params, "%s arguments" % name)
            _, scalls, finish = chat_stream(plain, msgs, 64, tools=[WEATHER, TIME], tool_choice=choice)
            G.check(finish == "tool_calls" and len(scalls) == 1 and
                    scalls[0]["function"] == call["function"] and scalls[0]["id"].startswith("call_"),
                    "tool_choice %r: streamed %r, plain %r", choice, scalls, call)
            G.log("  tool_choice %r -> %s(%s)" % (choice, name, call["function"]["arguments"]))
        # the call and its result in the conversation: answered
        convo = msgs + [
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather",
                                          "arguments": "{\"city\": \"Tokyo\", \"unit\": \"celsius\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
        ]
        r = chat(plain, convo, 32, tools=[WEATHER, TIME])
        G.check(r["choices"][0]["message"]["content"] or r["choices"][0]["message"].get("tool_calls"),
                "the answer after a tool turn is empty: %r", r)
        G.log("  after the tool turn: %r" % (r["choices"][0]["message"]["content"],))


@t.case
def official_client():
    try:
        import openai
    except ImportError as e:
        G.log("  SKIPPED part: the openai client is not importable (%s)" % e)
        return
    m = model()
    with G.Group("struct-client", m, workers=1) as g:
        cl = openai.OpenAI(base_url=g.url + "/v1", api_key="unused", max_retries=0, timeout=240)
        r = cl.chat.completions.create(
            model=cl.models.list().data[0].id,
            messages=[{"role": "user", "content": "Describe a person as JSON."}], temperature=0, max_tokens=96,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        validate(json.loads(r.choices[0].message.content), PERSON, "client json_schema")
        r = cl.chat.completions.create(
            model=cl.models.list().data[0].id, temperature=0, max_tokens=64,
            messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER, TIME],
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        call = r.choices[0].message.tool_calls[0]
        G.check(call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls",
                "client tool call %r", r)
        validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"], "client arguments")
        # n: 2 gives two choices; logit_bias -100 on the greedy first token changes it
        model_id = cl.models.list().data[0].id
        msgs = [{"role": "user", "content": "Name a color."}]
        r = cl.chat.completions.create(model=model_id, messages=msgs, n=2, temperature=1.0, seed=3, max_tokens=8)
        G.check(len(r.choices) == 2 and [c.index for c in r.choices] == [0, 1], "client n=2: %r", r)
        c = cl.completions.create(model=model_id, prompt="The capital of France is", max_tokens=3, temperature=0)
        first = c.model_extra["orochi"]["token_ids"][0]
        b = cl.completions.create(model=model_id, prompt="The capital of France is", max_tokens=3, temperature=0,
                                  logit_bias={str(first): -100})
        G.check(b.model_extra["orochi"]["token_ids"][0] != first, "client logit_bias -100 kept token %d", first)
        G.log("  official client: json_schema parses and validates; get_weather(%s); n=2 gives 2 choices; "
              "logit_bias -100 moves the first token" % call.function.arguments)


@t.case
def n_choices_share_the_prompt():
    m = model()
    with G.Group("struct-n", m, workers=1) as g:
        msgs = [{"role": "user", "content": "Tell me a short story about a robot."}]
        body = dict(messages=msgs, n=3, max_tokens=24, temperature=1.0, seed=40)
        r = g.http("/v1/chat/completions", "POST", body, timeout=240)
        G.check(r.status == 200 and len(r.json["choices"]) == 3, "n=3: %r", r)
        texts = [c["message"]["content"] for c in r.json["choices"]]
        G.check_eq([c["index"] for c in r.json["choices"]], [0, 1, 2], "the choices' indices")
        for k in range(3):  # choice k is the request alone with seed + k
            one = chat(g, msgs, 24, temperature=1.0, seed=40 + k)
            G.check_eq(one["choices"][0]["message"]["content"], texts[k], "choice %d against seed %d alone" % (k, 40 + k))
        for k in (1, 2):
            cached = r.json["choices"][k]["orochi"]["cached_tokens"]
            G.check(cached >= r.json["usage"]["prompt_tokens"] - 1,
                    "choice %d computed its prompt again (%d tokens from the cache)", k, cached)
        G.check_eq(r.json["usage"]["completion_tokens"],
                   sum(len(c["orochi"]["token_ids"]) for c in r.json["choices"][1:]) +
                   len(r.json["orochi"]["token_ids"]), "usage.completion_tokens, all choices")
        events, done = G.sse_events(g.url + "/v1/chat/completions", dict(body, stream=True), timeout=240)
        streamed = {}
        for ev in events:
            for c in ev["choices"]:
                streamed[c["index"]] = streamed.get(c["index"], "") + (c["delta"].get("content") or "")
        G.check(done and [streamed.get(k) for k in range(3)] == texts, "streamed %r, plain %r", streamed, texts)
        r = g.http("/v1/completions", "POST", dict(prompt="hi", n=9, max_tokens=3))
        G.check(r.status == 400 and r.json["error"]["param"] == "n", "n=9: %r", r)
        G.log("  n=3: each choice equals its seed alone, choices 1-2 start from the first's prompt K/V, "
              "streamed = plain")


@t.case
def bad_grammars_are_refused():
    m = model()
    with G.Group("struct-bad", m, workers=1) as g:
        cases = [
            ("/v1/completions", dict(prompt="hi", grammar="root ::= undefined_rule"), "grammar",
             "the rule 'undefined_rule' is not defined"),
            ("/v1/completions", dict(prompt="hi", grammar="root ::= root \"a\" | \"b\""), "grammar", "left-recursive"),
            ("/v1/chat/completions", dict(messages=[{"role": "user", "content": "x"}],
                                          response_format={"type": "xml"}), "response_format.type", "json_schema"),
            ("/v1/chat/completions", dict(messages=[{"role": "user", "content": "x"}],
                                          response_format={"type": "json_schema", "json_schema": {
                                              "name": "x", "schema": {"type": "string", "pattern": "a+"}}}),
             "response_format.json_schema.schema", "pattern"),
            ("/v1/chat/completions", dict(messages=[{"role": "user", "content": "x"}], tools=[WEATHER],
                                          tool_choice={"type": "function", "function": {"name": "nope"}}),
             "tools", "nope"),
            ("/v1/chat/completions", dict(messages=[{"role": "user", "content": "x"}], tool_choice="required"),
             "tool_choice", "needs tools"),
            ("/v1/completions", dict(prompt="x", tools=[WEATHER]), "tools", "chat completions field"),
        ]
        for path, body, param, words in cases:
            body["max_tokens"] = 4
            r = g.http(path, "POST", body)
            G.check(r.status == 400, "%s: HTTP %d, not 400 (%r)", body, r.status, r)
            err = r.json["error"]
            G.check(err.get("param") == param and words in err.get("message", ""),
                    "%s: the error %r does not name %s (%s)", body, err, param, words)
        G.check_eq(len(g.ids("hi", 4)), 4, "a request after the refusals")
        G.log("  %d bad grammars, schemas and tool choices refused with 400, the group serving on" % len(cases))


if __name__ == "__main__":
    t.main()
