/*
 * kernels/cpu/mm_isa.h — private to kernels/cpu: the matmul micro-kernels one instruction set
 * provides, and the data layouts they share with the driver (matmul.c).
 *
 * Three implementations fill the same table: mm_portable.c (plain C: the reference, and the path
 * for other CPUs), mm_avx2.c (AVX2 + FMA + F16C) and mm_avx512.c (AVX-512 F/BW/VL + VNNI). Each is
 * its own translation unit compiled with its own -m flags, so one binary carries all of them and
 * matmul.c picks one at run time from cpuid.
 *
 * Packed weights ("row groups"). A matrix is repacked once at load into groups of MM_GROUP = 16
 * consecutive rows, laid out so that one SIMD lane holds one row and a group is one sequential
 * stream. (Measured on AMD Zen 4: four interleaved row streams read at ~10 GB/s on one core, one
 * stream at ~22-28 GB/s.) Rows past the matrix end are zero.
 *   - F32 / F16 / BF16: column k of the 16 rows is 16 consecutive elements, as typed in the file.
 *   - Quantized types: block b (32 columns) of the 16 rows together —
 *       Q4_0: d[16] (f16), qs[4][16][4]                 288 bytes
 *       Q4_1: d[16] (f16), m[16] (f16), qs[4][16][4]    320 bytes
 *       Q8_0: d[16] (f16), qs[16][16][2]                544 bytes
 *     For the 4-bit types qs[k][j][i] is byte 4k+i of row j's block (low nibble: element 4k+i,
 *     high nibble: element 16+4k+i); for Q8_0 qs[p][j][i] is element 2p+i of row j.
 *
 * Activations for quantized weights (mm_xq) are quantized once per call to 16 bits per 32-element
 * block: x ~ d * q with |q| <= MM_QMAX. (8-bit activations cost the default model ~10% relative
 * logit error against a float reference; 16 bits, ~1e-3.) q is kept as int16 (Q8_0: vpmaddwd /
 * vpdpwssd) and split into two signed bytes q = 256 * hi + lo (4-bit types: vpdpbusd / vpmaddubsw
 * take the unsigned nibbles directly — two byte dots instead of widening every nibble to 16 bits).
 * MM_QMAX = 127 * 256 + 127 keeps hi within a signed byte. With 8-bit activations (kmat.act_bits
 * = 8, mm_xq.bits = 8) the same code quantizes to |q| <= 127, so hi is zero: lo holds q, hi is
 * written as zeros, and the 4-bit and K-family kernels skip the hi dots (half the vpdpbusd /
 * vpmaddubsw work; the dot and the roundings after it are the same expressions, so the paths stay
 * bit-identical across instruction sets). Q8_0 weights then take vpdpbusd too on AVX-512: the
 * weights plus 128 (unsigned) against the signed activations, less 128 * the block's sum of q
 * (mm_xq.qsum) — the same exact integer dot as the 16-bit vpdpwssd path. A block's integer dot is exact on every
 * path and is folded into the row's f32 accumulator with the same two roundings everywhere:
 * acc = fma(float(dot), d_w * d_x, acc), then acc = fma(m_w, s_x, acc) for the 4-bit types
 * (m_w = -8 d_w for Q4_0, s_x the block's float sum).
 *
 * Float weights multiply f32 activations lane-wise: each row keeps two partial sums (column k
 * goes to sum k % 2, fused multiply-add) added at the end — no horizontal reductions. So all
 * three instruction sets give bit-identical results for every type. Float matrices are worked
 * in pairs of groups (32 rows), so one activation broadcast feeds two FMAs.
 */
#ifndef OROCHI_MM_ISA_H
#define OROCHI_MM_ISA_H

#include <stddef.h>
#include <stdint.h>

#define MM_GROUP 16   /* rows per packed group (one AVX-512 lane each) */

/* Software prefetch in the tiles of MM_PF_MIN_TOK or more tokens, MM_PF_BYTES ahead of the weight
 * stream. The wide tiles do enough arithmetic per byte that the hardware prefetcher falls behind:
 * on AMD Zen 4 an F16 step of 4 tokens read 11 GB/s on one core without it and ran 1.3x faster
 * with it 4 KiB ahead. On AMD Zen 5 (a later machine) the one-token tiles gain too, and more from
 * 8 KiB ahead: decode at 1 thread F16 108 -> 121, Q8_0 215 -> 229, Q4_1 288 -> 332 tok/s, at 2
 * threads F16 191 -> 227, Q8_0 357 -> 394, Q4_1 445 -> 515 (medians of 3 interleaved A/B rounds;
 * 16 KiB ahead: between the two), while on Zen 4 the one- and two-token tiles had streamed fast
 * enough on their own. Every tile prefetches now. */
#define MM_PF_BYTES 8192
#define MM_PF_MIN_TOK 1

/* prefetch the n bytes that lie MM_PF_BYTES past p (one hint per cache line) */
static inline void mm_prefetch(const void *p, size_t n)
{
    for (size_t l = 0; l < n; l += 64)
        __builtin_prefetch((const char *)p + MM_PF_BYTES + l, 0, 3);
}
#define MM_QMAX 32639 /* largest |q| of a quantized activation: hi stays in [-128, 127] */

/* bytes of one packed block of MM_GROUP rows (quantized types) */
static inline size_t mm_group_block_bytes(uint32_t type)
{
    return type == 8 /* Q8_0 */ ? 544 : type == 3 /* Q4_1 */ ? 320 : 288;
}

/* bytes of one element of a float type (F32 4, F16 and BF16 2) */
static inline size_t mm_float_bytes(uint32_t type)
{
    return type == 0 ? 4 : 2;
}

/* The K family: Q2_K..Q6_K, Q5_0, Q5_1 and IQ4_NL, all packed from the common form of
 * ktypes_k.h (element = D * sc * (code - z) + M * mn, sc and mn per 16 elements). Per group of 16
 * rows, each super-block (S = 32 or 256 columns) is
 *     D[16] (f16), M[16] (f16)                                     64 bytes
 *   then S / 32 blocks of 32 columns ("kblocks"), each
 *     sc[nsc][16] (int8)      the scale of elements 0..15 and 16..31 (nsc = 2), of all 32
 *                             (nsc = 1), or none (nsc = 0: sc = mn = 1)
 *     mn[nsc][16] (int8)      when the type has mins
 *     qs[4][16][4]            low 4 bits of the codes, as Q4_0's qs (IQ4_NL: the grid index,
 *                             mapped to its code by a table in registers)
 *     qh[hb][16][4]           the codes' bits above 4: hb = 1: bit k of byte i is element 4k+i's
 *                             bit 4, bit 4+k element 16+4k+i's; hb = 2: plane 0 holds bits 2k,
 *                             2k+1 = element 4k+i's bits 4-5, plane 1 the same for 16+4k+i.
 * Per token and kblock the kernels take exact integer dots of the codes with the 16-bit
 * activations (first and second 16 elements apart), then, with f = D * sc and
 * o = M * mn - z * f (both exact but the one subtraction):
 *   nsc < 2:  acc = fma(float(dot0 + dot1), f * d_x, acc); acc = fma(o, s_x, acc)
 *   nsc = 2:  acc = fma(float(dot0), f0 * d_x, acc); acc = fma(float(dot1), f1 * d_x, acc);
 *             acc = fma(o0, s16_x[0], acc); acc = fma(o1, s16_x[1], acc)
 * the same operations in the same order on every instruction set. */
typedef struct {
    uint8_t kb;   /* kblocks per super-block: 1 or 8 */
    uint8_t nsc;  /* scale rows per kblock: 0, 1 or 2 */
    uint8_t mins; /* mn rows follow the scales */
    uint8_t hb;   /* high-bit planes: 0, 1 or 2 */
    uint8_t lut;  /* IQ4_NL: qs holds grid indices */
    int16_t z;    /* zero point */
} mm_kdesc;

/* The K-family layout of ggml type `type`, NULL for other types. */
static inline const mm_kdesc *mm_kdesc_of(uint32_t type)
{
    static const mm_kdesc Q5_0 = {1, 0, 0, 1, 0, 16}, Q5_1 = {1, 0, 0, 1, 0, 0},
                          IQ4NL = {1, 0, 0, 0, 1, 128}, Q2K = {8, 2, 1, 0, 0, 0},
                          Q3K = {8, 2, 0, 0, 0, 4}, Q4K = {8, 1, 1, 0, 0, 0},
                          Q5K = {8, 1, 1, 1, 0, 0}, Q6K = {8, 2, 0, 2, 0, 32};
    switch (type) {
    case 6: return &Q5_0;
    case 7: return &Q5_1;
    case 20: return &IQ4NL;
    case 10: return &Q2K;
    case 11: return &Q3K;
    case 12: return &Q4K;
    case 13: return &Q5K;
    case 14: return &Q6K;
    default: return NULL;
    }
}

#define MM_KHDR 64 /* bytes of a packed super-block's D and M */

/* bytes of one packed kblock (16 rows x 32 columns, without the super-block header) */
static inline size_t mm_kblock_bytes(const mm_kdesc *k)
{
    return (size_t)k->nsc * 16 * (1 + k->mins) + 256 + (size_t)k->hb * 64;
}

/* bytes of one packed super-block of 16 rows */
static inline size_t mm_ksuper_bytes(const mm_kdesc *k)
{
    return MM_KHDR + (size_t)k->kb * mm_kblock_bytes(k);
}

/* The quantized activations of nt tokens, nb blocks each: token t's block b at index
 * mm_xb(xq, t, b) = t * nb + b (its 32 values at 32 times that). Token-major: a tile reads one
 * sequential stream per token, which measured faster than block-major (the tile's tokens side by
 * side: 8% slower at 32 tokens, AMD Zen 5). */
typedef struct {
    int16_t *q; /* [t][k] */
    int8_t *lo; /* [t][k] low byte of q (signed) */
    int8_t *hi; /* [t][k] (q - lo) / 256 */
    float *d;   /* [t][b] block scale */
    float *s;   /* [t][b] exact sum of the block's float activations (offset term) */
    float *s16; /* [t][b][2] sums of its first and second 16 activations (K family) */
    int32_t *qsum; /* [t][b] sum of the block's q (8-bit activations only) */
    int64_t nb;
    int nt;   /* tokens */
    int bits; /* 16, or 8: |q| <= 127 and hi all zero */
} mm_xq;

static inline size_t mm_xb(const mm_xq *xq, int t, int64_t b)
{
    return (size_t)t * (size_t)xq->nb + (size_t)b;
}

#define MM_QMAX8 127 /* largest |q| of an 8-bit activation */

typedef struct {
    const char *name;
    /* One packed group (MM_GROUP rows) of a Q4_0 / Q4_1 / Q8_0 matrix times n_tok
     * tokens: out[t * MM_GROUP + j] = row j . token t. */
    void (*qgroup)(uint32_t type, const uint8_t *pk, const mm_xq *xq, int n_tok, float *out);
    /* The same for one packed group of a K-family matrix (layout k). */
    void (*kgroup)(const mm_kdesc *k, const uint8_t *pk, const mm_xq *xq, int n_tok, float *out);
    /* ng (1 or 2) adjacent packed groups (gbytes apart) of an F32 / F16 / BF16 matrix with cols
     * columns times n_tok tokens of x (row-major f32, cols each): out[t * 16 ng + 16 g + j]. */
    void (*fgroup)(uint32_t type, const uint8_t *pk, int ng, size_t gbytes, int64_t cols,
                   const float *x, int n_tok, float *out);
} mm_isa;

extern const mm_isa mm_isa_portable;
#if defined(__x86_64__)
extern const mm_isa mm_isa_avx2;
extern const mm_isa mm_isa_avx512;
#endif

#endif
