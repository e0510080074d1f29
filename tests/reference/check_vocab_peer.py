"""orochi's tokenizer against llama.cpp's own tokenizer tests, on real vocabularies.

llama.cpp's source carries vocabulary-only GGUF files of real models (models/ggml-vocab-NAME.gguf)
with test texts (NAME.gguf.inp, separated by lines "__ggml_vocab_test__") and the ids llama.cpp
gives them without BOS (NAME.gguf.out, one line per text). For each NAME this runs `orochi
tokenize --no-bos --no-special --jsonl` over the texts and counts the texts whose ids are the
same. A vocabulary whose pre-tokenizer orochi does not have must be refused at load, naming
tokenizer.ggml.pre (never tokenized by a guess).

    python3 tests/reference/check_vocab_peer.py --models DIR [--orochi build/bin/orochi]
        [--json FILE] [NAME ...]

DIR holds the files. The snapshot of llama.cpp's repository may leave its larger files out of the
work tree; `git -C REPO show HEAD:models/ggml-vocab-NAME.gguf > DIR/ggml-vocab-NAME.gguf` (and the
same for .inp and .out) brings them out. Not part of ctest (the files are llama.cpp's, not
orochi's); docs/models.md has the last results.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

DEFAULT = ["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "deepseek-r1-qwen",
           "deepseek-coder", "deepseek-llm", "falcon", "mpt", "starcoder", "refact"]


def texts_of(path):
    text = open(path, encoding="utf-8").read()
    parts = text.split("\n__ggml_vocab_test__\n")
    if parts and parts[-1] == "":
        parts.pop()
    return parts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", required=True)
    ap.add_argument("--orochi", default=os.path.join("build", "bin", "orochi"))
    ap.add_argument("--json")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    rows, bad = [], 0
    for name in a.names or DEFAULT:
        base = os.path.join(a.models, "ggml-vocab-%s.gguf" % name)
        if not all(os.path.exists(base + s) and os.path.getsize(base + s) > 0
                   for s in ("", ".inp", ".out")):
            print("%-18s not at hand (the .gguf, .inp or .out is missing)" % name)
            continue
        texts = texts_of(base + ".inp")
        want = open(base + ".out", encoding="utf-8").read().split("\n")
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
            for t in texts:
                f.write(json.dumps(t) + "\n")
            jsonl = f.name
        p = subprocess.run([a.orochi, "tokenize", "--model", base, "--no-bos", "--no-special",
                            "--jsonl", jsonl], capture_output=True, text=True)
        os.unlink(jsonl)
        row = {"vocab": name, "texts": len(texts)}
        if p.returncode:
            err = p.stderr.strip()
            row["refused"] = err
            ok = p.returncode == 2 and "tokenizer.ggml.pre" in err
            print("%-18s refused: %s%s" % (name, err[-120:], "" if ok else "  (UNEXPECTED)"))
            bad += not ok
        else:
            got = p.stdout.split("\n")
            differ = [i for i, _ in enumerate(texts)
                      if i >= len(got) or got[i].split() != want[i].split()]
            row["same"] = len(texts) - len(differ)
            row["differ"] = [texts[i] for i in differ]
            print("%-18s %d/%d texts give llama.cpp's ids" % (name, row["same"], len(texts)))
            for i in differ[:5]:
                print("    %-40r want %s, orochi %s" % (texts[i][:40], want[i].strip(),
                                                       got[i].strip() if i < len(got) else "-"))
            bad += bool(differ)
        rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
