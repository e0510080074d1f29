#!/usr/bin/env python3
"""bench/structured_bench.py — constrained (JSON Schema) answers with and without speculation.

Groups of one worker, started side by side and measured in interleaved rounds (the machine is
shared and noisy): the same chat requests with response_format json_schema, greedy, through

  nodraft   no speculator, the grammar's forced text not drafted (--grammar-drafts off): plain
            constrained decoding, one token a step
  forced    no speculator, the forced text drafted (the default)
  ngram     the ngram speculator, forced text drafted (the default)
  ...       any name=spec[+spec] given with --configs

Decode tok/s excludes the prompt (the wall time of a 1-token request is subtracted). Every answer
must parse, validate against its schema (python3-jsonschema) and equal the nodraft group's token
for token: a mismatch fails the run. Prints a table with the median ratios against nodraft and
writes JSON lines (and a plot with --plot).

  python3 bench/structured_bench.py --bin-dir build/bin --model models/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_bench as S  # noqa: E402

try:
    import jsonschema
except ImportError:
    jsonschema = None

PEOPLE = {
    "type": "object",
    "properties": {
        "people": {"type": "array", "minItems": 1, "maxItems": 6, "items": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20},
                           "age": {"type": "integer"},
                           "city": {"type": "string", "maxLength": 20}},
            "required": ["name", "age", "city"], "additionalProperties": False}},
    },
    "required": ["people"], "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "customer": {"type": "string", "maxLength": 30},
        "items": {"type": "array", "minItems": 1, "maxItems": 6, "items": {
            "type": "object",
            "properties": {"product": {"type": "string", "maxLength": 24},
                           "quantity": {"type": "integer"},
                           "unit_price": {"type": "number"}},
            "required": ["product", "quantity", "unit_price"], "additionalProperties": False}},
        "express": {"type": "boolean"},
    },
    "required": ["customer", "items", "express"], "additionalProperties": False,
}
TASKS = [
    ("Extract the people as JSON: Alice Martin is 31 and lives in Paris. Bob Stone is 45 and lives "
     "in London. Chiara Rossi is 28 and lives in Rome. Daniel Kim is 39 and lives in Seoul.", PEOPLE),
    ("Turn this order into JSON: customer Jane Doe ordered 2 notebooks at 3.50 each, 1 stapler at "
     "12.99, 10 pencils at 0.25 each and 3 folders at 1.20 each, with express delivery.", ORDER),
    ("List four members of a chess club as JSON, with their names, ages and home cities.", PEOPLE),
    ("Write a JSON order for a bakery: the customer Tom Lee buys 6 croissants at 1.80, 2 baguettes "
     "at 2.10 and 1 cake at 24.00, no express delivery.", ORDER),
]
DEFAULT_CONFIGS = "nodraft=,forced=,ngram=ngram"


def chat(g, prompt, schema, n):
    t0 = time.time()
    r = S.post(g.url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": prompt}], "max_tokens": n, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}})
    return r, time.time() - t0


def decode(g, prompt, schema, n):
    chat(g, prompt, schema, 1)
    _, wall1 = chat(g, prompt, schema, 1)
    r, wall = chat(g, prompt, schema, n)
    k = len(r["orochi"]["token_ids"])
    dt = wall - wall1
    return r, (k - 1) / dt if k > 1 and dt > 0 else k / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(S.ROOT, "build", "bin"))
    ap.add_argument("--model", default=os.path.join(S.ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=256, help="max_tokens of each answer")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help="name=spec+spec,... (empty spec: no speculator; the name nodraft adds "
                         "--grammar-drafts off)")
    ap.add_argument("--out", default=os.path.join(S.ROOT, "bench", "results", "structured.jsonl"))
    ap.add_argument("--plot", help="write a bar plot of the median speedups to this PNG")
    a = ap.parse_args()
    configs = []
    for item in a.configs.split(","):
        name, _, specs = item.partition("=")
        configs.append((name, [s for s in specs.split("+") if s]))
    groups = {}
    tmp = tempfile.mkdtemp(prefix="orochi-structured-")
    rows = []
    load = os.getloadavg()
    try:
        for name, specs in configs:
            extra = ["--guard", "off"] + (["--grammar-drafts", "off"] if name == "nodraft" else [])
            groups[name] = S.Group(a.bin_dir, a.model, os.path.join(tmp, name), 1, a.threads, specs, extra)
            print("structured_bench: group %s up (%s)" % (name, "+".join(specs) or "no speculator"),
                  file=sys.stderr)
        base = configs[0][0]
        for rnd in range(a.rounds):
            for ti, (prompt, schema) in enumerate(TASKS):
                ref = None
                for name, _ in (configs if rnd % 2 == 0 else configs[::-1]):  # alternate the order
                    r, tps = decode(groups[name], prompt, schema, a.n)
                    ids = r["orochi"]["token_ids"]
                    content = r["choices"][0]["message"]["content"]
                    if r["choices"][0]["finish_reason"] == "stop":  # (cut by -n: not whole)
                        doc = json.loads(content)
                        if jsonschema is not None:
                            jsonschema.validate(doc, schema)
                    row = dict(round=rnd, task=ti, config=name, tok_s=tps, tokens=len(ids),
                               accepted=r["orochi"]["mean_accepted"], finish=r["choices"][0]["finish_reason"],
                               ids=ids)
                    rows.append(row)
                    print("round %d task %d %-8s %6.1f tok/s  %3d tokens  %.2f a step" %
                          (rnd, ti, name, tps, len(ids), row["accepted"]), file=sys.stderr)
                for row in rows[-len(configs):]:
                    if ref is None:
                        ref = next(x["ids"] for x in rows[-len(configs):] if x["config"] == base)
                    if row["ids"] != ref:
                        raise SystemExit("structured_bench: task %d, %s differs from %s: not lossless"
                                         % (ti, row["config"], base))
    finally:
        for g in groups.values():
            g.down()
    load_after = os.getloadavg()
    print("\nJSON Schema answers, greedy, %d rounds x %d tasks, %d threads, load %.2f -> %.2f"
          % (a.rounds, len(TASKS), a.threads, load[0], load_after[0]))
    # ratios against nodraft, and against the second config (the default without speculators)
    alt = configs[1][0] if len(configs) > 1 else base
    print("%-8s %10s %8s %26s %26s" % ("config", "tok/s med", "a step", "vs %s (min/med/max)" % base,
                                       "vs %s (min/med/max)" % alt))
    summary = []

    def ratios(name, ref):
        out = []
        for r in rows:
            if r["config"] == name:
                b = next(x for x in rows if x["config"] == ref and x["round"] == r["round"] and x["task"] == r["task"])
                out.append(r["tok_s"] / b["tok_s"])
        return out

    for name, _ in configs:
        mine = [r for r in rows if r["config"] == name]
        r0, r1 = ratios(name, base), ratios(name, alt)
        s = dict(config=name, tok_s=statistics.median(r["tok_s"] for r in mine),
                 accepted=statistics.median(r["accepted"] for r in mine),
                 ratio_min=min(r0), ratio_med=statistics.median(r0), ratio_max=max(r0),
                 vs=alt, alt_min=min(r1), alt_med=statistics.median(r1), alt_max=max(r1),
                 load=load[0], load_after=load_after[0], threads=a.threads, rounds=a.rounds)
        summary.append(s)
        print("%-8s %10.1f %8.2f %12.2f / %.2f / %.2f %12.2f / %.2f / %.2f" % (
            name, s["tok_s"], s["accepted"], s["ratio_min"], s["ratio_med"], s["ratio_max"],
            s["alt_min"], s["alt_med"], s["alt_max"]))
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "a") as f:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        for r in rows:
            f.write(json.dumps(dict(r, kind="answer", time=stamp, ids=None)) + "\n")
        for s in summary:
            f.write(json.dumps(dict(s, kind="summary", time=stamp)) + "\n")
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3))
        ax.bar([s["config"] for s in summary], [s["ratio_med"] for s in summary],
               yerr=[[s["ratio_med"] - s["ratio_min"] for s in summary],
                     [s["ratio_max"] - s["ratio_med"] for s in summary]], capsize=4)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_ylabel("decode speed vs %s" % base)
        ax.set_title("JSON Schema answers (median, min-max)")
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)


if __name__ == "__main__":
    main()
