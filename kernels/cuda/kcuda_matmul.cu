/*
 * kernels/cuda/kcuda_matmul.cu — y[t][r] = W[r] . x[t] over an output-row range on the GPU.
 *
 * F32: cuBLAS SGEMM. F16 and BF16: the activations are rounded to the weight's type into the
 * context's scratch, then cublasGemmEx with f32 accumulation. Q8_0, Q4_0, Q4_1 (decode and
 * verification widths): one warp per output row; each lane dequantizes whole 32-element blocks
 * into registers and multiplies them with up to KQ_TOK tokens at once, so a weight block is read
 * from memory once per KQ_TOK tokens; the lanes' sums meet in a warp reduction. Over a range of
 * input columns only (kcuda_matmul_cols, the Megatron plan's partial sums), every type starts its
 * rows at the range's first block.
 */
#include <stdio.h>

#include "kernels/cuda/kcuda_internal.h"

#define KQ_TOK 8      /* tokens per pass over a weight row */
#define KQ_WARPS 4    /* rows per block */

template <uint32_t TYPE>
__device__ static inline void kq_block(const uint8_t *b, float w[32])
{
    if (TYPE == KT_Q8_0) {
        float d = kcuda_half(b);
        for (int i = 0; i < 32; i++)
            w[i] = d * (float)(int8_t)b[2 + i];
    } else if (TYPE == KT_Q4_0) {
        float d = kcuda_half(b);
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)((b[2 + j] & 0xf) - 8);
            w[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
        }
    } else {
        float d = kcuda_half(b), m = kcuda_half(b + 2);
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)(b[4 + j] & 0xf) + m;
            w[j + 16] = d * (float)(b[4 + j] >> 4) + m;
        }
    }
}

/* cols: the input columns multiplied (x's row length); w's rows start at the first of them */
template <uint32_t TYPE, int BLOCK_BYTES>
__global__ void kq_matmul(const uint8_t *w, size_t row_bytes, int64_t cols, int64_t lo, int64_t hi,
                          const float *x, int n, float *y, int64_t ldy)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int64_t r = lo + (int64_t)blockIdx.x * KQ_WARPS + warp;
    if (r >= hi)
        return;
    const uint8_t *row = w + (size_t)r * row_bytes;
    int64_t nb = cols / 32;
    for (int t0 = 0; t0 < n; t0 += KQ_TOK) {
        int nt = n - t0 < KQ_TOK ? n - t0 : KQ_TOK;
        float acc[KQ_TOK];
        for (int t = 0; t < KQ_TOK; t++)
            acc[t] = 0.0f;
        for (int64_t b = lane; b < nb; b += 32) {
            float wv[32];
            kq_block<TYPE>(row + (size_t)b * BLOCK_BYTES, wv);
            for (int t = 0; t < nt; t++) {
                const float4 *xp = (const float4 *)(x + (int64_t)(t0 + t) * cols + b * 32);
                float s = 0.0f;
                for (int i = 0; i < 8; i++) {
                    float4 v = xp[i];
                    s += wv[4 * i] * v.x + wv[4 * i + 1] * v.y + wv[4 * i + 2] * v.z +
                         wv[4 * i + 3] * v.w;
                }
                acc[t] += s;
            }
        }
        for (int t = 0; t < nt; t++) {
            float s = kcuda_warp_sum(acc[t]);
            if (lane == 0)
                y[(int64_t)(t0 + t) * ldy + r] = s;
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

int kcuda_matmul_cols(kcuda *g, const kmat *w, int64_t lo, int64_t hi, int64_t c0, int64_t c1,
                      const float *x, int n, float *y, int64_t ldy, char *err, size_t errlen)
{
    if (n <= 0 || hi <= lo)
        return 0;
    if (kcuda_check_matmul(w, c0, c1, err, errlen))
        return -1;
    int64_t k = c1 - c0;
    const uint8_t *wd = (const uint8_t *)w->data;
    unsigned blocks = (unsigned)((hi - lo + KQ_WARPS - 1) / KQ_WARPS);
    switch (w->type) {
    case KT_F32: {
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t s = cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)(hi - lo), n, (int)k,
                                       &one, (const float *)wd + lo * w->cols + c0,
                                       (int)(w->row_bytes / 4), x, (int)k, &zero, y + lo, (int)ldy);
        if (s != CUBLAS_STATUS_SUCCESS) {
            snprintf(err, errlen, "matmul: cublasSgemm failed (status %d)", (int)s);
            return -1;
        }
        return 0;
    }
    case KT_F16:
    case KT_BF16: return kcuda_gemm16(g, w, lo, hi, c0, k, x, n, y, ldy, err, errlen);
    case KT_Q8_0:
        kq_matmul<KT_Q8_0, 34><<<blocks, 32 * KQ_WARPS, 0, g->stream>>>(
            wd + (c0 / 32) * 34, w->row_bytes, k, lo, hi, x, n, y, ldy);
        return 0;
    case KT_Q4_0:
        kq_matmul<KT_Q4_0, 18><<<blocks, 32 * KQ_WARPS, 0, g->stream>>>(
            wd + (c0 / 32) * 18, w->row_bytes, k, lo, hi, x, n, y, ldy);
        return 0;
    default:
        kq_matmul<KT_Q4_1, 20><<<blocks, 32 * KQ_WARPS, 0, g->stream>>>(
            wd + (c0 / 32) * 20, w->row_bytes, k, lo, hi, x, n, y, ldy);
        return 0;
    }
}

int kcuda_matmul(kcuda *g, const kmat *w, int64_t lo, int64_t hi, const float *x, int n, float *y,
                 int64_t ldy, char *err, size_t errlen)
{
    return kcuda_matmul_cols(g, w, lo, hi, 0, w->cols, x, n, y, ldy, err, errlen);
}
