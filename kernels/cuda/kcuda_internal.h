/*
 * kernels/cuda/kcuda_internal.h — what the GPU op set's source files share: the context, warp
 * reductions, and the element reader of every type the GPU takes (GGUF block layouts, as
 * kernels/cpu/types.c reads them).
 */
#ifndef OROCHI_KCUDA_INTERNAL_H
#define OROCHI_KCUDA_INTERNAL_H

#include <string.h>
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
    int depth;     /* tensor-core matmul's blocks in flight a warp, one-tile passes: 0, 4 or 8
                      (kcuda_set_matmul_depth) */
    bool early;    /* tensor-core matmul launched early (kcuda_set_matmul_early) */
    int resident8[32][3][2]; /* blocks of the 8-deep k_mma<type, op, 1, 8, 1, frag> one
                                multiprocessor holds (-1: not yet asked) */
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

/* Programmatic dependent launch (sm_90; kcuda_set_matmul_early). kcuda_let_next_start: the next
 * kernel of the stream, where it was launched so, may start before this one finishes (a hint; no
 * effect on what either computes). kcuda_wait_prior: wait until the kernels before this one have
 * finished and their writes show — a kernel launched early must call it before it reads anything
 * they write, or writes anything they read. Both return at once where no launch asked for it,
 * and over the emulation, which runs a stream's kernels one after another. */
__device__ static inline void kcuda_let_next_start(void)
{
#if !defined(OROCHI_KEMU_H) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ static inline void kcuda_wait_prior(void)
{
#if !defined(OROCHI_KEMU_H) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Bring the 128-byte line at p into L2 (a hint; nothing over the emulation). */
__device__ static inline void kcuda_prefetch_l2(const void *p)
{
#ifndef OROCHI_KEMU_H
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#else
    (void)p;
#endif
}

/* The warp's xor butterfly over each of a lane's N values: at each step o = 16, 8, 4, 2, 1,
 * v[k] = op(v[k], v[k] of lane ^ o). On a device 5 shuffles a value; over the emulation one
 * meeting of the warp (kemu_warp_gather) and then the steps' sums this lane's result is made of,
 * the same operands in the same order: the same bits, without a meeting a shuffle. */
template <int N, typename T, typename Op>
__device__ static inline void kcuda_warp_butterfly(T (&v)[N], const Op &op)
{
#ifdef OROCHI_KEMU_H
    /* step o needs the lanes j = this lane ^ m (m < o) only, whose partners j ^ o it leaves */
    T x[32][N];
    kemu_warp_gather(0xffffffffu, v, sizeof v, x);
    const int me = threadIdx.x & 31;
    for (int o = 16; o > 0; o >>= 1)
        for (int m = 0; m < o; m++) {
            const int j = (me & ~(o - 1)) | m;
            for (int k = 0; k < N; k++)
                x[j][k] = op(x[j][k], x[j ^ o][k]);
        }
    memcpy(v, x[me], sizeof v);
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int k = 0; k < N; k++)
            v[k] = op(v[k], __shfl_xor_sync(0xffffffffu, v[k], o));
#endif
}

template <typename T>
__device__ static inline T kcuda_warp_sum_t(T v)
{
    T a[1] = {v};
    kcuda_warp_butterfly(a, [](T x, T y) { return x + y; });
    return a[0];
}

__device__ static inline float kcuda_warp_sum(float v)
{
    return kcuda_warp_sum_t(v);
}

__device__ static inline double kcuda_warp_sum_d(double v)
{
    return kcuda_warp_sum_t(v);
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

/* IQ4_NL's levels (KTK_IQ4NL) of the 8 codes of a lane's quant word v, whose nibbles run lo0, hi0,
 * lo1, hi1 (its low half), lo2, hi2, lo3, hi3 — w0..w3 the low nibbles, w4..w7 the high ones: L[0]
 * the levels as signed bytes (w0, w4, w1, w5), L[1] (w2, w6, w3, w7). No table in memory: levels
 * 0-7 and 8-15 are the bytes of two 64-bit constants, and three byte permutations a half word of
 * codes look them up — the codes' low 3 bits pick among levels 0-7 and among 8-15, their bit 3
 * (moved to bit 2 of the last selector) between the two. No selector nibble has its bit 3 set
 * (PRMT's sign mode on the device). */
__device__ static inline void kcuda_iq4nl_levels(uint32_t v, uint32_t L[2])
{
    const uint64_t lo = 0xF6EADDCFBFAD9881ull, hi = 0x7159453526190D01ull;
    const uint32_t s = v & 0x77777777u, pick = 0x32103210u | ((v >> 1) & 0x44444444u);
    for (int k = 0; k < 2; k++) {
        const uint32_t sk = s >> 16 * k;
        L[k] = __byte_perm(__byte_perm((uint32_t)lo, (uint32_t)(lo >> 32), sk),
                           __byte_perm((uint32_t)hi, (uint32_t)(hi >> 32), sk), pick >> 16 * k);
    }
}

/* The f32 number whose bits are v. */
__device__ static inline float kcuda_f32_bits(uint32_t v)
{
    float f;
    memcpy(&f, &v, 4);
    return f;
}

/* The f16 number whose bits are the low 16 of v. */
__device__ static inline float kcuda_half_bits(uint32_t v)
{
    return __half2float(__ushort_as_half((unsigned short)(v & 0xffff)));
}

/* Sub-block j (0..7) of the 6-bit scales and mins of Q4_K / Q5_K (ktk_scale_min), from the 12
 * bytes as the words s[0..2], as one word: the scale in its low half, the min in its high half.
 * Sub-blocks 0..3 take the low 6 bits of byte j of s[0] (scale) and s[1] (min); 4..7 the nibbles of
 * byte j - 4 of s[2] (low: scale, high: min) with the top 2 bits of the same bytes of s[0] and s[1]
 * above them. One byte permutation puts byte j mod 4 of s[0] and of s[1] into the two halves, one
 * more those of s[2] and of s[2] >> 4; then, with the lane's constants (kcuda_place_of: sel the
 * permutation; sha 0, or 2 to bring the top 2 bits to bits 4-5; ma 0x003F003F or 0x00300030; mc 0
 * or 0x000F000F), a shift and two logic operations make both halves at once. */
__device__ static inline uint32_t kcuda_scale_min(const uint32_t s[3], uint32_t sel, uint32_t sha,
                                                  uint32_t ma, uint32_t mc)
{
    const uint32_t x = __byte_perm(s[0], s[1], sel), y = __byte_perm(s[2], s[2] >> 4, sel);
    return ((x >> sha) & ma) | (y & mc);
}

/* The quantized types: the matmul reads them by groups of 8 weights (kcuda_group). */
__host__ __device__ static inline bool kcuda_quant(uint32_t t)
{
    return t != KT_F32 && t != KT_F16 && t != KT_BF16;
}

/* Bytes of 256 columns of a quantized row (a span): 8 blocks of 32, or one K super-block. */
template <uint32_t TYPE>
__host__ __device__ constexpr int kcuda_span_bytes()
{
    return TYPE == KT_Q4_0 || TYPE == KT_IQ4_NL ? 8 * 18
           : TYPE == KT_Q4_1                    ? 8 * 20
           : TYPE == KT_Q5_0                    ? 8 * 22
           : TYPE == KT_Q5_1                    ? 8 * 24
           : TYPE == KT_Q8_0                    ? 8 * 34
           : TYPE == KT_Q2_K                    ? 84
           : TYPE == KT_Q3_K                    ? 110
           : TYPE == KT_Q4_K                    ? 144
           : TYPE == KT_Q5_K                    ? 176
                                                : 210; /* Q6_K */
}

/* The 32-blocks with 4-bit codes and a 2-byte d first (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL). */
template <uint32_t TYPE>
__host__ __device__ constexpr bool kcuda_b32()
{
    return TYPE == KT_Q4_0 || TYPE == KT_Q4_1 || TYPE == KT_Q5_0 || TYPE == KT_Q5_1 ||
           TYPE == KT_IQ4_NL;
}

/* Where the inputs of lane `sub`'s (0..3) 8 weights of a 32-column block lie (kcuda_group): the
 * first 4 from column *a of the block, the last 4 from *bo. The same for every block of a type. */
template <uint32_t TYPE>
__host__ __device__ static inline void kcuda_group_cols(int sub, int *a, int *bo)
{
    if (kcuda_b32<TYPE>()) {
        *a = 4 * sub;
        *bo = 16 + 4 * sub;
    } else {
        *a = 8 * sub;
        *bo = 8 * sub + 4;
    }
}

/* A lane's place in the blocks it reads: block j = b mod 8 of its 256-column span, its group
 * `sub` (0..3). Both matmuls walk a row by blocks b, b + 8, b + 16, ... (a warp's 8 blocks a span,
 * or a tile's 8 warps), so a lane's place never changes on its walk: worked out once
 * (kcuda_place_of), then each block is only its span's address (kcuda_group_at). Byte offsets are
 * from the span's start; the fields a type does not use are 0.
 *  - off: the 32-column block's bytes (32-blocks: j times their size; the K-quants: 0);
 *  - qs, hs: the lane's quant bytes and high-bit bytes (Q5_0/Q5_1's qh word, Q5_K's qh, Q6_K's qh,
 *    Q3_K's hmask);
 *  - sc, sc2: Q6_K's, Q2_K's scale byte; Q3_K's two scale bytes;
 *  - sh: the codes' shift in their bytes; hsh: the high bits' (32-blocks: 4 sub);
 *  - ssh, ssh2: Q4_K/Q5_K: sel and sha of kcuda_scale_min; Q3_K: the scales' shifts in their two
 *    bytes; ma, mc: Q4_K/Q5_K's masks (kcuda_scale_min). */
struct kcuda_place {
    int off, qs, hs, sc, sc2;
    uint32_t sh, hsh, ssh, ssh2, ma, mc;
};

template <uint32_t TYPE>
__device__ static inline kcuda_place kcuda_place_of(int j, int sub)
{
    kcuda_place P = {0, 0, 0, 0, 0, 0u, 0u, 0u, 0u, 0u, 0u};
    const int n = j >> 2, jj = j & 3;
    if (kcuda_b32<TYPE>() || TYPE == KT_Q8_0) {
        const int bytes = kcuda_span_bytes<TYPE>() / 8;
        /* the quants follow d (and m, and Q5's 4 qh bytes): a lane's 4 bytes, Q8_0's 8 */
        const int q0 = TYPE == KT_Q4_1 ? 4 : TYPE == KT_Q5_0 ? 6 : TYPE == KT_Q5_1 ? 8 : 2;
        P.off = j * bytes;
        P.qs = P.off + q0 + (TYPE == KT_Q8_0 ? 8 : 4) * sub;
        P.hs = P.off + q0 - 4;
        P.hsh = 4u * (uint32_t)sub;
    } else if (TYPE == KT_Q4_K || TYPE == KT_Q5_K) {
        /* d, dmin, scales[12], (Q5_K: qh[32]), qs[128]: sub-block 2p + h is the nibble h of
         * qs[32p + l], Q5_K's fifth bit bit j of qh[l] */
        P.qs = (TYPE == KT_Q4_K ? 16 : 48) + 32 * (j >> 1) + 8 * sub;
        P.hs = 16 + 8 * sub;
        P.sh = 4u * (uint32_t)(j & 1);
        P.hsh = (uint32_t)j;
        P.ssh = (uint32_t)jj | (uint32_t)(4 + jj) << 8; /* bytes jj of two words: halves 0, 1 */
        P.ssh2 = j < 4 ? 0u : 2u;
        P.ma = j < 4 ? 0x003F003Fu : 0x00300030u;
        P.mc = j < 4 ? 0u : 0x000F000Fu;
    } else if (TYPE == KT_Q6_K) {
        /* ql[128], qh[64], scales[16] (int8), d; sub-block j = 4n + jj: the low 4 bits in
         * ql[64n + 32 (jj & 1) + l] (nibble jj >> 1), the high 2 in qh[32n + l] (bits 2 jj) */
        P.qs = 64 * n + 32 * (jj & 1) + 8 * sub;
        P.hs = 128 + 32 * n + 8 * sub;
        P.sc = 192 + 8 * n + 2 * jj + (sub >> 1);
        P.sh = 4u * (uint32_t)(jj >> 1);
        P.hsh = 2u * (uint32_t)jj;
    } else {
        /* Q2_K (scales[16], qs[64], d, dmin) and Q3_K (hmask[32], qs[64], scales[12], d):
         * sub-block j = 4n + jj is bits 2 jj of qs[32n + l], its scale s = 8n + 2jj + l / 16;
         * Q3_K's third bit is bit 4n + jj of hmask[l], its scale the nibble s / 8 of byte s mod 8
         * of the 12 with the 2 bits s / 4 of byte 8 + s mod 4 above it */
        const bool q3 = TYPE == KT_Q3_K;
        const int s = 8 * n + 2 * jj + (sub >> 1);
        P.qs = (q3 ? 32 : 16) + 32 * n + 8 * sub;
        P.hs = 8 * sub;
        P.sh = 2u * (uint32_t)jj;
        P.hsh = (uint32_t)(4 * n + jj);
        P.sc = q3 ? 96 + s % 8 : s;
        P.sc2 = 104 + s % 4;
        P.ssh = 4u * (uint32_t)(s / 8);
        P.ssh2 = 2u * (uint32_t)(s / 4);
    }
    return P;
}

/* The K-quants whose weights subtract a min (d sc c - dmin mn): Q4_K, Q5_K, Q2_K. */
template <uint32_t TYPE>
__host__ __device__ constexpr bool kcuda_kmin()
{
    return TYPE == KT_Q4_K || TYPE == KT_Q5_K || TYPE == KT_Q2_K;
}

/* A K-quant lane's block at place P, as the format keeps it, for both matmuls' readers (the f32
 * weights of kcuda_group_at, the tensor cores' f16 pairs of km_group_h2):
 *  - c[0], c[1]: its 8 codes a byte each (byte i of c[k] is column 8 sub + 4k + i), the type's
 *    offset not taken off (Q6_K's 32, Q3_K's 4). Q4_K's bytes keep the other sub-block's nibble
 *    above the code: each reader masks it with the mask it applies anyway;
 *  - d: the super-block's f16 d in the low half, dmin in the high half (kcuda_kmin types);
 *  - sc, mn: the sub-block's integer scale and min (Q6_K's and Q3_K's signed; no min); for the
 *    kcuda_kmin types also scm, the two as one word (the scale in the low half, the min in the high
 *    half), of which sc and mn are made (a reader that takes scm alone converts neither).
 * The weights are d sc (c - offset) - dmin mn. Loads: Q4_K/Q5_K's 144- and 176-byte super-blocks
 * are 16-aligned (kcuda_check_matmul: a row starts so), so d, dmin and the 12 scale bytes come in
 * one load, the lane's 8 quant bytes (and Q5_K's 8 qh bytes) in one each; Q2_K's 84-byte ones
 * are 4-aligned, Q3_K's 110 and Q6_K's 210 2-aligned (kcuda_u64h). */
struct kcuda_kblock {
    uint32_t c[2];
    uint32_t d, scm;
    float sc, mn;
};

template <uint32_t TYPE>
__device__ static inline kcuda_kblock kcuda_kblock_at(const uint8_t *span, const kcuda_place &P)
{
    kcuda_kblock B = {{0u, 0u}, 0u, 0u, 0.0f, 0.0f};
    if (TYPE == KT_Q4_K || TYPE == KT_Q5_K) {
        const uint4 hd = *(const uint4 *)span;
        const uint32_t s12[3] = {hd.y, hd.z, hd.w};
        B.scm = kcuda_scale_min(s12, P.ssh, P.ssh2, P.ma, P.mc);
        B.d = hd.x;
        const uint2 qv = *(const uint2 *)(span + P.qs);
        uint2 hv = {0u, 0u};
        if (TYPE == KT_Q5_K)
            hv = *(const uint2 *)(span + P.hs);
        const uint32_t v[2] = {qv.x, qv.y}, h[2] = {hv.x, hv.y};
        for (int k = 0; k < 2; k++) {
            B.c[k] = v[k] >> P.sh;
            if (TYPE == KT_Q5_K)
                B.c[k] = (B.c[k] & 0x0F0F0F0Fu) | ((h[k] >> P.hsh) & 0x01010101u) << 4;
        }
    } else if (TYPE == KT_Q2_K) {
        /* scales[16], qs[64], d, dmin: the 2 bits of each byte, a 4-bit scale and min */
        const uint32_t sb = span[P.sc];
        B.scm = (sb & 15u) | (sb >> 4) << 16;
        B.d = kcuda_u32(span + 80);
        for (int k = 0; k < 2; k++)
            B.c[k] = (kcuda_u32(span + P.qs + 4 * k) >> P.sh) & 0x03030303u;
    } else {
        /* Q6_K and Q3_K: the low bits of each byte of one 8-byte run (Q6_K's 4 of ql, Q3_K's 2
         * of qs) with the high ones of another above them (Q6_K's 2 of qh, Q3_K's hmask bit),
         * 4 at a time; a signed scale (Q6_K's int8: one conversion of a loaded byte, I2F.S8,
         * whatever its spelling; Q3_K's assembled from two bytes) */
        const bool q6 = TYPE == KT_Q6_K;
        if (q6) {
            B.sc = (float)(int8_t)span[P.sc];
            B.d = kcuda_u16(span + 208);
        } else {
            const uint32_t lo = (span[P.sc] >> P.ssh) & 15, hi = (span[P.sc2] >> P.ssh2) & 3;
            B.sc = (float)((int)(lo | hi << 4) - 32);
            B.d = kcuda_u16(span + 108);
        }
        uint32_t L[2], H[2];
        kcuda_u64h(span + P.qs, L);
        kcuda_u64h(span + P.hs, H);
        const uint32_t ml = q6 ? 0x0F0F0F0Fu : 0x03030303u, mh = q6 ? 0x03030303u : 0x01010101u;
        for (int k = 0; k < 2; k++)
            B.c[k] = ((L[k] >> P.sh) & ml) | ((H[k] >> P.hsh) & mh) << (q6 ? 4 : 2);
    }
    if (kcuda_kmin<TYPE>()) {
        /* 6 bits at most: masked so, converted on the float pipe (I2FP), not as 16-bit values */
        B.sc = (float)(B.scm & 63u);
        B.mn = (float)(B.scm >> 16 & 63u);
    }
    return B;
}

/* Such a lane's block at place P, as the format keeps it, for both matmuls' readers (as
 * kcuda_kblock for the K-quants):
 *  - v: its 4 quant bytes: low nibbles columns 4 sub + i, high ones 16 + 4 sub + i (i = 0..3);
 *  - h: Q5_0's and Q5_1's qh word shifted to the lane: bit i the fifth bit of column 4 sub + i,
 *    bit 16 + i that of column 16 + 4 sub + i (the other types: 0);
 *  - dm: d's f16 bits in the low half, Q4_1's and Q5_1's m in the high half.
 * Q4_1's 20-byte and Q5_1's 24-byte blocks are 4-aligned, one load a word; Q4_0's and IQ4_NL's 18
 * and Q5_0's 22 are 2-aligned (kcuda_u32h). */
struct kcuda_b32block {
    uint32_t v, h, dm;
};

template <uint32_t TYPE>
__device__ static inline kcuda_b32block kcuda_b32_at(const uint8_t *span, const kcuda_place &P)
{
    const bool al = kcuda_span_bytes<TYPE>() / 8 % 4 == 0;
    kcuda_b32block B;
    B.dm = al ? kcuda_u32(span + P.off) : kcuda_u16(span + P.off);
    B.v = al ? kcuda_u32(span + P.qs) : kcuda_u32h(span + P.qs);
    B.h = 0u;
    if (TYPE == KT_Q5_0 || TYPE == KT_Q5_1)
        B.h = (al ? kcuda_u32(span + P.hs) : kcuda_u32h(span + P.hs)) >> P.hsh;
    return B;
}

/* The 8 weights a lane at place P (kcuda_place_of) takes of the block in the 256-column span
 * starting at `span` (the layouts are kernels/cpu/ktypes_k.c's and types.c's):
 *  - 32-blocks with 4-bit codes (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): the 4 quant bytes 4*sub..; their
 *    low nibbles are columns 4*sub.., their high ones 16 + 4*sub..;
 *  - Q8_0: the 8 quants 8*sub..;
 *  - the K-quants: block j of the span is sub-block j of its super-block, and the lane takes its
 *    columns 8*sub .. 8*sub + 7, wherever the format keeps their bits.
 * w[0..3] multiply the 4 inputs from column a of the block, w[4..7] the 4 from bo
 * (kcuda_group_cols). So the 4 lanes of a block read its quants as one run of bytes and its inputs
 * as one run of floats, and 32 lanes (8 blocks) cover one span. */
template <uint32_t TYPE>
__device__ static inline void kcuda_group_at(const uint8_t *span, const kcuda_place &P, float w[8])
{
    if (kcuda_b32<TYPE>()) {
        const kcuda_b32block B = kcuda_b32_at<TYPE>(span, P);
        const float d = kcuda_half_bits(B.dm);
        const float m = TYPE == KT_Q4_1 || TYPE == KT_Q5_1 ? kcuda_half_bits(B.dm >> 16) : 0.0f;
        if (TYPE == KT_IQ4_NL) {
            /* the levels' bytes (kcuda_iq4nl_levels), each sign-extended by two shifts and then
             * converted (I2FP, as Q8_0's quants below) */
            uint32_t L[2];
            kcuda_iq4nl_levels(B.v, L);
            const int at[8] = {0, 16, 0, 16, 8, 24, 8, 24}; /* w0..w7: bit of the byte */
            for (int i = 0; i < 8; i++)
                w[i] = d * (float)((int32_t)(L[i >> 1 & 1] << (24 - at[i])) >> 24);
        } else {
            for (int i = 0; i < 4; i++) {
                uint32_t lo = (B.v >> (8 * i)) & 0xf, hi = (B.v >> (8 * i + 4)) & 0xf;
                lo |= ((B.h >> i) & 1) << 4;
                hi |= ((B.h >> (16 + i)) & 1) << 4;
                if (TYPE == KT_Q4_1 || TYPE == KT_Q5_1) {
                    w[i] = d * (float)lo + m;
                    w[4 + i] = d * (float)hi + m;
                } else {
                    const int z = TYPE == KT_Q4_0 ? 8 : 16;
                    w[i] = d * (float)((int)lo - z);
                    w[4 + i] = d * (float)((int)hi - z);
                }
            }
        }
        return;
    }
    if (TYPE == KT_Q8_0) {
        float d = kcuda_half(span + P.off);
        uint32_t v[2]; /* 34-byte blocks: 2-aligned */
        kcuda_u64h(span + P.qs, v);
        /* each quant sign-extended to 32 bits by two shifts, then converted: the float pipe's
         * I2FP (a conversion from an 8-bit type runs on the slower conversion pipe, I2F.S8) */
        for (int i = 0; i < 8; i++)
            w[i] = d * (float)((int32_t)(v[i >> 2] << (24 - 8 * (i & 3))) >> 24);
        return;
    }
    /* the K-quants: d sc (c - offset) - dmin mn, each code masked to its width so that it is
     * converted on the float pipe (I2FP), where a whole byte would go to the conversion pipe
     * (I2F.U8, an eighth of the rate; bench/sass_mix.py counts them) */
    const kcuda_kblock B = kcuda_kblock_at<TYPE>(span, P);
    const bool with_min = kcuda_kmin<TYPE>();
    const float ds = kcuda_half_bits(B.d) * B.sc;
    const float dm = with_min ? kcuda_half_bits(B.d >> 16) * B.mn : 0.0f;
    const uint32_t mask = TYPE == KT_Q6_K   ? 63u
                          : TYPE == KT_Q5_K ? 31u
                          : TYPE == KT_Q4_K ? 15u
                          : TYPE == KT_Q3_K ? 7u
                                            : 3u;
    const int z = TYPE == KT_Q6_K ? 32 : TYPE == KT_Q3_K ? 4 : 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) {
            const float c = (float)((int)((B.c[k] >> (8 * i)) & mask) - z);
            w[4 * k + i] = with_min ? ds * c - dm : ds * c;
        }
}

/* The 8 weights lane `sub` (0..3) of a row's 32-column block b takes (kcuda_group_at), and where
 * their inputs lie (kcuda_group_cols): for one block; the matmuls keep their place and walk. */
template <uint32_t TYPE>
__device__ static inline void kcuda_group(const uint8_t *row, int64_t b, int sub, float w[8],
                                          int *a, int *bo)
{
    kcuda_group_at<TYPE>(row + (size_t)(b >> 3) * kcuda_span_bytes<TYPE>(),
                         kcuda_place_of<TYPE>((int)(b & 7), sub), w);
    kcuda_group_cols<TYPE>(sub, a, bo);
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
