#!/usr/bin/env python3
"""bench/act_bits.py — what 8-bit activations cost in accuracy: perplexity and argmax agreement of
`--act-bits 8` against the default 16 bits, on the same text, in one run.

For each text file (default: README.md and docs/speculation.md) the first --tokens tokens (orochi
tokenize) are teacher-forced through `orochi eval --act-bits 16` and `--act-bits 8` (batch 64);
from the logits it prints the perplexity of each, their ratio, the mean and largest relative L2
distance between the two logit rows per position, and the share of positions where both pick the
same argmax. One JSON line per file goes to --json (bench/results/act_bits.jsonl).

    python3 bench/act_bits.py [--model M] [--tokens 1000] [FILE...]

numpy is needed (python3-numpy).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ids_of(a, text):
    p = subprocess.run([os.path.join(a.bin_dir, "orochi"), "tokenize", "--model", a.model, "--ids-only",
                        text], capture_output=True, text=True, check=True)
    return [int(s) for s in re.findall(r"-?\d+", p.stdout)][: a.tokens]


def logits(a, ids, bits, path):
    subprocess.run([os.path.join(a.bin_dir, "orochi"), "eval", "--model", a.model, "--ids",
                    " ".join(map(str, ids)), "--out", path, "--batch", "64", "--act-bits", str(bits)],
                   check=True, capture_output=True)
    return np.fromfile(path, dtype="<f4").reshape(len(ids), -1).astype(np.float64)


def perplexity(lg, ids):
    mx = lg.max(axis=1, keepdims=True)
    lse = np.log(np.exp(lg - mx).sum(axis=1)) + mx[:, 0]
    nll = lse[:-1] - lg[np.arange(len(ids) - 1), ids[1:]]
    return float(np.exp(nll.mean()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", default=[os.path.join(ROOT, "README.md"),
                                                  os.path.join(ROOT, "docs", "speculation.md")])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "act_bits.jsonl"))
    a = ap.parse_args()
    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    out = open(a.json, "a")
    print("%-28s %7s %10s %10s %8s %10s %10s %12s" % ("text", "tokens", "ppl 16", "ppl 8", "ratio",
                                                      "mean rel", "max rel", "same argmax"))
    with tempfile.TemporaryDirectory(prefix="act-bits-") as d:
        for f in a.files:
            text = open(f, encoding="utf-8", errors="replace").read()[: 8 * a.tokens]
            ids = ids_of(a, text)
            if len(ids) < 2:
                print("act_bits: %s gives fewer than 2 tokens" % f, file=sys.stderr)
                return 2
            l16 = logits(a, ids, 16, os.path.join(d, "l16"))
            l8 = logits(a, ids, 8, os.path.join(d, "l8"))
            p16, p8 = perplexity(l16, ids), perplexity(l8, ids)
            rel = np.linalg.norm(l8 - l16, axis=1) / np.linalg.norm(l16, axis=1)
            same = float(np.mean(l8.argmax(axis=1) == l16.argmax(axis=1)))
            name = os.path.relpath(f, ROOT)
            print("%-28s %7d %10.3f %10.3f %8.4f %10.4f %10.4f %12.3f" % (
                name, len(ids), p16, p8, p8 / p16, rel.mean(), rel.max(), same))
            out.write(json.dumps({"bench": "act_bits", "text": name, "tokens": len(ids),
                                  "model": os.path.basename(a.model), "ppl16": p16, "ppl8": p8,
                                  "ppl_ratio": p8 / p16, "mean_rel": float(rel.mean()),
                                  "max_rel": float(rel.max()), "same_argmax": same}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
