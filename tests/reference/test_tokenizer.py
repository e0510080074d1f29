"""ctest reference_tokenizer — the C tokenizer (`orochi tokenize`) against tokenizer_ref.py.

Environment: OROCHI_BIN (the orochi binary), OROCHI_MODEL (the default model), OROCHI_TMP (a
scratch directory). Checks, each independent of the C code except for the CLI under test:

1. the default model (byte-level BPE, pre "smollm"): every line of tokenizer_corpus.jsonl, plus
   600 seeded random strings drawn from characters that hit every branch of the pre-tokenizer
   patterns, is encoded by `orochi tokenize --jsonl` and by the reference; the ids must be
   identical line by line, and the reference's decode of the C ids must give the text back;
2. the same vocab and merges with tokenizer.ggml.pre set to "gpt2", "llama3" and "qwen2" (a
   tokenizer-only GGUF written here), again over the whole corpus;
3. `--chat` on the default model gives the ids of the exact ChatML prompt with SmolLM's default
   system message; plain output is "id<TAB>piece" with escapes;
4. a tiny SentencePiece-style ("llama") GGUF built here (<unk>, <s>, </s>, <0x00>..<0xFF>, U+2581,
   scored pieces, one user-defined token) against the reference on ~30 strings, BOS included;
5. malformed tokenizer metadata is refused with exit status 2 and a one-line error naming the key.
Exit 77 (skip) when the default model is absent.
"""

import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gguf_ref import GGUFRef, write_gguf, T_ARRAY, T_INT32, T_FLOAT32, T_STRING  # noqa: E402
from tokenizer_ref import RefTokenizer  # noqa: E402

BIN = os.environ.get("OROCHI_BIN", "orochi")
MODEL = os.environ.get("OROCHI_MODEL", "")
TMP = os.environ.get("OROCHI_TMP", "/tmp")
CORPUS = os.path.join(HERE, "tokenizer_corpus.jsonl")

failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)
    return cond


def run(args, **kw):
    return subprocess.run([BIN, "tokenize"] + args, capture_output=True, **kw)


def load_corpus():
    with open(CORPUS, "rb") as fp:
        raw = fp.read().decode("utf-8")
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [json.loads(line) for line in lines]


def c_jsonl(model, texts, extra=()):
    """Encode texts in one `orochi tokenize --jsonl` process; returns (list of id lists, secs)."""
    path = os.path.join(TMP, "tok_%d.jsonl" % os.getpid())
    with open(path, "w", encoding="utf-8") as fp:
        for t in texts:
            fp.write(json.dumps(t) + "\n")
    t0 = time.time()
    p = run(["--model", model, "--jsonl", path] + list(extra))
    dt = time.time() - t0
    os.unlink(path)
    if p.returncode != 0:
        raise SystemExit("orochi tokenize --jsonl failed (%d): %s" % (
            p.returncode, p.stderr.decode(errors="replace")))
    out = p.stdout.decode().split("\n")
    if out and out[-1] == "":
        out.pop()
    return [[int(x) for x in line.split()] for line in out], dt


def compare(name, ref, texts, c_ids, bos=None, roundtrip=True):
    check(len(c_ids) == len(texts), "%s: %d output lines for %d texts" % (
        name, len(c_ids), len(texts)))
    bad = 0
    for i, (t, got) in enumerate(zip(texts, c_ids)):
        want = ref.encode(t)
        if bos is not None:
            want = [bos] + want
        if got != want:
            bad += 1
            if bad <= 3:
                k = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]),
                         min(len(got), len(want)))
                print("%s line %d differs at id %d: text %r" % (name, i + 1, k, t[:120]))
                print("   C:   %s" % got[max(0, k - 3):k + 8])
                print("   ref: %s" % want[max(0, k - 3):k + 8])
                print("   C pieces:   %r" % [ref.tokens[x] for x in got[max(0, k - 3):k + 8]
                                              if 0 <= x < len(ref.tokens)])
                print("   ref pieces: %r" % [ref.tokens[x] for x in want[max(0, k - 3):k + 8]])
        elif roundtrip:
            ids = got[1:] if bos is not None else got
            back = ref.decode(ids)
            if back != t:
                bad += 1
                print("%s line %d: decode(encode(s)) != s: %r -> %r" % (name, i + 1, t[:80],
                                                                         back[:80]))
    check(bad == 0, "%s: %d of %d lines differ" % (name, bad, len(texts)))
    print("%s: %d lines, %d equal" % (name, len(texts), len(texts) - bad))


def tokenizer_only_copy(src, dst, **override):
    """Write dst with src's tokenizer.* metadata (no tensors), with keys overridden."""
    g = GGUFRef(src)
    kv = {}
    for k, v in g.kv.items():
        if not k.startswith("tokenizer."):
            continue
        if k == "tokenizer.ggml.token_type":
            kv[k] = (T_ARRAY, T_INT32, v)
        elif k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            kv[k] = (T_ARRAY, T_STRING, v)
        else:
            kv[k] = v
    for k, v in override.items():
        k = k.replace("__", ".")
        if v is None:
            kv.pop(k, None)
        else:
            kv[k] = v
    write_gguf(dst, kv)


# --- SentencePiece-style tiny model -------------------------------------------------------------

SPM_PIECES = [
    "\u2581", "\u2581the", "\u2581t", "th", "he", "in", "ing", "\u2581a", "er", "an", "re", "on",
    "\u2581hello", "llo", "ell", "he", "\u2581w", "or", "ld", "\u2581world", "wor", "\u2581is",
    "is", "\u2581i", "it", "\u2581it", "'s", "\u2581of", "of", "\u2581and", "nd", "\u2581to",
    "to", "en", "es", "ed", "\u2581s", "st", "\u2581st", "ar", "at", "\u2581c", "ch", "\u2581ch",
    "\u2581\u2581", "\u2581\u2581\u2581\u2581", "ou", "\u2581y", "\u2581you", "\u2581yo", "ab",
    "abc", "bc", "cd", "abcd", "\u2581abc", "12", "123", "\u25811", "..", "...", "!!", "\u2581(",
    ")", "\u2581x", "xx", "xxx", "xxxx", "\u00e9", "caf", "\u2581caf", "\u2581caf\u00e9",
    "\u65e5\u672c", "\u2581\u65e5", "\u2581h", "\u2581he", "\u2581hel", "\u2581hell",
    "\u2581wo", "\u2581wor", "\u2581th", "\u2581ca", "\u2581ab", "\u2581ha", "wa", "\u2581wa",
    "ta", "at\u2581", "e\u2581", "s\u2581", "\u2581the\u2581",
]


def build_spm_gguf(path):
    rng = random.Random(7)
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    seen = set(tokens)
    chars = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'()-")
    for p in chars + SPM_PIECES:
        if p in seen:
            continue
        seen.add(p)
        tokens.append(p)
        types.append(1)
        # longer pieces score higher on average, with noise so ties and order both matter
        scores.append(-10.0 + 2.0 * len(p) + rng.uniform(-3, 3) if len(p) > 1 else -12.0)
    tokens.append("<tool>")
    types.append(4)
    scores.append(0.0)
    kv = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": (T_ARRAY, T_STRING, tokens),
        "tokenizer.ggml.scores": (T_ARRAY, T_FLOAT32, scores),
        "tokenizer.ggml.token_type": (T_ARRAY, T_INT32, types),
        "tokenizer.ggml.bos_token_id": (4, 1),  # u32
        "tokenizer.ggml.eos_token_id": (4, 2),
        "tokenizer.ggml.unknown_token_id": (4, 0),
        "tokenizer.ggml.add_bos_token": True,
        # a Llama-2-style template (run by orochi's Jinja interpreter)
        "tokenizer.chat_template": ("{% for message in messages %}{% if message['role'] == 'user'"
                                    " %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
                                    "{% endif %}{% endfor %}"),
    }
    write_gguf(path, kv)


SPM_TEXTS = [
    "hello world", "Hello world", "the cat is on the mat", "  two leading spaces",
    "trailing spaces  ", "it's the thing", "abcd abc ab a", "xxxxxxxxxxx", "123123 1 12",
    "café au lait", "日本語", "Привет мир", "emoji 😀 here", "<s>hello</s>", "a<tool>b",
    "<tool> tool first", "hello <s> world", "", " ", "...!!...", "(x) (xx) (xxx)",
    "\u2581 literal marker", "tab\tand\nnewline", "the the the the the", "ABC abc AbC",
    "mixed 日本 and café", "z", "zz zz", "world hello world", "st st st ch ch",
]


# characters that exercise every branch of the pre-tokenizer patterns
STRESS_POOL = (list(" \t\n\r\x0b\x0c'sStTrReEvVmMlLdDxX09!?.,-_()\"") +
               ["\u00a0", "\u2009", "\u3000", "\u0085", "\u2028", "\u0301", "\u00e9", "\u00bd",
                "\u0663", "\u4e2d", "\u6587", "\u0430", "\u05d0", "\u0915", "\u094d", "\U0001F600",
                "\u200d", "\ufe0f", "\u017f", "\u2160", "<|im_end|>", "<|im_start|>", "  ", "\n\n",
                "'s", "'ll", "'re", "'VE", " 1", "123", "   ", "\r\n"])


def stress_texts(n, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(STRESS_POOL) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def main():
    if not MODEL or not os.path.exists(MODEL):
        print("SKIP: default model absent at %s (run make models)" % MODEL)
        sys.exit(77)
    os.makedirs(TMP, exist_ok=True)

    # 1. default model over the corpus (+ random strings built to stress the scanners)
    ref = RefTokenizer(MODEL)
    corpus = load_corpus()
    check(len(corpus) >= 220, "corpus has only %d lines" % len(corpus))
    c_ids, dt = c_jsonl(MODEL, corpus)
    print("orochi tokenize --jsonl: %d corpus lines in %.3f s (whole process, model load incl.)"
          % (len(corpus), dt))
    check(dt < 5.0, "corpus took %.2f s" % dt)
    texts = corpus + stress_texts(600, 2024)
    c_ids, dt = c_jsonl(MODEL, texts)
    compare("smollm corpus+stress", ref, texts, c_ids)

    # 2. other pre-tokenizers over the same vocab
    for pre in ("gpt2", "llama3", "qwen2"):
        path = os.path.join(TMP, "tok_pre_%s.gguf" % pre)
        tokenizer_only_copy(MODEL, path, tokenizer__ggml__pre=pre)
        r = RefTokenizer(path)
        ids, _ = c_jsonl(path, texts)
        compare("pre=" + pre, r, texts, ids)
        os.unlink(path)

    # 3. chat prompt and the plain output format
    msg = "What is the capital of France?"
    want = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\n" + msg + "<|im_end|>\n<|im_start|>assistant\n")
    p = run(["--model", MODEL, "--chat", "--ids-only", msg])
    check(p.returncode == 0, "--chat failed: %s" % p.stderr.decode(errors="replace"))
    got = [int(x) for x in p.stdout.split()]
    check(got == ref.encode(want), "--chat ids %s != ref %s" % (got, ref.encode(want)))
    p = run(["--model", MODEL, "a\nb<|im_end|>"])
    lines = p.stdout.decode().split("\n")
    want_ids = ref.encode("a\nb<|im_end|>")
    want_lines = ["%d\t%s" % (i, ref.token_bytes(i).decode().replace("\n", "\\n"))
                  for i in want_ids]
    check(len(want_ids) == 4 and lines[:-1] == want_lines and lines[-1] == "",
          "plain output %r, want %r" % (lines, want_lines))
    p = run(["--model", MODEL, "--no-special", "--ids-only", "<|im_end|>"])
    got = [int(x) for x in p.stdout.split()]
    check(got == ref.encode("<|im_end|>", parse_special=False) and 2 not in got,
          "--no-special gave %s" % got)

    # 4. SentencePiece-style tiny model
    spm = os.path.join(TMP, "tok_spm.gguf")
    build_spm_gguf(spm)
    r = RefTokenizer(spm)
    ids, _ = c_jsonl(spm, SPM_TEXTS)
    compare("spm", r, SPM_TEXTS, ids, bos=1, roundtrip=False)
    ids, _ = c_jsonl(spm, SPM_TEXTS, ["--no-bos"])
    compare("spm --no-bos", r, SPM_TEXTS, ids, roundtrip=False)
    # texts without unknown chars or literal markers decode back exactly
    for t, got in zip(SPM_TEXTS, ids):
        if all(ord(c) < 128 for c in t) and "<" not in t:
            check(r.decode(got) == t, "spm decode %r -> %r" % (t, r.decode(got)))
    p = run(["--model", spm, "--chat", "--no-bos", "--ids-only", "hello"])
    got = [int(x) for x in p.stdout.split()]
    check(got == r.encode("[INST] hello [/INST]"), "spm --chat ids %s" % got)
    os.unlink(spm)

    # 5. malformed tokenizer metadata: exit 2, one line naming the key
    bad_cases = [
        ("tokenizer.ggml.tokens", dict(tokenizer__ggml__tokens=None)),
        ("tokenizer.ggml.merges", dict(tokenizer__ggml__merges=(T_ARRAY, T_STRING, ["a b", "ab"]))),
        ("tokenizer.ggml.bos_token_id", dict(tokenizer__ggml__bos_token_id=(4, 10 ** 6))),
        ("tokenizer.ggml.model", dict(tokenizer__ggml__model="bert")),
        ("tokenizer.ggml.pre 'tekken'", dict(tokenizer__ggml__pre="tekken")),
        ("tokenizer.ggml.token_type", dict(tokenizer__ggml__token_type=(T_ARRAY, T_INT32, [1]))),
    ]
    for key, override in bad_cases:
        path = os.path.join(TMP, "tok_bad.gguf")
        tokenizer_only_copy(MODEL, path, **override)
        p = run(["--model", path, "hi"])
        err = p.stderr.decode(errors="replace").strip()
        check(p.returncode == 2 and key in err and "\n" not in err,
              "bad %s: status %d, stderr %r" % (key, p.returncode, err))
        os.unlink(path)
    path = os.path.join(TMP, "tok_trunc.gguf")
    with open(MODEL, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(1000))
    p = run(["--model", path, "hi"])
    err = p.stderr.decode(errors="replace").strip()
    check(p.returncode == 2 and err and "\n" not in err, "truncated file: %d %r" % (
        p.returncode, err))
    os.unlink(path)

    if failures:
        print("%d check(s) failed" % len(failures))
        sys.exit(1)
    print("reference_tokenizer: all checks passed")


if __name__ == "__main__":
    main()
