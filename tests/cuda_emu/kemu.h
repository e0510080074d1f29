/*
 * tests/cuda_emu/kemu.h — a CPU emulation of the part of CUDA and cuBLAS that kernels/cuda uses,
 * so the GPU op set's own kernels (not a stand-in) run and are tested on a machine without a GPU.
 *
 * The kernel sources are compiled unchanged as C++ against this header (the headers in
 * tests/cuda_emu/include name it), after tests/cuda_emu/unchevron.py has rewritten each launch
 * `k<<<grid, block, shared, stream>>>(args)` into `kemu_launch(kemu_cfg(grid, block, shared,
 * stream), k, args)`. A launch runs every block in turn; a block's threads are fibers on the
 * calling thread (stacks of their own, switched at __syncthreads and at warp shuffles), so
 * barriers and shuffles have CUDA's semantics: a barrier waits for every live thread of the
 * block, a shuffle exchanges among the 32 lanes of a warp, and a shuffle some lane of the warp
 * cannot reach (it returned, or waits at a barrier) is reported as the fault it is on a GPU.
 * A warp-wide instruction the op set emulates (mma.sync, the xor butterfly) meets once through
 * kemu_warp_gather, the emulation's own, where shuffles would meet once each.
 * `__shared__` arrays are per block (the blocks run one after another on one thread).
 *
 * What it checks beyond the results: launch limits (threads per block, grid y/z), device memory
 * from cudaMalloc bounded by a guard page (an overrun faults) and filled with NaN bytes (a read
 * of what nothing wrote shows), the stream-capture rules (no allocation, free or synchronisation
 * while the stream records; a captured copy touches only device or registered host memory), and
 * cuBLAS's argument rules (leading dimensions). Timings mean nothing here.
 */
#ifndef OROCHI_KEMU_H
#define OROCHI_KEMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <utility>

/* ===== the language ===== */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static /* one block at a time per thread: a static is the block's memory */

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

/* The running thread's coordinates. */
const uint3 &kemu_thread_idx();
const uint3 &kemu_block_idx();
const dim3 &kemu_block_dim();
const dim3 &kemu_grid_dim();
#define threadIdx (kemu_thread_idx())
#define blockIdx (kemu_block_idx())
#define blockDim (kemu_block_dim())
#define gridDim (kemu_grid_dim())

void kemu_syncthreads();
#define __syncthreads() kemu_syncthreads()
/* The value of `bytes` at v as lane (this lane ^ xor_mask) of the warp holds it. */
void kemu_shfl_xor(unsigned mask, void *v, size_t bytes, int xor_mask);
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask)
{
    kemu_shfl_xor(mask, &v, sizeof v, lane_mask);
    return v;
}
/* The value of `bytes` at v as lane src_lane of the warp holds it (each lane may name its own). */
void kemu_shfl(unsigned mask, void *v, size_t bytes, int src_lane);
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src_lane)
{
    kemu_shfl(mask, &v, sizeof v, src_lane);
    return v;
}

/* Every lane's `bytes` at v (KEMU_GATHER_MAX at most), in lane order, into all[32 * bytes] of
 * each lane: one meeting of the warp where as many shuffles would take one each. The emulation's
 * own (no device has it), for the emulated forms of warp-wide instructions (mma.sync). */
#define KEMU_GATHER_MAX 64
void kemu_warp_gather(unsigned mask, const void *v, size_t bytes, void *all);

static inline float __fadd_rn(float a, float b)
{
    return a + b;
}
static inline float __fsub_rn(float a, float b)
{
    return a - b;
}
static inline float __fmul_rn(float a, float b)
{
    return a * b;
}

/* Bytes of x (0..3) and y (4..7) picked by the 4 low nibbles of the selector s, the first for
 * the result's byte 0 (PRMT's default mode: each nibble's low 3 bits). */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s)
{
    uint64_t v = (uint64_t)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        r |= (unsigned)(v >> (8 * ((s >> (4 * i)) & 7)) & 0xff) << (8 * i);
    return r;
}

/* ===== 16-bit floats (round to nearest even, as the device converts) ===== */

struct __half {
    uint16_t bits;
    __half() = default;
    __half(float f)
    {
        _Float16 h = (_Float16)f;
        memcpy(&bits, &h, 2);
    }
};
static inline __half __ushort_as_half(unsigned short v)
{
    __half h;
    h.bits = v;
    return h;
}
/* Every f16 value as an f32 (exact), by its bits: kemu.cc fills it before main. */
extern float kemu_half_f32[65536];
static inline float __half2float(__half h)
{
    return kemu_half_f32[h.bits];
}

/* a * b + c of three f16 values (their bits), rounded once to f16, ties to even: the device's
 * fma.rn.f16 (HFMA2). In double the product is exact (22 bits), and so is the sum unless its
 * terms lie more than 53 bits apart: then either the product is the larger, at 2^29 or more
 * (beyond f16, inf both ways), or c is, an f16 value the exact sum rounds to as the double does.
 * So the double's one rounding to f16 is the only one. */
static inline uint16_t kemu_hfma(uint16_t a, uint16_t b, uint16_t c)
{
    double p = (double)__half2float(__ushort_as_half(a)) * __half2float(__ushort_as_half(b));
    _Float16 h = (_Float16)(p + __half2float(__ushort_as_half(c))); /* double to f16: once */
    uint16_t r;
    memcpy(&r, &h, 2);
    return r;
}

struct __nv_bfloat16 {
    uint16_t bits;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f)
    {
        uint32_t u;
        memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u)
            bits = (uint16_t)((u >> 16) | 0x40); /* a quiet NaN */
        else
            bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    }
};
static inline float __bfloat162float(__nv_bfloat16 h)
{
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ===== the runtime ===== */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorHostMemoryAlreadyRegistered = 712,
    cudaErrorHostMemoryNotRegistered = 713,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorIllegalState = 401,
} cudaError_t;

typedef struct kemu_stream *cudaStream_t;
typedef struct kemu_graph *cudaGraph_t;
typedef struct kemu_graph *cudaGraphExec_t;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrIntegrated = 18 };
#define cudaStreamNonBlocking 0x01
#define cudaHostRegisterMapped 0x02
#define cudaHostRegisterReadOnly 0x08

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    int major, minor, multiProcessorCount;
};

const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device);
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int device);
cudaError_t cudaGetLastError();
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMalloc(void **p, size_t bytes);
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t bytes)
{
    return cudaMalloc((void **)p, bytes);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t rows, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaHostRegister(void *host, size_t bytes, unsigned flags);
cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags);
cudaError_t cudaHostUnregister(void *host);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
/* The blocks of a kernel one multiprocessor holds at once: the emulation has no registers to
 * count, so every kernel gets kemu_resident()'s answer — OROCHI_KEMU_RESIDENT (1..1024), by
 * default 64, enough that the tests' small launches take the paths a device takes for them. */
int kemu_resident();
template <typename F>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F kernel,
                                                                        int block_size,
                                                                        size_t shared)
{
    (void)kernel, (void)block_size, (void)shared;
    *n = kemu_resident();
    return cudaSuccess;
}

/* ===== launches ===== */

struct kemu_cfg_t {
    dim3 grid, block;
    size_t shared;
    cudaStream_t stream;
};
static inline kemu_cfg_t kemu_cfg(dim3 grid, dim3 block, size_t shared = 0,
                                  cudaStream_t stream = nullptr)
{
    return kemu_cfg_t{grid, block, shared, stream};
}
/* Run (or, while the stream records, record) body once per thread of the grid. */
void kemu_run(const kemu_cfg_t &cfg, std::function<void()> body);

template <typename... P, typename... A>
static inline void kemu_launch(const kemu_cfg_t &cfg, void (*kernel)(P...), A &&...args)
{
    /* the arguments are converted and copied at the launch, as CUDA copies them */
    std::tuple<typename std::decay<P>::type...> params(std::forward<A>(args)...);
    kemu_run(cfg, [kernel, params]() { std::apply(kernel, params); });
}

/* ===== cuBLAS (column-major, as the library) ===== */

typedef struct kemu_blas *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *a, int lda,
                           const float *b, int ldb, const float *beta, float *c, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *a, cudaDataType_t at,
                            int lda, const void *b, cudaDataType_t bt, int ldb, const void *beta,
                            void *c, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);

/* ===== for the tests ===== */

/* Launches run (and threads run) since the process started. */
long kemu_launches();

#endif
