/*
 * kernels/cuda/kcuda_matmul.cu — y[t][r] = W[r] . x[t] over an output-row range on the GPU.
 *
 * kcuda_matmul / kcuda_matmul_cols, every type (k_matmul): one warp per output row, taking
 * 256 columns per iteration so that its loads of weights and inputs fall on consecutive
 * addresses (kcuda_group_at: four lanes to a quantized block, each dequantizing 8 weights in
 * registers; float rows: lane l takes 8 consecutive columns of each 256 by one 16-byte load,
 * or every 32nd column from l where the row lies off 16-byte words).
 * Each weight is multiplied with up to KQ_TOK tokens at once, so it is read from memory once per
 * KQ_TOK tokens; the lanes' sums meet in a warp reduction. Each token's sum is taken in the same
 * order whatever the batch, so a token's result does not depend on the width of the batch it came
 * in: a tree's verification computes the bits sequential decoding computes (docs/gpu.md, "Why the
 * forward does not use cuBLAS").
 * Over a range of input columns only (kcuda_matmul_cols, the Megatron plan's partial sums),
 * every type starts its rows at the range's first column.
 *
 * A quantized row's lanes may load U = 1, 2 or 4 of their groups before adding any
 * (kcuda_set_matmul_unroll: more loads in flight, the same order of additions, the same bits).
 *
 * The fused forms run the same kernel (k_matmul<TYPE, OP, U>), so a row's sums are the same bits
 * in all of them: kcuda_matmul_multi gives one launch up to three matrices (the block's index
 * picks the matrix and row), kcuda_matmul_add adds each sum to y (the residual), and
 * kcuda_matmul_silu has each warp take the gate row and the up row and write silu(gate) * up.
 *
 * kcuda_matmul_blas, F32: cuBLAS SGEMM; F16 and BF16: the activations are rounded to the weight's
 * type into the context's scratch, then cublasGemmEx with f32 accumulation. cuBLAS chooses its
 * algorithm by shape, so a token's result may depend on the batch: not used by the forward.
 */
#include <stdio.h>

#include "kernels/cuda/kcuda_internal.h"

#define KQ_TOK 8    /* tokens per pass over a weight row */
#define KQ_WARPS 4  /* rows per block */
#define KQ_SPAN 256 /* a warp's columns per iteration: 8 quantized blocks, 4 lanes each */

/* acc[t] += the 8 weights of one group times their inputs, for tokens t < nt (xb: token 0's
 * inputs of the group's block; a, bo: kcuda_group_cols' offsets). One expression wherever it is
 * used, so that every caller sums alike. */
__device__ static inline void k_group_acc(const float w[8], int a, int bo, const float *xb,
                                          int64_t cols, int nt, float acc[KQ_TOK])
{
#pragma unroll
    for (int t = 0; t < KQ_TOK; t++) {
        if (t >= nt)
            break;
        const float *xr = xb + (int64_t)t * cols;
        float4 u = *(const float4 *)(xr + a), v = *(const float4 *)(xr + bo);
        acc[t] += w[0] * u.x + w[1] * u.y + w[2] * u.z + w[3] * u.w + w[4] * v.x + w[5] * v.y +
                  w[6] * v.z + w[7] * v.w;
    }
}

/* The 8 weights of a float row at p (on a 16-byte word), as f32: the values kcuda_dequant gives,
 * by one 16-byte load (F32: two). */
#define KQ_FLOAT_SPANS 4 /* a float row's 256-column spans a lane loads before it adds */
template <uint32_t TYPE>
__device__ static inline void k_float8(const uint8_t *p, float w[8])
{
    if (TYPE == KT_F32) {
        const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
        w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
        return;
    }
    const uint4 v = *(const uint4 *)p;
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; i++) {
        /* F16 by its bits; BF16 is the top half of an f32 */
        w[2 * i] = TYPE == KT_F16 ? kcuda_half_bits(u[i]) : kcuda_f32_bits(u[i] << 16);
        w[2 * i + 1] =
            TYPE == KT_F16 ? kcuda_half_bits(u[i] >> 16) : kcuda_f32_bits(u[i] & 0xffff0000u);
    }
}

/* A lane's walk over its n groups of one row, group i's bytes `step` after group i - 1's:
 * load(o, w) fills the 8 weights w (a T, float[8]) of the group at byte offset o, use(i, w) adds
 * group i's products. U groups are loaded before any is used (U loads in flight) and used in
 * order, the last ones, fewer than U, one at a time: every U gives the same sums. The offset is
 * carried from group to group. Quantized and float rows walk so; k_mma keeps its own loop of the
 * same shape, of which nvcc makes shorter code for some types (docs/gpu.md, "One reader of the
 * K-quants' blocks, one walk of a row"). */
template <int U, typename T, typename Load, typename Use>
__device__ static inline void k_walk(int64_t n, int step, const Load &load, const Use &use)
{
    int64_t i = 0, o = 0;
    for (; i + U <= n; i += U, o += U * step) {
        T v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            load(o + u * step, v[u]);
#pragma unroll
        for (int u = 0; u < U; u++)
            use(i + u, v[u]);
    }
    for (; i < n; i++, o += step) {
        T v;
        load(o, v);
        use(i, v);
    }
}

/* The sums of one weight row (its columns from the first multiplied) with tokens [t0, t0 + nt)
 * of x (rows of `cols` values), this lane's share of them into acc[0..nt). Quantized rows: lane l
 * takes the group l % 4 of block l / 4 + 8 i (i = 0, 1, ...), U groups loaded at a time (k_walk);
 * float rows: lane l takes columns 8l .. 8l + 7 of each 256 (16-byte loads, k_walk) where the row
 * and the inputs lie on 16-byte words and the row is a multiple of 8 long, else columns l + 32 j.
 * Each lane's sum per token runs over its columns in one order, whatever n. */
template <uint32_t TYPE, int U>
__device__ static inline void k_row_sums(const uint8_t *row, int64_t cols, const float *xt, int nt,
                                         int lane, float acc[KQ_TOK])
{
    const bool quant = kcuda_quant(TYPE);
    const int step = KQ_SPAN / 32; /* blocks a warp iteration covers */
#pragma unroll
    for (int t = 0; t < KQ_TOK; t++)
        acc[t] = 0.0f;
    if (quant) {
        /* the lane's place in its blocks b, b + 8, ... (b = lane / 4): one for the whole row
         * (kcuda_place_of); block b + 8 i lies in the row's span (256 columns) i */
        static_assert(KQ_SPAN == 256, "a warp iteration covers one span of 8 blocks");
        const int sub = lane & 3;
        const int64_t b = lane >> 2, nb = cols / 32;
        const kcuda_place P = kcuda_place_of<TYPE>((int)b, sub);
        int a, bo;
        kcuda_group_cols<TYPE>(sub, &a, &bo);
        const int SB = kcuda_span_bytes<TYPE>();
        const float *xb = xt + b * 32;
        k_walk<U, float[8]>(
            b < nb ? (nb - b + step - 1) / step : 0, SB,
            [&](int64_t o, float (&w)[8]) { kcuda_group_at<TYPE>(row + o, P, w); },
            [&](int64_t i, const float (&w)[8]) {
                k_group_acc(w, a, bo, xb + i * KQ_SPAN, cols, nt, acc);
            });
    } else if (((uintptr_t)row | (uintptr_t)xt) % 16 == 0 && cols % 8 == 0) {
        /* float rows on 16-byte words: lane l takes columns 8l .. 8l + 7 of each 256, one 16-byte
         * load of weights (F32: two) for 8, KQ_FLOAT_SPANS of them loaded before any is added
         * (a lane's 8 columns are whole or past the row: cols is a multiple of 8) */
        const int es = TYPE == KT_F32 ? 4 : 2;
        const int64_t c = 8 * lane;
        k_walk<KQ_FLOAT_SPANS, float[8]>(
            c < cols ? (cols - c + KQ_SPAN - 1) / KQ_SPAN : 0, es * KQ_SPAN,
            [&](int64_t o, float (&w)[8]) { k_float8<TYPE>(row + es * c + o, w); },
            [&](int64_t i, const float (&w)[8]) {
                k_group_acc(w, 0, 4, xt + c + i * KQ_SPAN, cols, nt, acc);
            });
    } else {
        /* float rows off 16-byte words (a range starting off them, an odd length) */
        for (int64_t c0 = 0; c0 < cols; c0 += KQ_SPAN) {
            float wv[8];
#pragma unroll
            for (int i = 0; i < 8; i++) {
                int64_t c = c0 + lane + 32 * i;
                wv[i] = c < cols ? kcuda_dequant(TYPE, row, c) : 0.0f;
            }
#pragma unroll
            for (int t = 0; t < KQ_TOK; t++) {
                if (t >= nt)
                    break;
                const float *xr = xt + (int64_t)t * cols;
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    int64_t c = c0 + lane + 32 * i;
                    if (c < cols)
                        s += wv[i] * xr[c];
                }
                acc[t] += s;
            }
        }
    }
}

/* What a launch writes: the sums (KQ_STORE), the sums added to y (KQ_ADD, the residual), or
 * silu(gate sums) * up sums (KQ_SILU). */
enum { KQ_STORE, KQ_ADD, KQ_SILU };

/* One matrix of a launch: its rows (from the first input column multiplied; w2 the up matrix of
 * KQ_SILU) [lo, hi) into y, over the launch's blocks [previous b1, b1). */
struct kq_seg {
    const uint8_t *w, *w2;
    size_t row_bytes;
    int64_t lo, hi;
    float *y;
    int64_t ldy;
    unsigned b1;
};

struct kq_job {
    kq_seg s[KCUDA_MM_MAX];
    int n_seg;
    int64_t cols; /* the input columns multiplied: x's row length */
    const float *x;
    const uint4 *xf; /* tensor cores: x in fragment order (k_xfrag), or NULL */
    int n;
    bool early; /* tensor cores: launched before the kernel ahead finished (kcuda_set_matmul_early) */
};

/* The matrix (segment) of a job block blockIdx.x falls in, picked by constant indices (the job
 * stays in the parameter bank), and that block's first row. */
__device__ static inline kq_seg kq_seg_of(const kq_job &j, int rows_per_block, int64_t *r0)
{
    static_assert(KCUDA_MM_MAX == 3, "a job holds three matrices at most");
    kq_seg s = j.s[0];
    unsigned b0 = 0;
    if (j.n_seg > 1 && blockIdx.x >= j.s[0].b1) {
        s = j.s[1];
        b0 = j.s[0].b1;
    }
    if (j.n_seg > 2 && blockIdx.x >= j.s[1].b1) {
        s = j.s[2];
        b0 = j.s[1].b1;
    }
    *r0 = s.lo + (int64_t)(blockIdx.x - b0) * rows_per_block;
    return s;
}

/* One warp per output row of one of the job's matrices (the block's index picks which); the
 * lanes' sums meet in a warp reduction, in one order, so a row's result is the same bits for
 * every OP and every batch width. */
template <uint32_t TYPE, int OP, int U>
__global__ void k_matmul(kq_job j)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t r;
    kq_seg s = kq_seg_of(j, KQ_WARPS, &r);
    r += warp;
    if (r >= s.hi)
        return;
    const uint8_t *row = s.w + (size_t)r * s.row_bytes;
    for (int t0 = 0; t0 < j.n; t0 += KQ_TOK) {
        int nt = j.n - t0 < KQ_TOK ? j.n - t0 : KQ_TOK;
        const float *xt = j.x + (int64_t)t0 * j.cols;
        float acc[KQ_TOK], up[KQ_TOK];
        k_row_sums<TYPE, U>(row, j.cols, xt, nt, lane, acc);
        if (OP == KQ_SILU)
            k_row_sums<TYPE, U>(s.w2 + (size_t)r * s.row_bytes, j.cols, xt, nt, lane, up);
#pragma unroll
        for (int t = 0; t < KQ_TOK; t++) {
            if (t >= nt)
                break;
            float v = kcuda_warp_sum(acc[t]);
            float u = OP == KQ_SILU ? kcuda_warp_sum(up[t]) : 0.0f;
            if (lane == 0) {
                float *o = s.y + (int64_t)(t0 + t) * s.ldy + r;
                if (OP == KQ_STORE)
                    *o = v;
                else if (OP == KQ_ADD)
                    *o = *o + v;
                else
                    *o = kcuda_silu_mul1(v, u);
            }
        }
    }
}

/* ===== the quantized matmul on tensor cores (KCUDA_MM_TC) =====
 *
 * A block takes R row tiles of 16 output rows (one m16n8k16 A tile each) of one matrix, with
 * KM_SPLIT warps a tile: warp s of a tile takes the row's 32-column blocks s, s + KM_SPLIT, ...,
 * and a lane (g = lane / 4, t = lane % 4) fills its A fragment with its 8 weights of rows g and
 * g + 8 for sub t as f16 (the first 4 go into the first k-step's slots, the last 4 into the
 * second's: km_load, every type straight from its codes, km_group_h2), its B fragment with the
 * same columns of token g of the tile. A permutation of the columns inside a k-step changes nothing
 * as long as A and B follow it, so each lane loads exactly the bytes the CUDA-core kernel's lane
 * loads. The inputs are rounded to f16, the products summed in f32. Tokens run in tiles of 8 (NT
 * tiles a pass); a tile's KM_SPLIT partial sums are added in warp order through shared memory.
 * Every output is one lane's accumulator over its warp's blocks in one order, then the warps in one
 * order: a token's result depends neither on the batch it came in, nor on which of the 8 columns of
 * a tile it took, nor on R and NT (chosen by the tiles a pass takes: R = 2 tiles a block from 4
 * token tiles a pass, whose warps of one k-slice read the same inputs, once from L2 for both), nor
 * on U, the blocks a warp loads before it multiplies any (kcuda_depth_rule: 8 at one tile a pass
 * where the device holds the whole launch at once with 8, else 4; 4 at two tiles, 2 from four), nor
 * on which block took its pass: kcuda_set_matmul_groups deals the passes to G blocks of each row
 * tile (gridDim.y), each pass then a G-th of the step's tiles (kcuda_pass_tiles). KM_SPLIT is
 * fixed: the order of the sums.
 *
 * Launched early (kq_job.early, kcuda_set_matmul_early: a programmatic dependent launch), a block
 * brings its first round of weights into L2 and then waits for the kernel ahead; every block
 * waits for it before it reads x or y either way (kcuda_wait_prior).
 *
 * The inputs (B) either come from x's f32 rows, each lane loading its token's 8 columns of the
 * block (16 bytes at two places of a row: 8 rows touched a warp per token tile) and rounding them,
 * or, for the widths kcuda_set_matmul_frag picks, from x in fragment order: one launch before
 * (k_xfrag) rounds each lane's 8 values once into the 16 bytes it will load, so a warp's B of a
 * token tile and block is one load of 512 consecutive bytes, half the bytes, no conversion — the
 * same f16 values, so the same bits. */
#define KM_SPLIT 8
#define KM_ROWS 16
#define KM_TILES 8 /* token tiles of 8 a pass at most: 64 tokens */

/* The row tiles a block takes, by the token tiles of its passes (kcuda_pass_tiles). */
static inline int km_tiles_per_block(int pass_tiles)
{
    return pass_tiles > 2 ? 2 : 1;
}

__device__ static inline uint32_t km_h2(float lo, float hi)
{
#ifdef OROCHI_KEMU_H
    __half l(lo), h(hi);
    return (uint32_t)l.bits | (uint32_t)h.bits << 16;
#else
    __half2 v = __floats2half2_rn(lo, hi);
    return *(uint32_t *)&v;
#endif
}

#ifdef OROCHI_KEMU_H
static inline float km_f(uint32_t v, int hi)
{
    __half h;
    h.bits = (uint16_t)(hi ? v >> 16 : v & 0xffff);
    return __half2float(h);
}
#endif

/* Words of two f16 values (the low half first): a - b, a * b, a * b + c, each half rounded once
 * (PTX sub.rn/mul.rn/fma.rn.f16x2; over the emulation the same roundings: a difference or a
 * product of two f16 values rounded to f32 and then to f16 is rounded once, as f32 has
 * 2 x 11 + 2 bits; the fused form is kemu_hfma). */
__device__ static inline uint32_t km_hsub2(uint32_t a, uint32_t b)
{
#ifdef OROCHI_KEMU_H
    return km_h2(km_f(a, 0) - km_f(b, 0), km_f(a, 1) - km_f(b, 1));
#else
    uint32_t r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#endif
}
__device__ static inline uint32_t km_hmul2(uint32_t a, uint32_t b)
{
#ifdef OROCHI_KEMU_H
    return km_h2(km_f(a, 0) * km_f(b, 0), km_f(a, 1) * km_f(b, 1));
#else
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
#endif
}
/* -a of both halves (its sign bits flipped: exact; on the device an operand's sign, folded into the
 * instruction that takes it). */
__device__ static inline uint32_t km_hneg2(uint32_t a)
{
#ifdef OROCHI_KEMU_H
    return a ^ 0x80008000u;
#else
    uint32_t r;
    asm("neg.f16x2 %0, %1;" : "=r"(r) : "r"(a));
    return r;
#endif
}
/* (a & m) ^ k in one logic operation (LOP3: nvcc's own splits it in two when m and k are both
 * constants) — the codes' f16 bits, k the exponent 0x6400 of each half (and Q8_0's flipped top
 * bits), never overlapping a & m. */
__device__ static inline uint32_t km_andxor(uint32_t a, uint32_t m, uint32_t k)
{
#ifdef OROCHI_KEMU_H
    return (a & m) ^ k;
#else
    uint32_t r;
    asm("lop3.b32 %0, %1, %2, %3, 0x6A;" : "=r"(r) : "r"(a), "r"(m), "r"(k));
    return r;
#endif
}
__device__ static inline uint32_t km_hfma2(uint32_t a, uint32_t b, uint32_t c)
{
#ifdef OROCHI_KEMU_H
    return (uint32_t)kemu_hfma((uint16_t)a, (uint16_t)b, (uint16_t)c) |
           (uint32_t)kemu_hfma((uint16_t)(a >> 16), (uint16_t)(b >> 16), (uint16_t)(c >> 16)) << 16;
#else
    uint32_t r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#endif
}

/* d += A (16 x 16, f16, row-major fragments) B (16 x 8, f16, column-major), f32 accumulation:
 * mma.sync m16n8k16 on the device; over the emulation the same product formed from the warp's
 * fragments through shuffles, k in order. */
__device__ static inline void km_mma(float d[4], const uint32_t a[4], const uint32_t b[2])
{
#ifdef OROCHI_KEMU_H
    /* the warp's fragments in one meeting (each lane's 4 A words, then its 2 B words) */
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const uint32_t mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    uint32_t all[32][6];
    kemu_warp_gather(0xffffffffu, mine, sizeof mine, all);
    for (int tt = 0; tt < 4; tt++) {
        uint32_t ar[4], bc[2][2];
        for (int r = 0; r < 4; r++)
            ar[r] = all[g * 4 + tt][r];
        for (int c = 0; c < 2; c++)
            for (int r = 0; r < 2; r++)
                bc[c][r] = all[(2 * t + c) * 4 + tt][4 + r];
        for (int row = 0; row < 2; row++)
            for (int c = 0; c < 2; c++) {
                float s = 0.0f;
                for (int half = 0; half < 2; half++) /* k 2tt.. then 2tt + 8.. */
                    for (int e = 0; e < 2; e++)
                        s += km_f(ar[row + 2 * half], e) * km_f(bc[c][half], e);
                d[2 * row + c] += s;
            }
    }
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/* Tensor cores take every quantized type straight into f16 pairs: a lane's 8 codes of one row,
 * two at a time, made f16 values by their bits (0x6400 | c is 1024 + c: the codes of bytes 0 and
 * 2 of a word, then of 1 and 3; Q8_0's signed quants and IQ4_NL's signed levels with their top
 * bit flipped, q + 128; Q5_0's and Q5_1's fifth bits put in at bit 4 of each half), the 1024 and
 * the type's offset taken off (exact: the code as an f16), then times the block's scale (HMUL2;
 * the types with a min: plus the min, HFMA2, one fused rounding). Two weights an instruction or
 * two, where the f32 path (kcuda_group_at) takes a byte out, converts, multiplies and rounds each.
 *  - Q8_0, Q4_0, Q5_0, IQ4_NL: the weights' values are the f32 path's (d times the code or level
 *    is exact in f32, then rounded to f16 once either way);
 *  - Q6_K, Q3_K: d times the sub-block's int scale is rounded to f16 first (exact in f32), then
 *    times the code once more;
 *  - Q4_1, Q5_1: d c + m rounded once, where the f32 path rounds in f32 and then to f16;
 *  - Q4_K/Q5_K/Q2_K: d sc and dmin mn are rounded to f16 first (exact in f32), then c times the
 *    scale less the min rounded once: at most a rounding of each part more than the f32 path,
 *    which shows where the two nearly cancel (docs/gpu.md, "Codes straight into f16").
 * h[0] = (w0, w2), h[1] = (w1, w3), h[2] = (w4, w6), h[3] = (w5, w7): km_load's slot order. */
template <uint32_t TYPE>
__device__ static inline void km_group_h2(const uint8_t *span, const kcuda_place &P, uint32_t h[4])
{
    const uint32_t K1024 = 0x64006400u; /* (1024, 1024) */
    const bool with_min = kcuda_kmin<TYPE>() || TYPE == KT_Q4_1 || TYPE == KT_Q5_1;
    uint32_t q[4], sc, mn = 0;
    /* the pairs' bias: 1024 and the type's offset (Q6_K 32, Q8_0 and IQ4_NL 128, Q4_0 8, Q5_0
     * 16, Q3_K 4) */
    const uint32_t off = TYPE == KT_Q6_K                        ? 0x64206420u
                         : TYPE == KT_Q8_0 || TYPE == KT_IQ4_NL ? 0x64806480u
                         : TYPE == KT_Q4_0                      ? 0x64086408u
                         : TYPE == KT_Q5_0                      ? 0x64106410u
                         : TYPE == KT_Q3_K                      ? 0x64046404u
                                                                : K1024;
    /* Q8_0's and IQ4_NL's signed bytes: the top bit flipped with the exponents */
    const uint32_t K8 = K1024 ^ 0x00800080u;
    if (kcuda_b32<TYPE>()) {
        /* the lane's 4 bytes: low nibbles columns 4 sub.., high ones 16 + 4 sub.. */
        const kcuda_b32block B = kcuda_b32_at<TYPE>(span, P);
        sc = __byte_perm(B.dm, 0, 0x1010);
        if (TYPE == KT_Q4_1 || TYPE == KT_Q5_1)
            mn = __byte_perm(B.dm, 0, 0x3232);
        if (TYPE == KT_IQ4_NL) {
            uint32_t L[2];
            kcuda_iq4nl_levels(B.v, L);
            const uint32_t pair[4] = {0x0400u, 0x0602u, 0x0501u, 0x0703u}; /* bytes of L[0], L[1] */
            for (int i = 0; i < 4; i++)
                q[i] = km_andxor(__byte_perm(L[0], L[1], pair[i]), 0x00FF00FFu, K8);
        } else {
            /* Q5_0/Q5_1: each pair's two fifth bits (h's bits i and i + 2 of its half) at bits 4
             * and 20, spread by one multiplication (h's 4 bits of a half land at bits 4, 12, 20,
             * 28, no two terms overlapping), then with the exponents in one logic operation */
            uint32_t k[4] = {K1024, K1024, K1024, K1024};
            if (TYPE == KT_Q5_0 || TYPE == KT_Q5_1) {
                const uint32_t lo = (B.h & 15u) * 0x02040810u, hi = (B.h >> 16 & 15u) * 0x02040810u;
                k[0] = km_andxor(lo, 0x00100010u, K1024);
                k[1] = km_andxor(lo >> 8, 0x00100010u, K1024);
                k[2] = km_andxor(hi, 0x00100010u, K1024);
                k[3] = km_andxor(hi >> 8, 0x00100010u, K1024);
            }
            q[0] = km_andxor(B.v, 0x000F000Fu, k[0]);
            q[1] = km_andxor(B.v >> 8, 0x000F000Fu, k[1]);
            q[2] = km_andxor(B.v >> 4, 0x000F000Fu, k[2]);
            q[3] = km_andxor(B.v >> 12, 0x000F000Fu, k[3]);
        }
    } else {
        uint32_t c4[2];
        if (TYPE == KT_Q8_0) {
            sc = __byte_perm(kcuda_u16(span + P.off), 0, 0x1010);
            kcuda_u64h(span + P.qs, c4); /* 34-byte blocks: 2-aligned */
        } else {
            /* the K-quants as the format keeps them (kcuda_kblock_at, the f32 path's reader) */
            const kcuda_kblock B = kcuda_kblock_at<TYPE>(span, P);
            if (with_min) {
                /* (d, dmin) times (scale, min) as f16 pairs: the integer pair made f16 by its
                 * bits (1024 + each, less 1024: exact), each product rounded once, as the f32
                 * product (exact: 11 by 6 bits) rounded; then each spread to both halves, the min
                 * negated */
                const uint32_t dm = km_hmul2(B.d, km_hsub2(B.scm | K1024, K1024));
                sc = __byte_perm(dm, 0, 0x1010);
                mn = km_hneg2(__byte_perm(dm, 0, 0x3232));
            } else {
                const float ds = kcuda_half_bits(B.d) * B.sc; /* exact in f32 */
                sc = km_h2(ds, ds);
            }
            c4[0] = B.c[0]; /* Q4_K: masked with the exponents below */
            c4[1] = B.c[1];
        }
        /* a byte a code (Q8_0: its top bit flipped, so q + 128; Q4_K: its low nibble) */
        const uint32_t k = TYPE == KT_Q8_0 ? K8 : K1024;
        const uint32_t m = TYPE == KT_Q4_K ? 0x000F000Fu : 0x00FF00FFu;
        for (int w = 0; w < 2; w++) {
            q[2 * w] = km_andxor(c4[w], m, k);
            q[2 * w + 1] = km_andxor(c4[w] >> 8, m, k);
        }
    }
    for (int i = 0; i < 4; i++) {
        uint32_t c = km_hsub2(q[i], off);
        h[i] = with_min ? km_hfma2(c, sc, mn) : km_hmul2(c, sc);
    }
}

/* The A fragments of rows g and g + 8 of one 32-column block, at the lane's place P in the spans
 * sa and sb of the two rows: A[0..3] the first k-step's, A[4..7] the second's. The columns go
 * into k-slots as pairs (0, 2), (1, 3), (4, 6), (5, 7) of the lane's 8 (km_group_h2's order; km_b
 * puts the inputs alike): the first pair in slots 2t and 2t + 1, the second in 2t + 8 and 2t + 9,
 * and so on. */
template <uint32_t TYPE>
__device__ static inline void km_load(const uint8_t *sa, const uint8_t *sb, const kcuda_place &P,
                                      uint32_t A[8])
{
    uint32_t ha[4], hb[4];
    km_group_h2<TYPE>(sa, P, ha);
    km_group_h2<TYPE>(sb, P, hb);
    for (int i = 0; i < 4; i++)
        A[2 * i] = ha[i], A[2 * i + 1] = hb[i];
}

/* A token's B fragments of one block, both k-steps, from xr, its inputs of the block (zeros
 * where !live: a token past the step's n, whose xr is not read): the 4 inputs from column a of the
 * block and the 4 from bo, rounded to f16 pairs in km_load's slot order, (0, 2), (1, 3), (4, 6),
 * (5, 7). The one rounding of the inputs: km_mul forms them where it multiplies, k_xfrag once for a
 * step's fragment order. */
__device__ static inline uint4 km_b(const float *xr, bool live, int a, int bo)
{
    float4 u = {0.0f, 0.0f, 0.0f, 0.0f}, v = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live) {
        u = *(const float4 *)(xr + a);
        v = *(const float4 *)(xr + bo);
    }
    uint4 o;
    o.x = km_h2(u.x, u.z), o.y = km_h2(u.y, u.w), o.z = km_h2(v.x, v.z), o.w = km_h2(v.y, v.w);
    return o;
}

/* A block's fragments times the pass's NT token tiles, into acc[NT][4]: the lane's token of tile
 * i has its inputs of the block at xb + i ts (ts: 8 rows of x), and only tiles i < live have one
 * (the others multiply zeros). The addresses are a pointer carried from tile to tile and from
 * block to block (k_mma), not a token's row times the row length again each time. */
template <int NT>
__device__ static inline void km_mul(const uint32_t A[8], int a, int bo, const float *xb,
                                     int64_t ts, int live, float acc[NT][4])
{
#pragma unroll
    for (int i = 0; i < NT; i++) {
        uint4 v = km_b(xb, i < live, a, bo);
        uint32_t B0[2] = {v.x, v.y}, B1[2] = {v.z, v.w};
        km_mma(acc[i], A, B0);
        km_mma(acc[i], A + 4, B1);
        xb += ts;
    }
}

/* The same, with the inputs in fragment order (k_xfrag): lane L's B fragments of token tile tt and
 * block b are the 16 bytes xf[(tt * nb + b) * 32 + L], one load of a warp's 512 consecutive
 * bytes; fb is the pass's first tile's entry of the block, the next tile's fs = nb * 32 entries on,
 * and tiles i >= live hold no token of the step (zeros). The same f16 values as km_mul's (rounded
 * alike, zero past the step's tokens), so the same sums. */
template <int NT>
__device__ static inline void km_mul_frag(const uint32_t A[8], const uint4 *fb, int64_t fs,
                                          int live, float acc[NT][4])
{
#pragma unroll
    for (int i = 0; i < NT; i++) {
        uint4 v = {0u, 0u, 0u, 0u};
        if (i < live)
            v = *fb;
        uint32_t B0[2] = {v.x, v.y}, B1[2] = {v.z, v.w};
        km_mma(acc[i], A, B0);
        km_mma(acc[i], A + 4, B1);
        fb += fs;
    }
}

/* x (n rows of `cols` floats) into fragment order for TYPE's groups: entry (tt * nb + b) * 32 + L
 * holds, for token 8 tt + L / 4 and the lane L % 4 of block b, the f16 pairs of the 4 inputs from
 * column a and the 4 from bo (kcuda_group_cols) as km_mul forms them (km_b); zeros past the n
 * tokens. */
template <uint32_t TYPE>
__global__ void k_xfrag(const float *x, int64_t cols, int n, uint4 *xf)
{
    int64_t nb = cols / 32, total = (int64_t)((n + 7) / 8) * nb * 32;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int lane = (int)(i & 31), a, bo;
        int64_t b = (i >> 5) % nb, tok = (i >> 5) / nb * 8 + (lane >> 2);
        kcuda_group_cols<TYPE>(lane & 3, &a, &bo);
        xf[i] = km_b(x + tok * cols + b * 32, tok < n, a, bo);
    }
}

/* Output slot (q, L) of a tile's partial sums: the one sum (S = 1), or the S warps' added in warp
 * order — the additions the one sum had, warp 0's value first. */
template <int S, int Q>
__device__ static inline float km_warps_sum(const float (&red)[S][Q][32], int q, int L)
{
    float v = red[0][q][L];
#pragma unroll
    for (int k = 1; k < S; k++)
        v = v + red[k][q][L];
    return v;
}

template <uint32_t TYPE, int OP, int NT, int U, int R, bool XF>
__global__ void __launch_bounds__(32 * KM_SPLIT * R) k_mma(kq_job j)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int tile = warp / KM_SPLIT, ks = warp % KM_SPLIT;
    int64_t r0;
    kq_seg s = kq_seg_of(j, KM_ROWS * R, &r0);
    const int64_t rt0 = r0; /* the block's first row */
    r0 += (int64_t)tile * KM_ROWS;
    /* rows past the segment's end compute on its last row and are not written */
    int64_t ra = r0 + g < s.hi ? r0 + g : s.hi - 1, rb = r0 + g + 8 < s.hi ? r0 + g + 8 : s.hi - 1;
    const int NM = OP == KQ_SILU ? 2 : 1;
    int64_t nb = j.cols / 32;
    kcuda_let_next_start();
    if (j.early) {
        /* launched while the kernel ahead still runs (kcuda_set_matmul_early): the first U spans
         * of the block's rows (every warp's first round of loads) into L2 meanwhile, then wait
         * for that kernel's writes (x, and y where the sums are added to it) */
        const int64_t SB = kcuda_span_bytes<TYPE>();
        const int64_t used = (nb + KM_SPLIT - 1) / KM_SPLIT * SB;
        const int64_t lim = U * SB < used ? U * SB : used;
        const int lines = (int)((lim + 127) / 128) + 1; /* a row need not start on a line */
        for (int k = threadIdx.x; k < NM * R * KM_ROWS * lines; k += blockDim.x) {
            int l = k % lines, rr = (k / lines) % (R * KM_ROWS), m = k / (lines * R * KM_ROWS);
            int64_t row = rt0 + rr < s.hi ? rt0 + rr : s.hi - 1, at = (int64_t)l * 128;
            if (lim > 0)
                kcuda_prefetch_l2((m ? s.w2 : s.w) + (size_t)row * s.row_bytes +
                                  (at < lim ? at : lim - 1));
        }
    }
    kcuda_wait_prior();
    /* the warps' partial sums: up to 2 token tiles a pass each warp's apart (S = KM_SPLIT), added
     * in warp order after one barrier; from 4, one sum added to in warp order, a barrier a warp
     * (their KM_SPLIT copies would not fit): the same additions either way */
    constexpr int S = NT <= 2 ? KM_SPLIT : 1;
    __shared__ float red[NM][R][S][NT * 4][32];
    /* the passes of NT token tiles, dealt to the launch's token groups (blockIdx.y) in turn */
    for (int t0 = blockIdx.y * NT * 8; t0 < j.n; t0 += gridDim.y * NT * 8) {
        for (int m = 0; m < NM; m++) {
            const uint8_t *w = m ? s.w2 : s.w;
            const uint8_t *rowa = w + (size_t)ra * s.row_bytes, *rowb = w + (size_t)rb * s.row_bytes;
            float acc[NT][4];
#pragma unroll
            for (int i = 0; i < NT; i++)
                acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
            /* warp ks takes blocks ks, ks + 8, ...: the lane's place is the same in each
             * (kcuda_place_of), spa and spb the two rows' spans of block b */
            static_assert(KM_SPLIT == 8, "a tile's warps take the 8 blocks of a span");
            const int SB = kcuda_span_bytes<TYPE>();
            const kcuda_place P = kcuda_place_of<TYPE>(ks, t);
            int a, bo;
            kcuda_group_cols<TYPE>(t, &a, &bo);
            int64_t b = ks;
            const uint8_t *spa = rowa, *spb = rowb;
            /* the inputs of block b: the lane's token t0 + g (the tiles with one: live) at xb,
             * or (fragment order) the pass's first tile's entry at fb; each advanced with b */
            const float *xb = j.x + (int64_t)(t0 + g) * j.cols + b * 32;
            const uint4 *fb = XF ? j.xf + ((int64_t)(t0 / 8) * nb + b) * 32 + lane : NULL;
            const int64_t ts = 8 * j.cols, fs = nb * 32, XS = KM_SPLIT * 32;
            const int64_t FS = XF ? XS : 0; /* fb is NULL, and stays so, where x is read in place */
            const int live = XF ? (j.n - t0 + 7) / 8 : (j.n - t0 - g + 7) / 8;
            /* U blocks' weights loaded before any is multiplied (loads in flight), multiplied in
             * the order of the blocks: the same sums for every U */
            for (; b + (U - 1) * KM_SPLIT < nb;
                 b += U * KM_SPLIT, spa += U * SB, spb += U * SB, xb += U * XS, fb += U * FS) {
                uint32_t A[U][8];
#pragma unroll
                for (int u = 0; u < U; u++)
                    km_load<TYPE>(spa + u * SB, spb + u * SB, P, A[u]);
#pragma unroll
                for (int u = 0; u < U; u++)
                    if (XF)
                        km_mul_frag<NT>(A[u], fb + u * XS, fs, live, acc);
                    else
                        km_mul<NT>(A[u], a, bo, xb + u * XS, ts, live, acc);
            }
            for (; b < nb; b += KM_SPLIT, spa += SB, spb += SB, xb += XS, fb += FS) {
                uint32_t A[8];
                km_load<TYPE>(spa, spb, P, A);
                if (XF)
                    km_mul_frag<NT>(A, fb, fs, live, acc);
                else
                    km_mul<NT>(A, a, bo, xb, ts, live, acc);
            }
            if constexpr (S > 1) {
#pragma unroll
                for (int i = 0; i < NT; i++)
                    for (int e = 0; e < 4; e++)
                        red[m][tile][ks % S][4 * i + e][lane] = acc[i][e];
            } else {
                /* the tile's partial sums added in warp order: warp 0 writes, then 1, 2, ... add */
                for (int k = 0; k < KM_SPLIT; k++) {
                    if (ks == k)
#pragma unroll
                        for (int i = 0; i < NT; i++)
                            for (int e = 0; e < 4; e++) {
                                float *r = &red[m][tile][0][4 * i + e][lane];
                                *r = k ? *r + acc[i][e] : acc[i][e];
                            }
                    __syncthreads();
                }
            }
        }
        if constexpr (S > 1)
            __syncthreads();
        /* output (tile, lane L, slot q): row g(L) (+8 for e >= 2), token t0 + 8 i + 2 t(L) +
         * e % 2; the block's threads take them in turn */
        for (int o = threadIdx.x; o < R * NT * 4 * 32; o += KM_SPLIT * R * 32) {
            int tl = o / (NT * 4 * 32), q = (o >> 5) % (NT * 4), L = o & 31, i = q >> 2, e = q & 3;
            int64_t r = rt0 + tl * KM_ROWS + (L >> 2) + (e >= 2 ? 8 : 0);
            int tok = t0 + 8 * i + 2 * (L & 3) + (e & 1);
            if (r >= s.hi || tok >= j.n)
                continue;
            float v = km_warps_sum<S>(red[0][tl], q, L), *out = s.y + (int64_t)tok * s.ldy + r;
            if (OP == KQ_STORE)
                *out = v;
            else if (OP == KQ_ADD)
                *out = *out + v;
            else
                *out = kcuda_silu_mul1(v, km_warps_sum<S>(red[NM - 1][tl], q, L));
        }
        __syncthreads();
    }
}

/* Queue a tensor-core launch: plainly, or (j.early) as a programmatic dependent launch, whose
 * blocks may start while the kernel ahead of it still runs (k_mma waits for its writes). */
static void km_start(kcuda *g, void (*kernel)(kq_job), dim3 grid, dim3 block, const kq_job &j)
{
#ifndef OROCHI_KEMU_H /* the emulation runs a stream's kernels one after another: plainly there */
    if (j.early) {
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t c = {};
        c.gridDim = grid;
        c.blockDim = block;
        c.dynamicSmemBytes = 0;
        c.stream = g->stream;
        c.attrs = at;
        c.numAttrs = 1;
        if (cudaLaunchKernelEx(&c, kernel, j) == cudaSuccess)
            return;
        (void)cudaGetLastError(); /* a runtime without it: plainly */
    }
#endif
    kernel<<<grid, block, 0, g->stream>>>(j);
}

/* The blocks of the 8-deep one-tile kernel the device holds at once (its multiprocessors times
 * what one holds of it, asked once per kernel: kcuda_depth_rule's resident8); 0 where the
 * runtime cannot say, so that the depth stays 4 — and, not yet asked, while a graph is being
 * captured (kcuda_matmul_prepare asks before). */
template <uint32_t TYPE, int OP, bool XF>
static long km_resident8(kcuda *g)
{
    static_assert(TYPE < 32 && OP < 3, "kcuda.resident8 is indexed by type and op");
    int &n = g->resident8[TYPE][OP][XF];
    if (n < 0 && g->capturing)
        return 0;
    if (n < 0) {
        int per = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k_mma<TYPE, OP, 1, 8, 1, XF>,
                                                          32 * KM_SPLIT, 0) != cudaSuccess) {
            per = 0;
            (void)cudaGetLastError();
        }
        n = per;
    }
    return (long)n * g->sms;
}

/* A quantized type on tensor cores: the token tiles a pass takes (by the step's width and its
 * token groups: kcuda_pass_tiles), the blocks a warp loads before it multiplies (kcuda_depth_rule),
 * and the groups as gridDim.y (a token's bits depend on none of them). */
template <uint32_t TYPE, int OP, bool XF>
static void km_launch(kcuda *g, dim3 grid, const kq_job &j)
{
    dim3 one(32 * KM_SPLIT), two(32 * KM_SPLIT * 2);
    static_assert(KM_TILES == 8, "km_launch takes 1, 2, 4 or 8 token tiles a pass");
    grid.y = (unsigned)kcuda_groups_rule(g->groups, j.n);
    int tiles = kcuda_pass_tiles(j.n, g->groups);
    if (tiles == 1 && kcuda_depth_rule(g->depth, 1, (long)grid.x * grid.y,
                                       g->depth ? 0 : km_resident8<TYPE, OP, XF>(g)) == 8) {
        km_start(g, k_mma<TYPE, OP, 1, 8, 1, XF>, grid, one, j);
        return;
    }
    switch (tiles) {
    case 1: km_start(g, k_mma<TYPE, OP, 1, 4, 1, XF>, grid, one, j); return;
    case 2: km_start(g, k_mma<TYPE, OP, 2, 4, 1, XF>, grid, one, j); return;
    case 4: km_start(g, k_mma<TYPE, OP, 4, 2, 2, XF>, grid, two, j); return;
    default: km_start(g, k_mma<TYPE, OP, 8, 2, 2, XF>, grid, two, j); return;
    }
}

/* A quantized type on tensor cores: its inputs in fragment order first where the rule asks for it
 * (kcuda_frag_rule) and the scratch can hold them (a capture cannot grow it: kcuda_reserve);
 * either way the same bits. */
template <uint32_t TYPE, int OP>
static void km_run(kcuda *g, dim3 grid, const kq_job &job)
{
    kq_job j = job;
    j.early = g->early;
    size_t bytes = kcuda_frag_bytes(j.n, j.cols);
    uint4 *xf = kcuda_frag_rule(g->frag, j.n) ? (uint4 *)kcuda_scratch(g, bytes) : NULL;
    if (!xf) {
        km_launch<TYPE, OP, false>(g, grid, j);
        return;
    }
    int64_t units = (int64_t)(bytes / 16);
    int blocks = (int)((units + 255) / 256);
    k_xfrag<TYPE><<<blocks < 4096 ? blocks : 4096, 256, 0, g->stream>>>(j.x, j.cols, j.n, xf);
    g->launches++;
    kq_job jf = j;
    jf.xf = xf;
    km_launch<TYPE, OP, true>(g, grid, jf);
}

/* mma.sync at its rate: KM_PEAK_CHAINS independent accumulators a warp, `iters` rounds of them;
 * `never` is NULL and the sums are positive, so nothing is written, yet nothing can be left out. */
#define KM_PEAK_CHAINS 8
#define KM_PEAK_ITERS 128
__global__ void k_mma_peak(int iters, float *never)
{
    uint32_t A[4], B[2];
    for (int i = 0; i < 4; i++)
        A[i] = km_h2(1e-3f, 2e-3f);
    B[0] = B[1] = km_h2(1e-3f, 1e-3f);
    float d[KM_PEAK_CHAINS][4] = {};
    for (int i = 0; i < iters; i++)
#pragma unroll
        for (int c = 0; c < KM_PEAK_CHAINS; c++)
            km_mma(d[c], A, B);
    float s = 0.0f;
    for (int c = 0; c < KM_PEAK_CHAINS; c++)
        s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
    if (s < 0.0f)
        *never = s;
}

int kcuda_mma_tflops(kcuda *g, double seconds, double *tflops, char *err, size_t errlen)
{
    dim3 grid(2 * (g->sms > 0 ? g->sms : 1)), block(128);
    k_mma_peak<<<grid, block, 0, g->stream>>>(KM_PEAK_ITERS, (float *)NULL); /* not timed */
    if (kcuda_sync(g, err, errlen))
        return -1;
    double t0 = kcuda_now(), dt = 0;
    long launches = 0;
    /* doubling batches of launches until `seconds` have passed (a sync between batches) */
    for (long batch = 1; dt < seconds && launches < (1L << 20); batch *= 2) {
        for (long i = 0; i < batch; i++)
            k_mma_peak<<<grid, block, 0, g->stream>>>(KM_PEAK_ITERS, (float *)NULL);
        launches += batch;
        if (kcuda_sync(g, err, errlen))
            return -1;
        dt = kcuda_now() - t0;
    }
    double mma = (double)launches * grid.x * (block.x / 32) * KM_PEAK_ITERS * KM_PEAK_CHAINS;
    *tflops = mma * 4096.0 / (dt > 0 ? dt : 1e-9) / 1e12;
    return 0;
}

template <typename T>
__global__ void k_round_kernel(const float *x, T *out, int64_t count)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        out[i] = (T)x[i];
}

static int kcuda_gemm16(kcuda *g, const kmat *w, int64_t lo, int64_t hi, int64_t c0, int64_t k,
                        const float *x, int n, float *y, int64_t ldy, char *err, size_t errlen)
{
    int64_t count = (int64_t)n * k;
    void *xs = kcuda_scratch(g, (size_t)count * 2);
    if (!xs) {
        snprintf(err, errlen, "matmul: cannot allocate %lld bytes of GPU scratch",
                 (long long)count * 2);
        return -1;
    }
    int blocks = (int)((count + 255) / 256);
    blocks = blocks < 1024 ? blocks : 1024;
    cudaDataType_t t16 = w->type == KT_F16 ? CUDA_R_16F : CUDA_R_16BF;
    g->launches += 2; /* the rounding and the GEMM */
    if (w->type == KT_F16)
        k_round_kernel<__half><<<blocks, 256, 0, g->stream>>>(x, (__half *)xs, count);
    else
        k_round_kernel<__nv_bfloat16><<<blocks, 256, 0, g->stream>>>(x, (__nv_bfloat16 *)xs, count);
    const float one = 1.0f, zero = 0.0f;
    const uint8_t *a = (const uint8_t *)w->data + (size_t)lo * w->row_bytes + (size_t)c0 * 2;
    cublasStatus_t s =
        cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)(hi - lo), n, (int)k, &one, a, t16,
                     (int)(w->row_bytes / 2), xs, t16, (int)k, &zero, y + lo, CUDA_R_32F, (int)ldy,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "matmul: cublasGemmEx failed (status %d)", (int)s);
        return -1;
    }
    return 0;
}

/* A quantized type's kernel: on tensor cores, or U groups in flight per lane. */
template <uint32_t TYPE, int OP>
static void kq_launch_quant(kcuda *g, dim3 grid, dim3 block, const kq_job &j)
{
    if (kcuda_mm_rule(g->mm_kind, TYPE) == KCUDA_MM_TC) {
        km_run<TYPE, OP>(g, grid, j);
        return;
    }
    switch (kcuda_unroll_rule(g->unroll, j.n)) {
    case 4: k_matmul<TYPE, OP, 4><<<grid, block, 0, g->stream>>>(j); return;
    case 2: k_matmul<TYPE, OP, 2><<<grid, block, 0, g->stream>>>(j); return;
    default: k_matmul<TYPE, OP, 1><<<grid, block, 0, g->stream>>>(j); return;
    }
}

/* Queue a job: its blocks are the sum of its matrices'. */
template <int OP>
static void kq_launch(kcuda *g, uint32_t type, const kq_job &j)
{
    dim3 grid(j.s[j.n_seg - 1].b1), block(32 * KQ_WARPS);
    g->launches++;
    switch (type) {
    case KT_F32: k_matmul<KT_F32, OP, 1><<<grid, block, 0, g->stream>>>(j); return;
    case KT_F16: k_matmul<KT_F16, OP, 1><<<grid, block, 0, g->stream>>>(j); return;
    case KT_BF16: k_matmul<KT_BF16, OP, 1><<<grid, block, 0, g->stream>>>(j); return;
    case KT_Q8_0: kq_launch_quant<KT_Q8_0, OP>(g, grid, block, j); return;
    case KT_Q4_0: kq_launch_quant<KT_Q4_0, OP>(g, grid, block, j); return;
    case KT_Q4_1: kq_launch_quant<KT_Q4_1, OP>(g, grid, block, j); return;
    case KT_Q5_0: kq_launch_quant<KT_Q5_0, OP>(g, grid, block, j); return;
    case KT_Q5_1: kq_launch_quant<KT_Q5_1, OP>(g, grid, block, j); return;
    case KT_IQ4_NL: kq_launch_quant<KT_IQ4_NL, OP>(g, grid, block, j); return;
    case KT_Q2_K: kq_launch_quant<KT_Q2_K, OP>(g, grid, block, j); return;
    case KT_Q3_K: kq_launch_quant<KT_Q3_K, OP>(g, grid, block, j); return;
    case KT_Q4_K: kq_launch_quant<KT_Q4_K, OP>(g, grid, block, j); return;
    case KT_Q5_K: kq_launch_quant<KT_Q5_K, OP>(g, grid, block, j); return;
    default: kq_launch_quant<KT_Q6_K, OP>(g, grid, block, j); return;
    }
}

void kcuda_set_matmul_unroll(kcuda *g, int groups)
{
    g->unroll = groups == 1 || groups == 2 || groups == 4 ? groups : 0;
}

int kcuda_matmul_unroll(const kcuda *g, int n)
{
    return kcuda_unroll_rule(g->unroll, n);
}

void kcuda_set_matmul_kind(kcuda *g, int kind)
{
    g->mm_kind = kind == KCUDA_MM_SIMT || kind == KCUDA_MM_TC ? kind : KCUDA_MM_AUTO;
}

int kcuda_matmul_kind(const kcuda *g, uint32_t type)
{
    return kcuda_mm_rule(g->mm_kind, type);
}

void kcuda_set_matmul_frag(kcuda *g, int how)
{
    g->frag = how == KCUDA_FRAG_ON || how == KCUDA_FRAG_OFF ? how : KCUDA_FRAG_AUTO;
}

int kcuda_matmul_frag(const kcuda *g, uint32_t type, int n)
{
    return kcuda_mm_rule(g->mm_kind, type) == KCUDA_MM_TC && kcuda_frag_rule(g->frag, n);
}

void kcuda_set_matmul_groups(kcuda *g, int groups)
{
    g->groups = kcuda_groups_set(groups);
}

int kcuda_matmul_groups(const kcuda *g, uint32_t type, int n)
{
    return kcuda_mm_rule(g->mm_kind, type) == KCUDA_MM_TC ? kcuda_groups_rule(g->groups, n) : 1;
}

void kcuda_set_matmul_early(kcuda *g, bool on)
{
    g->early = on;
}

void kcuda_set_matmul_depth(kcuda *g, int blocks)
{
    g->depth = blocks == 4 || blocks == 8 ? blocks : 0;
}

template <uint32_t TYPE>
static void km_prepare(kcuda *g)
{
    (void)km_resident8<TYPE, KQ_STORE, false>(g);
    (void)km_resident8<TYPE, KQ_STORE, true>(g);
    (void)km_resident8<TYPE, KQ_ADD, false>(g);
    (void)km_resident8<TYPE, KQ_ADD, true>(g);
    (void)km_resident8<TYPE, KQ_SILU, false>(g);
    (void)km_resident8<TYPE, KQ_SILU, true>(g);
}

void kcuda_matmul_prepare(kcuda *g, uint32_t type)
{
    switch (type) {
    case KT_Q8_0: km_prepare<KT_Q8_0>(g); return;
    case KT_Q4_0: km_prepare<KT_Q4_0>(g); return;
    case KT_Q4_1: km_prepare<KT_Q4_1>(g); return;
    case KT_Q5_0: km_prepare<KT_Q5_0>(g); return;
    case KT_Q5_1: km_prepare<KT_Q5_1>(g); return;
    case KT_IQ4_NL: km_prepare<KT_IQ4_NL>(g); return;
    case KT_Q2_K: km_prepare<KT_Q2_K>(g); return;
    case KT_Q3_K: km_prepare<KT_Q3_K>(g); return;
    case KT_Q4_K: km_prepare<KT_Q4_K>(g); return;
    case KT_Q5_K: km_prepare<KT_Q5_K>(g); return;
    case KT_Q6_K: km_prepare<KT_Q6_K>(g); return;
    default: return; /* float types: CUDA cores */
    }
}

int kcuda_matmul_depth(kcuda *g, uint32_t type, int64_t rows, int n)
{
    if (kcuda_mm_rule(g->mm_kind, type) != KCUDA_MM_TC)
        return 0;
    int tiles = kcuda_pass_tiles(n, g->groups);
    long blocks = (long)((rows + KM_ROWS * km_tiles_per_block(tiles) - 1) /
                         (KM_ROWS * km_tiles_per_block(tiles))) *
                  kcuda_groups_rule(g->groups, n);
    int per = 0; /* what a multiprocessor holds of the q/k/v launch's 8-deep kernel */
    if (tiles == 1 && !g->depth) {
        kcuda_matmul_prepare(g, type); /* asked once (km_resident8); not while capturing */
        per = g->resident8[type][KQ_STORE][kcuda_frag_rule(g->frag, n)];
    }
    return kcuda_depth_rule(g->depth, tiles, blocks, per > 0 ? (long)per * g->sms : 0);
}

/* Matrix w's rows [lo, hi) from input column c0 as the job's next matrix. */
static void kq_add(const kcuda *g, kq_job *j, const kmat *w, const kmat *w2, int64_t lo, int64_t hi,
                   int64_t c0, float *y, int64_t ldy)
{
    /* a block's rows: a warp's on CUDA cores, its 16-row tiles on tensor cores */
    int64_t rpb = kcuda_mm_rule(g->mm_kind, w->type) == KCUDA_MM_TC
                      ? KM_ROWS * km_tiles_per_block(kcuda_pass_tiles(j->n, g->groups))
                      : KQ_WARPS;
    size_t at = kt_row_bytes(w->type, (uint64_t)c0); /* on a block: kcuda_check_matmul */
    unsigned b0 = j->n_seg ? j->s[j->n_seg - 1].b1 : 0;
    kq_seg *s = &j->s[j->n_seg++];
    s->w = (const uint8_t *)w->data + at;
    s->w2 = w2 ? (const uint8_t *)w2->data + at : NULL;
    s->row_bytes = w->row_bytes;
    s->lo = lo;
    s->hi = hi;
    s->y = y;
    s->ldy = ldy;
    s->b1 = b0 + (unsigned)((hi - lo + rpb - 1) / rpb);
}

/* One matrix (two under KQ_SILU) over input columns [c0, c1). */
template <int OP>
static int kq_one(kcuda *g, const kmat *w, const kmat *w2, int64_t lo, int64_t hi, int64_t c0,
                  int64_t c1, const float *x, int n, float *y, int64_t ldy, char *err,
                  size_t errlen)
{
    if (n <= 0 || hi <= lo)
        return 0;
    if (kcuda_check_matmul(w, c0, c1, err, errlen) ||
        (w2 && kcuda_check_same(w, w2, "gate and up", err, errlen)))
        return -1;
    kq_job j = {};
    j.cols = c1 - c0;
    j.x = x;
    j.n = n;
    kq_add(g, &j, w, w2, lo, hi, c0, y, ldy);
    kq_launch<OP>(g, w->type, j);
    return 0;
}

int kcuda_matmul_cols(kcuda *g, const kmat *w, int64_t lo, int64_t hi, int64_t c0, int64_t c1,
                      const float *x, int n, float *y, int64_t ldy, char *err, size_t errlen)
{
    return kq_one<KQ_STORE>(g, w, NULL, lo, hi, c0, c1, x, n, y, ldy, err, errlen);
}

int kcuda_matmul_add(kcuda *g, const kmat *w, int64_t lo, int64_t hi, const float *x, int n,
                     float *y, int64_t ldy, char *err, size_t errlen)
{
    return kq_one<KQ_ADD>(g, w, NULL, lo, hi, 0, w->cols, x, n, y, ldy, err, errlen);
}

int kcuda_matmul_silu(kcuda *g, const kmat *gate, const kmat *up, int64_t lo, int64_t hi,
                      const float *x, int n, float *y, int64_t ldy, char *err, size_t errlen)
{
    return kq_one<KQ_SILU>(g, gate, up, lo, hi, 0, gate->cols, x, n, y, ldy, err, errlen);
}

int kcuda_matmul_multi(kcuda *g, const kcuda_mm *mm, int count, const float *x, int n, char *err,
                       size_t errlen)
{
    if (kcuda_check_multi(mm, count, err, errlen))
        return -1;
    kq_job j = {};
    j.cols = mm[0].w->cols;
    j.x = x;
    j.n = n;
    for (int i = 0; i < count; i++)
        if (mm[i].hi > mm[i].lo)
            kq_add(g, &j, mm[i].w, NULL, mm[i].lo, mm[i].hi, 0, mm[i].y, mm[i].ldy);
    if (n > 0 && j.n_seg)
        kq_launch<KQ_STORE>(g, mm[0].w->type, j);
    return 0;
}

int kcuda_matmul(kcuda *g, const kmat *w, int64_t lo, int64_t hi, const float *x, int n, float *y,
                 int64_t ldy, char *err, size_t errlen)
{
    return kcuda_matmul_cols(g, w, lo, hi, 0, w->cols, x, n, y, ldy, err, errlen);
}

int kcuda_matmul_blas(kcuda *g, const kmat *w, int64_t lo, int64_t hi, const float *x, int n,
                      float *y, int64_t ldy, char *err, size_t errlen)
{
    if (n <= 0 || hi <= lo)
        return 0;
    if (kcuda_check_matmul(w, 0, w->cols, err, errlen))
        return -1;
    if (w->type == KT_F16 || w->type == KT_BF16)
        return kcuda_gemm16(g, w, lo, hi, 0, w->cols, x, n, y, ldy, err, errlen);
    if (w->type != KT_F32)
        return kcuda_matmul(g, w, lo, hi, x, n, y, ldy, err, errlen);
    const float one = 1.0f, zero = 0.0f;
    g->launches++;
    cublasStatus_t s = cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)(hi - lo), n,
                                   (int)w->cols, &one, (const float *)w->data + lo * w->cols,
                                   (int)(w->row_bytes / 4), x, (int)w->cols, &zero, y + lo,
                                   (int)ldy);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "matmul: cublasSgemm failed (status %d)", (int)s);
        return -1;
    }
    return 0;
}
