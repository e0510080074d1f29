#!/usr/bin/env python3
"""bench/peer.py — orochi against llama.cpp, the speed peer, on the same GGUF files in one run.

llama.cpp is not part of orochi: build it with ../shared/bench/build-peer.sh and pass its bin
directory with --llama-cpp (this script never fetches or vendors it). From --model the other types
of the same model (--types: plain types or llama.cpp-style mixes such as Q4_K_M) are derived with
`orochi quantize` into --work-dir, so both engines read byte-identical files. The K-quant table:
`make bench-peer PEER_FLAGS="--types Q4_K_M,Q5_K_M,Q6_K,Q5_1,Q3_K_M --no-spec"`.

The run is a number of rounds (--rounds); each round measures everything once, alternating the two
engines measurement by measurement, so a slow period on a shared machine hits both sides instead
of one. The 1-minute load average is recorded beside every measurement. Sections, for every type
and thread count:

  decode   llama-bench -p 0 -n N            vs  orochi bench --decode-tokens N       (tok/s)
  prompt   llama-bench -p 128 -n 0          vs  orochi run --prompt-file (128 tok)   (tok/s)
  step     llama-bench -p W -n 0 -r 3       vs  orochi bench --widths 2,4,8,16 t(W)  (ms per
           a W-token batch at the start of the context, W = 2, 4, 8, 16)
  spec     (--spec, default on) greedy generation of -n tokens for the prompts of --prompts on the
           --spec-target file: orochi run (sequential) vs llama-bench tg (plain decode); an orochi
           group with the `ngram` speculator vs llama-lookup; an orochi group with the `model`
           speculator on the --spec-draft file vs llama-speculative -md on the same file. Every
           orochi speculative output is checked token for token against `orochi run --temp 0`
           (a mismatch is printed and makes the exit status 1).

ratio is always "how many times faster orochi is": orochi/llama.cpp for tok/s, llama.cpp/orochi
for milliseconds. Tables on stdout (each round, then the medians over rounds), JSON lines to
--json (one per measurement, one per median row), a plot of the median ratios to --plot when
matplotlib is importable. --quick: 1 round, Q4_1, 1 thread, -n 16, one prompt (a smoke test).
--act-bits auto|16|8: the activation precision of orochi's decode, prompt and step sections (default
auto, orochi's own default: 8 bits for K-quant matrices, 16 for the rest; llama.cpp multiplies every
quantized type against 8-bit activations).
--shapes 1b,8b: instead of --model, random-weight files of the Llama-3.2-1B and Llama-3.1-8B shapes,
written in F16 by `orochi mkmodel` and quantized to the other --types by the peer's own
llama-quantize (Q4_K_M, Q8_0, BF16, ...), cached in --work-dir; no spec section. --prompt-tokens N
(default 128) sets the prompt section's length, --widths the step section's W (default 2,4,8,16).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spec_bench  # noqa: E402  (Group, sequential, load_prompts: the group helpers, not copied)

ROOT = spec_bench.ROOT
# every type `orochi quantize` writes, and its llama.cpp-style mixes (docs/quantize.md)
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K",
         "Q4_K", "Q5_K", "Q6_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
         "Q5_K_M")
STEP_WIDTHS = (2, 4, 8, 16)  # the default of --widths
PROMPT_TOKENS = 128  # the default of --prompt-tokens
# --shapes: random-weight files of real models' shapes, written by `orochi mkmodel` in F16 and
# quantized by the peer's own llama-quantize (so llama.cpp reads files its own tool wrote)
SHAPES = {
    "1b": "--layers 16 --dim 2048 --ffn 8192 --heads 32 --kv-heads 8 --vocab 128256 --ctx 4096",
    "8b": "--layers 32 --dim 4096 --ffn 14336 --heads 32 --kv-heads 8 --vocab 128256 --ctx 4096",
}
# orochi bench measures t(W) on top of a committed context; llama-bench's -p W starts at position
# 0, so orochi's context is kept at one token to compare the same attention work
STEP_CTX = 1
LLAMA_TOOLS_ALWAYS = ("llama-bench",)
LLAMA_TOOLS_SPEC = ("llama-lookup", "llama-speculative")
FILLER = ("The river runs past the old mill, where the miller keeps a ledger of every sack of grain "
          "brought in from the hills. In spring the water rises and the wheel turns faster; in late "
          "summer it slows, and the village waits for rain. Children count the boats that pass, and "
          "the baker sells bread to the boatmen at dawn. ")


class PeerError(Exception):
    pass


def log(msg):
    print("peer: " + msg, file=sys.stderr, flush=True)


def load1():
    return round(os.getloadavg()[0], 2)


def loadavg():
    return [round(x, 2) for x in os.getloadavg()]


def run(cmd, what, **kw):
    """Run a command; on failure a PeerError with the command's last stderr lines."""
    p = subprocess.run(cmd, capture_output=True, **kw)
    if p.returncode != 0:
        err = p.stderr if isinstance(p.stderr, str) else p.stderr.decode(errors="replace")
        tail = " | ".join(err.strip().splitlines()[-3:])
        raise PeerError("%s failed (exit %d): %s: %s" % (what, p.returncode, " ".join(cmd[:3]), tail))
    return p


# ---- models -----------------------------------------------------------------------------------

def model_type_of(path):
    """The type named in a file name like NAME.Q4_1.gguf, or None."""
    m = re.search(r"\.([A-Za-z0-9_]+)\.gguf$", os.path.basename(path))
    return m.group(1).upper() if m and m.group(1).upper() in TYPES else None


def shape_models(a, shapes, types):
    """--shapes: {"SHAPE TYPE": path}. SHAPE.F16.gguf written once into --work-dir by `orochi
    mkmodel` (random weights, seed 1), every other type made from it by the peer's llama-quantize
    (an existing file is reused; each is written to OUT.tmp and renamed)."""
    os.makedirs(a.work_dir, exist_ok=True)
    out = {}
    for shape in shapes:
        f16 = os.path.abspath(os.path.join(a.work_dir, "shape-%s.F16.gguf" % shape))
        if not os.path.exists(f16):
            log("writing the %s shape in F16 with orochi mkmodel ..." % shape)
            run([os.path.join(a.bin_dir, "orochi"), "mkmodel", "--out", f16 + ".tmp", "--type", "f16",
                 "--seed", "1"] + SHAPES[shape].split(), "orochi mkmodel")
            os.rename(f16 + ".tmp", f16)
        for t in types:
            path = os.path.abspath(os.path.join(a.work_dir, "shape-%s.%s.gguf" % (shape, t)))
            if t != "F16" and not os.path.exists(path):
                log("quantizing the %s shape to %s with llama-quantize ..." % (shape, t))
                # the output name first: llama-quantize reads a leading number as a type
                run([os.path.join(a.llama_cpp, "llama-quantize"), f16, path + ".tmp", t, "2"],
                    "llama-quantize")
                os.rename(path + ".tmp", path)
            out["%s %s" % (shape, t)] = path
    return out


def derive_models(a, types):
    """{type: path}: --model itself for its own type, the others quantized once into --work-dir
    (an existing file is reused; quantize writes OUT.tmp and renames, so a file there is whole)."""
    own = model_type_of(a.model)
    stem = os.path.basename(a.model)[: -len(".gguf")]
    if own:
        stem = stem[: -len(own) - 1]
    os.makedirs(a.work_dir, exist_ok=True)
    out = {}
    for t in types:
        if t == own:
            out[t] = os.path.abspath(a.model)
            continue
        path = os.path.abspath(os.path.join(a.work_dir, "%s.%s.gguf" % (stem, t)))
        if not os.path.exists(path):
            log("deriving %s with orochi quantize ..." % os.path.relpath(path, ROOT))
            run([os.path.join(a.bin_dir, "orochi"), "quantize", a.model, path, t], "orochi quantize")
        out[t] = path
    return out


# ---- prompt text --------------------------------------------------------------------------------

def unescape_piece(s):
    """Bytes of a piece as `orochi tokenize` prints it (\\n \\t \\r \\\\ \\xNN escaped)."""
    out, i = bytearray(), 0
    while i < len(s):
        c = s[i]
        if c == 0x5C and i + 1 < len(s):
            n = s[i + 1]
            if n == ord("x"):
                out.append(int(s[i + 2:i + 4], 16))
                i += 4
                continue
            out.append({ord("n"): 10, ord("t"): 9, ord("r"): 13}.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


def tokenize_pieces(a, model, text, chat=False):
    """[(id, bytes)] of text with the model's own tokenizer (chat-wrapped if asked)."""
    cmd = [os.path.join(a.bin_dir, "orochi"), "tokenize", "--model", model] + (["--chat"] if chat else []) + ["-"]
    p = run(cmd, "orochi tokenize", input=text.encode())
    rows = []
    for line in p.stdout.split(b"\n"):
        if line:
            tid, _, piece = line.partition(b"\t")
            rows.append((int(tid), unescape_piece(piece)))
    return rows


def chat_text(a, model, prompt):
    """The chat-template text orochi decodes for --chat, for the llama.cpp tools (which take raw
    text and parse special tokens): the same prompt tokens on both sides. Returns (bytes, count)."""
    pieces = tokenize_pieces(a, model, prompt, chat=True)
    return b"".join(p for _, p in pieces), len(pieces)


def prompt_file_128(a, model, path):
    """A plain-text file that orochi tokenizes into exactly --prompt-tokens tokens."""
    n = a.prompt_tokens
    pieces = tokenize_pieces(a, model, FILLER * (8 * ((n + 127) // 128)))
    for k in range(n, min(len(pieces), n + 16)):
        text = b"".join(p for _, p in pieces[:k])
        if len(tokenize_pieces(a, model, text.decode(errors="replace"))) == n:
            with open(path, "wb") as f:
                f.write(text)
            return path
    raise PeerError("could not cut a %d-token prompt from the filler text" % n)


# ---- the measurements ---------------------------------------------------------------------------

def llama_bench(a, model, threads, args):
    """llama-bench -o jsonl: one dict per test (avg_ns per test, avg_ts tok/s)."""
    cmd = [os.path.join(a.llama_cpp, "llama-bench"), "-m", model, "-t", str(threads), "-o", "jsonl"] + args
    p = run(cmd, "llama-bench", text=True)
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if not rows:
        raise PeerError("llama-bench printed no JSON line for %s" % " ".join(args))
    return rows


def orochi_bench(a, model, threads, n, widths):
    """orochi bench: (decode tok/s, {W: ms}) from the JSON lines it appends to a fresh file."""
    with tempfile.TemporaryDirectory(prefix="peer-bench-") as d:
        js = os.path.join(d, "bench.jsonl")
        run([os.path.join(a.bin_dir, "orochi"), "bench", "--model", model, "--threads", str(threads),
             "--decode-tokens", str(n), "--widths", ",".join(map(str, widths)), "--ctx", str(STEP_CTX),
             "--reps", "3", "--act-bits", str(a.act_bits), "--json", js], "orochi bench", text=True)
        rows = [json.loads(l) for l in open(js) if l.strip()]
    dec = [r["tok_s"] for r in rows if r["bench"] == "decode"]
    steps = {r["w"]: r["ms"] for r in rows if r["bench"] == "width"}
    if not dec or set(steps) != set(widths):
        raise PeerError("orochi bench wrote no decode or width rows for %s" % model)
    return dec[0], steps


def orochi_prompt(a, model, threads, prompt_path):
    """orochi run --prompt-file: prompt tok/s from the stderr summary."""
    p = run([os.path.join(a.bin_dir, "orochi"), "run", "--model", model, "--prompt-file", prompt_path,
             "-n", "1", "--temp", "0", "--threads", str(threads), "--act-bits", str(a.act_bits)],
            "orochi run", text=True)
    m = re.search(r"prompt (\d+) tok, ([0-9.]+) prompt tok/s", p.stderr)
    if not m:
        raise PeerError("orochi run printed no 'prompt N tok, X prompt tok/s' summary")
    if int(m.group(1)) != a.prompt_tokens:
        raise PeerError("the prompt file is %s tokens, not %d" % (m.group(1), a.prompt_tokens))
    return float(m.group(2))


def llama_generate(a, tool, model, threads, text, n, n_ctx, draft=None):
    """llama-lookup / llama-speculative, greedy: decoded tokens, seconds, tok/s, prompt tokens,
    drafted and accepted draft tokens, and the target steps they imply (each step yields its
    accepted drafts plus one token of its own). The text goes in -p, not -f: -f drops the chat
    template's final newline."""
    cmd = [os.path.join(a.llama_cpp, tool), "-m", model, "-p", text.decode("utf-8", "surrogateescape"),
           "--no-escape", "-n", str(n),
           "-t", str(threads), "--temp", "0", "-c", str(n_ctx), "--seed", "1"]
    if draft:
        cmd += ["-md", draft, "-cd", str(n_ctx)]
    p = run(cmd, tool, text=True)
    err = p.stderr
    m = re.search(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds", err)
    e = re.search(r"encoded\s+(\d+) tokens", err)
    if not m or not e:
        raise PeerError("%s printed no 'encoded/decoded N tokens in S seconds' lines" % tool)
    tokens, secs = int(m.group(1)), float(m.group(2))
    drafted = re.search(r"n_drafted\s*=\s*(\d+)", err)
    accepted = re.search(r"n_accept\s*=\s*(\d+)", err)
    acc = int(accepted.group(1)) if accepted else None
    return {"tokens": tokens, "seconds": secs, "tok_s": tokens / secs if secs > 0 else 0.0,
            "prompt_tokens": int(e.group(1)), "drafted": int(drafted.group(1)) if drafted else None,
            "accepted": acc, "target_steps": tokens - acc if acc is not None and tokens > acc else None}


# ---- results ------------------------------------------------------------------------------------

class Results:
    def __init__(self, path, run_id, act_bits="auto"):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.out = open(path, "a")
        self.run_id = run_id
        self.act_bits = act_bits
        self.rows = []

    def add(self, section, what, typ, threads, rnd, orochi, llama, unit, load_o, load_l, **extra):
        """One paired measurement; ratio = times faster orochi is (unit 'ms': lower is better)."""
        if unit == "ms":
            ratio = llama / orochi if orochi > 0 else None
        else:
            ratio = orochi / llama if llama > 0 else None
        row = {"bench": "peer", "run": self.run_id, "section": section, "what": what, "type": typ,
               "threads": threads, "round": rnd, "orochi": orochi, "llama_cpp": llama, "unit": unit,
               "ratio": ratio, "load_orochi": load_o, "load_llama_cpp": load_l,
               "act_bits": self.act_bits}
        row.update(extra)
        self.rows.append(row)
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        return row

    def summary(self, section):
        """Median over rounds per (what, type, threads); also written as JSON lines."""
        keys = []
        for r in self.rows:
            k = (r["what"], r["type"], r["threads"])
            if r["section"] == section and k not in keys:
                keys.append(k)
        out = []
        for k in keys:
            sel = [r for r in self.rows if r["section"] == section and (r["what"], r["type"], r["threads"]) == k]

            def med(f):
                v = [r[f] for r in sel if r.get(f) is not None]
                return statistics.median(v) if v else None
            row = {"bench": "peer-summary", "run": self.run_id, "section": section, "what": k[0], "type": k[1],
                   "threads": k[2], "rounds": len(sel), "orochi": med("orochi"), "llama_cpp": med("llama_cpp"),
                   "unit": sel[0]["unit"], "ratio": med("ratio"),
                   "load_orochi": med("load_orochi"), "load_llama_cpp": med("load_llama_cpp")}
            for f in ("orochi_tok_step", "llama_tok_step", "orochi_x_seq", "llama_x_plain", "orochi_over_llama_plain"):
                if any(f in r for r in sel):
                    row[f] = med(f)
            out.append(row)
            self.out.write(json.dumps(row) + "\n")
        self.out.flush()
        return out


def fmt(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(v)
    return ("%.*f" % (nd, v)) if abs(v) < 1000 else "%.0f" % v


def print_table(title, rows, spec=False):
    head = ["round", "what", "type", "threads", "orochi", "llama.cpp", "ratio"]
    if spec:
        head += ["o tok/step", "l tok/step", "o x seq", "l x plain", "o/l plain"]
    head += ["load o/l"]
    lines = []
    for r in rows:
        cells = [str(r.get("round", "med")), "%s (%s)" % (r["what"], r["unit"]), r["type"], str(r["threads"]),
                 fmt(r["orochi"]), fmt(r["llama_cpp"]), fmt(r["ratio"]) + "x" if r["ratio"] else "-"]
        if spec:
            cells += [fmt(r.get("orochi_tok_step")), fmt(r.get("llama_tok_step")), fmt(r.get("orochi_x_seq")),
                      fmt(r.get("llama_x_plain")), fmt(r.get("orochi_over_llama_plain"))]
        cells.append("%s/%s" % (fmt(r["load_orochi"]), fmt(r["load_llama_cpp"])))
        lines.append(cells)
    width = [max(len(x) for x in col) for col in zip(head, *lines)]
    print("\n" + title)
    print("  ".join(h.ljust(w) if i < 3 else h.rjust(w) for i, (h, w) in enumerate(zip(head, width))))
    print("  ".join("-" * w for w in width))
    for cells in lines:
        print("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, width))))


def plot(path, summaries):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not importable (Debian: python3-matplotlib): no plot")
        return
    sections = [s for s in summaries if summaries[s]]
    fig, axes = plt.subplots(len(sections), 1, figsize=(10, 2.6 * len(sections) + 0.8), squeeze=False)
    for ax, s in zip(axes[:, 0], sections):
        rows = [r for r in summaries[s] if r["ratio"]]
        labels = ["%s %s t%d" % (r["what"], r["type"], r["threads"]) for r in rows]
        vals = [r["ratio"] for r in rows]
        ax.bar(range(len(vals)), vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("x faster")
        ax.set_title("%s: orochi vs llama.cpp (median over rounds; > 1: orochi faster)" % s, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    log("plot written to %s" % path)


# ---- one round ----------------------------------------------------------------------------------

def round_engine(a, res, rnd, models, prompt_paths):
    """decode, prompt and step sections for every type and thread count, engines alternating."""
    tag = "round %d/%d" % (rnd, a.rounds)
    for typ in a.types:
        m = models[typ]
        for t in a.threads:
            log("%s: %s t=%d llama-bench decode ..." % (tag, typ, t))
            ll = load1()
            tg = llama_bench(a, m, t, ["-p", "0", "-n", str(a.n), "-r", "1"])[0]["avg_ts"]
            log("%s: %s t=%d orochi bench decode + steps ..." % (tag, typ, t))
            lo_bench = load1()
            dec, steps = orochi_bench(a, m, t, a.n, a.widths)
            res.add("decode", "decode", typ, t, rnd, dec, tg, "tok/s", lo_bench, ll, tokens=a.n)
            a.llama_tg[(rnd, typ, t)] = (tg, ll)

            log("%s: %s t=%d llama-bench prompt %d ..." % (tag, typ, t, a.prompt_tokens))
            ll = load1()
            pp = llama_bench(a, m, t, ["-p", str(a.prompt_tokens), "-n", "0", "-r", "1"])[0]["avg_ts"]
            log("%s: %s t=%d orochi run prompt %d ..." % (tag, typ, t, a.prompt_tokens))
            lo = load1()
            opp = orochi_prompt(a, m, t, prompt_paths[typ] if isinstance(prompt_paths, dict)
                                else prompt_paths)
            res.add("prompt", "prompt %d" % a.prompt_tokens, typ, t, rnd, opp, pp, "tok/s", lo, ll)

            log("%s: %s t=%d llama-bench steps W=%s ..." % (tag, typ, t, ",".join(map(str, a.widths))))
            ll2 = load1()
            lsteps = {r["n_prompt"]: r["avg_ns"] / 1e6
                      for r in llama_bench(a, m, t, ["-p", ",".join(map(str, a.widths)), "-n", "0", "-r", "3"])}
            for w in a.widths:
                # orochi's step times came from the orochi bench run above
                res.add("step", "t(%d)" % w, typ, t, rnd, steps[w], lsteps[w], "ms", lo_bench, ll2, width=w)


def round_spec(a, res, rnd, models, prompts, failures):
    tag = "round %d/%d" % (rnd, a.rounds)
    target, draft = models[a.spec_target], models[a.spec_draft]
    ttype = a.spec_target
    for t in a.threads:
        if (rnd, ttype, t) in a.llama_tg:
            plain, lplain = a.llama_tg[(rnd, ttype, t)]
        else:
            log("%s: spec t=%d llama-bench decode %s ..." % (tag, t, ttype))
            lplain = load1()
            plain = llama_bench(a, target, t, ["-p", "0", "-n", str(a.n), "-r", "1"])[0]["avg_ts"]

        # orochi sequential: the baseline and the reference ids
        log("%s: spec t=%d orochi run %s, %d prompts ..." % (tag, t, ttype, len(prompts)))
        lo = load1()
        seq = {}
        for p in prompts:
            ids, dec, _ = spec_bench.sequential(a.bin_dir, target, p["prompt"], a.n, t)
            seq[p["id"]] = (ids, dec)
        seq_tok = sum(len(v[0]) for v in seq.values())
        seq_tps = seq_tok / sum(len(v[0]) / v[1] for v in seq.values() if v[1] > 0)
        res.add("spec", "plain decode", ttype, t, rnd, seq_tps, plain, "tok/s", lo, lplain,
                orochi_x_seq=1.0, llama_x_plain=1.0, orochi_over_llama_plain=seq_tps / plain,
                orochi_what="orochi run --chat --temp 0", llama_what="llama-bench tg%d" % a.n)

        for label, tool, spec in (("ngram", "llama-lookup", "ngram"),
                                  ("draft %s" % a.spec_draft, "llama-speculative",
                                   "model:draft=%s,threads=%d" % (draft, a.speculator_threads or t))):
            log("%s: spec t=%d %s, %d prompts ..." % (tag, t, tool, len(prompts)))
            ll = load1()
            lrows = []
            for p in prompts:
                lr = llama_generate(a, tool, target, t, a.chat_texts[p["id"]], a.n, a.n_ctx,
                                    draft=draft if tool == "llama-speculative" else None)
                if lr["prompt_tokens"] != a.chat_tokens[p["id"]]:
                    log("note: %s read %d prompt tokens for %s, orochi %d" % (tool, lr["prompt_tokens"], p["id"],
                                                                            a.chat_tokens[p["id"]]))
                lrows.append(lr)
            l_tps = sum(r["tokens"] for r in lrows) / sum(r["seconds"] for r in lrows)
            l_steps = [r["target_steps"] for r in lrows]
            l_tok_step = (sum(r["tokens"] for r in lrows) / sum(l_steps)) if all(l_steps) else None

            log("%s: spec t=%d orochi group (cpu:1 x %d threads, %s) ..." % (tag, t, t, label))
            lo = load1()
            run_dir = "%s-%s-t%d" % (a.run_dir, re.sub(r"[^a-z0-9]+", "-", label.lower()), t)
            try:
                # the drafter is the target's own low-bit copy: long drafts pay (--max-draft up to
                # width - 1); prompt lookup keeps the group default
                ctl = ["--max-draft", str(a.max_draft)] if spec.startswith("model") else []
                g = spec_bench.Group(a.bin_dir, target, run_dir, 1, t, [spec], [], ctl=ctl)
            except subprocess.CalledProcessError:
                raise PeerError("the orochi group (%s) did not start: see %s/logs" % (label, run_dir))
            orows = []
            try:
                for p in prompts:
                    o, tps, dt = spec_bench.group_decode(g, p["prompt"], a.n)
                    want = seq[p["id"]][0]
                    same = o["token_ids"] == want
                    if not same:
                        failures.append((label, t, p["id"]))
                        at = next((i for i, (x, y) in enumerate(zip(o["token_ids"], want)) if x != y),
                                  min(len(o["token_ids"]), len(want)))
                        print("MISMATCH round %d t=%d %s %s: orochi speculative output differs from orochi run "
                              "--temp 0 at token %d: %s vs %s" % (rnd, t, label, p["id"], at, o["token_ids"][at:at + 8],
                                                                  want[at:at + 8]), file=sys.stderr, flush=True)
                    orows.append({"tokens": len(o["token_ids"]), "decoded": max(1, len(o["token_ids"]) - 1),
                                  "seconds": dt, "steps": o["steps"], "acc": o["mean_accepted"], "same": same})
                    res.out.write(json.dumps({"bench": "peer-prompt", "run": res.run_id, "round": rnd, "threads": t,
                                              "config": label, "id": p["id"], "category": p.get("category"),
                                              "orochi_tok_s": tps, "orochi_tokens": len(o["token_ids"]),
                                              "orochi_steps": o["steps"], "orochi_mean_accepted": o["mean_accepted"],
                                              "orochi_seq_decode_tok_s": seq[p["id"]][1], "lossless": same,
                                              "llama_cpp": lrows[prompts.index(p)]}) + "\n")
            finally:
                g.down()
            o_tps = sum(r["decoded"] for r in orows) / sum(r["seconds"] for r in orows)
            o_acc = sum(r["acc"] * r["steps"] for r in orows) / max(1, sum(r["steps"] for r in orows))
            res.add("spec", label, ttype, t, rnd, o_tps, l_tps, "tok/s", lo, ll,
                    orochi_tok_step=o_acc, llama_tok_step=l_tok_step, orochi_x_seq=o_tps / seq_tps,
                    llama_x_plain=l_tps / plain, orochi_over_llama_plain=o_tps / plain,
                    lossless=all(r["same"] for r in orows), orochi_workers="cpu:1", orochi_threads_per_worker=t,
                    orochi_speculator=spec, llama_tool=tool,
                    llama_drafted=sum(r["drafted"] or 0 for r in lrows),
                    llama_accepted=sum(r["accepted"] or 0 for r in lrows))


# ---- main ---------------------------------------------------------------------------------------

def check_tools(a):
    """One line naming what is missing, or None."""
    if not a.llama_cpp:
        return "--llama-cpp DIR (llama.cpp's bin directory; build it with ../shared/bench/build-peer.sh) is required"
    if not os.path.isdir(a.llama_cpp):
        return "--llama-cpp %s is not a directory (build llama.cpp with ../shared/bench/build-peer.sh)" % a.llama_cpp
    need = list(LLAMA_TOOLS_ALWAYS) + (list(LLAMA_TOOLS_SPEC) if a.spec else []) + (
        ["llama-quantize"] if a.shapes else [])
    missing = [t for t in need if not os.access(os.path.join(a.llama_cpp, t), os.X_OK)]
    if missing:
        return "missing in %s: %s" % (a.llama_cpp, ", ".join(missing))
    omissing = [b for b in ("orochi", "orochi-coordinator", "orochi-worker", "orochi-speculator")
                if not os.access(os.path.join(a.bin_dir, b), os.X_OK)]
    if omissing:
        return "missing in %s: %s (run make)" % (a.bin_dir, ", ".join(omissing))
    if not os.path.exists(a.model):
        return "model %s is absent (run make models)" % a.model
    if a.spec and not os.path.exists(a.prompts):
        return "prompt file %s is absent" % a.prompts
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--llama-cpp", default="", help="llama.cpp bin directory (llama-bench, llama-lookup, ...)")
    ap.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"), help="orochi binaries")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--types", default="Q4_1,Q8_0,F16", help="types compared (derived from --model)")
    ap.add_argument("--work-dir", default=os.path.join(ROOT, "bench", "results", "peer-models"),
                    help="where derived model files are kept and reused")
    ap.add_argument("--threads", default="1,2", help="thread counts (llama.cpp -t = orochi threads)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=64, help="tokens generated (decode section and spec section)")
    ap.add_argument("--spec", dest="spec", action="store_true", default=True)
    ap.add_argument("--no-spec", dest="spec", action="store_false", help="skip the speculative section")
    ap.add_argument("--spec-target", default="F16", help="type of the target in the spec section")
    ap.add_argument("--spec-draft", default="Q4_1", help="type of the draft model in the spec section")
    ap.add_argument("--speculator-threads", type=int, default=0,
                    help="threads of orochi's model speculator (0: the same as the target's)")
    ap.add_argument("--max-draft", type=int, default=7, help="the model drafter group's --max-draft")
    ap.add_argument("--prompts", default=os.path.join(os.path.dirname(ROOT), "shared", "bench", "prompts.jsonl"))
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--json", default=os.path.join(ROOT, "bench", "results", "peer.jsonl"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "bench", "results", "peer.png"))
    ap.add_argument("--run-dir", default="/tmp/orochi-peer-run", help="run directory prefix of the groups")
    ap.add_argument("--quick", action="store_true", help="1 round, Q4_1, 1 thread, -n 16, one prompt")
    ap.add_argument("--shapes", default="",
                    help="real models' shapes (1b, 8b; comma list) instead of --model: random weights "
                         "by orochi mkmodel in F16, the other --types by the peer's llama-quantize; "
                         "no spec section")
    ap.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS,
                    help="tokens of the prompt section's prompt (default %d)" % PROMPT_TOKENS)
    ap.add_argument("--widths", default=",".join(map(str, STEP_WIDTHS)),
                    help="widths W of the step section (at most 64)")
    ap.add_argument("--act-bits", choices=("auto", "8", "16"), default="auto",
                    help="orochi's activation precision in the decode, prompt and step sections "
                         "(default auto: 8 bits for the K-quants, 16 for the rest)")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.types, a.threads, a.n, a.per_category = 1, "Q4_1", "1", 16, 1
    a.types = [t.strip().upper() for t in a.types.split(",") if t.strip()]
    a.widths = [int(w) for w in a.widths.split(",") if w.strip()]
    a.shapes = [x.strip().lower() for x in a.shapes.split(",") if x.strip()]
    if a.shapes:
        a.spec = False
        if any(x not in SHAPES for x in a.shapes):
            print("peer: --shapes takes %s" % ", ".join(SHAPES), file=sys.stderr)
            return 2
    a.threads = [int(t) for t in a.threads.split(",") if t.strip()]
    a.spec_target, a.spec_draft = a.spec_target.upper(), a.spec_draft.upper()
    bad = [t for t in a.types + [a.spec_target, a.spec_draft] if t not in TYPES]
    if bad or a.rounds < 1 or not a.threads or a.n < 2:
        print("peer: bad arguments: %s" % ("unknown type %s (one of %s)" % (bad[0], " ".join(TYPES)) if bad
                                           else "--rounds >= 1, --threads non-empty, -n >= 2"), file=sys.stderr)
        return 2
    a.bin_dir = os.path.abspath(a.bin_dir)
    a.llama_cpp = os.path.abspath(a.llama_cpp) if a.llama_cpp else ""
    missing = check_tools(a)
    if missing:
        print("peer: " + missing, file=sys.stderr)
        return 2

    res = Results(a.json, time.strftime("%Y-%m-%dT%H:%M:%S"), a.act_bits)
    failures = []
    a.llama_tg = {}
    try:
        need = list(dict.fromkeys(a.types + ([a.spec_target, a.spec_draft] if a.spec else [])))
        if a.shapes:
            models = shape_models(a, a.shapes, a.types)
            a.types = list(models)  # "SHAPE TYPE" labels
        else:
            models = derive_models(a, need)
        with tempfile.TemporaryDirectory(prefix="peer-") as tmp:
            # one prompt file per vocabulary (a shape's files share theirs)
            prompt_path = {}
            for typ in a.types:
                key = typ.split()[0] if a.shapes else "model"
                if key not in prompt_path:
                    prompt_path[key] = prompt_file_128(a, models[typ], os.path.join(
                        tmp, "prompt-%s.txt" % key))
            prompt_path = {typ: prompt_path[typ.split()[0] if a.shapes else "model"]
                           for typ in a.types}
            prompts = []
            if a.spec:
                prompts = spec_bench.load_prompts(a.prompts, a.per_category)[: 1 if a.quick else None]
                if not prompts:
                    raise PeerError("no prompts in %s" % a.prompts)
                a.chat_texts, a.chat_tokens = {}, {}
                for p in prompts:
                    a.chat_texts[p["id"]], a.chat_tokens[p["id"]] = chat_text(a, models[a.spec_target], p["prompt"])
                # room for the prompt, -n, and what llama-speculative decodes past -n
                a.n_ctx = (max(a.chat_tokens.values()) + a.n + 64 + 255) // 256 * 256
            log("%d round(s); types %s; threads %s; -n %d; %s; load %s" % (
                a.rounds, ",".join(a.types), ",".join(map(str, a.threads)), a.n,
                "spec on %d prompt(s), target %s, draft %s" % (len(prompts), a.spec_target, a.spec_draft)
                if a.spec else "no spec", loadavg()))
            for rnd in range(1, a.rounds + 1):
                round_engine(a, res, rnd, models, prompt_path)
                if a.spec:
                    round_spec(a, res, rnd, models, prompts, failures)
    except PeerError as e:
        print("peer: %s" % e, file=sys.stderr)
        return 1
    except (subprocess.CalledProcessError, OSError) as e:
        # orochi run through spec_bench.sequential, or an HTTP request to a group
        print("peer: %s" % e, file=sys.stderr)
        return 1

    titles = {"decode": "decode tok/s (llama-bench -p 0 -n %d  vs  orochi bench --decode-tokens %d)" % (a.n, a.n),
              "prompt": "prompt processing, %d tokens (llama-bench -p %d -n 0  vs  orochi run --prompt-file)"
                        % (a.prompt_tokens, a.prompt_tokens),
              "step": "step time of a W-token batch, ms (llama-bench -p W -n 0 -r 3  vs  orochi bench t(W), "
                      "context %d); ratio = llama.cpp ms / orochi ms" % STEP_CTX,
              "spec": "speculative decoding, greedy, -n %d (target %s; orochi group cpu:1 x T threads + 1 "
                      "speculator process  vs  llama-lookup / llama-speculative -t T)" % (a.n, a.spec_target)}
    summaries = {}
    for s in ("decode", "prompt", "step", "spec"):
        rows = [r for r in res.rows if r["section"] == s]
        if not rows:
            continue
        summaries[s] = res.summary(s)
        print_table(titles[s], rows + (summaries[s] if a.rounds > 1 else []), spec=(s == "spec"))
    print("\nratio: how many times faster orochi is (> 1: orochi faster); load o/l: 1-minute load average "
          "at the orochi / llama.cpp measurement; JSON lines in %s" % a.json)
    plot(a.plot, summaries)
    if failures:
        print("peer: %d orochi speculative outputs differ from orochi run --temp 0 (NOT LOSSLESS): %s"
              % (len(failures), ", ".join("%s t=%d %s" % f for f in failures)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
