/*
 * kernels/cuda/kcuda_matmul.cu — y[t][r] = W[r] . x[t] over an output-row range on the GPU.
 *
 * kcuda_matmul / kcuda_matmul_cols, every type (k_matmul): one warp per output row, taking
 * 256 columns per iteration so that its loads of weights and inputs fall on consecutive
 * addresses (k_group: four lanes to a quantized block, each dequantizing 8 weights in registers;
 * float rows: lane l takes every 32nd column from l, the row's end possibly short). Each weight is
 * multiplied with up to KQ_TOK tokens at once, so it is read from memory once per KQ_TOK tokens;
 * the lanes' sums meet in a warp reduction. Each token's sum is taken in the same order
 * whatever the batch, so a token's result does not depend on the width of the batch it came in:
 * a tree's verification computes the bits sequential decoding computes (docs/gpu.md, "Why the
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

/* The 8 weights lane `sub` (0..3) of a quantized block takes, and where their inputs lie: w[0..3]
 * multiply the 4 inputs from column *a of the block, w[4..7] the 4 from *b. Q4_0 / Q4_1: the 4
 * quant bytes 4*sub.. (their low nibbles are columns 4*sub.., their high ones 16 + 4*sub..);
 * Q8_0: the 8 quants 8*sub... So the 4 lanes of a block read its quants as one run of bytes and
 * their inputs as one run of floats, and a warp's loads fall on consecutive addresses. */
template <uint32_t TYPE>
__device__ static inline void k_group(const uint8_t *row, int64_t b, int sub, float w[8], int *a,
                                      int *bo)
{
    if (TYPE == KT_Q4_1) {
        const uint8_t *q = row + (size_t)b * 20;
        float d = kcuda_half(q), m = kcuda_half(q + 2);
        uint32_t v = *(const uint32_t *)(q + 4 + 4 * sub); /* 20-byte blocks: 4-aligned */
        for (int i = 0; i < 4; i++) {
            w[i] = d * (float)((v >> (8 * i)) & 0xf) + m;
            w[4 + i] = d * (float)((v >> (8 * i + 4)) & 0xf) + m;
        }
        *a = 4 * sub;
        *bo = 16 + 4 * sub;
    } else if (TYPE == KT_Q4_0) {
        const uint8_t *q = row + (size_t)b * 18;
        float d = kcuda_half(q);
        const uint16_t *h = (const uint16_t *)(q + 2 + 4 * sub); /* 18-byte blocks: 2-aligned */
        uint32_t v = (uint32_t)h[0] | (uint32_t)h[1] << 16;
        for (int i = 0; i < 4; i++) {
            w[i] = d * (float)((int)((v >> (8 * i)) & 0xf) - 8);
            w[4 + i] = d * (float)((int)((v >> (8 * i + 4)) & 0xf) - 8);
        }
        *a = 4 * sub;
        *bo = 16 + 4 * sub;
    } else { /* Q8_0 */
        const uint8_t *q = row + (size_t)b * 34;
        float d = kcuda_half(q);
        const uint16_t *h = (const uint16_t *)(q + 2 + 8 * sub); /* 34-byte blocks: 2-aligned */
        for (int i = 0; i < 4; i++) {
            w[2 * i] = d * (float)(int8_t)(h[i] & 0xff);
            w[2 * i + 1] = d * (float)(int8_t)(h[i] >> 8);
        }
        *a = 8 * sub;
        *bo = 8 * sub + 4;
    }
}

/* acc[t] += the 8 weights of one group times their inputs, for tokens t < nt (xb: token 0's
 * inputs of the group's block; a, bo: k_group's offsets). One expression wherever it is used, so
 * that every caller sums alike. */
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

/* The sums of one weight row (its columns from the first multiplied) with tokens [t0, t0 + nt)
 * of x (rows of `cols` values), this lane's share of them into acc[0..nt). Quantized rows: lane l
 * takes the group l % 4 of block l / 4 + 8 i (i = 0, 1, ...), loading U groups before it adds
 * any of them (U loads in flight; the additions in the same order, so every U gives the same
 * bits); float rows: lane l takes columns l + 32 j. Each lane's sum per token runs over its
 * columns in one order, whatever n. */
template <uint32_t TYPE, int U>
__device__ static inline void k_row_sums(const uint8_t *row, int64_t cols, const float *xt, int nt,
                                         int lane, float acc[KQ_TOK])
{
    const bool quant = TYPE == KT_Q8_0 || TYPE == KT_Q4_0 || TYPE == KT_Q4_1;
    const int step = KQ_SPAN / 32; /* blocks a warp iteration covers */
#pragma unroll
    for (int t = 0; t < KQ_TOK; t++)
        acc[t] = 0.0f;
    if (quant) {
        int sub = lane & 3, a = 0, bo = 0;
        int64_t b = lane >> 2, nb = cols / 32;
        for (; b + (U - 1) * step < nb; b += U * step) {
            float wv[U][8];
#pragma unroll
            for (int u = 0; u < U; u++)
                k_group<TYPE>(row, b + u * step, sub, wv[u], &a, &bo);
#pragma unroll
            for (int u = 0; u < U; u++)
                k_group_acc(wv[u], a, bo, xt + (b + u * step) * 32, cols, nt, acc);
        }
        for (; b < nb; b += step) { /* the row's last blocks, fewer than U groups */
            float wv[8];
            k_group<TYPE>(row, b, sub, wv, &a, &bo);
            k_group_acc(wv, a, bo, xt + b * 32, cols, nt, acc);
        }
    } else {
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
    int n;
};

/* One warp per output row of one of the job's matrices (the block's index picks which); the
 * lanes' sums meet in a warp reduction, in one order, so a row's result is the same bits for
 * every OP and every batch width. */
template <uint32_t TYPE, int OP, int U>
__global__ void k_matmul(kq_job j)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* the block's matrix, by constant indices (the job stays in the parameter bank) */
    static_assert(KCUDA_MM_MAX == 3, "k_matmul picks among three matrices");
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
    int64_t r = s.lo + (int64_t)(blockIdx.x - b0) * KQ_WARPS + warp;
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

/* A quantized type's kernel, U groups in flight per lane. */
template <uint32_t TYPE, int OP>
static void kq_launch_quant(kcuda *g, dim3 grid, dim3 block, const kq_job &j)
{
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
    default: kq_launch_quant<KT_Q4_1, OP>(g, grid, block, j); return;
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

/* Matrix w's rows [lo, hi) from input column c0 as the job's next matrix. */
static void kq_add(kq_job *j, const kmat *w, const kmat *w2, int64_t lo, int64_t hi, int64_t c0,
                   float *y, int64_t ldy)
{
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
    s->b1 = b0 + (unsigned)((hi - lo + KQ_WARPS - 1) / KQ_WARPS);
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
    kq_add(&j, w, w2, lo, hi, c0, y, ldy);
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
            kq_add(&j, mm[i].w, NULL, mm[i].lo, mm[i].hi, 0, mm[i].y, mm[i].ldy);
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
