/*
 * kernels/cuda/kcuda.cu — the context (stream, cuBLAS handle, scratch), memory, and the
 * element-wise ops of the GPU op set (kcuda.h): rmsnorm, rope, silu*mul, residual add, embedding
 * rows. The matmul is in kcuda_matmul.cu, attention in kcuda_attention.cu.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/kcuda_internal.h"

#define KCUDA_BLAS_WS ((size_t)32 << 20) /* bytes of cuBLAS workspace (its Hopper guidance) */

int kcuda_devices(char *why, size_t whylen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(why, whylen, "no usable CUDA device (cudaGetDeviceCount: %s)",
                 cudaGetErrorString(e));
        return 0;
    }
    if (n == 0)
        snprintf(why, whylen, "no CUDA device (cudaGetDeviceCount found 0)");
    return n;
}

int kcuda_fail(cudaError_t e, const char *what, char *err, size_t errlen)
{
    if (e == cudaSuccess)
        return 0;
    snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(e));
    return -1;
}

kcuda *kcuda_new(int device, char *err, size_t errlen)
{
    kcuda *g = (kcuda *)calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    g->device = device;
    g->att_keys = 4;
    if (kcuda_fail(cudaSetDevice(device), "cudaSetDevice", err, errlen) ||
        kcuda_fail(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking),
                   "cudaStreamCreate", err, errlen)) {
        free(g);
        return NULL;
    }
    if (cublasCreate(&g->blas) != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "cublasCreate failed");
        cudaStreamDestroy(g->stream);
        free(g);
        return NULL;
    }
    cublasSetStream(g->blas, g->stream);
    /* after cublasSetStream, which resets the workspace to cuBLAS's own pool */
    if (cudaMalloc(&g->blas_ws, KCUDA_BLAS_WS) == cudaSuccess)
        cublasSetWorkspace(g->blas, g->blas_ws, KCUDA_BLAS_WS);
    else
        g->blas_ws = NULL;
    /* attention cuts long key streams into parts only with somewhere to put their records */
    if (cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        g->sms < 1)
        g->sms = 1;
    memset(g->resident8, 0xff, sizeof g->resident8); /* -1: asked at the first launch */
    if (cudaMalloc((void **)&g->att_part, KCUDA_ATT_PART_FLOATS * sizeof(float)) != cudaSuccess)
        g->att_part = NULL;
    return g;
}

void kcuda_destroy(kcuda **gp)
{
    kcuda *g = *gp;
    if (!g)
        return;
    cudaStreamSynchronize(g->stream);
    cudaFree(g->scratch);
    cudaFree(g->att_part);
    cublasDestroy(g->blas);
    cudaFree(g->blas_ws);
    cudaStreamDestroy(g->stream);
    free(g);
    *gp = NULL;
}

int kcuda_copy_gbps(kcuda *g, size_t bytes, int reps, double *gbps, char *err, size_t errlen)
{
    void *a = NULL, *b = NULL;
    if (kcuda_fail(cudaMalloc(&a, bytes), "copy bandwidth: cudaMalloc", err, errlen) ||
        kcuda_fail(cudaMalloc(&b, bytes), "copy bandwidth: cudaMalloc", err, errlen)) {
        cudaFree(a);
        return -1;
    }
    int rc = 0;
    double t0 = 0;
    for (int i = -1; i < reps && !rc; i++) { /* the first copy is not timed */
        rc = kcuda_fail(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, g->stream),
                        "copy bandwidth: cudaMemcpyAsync", err, errlen);
        if (i == -1 && !rc) {
            rc = kcuda_sync(g, err, errlen);
            t0 = kcuda_now();
        }
    }
    if (!rc)
        rc = kcuda_sync(g, err, errlen);
    double dt = kcuda_now() - t0;
    if (!rc)
        *gbps = 2.0 * (double)bytes * reps / (dt > 0 ? dt : 1e-9) / 1e9;
    cudaFree(a);
    cudaFree(b);
    return rc;
}

void kcuda_describe(const kcuda *g, char *out, size_t len)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, g->device) != cudaSuccess) {
        snprintf(out, len, "CUDA device %d", g->device);
        return;
    }
    snprintf(out, len, "%s, %.0f GiB, sm_%d%d, %d multiprocessors", p.name,
             (double)p.totalGlobalMem / (1u << 30), p.major, p.minor, p.multiProcessorCount);
}

int kcuda_integrated(const kcuda *g)
{
    int v = 0;
    return cudaDeviceGetAttribute(&v, cudaDevAttrIntegrated, g->device) == cudaSuccess && v;
}

int kcuda_sync(kcuda *g, char *err, size_t errlen)
{
    if (kcuda_fail(cudaStreamSynchronize(g->stream), "a queued GPU op failed", err, errlen))
        return -1;
    return kcuda_fail(cudaGetLastError(), "a GPU launch failed", err, errlen);
}

void *kcuda_scratch(kcuda *g, size_t bytes)
{
    if (bytes <= g->scratch_bytes)
        return g->scratch;
    /* no wait or allocation inside a capture (kcuda_reserve first), and none after one: a
     * recorded graph may hold the scratch's address */
    if (g->capturing || g->captured)
        return NULL;
    cudaStreamSynchronize(g->stream); /* queued ops may still read the old buffer */
    cudaFree(g->scratch);
    g->scratch = NULL;
    g->scratch_bytes = 0;
    if (cudaMalloc(&g->scratch, bytes) != cudaSuccess)
        return NULL;
    g->scratch_bytes = bytes;
    return g->scratch;
}

int kcuda_reserve(kcuda *g, size_t bytes, char *err, size_t errlen)
{
    if (kcuda_scratch(g, bytes))
        return 0;
    snprintf(err, errlen, "cannot allocate %zu bytes of GPU scratch", bytes);
    return -1;
}

void *kcuda_alloc(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes ? bytes : 1) == cudaSuccess ? p : NULL;
}

void kcuda_free(void *p)
{
    cudaFree(p);
}

int kcuda_upload(kcuda *g, void *dst, const void *src, size_t bytes, char *err, size_t errlen)
{
    g->launches++;
    return kcuda_fail(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->stream),
                      "upload", err, errlen);
}

int kcuda_download(kcuda *g, void *dst, const void *src, size_t bytes, char *err, size_t errlen)
{
    g->launches++;
    return kcuda_fail(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream),
                      "download", err, errlen);
}

int kcuda_copy2d(kcuda *g, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                 size_t rows, char *err, size_t errlen)
{
    if (!rows || !width)
        return 0;
    g->launches++;
    return kcuda_fail(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDefault,
                                        g->stream),
                      "2-D copy", err, errlen);
}

int kcuda_register(void *host, size_t bytes, void **dev, char *err, size_t errlen)
{
    if (kcuda_fail(cudaHostRegister(host, bytes, cudaHostRegisterMapped), "cudaHostRegister",
                   err, errlen))
        return -1;
    if (kcuda_fail(cudaHostGetDevicePointer(dev, host, 0), "cudaHostGetDevicePointer", err,
                   errlen)) {
        cudaHostUnregister(host);
        return -1;
    }
    return 0;
}

int kcuda_register_ro(const void *host, size_t bytes, void **dev, char *err, size_t errlen)
{
    void *h = (void *)host; /* the device only reads it */
    cudaError_t e = cudaHostRegister(h, bytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly);
    int rc = 0;
    if (e == cudaErrorHostMemoryAlreadyRegistered) { /* another context of this process did */
        cudaGetLastError();
        rc = 1;
    } else if (kcuda_fail(e, "cudaHostRegister (read-only)", err, errlen)) {
        return -1;
    }
    if (kcuda_fail(cudaHostGetDevicePointer(dev, h, 0), "cudaHostGetDevicePointer", err,
                   errlen)) {
        if (!rc)
            cudaHostUnregister(h);
        return -1;
    }
    return rc;
}

void kcuda_unregister(void *host)
{
    cudaHostUnregister(host);
}

/* ===== strided copies ===== */

/* Block (blockIdx.z, blockIdx.y); the x dimension strides over its units (T: 16 or 4 bytes). */
template <typename T>
__global__ void k_copy3d_kernel(uint8_t *dst, size_t dst_pitch_z, const uint8_t *src,
                                size_t src_pitch_z, size_t units, size_t pitch_y)
{
    size_t row = (size_t)blockIdx.y * pitch_y;
    T *d = (T *)(dst + (size_t)blockIdx.z * dst_pitch_z + row);
    const T *s = (const T *)(src + (size_t)blockIdx.z * src_pitch_z + row);
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < units;
         i += (size_t)gridDim.x * blockDim.x)
        d[i] = s[i];
}

void kcuda_copy3d_pz(kcuda *g, void *dst, size_t dst_pitch_z, const void *src, size_t src_pitch_z,
                     size_t width, size_t height, size_t pitch_y, size_t depth)
{
    if (!width || !height || !depth)
        return;
    bool wide = !(((uintptr_t)dst | (uintptr_t)src | width | pitch_y | dst_pitch_z | src_pitch_z) &
                  15);
    size_t unit = wide ? 16 : 4, units = width / unit;
    unsigned bx = (unsigned)((units + 255) / 256);
    dim3 grid(bx < 32 ? bx : 32, (unsigned)height, (unsigned)depth);
    g->launches++;
    if (wide)
        k_copy3d_kernel<uint4><<<grid, 256, 0, g->stream>>>(
            (uint8_t *)dst, dst_pitch_z, (const uint8_t *)src, src_pitch_z, units, pitch_y);
    else
        k_copy3d_kernel<uint32_t><<<grid, 256, 0, g->stream>>>(
            (uint8_t *)dst, dst_pitch_z, (const uint8_t *)src, src_pitch_z, units, pitch_y);
}

void kcuda_copy3d(kcuda *g, void *dst, const void *src, size_t width, size_t height,
                  size_t pitch_y, size_t depth, size_t pitch_z)
{
    kcuda_copy3d_pz(g, dst, pitch_z, src, pitch_z, width, height, pitch_y, depth);
}

/* One block per (row, head): its head_dim values, rounded to the block's type. */
template <typename T>
__global__ void k_kv_store_kernel(T *dst, int64_t head_rows, int64_t r0, const float *src,
                                  int64_t src_stride, int h0, int head_dim)
{
    int t = blockIdx.x, h = h0 + blockIdx.y;
    const float *s = src + (int64_t)t * src_stride + (int64_t)h * head_dim;
    T *d = dst + ((int64_t)h * head_rows + r0 + t) * head_dim;
    for (int e = threadIdx.x; e < head_dim; e += blockDim.x)
        d[e] = (T)s[e];
}

void kcuda_kv_store(kcuda *g, kv_type type, void *dst, int64_t head_rows, int64_t r0,
                    const float *src, int64_t src_stride, int h0, int h1, int head_dim, int n)
{
    if (n <= 0 || h1 <= h0)
        return;
    dim3 grid(n, h1 - h0);
    g->launches++;
    if (type == KV_F16) /* the conversion rounds to nearest even */
        k_kv_store_kernel<__half><<<grid, 64, 0, g->stream>>>((__half *)dst, head_rows, r0, src,
                                                              src_stride, h0, head_dim);
    else
        k_kv_store_kernel<float><<<grid, 64, 0, g->stream>>>((float *)dst, head_rows, r0, src,
                                                             src_stride, h0, head_dim);
}

/* ===== graphs ===== */

struct kcuda_graph {
    cudaGraphExec_t exec;
};

int kcuda_capture_begin(kcuda *g, char *err, size_t errlen)
{
    /* thread-local: other threads of the process (CPU parts, the runtime) may call CUDA meanwhile */
    if (kcuda_fail(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal),
                   "cudaStreamBeginCapture", err, errlen))
        return -1;
    g->capturing = true;
    g->captured = true;
    return 0;
}

kcuda_graph *kcuda_capture_end(kcuda *g, char *err, size_t errlen)
{
    cudaGraph_t graph = NULL;
    g->capturing = false;
    cudaError_t e = cudaStreamEndCapture(g->stream, &graph);
    if (kcuda_fail(e, "cudaStreamEndCapture", err, errlen)) {
        if (graph)
            cudaGraphDestroy(graph);
        cudaGetLastError(); /* a failed capture is not the next op's error */
        return NULL;
    }
    kcuda_graph *kg = (kcuda_graph *)calloc(1, sizeof *kg);
    if (!kg) {
        cudaGraphDestroy(graph);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    e = cudaGraphInstantiate(&kg->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (kcuda_fail(e, "cudaGraphInstantiate", err, errlen)) {
        cudaGetLastError();
        free(kg);
        return NULL;
    }
    return kg;
}

int kcuda_graph_launch(kcuda *g, kcuda_graph *graph, char *err, size_t errlen)
{
    g->launches++;
    return kcuda_fail(cudaGraphLaunch(graph->exec, g->stream), "cudaGraphLaunch", err, errlen);
}

void kcuda_graph_destroy(kcuda_graph **graph)
{
    if (!*graph)
        return;
    cudaGraphExecDestroy((*graph)->exec);
    free(*graph);
    *graph = NULL;
}

/* ===== element-wise ops ===== */

/* One block per row: the sum of squares in double, as k_rmsnorm. */
__global__ void k_rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps)
{
    kcuda_let_next_start(); /* the matmul after it may start (kcuda_set_matmul_early) */
    const float *xr = x + (int64_t)blockIdx.x * dim;
    float *o = out + (int64_t)blockIdx.x * dim;
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        ss += (double)xr[i] * xr[i];
    __shared__ double part[32];
    ss = kcuda_warp_sum_d(ss);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        double v = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0;
        v = kcuda_warp_sum_d(v);
        if (threadIdx.x == 0)
            part[0] = v;
    }
    __syncthreads();
    float scale = (float)(1.0 / sqrt(part[0] / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        o[i] = xr[i] * scale * w[i];
}

void kcuda_rmsnorm(kcuda *g, float *out, const float *x, const float *weight, int dim, int n,
                   float eps)
{
    if (n <= 0)
        return;
    g->launches++;
    k_rmsnorm_kernel<<<n, 256, 0, g->stream>>>(out, x, weight, dim, eps);
}

/* The pair (p[0], p[1]) rotated by cos c, sin s, rounded as k_rope_apply rounds it (no fused
 * multiply-add): the RoPE op and the fused RoPE-and-store share it. */
__device__ static inline void k_rope_pair(float *p, float c, float s)
{
    float a = p[0], b = p[1];
    p[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    p[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

__global__ void k_rope_kernel(float *x, int64_t stride, int n_heads, int head_dim, int half,
                              const float *cs, const float *sn)
{
    int t = blockIdx.x;
    float *row = x + (int64_t)t * stride;
    for (int e = threadIdx.x; e < n_heads * half; e += blockDim.x) {
        int h = e / half, i = e % half;
        k_rope_pair(row + (int64_t)h * head_dim + 2 * i, cs[t * half + i], sn[t * half + i]);
    }
}

void kcuda_rope(kcuda *g, float *x, int n, int64_t stride, int n_heads, int head_dim, int half,
                const float *cs, const float *sn)
{
    if (n <= 0 || n_heads <= 0 || half <= 0)
        return;
    g->launches++;
    k_rope_kernel<<<n, 128, 0, g->stream>>>(x, stride, n_heads, head_dim, half, cs, sn);
}

/* One block per token: RoPE of its query heads and of its key heads [kv_h0, kv_h1) (as
 * k_rope_kernel), then, once the block has rotated them, its key and value heads stored into
 * every destination (as k_kv_store_kernel). */
template <typename T>
__global__ void k_rope_store_kernel(kcuda_rope_kv a)
{
    int t = blockIdx.x, half = a.half, hd = a.head_dim;
    const float *c = a.cs + t * half, *sn = a.sn + t * half;
    float *qr = a.q + (int64_t)t * a.q_stride, *kr = a.k + (int64_t)t * a.kv_stride;
    float *vw = (float *)a.v + (int64_t)t * a.kv_stride;
    int nkh = a.kv_h1 - a.kv_h0;
    if (a.bq || a.bk || a.bv) { /* the biases (qwen2) */
        int64_t nq = (int64_t)a.q_heads * hd, nk = (int64_t)nkh * hd, k0 = (int64_t)a.kv_h0 * hd;
        for (int64_t e = threadIdx.x; e < nq + 2 * nk; e += blockDim.x) {
            if (e < nq) {
                if (a.bq)
                    qr[e] += a.bq[e];
            } else if (e < nq + nk) {
                if (a.bk)
                    kr[k0 + e - nq] += a.bk[k0 + e - nq];
            } else if (a.bv) {
                vw[k0 + e - nq - nk] += a.bv[k0 + e - nq - nk];
            }
        }
        __syncthreads();
    }
    if (a.q_norm) { /* each query and key head RMS-normalised (qwen3): a warp a head */
        int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
        for (int h = warp; h < a.q_heads + nkh; h += warps) {
            bool key = h >= a.q_heads;
            float *p = key ? kr + (int64_t)(a.kv_h0 + h - a.q_heads) * hd : qr + (int64_t)h * hd;
            const float *w = key ? a.k_norm : a.q_norm;
            double ss = 0;
            for (int i = lane; i < hd; i += 32)
                ss += (double)p[i] * p[i];
            ss = kcuda_warp_sum_d(ss);
            float scale = (float)(1.0 / sqrt(ss / hd + (double)a.eps));
            for (int i = lane; i < hd; i += 32)
                p[i] = p[i] * scale * w[i];
        }
        __syncthreads();
    }
    int nq = a.q_heads * half, nk = nkh * half;
    for (int e = threadIdx.x; e < nq + nk; e += blockDim.x) {
        bool key = e >= nq;
        int f = key ? e - nq : e, h = f / half, i = f % half;
        float *p = key ? kr + (int64_t)(a.kv_h0 + h) * hd : qr + (int64_t)h * hd;
        if (a.neox) { /* pairs (i, i + half) */
            float x0 = p[i], x1 = p[i + half];
            p[i] = x0 * c[i] - x1 * sn[i];
            p[i + half] = x0 * sn[i] + x1 * c[i];
        } else {
            k_rope_pair(p + 2 * i, c[i], sn[i]);
        }
    }
    __syncthreads();
    const float *vr = a.v + (int64_t)t * a.kv_stride;
    int count = (a.kv_h1 - a.kv_h0) * hd;
    for (int e = threadIdx.x; e < count; e += blockDim.x) {
        int h = a.kv_h0 + e / hd, i = e % hd;
        int64_t src = (int64_t)h * hd + i, at = ((int64_t)h * a.head_rows + a.r0 + t) * hd + i;
        for (int d = 0; d < a.n_dst; d++) {
            ((T *)a.k_dst[d])[at] = (T)kr[src];
            ((T *)a.v_dst[d])[at] = (T)vr[src];
        }
    }
}

void kcuda_rope_store(kcuda *g, const kcuda_rope_kv *a, int n)
{
    if (n <= 0)
        return;
    g->launches++;
    if (a->type == KV_F16) /* the conversion rounds to nearest even */
        k_rope_store_kernel<__half><<<n, 128, 0, g->stream>>>(*a);
    else
        k_rope_store_kernel<float><<<n, 128, 0, g->stream>>>(*a);
}

long kcuda_launches(const kcuda *g)
{
    return g->launches;
}

__global__ void k_silu_mul_kernel(float *gate, const float *up, int64_t stride, int64_t count)
{
    float *gr = gate + (int64_t)blockIdx.y * stride;
    const float *ur = up + (int64_t)blockIdx.y * stride;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        gr[i] = kcuda_silu_mul1(gr[i], ur[i]);
    }
}

void kcuda_silu_mul(kcuda *g, float *gate, const float *up, int n, int64_t stride, int64_t count)
{
    if (n <= 0 || count <= 0)
        return;
    int blocks = (int)((count + 255) / 256);
    dim3 grid(blocks < 64 ? blocks : 64, n);
    g->launches++;
    k_silu_mul_kernel<<<grid, 256, 0, g->stream>>>(gate, up, stride, count);
}

/* x[t * dim + c] += d[t * ld + c]: ld = dim a row of d per token, ld = 0 one row (a bias). */
__global__ void k_add_cols_kernel(float *x, const float *d, int64_t ld, int64_t dim, int64_t lo,
                                  int64_t hi)
{
    int64_t t = blockIdx.y;
    for (int64_t c = lo + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < hi;
         c += (int64_t)gridDim.x * blockDim.x)
        x[t * dim + c] += d[t * ld + c];
}

static void add_cols_launch(kcuda *g, float *x, const float *d, int64_t ld, int n, int64_t dim,
                            int64_t lo, int64_t hi)
{
    if (n <= 0 || hi <= lo)
        return;
    int blocks = (int)((hi - lo + 255) / 256);
    dim3 grid(blocks < 64 ? blocks : 64, n);
    g->launches++;
    k_add_cols_kernel<<<grid, 256, 0, g->stream>>>(x, d, ld, dim, lo, hi);
}

void kcuda_add_bias(kcuda *g, float *x, const float *bias, int n, int64_t dim, int64_t lo,
                    int64_t hi)
{
    add_cols_launch(g, x, bias, 0, n, dim, lo, hi);
}

void kcuda_add_cols(kcuda *g, float *x, const float *d, int n, int64_t dim, int64_t lo, int64_t hi)
{
    add_cols_launch(g, x, d, dim, n, dim, lo, hi);
}

/* One block per token: columns [c0, c1) of its row, dequantized (kcuda_dequant). */
__global__ void k_embed_kernel(uint32_t type, const uint8_t *table, size_t row_bytes,
                               const int32_t *ids, float *out, int64_t ldo, int64_t c0, int64_t c1)
{
    const uint8_t *row = table + (size_t)ids[blockIdx.x] * row_bytes;
    float *o = out + (int64_t)blockIdx.x * ldo;
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x)
        o[c - c0] = kcuda_dequant(type, row, c);
}

int kcuda_embed(kcuda *g, const kmat *table, const int32_t *ids, int n, float *out, int64_t ldo,
                int64_t c0, int64_t c1, char *err, size_t errlen)
{
    if (kcuda_check_embed(table, err, errlen))
        return -1;
    if (n <= 0 || c1 <= c0)
        return 0;
    g->launches++;
    k_embed_kernel<<<n, 128, 0, g->stream>>>(table->type, (const uint8_t *)table->data,
                                              table->row_bytes, ids, out, ldo, c0, c1);
    return 0;
}
