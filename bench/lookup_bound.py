#!/usr/bin/env python3
"""bench/lookup_bound.py — how much prompt lookup could give on a set of chats, at most.

Each prompt of --prompts (distinct chat questions: bench/chats.jsonl) is answered greedily by
`orochi run --chat` (-n tokens). Then drafting is replayed on those answers, step by step, as a
verification cycle would see it: at each step a rule drafts a chain from the context so far (the
user's prompt tokens, then the answer up to there), the chain's tokens are accepted up to the
first that differs from the answer, and the step takes those plus one. No group runs: this is
the drafter's accuracy alone, what any speed-up from it is bounded by. Rules:

  lookup     the ngram speculator's rule: the continuation of the latest earlier occurrence of the
             context's last k tokens (k from --ngram down to 1) in the context itself
  lookup>=K  the same, drafting only where the match is K tokens or longer (fewer, surer drafts)
  history    lookup, or, where it finds a longer match, the continuation in the answers of the
             requests before (a group-wide history of answers, as a cache across requests would
             hold), from matches of --min-history tokens up

Per rule: tokens per step (what verification at no cost would give: an upper bound on the
speed-up), drafted rows per step (1 + the chain: what the steps carry), and the speed-up under
a step cost linear in its rows with a fixed part of --fixed-rows rows per request (the default,
1.225, fits docs/performance.md's "Every drafter for every request": 8 chats in flight, a
perfect drafter's 4.4-4.7 tokens a step at 7-deep chains gave 1.22x the group without drafts).
Results: a table, and JSON lines with --json.

Example: python3 bench/lookup_bound.py --prompts bench/chats.jsonl -n 128
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def own_lookup(ctx, n):
    """(k, index of the continuation's first token) of the latest earlier occurrence of ctx's last
    k tokens, the largest k <= n that has one; (0, -1) when none."""
    L = len(ctx)
    for k in range(min(n, L - 1), 0, -1):
        suf = ctx[L - k:]
        for j in range(L - k - 1, -1, -1):
            if ctx[j:j + k] == suf:
                return k, j + k
    return 0, -1


def history_lookup(ctx, hist, n, depth):
    """(k, chain) from the latest earlier answer holding ctx's last k tokens, largest k <= n."""
    L = len(ctx)
    for k in range(min(n, L), 0, -1):
        suf = ctx[L - k:]
        for h in reversed(hist):
            for j in range(len(h) - k - 1, -1, -1):
                if h[j:j + k] == suf:
                    return k, h[j + k:j + k + depth]
    return 0, []


def replay(cases, rule, a):
    """Totals over the answers: (steps, tokens, rows)."""
    steps = tokens = rows = 0
    hist = []
    for prompt, ans in cases:
        i = 1  # the first answer token comes from the prompt's step
        while i < len(ans):
            ctx = prompt + ans[:i]
            k, p = own_lookup(ctx, a.ngram)
            draft = ctx[p:p + a.depth] if k > 0 and k >= rule.get("min", 1) else []
            if rule.get("history"):
                kh, dh = history_lookup(ctx, hist, 16, a.depth)
                if kh >= a.min_history and kh > k:
                    draft = dh
            acc = 0
            while acc < len(draft) and i + acc < len(ans) and draft[acc] == ans[i + acc]:
                acc += 1
            steps += 1
            tokens += acc + 1
            rows += 1 + len(draft)
            i += acc + 1
        hist.append(ans)
    return steps, tokens, rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", default=os.path.join(ROOT, "bench", "chats.jsonl"))
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--ngram", type=int, default=8, help="longest match tried")
    ap.add_argument("--depth", type=int, default=7, help="longest chain drafted")
    ap.add_argument("--min-history", type=int, default=3)
    ap.add_argument("--fixed-rows", type=float, default=1.225)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    orochi = os.path.join(a.bin_dir, "orochi")
    rows = [json.loads(line) for line in open(a.prompts) if line.strip()]
    cases = []
    for k, r in enumerate(rows):
        ans = subprocess.run([orochi, "run", "--model", a.model, "--chat", "--prompt", r["prompt"], "-n",
                              str(a.max_tokens), "--temp", "0", "--threads", "2", "--print-ids"],
                             capture_output=True, text=True, check=True).stdout.split()
        prompt = subprocess.run([orochi, "tokenize", "--model", a.model, "--ids-only", "--no-bos", "--",
                                 r["prompt"]], capture_output=True, text=True, check=True).stdout.split()
        cases.append(([int(x) for x in prompt], [int(x) for x in ans]))
        print("\ranswered %d/%d" % (k + 1, len(rows)), end="", file=sys.stderr)
    print(file=sys.stderr)
    rules = [("lookup", {})] + [("lookup>=%d" % m, {"min": m}) for m in (2, 3, 4, 6)] + \
        [("history", {"history": True})]
    out = open(a.json, "a") if a.json else None
    print("%d answers, %d tokens; chains up to %d, matches up to %d\n" % (
        len(cases), sum(len(c[1]) for c in cases), a.depth, a.ngram))
    print("%-12s %14s %14s %22s" % ("rule", "tokens/step", "rows/step", "speed-up at the cost"))
    f = a.fixed_rows
    for name, rule in rules:
        steps, tokens, nrows = replay(cases, rule, a)
        tps, rps = tokens / steps, nrows / steps
        ratio = tps * (f + 1) / (f + rps)
        print("%-12s %14.3f %14.3f %21.3fx" % (name, tps, rps, ratio))
        if out:
            out.write(json.dumps({"bench": "lookup_bound", "rule": name, "answers": len(cases),
                                  "max_tokens": a.max_tokens, "tokens_per_step": tps, "rows_per_step": rps,
                                  "fixed_rows": f, "speedup_modelled": ratio,
                                  "prompts": os.path.basename(a.prompts)}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
