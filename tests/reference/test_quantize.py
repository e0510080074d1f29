"""ctest `reference_quantize`: `orochi quantize IN OUT TYPE` against the independent reader.

Every file the command writes is read back with tests/reference/gguf_ref.py and its tensors
dequantised with dequant_ref.py (neither shares code with the C side), and checked for:
the tensor types the rules promise (2-D *.weight tensors -> TYPE, 1-D tensors unchanged,
--keep, rows not a multiple of 32 kept with one note), metadata equal to the input's key by
key and in order except general.file_type (uint32, llama.cpp's number for TYPE, appended when
the input had none), every tensor's data aligned to general.alignment, and values within the
format's resolution of the input's.

Parts:
  a. a tiny F32 model from `orochi mkmodel` quantised to each of the six types:
     F16 must equal numpy's float16 rounding exactly, BF16 round-to-nearest-even exactly, the
     block types must keep every element within 0.6 quantisation steps of the original (and a
     relative L2 error under the bounds test_logits uses for its own round trips); then
     `orochi eval` on the quantised file against the numpy Llama on the same file, with the
     tolerances of test_logits (1e-4 float weights, 1e-2 quantised). Each quantised file
     converted back to F32 must give exactly the dequantised values.
  b. a hand-written GGUF (gguf_ref.write_gguf) with mixed F32/F16 matrices, a 3-D weight, a
     row length of 48, a non-weight 2-D tensor, metadata of every value type including nested
     arrays, an int32 general.file_type and alignment 64: --keep, the note, in-place file_type.
  c. the default model (OROCHI_MODEL, Q4_1 matrices, Q8_0 embedding): to F16 and Q8_0 (the
     Q8_0 file identical with --threads 1 and 2), then `orochi run --temp 0 -n 8` on each;
     Q4_1 -> Q4_1 copies every Q4_1 tensor byte for byte (and with --keep Q8_0 the whole file
     is identical to the input).
  d. errors: unknown TYPE, unknown --keep type, unknown --mix preset, bad or unknown-type --mix
     rules, TYPE with a --mix preset, unreadable IN, malformed IN (truncated, bad magic), OUT in
     a missing directory, OUT a directory: status 2, exactly one stderr line that names the
     problem (unknown names with the list of valid ones), no OUT and no OUT.tmp left (a
     pre-existing OUT is left untouched).
  e. the K-quants, Q5_0/Q5_1/IQ4_NL, presets and --mix rules (docs/quantize.md), on a tiny F32
     model with 256-wide rows except ffn_down's 320: each new TYPE (matrices of that type, the
     K-types' llama.cpp fallback for ffn_down with one note giving the count, values within the
     type's error bound, back to F32 exactly the dequantised values); every preset's per-tensor
     types against a Python transcription of the documented rules (TYPE Q4_K_M also: the
     summary's type counts, `orochi inspect`'s type mix, `orochi eval` against the numpy Llama;
     a tied model, where token_embd.weight takes output.weight's rule); --mix rules alone, with
     TYPE and with a preset; a K-type whose fallback does not fit a 48-long row either.

Environment: OROCHI_BIN, OROCHI_MODEL, OROCHI_TMP (as set by ctest).
Exit status: 0 pass, 1 fail, 77 everything skipped.
"""

import os
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import dequant_ref as dq  # noqa: E402
import gguf_ref  # noqa: E402
from llama_ref import LlamaRef  # noqa: E402

SOURCE = os.environ.get("OROCHI_SOURCE", os.path.dirname(os.path.dirname(HERE)))
OROCHI_BIN = os.environ.get("OROCHI_BIN", os.path.join(SOURCE, "build", "bin", "orochi"))
OROCHI_MODEL = os.environ.get(
    "OROCHI_MODEL", os.path.join(SOURCE, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
TMP = os.environ.get("OROCHI_TMP", "/tmp")
WORKDIR = os.path.join(TMP, "reference_quantize.%d" % os.getpid())
SUBPROCESS_TIMEOUT = 300

# type name -> (ggml type id, llama.cpp general.file_type)
TYPES = {
    "F32": (dq.GGML_F32, 0),
    "F16": (dq.GGML_F16, 1),
    "BF16": (dq.GGML_BF16, 32),
    "Q8_0": (dq.GGML_Q8_0, 7),
    "Q4_0": (dq.GGML_Q4_0, 2),
    "Q4_1": (dq.GGML_Q4_1, 3),
}
BLOCK_TYPES = (dq.GGML_Q8_0, dq.GGML_Q4_0, dq.GGML_Q4_1)
# relative L2 error of a whole tensor against its F32 original (test_logits' round-trip bounds)
ROUND_TRIP_L2 = {dq.GGML_Q8_0: 0.01, dq.GGML_Q4_0: 0.15, dq.GGML_Q4_1: 0.12}
# Every element within WORST_STEPS quantisation steps of its original, a step being
# amax/127 (Q8_0), amax/8 (Q4_0), (max-min)/15 (Q4_1) of its block: half a step of rounding
# plus up to level * 2^-11 from storing d (and m) as f16 (127 * 2^-11 = 0.06 for Q8_0). Q4_0 as
# ggml defines it maps the signed extreme to level -8, so values near the other extreme clip at
# +7: up to one step off.
STEPS = {dq.GGML_Q8_0: 127, dq.GGML_Q4_0: 8, dq.GGML_Q4_1: 15}
WORST_STEPS = {dq.GGML_Q8_0: 0.6, dq.GGML_Q4_0: 1.01, dq.GGML_Q4_1: 0.6}
BOUND_FLOAT = 1e-4   # logits, F32/F16/BF16 weights (as test_logits)
BOUND_QUANT = 1e-2   # logits, quantised weights (as test_logits)

TINY = dict(layers=2, dim=64, ffn=160, heads=4, kv_heads=2, vocab=300, ctx=128, seed=7)
TINY_IDS = [3, 17, 42, 299, 0, 128, 7, 7, 250, 64, 1, 199, 33, 280, 5, 111]
FILE_TYPE = "general.file_type"


class Report:
    def __init__(self):
        self.failures = []
        self.ran = 0

    def check(self, cond, message):
        self.ran += 1
        if not cond:
            self.failures.append(message)
            print("FAIL: " + message, flush=True)
        return cond


def orochi(args):
    """Run the CLI; returns (status, stdout, stderr) as text."""
    cmd = [OROCHI_BIN] + [str(a) for a in args]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=SUBPROCESS_TIMEOUT)
    return (proc.returncode, proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"))


def quantize(report, src, dst, type_name, *extra):
    """orochi quantize; returns its stderr lines, or None after recording a failure."""
    rc, _, err = orochi(["quantize", src, dst, type_name] + list(extra))
    if not report.check(rc == 0, "quantize %s -> %s %s: exit %d: %s"
                        % (os.path.basename(src), type_name, " ".join(extra), rc,
                           err.strip()[-300:])):
        return None
    report.check(not os.path.exists(dst + ".tmp"), "quantize %s: %s.tmp left behind"
                 % (type_name, dst))
    lines = err.splitlines()
    report.check(bool(lines) and "orochi quantize: wrote" in lines[-1],
                 "quantize %s: last stderr line is not the summary: %r"
                 % (type_name, lines[-1:] if lines else ""))
    return lines


def values(g, name):
    info = g.tensors[name]
    return dq.dequant(g.tensor_bytes(name), info.type, info.ne)


def check_container(report, case, src, out, want_type_of, want_ftype):
    """Types, shapes, order, metadata and alignment of `out` against `src`.

    want_type_of(name, src_info) -> the ggml type the tensor must have in `out`."""
    a, b = gguf_ref.GGUFRef(src), gguf_ref.GGUFRef(out)
    report.check(b.version == 3, "%s: GGUF version %d, expected 3" % (case, b.version))
    # metadata: same keys in the same order, same types and values, except general.file_type
    keys_a = [k for k in a.kv if k != FILE_TYPE]
    keys_b = [k for k in b.kv if k != FILE_TYPE]
    report.check(keys_a == keys_b, "%s: metadata keys differ: %s vs %s"
                 % (case, keys_a[:6], keys_b[:6]))
    if FILE_TYPE in a.kv:
        report.check(list(a.kv).index(FILE_TYPE) == list(b.kv).index(FILE_TYPE),
                     "%s: general.file_type moved" % case)
    else:
        report.check(list(b.kv)[-1] == FILE_TYPE, "%s: general.file_type not appended" % case)
    for k in keys_a:
        if a.kv_types[k] != b.kv_types.get(k) or a.kv[k] != b.kv.get(k):
            report.check(False, "%s: metadata %s differs (type %s vs %s)"
                         % (case, k, a.kv_types[k], b.kv_types.get(k)))
            break
    report.check(b.kv.get(FILE_TYPE) == want_ftype
                 and b.kv_types.get(FILE_TYPE) == gguf_ref.T_UINT32,
                 "%s: general.file_type = %r (type %s), expected uint32 %d"
                 % (case, b.kv.get(FILE_TYPE), b.kv_types.get(FILE_TYPE), want_ftype))
    # tensors: same names, order and shapes; expected types; aligned data
    report.check(list(a.tensors) == list(b.tensors), "%s: tensor names or order differ" % case)
    align = b.alignment
    report.check(align == a.alignment, "%s: alignment %d, input %d" % (case, align, a.alignment))
    report.check(b.data_offset % align == 0, "%s: data section at %d" % (case, b.data_offset))
    for name, ia in a.tensors.items():
        ib = b.tensors.get(name)
        if ib is None:
            continue
        want = want_type_of(name, ia)
        if not report.check(ib.type == want and ib.ne == ia.ne,
                            "%s: %s has type %d shape %s, expected type %d shape %s"
                            % (case, name, ib.type, ib.ne, want, ia.ne)):
            return a, b
        report.check((ib.offset_abs - b.data_offset) % align == 0,
                     "%s: %s data at %d, not aligned to %d" % (case, name, ib.offset_abs, align))
    return a, b


def rne_bf16(x):
    """float32 -> bf16 (as float32) with round to nearest even."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32)


def check_values(report, case, ggml_type, orig, got):
    """got (dequantised output) against orig (F32 input values) for the format's resolution."""
    if ggml_type == dq.GGML_F32:
        return report.check(np.array_equal(got, orig), "%s: F32 values changed" % case)
    if ggml_type == dq.GGML_F16:
        want = orig.astype(np.float16).astype(np.float32)
        return report.check(np.array_equal(got, want), "%s: F16 values are not the "
                            "round-to-nearest halves of the input" % case)
    if ggml_type == dq.GGML_BF16:
        return report.check(np.array_equal(got, rne_bf16(orig)), "%s: BF16 values are not "
                            "the round-to-nearest-even bfloat16 of the input" % case)
    blk = orig.reshape(-1, 32).astype(np.float64)
    step = (blk.max(1) - blk.min(1)) if ggml_type == dq.GGML_Q4_1 else np.abs(blk).max(1)
    step = step / STEPS[ggml_type]
    worst = (np.abs(got.reshape(-1, 32) - blk) / (step[:, None] + 1e-12)).max()
    rel = np.linalg.norm(got - orig) / np.linalg.norm(orig)
    return report.check(worst <= WORST_STEPS[ggml_type] and rel <= ROUND_TRIP_L2[ggml_type],
                        "%s: worst error %.2f quantisation steps (bound %.2f), relative L2 %.4f "
                        "(bound %.2f)" % (case, worst, WORST_STEPS[ggml_type], rel,
                                          ROUND_TRIP_L2[ggml_type]))


def rel_l2(c, r):
    return float((np.linalg.norm(c - r, axis=1) / np.maximum(np.linalg.norm(r, axis=1),
                                                            1e-30)).max())


def c_eval(path, ids, vocab, batch):
    out = path + ".logits"
    # 16-bit activations: the quantizer is held to the exact reference, not the 8-bit rounding
    # the default (auto) gives K-quant matrices
    rc, _, err = orochi(["eval", "--model", path, "--ids", " ".join(map(str, ids)), "--out", out,
                         "--batch", batch, "--act-bits", "16"])
    if rc != 0:
        raise RuntimeError("eval exit %d: %s" % (rc, err.strip()[-300:]))
    data = np.fromfile(out, dtype="<f4")
    os.unlink(out)
    return data.reshape(len(ids), vocab).astype(np.float64)


def check_eval(report, case, path, ref, vocab, bound):
    """`orochi eval` of TINY_IDS at batch 1 and 8 against the reference logits ref; the worst
    relative L2 (each must be within bound)."""
    worst = 0.0
    for batch in (1, 8):
        try:
            e = rel_l2(c_eval(path, TINY_IDS, vocab, batch), ref)
        except RuntimeError as exc:
            report.check(False, "%s eval: %s" % (case, exc))
            continue
        worst = max(worst, e)
        report.check(e <= bound, "%s eval batch %d: logits relative L2 %.2e > %.0e"
                     % (case, batch, e, bound))
    return worst


# ---------------------------------------------------------------------------
# Part a: a tiny F32 mkmodel model to every type
# ---------------------------------------------------------------------------

def check_tiny(report):
    print("part a: tiny F32 model -> every type", flush=True)
    src = os.path.join(WORKDIR, "tiny_src.gguf")
    p = TINY
    rc, _, err = orochi(["mkmodel", "--out", src, "--layers", p["layers"], "--dim", p["dim"],
                         "--ffn", p["ffn"], "--heads", p["heads"], "--kv-heads", p["kv_heads"],
                         "--vocab", p["vocab"], "--ctx", p["ctx"], "--type", "f32",
                         "--seed", p["seed"]])
    if not report.check(rc == 0, "mkmodel: exit %d: %s" % (rc, err.strip())):
        return
    g_src = gguf_ref.GGUFRef(src)
    orig = {name: values(g_src, name) for name in g_src.tensors}
    for type_name, (type_id, ftype) in TYPES.items():
        out = os.path.join(WORKDIR, "tiny_%s.gguf" % type_name.lower())
        # lower-case TYPE: names are case-insensitive
        if quantize(report, src, out, type_name.lower(), "--threads", "2") is None:
            continue

        def want(name, info, type_id=type_id):
            return type_id if len(info.ne) >= 2 else info.type
        _, g = check_container(report, "tiny %s" % type_name, src, out, want, ftype)
        worst = 0.0
        for name in g.tensors:
            got = values(g, name)
            if not check_values(report, "tiny %s %s" % (type_name, name), g.tensors[name].type,
                                orig[name], got):
                break
            if g.tensors[name].type in BLOCK_TYPES:
                worst = max(worst, np.linalg.norm(got - orig[name]) / np.linalg.norm(orig[name]))
        ref = LlamaRef(out).teacher_forced(TINY_IDS)
        bound = BOUND_QUANT if type_id in BLOCK_TYPES else BOUND_FLOAT
        logit_err = check_eval(report, "tiny %s" % type_name, out, ref, p["vocab"], bound)
        print("  %-5s weights rel L2 <= %.4f, eval vs reference %.2e (bound %.0e)"
              % (type_name, worst, logit_err, bound), flush=True)
        # back to F32: exactly the dequantised values
        back = os.path.join(WORKDIR, "tiny_%s_f32.gguf" % type_name.lower())
        if quantize(report, out, back, "F32") is not None:
            gb = gguf_ref.GGUFRef(back)
            same = all(np.array_equal(values(gb, n), values(g, n)) for n in g.tensors)
            report.check(same and all(i.type == dq.GGML_F32 for i in gb.tensors.values()),
                         "tiny %s -> F32: values are not the exact dequantised ones" % type_name)
            os.unlink(back)
        os.unlink(out)
    # --keep F32 on an all-F32 model: nothing changes but file_type
    out = os.path.join(WORKDIR, "tiny_keep.gguf")
    if quantize(report, src, out, "Q4_0", "--keep", "F32") is not None:
        _, g = check_container(report, "tiny --keep F32", src, out,
                               lambda name, info: info.type, TYPES["Q4_0"][1])
        same = all(np.array_equal(g.tensor_bytes(n), g_src.tensor_bytes(n)) for n in g.tensors)
        report.check(same, "tiny --keep F32: tensor bytes changed")
        os.unlink(out)
    os.unlink(src)


# ---------------------------------------------------------------------------
# Part b: a hand-written mixed GGUF
# ---------------------------------------------------------------------------

def write_mixed(path):
    rng = np.random.default_rng(5)
    T = gguf_ref
    kv = {
        "general.architecture": "llama",
        "general.alignment": (T.T_UINT32, 64),
        "general.file_type": (T.T_INT32, 0),
        "test.u8": (T.T_UINT8, 200), "test.i8": (T.T_INT8, -100),
        "test.u16": (T.T_UINT16, 60000), "test.i16": (T.T_INT16, -30000),
        "test.u32": (T.T_UINT32, 4000000000), "test.i32": (T.T_INT32, -2000000000),
        "test.u64": (T.T_UINT64, 2 ** 63 + 5), "test.i64": (T.T_INT64, -2 ** 62),
        "test.f32": (T.T_FLOAT32, 1.5), "test.f64": (T.T_FLOAT64, -2.25e-300),
        "test.bool": (T.T_BOOL, True), "test.str": (T.T_STRING, "h\u00e9llo\n"),
        "test.empty": (T.T_STRING, ""),
        "test.strs": (T.T_ARRAY, T.T_STRING, ["a", "", "\u00ff\u00fe"]),
        "test.f64s": (T.T_ARRAY, T.T_FLOAT64, [1.0, -0.5]),
        "test.nested": (T.T_ARRAY, T.T_ARRAY, [[1, 2, 3], [], ["x", "y"]]),
        "test.noarr": (T.T_ARRAY, T.T_UINT8, []),
    }

    def f32(ne, scale=0.5):
        return (rng.standard_normal(int(np.prod(ne))) * scale).astype("<f4")

    tensors = [
        ("a.weight", dq.GGML_F32, (64, 8), f32((64, 8)).tobytes()),
        ("b.weight", dq.GGML_F16, (64, 4), f32((64, 4)).astype("<f2").tobytes()),
        ("odd.weight", dq.GGML_F32, (48, 4), f32((48, 4)).tobytes()),
        ("norm.weight", dq.GGML_F32, (64,), f32((64,)).tobytes()),
        ("pos.embd", dq.GGML_F32, (32, 3), f32((32, 3)).tobytes()),
        ("cube.weight", dq.GGML_F32, (32, 2, 3), f32((32, 2, 3)).tobytes()),
    ]
    gguf_ref.write_gguf(path, kv, tensors, alignment=64)


def check_mixed(report):
    print("part b: mixed hand-written GGUF (alignment 64, every metadata type)", flush=True)
    failed = len(report.failures)
    src = os.path.join(WORKDIR, "mixed.gguf")
    write_mixed(src)
    g_src = gguf_ref.GGUFRef(src)
    matrices = ("a.weight", "b.weight", "odd.weight", "cube.weight")
    cases = [
        # TYPE, extra args, tensors that must keep their type, whether odd.weight gets a note
        ("Q8_0", ["--keep", "F16"], {"b.weight", "odd.weight"}, True),
        ("Q4_1", ["--keep", "f32"], {"a.weight", "odd.weight", "cube.weight"}, False),
        ("F16", [], set(), False),
        ("BF16", ["--keep", "F16", "--keep", "Q4_0"], {"b.weight"}, False),
    ]
    for type_name, extra, kept, note in cases:
        case = "mixed %s %s" % (type_name, " ".join(extra))
        out = os.path.join(WORKDIR, "mixed_out.gguf")
        lines = quantize(report, src, out, type_name, *extra)
        if lines is None:
            continue
        type_id, ftype = TYPES[type_name]

        def want(name, info, type_id=type_id, kept=kept):
            return type_id if name in matrices and name not in kept else info.type
        _, g = check_container(report, case, src, out, want, ftype)
        notes = [ln for ln in lines if "note:" in ln]
        if note:
            report.check(len(notes) == 1 and "odd.weight" in notes[0] and "48" in notes[0],
                         "%s: expected one note naming odd.weight and its row length 48, got %r"
                         % (case, notes))
        else:
            report.check(not notes, "%s: unexpected notes %r" % (case, notes))
        for name, info in g.tensors.items():
            if info.type == g_src.tensors[name].type:
                report.check(np.array_equal(g.tensor_bytes(name), g_src.tensor_bytes(name)),
                             "%s: %s kept its type but its bytes changed" % (case, name))
            else:  # converted from F32 or F16: within TYPE's resolution of the input values
                check_values(report, "%s %s" % (case, name), info.type, values(g_src, name),
                             values(g, name))
        os.unlink(out)
    print("  ok" if len(report.failures) == failed else "  failures above", flush=True)
    os.unlink(src)


# ---------------------------------------------------------------------------
# Part c: the default model
# ---------------------------------------------------------------------------

def check_default(report):
    if not os.path.exists(OROCHI_MODEL):
        print("SKIP part c: default model absent at %s (run make models)" % OROCHI_MODEL)
        return
    print("part c: default model %s" % os.path.basename(OROCHI_MODEL), flush=True)
    g_src = gguf_ref.GGUFRef(OROCHI_MODEL)
    src_types = {n: i.type for n, i in g_src.tensors.items()}
    for type_name in ("F16", "Q8_0"):
        out = os.path.join(WORKDIR, "default_%s.gguf" % type_name.lower())
        t0 = time.time()
        lines = quantize(report, OROCHI_MODEL, out, type_name)
        if lines is None:
            continue
        dt = time.time() - t0
        type_id, ftype = TYPES[type_name]

        def want(name, info, type_id=type_id):
            return type_id if len(info.ne) >= 2 else info.type
        _, g = check_container(report, "default %s" % type_name, OROCHI_MODEL, out, want, ftype)
        for name in ("blk.0.attn_q.weight", "blk.29.ffn_down.weight", "token_embd.weight"):
            a, b = values(g_src, name), values(g, name)
            rel = np.linalg.norm(b - a) / np.linalg.norm(a)
            if src_types[name] == type_id:
                report.check(np.array_equal(g.tensor_bytes(name), g_src.tensor_bytes(name)),
                             "default %s: %s already %s but bytes changed"
                             % (type_name, name, type_name))
            else:
                bound = 1e-3 if type_id == dq.GGML_F16 else 0.01
                report.check(rel <= bound, "default %s: %s relative L2 %.2e > %.0e"
                             % (type_name, name, rel, bound))
        if type_name == "Q8_0":  # rows are independent: the thread count changes no byte
            one = os.path.join(WORKDIR, "default_q8_0_t1.gguf")
            if quantize(report, OROCHI_MODEL, one, type_name, "--threads", "1") is not None:
                with open(out, "rb") as fa, open(one, "rb") as fb:
                    report.check(fa.read() == fb.read(),
                                 "default Q8_0: --threads 1 and 2 give different files")
                os.unlink(one)
        rc, text, err = orochi(["run", "--model", out, "--prompt", "The capital of France is",
                                "--temp", 0, "-n", 8])
        report.check(rc == 0 and text.strip(), "default %s: orochi run exit %d, output %r: %s"
                     % (type_name, rc, text, err.strip()[-300:]))
        print("  %-5s quantized in %.1fs (%.1f MiB); run: %r"
              % (type_name, dt, os.path.getsize(out) / 2 ** 20, text.strip()[:40]), flush=True)
        os.unlink(out)
    # Q4_1 -> Q4_1: Q4_1 tensors are copied, not requantised
    out = os.path.join(WORKDIR, "default_q4_1.gguf")
    if quantize(report, OROCHI_MODEL, out, "Q4_1") is not None:
        def want(name, info):
            return dq.GGML_Q4_1 if len(info.ne) >= 2 else info.type
        _, g = check_container(report, "default Q4_1", OROCHI_MODEL, out, want, 3)
        same = all(np.array_equal(g.tensor_bytes(n), g_src.tensor_bytes(n))
                   for n, t in src_types.items() if t == dq.GGML_Q4_1)
        report.check(same, "default Q4_1 -> Q4_1: Q4_1 tensor bytes changed")
        os.unlink(out)
    if quantize(report, OROCHI_MODEL, out, "Q4_1", "--keep", "Q8_0") is not None:
        with open(OROCHI_MODEL, "rb") as fa, open(out, "rb") as fb:
            report.check(fa.read() == fb.read(),
                         "default Q4_1 --keep Q8_0: file differs from the input")
        os.unlink(out)
    print("  Q4_1 -> Q4_1 copies the Q4_1 tensors byte for byte", flush=True)


# ---------------------------------------------------------------------------
# Part d: errors
# ---------------------------------------------------------------------------

def check_errors(report):
    print("part d: errors", flush=True)
    failed = len(report.failures)
    good = os.path.join(WORKDIR, "err_src.gguf")
    write_mixed(good)
    data = open(good, "rb").read()
    truncated = os.path.join(WORKDIR, "truncated.gguf")
    with open(truncated, "wb") as fp:
        fp.write(data[:200])
    badmagic = os.path.join(WORKDIR, "badmagic.gguf")
    with open(badmagic, "wb") as fp:
        fp.write(b"GGUX" + data[4:])
    missing = os.path.join(WORKDIR, "no_such_file.gguf")
    out = os.path.join(WORKDIR, "err_out.gguf")
    outdir = os.path.join(WORKDIR, "a_directory")
    os.mkdir(outdir)
    nodir_out = os.path.join(WORKDIR, "no_such_dir", "out.gguf")
    cases = [
        # args, words the single stderr line must contain, the OUT to check
        ([good, out, "Q7_K"],
         ["orochi quantize: unknown type 'Q7_K' (one of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
          "Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; or a preset: Q3_K_S, Q3_K_M, Q3_K_L, "
          "Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M)"], out),
        ([good, out, "--mix", "Q4_K_X"],
         ["orochi quantize: unknown --mix preset 'Q4_K_X' (one of Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, "
          "Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K; or rules PATTERN=TYPE,...)"], out),
        ([good, out, "--mix", "attn_v=Q7_K,*=Q4_K"],
         ["unknown type 'Q7_K' in --mix rule 'attn_v=Q7_K'", "Q6_K", "keep"], out),
        ([good, out, "--mix", "attn_v=Q6_K,ffn_down"],
         ["bad --mix rule 'ffn_down'", "PATTERN=TYPE", "Q6_K"], out),
        ([good, out, "--mix", "attn_v=Q6_K,,*=Q4_K"], ["bad --mix rule ''"], out),
        ([good, out, "--mix", "=Q4_K"], ["bad --mix rule '=Q4_K'"], out),
        ([good, out, "--mix", "blk.*.attn_v=Q6_K"], ["bad --mix rule 'blk.*.attn_v=Q6_K'"], out),
        ([good, out, "Q4_0", "--mix", "Q4_K_M"], ["TYPE 'Q4_0'", "--mix preset 'Q4_K_M'"], out),
        ([good, out, "--mix", "Q4_K_M", "--mix", "*=Q8_0"], ["--mix given twice"], out),
        ([good, out, "Q8_0", "--keep", "Q3"], ["--keep", "'Q3'"], out),
        ([good, out, "Q8_0", "--threads", "0"], ["--threads"], out),
        ([good, out, "Q8_0", "--bogus"], ["--bogus"], out),
        ([good, out], ["IN OUT TYPE"], out),
        ([missing, out, "Q8_0"], [missing, "cannot open"], out),
        ([truncated, out, "Q8_0"], [truncated, "byte"], out),
        ([badmagic, out, "Q8_0"], [badmagic, "magic"], out),
        ([good, nodir_out, "Q8_0"], [nodir_out], nodir_out),
        ([good, outdir, "Q8_0"], [outdir, "directory"], None),
    ]
    for args, words, target in cases:
        case = "quantize %s" % " ".join(os.path.basename(a) for a in args)
        rc, _, err = orochi(["quantize"] + args)
        lines = err.splitlines()
        report.check(rc == 2, "%s: exit %d, expected 2" % (case, rc))
        if report.check(len(lines) == 1, "%s: %d stderr lines, expected 1: %r"
                        % (case, len(lines), lines[:4])):
            report.check(all(w in lines[0] for w in words), "%s: stderr %r does not name %r"
                         % (case, lines[0], words))
        if target:
            report.check(not os.path.exists(target) and not os.path.exists(target + ".tmp"),
                         "%s: left %s or its .tmp behind" % (case, target))
    report.check(os.path.isdir(outdir) and not os.listdir(outdir),
                 "quantize to a directory: the directory was changed")
    # a failure leaves an existing OUT untouched
    with open(out, "wb") as fp:
        fp.write(b"previous contents")
    rc, _, _ = orochi(["quantize", truncated, out, "Q8_0"])
    report.check(rc == 2 and open(out, "rb").read() == b"previous contents"
                 and not os.path.exists(out + ".tmp"),
                 "malformed IN with an existing OUT: exit %d, OUT changed or .tmp left" % rc)
    rc, text, _ = orochi(["quantize", "--help"])
    report.check(rc == 0 and "usage: orochi quantize" in text, "quantize --help: exit %d" % rc)
    print("  ok" if len(report.failures) == failed else "  failures above", flush=True)


# ---------------------------------------------------------------------------
# Part e: K-quants, Q5_0/Q5_1/IQ4_NL, presets and --mix rules
# ---------------------------------------------------------------------------

GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL = 6, 7, 20
GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 10, 11, 12, 13, 14
# ggml's layouts (block elements, block bytes), for a gguf_ref that does not list them
for _t, _layout in {GGML_Q5_0: (32, 22), GGML_Q5_1: (32, 24), GGML_IQ4_NL: (32, 18),
                    GGML_Q2_K: (256, 84), GGML_Q3_K: (256, 110), GGML_Q4_K: (256, 144),
                    GGML_Q5_K: (256, 176), GGML_Q6_K: (256, 210)}.items():
    gguf_ref.GGML_BLOCK.setdefault(_t, _layout)

# the new TYPE names -> (ggml type id, llama.cpp general.file_type; a K-type: its _S mix's)
NEW_TYPES = {
    "Q5_0": (GGML_Q5_0, 8), "Q5_1": (GGML_Q5_1, 9), "IQ4_NL": (GGML_IQ4_NL, 25),
    "Q2_K": (GGML_Q2_K, 10), "Q3_K": (GGML_Q3_K, 11), "Q4_K": (GGML_Q4_K, 14),
    "Q5_K": (GGML_Q5_K, 16), "Q6_K": (GGML_Q6_K, 18),
}
TYPE_NAME = {t: n for n, (t, _) in list(TYPES.items()) + list(NEW_TYPES.items())}
# llama.cpp's type for a K-type matrix whose rows are not a multiple of 256
FALLBACK = {GGML_Q2_K: GGML_IQ4_NL, GGML_Q3_K: GGML_IQ4_NL, GGML_Q4_K: GGML_Q5_0,
            GGML_Q5_K: GGML_Q5_1, GGML_Q6_K: dq.GGML_Q8_0}
# Relative L2 error of a whole tensor of mkmodel's weights against its F32 original, per type:
# about 1.5x what kernels/cpu's quantizers give there (Q8_0 0.004, Q6_K 0.013, Q5_K 0.027,
# Q5_0 0.028, Q5_1 0.026, Q4_K 0.054, IQ4_NL 0.062, Q3_K 0.12, Q2_K 0.22).
KTYPE_L2 = {dq.GGML_Q8_0: 0.01, GGML_Q6_K: 0.02, GGML_Q5_K: 0.04, GGML_Q5_0: 0.045,
            GGML_Q5_1: 0.04, GGML_Q4_K: 0.08, GGML_IQ4_NL: 0.095, GGML_Q3_K: 0.18,
            GGML_Q2_K: 0.33}

# llama.cpp's presets: name -> (base type, general.file_type)
PRESETS = {
    "Q2_K": (GGML_Q2_K, 10), "Q3_K_S": (GGML_Q3_K, 11), "Q3_K_M": (GGML_Q3_K, 12),
    "Q3_K_L": (GGML_Q3_K, 13), "Q4_K_S": (GGML_Q4_K, 14), "Q4_K_M": (GGML_Q4_K, 15),
    "Q5_K_S": (GGML_Q5_K, 16), "Q5_K_M": (GGML_Q5_K, 17), "Q6_K": (GGML_Q6_K, 18),
}
# 8 layers, rows of 256 (the K-types fit) except ffn_down's 320 (they fall back); 8 heads over
# 2 KV heads, so Q2_K's attn_v takes its n_gqa >= 4 branch
KQ = dict(layers=8, dim=256, ffn=320, heads=8, kv_heads=2, vocab=300, ctx=128, seed=11)


def more_bits(i, n):
    """llama.cpp's use_more_bits: first and last eighth of the layers, every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def preset_want(preset, role, i, n, n_gqa):
    """The type preset gives the i-th of n matrices of a role (docs/quantize.md's table)."""
    base = PRESETS[preset][0]
    more = preset in ("Q4_K_M", "Q5_K_M") and more_bits(i, n)
    if role == "output":
        return GGML_Q6_K
    if role == "attn_v":
        return {"Q2_K": GGML_Q4_K if n_gqa >= 4 else GGML_Q3_K,
                "Q3_K_M": GGML_Q5_K if i < 2 else GGML_Q4_K,
                "Q3_K_L": GGML_Q5_K,
                "Q4_K_S": GGML_Q5_K if i < 4 else base}.get(preset,
                                                             GGML_Q6_K if more else base)
    if role == "ffn_down":
        return {"Q2_K": GGML_Q3_K,
                "Q3_K_M": GGML_Q5_K if i < n // 16 else GGML_Q4_K,
                "Q3_K_L": GGML_Q5_K,
                "Q4_K_S": GGML_Q5_K if i < n // 8 else base}.get(preset,
                                                                 GGML_Q6_K if more else base)
    if role == "attn_output":
        return {"Q2_K": GGML_Q3_K, "Q3_K_M": GGML_Q4_K, "Q3_K_L": GGML_Q5_K}.get(preset, base)
    return base


def is_matrix(name, info):
    return len(info.ne) >= 2 and name.endswith(".weight")


def rule_matches(pattern, name):
    """A --mix pattern: '*', or whole dot-separated parts of the name."""
    if pattern == "*":
        return True
    parts, want = name.split("."), pattern.split(".")
    return any(parts[i:i + len(want)] == want for i in range(len(parts) - len(want) + 1))


def expected_types(g, preset=None, type_id=None, rules=()):
    """name -> expected output type, and {K-type: matrices given its fallback}, for the source
    file g: rules first (first match; None = keep), then the preset, then TYPE; then the
    row-length fallback."""
    has_output = "output.weight" in g.tensors

    def role(name):
        if name == "output.weight" or (not has_output and name == "token_embd.weight"):
            return "output"
        for r, part in (("attn_v", "attn_v.weight"), ("ffn_down", "ffn_down"),
                        ("attn_output", "attn_output.weight")):
            if part in name:
                return r
        return "other"
    roles = {n: role(n) for n, i in g.tensors.items() if is_matrix(n, i)}
    count = {r: list(roles.values()).count(r) for r in set(roles.values())}
    seen = dict.fromkeys(count, 0)
    heads = g.kv.get("llama.attention.head_count", 1)
    n_gqa = heads // g.kv.get("llama.attention.head_count_kv", heads)
    out, fallbacks = {}, {}
    for name, info in g.tensors.items():
        out[name] = info.type
        if name not in roles:
            continue
        r = roles[name]
        i = seen[r]
        seen[r] += 1
        want = type_id
        for pattern, t in rules:
            if rule_matches(pattern, name):
                want = t
                break
        else:
            if preset:
                want = preset_want(preset, r, i, count[r], n_gqa)
        if want is None or want == info.type:
            continue
        if info.ne[0] % gguf_ref.GGML_BLOCK[want][0]:
            fb = FALLBACK.get(want)
            if fb is None or info.ne[0] % gguf_ref.GGML_BLOCK[fb][0]:
                continue
            fallbacks[want] = fallbacks.get(want, 0) + 1
            want = fb
        out[name] = want
    return out, fallbacks


def check_fallback_notes(report, case, lines, fallbacks):
    """One note per fallback type, with its count."""
    notes = [ln for ln in lines if "instead of" in ln]
    want = sorted("%d tensor%s written as %s instead of %s" % (
        n, "" if n == 1 else "s", TYPE_NAME[FALLBACK[t]], TYPE_NAME[t])
        for t, n in fallbacks.items())
    got = sorted(ln.split("note: ", 1)[-1].split(":")[0] for ln in notes)
    report.check(got == want, "%s: fallback notes %r, expected %r" % (case, got, want))


def check_summary(report, case, lines, g):
    """The summary's 'types NAME N, ...' against the file's tensor types."""
    text = lines[-1].split("; types ", 1)[-1].split(";")[0] if lines else ""
    got = {}
    for item in text.split(", "):
        name, _, n = item.rpartition(" ")
        got[name] = int(n) if n.isdigit() else -1
    want = {}
    for info in g.tensors.values():
        want[TYPE_NAME[info.type]] = want.get(TYPE_NAME[info.type], 0) + 1
    report.check(got == want, "%s: summary types %r, file has %r" % (case, got, want))


def check_inspect_mix(report, case, path, g):
    """`orochi inspect`'s type mix: per type tensors, parameters, bytes, bits per weight."""
    rc, text, err = orochi(["inspect", path])
    if not report.check(rc == 0 and "\ntype mix:" in text, "%s: inspect exit %d, no type mix: %s"
                        % (case, rc, err.strip()[-200:])):
        return
    rows = {}
    for ln in text.split("\ntype mix:", 1)[1].splitlines()[2:]:
        f = ln.split()
        if len(f) == 5:
            rows[f[0]] = (int(f[1]), int(f[2]), int(f[3]), float(f[4]))
    want = {}
    for info in g.tensors.values():
        k = [TYPE_NAME[info.type], "all"]
        for key in k:
            n, p, b = want.get(key, (0, 0, 0))
            want[key] = (n + 1, p + int(np.prod(info.ne)), b + info.nbytes)
    want = {k: v + (round(8.0 * v[2] / v[1], 3),) for k, v in want.items()}
    report.check(rows == want, "%s: inspect type mix %r, expected %r" % (case, rows, want))


def f32_values(report, case, path, g):
    """name -> dequantised values of every tensor in g (the file at path), from orochi's own
    conversion to F32; where dequant_ref knows a tensor's type, checked equal to its values."""
    back = path + ".f32.gguf"
    if quantize(report, path, back, "F32") is None:
        return None
    gb = gguf_ref.GGUFRef(back)
    vals = {n: values(gb, n) for n in gb.tensors}
    for n, info in g.tensors.items():
        if info.type in dq.TYPE_LAYOUT:
            mine = values(g, n)
            if not report.check(np.array_equal(mine, vals[n]), "%s: %s (%s) dequantised by "
                                "dequant_ref differs from orochi's F32 conversion"
                                % (case, n, TYPE_NAME[info.type])):
                break
    del gb
    os.unlink(back)
    return vals


def check_weights(report, case, g, vals, orig):
    """Every converted matrix within its type's relative L2 bound of the F32 original."""
    worst = {}
    for name, info in g.tensors.items():
        if info.type == dq.GGML_F32:
            continue
        rel = float(np.linalg.norm(vals[name] - orig[name]) / np.linalg.norm(orig[name]))
        worst[info.type] = max(worst.get(info.type, 0.0), rel)
        if not report.check(rel <= KTYPE_L2[info.type], "%s: %s (%s) relative L2 %.4f > %.3f"
                            % (case, name, TYPE_NAME[info.type], rel, KTYPE_L2[info.type])):
            break
    return worst


def mkmodel(report, path, p, *extra):
    rc, _, err = orochi(["mkmodel", "--out", path, "--layers", p["layers"], "--dim", p["dim"],
                         "--ffn", p["ffn"], "--heads", p["heads"], "--kv-heads", p["kv_heads"],
                         "--vocab", p["vocab"], "--ctx", p["ctx"], "--type", "f32",
                         "--seed", p["seed"]] + list(extra))
    return report.check(rc == 0, "mkmodel %s: exit %d: %s" % (path, rc, err.strip()))


def check_kquants(report):
    print("part e: K-quants, Q5_0/Q5_1/IQ4_NL, presets and --mix rules", flush=True)
    src = os.path.join(WORKDIR, "kq_src.gguf")
    if not mkmodel(report, src, KQ):
        return
    g_src = gguf_ref.GGUFRef(src)
    orig = {n: values(g_src, n) for n in g_src.tensors}
    out = os.path.join(WORKDIR, "kq_out.gguf")

    def run_case(case, args, ftype, preset=None, type_id=None, rules=(), source=src):
        """quantize, then check types, notes and file_type; returns (GGUFRef, lines) or None."""
        lines = quantize(report, source, out, *args)
        if lines is None:
            return None
        want, fallbacks = expected_types(gguf_ref.GGUFRef(source), preset, type_id, rules)
        _, g = check_container(report, case, source, out, lambda name, info: want[name], ftype)
        check_fallback_notes(report, case, lines, fallbacks)
        return g, lines

    # each new TYPE for every matrix (two layers are enough here)
    src2 = os.path.join(WORKDIR, "kq_src2.gguf")
    if not mkmodel(report, src2, dict(KQ, layers=2)):
        return
    g_src2 = gguf_ref.GGUFRef(src2)
    orig2 = {n: values(g_src2, n) for n in g_src2.tensors}
    for type_name, (type_id, ftype) in NEW_TYPES.items():
        case = "kq %s" % type_name
        r = run_case(case, [type_name.lower()], ftype, type_id=type_id, source=src2)
        if r is None:
            continue
        g, lines = r
        vals = f32_values(report, case, out, g)
        if vals is not None:
            worst = check_weights(report, case, g, vals, orig2)
            print("  %-6s %s" % (type_name, ", ".join("%s rel L2 %.4f" % (TYPE_NAME[t], e)
                                                      for t, e in sorted(worst.items()))),
                  flush=True)
        del g
        os.unlink(out)
    del g_src2
    os.unlink(src2)

    # every preset's per-tensor types; Q4_K_M as TYPE, the rest through --mix
    for preset, (_, ftype) in PRESETS.items():
        case = "kq preset %s" % preset
        args = [preset] if preset == "Q4_K_M" else ["--mix", preset]
        r = run_case(case, args, ftype, preset=preset)
        if r is None:
            continue
        g, lines = r
        if preset == "Q4_K_M":
            check_summary(report, case, lines, g)
            check_inspect_mix(report, case, out, g)
            vals = f32_values(report, case, out, g)
            if vals is not None:
                check_weights(report, case, g, vals, orig)
                # the engine on the mix against numpy on its dequantised weights
                back = os.path.join(WORKDIR, "kq_q4_k_m_f32.gguf")
                if quantize(report, out, back, "F32") is not None:
                    ref = LlamaRef(back).teacher_forced(TINY_IDS)
                    e = check_eval(report, case, out, ref, KQ["vocab"], BOUND_QUANT)
                    print("  Q4_K_M eval vs reference %.2e (bound %.0e)" % (e, BOUND_QUANT),
                          flush=True)
                    os.unlink(back)
        kinds = {}
        for info in g.tensors.values():
            kinds[TYPE_NAME[info.type]] = kinds.get(TYPE_NAME[info.type], 0) + 1
        print("  %-6s %s" % (preset, ", ".join("%s %d" % kv for kv in sorted(kinds.items()))),
              flush=True)
        del g
        os.unlink(out)

    # a tied model: token_embd.weight is the lm_head and takes output.weight's rule (Q6_K)
    tied = os.path.join(WORKDIR, "kq_tied.gguf")
    if mkmodel(report, tied, dict(KQ, layers=2), "--tied"):
        r = run_case("kq tied Q4_K_M", ["Q4_K_M"], 15, preset="Q4_K_M", source=tied)
        if r is not None:
            report.check(r[0].tensors["token_embd.weight"].type == GGML_Q6_K,
                         "kq tied Q4_K_M: token_embd.weight is not Q6_K")
            os.unlink(out)
        os.unlink(tied)

    # --mix rules: alone (unmatched matrices would stay; '*' matches all), with TYPE, with a
    # preset; 'output' names output.weight and not attn_output.weight
    rule_cases = [
        ("attn_v=Q6_K,ffn_down=Q6_K,output=Q6_K,*=Q4_K", None, None, 14,
         [("attn_v", GGML_Q6_K), ("ffn_down", GGML_Q6_K), ("output", GGML_Q6_K),
          ("*", GGML_Q4_K)]),
        ("token_embd=keep, blk.1=Q8_0", "Q4_0", None, 2,
         [("token_embd", None), ("blk.1", dq.GGML_Q8_0)]),
        ("ffn_down=q5_k", "Q4_K_M", "Q4_K_M", 15, [("ffn_down", GGML_Q5_K)]),
        ("blk.0=Q8_0", None, None, 0, [("blk.0", dq.GGML_Q8_0)]),
    ]
    for text, type_arg, preset, ftype, rules in rule_cases:
        case = "kq %s --mix %r" % (type_arg or "", text)
        type_id = TYPES[type_arg][0] if type_arg in TYPES else None
        args = ([type_arg] if type_arg else []) + ["--mix", text]
        r = run_case(case, args, ftype, preset=preset, type_id=type_id, rules=rules)
        if r is not None:
            check_summary(report, case, r[1], r[0])
            os.unlink(out)

    # a K-type on the hand-written file: 64- and 32-wide rows fall back to Q5_0 (one note with
    # the count), the 48-wide odd.weight fits neither and stays F32 (a note naming it)
    mixed = os.path.join(WORKDIR, "kq_mixed.gguf")
    write_mixed(mixed)
    r = run_case("kq mixed Q4_K", ["Q4_K"], 14, type_id=GGML_Q4_K, source=mixed)
    if r is not None:
        kept = [ln for ln in r[1] if "kept as" in ln]
        report.check(len(kept) == 1 and "'odd.weight' kept as F32" in kept[0] and "48" in kept[0]
                     and "Q5_0" in kept[0], "kq mixed Q4_K: expected one note keeping odd.weight "
                     "(row length 48, nor Q5_0), got %r" % kept)
        os.unlink(out)
    os.unlink(mixed)
    os.unlink(src)
    print("  --mix rules, tied model, fallback notes checked", flush=True)


def main():
    if not os.path.exists(OROCHI_BIN):
        print("FAIL: orochi binary not found at %s" % OROCHI_BIN)
        return 1
    os.makedirs(WORKDIR, exist_ok=True)
    report = Report()
    start = time.time()
    try:
        check_tiny(report)
        check_mixed(report)
        check_default(report)
        check_errors(report)
        check_kquants(report)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)
    print("reference_quantize: %d checks, %d failures, %.1fs"
          % (report.ran, len(report.failures), time.time() - start))
    if report.failures:
        print("FAILURES:")
        for message in report.failures:
            print("  " + message.splitlines()[0])
        return 1
    return 0 if report.ran else 77


if __name__ == "__main__":
    sys.exit(main())
