/*
 * kernels/cuda/kcuda_internal.h — what the GPU op set's source files share: the context, warp
 * reductions, and the element reader of every type the GPU takes (GGUF block layouts, as
 * kernels/cpu/types.c reads them).
 */
#ifndef OROCHI_KCUDA_INTERNAL_H
#define OROCHI_KCUDA_INTERNAL_H

#include <time.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/kcuda.h"
#include "kernels/cuda/kcuda_check.h"

struct kcuda {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *scratch; /* the 16-bit activations of a cuBLAS matmul or of the tensor cores' fragments */
    size_t scratch_bytes;
    void *blas_ws; /* cuBLAS's workspace, set once so that a captured matmul allocates nothing */
    bool capturing;
    bool captured; /* a graph was recorded: the scratch no longer moves (kcuda_scratch) */
    long launches; /* ops queued (kcuda_launches) */
    int unroll;    /* quantized matmul: groups a lane loads before adding, 0 by the step
                      (kcuda_set_matmul_unroll) */
    int mm_kind;   /* quantized matmul: KCUDA_MM_* (kcuda_set_matmul_kind) */
    int frag;      /* tensor-core matmul's inputs: KCUDA_FRAG_* (kcuda_set_matmul_frag) */
    int groups;    /* tensor-core matmul's token groups as set (kcuda_set_matmul_groups) */
    int sms;         /* the device's multiprocessors (kcuda_att_parts) */
    int att_keys;    /* keys an attention warp scores at a time (kcuda_set_att_keys) */
    int att_tile;    /* attention by tiles: KCUDA_TILE_* (kcuda_set_att_tile) */
    float *att_part; /* attention's part records, KCUDA_ATT_PART_FLOATS (NULL: streams not cut) */
};

/* Seconds on the monotonic clock (the op set's timings: copy bandwidth, the tensor cores' rate). */
static inline double kcuda_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* -1 with "what: cuda's reason" in err unless e is cudaSuccess. */
int kcuda_fail(cudaError_t e, const char *what, char *err, size_t errlen);
/* The context's scratch, at least `bytes` (NULL when that cannot be had). */
void *kcuda_scratch(kcuda *g, size_t bytes);

__device__ static inline float kcuda_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static inline double kcuda_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ static inline float kcuda_half(const uint8_t *p)
{
    return __half2float(*(const __half *)p);
}

/* silu(g) * u, as k_silu_mul computes it: the silu*mul op and the fused gate/up matmul share it. */
__device__ static inline float kcuda_silu_mul1(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

/* Two bytes; four bytes at a 2-aligned address: one load where the address is 4-aligned, else
 * two 2-byte loads (the blocks of several types are only 2-aligned; a warp's lanes mostly share
 * the address's parity, so the branch is mostly uniform). */
__device__ static inline uint32_t kcuda_u16(const uint8_t *p)
{
    return *(const uint16_t *)p;
}
__device__ static inline uint32_t kcuda_u32h(const uint8_t *p)
{
    if (((uintptr_t)p & 3) == 0)
        return *(const uint32_t *)p;
    return kcuda_u16(p) | kcuda_u16(p + 2) << 16;
}
/* Eight bytes at a 2-aligned address into v[0] (the first four) and v[1]: two 4-byte loads where
 * it is 4-aligned, else a 2-byte, a 4-byte and a 2-byte one (none past the 8 bytes). */
__device__ static inline void kcuda_u64h(const uint8_t *p, uint32_t v[2])
{
    if (((uintptr_t)p & 3) == 0) {
        v[0] = *(const uint32_t *)p;
        v[1] = *(const uint32_t *)(p + 4);
        return;
    }
    uint32_t m = *(const uint32_t *)(p + 2);
    v[0] = kcuda_u16(p) | m << 16;
    v[1] = m >> 16 | kcuda_u16(p + 6) << 16;
}
/* Four bytes at a 4-aligned address. */
__device__ static inline uint32_t kcuda_u32(const uint8_t *p)
{
    return *(const uint32_t *)p;
}

/* IQ4_NL's 16 levels (KTK_IQ4NL) as the bytes of two constants: no table in memory. */
__device__ static inline float kcuda_iq4nl(uint32_t code)
{
    const uint64_t lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull;
    return (float)(int8_t)((code < 8 ? lo : hi) >> (8 * (code & 7)));
}

/* The f16 number whose bits are the low 16 of v. */
__device__ static inline float kcuda_half_bits(uint32_t v)
{
    return __half2float(__ushort_as_half((unsigned short)(v & 0xffff)));
}

/* Sub-block j (0..7) of the 6-bit scales and mins of Q4_K / Q5_K (ktk_scale_min): with the 12
 * bytes as the words s[0..2] and sh = 8 (j mod 4), sub-blocks 0..3 take the low 6 bits of byte j
 * of s[0] (scale) and s[1] (min); 4..7 the nibbles of byte j - 4 of s[2] with the top 2 bits of
 * the same bytes of s[0] and s[1] above them. Shifts and one select, no branch nor byte indexing:
 * the same values as reading the bytes one by one, in fewer instructions. */
__device__ static inline void kcuda_scale_min(const uint32_t s[3], int j, float *sc, float *mn)
{
    uint32_t sh = 8u * (uint32_t)(j & 3), a = s[0] >> sh, b = s[1] >> sh, c = s[2] >> sh;
    bool lo = j < 4;
    uint32_t scv = lo ? a & 63 : (c & 15) | ((a >> 2) & 48);
    uint32_t mnv = lo ? b & 63 : ((c >> 4) & 15) | ((b >> 2) & 48);
    *sc = (float)scv;
    *mn = (float)mnv;
}

/* The quantized types: the matmul reads them by groups of 8 weights (kcuda_group). */
__host__ __device__ static inline bool kcuda_quant(uint32_t t)
{
    return t != KT_F32 && t != KT_F16 && t != KT_BF16;
}

/* Where the inputs of lane `sub`'s (0..3) 8 weights of a 32-column block lie (kcuda_group): the
 * first 4 from column *a of the block, the last 4 from *bo. The same for every block of a type. */
template <uint32_t TYPE>
__host__ __device__ static inline void kcuda_group_cols(int sub, int *a, int *bo)
{
    if (TYPE == KT_Q4_1 || TYPE == KT_Q4_0 || TYPE == KT_Q5_0 || TYPE == KT_Q5_1 ||
        TYPE == KT_IQ4_NL) {
        *a = 4 * sub;
        *bo = 16 + 4 * sub;
    } else {
        *a = 8 * sub;
        *bo = 8 * sub + 4;
    }
}

/* The 8 weights lane `sub` (0..3) of a row's 32-column block b takes, and where their inputs lie:
 * w[0..3] multiply the 4 inputs from column *a of the block, w[4..7] the 4 from *bo (the layouts
 * are kernels/cpu/ktypes_k.c's and types.c's).
 *  - 32-blocks with 4-bit codes (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): the 4 quant bytes 4*sub..; their
 *    low nibbles are columns 4*sub.., their high ones 16 + 4*sub..;
 *  - Q8_0: the 8 quants 8*sub..;
 *  - the K-quants: block b is sub-block b % 8 of super-block b / 8, and the lane takes its
 *    columns 8*sub .. 8*sub + 7, wherever the format keeps their bits.
 * So the 4 lanes of a block read its quants as one run of bytes and its inputs as one run of
 * floats, and 32 lanes (8 blocks) cover one K super-block. */
template <uint32_t TYPE>
__device__ static inline void kcuda_group(const uint8_t *row, int64_t b, int sub, float w[8], int *a,
                                          int *bo)
{
    if (TYPE == KT_Q4_1 || TYPE == KT_Q4_0 || TYPE == KT_Q5_0 || TYPE == KT_Q5_1 ||
        TYPE == KT_IQ4_NL) {
        const int bytes = TYPE == KT_Q4_1 ? 20 : TYPE == KT_Q5_0 ? 22 : TYPE == KT_Q5_1 ? 24 : 18;
        const int qs = TYPE == KT_Q4_1 ? 4 : TYPE == KT_Q5_0 ? 6 : TYPE == KT_Q5_1 ? 8 : 2;
        const uint8_t *q = row + (size_t)b * bytes;
        float d = kcuda_half(q), m = 0.0f;
        if (TYPE == KT_Q4_1 || TYPE == KT_Q5_1)
            m = kcuda_half(q + 2);
        /* Q4_1's and Q5_1's blocks are 4-aligned: one 4-byte load */
        const bool al = bytes % 4 == 0;
        uint32_t v = al ? *(const uint32_t *)(q + qs + 4 * sub) : kcuda_u32h(q + qs + 4 * sub);
        uint32_t h = 0;
        if (TYPE == KT_Q5_0 || TYPE == KT_Q5_1)
            h = al ? *(const uint32_t *)(q + qs - 4) : kcuda_u32h(q + qs - 4);
        for (int i = 0; i < 4; i++) {
            uint32_t lo = (v >> (8 * i)) & 0xf, hi = (v >> (8 * i + 4)) & 0xf;
            lo |= ((h >> (4 * sub + i)) & 1) << 4;
            hi |= ((h >> (16 + 4 * sub + i)) & 1) << 4;
            if (TYPE == KT_Q4_1 || TYPE == KT_Q5_1) {
                w[i] = d * (float)lo + m;
                w[4 + i] = d * (float)hi + m;
            } else if (TYPE == KT_IQ4_NL) {
                w[i] = d * kcuda_iq4nl(lo);
                w[4 + i] = d * kcuda_iq4nl(hi);
            } else {
                const int z = TYPE == KT_Q4_0 ? 8 : 16;
                w[i] = d * (float)((int)lo - z);
                w[4 + i] = d * (float)((int)hi - z);
            }
        }
        kcuda_group_cols<TYPE>(sub, a, bo);
        return;
    }
    if (TYPE == KT_Q8_0) {
        const uint8_t *q = row + (size_t)b * 34;
        float d = kcuda_half(q);
        uint32_t v[2]; /* 34-byte blocks: 2-aligned */
        kcuda_u64h(q + 2 + 8 * sub, v);
        /* each quant sign-extended to 32 bits by two shifts, then converted: the float pipe's
         * I2FP (a conversion from an 8-bit type runs on the slower conversion pipe, I2F.S8) */
        for (int i = 0; i < 8; i++)
            w[i] = d * (float)((int32_t)(v[i >> 2] << (24 - 8 * (i & 3))) >> 24);
        kcuda_group_cols<TYPE>(sub, a, bo);
        return;
    }
    /* the K-quants */
    int64_t S = b >> 3;
    int j = (int)(b & 7), n = j >> 2, jj = j & 3;
    kcuda_group_cols<TYPE>(sub, a, bo);
    if (TYPE == KT_Q4_K || TYPE == KT_Q5_K) {
        /* d, dmin, scales[12], (Q5_K: qh[32]), qs[128]: sub-block 2p + h is the nibble h of
         * qs[32p + l], Q5_K's fifth bit bit j of qh[l] */
        /* 144- and 176-byte super-blocks, 16-aligned (kcuda_check_matmul: a row starts so): the
         * 16 bytes of d, dmin and the scales in one load, the lane's 8 quant bytes (and 8 qh
         * bytes) in one each */
        const uint8_t *q = row + (size_t)S * (TYPE == KT_Q4_K ? 144 : 176);
        uint4 hd = *(const uint4 *)q;
        const uint32_t s12[3] = {hd.y, hd.z, hd.w};
        float sc, mn;
        kcuda_scale_min(s12, j, &sc, &mn);
        float ds = kcuda_half_bits(hd.x) * sc, dm = kcuda_half_bits(hd.x >> 16) * mn;
        const uint8_t *qs = q + (TYPE == KT_Q4_K ? 16 : 48) + 32 * (j >> 1) + 8 * sub;
        uint2 qv = *(const uint2 *)qs;
        uint32_t v[2] = {qv.x, qv.y}, h[2] = {0, 0};
        if (TYPE == KT_Q5_K) {
            uint2 hv = *(const uint2 *)(q + 16 + 8 * sub);
            h[0] = hv.x;
            h[1] = hv.y;
        }
        /* the 4 codes of a word at once (each nibble, and Q5_K's bit j above it, in its own
         * byte), then each at its fixed place, masked to its 5 bits: so converted on the float
         * pipe (I2FP), where a whole byte would go to the conversion pipe (I2F.U8, an eighth of
         * the rate; bench/sass_mix.py counts them) */
        int sh = 4 * (j & 1);
        for (int k = 0; k < 2; k++) {
            uint32_t c4 = (v[k] >> sh) & 0x0F0F0F0Fu;
            if (TYPE == KT_Q5_K)
                c4 |= ((h[k] >> j) & 0x01010101u) << 4;
            for (int i = 0; i < 4; i++)
                w[4 * k + i] = ds * (float)(int32_t)((c4 >> (8 * i)) & 0x1f) - dm;
        }
        return;
    }
    if (TYPE == KT_Q6_K) {
        /* ql[128], qh[64], scales[16] (int8), d; sub-block j = 4n + jj: the low 4 bits in
         * ql[64n + 32 (jj & 1) + l] (nibble jj >> 1), the high 2 in qh[32n + l] (bits 2 jj) */
        const uint8_t *q = row + (size_t)S * 210;
        float ds = kcuda_half(q + 208) * (float)(int8_t)q[192 + 8 * n + 2 * jj + (sub >> 1)];
        const uint8_t *ql = q + 64 * n + 32 * (jj & 1) + 8 * sub, *qh = q + 128 + 32 * n + 8 * sub;
        int sh = 4 * (jj >> 1);
        uint32_t Lv[2], Hv[2];
        kcuda_u64h(ql, Lv);
        kcuda_u64h(qh, Hv);
        for (int k = 0; k < 2; k++) {
            /* the 4 codes of a word at once (low nibble and high 2 bits in their byte), then
             * each at its fixed place, masked to its 6 bits (as Q4_K's: bench/sass_mix.py) */
            uint32_t c4 = ((Lv[k] >> sh) & 0x0F0F0F0Fu) | ((Hv[k] >> (2 * jj)) & 0x03030303u) << 4;
            for (int i = 0; i < 4; i++)
                w[4 * k + i] = ds * (float)((int)((c4 >> (8 * i)) & 0x3f) - 32);
        }
        return;
    }
    /* Q2_K (scales[16], qs[64], d, dmin) and Q3_K (hmask[32], qs[64], scales[12], d): sub-block
     * j = 4n + jj is bits 2 jj of qs[32n + l], its scale 8n + 2jj + l / 16; Q3_K's third bit is bit
     * 4n + jj of hmask[l] */
    const bool q3 = TYPE == KT_Q3_K;
    const uint8_t *q = row + (size_t)S * (q3 ? 110 : 84);
    int s = 8 * n + 2 * jj + (sub >> 1);
    float ds, dm = 0.0f;
    if (q3) {
        const uint8_t *s12 = q + 96;
        int lo = (s12[s % 8] >> (4 * (s / 8))) & 15, hi = (s12[8 + s % 4] >> (2 * (s / 4))) & 3;
        ds = kcuda_half(q + 108) * (float)((lo | hi << 4) - 32);
    } else {
        ds = kcuda_half(q + 80) * (float)(q[s] & 15);
        dm = kcuda_half(q + 82) * (float)(q[s] >> 4);
    }
    const uint8_t *qs = q + (q3 ? 32 : 16) + 32 * n + 8 * sub;
    /* the lane's 8 quant bytes (and Q3_K's 8 hmask bytes): Q2_K's 84-byte super-blocks are
     * 4-aligned, Q3_K's 110-byte ones 2-aligned */
    uint32_t v[2], H[2] = {0, 0};
    if (q3) {
        kcuda_u64h(qs, v);
        kcuda_u64h(q + 8 * sub, H);
    } else {
        v[0] = kcuda_u32(qs);
        v[1] = kcuda_u32(qs + 4);
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) {
            int c = (int)((v[k] >> (8 * i + 2 * jj)) & 3);
            if (q3)
                c += 4 * (int)((H[k] >> (8 * i + 4 * n + jj)) & 1) - 4;
            w[4 * k + i] = ds * (float)c - dm;
        }
}

/* Element c of a quantized row, through the lane of its block that holds it. */
template <uint32_t TYPE>
__device__ static inline float kcuda_elem(const uint8_t *row, int64_t c)
{
    int e = (int)(c % 32), a, bo, sub = TYPE >= KT_Q2_K && TYPE <= KT_Q6_K ? e / 8 : (e % 16) / 4;
    if (TYPE == KT_Q8_0)
        sub = e / 8;
    float w[8];
    kcuda_group<TYPE>(row, c / 32, sub, w, &a, &bo);
    return e - a >= 0 && e - a < 4 ? w[e - a] : w[4 + e - bo];
}

/* Element c of a GGUF row of `type` (the types kcuda_type_ok accepts). */
__device__ static inline float kcuda_dequant(uint32_t type, const uint8_t *row, int64_t c)
{
    switch (type) {
    case KT_F32: return ((const float *)row)[c];
    case KT_F16: return __half2float(((const __half *)row)[c]);
    case KT_BF16: return __bfloat162float(((const __nv_bfloat16 *)row)[c]);
    case KT_Q8_0: return kcuda_elem<KT_Q8_0>(row, c);
    case KT_Q4_0: return kcuda_elem<KT_Q4_0>(row, c);
    case KT_Q4_1: return kcuda_elem<KT_Q4_1>(row, c);
    case KT_Q5_0: return kcuda_elem<KT_Q5_0>(row, c);
    case KT_Q5_1: return kcuda_elem<KT_Q5_1>(row, c);
    case KT_IQ4_NL: return kcuda_elem<KT_IQ4_NL>(row, c);
    case KT_Q2_K: return kcuda_elem<KT_Q2_K>(row, c);
    case KT_Q3_K: return kcuda_elem<KT_Q3_K>(row, c);
    case KT_Q4_K: return kcuda_elem<KT_Q4_K>(row, c);
    case KT_Q5_K: return kcuda_elem<KT_Q5_K>(row, c);
    case KT_Q6_K: return kcuda_elem<KT_Q6_K>(row, c);
    default: return 0.0f;
    }
}

#endif
