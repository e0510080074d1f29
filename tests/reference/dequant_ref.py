"""Independent numpy dequantisation of GGUF (ggml) tensor data.

This module is part of the reference used by the `reference_*` tests to check
the C engine.  It is written from the published block-format facts only and
shares no code with the C kernels, so a misreading of a format in one of them
shows up as a disagreement between the two.

Supported ggml types (numeric id -> layout):

  F32  (0)   little-endian float32 per element
  F16  (1)   little-endian IEEE half per element
  BF16 (30)  upper 16 bits of a float32 per element
  Q4_0 (2)   blocks of 32: f16 d, 16 bytes qs
             x[j] = d*((qs[j] & 0xF) - 8), x[j+16] = d*((qs[j] >> 4) - 8)
  Q4_1 (3)   blocks of 32: f16 d, f16 m, 16 bytes qs
             x[j] = d*(qs[j] & 0xF) + m, x[j+16] = d*(qs[j] >> 4) + m
  Q8_0 (8)   blocks of 32: f16 d, 32 int8 q;  x[j] = d*q[j]

A tensor with ne = (ne0, ne1) is ne1 rows of ne0 contiguous elements; `dequant`
returns a float32 array of shape (ne1, ne0).  Higher dimensions (ne2, ne3) are
folded into the row count.

The module also carries small numpy *quantisers* (`quantize_q8_0`,
`quantize_q4_0`, `quantize_q4_1`) used by the tests to round-trip random data
through `dequant` and so catch a bug in the dequantiser itself.
"""

import numpy as np

GGML_F32 = 0
GGML_F16 = 1
GGML_Q4_0 = 2
GGML_Q4_1 = 3
GGML_Q8_0 = 8
GGML_BF16 = 30

QBLOCK = 32  # elements per block for the quantised types handled here

# ggml type id -> (elements per block, bytes per block)
TYPE_LAYOUT = {
    GGML_F32: (1, 4),
    GGML_F16: (1, 2),
    GGML_BF16: (1, 2),
    GGML_Q4_0: (QBLOCK, 2 + QBLOCK // 2),
    GGML_Q4_1: (QBLOCK, 4 + QBLOCK // 2),
    GGML_Q8_0: (QBLOCK, 2 + QBLOCK),
}

TYPE_NAMES = {
    GGML_F32: "f32",
    GGML_F16: "f16",
    GGML_BF16: "bf16",
    GGML_Q4_0: "q4_0",
    GGML_Q4_1: "q4_1",
    GGML_Q8_0: "q8_0",
}


def tensor_nbytes(ggml_type, ne):
    """Bytes occupied by a tensor of this type and shape."""
    per_block, block_bytes = TYPE_LAYOUT[ggml_type]
    count = int(np.prod([int(n) for n in ne], dtype=np.int64))
    if ne and int(ne[0]) % per_block != 0:
        raise ValueError("ne0=%d is not a multiple of the block size %d"
                         % (int(ne[0]), per_block))
    return count // per_block * block_bytes


def _shape_of(ne):
    ne = [int(n) for n in ne] or [1]
    rows = 1
    for n in ne[1:]:
        rows *= n
    return rows, ne[0]


def _half_column(blocks, start):
    """Read a little-endian f16 at byte `start` of every block row -> float32."""
    pair = np.ascontiguousarray(blocks[:, start:start + 2])
    return pair.view("<f2").astype(np.float32)  # shape (nblocks, 1)


def _split_nibbles(qs):
    """(nblocks, 16) packed bytes -> (nblocks, 32) values 0..15 in element order.

    Element j (j < 16) lives in the low nibble of byte j, element j+16 in the
    high nibble of byte j.
    """
    low = qs & np.uint8(0x0F)
    high = qs >> np.uint8(4)
    return np.concatenate([low, high], axis=1)


def dequant(raw, ggml_type, ne):
    """Dequantise raw tensor bytes to a float32 array of shape (ne1, ne0).

    raw: 1-D numpy uint8 array (a memmap slice is fine) holding at least
         tensor_nbytes(ggml_type, ne) bytes.
    """
    ggml_type = int(ggml_type)
    if ggml_type not in TYPE_LAYOUT:
        raise ValueError("unsupported ggml type %d" % ggml_type)
    rows, cols = _shape_of(ne)
    nbytes = tensor_nbytes(ggml_type, ne)
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size < nbytes:
        raise ValueError("tensor needs %d bytes, got %d" % (nbytes, raw.size))
    raw = raw[:nbytes]

    if ggml_type == GGML_F32:
        out = np.frombuffer(raw.tobytes(), dtype="<f4").astype(np.float32)
    elif ggml_type == GGML_F16:
        out = np.frombuffer(raw.tobytes(), dtype="<f2").astype(np.float32)
    elif ggml_type == GGML_BF16:
        upper = np.frombuffer(raw.tobytes(), dtype="<u2").astype(np.uint32)
        out = (upper << np.uint32(16)).view(np.float32)
    else:
        _, block_bytes = TYPE_LAYOUT[ggml_type]
        blocks = raw.reshape(-1, block_bytes)
        if ggml_type == GGML_Q8_0:
            scale = _half_column(blocks, 0)
            quants = np.ascontiguousarray(blocks[:, 2:]).view(np.int8)
            out = quants.astype(np.float32) * scale
        elif ggml_type == GGML_Q4_0:
            scale = _half_column(blocks, 0)
            nib = _split_nibbles(blocks[:, 2:]).astype(np.float32) - 8.0
            out = nib * scale
        else:  # Q4_1
            scale = _half_column(blocks, 0)
            minimum = _half_column(blocks, 2)
            nib = _split_nibbles(blocks[:, 4:]).astype(np.float32)
            out = nib * scale + minimum
    return np.ascontiguousarray(out.reshape(rows, cols), dtype=np.float32)


def block_offsets(raw, ggml_type, ne):
    """The additive offset m of every block, shape (ne1, ne0 / 32), float32.

    For Q4_1 it is the stored m, for Q4_0 it is -8 d (element = d*n - 8d with
    n the unsigned nibble), for Q8_0 it is 0.  An engine may multiply the
    offsets by exact activation block sums and only the d*n part by quantised
    activations; the reference models that with these values.
    """
    ggml_type = int(ggml_type)
    if ggml_type not in (GGML_Q4_0, GGML_Q4_1, GGML_Q8_0):
        raise ValueError("ggml type %d has no block offsets" % ggml_type)
    rows, cols = _shape_of(ne)
    _, block_bytes = TYPE_LAYOUT[ggml_type]
    nbytes = tensor_nbytes(ggml_type, ne)
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1)[:nbytes].reshape(-1, block_bytes)
    if ggml_type == GGML_Q4_1:
        offsets = _half_column(blocks, 2)
    elif ggml_type == GGML_Q4_0:
        offsets = -8.0 * _half_column(blocks, 0)
    else:
        offsets = np.zeros((blocks.shape[0], 1), dtype=np.float32)
    return np.ascontiguousarray(offsets.reshape(rows, cols // QBLOCK), dtype=np.float32)


# ---------------------------------------------------------------------------
# Quantisers: used only to test `dequant` against data whose values we chose.
# They need not match the C quantiser bit for bit; the tests only check that
# quantise -> dequant reproduces the input within the format's resolution.
# ---------------------------------------------------------------------------

def _blocks_of(values):
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    if values.size % QBLOCK:
        raise ValueError("length must be a multiple of %d" % QBLOCK)
    return values.reshape(-1, QBLOCK)


def _f16_bytes(column):
    return column.astype("<f2").reshape(-1, 1).view(np.uint8)


def _pack_nibbles(levels):
    """(nblocks, 32) ints 0..15 -> (nblocks, 16) bytes, inverse of _split_nibbles."""
    levels = levels.astype(np.uint8)
    return levels[:, :16] | (levels[:, 16:] << np.uint8(4))


def quantize_q8_0(values):
    """float values (multiple of 32) -> raw Q8_0 bytes (uint8 array)."""
    blk = _blocks_of(values)
    amax = np.abs(blk).max(axis=1)
    d = (amax / 127.0).astype(np.float16).astype(np.float32)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    q = np.clip(np.rint(blk * inv[:, None]), -127, 127).astype(np.int8)
    return np.concatenate([_f16_bytes(d), q.view(np.uint8)], axis=1).reshape(-1)


def quantize_q4_0(values):
    """float values (multiple of 32) -> raw Q4_0 bytes (uint8 array)."""
    blk = _blocks_of(values)
    amax = np.abs(blk).max(axis=1)
    d = (amax / 7.0).astype(np.float16).astype(np.float32)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    levels = np.clip(np.rint(blk * inv[:, None]) + 8, 0, 15)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(levels)], axis=1).reshape(-1)


def quantize_q4_1(values):
    """float values (multiple of 32) -> raw Q4_1 bytes (uint8 array)."""
    blk = _blocks_of(values)
    lo = blk.min(axis=1).astype(np.float16).astype(np.float32)
    hi = blk.max(axis=1)
    d = ((hi - lo) / 15.0).astype(np.float16).astype(np.float32)
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1.0), 0.0)
    levels = np.clip(np.rint((blk - lo[:, None]) * inv[:, None]), 0, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(levels)],
                          axis=1).reshape(-1)


def _self_check():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(32 * 64).astype(np.float32)
    for name, quant, typ, tol in (("q8_0", quantize_q8_0, GGML_Q8_0, 0.01),
                                  ("q4_0", quantize_q4_0, GGML_Q4_0, 0.15),
                                  ("q4_1", quantize_q4_1, GGML_Q4_1, 0.1)):
        y = dequant(quant(x), typ, (32, 64)).reshape(-1)
        err = np.linalg.norm(y - x) / np.linalg.norm(x)
        print("%-5s round-trip relative error %.4f" % (name, err))
        assert err < tol, name


if __name__ == "__main__":
    _self_check()
