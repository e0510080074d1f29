"""gguf_ref — an independent, pure Python + numpy reader (and tiny writer) of GGUF files.

Used by the reference tests as ground truth next to the C reader (model/gguf.c); it shares no code
with it. The whole file is memory-mapped as uint8; the header, the key/value metadata and the
tensor table are parsed sequentially with struct, and tensor data is exposed as numpy views into
the mapping (nothing big is copied).

Layout (all little-endian): b"GGUF", u32 version, u64 n_tensors, u64 n_kv; n_kv records of
(string key, u32 type, value); n_tensors records of (string name, u32 n_dims, n_dims x u64 ne,
u32 ggml type, u64 offset relative to the data section); the data section starts at the end of
the tensor table rounded up to general.alignment (default 32). Strings are u64 length + bytes.

`write_gguf(path, kv, tensors)` writes a small GGUF (used to build tiny test models).
"""

import struct
from collections import namedtuple

import numpy as np

GGUF_MAGIC = b"GGUF"

T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, \
    T_UINT64, T_INT64, T_FLOAT64 = range(13)

# scalar type -> (struct code, size, numpy dtype)
_SCALAR = {
    T_UINT8: ("B", 1, "<u1"),
    T_INT8: ("b", 1, "<i1"),
    T_UINT16: ("H", 2, "<u2"),
    T_INT16: ("h", 2, "<i2"),
    T_UINT32: ("I", 4, "<u4"),
    T_INT32: ("i", 4, "<i4"),
    T_FLOAT32: ("f", 4, "<f4"),
    T_BOOL: ("?", 1, "<u1"),
    T_UINT64: ("Q", 8, "<u8"),
    T_INT64: ("q", 8, "<i8"),
    T_FLOAT64: ("d", 8, "<f8"),
}

# ggml tensor type -> (block elements, block bytes)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30
GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL = 6, 7, 20
GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K = 10, 11, 12, 13, 14
GGML_BLOCK = {
    GGML_F32: (1, 4),
    GGML_F16: (1, 2),
    GGML_BF16: (1, 2),
    GGML_Q4_0: (32, 18),
    GGML_Q4_1: (32, 20),
    GGML_Q8_0: (32, 34),
    GGML_Q5_0: (32, 22),
    GGML_Q5_1: (32, 24),
    GGML_IQ4_NL: (32, 18),
    GGML_Q2_K: (256, 84),
    GGML_Q3_K: (256, 110),
    GGML_Q4_K: (256, 144),
    GGML_Q5_K: (256, 176),
    GGML_Q6_K: (256, 210),
}

TensorInfo = namedtuple("TensorInfo", "name type ne offset_abs nbytes")


class GGUFError(ValueError):
    pass


def _decode_str(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(b)


def tensor_nbytes(ggml_type, ne):
    if ggml_type not in GGML_BLOCK:
        raise GGUFError("unsupported ggml type %d" % ggml_type)
    blk, bsz = GGML_BLOCK[ggml_type]
    n = 1
    for d in ne:
        n *= int(d)
    if ne and int(ne[0]) % blk != 0:
        raise GGUFError("ne[0]=%d not a multiple of block size %d" % (ne[0], blk))
    return n // blk * bsz


class GGUFRef:
    def __init__(self, path):
        self.path = path
        self.raw = np.memmap(path, dtype=np.uint8, mode="r")
        self._buf = memoryview(self.raw)
        self._size = len(self.raw)
        self._pos = 0
        if self._size < 24 or bytes(self._buf[0:4]) != GGUF_MAGIC:
            raise GGUFError("%s: bad magic" % path)
        self._pos = 4
        self.version = self._u32()
        n_tensors = self._u64()
        n_kv = self._u64()
        self.kv = {}
        self.kv_types = {}
        for _ in range(n_kv):
            key = self._str()
            if isinstance(key, bytes):
                key = key.decode("utf-8", errors="surrogateescape")
            t = self._u32()
            self.kv_types[key] = t
            self.kv[key] = self._value(t)
        self.alignment = int(self.kv.get("general.alignment", 32))
        if self.alignment <= 0:
            raise GGUFError("bad alignment %d" % self.alignment)
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            if isinstance(name, bytes):
                name = name.decode("utf-8", errors="surrogateescape")
            n_dims = self._u32()
            if n_dims > 4:
                raise GGUFError("tensor %s: n_dims %d" % (name, n_dims))
            ne = tuple(self._u64() for _ in range(n_dims))
            ttype = self._u32()
            off = self._u64()
            infos.append((name, ttype, ne, off))
        a = self.alignment
        self.data_offset = (self._pos + a - 1) // a * a
        self.tensors = {}
        for name, ttype, ne, off in infos:
            nb = tensor_nbytes(ttype, ne)
            absoff = self.data_offset + off
            if absoff + nb > self._size:
                raise GGUFError("tensor %s: data past end of file" % name)
            self.tensors[name] = TensorInfo(name, ttype, ne, absoff, nb)
        del self._buf

    # --- primitive readers -------------------------------------------------------------------
    def _take(self, n):
        p = self._pos
        if n < 0 or p + n > self._size:
            raise GGUFError("%s: read of %d bytes at %d past end of file" % (self.path, n, p))
        self._pos = p + n
        return self._buf[p:p + n]

    def _u32(self):
        return struct.unpack_from("<I", self._take(4))[0]

    def _u64(self):
        return struct.unpack_from("<Q", self._take(8))[0]

    def _str(self):
        n = self._u64()
        return _decode_str(bytes(self._take(n)))

    def _value(self, t):
        if t in _SCALAR:
            code, size, _ = _SCALAR[t]
            v = struct.unpack_from("<" + code, self._take(size))[0]
            return bool(v) if t == T_BOOL else v
        if t == T_STRING:
            return self._str()
        if t == T_ARRAY:
            et = self._u32()
            n = self._u64()
            if et in _SCALAR:
                code, size, dt = _SCALAR[et]
                arr = np.frombuffer(self._take(n * size), dtype=dt)
                if et == T_BOOL:
                    return [bool(x) for x in arr]
                return arr.tolist()
            if et == T_STRING:
                return self._str_array(n)
            if et == T_ARRAY:
                return [self._value(T_ARRAY) for _ in range(n)]
            raise GGUFError("%s: bad array element type %d at %d" % (self.path, et, self._pos))
        raise GGUFError("%s: bad value type %d at %d" % (self.path, t, self._pos))

    def _str_array(self, n):
        # Fast path: walk lengths with int.from_bytes over one bytes object.
        buf = self._buf
        p = self._pos
        size = self._size
        out = []
        append = out.append
        # read in a growing window to avoid copying the whole file
        for _ in range(n):
            if p + 8 > size:
                raise GGUFError("%s: string array past end of file at %d" % (self.path, p))
            ln = int.from_bytes(buf[p:p + 8], "little")
            p += 8
            if p + ln > size:
                raise GGUFError("%s: string past end of file at %d" % (self.path, p))
            b = bytes(buf[p:p + ln])
            p += ln
            try:
                append(b.decode("utf-8"))
            except UnicodeDecodeError:
                append(b)
        self._pos = p
        return out

    # --- tensor access -------------------------------------------------------------------------
    def tensor_bytes(self, name):
        ti = self.tensors[name]
        return self.raw[ti.offset_abs:ti.offset_abs + ti.nbytes]


# --- writer ------------------------------------------------------------------------------------

def _enc_str(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _guess_type(v):
    if isinstance(v, bool):
        return T_BOOL
    if isinstance(v, int):
        return T_INT32 if -2**31 <= v < 2**31 else T_INT64
    if isinstance(v, float):
        return T_FLOAT32
    if isinstance(v, (str, bytes)):
        return T_STRING
    if isinstance(v, (list, tuple)):
        return T_ARRAY
    raise TypeError("cannot store %r in GGUF" % (v,))


def _enc_value(t, v, elem=None):
    if t in _SCALAR:
        return struct.pack("<" + _SCALAR[t][0], v)
    if t == T_STRING:
        return _enc_str(v)
    if t == T_ARRAY:
        if elem is None:
            elem = _guess_type(v[0]) if len(v) else T_INT32
            if elem in (T_INT32, T_INT64) and any(isinstance(x, float) for x in v):
                elem = T_FLOAT32
        out = [struct.pack("<IQ", elem, len(v))]
        if elem in _SCALAR:
            out.append(np.asarray(v, dtype=_SCALAR[elem][2]).tobytes())
        else:
            out.extend(_enc_value(elem, x) for x in v)
        return b"".join(out)
    raise TypeError("bad GGUF type %d" % t)


def write_gguf(path, kv, tensors=(), version=3, alignment=32):
    """kv: dict key -> value, or key -> (type, value) / (T_ARRAY, elem_type, list) for explicit
    types. tensors: list of (name, ggml_type, ne tuple, bytes)."""
    out = [GGUF_MAGIC, struct.pack("<IQQ", version, len(tensors), len(kv))]
    for k, v in kv.items():
        if isinstance(v, tuple) and len(v) in (2, 3) and isinstance(v[0], int) \
                and not isinstance(v[0], bool):
            t = v[0]
            elem = v[1] if len(v) == 3 else None
            val = v[-1]
        else:
            t, elem, val = _guess_type(v), None, v
        out.append(_enc_str(k) + struct.pack("<I", t) + _enc_value(t, val, elem))
    off = 0
    offs = []
    for name, ttype, ne, data in tensors:
        off = (off + alignment - 1) // alignment * alignment
        offs.append(off)
        out.append(_enc_str(name) + struct.pack("<I", len(ne)) +
                   b"".join(struct.pack("<Q", d) for d in ne) + struct.pack("<IQ", ttype, off))
        off += len(data)
    head = b"".join(out)
    pad = (-len(head)) % alignment
    body = bytearray()
    for (name, ttype, ne, data), o in zip(tensors, offs):
        body += b"\0" * (o - len(body))
        body += data
    with open(path, "wb") as fp:
        fp.write(head + b"\0" * pad + bytes(body))


if __name__ == "__main__":
    import sys
    import time
    t0 = time.time()
    g = GGUFRef(sys.argv[1])
    dt = time.time() - t0
    print("version", g.version, "n_kv", len(g.kv), "n_tensors", len(g.tensors),
          "data_offset", g.data_offset, "parsed in %.3fs" % dt)
    for k, v in g.kv.items():
        s = repr(v)
        if isinstance(v, list):
            s = "[%d] %s" % (len(v), repr(v[:5]))
        print(" ", k, "=", s[:120])
    for name, ti in list(g.tensors.items())[:8]:
        print(" ", ti)
