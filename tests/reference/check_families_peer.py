"""Greedy ids of each model family against llama.cpp, on files neither side wrote.

For each family (llama, llama31 with rope_freqs.weight, llama with q/k/v and output biases, a
head size other than dim / heads, linear and YaRN RoPE scaling, qwen2), random weights are drawn
here with numpy and the file is written by llama.cpp's own gguf-py (GGUFWriter) with the real
metadata keys of the family; the tokenizer keys are copied from an `orochi mkmodel` file (a
byte-level BPE vocabulary both sides read). Then `llama-simple` (llama.cpp) and `orochi run
--temp 0` continue the same prompt greedily for N tokens, and the generated text must be the same
bytes (up to llama.cpp's end of generation: it also stops at tokens whose text marks an end, such
as <|endoftext|>, where orochi run stops at the file's eos only). A file without the family's piece (no rope_freqs, no biases, ...) is written too: it must
generate something else, so that the comparison can tell.

    python3 tests/reference/check_families_peer.py --llama-cpp-src DIR --llama-simple BIN
        [--orochi build/bin/orochi] [--tokens 32] [--type f32|f16] [--json FILE]

Not part of ctest (it needs a llama.cpp build); docs/models.md has the last results.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

# long enough (about 1000 tokens of the byte-level vocabulary) for Llama 3.1's factors, which
# slow the low-frequency pairs, to move the rotations visibly
PROMPT = " ".join(["one two three four five six seven eight nine ten"] * 20)
SPECIALS = (b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>")

# label, architecture, options
FAMILIES = [
    ("llama", "llama", {}),
    ("llama31", "llama", {"rope_freqs": True, "base": 500000.0}),
    ("llama-bias", "llama", {"bias": True, "out_bias": True}),
    ("llama-head96", "llama", {"head_dim": 96}),
    ("llama-linear", "llama", {"scaling": ("linear", 4.0, None)}),
    ("llama-yarn", "llama", {"scaling": ("yarn", 4.0, 256)}),
    ("qwen2", "qwen2", {"bias": True, "base": 1000000.0}),
]


def llama3_factor(i, rot):
    """Llama 3.1's published RoPE factors (factor 8, low 1, high 4, original context 8192)."""
    inv = 500000.0 ** (-2.0 * i / rot)
    wavelen = 2 * np.pi / inv
    if wavelen < 8192 / 4:
        return 1.0
    if wavelen > 8192 / 1:
        return 8.0
    smooth = (8192 / wavelen - 1) / (4 - 1)
    return 1.0 / ((1 - smooth) / 8 + smooth)


def tokenizer_keys(orochi, tmp):
    """The tokenizer metadata of an orochi mkmodel file (vocabulary 300)."""
    import gguf
    path = os.path.join(tmp, "vocab.gguf")
    subprocess.run([orochi, "mkmodel", "--out", path, "--layers", "1", "--dim", "64", "--ffn",
                    "64", "--heads", "2", "--kv-heads", "2", "--vocab", "300", "--ctx", "64",
                    "--type", "f32"], check=True, capture_output=True)
    reader = gguf.GGUFReader(path)
    keys = {}
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            elem = field.types[1]
            if elem == gguf.GGUFValueType.STRING:
                val = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                val = [int(field.parts[i][0]) for i in field.data]
            keys[field.name] = ("array", val)
        elif field.types[0] == gguf.GGUFValueType.STRING:
            keys[field.name] = ("str", bytes(field.parts[-1]).decode("utf-8"))
        elif field.types[0] == gguf.GGUFValueType.BOOL:
            keys[field.name] = ("bool", bool(field.parts[-1][0]))
        else:
            keys[field.name] = ("u32", int(field.parts[-1][0]))
    return keys


def write_family(path, arch, opts, tok, dtype, seed, leave_out=False):
    import gguf
    rng = np.random.default_rng(seed)
    layers, dim, ffn, heads, kv_heads, vocab = 2, 128, 256, 4, 2, 300
    hd = opts.get("head_dim", dim // heads)
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(opts.get("base", 10000.0))
    w.add_layer_norm_rms_eps(1e-5)
    if "head_dim" in opts:
        w.add_key_length(hd)
        w.add_value_length(hd)
    scaling = opts.get("scaling")
    if scaling and not leave_out:
        kind, factor, orig = scaling
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR if kind == "linear"
                                else gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        if orig:
            w.add_rope_scaling_orig_ctx_len(orig)
    for name, (kind, val) in tok.items():
        if kind == "array":
            w.add_array(name, val)
        elif kind == "str":
            w.add_string(name, val)
        elif kind == "bool":
            w.add_bool(name, val)
        else:
            w.add_uint32(name, val)
    ftype = np.float16 if dtype == "f16" else np.float32

    def mat(name, rows, cols, scale=None):
        s = scale if scale is not None else np.sqrt(3.0 / cols)
        w.add_tensor(name, (rng.uniform(-s, s, (rows, cols))).astype(ftype))

    def vec(name, n, centre, scale=0.1):
        w.add_tensor(name, (centre + rng.uniform(-scale, scale, n)).astype(np.float32))

    mat("token_embd.weight", vocab, dim, 1.0)
    for i in range(layers):
        p = "blk.%d." % i
        vec(p + "attn_norm.weight", dim, 1.0)
        mat(p + "attn_q.weight", heads * hd, dim)
        mat(p + "attn_k.weight", kv_heads * hd, dim)
        mat(p + "attn_v.weight", kv_heads * hd, dim)
        mat(p + "attn_output.weight", dim, heads * hd)
        vec(p + "ffn_norm.weight", dim, 1.0)
        mat(p + "ffn_gate.weight", ffn, dim)
        mat(p + "ffn_up.weight", ffn, dim)
        mat(p + "ffn_down.weight", dim, ffn)
        if opts.get("bias"):
            for t, n in (("attn_q.bias", heads * hd), ("attn_k.bias", kv_heads * hd),
                         ("attn_v.bias", kv_heads * hd)):
                if leave_out:
                    w.add_tensor(p + t, np.zeros(n, np.float32))  # qwen2 needs them: zero
                else:
                    vec(p + t, n, 0.0, 0.5)
        if opts.get("out_bias") and not leave_out:
            vec(p + "attn_output.bias", dim, 0.0, 0.5)
    vec("output_norm.weight", dim, 1.0)
    mat("output.weight", vocab, dim)
    if opts.get("rope_freqs") and not leave_out:
        w.add_tensor("rope_freqs.weight",
                     np.array([llama3_factor(i, hd) for i in range(hd // 2)], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def peer_text(llama_simple, path, n):
    out = subprocess.run([llama_simple, "-m", path, "-n", str(n), PROMPT], capture_output=True,
                         timeout=300)
    if out.returncode:
        raise RuntimeError("llama-simple: %s" % out.stderr.decode(errors="replace")[-400:])
    text = out.stdout
    prompt = PROMPT.encode()
    text = text[text.index(prompt) + len(prompt):] if prompt in text else text
    for sp in SPECIALS:  # llama-simple prints special tokens' text, orochi run does not
        text = text.replace(sp, b"")
    return text[:-1] if text.endswith(b"\n") else text  # its closing newline


def orochi_text(orochi, path, n):
    out = subprocess.run([orochi, "run", "--model", path, "--prompt", PROMPT, "-n", str(n),
                          "--temp", "0", "--threads", "2", "--kv", "f16"], capture_output=True,
                         timeout=300)
    if out.returncode:
        raise RuntimeError("orochi run: %s" % out.stderr.decode(errors="replace")[-400:])
    return out.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-cpp-src", required=True)
    ap.add_argument("--llama-simple", required=True)
    ap.add_argument("--orochi", default="build/bin/orochi")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--type", default="f32", choices=("f32", "f16"))
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.llama_cpp_src, "gguf-py"))
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        tok = tokenizer_keys(a.orochi, tmp)
        for k, (label, arch, opts) in enumerate(FAMILIES):
            path = os.path.join(tmp, label + ".gguf")
            write_family(path, arch, opts, tok, a.type, 100 + k)
            peer = peer_text(a.llama_simple, path, a.tokens)
            ours = orochi_text(a.orochi, path, a.tokens)
            # llama.cpp ends at every end-of-generation token it recognises by its text
            # (<|endoftext|> too), orochi run at the file's eos only: the same ids then give
            # llama.cpp's text as a prefix of orochi's
            # (and llama-simple prints a NUL byte's piece as nothing: compared without NULs)
            peer, ours = peer.replace(b"\0", b""), ours.replace(b"\0", b"")
            same = peer == ours or (len(peer) < len(ours) and ours.startswith(peer))
            common = next((i for i, (x, y) in enumerate(zip(peer, ours)) if x != y),
                          min(len(peer), len(ours)))
            moved = None
            if label != "llama" and label != "llama-head96":
                plain = os.path.join(tmp, label + "-plain.gguf")
                write_family(plain, arch, opts, tok, a.type, 100 + k, leave_out=True)
                moved = orochi_text(a.orochi, plain, a.tokens) != ours
            ok = same and moved is not False
            failures += not ok
            print("%-14s %s: llama.cpp and orochi %s (%d of %d/%d bytes in common)%s"
                  % (label, a.type, "agree" if same else "DIFFER", common, len(peer), len(ours),
                     "" if moved is None else "; without its piece the text %s"
                     % ("changes" if moved else "DOES NOT CHANGE")), flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps({"check": "families_peer", "family": label,
                                        "type": a.type, "tokens": a.tokens, "agree": same,
                                        "common_bytes": common, "piece_changes": moved}) + "\n")
    print("families vs llama.cpp: %s" % ("all agree" if not failures else "%d FAILED" % failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
