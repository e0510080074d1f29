/*
 * kernels/cpu/ktypes_k.h — private to kernels/cpu: the K-quants (Q2_K..Q6_K), Q5_0/Q5_1 and
 * IQ4_NL as scalar routines. types.c dispatches kt_quantize_row / kt_dequantize_row here for
 * those types.
 *
 * Block layouts (GGUF/ggml; all little-endian, f16 = IEEE half):
 *   Q5_0   (32, 22 B):  f16 d, u32 qh, u8 qs[16]            x = d * (q - 16)
 *   Q5_1   (32, 24 B):  f16 d, f16 m, u32 qh, u8 qs[16]     x = d * q + m
 *          q of element j < 16: qs[j] & 15 | bit j of qh << 4; element j + 16: qs[j] >> 4 |
 *          bit j + 16 of qh << 4.
 *   IQ4_NL (32, 18 B):  f16 d, u8 qs[16]                    x = d * KTK_IQ4NL[nibble], nibbles
 *          as Q4_0.
 *   Q2_K  (256, 84 B):  u8 scales[16], u8 qs[64], f16 d, f16 dmin
 *          16 sub-blocks of 16: x = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4), q 2-bit.
 *   Q3_K (256, 110 B):  u8 hmask[32], u8 qs[64], u8 scales[12], f16 d
 *          16 sub-blocks of 16 with 6-bit scales sc (stored + 32): x = d * (sc - 32) * (q - 4 +
 *          4 * h), q 2-bit, h the hmask bit.
 *   Q4_K (256, 144 B):  f16 d, f16 dmin, u8 scales[12], u8 qs[128]
 *          8 sub-blocks of 32 with 6-bit scale sc and min m: x = d * sc * q - dmin * m, q 4-bit.
 *   Q5_K (256, 176 B):  f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]   q 5-bit.
 *   Q6_K (256, 210 B):  u8 ql[128], u8 qh[64], i8 scales[16], f16 d
 *          16 sub-blocks of 16: x = d * scales[s] * (q - 32), q 6-bit.
 * Where each element's bits lie inside a super-block: ktk_code() in ktypes_k.c, the one place
 * that reads them (the matmul's packing uses it too).
 */
#ifndef OROCHI_KTYPES_K_H
#define OROCHI_KTYPES_K_H

#include <stdint.h>

/* the 16 values of IQ4_NL's non-linear 4-bit grid */
extern const int8_t KTK_IQ4NL[16];

/* One block of any of these types in one common form: element e is
 *     D * sc[e / 16] * (code[e] - z) + M * mn[e / 16]
 * with code an unsigned integer (at most 241), sc and mn small integers per 16 elements, D and M
 * floats (from f16: D * sc and M * mn are exact in float) and z a power of two. Per type:
 *   Q4_K, Q5_K  D = d, M = -dmin, sc / mn the sub-block's scale and min, z = 0
 *   Q2_K        D = d, M = -dmin, sc / mn the 4-bit scale and min, z = 0
 *   Q3_K        D = d, M = 0, sc = scale - 32, code = q + 4 h, z = 4
 *   Q6_K        D = d, M = 0, sc = scale, z = 32
 *   Q5_0        D = d, M = 0, sc = 1, z = 16
 *   Q5_1        D = d, M = m, sc = mn = 1, z = 0
 *   IQ4_NL      D = d, M = 0, sc = 1, code = grid value + 128, z = 128 */
typedef struct {
    int n; /* elements: 32 or 256 */
    int z;
    float D, M;
    int16_t sc[16], mn[16];
    uint8_t code[256];
} ktk_block;

/* Whether `type` is one of this file's types. */
int ktk_is_k(uint32_t type);
/* Read one block of `type` at blk into u. */
void ktk_unpack(uint32_t type, const uint8_t *blk, ktk_block *u);

void ktk_quantize_row(uint32_t type, const float *x, void *out, int64_t n);
void ktk_dequantize_row(uint32_t type, const void *row, float *out, int64_t n);

#endif
