"""ctest `reference_logits`: the C engine's logits against the numpy reference.

The C engine (OROCHI_BIN) is driven through two CLI commands:

  orochi mkmodel --out F --layers L --dim D --ffn F --heads H --kv-heads K
                 --vocab V --ctx C --type T --seed S [--tied]
      writes a deterministic random-weight Llama GGUF (matrices in type T,
      norms in F32; `--tied` omits output.weight);
  orochi eval --model M --ids "3 17 42" --out FILE [--batch W] [--threads N]
              [--kv f32|f16] [--act-bits 16|8]
      teacher-forces the ids and writes raw little-endian float32 logits,
      one row of `vocab` values per id (row i = after consuming ids[0..i]).

The reference is tests/reference/llama_ref.py (float64 numpy, its own GGUF
reader and dequantiser), written independently of the C code.

Parts:
  0. checks of the reference itself: dequantisation of hand-built blocks with
     known values, quantise->dequantise round trips of random data, and the
     vectorised reference forward against a deliberately naive loop version
     on tiny models written by gguf_ref.write_gguf;
  a. tiny random models from `mkmodel` in every weight type (plus tied and
     MHA variants), evaluated on a fixed id sequence with batch 1 and batch 8
     (and an f16 KV cache on the f32 model);
  b. the default model (OROCHI_MODEL): the reference generates 32 tokens
     greedily after each of 5 prompts, then `orochi eval` must reproduce the
     logits at every position (prompt and generated part);
  c. the default model re-quantized by `orochi quantize` to Q4_K_M, Q5_K_M,
     Q6_K, Q5_1 and Q3_K (K-types, their llama.cpp fallbacks, mixes): the
     reference generates 8 tokens after the first prompt from each file and
     `orochi eval` (batch 1 and 8) must reproduce its logits;
  d. `--act-bits 8` (8-bit activations for quantized matmuls): tiny Q8_0 / Q4_0
     models against the reference rounding the same way (1e-3), tiny Q4_1 and
     the default model against the exact reference in mean relative L2 and
     argmax agreement (check_act8 says why not tighter); `--act-bits auto` (the
     default: 8 bits for K-quant matrices, 16 for the rest) equal to the 8-bit
     run on a tiny Q4_K model, to the 16-bit one on a tiny Q4_1 model, and to
     neither on a tiny model mixing the two;
  e. the families (`mkmodel --arch`): llama31 (rope_freqs.weight), qwen2
     (q/k/v biases, NEOX RoPE), qwen3 (per-head q/k norms), llama with q/k/v
     and output biases, a head size other than dim / heads, linear and YaRN
     RoPE scaling — at F16, and the three architectures also at Q8_0, Q4_K and
     Q4_K_M (orochi quantize's preset: Q4_K with Q6_K), 48 positions, batch 1 and 8; each
     family's file with its distinguishing piece left out must miss the
     bound (the check can fail); and files written here with each metadata
     key orochi does not compute, an unknown architecture and a stray block
     tensor must be refused naming it, by `orochi eval` and in `orochi
     inspect`'s verdict line.

The measure is the relative L2 error per position, ||c - r|| / ||r||, against
the exact (float64, unquantised-activation) reference.  Bounds: 1e-4 for
f32/f16/bf16 weights; 1e-2 for quantised weights (the engine rounds the
activations it multiplies with quantised weights) and for an f16 KV cache.
Measured when written: ~4e-7 for float weights, ~2e-4 for quantised tiny
models and ~2e-3 at worst on SmolLM2-135M with the engine's 16-bit
activations (its opt-in 8-bit activations give ~2e-2 tiny and ~0.09 mean,
up to ~0.3, on SmolLM2: part d), ~5e-4 for the f16 KV cache.

Environment: OROCHI_BIN, OROCHI_MODEL, OROCHI_TMP (as set by ctest).
Exit status: 0 pass, 1 fail, 77 everything skipped.
"""

import os
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import dequant_ref as dq  # noqa: E402
import gguf_ref  # noqa: E402
from llama_ref import LlamaRef, quantise_activations  # noqa: E402

SOURCE = os.environ.get("OROCHI_SOURCE", os.path.dirname(os.path.dirname(HERE)))
OROCHI_BIN = os.environ.get("OROCHI_BIN", os.path.join(SOURCE, "build", "bin", "orochi"))
OROCHI_MODEL = os.environ.get(
    "OROCHI_MODEL", os.path.join(SOURCE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
TMP = os.environ.get("OROCHI_TMP", "/tmp")
WORKDIR = os.path.join(TMP, "reference_logits.%d" % os.getpid())

BOUND_FLOAT = 1e-4     # f32 / f16 / bf16 weights
BOUND_QUANT = 1e-2     # quantised weights (tiny and default model)
BOUND_KV_F16 = 1e-2    # f16 KV cache on the f32 tiny model
BOUND_ACT8 = 1e-3      # --act-bits 8 against the reference that rounds the same way (Q8_0, Q4_0)
ACT8_MEAN = 0.15       # --act-bits 8 against the exact reference: mean relative L2 ...
ACT8_TOP1 = 0.8        # ... and the share of positions with the same argmax
SUBPROCESS_TIMEOUT = 300

# A fixed teacher-forcing sequence for the tiny models (vocab 300).
TINY_IDS = [3, 17, 42, 299, 0, 128, 7, 7, 250, 64, 1, 199, 33, 280, 5, 111,
            90, 2, 255, 18, 144, 73, 298, 60]

TINY_BASE = dict(layers=2, dim=64, ffn=160, heads=4, kv_heads=2, vocab=300,
                 ctx=128, seed=7)

DEFAULT_PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, there was a little",
    "def fibonacci(n):\n",
    "The quick brown fox jumps over the lazy dog. Then",
]
# Token ids of DEFAULT_PROMPTS for SmolLM2's vocabulary, used only when
# `orochi tokenize` is unavailable (found by a longest-match vocab lookup).
FALLBACK_PROMPT_IDS = [
    [504, 3575, 282, 4649, 314],
    [1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 32075, 14542,
     100, 198],
    [6403, 1980, 253, 655, 28, 665, 436, 253, 1838],
    [1604, 3987, 46477, 24, 94, 727, 198],
    [504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30, 3875],
]
GENERATE = 32


class Report:
    """Collects per-case error statistics and failures; prints a table."""

    def __init__(self):
        self.rows = []
        self.failures = []
        self.ran = 0

    def fail(self, message):
        self.failures.append(message)
        print("FAIL: " + message, flush=True)

    def compare(self, case, c_logits, r_logits, bound):
        """Relative L2 error per position; records the worst offender."""
        self.ran += 1
        if c_logits.shape != r_logits.shape:
            self.fail("%s: C logits have shape %s, reference %s"
                      % (case, c_logits.shape, r_logits.shape))
            return
        if not np.all(np.isfinite(c_logits)):
            bad = int(np.argmax(~np.all(np.isfinite(c_logits), axis=1)))
            self.fail("%s: non-finite C logits at position %d" % (case, bad))
            return
        diff = np.linalg.norm(c_logits - r_logits, axis=1)
        rel = diff / np.maximum(np.linalg.norm(r_logits, axis=1), 1e-30)
        worst = int(np.argmax(rel))
        ok = bool(rel.max() <= bound)
        self.rows.append((case, len(rel), float(rel.max()), float(rel.mean()),
                          worst, bound, ok))
        print("  %-32s max %.2e (pos %3d) mean %.2e %s"
              % (case, rel.max(), worst, rel.mean(), "ok" if ok else "FAIL"),
              flush=True)
        if not ok:
            over = np.nonzero(rel > bound)[0]
            self.fail("%s: relative L2 error %.3e > %.0e at position %d "
                      "(%d of %d positions over the bound, first at %d)"
                      % (case, rel[worst], bound, worst, over.size, rel.size,
                         over[0]))

    def table(self):
        if not self.rows:
            return
        print("\n%-32s %4s %9s %5s %9s %7s  %s"
              % ("case", "pos", "max rel", "@pos", "mean rel", "bound", "status"))
        for case, n, mx, mean, worst, bound, ok in self.rows:
            print("%-32s %4d %9.2e %5d %9.2e %7.0e  %s"
                  % (case, n, mx, worst, mean, bound, "ok" if ok else "FAIL"))
        print(flush=True)


# ---------------------------------------------------------------------------
# Running the C engine
# ---------------------------------------------------------------------------

def run_orochi(args, what):
    cmd = [OROCHI_BIN] + [str(a) for a in args]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=SUBPROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RuntimeError("%s: timed out after %ds: %s"
                           % (what, SUBPROCESS_TIMEOUT, " ".join(cmd)))
    if proc.returncode != 0:
        raise RuntimeError("%s: exit status %d: %s\n%s"
                           % (what, proc.returncode, " ".join(cmd),
                              proc.stderr.decode(errors="replace")[-2000:]))
    return proc.stdout.decode(errors="replace")


def c_eval(model, ids, vocab, tag, batch=1, kv="f32", threads=None, act_bits=16):
    out = os.path.join(WORKDIR, "%s.logits" % tag)
    args = ["eval", "--model", model, "--ids", " ".join(str(i) for i in ids),
            "--out", out, "--batch", batch, "--kv", kv, "--act-bits", act_bits]
    if threads:
        args += ["--threads", threads]
    run_orochi(args, "eval " + tag)
    data = np.fromfile(out, dtype="<f4")
    os.unlink(out)
    if data.size != len(ids) * vocab:
        raise RuntimeError("eval %s: wrote %d floats, expected %d x %d"
                           % (tag, data.size, len(ids), vocab))
    return data.reshape(len(ids), vocab).astype(np.float64)


def mkmodel(path, type_name, tied=False, **over):
    p = dict(TINY_BASE, **over)
    args = ["mkmodel", "--out", path, "--layers", p["layers"], "--dim", p["dim"],
            "--ffn", p["ffn"], "--heads", p["heads"], "--kv-heads", p["kv_heads"],
            "--vocab", p["vocab"], "--ctx", p["ctx"], "--type", type_name,
            "--seed", p["seed"]]
    if tied:
        args.append("--tied")
    run_orochi(args, "mkmodel " + os.path.basename(path))
    return p


def check_tiny_model_layout(path, type_id, tied, params):
    """The GGUF from mkmodel must really have the requested types and shape."""
    g = gguf_ref.GGUFRef(path)
    problems = []
    for name, info in g.tensors.items():
        is_matrix = len(info.ne) >= 2 and info.ne[1] > 1
        want = type_id if is_matrix else dq.GGML_F32
        if info.type != want:
            problems.append("%s has ggml type %d, expected %d" % (name, info.type, want))
    has_output = "output.weight" in g.tensors
    if tied == has_output:
        problems.append("output.weight is %s although the model should be %s"
                        % ("present" if has_output else "absent",
                           "tied" if tied else "untied"))
    n_blocks = int(g.kv.get("llama.block_count", -1))
    if n_blocks != params["layers"]:
        problems.append("block_count %d, expected %d" % (n_blocks, params["layers"]))
    embd = g.tensors.get("token_embd.weight")
    if embd is None or tuple(embd.ne[:2]) != (params["dim"], params["vocab"]):
        problems.append("token_embd.weight shape %s" % (embd.ne if embd else None,))
    return problems


# ---------------------------------------------------------------------------
# Part 0: checks of the reference itself
# ---------------------------------------------------------------------------

def check_dequant(report):
    """Hand-built blocks with known values, and random round trips."""
    print("part 0: reference self-checks", flush=True)
    j = np.arange(16)

    def half(v):
        return np.array([v], dtype="<f2").view(np.uint8)

    cases = []
    # Q4_0: d = 0.5, low nibble j, high nibble 15 - j
    qs = (j | ((15 - j) << 4)).astype(np.uint8)
    raw = np.concatenate([half(0.5), qs])
    want = np.concatenate([0.5 * (j - 8), 0.5 * ((15 - j) - 8)])
    cases.append(("q4_0 block", raw, dq.GGML_Q4_0, want))
    # Q4_1: d = 0.25, m = -1; low nibble (3j) % 16, high nibble j
    low = (3 * j) % 16
    raw = np.concatenate([half(0.25), half(-1.0),
                          (low | (j << 4)).astype(np.uint8)])
    want = np.concatenate([0.25 * low - 1.0, 0.25 * j - 1.0])
    cases.append(("q4_1 block", raw, dq.GGML_Q4_1, want))
    # Q8_0: d = 0.125, q = -16 .. 15 as int8
    q = np.arange(-16, 16, dtype=np.int8)
    raw = np.concatenate([half(0.125), q.view(np.uint8)])
    cases.append(("q8_0 block", raw, dq.GGML_Q8_0, 0.125 * q.astype(np.float64)))
    # F16 / BF16 / F32 bit patterns
    f16_bits = np.array([0x3C00, 0xC000, 0x3555, 0x7BFF] * 8, dtype="<u2")
    cases.append(("f16 bits", f16_bits.view(np.uint8), dq.GGML_F16,
                  np.array([1.0, -2.0, 0.333251953125, 65504.0] * 8)))
    bf16_bits = np.array([0x3F80, 0xC049, 0x0000, 0x4780] * 8, dtype="<u2")
    cases.append(("bf16 bits", bf16_bits.view(np.uint8), dq.GGML_BF16,
                  np.array([1.0, -3.140625, 0.0, 65536.0] * 8)))
    f32_vals = np.linspace(-3, 3, 32).astype("<f4")
    cases.append(("f32 values", f32_vals.view(np.uint8), dq.GGML_F32,
                  f32_vals.astype(np.float64)))
    for name, raw, typ, want in cases:
        got = dq.dequant(raw, typ, (32, 1)).reshape(-1)
        if not np.array_equal(got.astype(np.float64), want):
            report.fail("dequant %s: got %s, want %s" % (name, got[:8], want[:8]))
    # multi-row layout: row r of a (ne0=64, ne1=3) Q8_0 tensor holds r*100 + k
    rows = np.array([[r * 100.0 + k for k in range(64)] for r in range(3)], dtype=np.float32)
    got = dq.dequant(dq.quantize_q8_0(rows.reshape(-1)), dq.GGML_Q8_0, (64, 3))
    if got.shape != (3, 64) or np.abs(got - rows).max() > 2.0:
        report.fail("dequant q8_0 rows: wrong layout (shape %s)" % (got.shape,))

    rng = np.random.default_rng(2024)
    x = (rng.standard_normal(32 * 256) * rng.uniform(0.1, 3, 32 * 256)).astype(np.float32)
    for name, quant, typ, bound in (("q8_0", dq.quantize_q8_0, dq.GGML_Q8_0, 0.01),
                                    ("q4_0", dq.quantize_q4_0, dq.GGML_Q4_0, 0.15),
                                    ("q4_1", dq.quantize_q4_1, dq.GGML_Q4_1, 0.12)):
        raw = quant(x)
        if raw.size != dq.tensor_nbytes(typ, (32, 256)):
            report.fail("quantize %s: %d bytes" % (name, raw.size))
            continue
        y = dq.dequant(raw, typ, (32, 256)).reshape(-1)
        err = np.linalg.norm(y - x) / np.linalg.norm(x)
        # every element must be within one quantisation step of its input
        blk = x.reshape(-1, 32)
        step = (blk.max(1) - blk.min(1)) if typ == dq.GGML_Q4_1 else np.abs(blk).max(1)
        step = step / {dq.GGML_Q8_0: 127, dq.GGML_Q4_0: 7, dq.GGML_Q4_1: 15}[typ]
        worst = (np.abs(y - x).reshape(-1, 32) / (step[:, None] + 1e-12)).max()
        print("  dequant round trip %-5s rel L2 %.4f, worst error %.2f steps"
              % (name, err, worst))
        if err > bound or worst > 0.6:
            report.fail("dequant round trip %s: rel L2 %.4f (bound %.2f), "
                        "worst %.2f steps" % (name, err, bound, worst))

    # block offsets (used by the reference's optional act_bits mode)
    q4_0_raw, q4_1_raw = cases[0][1], cases[1][1]
    for name, raw, typ, want in (("q4_0", q4_0_raw, dq.GGML_Q4_0, -4.0),
                                 ("q4_1", q4_1_raw, dq.GGML_Q4_1, -1.0)):
        got = dq.block_offsets(raw, typ, (32, 1))
        if got.shape != (1, 1) or got[0, 0] != want:
            report.fail("block_offsets %s: got %s, want %g" % (name, got, want))

    # activation rounding of the act_bits mode: scale amax/127, ties to even
    act = np.zeros((2, 64))
    act[0, :7] = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 3.2]
    act[0, 32:35] = [-2.54, 1.0, 0.3]            # amax 2.54 -> step 0.02
    want = np.zeros((2, 64))
    want[0, :7] = [127.0, 0.0, 2.0, 2.0, 0.0, -2.0, 3.0]
    want[0, 32:35] = [-2.54, 1.0, 0.3]
    got = quantise_activations(act, 8)
    if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
        report.fail("activation rounding: got %s" % got[0, [0, 1, 2, 3, 4, 5, 6, 32, 33, 34]])
    report.ran += 1


def naive_logits(model, ids):
    """Slow, loop-by-loop Llama forward using the weights held by `model`.

    Written in a different style from LlamaRef (per token, per head, RoPE via
    complex multiplication) so that it checks the vectorised reference.
    """
    cfg = model.cfg
    hd = cfg.head_dim
    group = cfg.n_heads // cfg.n_kv_heads
    keys = [[] for _ in model.layers]
    values = [[] for _ in model.layers]

    def norm(v, w):
        return w * v / np.sqrt(np.dot(v, v) / v.size + cfg.eps)

    def rotate(vec, pos):
        out = vec.copy()
        for i in range(cfg.rot_dim // 2):
            z = complex(vec[2 * i], vec[2 * i + 1])
            z *= np.exp(1j * pos * cfg.rope_base ** (-2.0 * i / cfg.rot_dim))
            out[2 * i], out[2 * i + 1] = z.real, z.imag
        return out

    result = []
    for pos, tok in enumerate(ids):
        x = model.token_embd[tok].astype(np.float64)
        for li, L in enumerate(model.layers):
            h = norm(x, L["attn_norm"])
            q = L["wq"].values @ h
            k = L["wk"].values @ h
            v = L["wv"].values @ h
            keys[li].append([rotate(k[g * hd:(g + 1) * hd], pos) for g in range(cfg.n_kv_heads)])
            values[li].append([v[g * hd:(g + 1) * hd] for g in range(cfg.n_kv_heads)])
            heads = []
            for hh in range(cfg.n_heads):
                g = hh // group
                qh = rotate(q[hh * hd:(hh + 1) * hd], pos)
                s = np.array([np.dot(qh, keys[li][t][g]) for t in range(pos + 1)]) / np.sqrt(hd)
                w = np.exp(s - s.max())
                w /= w.sum()
                heads.append(sum(w[t] * values[li][t][g] for t in range(pos + 1)))
            x = x + L["wo"].values @ np.concatenate(heads)
            h = norm(x, L["ffn_norm"])
            a = L["w_gate"].values @ h
            x = x + L["w_down"].values @ ((a / (1 + np.exp(-a))) * (L["w_up"].values @ h))
        result.append(model.lm_head.values @ norm(x, model.output_norm))
    return np.array(result)


def write_python_tiny_model(path, rng, n_heads=4, n_kv=2, rot_dim=None, tied=False):
    """A small f32 llama GGUF written with gguf_ref.write_gguf (no C involved)."""
    dim, ffn, vocab, layers, hd = 32, 48, 50, 2, 8
    kv = {
        "general.architecture": "llama",
        "llama.block_count": layers,
        "llama.embedding_length": dim,
        "llama.feed_forward_length": ffn,
        "llama.attention.head_count": n_heads,
        "llama.attention.head_count_kv": n_kv,
        "llama.rope.freq_base": 500.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.context_length": 64,
    }
    if rot_dim is not None:
        kv["llama.rope.dimension_count"] = rot_dim
    tensors = []

    def add(name, ne, scale=0.3, offset=0.0):
        data = (rng.standard_normal(int(np.prod(ne))) * scale + offset).astype("<f4")
        tensors.append((name, dq.GGML_F32, tuple(ne), data.tobytes()))

    add("token_embd.weight", (dim, vocab), 1.0)
    for i in range(layers):
        p = "blk.%d." % i
        add(p + "attn_norm.weight", (dim,), 0.1, 1.0)
        add(p + "attn_q.weight", (dim, n_heads * hd))
        add(p + "attn_k.weight", (dim, n_kv * hd))
        add(p + "attn_v.weight", (dim, n_kv * hd))
        add(p + "attn_output.weight", (n_heads * hd, dim))
        add(p + "ffn_norm.weight", (dim,), 0.1, 1.0)
        add(p + "ffn_gate.weight", (dim, ffn))
        add(p + "ffn_up.weight", (dim, ffn))
        add(p + "ffn_down.weight", (ffn, dim))
    add("output_norm.weight", (dim,), 0.1, 1.0)
    if not tied:
        add("output.weight", (dim, vocab))
    gguf_ref.write_gguf(path, kv, tensors)


def check_reference_forward(report):
    rng = np.random.default_rng(99)
    ids = [int(t) for t in rng.integers(0, 50, 12)]
    variants = [("gqa", dict()), ("mha+tied", dict(n_kv=4, tied=True)),
                ("partial rope", dict(n_heads=2, n_kv=1, rot_dim=4))]
    for name, opts in variants:
        path = os.path.join(WORKDIR, "pyref_%s.gguf" % name.replace(" ", "_").replace("+", "_"))
        write_python_tiny_model(path, rng, **opts)
        model = LlamaRef(path)
        fast = model.teacher_forced(ids, chunk=5)
        model.reset()
        stepped = np.array([model.step(t) for t in ids])
        slow = naive_logits(model, ids)
        for what, got in (("chunked", fast), ("stepped", stepped)):
            err = np.abs(got - slow).max() / np.abs(slow).max()
            if not err < 1e-10:
                report.fail("reference forward (%s, %s) disagrees with the naive "
                            "forward: %.2e" % (name, what, err))
        print("  reference vs naive forward (%s): ok" % name, flush=True)
    report.ran += 1


# ---------------------------------------------------------------------------
# Part a: tiny random models from mkmodel
# ---------------------------------------------------------------------------

TYPE_IDS = {"f32": dq.GGML_F32, "f16": dq.GGML_F16, "bf16": dq.GGML_BF16,
            "q8_0": dq.GGML_Q8_0, "q4_0": dq.GGML_Q4_0, "q4_1": dq.GGML_Q4_1,
            "q5_0": dq.GGML_Q5_0, "q5_1": dq.GGML_Q5_1, "iq4_nl": dq.GGML_IQ4_NL,
            "q2_k": dq.GGML_Q2_K, "q3_k": dq.GGML_Q3_K, "q4_k": dq.GGML_Q4_K,
            "q5_k": dq.GGML_Q5_K, "q6_k": dq.GGML_Q6_K}
# K-quant tiny models: rows a multiple of the 256-element super-block
TINY_K = {"dim": 256, "ffn": 512}


def tiny_cases():
    cases = [(t, t, False, {}) for t in ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0",
                                         "q5_1", "iq4_nl")]
    cases += [(t, t, False, TINY_K) for t in ("q2_k", "q3_k", "q4_k", "q5_k", "q6_k")]
    cases.append(("f32-tied", "f32", True, {}))
    cases.append(("q8_0-tied", "q8_0", True, {}))
    cases.append(("f32-mha", "f32", False, {"kv_heads": TINY_BASE["heads"]}))
    cases.append(("q4_1-mha", "q4_1", False, {"kv_heads": TINY_BASE["heads"], "seed": 11}))
    return cases


def check_tiny_models(report):
    print("part a: tiny mkmodel models vs reference", flush=True)
    for label, type_name, tied, over in tiny_cases():
        path = os.path.join(WORKDIR, "tiny_%s.gguf" % label)
        try:
            params = mkmodel(path, type_name, tied=tied, **over)
        except RuntimeError as exc:
            report.fail("tiny %s: %s" % (label, exc))
            continue
        problems = check_tiny_model_layout(path, TYPE_IDS[type_name], tied, params)
        if problems:
            report.fail("tiny %s: mkmodel output: %s" % (label, "; ".join(problems)))
            continue
        ref = LlamaRef(path).teacher_forced(TINY_IDS)
        bound = BOUND_FLOAT if type_name in ("f32", "f16", "bf16") else BOUND_QUANT
        runs = [("batch1", 1, "f32", bound), ("batch8", 8, "f32", bound)]
        if label == "f32":
            runs.append(("batch1 kv-f16", 1, "f16", BOUND_KV_F16))
            runs.append(("batch8 kv-f16", 8, "f16", BOUND_KV_F16))
        for run_name, batch, kv, run_bound in runs:
            case = "tiny %s %s" % (label, run_name)
            try:
                c = c_eval(path, TINY_IDS, params["vocab"], "tiny_%s_%d_%s" % (label, batch, kv),
                           batch=batch, kv=kv)
            except RuntimeError as exc:
                report.fail("%s: %s" % (case, exc))
                continue
            report.compare(case, c, ref, run_bound)
        os.unlink(path)


# ---------------------------------------------------------------------------
# Part b: the default model
# ---------------------------------------------------------------------------

def prompt_ids(text, fallback, vocab):
    """Ids of a prompt from `orochi tokenize --ids-only`, else the fixed list."""
    try:
        out = run_orochi(["tokenize", "--model", OROCHI_MODEL, "--ids-only", text],
                         "tokenize")
        ids = [int(s) for s in re.findall(r"-?\d+", out)]
        if ids and all(0 <= i < vocab for i in ids):
            return ids, "tokenize"
        print("  tokenize gave unusable output %r; using fixed ids" % out[:80])
    except RuntimeError as exc:
        print("  tokenize unavailable (%s); using fixed ids"
              % str(exc).splitlines()[0][:120])
    return list(fallback), "fixed"


def byte_level_alphabet():
    """The byte-level BPE alphabet: byte value -> the character that stands for it.

    Printable Latin-1 bytes stand for themselves; the others (control
    characters, space, 0x7f-0xa0, 0xad) are given the characters from U+0100
    on, in increasing byte order (so space is U+0120 and newline U+010A).
    """
    keep = [b for b in range(256)
            if 0x21 <= b <= 0x7e or 0xa1 <= b <= 0xac or 0xae <= b <= 0xff]
    alphabet = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in alphabet:
            alphabet[b] = chr(0x100 + extra)
            extra += 1
    return alphabet


def decode_byte_level(tokens, ids):
    """Text of token ids of a byte-level BPE vocabulary (for display only)."""
    char_to_byte = {c: b for b, c in byte_level_alphabet().items()}
    out = bytearray()
    for i in ids:
        piece = tokens[i] if isinstance(tokens[i], str) else "?"
        if piece.startswith("<|") and piece.endswith("|>"):
            out += piece.encode()
            continue
        for ch in piece:
            out += bytes([char_to_byte[ch]]) if ch in char_to_byte else ch.encode()
    return out.decode("utf-8", errors="replace")


def check_default_model(report):
    if not os.path.exists(OROCHI_MODEL):
        print("SKIP: default model absent at %s (run make models)" % OROCHI_MODEL)
        return
    print("part b: default model %s" % os.path.basename(OROCHI_MODEL), flush=True)
    t0 = time.time()
    model = LlamaRef(OROCHI_MODEL)
    print("  reference loaded in %.1fs: %s" % (time.time() - t0, model.cfg), flush=True)
    vocab = model.cfg.vocab
    tokens = gguf_ref.GGUFRef(OROCHI_MODEL).kv.get("tokenizer.ggml.tokens")

    def show(ids):
        if not tokens:
            return str(ids)
        return repr(decode_byte_level(tokens, ids))

    for n, (text, fallback) in enumerate(zip(DEFAULT_PROMPTS, FALLBACK_PROMPT_IDS)):
        ids, source = prompt_ids(text, fallback, vocab)
        t0 = time.time()
        generated, ref = model.greedy(ids, GENERATE)
        full = ids + generated
        print("  prompt %d (%s ids, %d tokens): %s -> %s  [reference %.1fs]"
              % (n, source, len(ids), show(ids), show(generated), time.time() - t0),
              flush=True)
        batches = [1, 8] if n == 0 else [1]
        for batch in batches:
            case = "default p%d batch%d (%d+%d)" % (n, batch, len(ids), GENERATE)
            try:
                c = c_eval(OROCHI_MODEL, full, vocab, "default_%d_%d" % (n, batch),
                           batch=batch)
            except RuntimeError as exc:
                report.fail("%s: %s" % (case, exc))
                continue
            report.compare(case, c, ref, BOUND_QUANT)
            agree = int(np.sum(np.argmax(c[len(ids) - 1:-1], axis=1) == np.array(generated)))
            print("    positions %d.. are generated; C argmax agrees with the reference "
                  "on %d of %d generated tokens" % (len(ids), agree, GENERATE))


# ---------------------------------------------------------------------------
# Part c: the default model re-quantized by `orochi quantize`
# ---------------------------------------------------------------------------

# llama.cpp-style mixes and plain types; on SmolLM2-135M most rows are 576 long, so the K-types
# reach ffn_down (1536) and the rest falls back (Q4_K -> Q5_0, Q6_K -> Q8_0, Q3_K -> IQ4_NL)
REQUANT = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q5_1", "Q3_K")


def check_requantized(report):
    if not os.path.exists(OROCHI_MODEL):
        print("SKIP part c: default model absent at %s (run make models)" % OROCHI_MODEL)
        return
    print("part c: the default model re-quantized by orochi quantize", flush=True)
    vocab = None
    for type_name in REQUANT:
        path = os.path.join(WORKDIR, "default_%s.gguf" % type_name.lower())
        try:
            run_orochi(["quantize", OROCHI_MODEL, path, type_name], "quantize " + type_name)
        except RuntimeError as exc:
            report.fail("requant %s: %s" % (type_name, exc))
            continue
        model = LlamaRef(path)
        vocab = model.cfg.vocab
        ids, _ = prompt_ids(DEFAULT_PROMPTS[0], FALLBACK_PROMPT_IDS[0], vocab)
        generated, ref = model.greedy(ids, 8)
        mix = {}
        for info in gguf_ref.GGUFRef(path).tensors.values():
            name = dq.TYPE_NAMES.get(info.type, str(info.type))
            mix[name] = mix.get(name, 0) + 1
        for batch in (1, 8):
            case = "requant %s batch%d" % (type_name, batch)
            try:
                c = c_eval(path, ids + generated, vocab, "requant_%d" % batch, batch=batch)
            except RuntimeError as exc:
                report.fail("%s: %s" % (case, exc))
                continue
            report.compare(case, c, ref, BOUND_QUANT)
        print("  %-6s %s" % (type_name, " ".join("%s %d" % kv for kv in sorted(mix.items()))),
              flush=True)
        os.unlink(path)


# ---------------------------------------------------------------------------
# Part d: 8-bit activations (`--act-bits 8`)
# ---------------------------------------------------------------------------

def check_act8(report):
    """The engine's 8-bit activation mode (`--act-bits 8`).

    Tiny Q8_0 and Q4_0 models against the reference that rounds the activations the same way
    (LlamaRef(act_bits=8)), bound BOUND_ACT8. On Q4_1 models and the default model that
    comparison is not stable: a value the engine (float32) and the reference (float64) see a few
    ulps apart can round to neighbouring 8-bit steps, one step is 1/127 of its block's largest
    value, and over 30 layers with SmolLM2's outlier channels the two 8-bit computations drift
    as far from each other (~1e-1) as from the exact result. Those are held to the exact
    reference by what the mode costs in use: mean relative L2 at most ACT8_MEAN and the same
    argmax at ACT8_TOP1 of the positions (measured 0.086 and 0.89-0.97 on the default model).
    """
    print("part d: --act-bits 8", flush=True)

    def loose(case, c, exact):
        rel = (np.linalg.norm(c - exact, axis=1) /
               np.maximum(np.linalg.norm(exact, axis=1), 1e-30))
        top1 = float(np.mean(c.argmax(axis=1) == exact.argmax(axis=1)))
        ok = rel.mean() <= ACT8_MEAN and top1 >= ACT8_TOP1
        print("  %-30s mean rel %.3g (bound %.2g), max %.3g, same argmax %.2f (bound %.2f) %s"
              % (case, rel.mean(), ACT8_MEAN, rel.max(), top1, ACT8_TOP1,
                 "ok" if ok else "FAIL"), flush=True)
        report.ran += 1
        if not ok:
            report.fail("%s: mean relative L2 %.3g (bound %.2g), same argmax at %.2f of the "
                        "positions (bound %.2f)" % (case, rel.mean(), ACT8_MEAN, top1, ACT8_TOP1))

    for type_name in ("q8_0", "q4_0", "q4_1"):
        path = os.path.join(WORKDIR, "act8_%s.gguf" % type_name)
        try:
            params = mkmodel(path, type_name)
        except RuntimeError as exc:
            report.fail("act8 tiny %s: %s" % (type_name, exc))
            continue
        ref = LlamaRef(path, act_bits=8)
        ref8 = ref.teacher_forced(TINY_IDS)
        ref.act_bits = None
        exact = ref.teacher_forced(TINY_IDS)
        for batch in (1, 8):
            case = "act8 tiny %s batch%d" % (type_name, batch)
            try:
                c = c_eval(path, TINY_IDS, params["vocab"], "act8_%s_%d" % (type_name, batch),
                           batch=batch, act_bits=8)
            except RuntimeError as exc:
                report.fail("%s: %s" % (case, exc))
                continue
            if type_name == "q4_1":
                loose(case, c, exact)
            else:
                report.compare(case, c, ref8, BOUND_ACT8)
        os.unlink(path)
    check_act_auto(report)
    if not os.path.exists(OROCHI_MODEL):
        print("SKIP: act8 on the default model: absent at %s (run make models)" % OROCHI_MODEL)
        return
    model = LlamaRef(OROCHI_MODEL)
    ids, _ = prompt_ids(DEFAULT_PROMPTS[0], FALLBACK_PROMPT_IDS[0], model.cfg.vocab)
    generated, exact = model.greedy(ids, GENERATE)
    full = ids + generated
    for batch in (1, 8):
        case = "act8 default p0 batch%d" % batch
        try:
            c = c_eval(OROCHI_MODEL, full, model.cfg.vocab, "act8_default_%d" % batch,
                       batch=batch, act_bits=8)
        except RuntimeError as exc:
            report.fail("%s: %s" % (case, exc))
            continue
        loose(case, c, exact)


def check_act_auto(report):
    """`--act-bits auto` (every command's default): 8-bit activations for the K-quant matrices,
    16-bit for the rest. On a tiny all-Q4_K model its logits are the 8-bit run's bit for bit, on a
    tiny Q4_1 model the 16-bit run's; on the same model with its attention in Q4_K and the rest
    in Q4_1 (`orochi quantize --mix`) they are neither."""
    base = os.path.join(WORKDIR, "auto_f32.gguf")
    params = mkmodel(base, "f32", **TINY_K)
    runs = {}
    for label, mix in (("q4_k", "*=Q4_K"), ("q4_1", "*=Q4_1"),
                       ("mixed", "attn_q=Q4_K,attn_k=Q4_K,attn_v=Q4_K,attn_output=Q4_K,*=Q4_1")):
        path = os.path.join(WORKDIR, "auto_%s.gguf" % label)
        run_orochi(["quantize", base, path, "--mix", mix], "quantize " + label)
        runs[label] = {bits: c_eval(path, TINY_IDS, params["vocab"], "auto_%s_%s" % (label, bits),
                                    batch=8, act_bits=bits) for bits in ("auto", "8", "16")}
        os.unlink(path)
    os.unlink(base)
    expect = (("q4_k", "8", True), ("q4_k", "16", False), ("q4_1", "16", True),
              ("q4_1", "8", False), ("mixed", "8", False), ("mixed", "16", False))
    for label, bits, same in expect:
        got = bool(np.array_equal(runs[label]["auto"], runs[label][bits]))
        report.ran += 1
        print("  act auto, tiny %-6s: %s the %s-bit logits (%s)"
              % (label, "equals" if got else "differs from", bits, "ok" if got == same else "FAIL"),
              flush=True)
        if got != same:
            report.fail("--act-bits auto on the tiny %s model: its logits %s the --act-bits %s "
                        "ones" % (label, "equal" if got else "differ from", bits))


# ---------------------------------------------------------------------------
# Part e: the families
# ---------------------------------------------------------------------------

FAMILY_IDS = (TINY_IDS * 2)[:48]
FAMILY_BASE = dict(layers=2, dim=256, ffn=512, heads=4, kv_heads=2, vocab=300, ctx=4096, seed=5)
FAMILIES = [  # label, mkmodel options
    ("llama31", ["--arch", "llama31"]),
    ("qwen2", ["--arch", "qwen2"]),
    ("qwen3", ["--arch", "qwen3"]),
    ("llama-bias", ["--bias"]),
    ("llama-head96", ["--head-dim", "96"]),
    ("qwen3-head96", ["--arch", "qwen3", "--head-dim", "96"]),
    ("llama-linear", ["--rope-scaling", "linear:4"]),
    ("qwen2-yarn", ["--arch", "qwen2", "--rope-scaling", "yarn:4:256"]),
]


def family_model(path, type_name, options):
    p = FAMILY_BASE
    args = ["mkmodel", "--out", path, "--layers", p["layers"], "--dim", p["dim"],
            "--ffn", p["ffn"], "--heads", p["heads"], "--kv-heads", p["kv_heads"],
            "--vocab", p["vocab"], "--ctx", p["ctx"], "--type", type_name, "--seed", p["seed"]]
    run_orochi(args + options, "mkmodel " + os.path.basename(path))


def check_families(report):
    print("part e: the families vs reference", flush=True)
    for label, options in FAMILIES:
        for type_name in ("f16", "q8_0", "q4_k", "q4_k_m"):
            if type_name != "f16" and label not in ("llama31", "qwen2", "qwen3"):
                continue  # the other variants at F16 only
            path = os.path.join(WORKDIR, "fam_%s_%s.gguf" % (label, type_name))
            try:
                if type_name == "q4_k_m":  # the mix users download: orochi quantize's preset
                    src = os.path.join(WORKDIR, "fam_%s_src.gguf" % label)
                    family_model(src, "f16", options)
                    run_orochi(["quantize", src, path, "Q4_K_M"], "quantize " + label)
                    os.unlink(src)
                else:
                    family_model(path, type_name, options)
            except RuntimeError as exc:
                report.fail("family %s %s: %s" % (label, type_name, exc))
                continue
            ref = LlamaRef(path).teacher_forced(FAMILY_IDS)
            bound = BOUND_FLOAT if type_name == "f16" else BOUND_QUANT
            for batch in (1, 8):
                case = "family %s %s batch%d" % (label, type_name, batch)
                try:
                    c = c_eval(path, FAMILY_IDS, FAMILY_BASE["vocab"],
                               "fam_%s_%s_%d" % (label, type_name, batch), batch=batch)
                except RuntimeError as exc:
                    report.fail("%s: %s" % (case, exc))
                    continue
                report.compare(case, c, ref, bound)
            if type_name == "f16":
                # the reference without the family's piece must miss the bound: the comparison
                # can tell (a forward that ignored it would fail)
                model = LlamaRef(path)
                if label == "llama31" or label.endswith(("linear", "yarn")):
                    pair = np.arange(model.cfg.rot_dim // 2, dtype=np.float64)
                    model.inv_freq = model.cfg.rope_base ** (-2.0 * pair / model.cfg.rot_dim)
                    model.mscale = 1.0
                elif label.startswith("qwen"):
                    model.cfg.neox = False
                else:
                    for L in model.layers:
                        L["bq"] = L["bk"] = L["bv"] = L["bo"] = None
                if label.startswith("llama-head"):
                    continue  # a head size is not something to leave out
                plain = model.teacher_forced(FAMILY_IDS)
                err = np.max(np.linalg.norm(plain - ref, axis=1) / np.linalg.norm(ref, axis=1))
                if not err > bound:
                    report.fail("family %s: the reference without its piece differs only by "
                                "%.2e (the check could not fail)" % (label, err))
                else:
                    print("  family %s: without its piece the reference moves by %.2e (> %.0e)"
                          % (label, err, bound), flush=True)
            os.unlink(path)
    check_refusals(report)


# every metadata key orochi refuses (model/llama.c, llama_refused_keys), with a value that asks
# for the feature
REFUSED_KEYS = [("attention.sliding_window", 4096), ("attn_logit_softcapping", 50.0),
                ("final_logit_softcapping", 30.0), ("attention.clamp_kqv", 8.0),
                ("attention.layer_norm_epsilon", 1e-5), ("attention.scale", 0.125),
                ("logit_scale", 0.5), ("embedding_scale", 12.0), ("residual_scale", 0.2),
                ("expert_count", 8), ("rope.scaling.yarn_log_multiplier", 0.1), ("attention.value_length_mla", 128)]


def check_refusals(report):
    rng = np.random.default_rng(5)
    cases = [("llama." + k, {"llama." + k: v}, None, k) for k, v in REFUSED_KEYS]
    cases.append(("architecture gemma2", {"general.architecture": "gemma2"}, None, "gemma2"))
    cases.append(("rope scaling type longrope", {"llama.rope.scaling.type": "longrope"}, None,
                  "longrope"))
    cases.append(("a stray block tensor", {}, "blk.0.ffn_up.bias", "blk.0.ffn_up.bias"))
    cases.append(("q/k norms on a llama", {}, "blk.1.attn_q_norm.weight",
                  "blk.1.attn_q_norm.weight"))
    for what, extra_kv, extra_tensor, needle in cases:
        path = os.path.join(WORKDIR, "refuse.gguf")
        write_python_tiny_model(path, rng)
        if extra_kv or extra_tensor:
            meta = gguf_ref.GGUFRef(path)
            kv = dict(meta.kv)
            kv.update(extra_kv)
            if kv["general.architecture"] != "llama":  # the keys under the new name
                kv = {k.replace("llama.", kv["general.architecture"] + ".", 1): v
                      for k, v in kv.items()}
            tensors = [(n, t.type, tuple(t.ne), bytes(meta.tensor_bytes(n)))
                       for n, t in meta.tensors.items()]
            if extra_tensor:
                tensors.append((extra_tensor, dq.GGML_F32, (8,), np.ones(8, "<f4").tobytes()))
            gguf_ref.write_gguf(path, kv, tensors)
        proc = subprocess.run([OROCHI_BIN, "eval", "--model", path, "--ids", "1 2", "--out",
                               os.path.join(WORKDIR, "refuse.logits")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=SUBPROCESS_TIMEOUT)
        err = proc.stderr.decode(errors="replace")
        report.ran += 1
        insp = subprocess.run([OROCHI_BIN, "inspect", path], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=SUBPROCESS_TIMEOUT)
        verdict = insp.stdout.decode(errors="replace").rstrip().splitlines()[-1:]
        if proc.returncode == 0 or needle not in err:
            report.fail("refusal of %s: exit %d, stderr %r (want it to name %r)"
                        % (what, proc.returncode, err.strip()[-300:], needle))
        elif not (verdict and verdict[0].startswith("orochi can run it: no") and
                  needle in verdict[0]):
            report.fail("orochi inspect of %s: last line %r (want 'no' naming %r)"
                        % (what, verdict, needle))
        else:
            print("  refused %s: %s" % (what, err.strip().splitlines()[-1][:150]), flush=True)
        os.unlink(path)


def main():
    os.makedirs(WORKDIR, exist_ok=True)
    report = Report()
    start = time.time()
    try:
        check_dequant(report)
        check_reference_forward(report)
        if not os.path.exists(OROCHI_BIN):
            report.fail("orochi binary not found at %s" % OROCHI_BIN)
        else:
            check_tiny_models(report)
            check_default_model(report)
            check_requantized(report)
            check_act8(report)
            check_families(report)
    finally:
        for name in os.listdir(WORKDIR):
            os.unlink(os.path.join(WORKDIR, name))
        os.rmdir(WORKDIR)
    report.table()
    print("reference_logits: %d checks, %d failures, %.1fs"
          % (report.ran, len(report.failures), time.time() - start))
    if report.failures:
        print("FAILURES:")
        for message in report.failures:
            print("  " + message.splitlines()[0])
        return 1
    if report.ran == 0:
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
