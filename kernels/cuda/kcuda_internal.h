/*
 * kernels/cuda/kcuda_internal.h — what the GPU op set's source files share: the context, warp
 * reductions, and the element reader of every type the GPU takes (GGUF block layouts, as
 * kernels/cpu/types.c reads them).
 */
#ifndef OROCHI_KCUDA_INTERNAL_H
#define OROCHI_KCUDA_INTERNAL_H

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
    void *scratch; /* the 16-bit activations of a cuBLAS matmul */
    size_t scratch_bytes;
    void *blas_ws; /* cuBLAS's workspace, set once so that a captured matmul allocates nothing */
    bool capturing;
    long launches; /* ops queued (kcuda_launches) */
    int unroll;    /* quantized matmul: groups a lane loads before adding, 0 by the step
                      (kcuda_set_matmul_unroll) */
    int sms;         /* the device's multiprocessors (kcuda_att_parts) */
    int att_keys;    /* keys an attention warp scores at a time (kcuda_set_att_keys) */
    int att_tile;    /* attention by tiles: KCUDA_TILE_* (kcuda_set_att_tile) */
    float *att_part; /* attention's part records, KCUDA_ATT_PART_FLOATS (NULL: streams not cut) */
};

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

/* Element c of a GGUF row of `type` (the types kcuda_type_ok accepts). */
__device__ static inline float kcuda_dequant(uint32_t type, const uint8_t *row, int64_t c)
{
    switch (type) {
    case KT_F32: return ((const float *)row)[c];
    case KT_F16: return __half2float(((const __half *)row)[c]);
    case KT_BF16: return __bfloat162float(((const __nv_bfloat16 *)row)[c]);
    case KT_Q8_0: {
        const uint8_t *b = row + (c / 32) * 34;
        return kcuda_half(b) * (float)(int8_t)b[2 + c % 32];
    }
    case KT_Q4_0: {
        const uint8_t *b = row + (c / 32) * 18;
        int j = (int)(c % 32), q = j < 16 ? (b[2 + j] & 0xf) : (b[2 + j - 16] >> 4);
        return kcuda_half(b) * (float)(q - 8);
    }
    case KT_Q4_1: {
        const uint8_t *b = row + (c / 32) * 20;
        int j = (int)(c % 32), q = j < 16 ? (b[4 + j] & 0xf) : (b[4 + j - 16] >> 4);
        return kcuda_half(b) * (float)q + kcuda_half(b + 2);
    }
    default: return 0.0f;
    }
}

#endif
