#!/usr/bin/env python3
"""Write the seed corpus of the GGUF fuzz target: two tiny valid GGUF files (v3 and v2).

Pure Python, no dependencies. Usage: make_corpus.py [OUT_DIR] (default: the corpus/ folder next
to this script). The files are deterministic, so re-running it changes nothing in git.
"""
import os
import struct
import sys

# GGUF value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
# ggml tensor types used here: id -> (elements per block, bytes per block)
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 6: (32, 22), 8: (32, 34), 11: (256, 110),
        12: (256, 144), 14: (256, 210), 20: (32, 18)}


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def value(vtype, v):
    """Encode a value; arrays are given as (elem_type, [elements])."""
    if vtype == STR:
        return gstr(v)
    if vtype == ARR:
        elem, items = v
        out = struct.pack("<IQ", elem, len(items))
        return out + b"".join(value(elem, x) for x in items)
    return struct.pack(SCALAR_FMT[vtype], v)


def gguf(version, kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ggml_type, shape)]; data bytes are a pattern."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    for key, vtype, v in kvs:
        out += gstr(key) + struct.pack("<I", vtype) + value(vtype, v)
    offset = 0
    blobs = []
    for name, ttype, shape in tensors:
        block, nbytes = GGML[ttype]
        assert shape[0] % block == 0
        size = shape[0] // block * nbytes
        for d in shape[1:]:
            size *= d
        out += gstr(name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", ttype, offset)
        blobs.append((offset, bytes((i * 7 + 3) & 0xFF for i in range(size))))
        offset = (offset + size + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    data_start = len(out)
    for off, blob in blobs:
        out += b"\0" * (data_start + off - len(out))
        out += blob
    return bytes(out)


def seeds():
    v3 = gguf(3, [
        ("general.architecture", STR, "llama"),
        ("general.alignment", U32, 32),
        ("llama.block_count", U32, 1),
        ("t.u8", U8, 7), ("t.i8", I8, -7), ("t.u16", U16, 700), ("t.i16", I16, -700),
        ("t.i32", I32, -70000), ("t.f32", F32, 0.5), ("t.bool", BOOL, 1),
        ("t.u64", U64, 1 << 40), ("t.i64", I64, -(1 << 40)), ("t.f64", F64, 2.25),
        ("tokenizer.ggml.tokens", ARR, (STR, ["<s>", "</s>", "a", "b", "ab"])),
        ("tokenizer.ggml.scores", ARR, (F32, [0.0, 0.0, -1.0, -2.0, -3.0])),
        ("tokenizer.ggml.token_type", ARR, (I32, [3, 3, 1, 1, 1])),
        ("t.nested", ARR, (ARR, [(U16, [1, 2]), (STR, ["x"]), (ARR, [(U8, [])])])),
    ], [
        ("token_embd.weight", 8, (32, 5)),
        ("output_norm.weight", 0, (32,)),
    ])
    v2 = gguf(2, [
        ("general.architecture", STR, "llama"),
        ("general.alignment", U32, 64),
        ("tokenizer.ggml.merges", ARR, (STR, ["a b", "ab c"])),
        ("t.empty", ARR, (U32, [])),
    ], [
        ("blk.0.attn_q.weight", 2, (32, 2)),
        ("blk.0.attn_k.weight", 1, (4, 2, 1)),
    ], alignment=64)
    kq = gguf(3, [
        ("general.architecture", STR, "llama"),
    ], [
        ("blk.0.ffn_down.weight", 12, (256, 2)),
        ("blk.0.attn_v.weight", 14, (256, 1)),
        ("blk.0.ffn_up.weight", 11, (256, 1)),
        ("blk.0.attn_q.weight", 6, (64, 2)),
        ("blk.0.attn_k.weight", 20, (32, 3)),
    ])
    return {"tiny_v3.gguf": v3, "tiny_v2.gguf": v2, "kquants.gguf": kq}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out_dir, exist_ok=True)
    for name, blob in seeds().items():
        assert len(blob) < 4096, name
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(blob)
        print(f"{os.path.join(out_dir, name)}: {len(blob)} bytes")


if __name__ == "__main__":
    main()
