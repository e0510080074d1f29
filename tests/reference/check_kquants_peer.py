"""check_kquants_peer.py - check dequant_ref.py against llama.cpp's quantiser (a local tool).

Usage:
  python3 tests/reference/check_kquants_peer.py LLAMA_BIN_DIR F16_GGUF
          [--out DIR] [--threads N] [--fresh] [--keep-f32] [--no-row256]
          [--ftypes Q4_K_M,Q6_K,...]

  LLAMA_BIN_DIR  directory holding llama.cpp's llama-quantize
  F16_GGUF       an F16 GGUF of a llama model (e.g. SmolLM2-135M), used as the original
  --out DIR      where the generated files go (default: the directory of F16_GGUF); an
                 existing quantised file newer than its source is reused unless --fresh
  --threads N    threads for llama-quantize (default 1)
  --keep-f32     keep the F32 re-expansions (*.f32.gguf) instead of deleting them
  --no-row256    only use F16_GGUF itself (see "row256" below)
  --ftypes LIST  comma-separated llama-quantize file types
                 (default Q2_K,Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q5_0,Q5_1,IQ4_NL)

For every file type, llama-quantize writes a quantised copy of the source.  Every tensor
in it is read with gguf_ref.py, dequantised with dequant_ref.py and compared with the
same tensor of the source (relative RMS error ||ours - original|| / ||original||); a
misread bit layout gives errors near 1.  In addition llama-quantize --allow-requantize
expands the quantised file back to F32 with ggml's own dequantiser, and the script
reports the largest difference between that and ours (it should be 0 or rounding).

row256: llama-quantize stores a K type (256-element super-blocks) only in tensors whose
rows are a multiple of 256 long and falls back to a 32-element type elsewhere; in a
model with 576-wide rows that leaves only ffn_down in K types, and the plain Q2_K mix
then holds no Q2_K tensor at all.  So the script also writes <F16 stem>-row256.gguf, a
byte copy of F16_GGUF whose tensor table declares each 2-D tensor with k rows joined
into one (ne0*k, ne1/k; smallest k making ne0*k a multiple of 256).  The data bytes are
unchanged, so the comparison is still element for element against the same values, and
every matrix is then quantised to the K type the mix asks for.  (llama-quantize does not
check matrix shapes against the model's hyper-parameters; the file is not meant to run.)

Tensors are grouped by the ggml type llama-quantize actually chose, and one line is
printed per type: count, max and median relative error, the bound, and the largest
|ours - ggml| relative to max|ggml|.  Lines starting with "#" list, per source and file
type, the ggml types chosen and the row lengths they were chosen for.  Exit status 1 if
a type exceeds its bound or disagrees with ggml, 2 if a tool failed.

This is a local check, not a ctest: it needs a llama.cpp build.
"""

import argparse
import collections
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dequant_ref as dq  # noqa: E402
import gguf_ref  # noqa: E402

DEFAULT_FTYPES = "Q2_K,Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q5_0,Q5_1,IQ4_NL"

# Largest acceptable relative RMS error against the original, per ggml type.  Loose
# enough for any sane quantiser, far below the ~1 a wrong layout gives.
REL_BOUND = {
    dq.GGML_F32: 1e-3, dq.GGML_F16: 1e-3, dq.GGML_BF16: 1e-2,
    dq.GGML_Q8_0: 0.02,
    dq.GGML_Q6_K: 0.04,
    dq.GGML_Q5_0: 0.08, dq.GGML_Q5_1: 0.08, dq.GGML_Q5_K: 0.08,
    dq.GGML_Q4_0: 0.15, dq.GGML_Q4_1: 0.15, dq.GGML_Q4_K: 0.15, dq.GGML_IQ4_NL: 0.15,
    dq.GGML_Q3_K: 0.3,
    dq.GGML_Q2_K: 0.6,
}
# Largest acceptable max|ours - ggml| / max|ggml| (ggml's SIMD paths may round apart).
GGML_BOUND = 1e-5


def run(cmd, log):
    with open(log, "w") as fp:
        rc = subprocess.call(cmd, stdout=fp, stderr=subprocess.STDOUT)
    if rc != 0:
        print("FAILED (rc %d, log %s): %s" % (rc, log, " ".join(cmd)), file=sys.stderr)
    return rc == 0


def newer(path, than):
    return os.path.exists(path) and os.path.getmtime(path) >= os.path.getmtime(than)


def rel_err(ours, ref):
    ref = ref.astype(np.float64).reshape(-1)
    denom = np.linalg.norm(ref)
    diff = np.linalg.norm(ours.astype(np.float64).reshape(-1) - ref)
    return diff / denom if denom > 0 else diff


def write_row256(src, dst):
    """Copy src to dst, re-declaring 2-D tensors with rows a multiple of 256 long."""
    g = gguf_ref.GGUFRef(src)
    with open(src, "rb") as fp:
        header = fp.read(g.data_offset)
    patches = []
    for name, info in g.tensors.items():
        if len(info.ne) != 2 or info.ne[0] % dq.QK_K == 0:
            continue
        ne0, ne1 = int(info.ne[0]), int(info.ne[1])
        k = next((k for k in range(2, 257) if ne0 * k % dq.QK_K == 0 and ne1 % k == 0), None)
        if k is None:
            continue
        raw_name = name.encode("utf-8")
        record = struct.pack("<Q", len(raw_name)) + raw_name + struct.pack("<IQQ", 2, ne0, ne1)
        pos = header.find(record)
        if pos < 0 or header.find(record, pos + 1) >= 0:
            raise RuntimeError("cannot locate the table entry of %s" % name)
        patches.append((pos + len(record) - 16, struct.pack("<QQ", ne0 * k, ne1 // k)))
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as fp:
        for pos, data in patches:
            fp.seek(pos)
            fp.write(data)
    return len(patches)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bindir")
    ap.add_argument("f16")
    ap.add_argument("--out")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--keep-f32", action="store_true")
    ap.add_argument("--no-row256", action="store_true")
    ap.add_argument("--ftypes", default=DEFAULT_FTYPES)
    args = ap.parse_args()

    quantize = os.path.join(args.bindir, "llama-quantize")
    if not os.access(quantize, os.X_OK):
        print("no llama-quantize in %s" % args.bindir, file=sys.stderr)
        return 2
    out_dir = args.out or os.path.dirname(os.path.abspath(args.f16))
    os.makedirs(out_dir, exist_ok=True)

    sources = [("", args.f16)]
    if not args.no_row256:
        stem = os.path.splitext(os.path.basename(args.f16))[0]
        row256 = os.path.join(out_dir, stem + "-row256.gguf")
        if args.fresh or not newer(row256, args.f16):
            write_row256(args.f16, row256)
        sources.append(("row256-", row256))

    rel = collections.defaultdict(list)       # ggml type -> [rel err per tensor]
    vs_ggml = collections.defaultdict(list)   # ggml type -> [max|ours-ggml|/max|ggml|]
    worst = {}                                # ggml type -> (rel err, label, tensor)
    tool_failed = False

    for prefix, src_path in sources:
        original = gguf_ref.GGUFRef(src_path)
        for ftype in [t.strip() for t in args.ftypes.split(",") if t.strip()]:
            label = prefix + ftype
            stem = os.path.join(out_dir, "ll-" + label.lower())
            qpath, fpath = stem + ".gguf", stem + ".f32.gguf"
            if args.fresh or not newer(qpath, src_path):
                if not run([quantize, src_path, qpath, ftype, str(args.threads)], stem + ".log"):
                    tool_failed = True
                    continue
            have_f32 = run([quantize, "--allow-requantize", qpath, fpath, "F32",
                            str(args.threads)], stem + ".f32.log")
            if not have_f32:
                print("warning: no ggml F32 expansion for %s; compared with the original only"
                      % label, file=sys.stderr)
                tool_failed = True
            quant = gguf_ref.GGUFRef(qpath)
            expanded = gguf_ref.GGUFRef(fpath) if have_f32 else None

            mix = collections.Counter()
            for name, info in quant.tensors.items():
                if name not in original.tensors:
                    continue
                mix[(dq.TYPE_NAMES.get(info.type, str(info.type)), int(info.ne[0]))] += 1
                ours = dq.dequant(quant.tensor_bytes(name), info.type, info.ne)
                src = original.tensors[name]
                err = rel_err(ours, dq.dequant(original.tensor_bytes(name), src.type, src.ne))
                rel[info.type].append(err)
                if info.type not in worst or err > worst[info.type][0]:
                    worst[info.type] = (err, label, name)
                if expanded is not None:
                    e = expanded.tensors[name]
                    theirs = dq.dequant(expanded.tensor_bytes(name), e.type, e.ne)
                    scale = float(np.abs(theirs).max()) or 1.0
                    vs_ggml[info.type].append(float(np.abs(ours - theirs).max()) / scale)
            print("# %-15s %s" % (label, "  ".join("%s[%d] x%d" % (t, n0, c)
                                                   for (t, n0), c in sorted(mix.items()))))
            sys.stdout.flush()
            if expanded is not None:
                del expanded
                if not args.keep_f32:
                    os.remove(fpath)

    print("%-7s %7s %10s %10s %7s %12s  %s"
          % ("type", "tensors", "max_rel", "median_rel", "bound", "max_vs_ggml", "status"))
    bad = False
    for typ in sorted(rel, key=lambda t: dq.TYPE_NAMES.get(t, str(t))):
        errs = np.array(rel[typ])
        bound = REL_BOUND.get(typ, 0.5)
        ok = bool(np.all(np.isfinite(errs))) and errs.max() <= bound
        diff = "n/a"
        if vs_ggml[typ]:
            d = max(vs_ggml[typ])
            diff = "exact" if d == 0 else "%.2e" % d
            ok = ok and d <= GGML_BOUND
        bad = bad or not ok
        status = "ok" if ok else "BAD (worst: %s in %s)" % (worst[typ][2], worst[typ][1])
        print("%-7s %7d %10.5f %10.5f %7.3f %12s  %s"
              % (dq.TYPE_NAMES.get(typ, str(typ)), errs.size, errs.max(), np.median(errs),
                 bound, diff, status))
    if bad:
        return 1
    return 2 if tool_failed else 0


if __name__ == "__main__":
    sys.exit(main())
