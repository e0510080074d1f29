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
  Q5_0 (6)   blocks of 32 (22 bytes): f16 d, u32 qh (little-endian), 16 bytes qs
             q[j] = (qs[j] & 0xF) | (bit j of qh) << 4,
             q[j+16] = (qs[j] >> 4) | (bit j+16 of qh) << 4;  x = d*(q - 16)
  Q5_1 (7)   blocks of 32 (24 bytes): f16 d, f16 m, u32 qh, 16 bytes qs
             q as for Q5_0;  x = d*q + m
  IQ4_NL (20) blocks of 32 (18 bytes): f16 d, 16 bytes qs; nibbles placed as
             in Q4_0, each one indexes the non-linear table
             K = (-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113);
             x = d*K[nibble]

The "K" types below use super-blocks of 256 elements.  Within one, element e
(0..255) is written e = 128*h + 32*k + l with h in 0..1, k in 0..3, l in 0..31
where a format interleaves by 2-bit planes, or e = 64*c + 32*u + l with c in
0..3, u in 0..1 where it interleaves by nibbles.

  Q2_K (10)  84 bytes: scales[16], qs[64], f16 d, f16 dmin
             sub-block s = e // 16 (16 elements each); sc = scales[s]
             q = (qs[32*h + l] >> 2*k) & 3
             x = d*(sc & 0xF)*q - dmin*(sc >> 4)
  Q3_K (11)  110 bytes: hmask[32], qs[64], scales[12], f16 d
             low two bits as Q2_K; third bit = bit (e // 32) of hmask[e % 32];
             q = low + 4*third - 4 (range -4..3)
             16 six-bit scales, stored +32: scale i has its low four bits in
             scales[i % 8] (low nibble for i < 8, high nibble for i >= 8) and
             its top two bits at bit 2*(i // 4) of scales[8 + i % 4]
             x = d*(scale[e // 16] - 32)*q
  Q4_K (12)  144 bytes: f16 d, f16 dmin, scales[12], qs[128]
             eight sub-blocks of 32, sub-block j = e // 32, each with a six-bit
             scale sc[j] and a six-bit min mn[j] packed in the 12 bytes S:
               j < 4:  sc = S[j] & 63,  mn = S[j+4] & 63
               j >= 4: sc = (S[j+4] & 0xF) | (S[j-4] >> 6) << 4
                       mn = (S[j+4] >> 4)  | (S[j] >> 6) << 4
             q = low (u = 0) or high (u = 1) nibble of qs[32*c + l]
             x = d*sc[j]*q - dmin*mn[j]
  Q5_K (13)  176 bytes: f16 d, f16 dmin, scales[12], qh[32], qs[128]
             as Q4_K, with q += 16 * (bit (e // 32) of qh[e % 32])
  Q6_K (14)  210 bytes: ql[128], qh[64], int8 scales[16], f16 d
             low four bits: nibble (k // 2) of ql[64*h + 32*(k % 2) + l]
             top two bits: bits 2k, 2k+1 of qh[32*h + l]
             x = d*scales[e // 16]*(q - 32)

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
GGML_Q5_0 = 6
GGML_Q5_1 = 7
GGML_Q8_0 = 8
GGML_Q2_K = 10
GGML_Q3_K = 11
GGML_Q4_K = 12
GGML_Q5_K = 13
GGML_Q6_K = 14
GGML_IQ4_NL = 20
GGML_BF16 = 30

QBLOCK = 32  # elements per block of the 32-element quantised types
QK_K = 256   # elements per super-block of the K types

# IQ4_NL: nibble -> multiple of d
IQ4_NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                          1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float32)

# ggml type id -> (elements per block, bytes per block)
TYPE_LAYOUT = {
    GGML_F32: (1, 4),
    GGML_F16: (1, 2),
    GGML_BF16: (1, 2),
    GGML_Q4_0: (QBLOCK, 2 + QBLOCK // 2),
    GGML_Q4_1: (QBLOCK, 4 + QBLOCK // 2),
    GGML_Q8_0: (QBLOCK, 2 + QBLOCK),
    GGML_Q5_0: (QBLOCK, 2 + 4 + QBLOCK // 2),
    GGML_Q5_1: (QBLOCK, 4 + 4 + QBLOCK // 2),
    GGML_IQ4_NL: (QBLOCK, 2 + QBLOCK // 2),
    GGML_Q2_K: (QK_K, QK_K // 16 + QK_K // 4 + 4),
    GGML_Q3_K: (QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    GGML_Q4_K: (QK_K, 4 + 12 + QK_K // 2),
    GGML_Q5_K: (QK_K, 4 + 12 + QK_K // 8 + QK_K // 2),
    GGML_Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}

TYPE_NAMES = {
    GGML_F32: "f32",
    GGML_F16: "f16",
    GGML_BF16: "bf16",
    GGML_Q4_0: "q4_0",
    GGML_Q4_1: "q4_1",
    GGML_Q8_0: "q8_0",
    GGML_Q5_0: "q5_0",
    GGML_Q5_1: "q5_1",
    GGML_IQ4_NL: "iq4_nl",
    GGML_Q2_K: "q2_k",
    GGML_Q3_K: "q3_k",
    GGML_Q4_K: "q4_k",
    GGML_Q5_K: "q5_k",
    GGML_Q6_K: "q6_k",
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


def _high_bits_u32(blocks, start):
    """(nblocks, 32) values 0/1: bit j of the little-endian u32 at byte `start`."""
    word = np.ascontiguousarray(blocks[:, start:start + 4]).view("<u4")  # (nblocks, 1)
    return ((word >> np.arange(32, dtype=np.uint32)) & np.uint32(1)).astype(np.uint8)


# Per-element position tables for a 256-element super-block (see the module
# docstring).  All are uint8 so shifted uint8 arrays stay uint8.
_E = np.arange(QK_K)
# 2-bit planes (Q2_K, Q3_K): element 128h + 32k + l -> byte 32h + l, shift 2k
_PLANE_BYTE = 32 * (_E // 128) + _E % 32
_PLANE_SHIFT = (2 * ((_E // 32) % 4)).astype(np.uint8)
# nibbles (Q4_K, Q5_K): element 64c + 32u + l -> byte 32c + l, shift 4u
_NIB_BYTE = 32 * (_E // 64) + _E % 32
_NIB_SHIFT = (4 * ((_E // 32) % 2)).astype(np.uint8)
# one extra bit per element (Q3_K hmask, Q5_K qh): byte e % 32, bit e // 32
_HBIT_BYTE = _E % 32
_HBIT_SHIFT = (_E // 32).astype(np.uint8)
# Q6_K: element 128h + 32k + l -> ql byte 64h + 32(k % 2) + l, shift 4(k // 2);
#                                 qh byte 32h + l, shift 2k
_Q6_LOW_BYTE = 64 * (_E // 128) + 32 * ((_E // 32) % 2) + _E % 32
_Q6_LOW_SHIFT = (4 * (((_E // 32) % 4) // 2)).astype(np.uint8)
_Q6_HIGH_BYTE = 32 * (_E // 128) + _E % 32
_Q6_HIGH_SHIFT = (2 * ((_E // 32) % 4)).astype(np.uint8)


def _per_sub(values, size):
    """(nblocks, n) per-sub-block values -> (nblocks, n*size), each repeated."""
    return np.repeat(values, size, axis=1)


def _q3_k_scales(packed):
    """(nblocks, 12) bytes -> (nblocks, 16) signed scales (stored value - 32)."""
    i = np.arange(16)
    low = (packed[:, i % 8] >> (4 * (i // 8)).astype(np.uint8)) & np.uint8(0x0F)
    top = (packed[:, 8 + i % 4] >> (2 * (i // 4)).astype(np.uint8)) & np.uint8(3)
    return (low | (top << np.uint8(4))).astype(np.float32) - 32.0


def _k4_scales_mins(packed):
    """(nblocks, 12) bytes -> two (nblocks, 8) arrays: six-bit scales and mins."""
    first, second, third = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    six, four, top = np.uint8(63), np.uint8(4), np.uint8(6)
    # sub-blocks 0..3: low six bits of bytes 0..3 (scales) and 4..7 (mins);
    # sub-blocks 4..7: a nibble of bytes 8..11 plus the top two bits of 0..7
    scale = np.concatenate([first & six,
                            (third & np.uint8(0x0F)) | ((first >> top) << four)], axis=1)
    minimum = np.concatenate([second & six,
                              (third >> four) | ((second >> top) << four)], axis=1)
    return scale.astype(np.float32), minimum.astype(np.float32)


def _dequant_blocks(blocks, ggml_type):
    """Dequantise (nblocks, block_bytes) uint8 -> (nblocks, block_elems) float32."""
    if ggml_type == GGML_Q8_0:
        scale = _half_column(blocks, 0)
        quants = np.ascontiguousarray(blocks[:, 2:]).view(np.int8)
        return quants.astype(np.float32) * scale
    if ggml_type == GGML_Q4_0:
        scale = _half_column(blocks, 0)
        return (_split_nibbles(blocks[:, 2:]).astype(np.float32) - 8.0) * scale
    if ggml_type == GGML_Q4_1:
        scale = _half_column(blocks, 0)
        minimum = _half_column(blocks, 2)
        return _split_nibbles(blocks[:, 4:]).astype(np.float32) * scale + minimum
    if ggml_type == GGML_Q5_0:
        scale = _half_column(blocks, 0)
        q = _split_nibbles(blocks[:, 6:]) | (_high_bits_u32(blocks, 2) << np.uint8(4))
        return (q.astype(np.float32) - 16.0) * scale
    if ggml_type == GGML_Q5_1:
        scale = _half_column(blocks, 0)
        minimum = _half_column(blocks, 2)
        q = _split_nibbles(blocks[:, 8:]) | (_high_bits_u32(blocks, 4) << np.uint8(4))
        return q.astype(np.float32) * scale + minimum
    if ggml_type == GGML_IQ4_NL:
        scale = _half_column(blocks, 0)
        return IQ4_NL_VALUES[_split_nibbles(blocks[:, 2:])] * scale
    if ggml_type == GGML_Q2_K:
        scales = blocks[:, 0:16]
        qs = blocks[:, 16:80]
        d = _half_column(blocks, 80)
        dmin = _half_column(blocks, 82)
        q = (qs[:, _PLANE_BYTE] >> _PLANE_SHIFT) & np.uint8(3)
        mult = _per_sub((scales & np.uint8(0x0F)).astype(np.float32) * d, 16)
        offs = _per_sub((scales >> np.uint8(4)).astype(np.float32) * dmin, 16)
        return mult * q.astype(np.float32) - offs
    if ggml_type == GGML_Q3_K:
        hmask = blocks[:, 0:32]
        qs = blocks[:, 32:96]
        d = _half_column(blocks, 108)
        low = (qs[:, _PLANE_BYTE] >> _PLANE_SHIFT) & np.uint8(3)
        third = (hmask[:, _HBIT_BYTE] >> _HBIT_SHIFT) & np.uint8(1)
        q = low.astype(np.float32) + 4.0 * third.astype(np.float32) - 4.0
        mult = _per_sub(_q3_k_scales(blocks[:, 96:108]) * d, 16)
        return mult * q
    if ggml_type in (GGML_Q4_K, GGML_Q5_K):
        d = _half_column(blocks, 0)
        dmin = _half_column(blocks, 2)
        scale, minimum = _k4_scales_mins(blocks[:, 4:16])
        qs = blocks[:, 16:144] if ggml_type == GGML_Q4_K else blocks[:, 48:176]
        q = (qs[:, _NIB_BYTE] >> _NIB_SHIFT) & np.uint8(0x0F)
        if ggml_type == GGML_Q5_K:
            qh = blocks[:, 16:48]
            q = q | (((qh[:, _HBIT_BYTE] >> _HBIT_SHIFT) & np.uint8(1)) << np.uint8(4))
        mult = _per_sub(scale * d, 32)
        offs = _per_sub(minimum * dmin, 32)
        return mult * q.astype(np.float32) - offs
    if ggml_type == GGML_Q6_K:
        ql = blocks[:, 0:128]
        qh = blocks[:, 128:192]
        scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8)
        d = _half_column(blocks, 208)
        low = (ql[:, _Q6_LOW_BYTE] >> _Q6_LOW_SHIFT) & np.uint8(0x0F)
        top = (qh[:, _Q6_HIGH_BYTE] >> _Q6_HIGH_SHIFT) & np.uint8(3)
        q = (low | (top << np.uint8(4))).astype(np.float32) - 32.0
        mult = _per_sub(scales.astype(np.float32) * d, 16)
        return mult * q
    raise ValueError("unsupported ggml type %d" % ggml_type)


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
        out = _dequant_blocks(raw.reshape(-1, block_bytes), ggml_type)
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
