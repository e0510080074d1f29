/*
 * tests/cuda_emu/test_kemu.cu — the CUDA emulation (kemu.h) against what CUDA specifies, so that
 * the GPU op set's tests run on it mean something (ctest unit_cuda_emu_self):
 *   - thread and block coordinates over 3-D grids and blocks; a launch without arguments;
 *   - __syncthreads and __shared__ in a block reduction, and warp shuffles (exact sums);
 *   - the warp gather (kemu_warp_gather): every lane's bytes in lane order, in every lane; a warp
 *     whose lanes mix a gather and a shuffle faults;
 *   - the GPU op set's warp butterfly (kcuda_warp_butterfly: one gather over the emulation) gives
 *     each lane the bits of the 5 shuffles it stands for, sums and maxima, 1 and 4 values, f32 and
 *     f64, on values whose sums depend on their order (the butterfly in the other order differs);
 *   - faults a GPU raises, each in a child process: a shuffle whose lane has returned, a read
 *     past the end of device memory; a block of 2048 threads refused at launch;
 *   - the capture rules: an allocation while recording invalidates the capture, a captured copy
 *     of pageable memory is refused, a graph runs its kernels only when launched, and each launch
 *     runs them again;
 *   - cuBLAS: SGEMM with a transposed A against a plain loop, and a leading dimension too small
 *     refused;
 *   - the fused f16 multiply-add (kemu_hfma) against an exact reference in 128-bit integers,
 *     rounded once, ties to even: random operands, and products on a midpoint between two f16
 *     values with a tiny addend of either sign, or none (where a sum rounded to f32 first errs).
 * Compiled through unchevron.py as the GPU op set is; it exits 1 on the first disagreement.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/cuda/kcuda_internal.h"

static int failures;

static void expect(bool ok, const char *what)
{
    printf("  %-64s %s\n", what, ok ? "ok" : "FAILED");
    failures += !ok;
}

__global__ void k_coords(int *out)
{
    int b = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    int t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    out[b * blockDim.x * blockDim.y * blockDim.z + t] = b * 1000 + t;
}

static int noargs_ran;
__global__ void k_noargs()
{
    noargs_ran++;
}

/* The sum of in[0..n) by one block: strided partial sums, warp shuffles, shared memory. */
__global__ void k_block_sum(const int *in, int n, long long *out)
{
    __shared__ long long part[32];
    long long s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s += in[i];
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long t = 0;
        for (unsigned w = 0; w < blockDim.x / 32; w++)
            t += part[w];
        *out = t;
    }
}

/* Each lane reads the lane 31 - lane (an indexed shuffle, every lane its own source). */
__global__ void k_reverse(int *x)
{
    x[threadIdx.x] = __shfl_sync(0xffffffffu, x[threadIdx.x], 31 - (int)(threadIdx.x & 31));
}

__global__ void k_early_return(float *x)
{
    if (threadIdx.x == 7)
        return;
    float v = x[threadIdx.x];
    x[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 1);
}

/* Each lane gathers (its lane, block, warp, lane * 5 + 1): out[thread][j] what it got of lane j. */
__global__ void k_gather(uint32_t *out)
{
    const uint32_t lane = threadIdx.x & 31;
    const uint32_t mine[4] = {lane, blockIdx.x, threadIdx.x >> 5, lane * 5 + 1};
    uint32_t all[32][4];
    kemu_warp_gather(0xffffffffu, mine, sizeof mine, all);
    memcpy(out + (blockIdx.x * blockDim.x + threadIdx.x) * 128, all, sizeof all);
}

/* Lanes 0..15 gather, lanes 16..31 shuffle: no device instruction does both at once. */
__global__ void k_gather_mixed(uint32_t *x)
{
    uint32_t v = x[threadIdx.x], all[32];
    if (threadIdx.x < 16)
        kemu_warp_gather(0xffffffffu, &v, sizeof v, all);
    else
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    x[threadIdx.x] = v;
}

/* Each lane's x[lane] through the op set's butterfly and through 5 shuffles in the device's order
 * (o = 16 .. 1), or in the other order (o = 1 .. 16, `flip`): got and want per lane, for a sum
 * and a maximum of one f32, a sum of 4 f32 values, and a sum of one f64. */
__global__ void k_butterfly(const float *x, const double *xd, int flip, float *got, float *want,
                            double *gotd, double *wantd)
{
    const int lane = threadIdx.x & 31, base = blockIdx.x * 32;
    auto add = [](float a, float b) { return a + b; };
    auto mx = [](float a, float b) { return fmaxf(a, b); };
    float s[1] = {x[base + lane]}, m[1] = {x[base + lane]}, q[4];
    for (int k = 0; k < 4; k++)
        q[k] = x[(base + lane * 4 + k) % (32 * gridDim.x)];
    double d = xd[base + lane];
    float rs = s[0], rm = m[0], rq[4] = {q[0], q[1], q[2], q[3]};
    double rd = d;
    for (int i = 0; i < 5; i++) {
        const int o = flip ? 1 << i : 16 >> i;
        rs += __shfl_xor_sync(0xffffffffu, rs, o);
        rm = fmaxf(rm, __shfl_xor_sync(0xffffffffu, rm, o));
        for (int k = 0; k < 4; k++)
            rq[k] += __shfl_xor_sync(0xffffffffu, rq[k], o);
        rd += __shfl_xor_sync(0xffffffffu, rd, o);
    }
    kcuda_warp_butterfly(s, add);
    kcuda_warp_butterfly(m, mx);
    kcuda_warp_butterfly(q, add);
    float *g = got + (base + lane) * 6, *w = want + (base + lane) * 6;
    g[0] = s[0], g[1] = m[0], w[0] = rs, w[1] = rm;
    for (int k = 0; k < 4; k++)
        g[2 + k] = q[k], w[2 + k] = rq[k];
    gotd[base + lane] = kcuda_warp_sum_d(d);
    wantd[base + lane] = rd;
}

/* The butterfly's bits against the shuffles' over 16 warps of values 2^-20 .. 2^20 apart: every
 * lane equal in the device's order; in the other order, some lane differs (the values make the
 * order matter, so the first check can fail). */
static void check_butterfly()
{
    const int warps = 16, n = 32 * warps;
    float *x, *got, *want;
    double *xd, *gotd, *wantd;
    cudaMalloc(&x, n * sizeof *x);
    cudaMalloc(&xd, n * sizeof *xd);
    cudaMalloc(&got, 6 * n * sizeof *got);
    cudaMalloc(&want, 6 * n * sizeof *want);
    cudaMalloc(&gotd, n * sizeof *gotd);
    cudaMalloc(&wantd, n * sizeof *wantd);
    uint32_t r = 12345;
    for (int i = 0; i < n; i++) {
        r = r * 1664525u + 1013904223u;
        const float m = (float)(r >> 8) / (float)(1u << 24) - 0.5f;
        x[i] = ldexpf(m, (int)(r % 41) - 20);
        xd[i] = ldexp((double)m, (int)(r % 97) - 48) * (1.0 + 1e-9 * i);
    }
    bool same = true, differs = false;
    for (int flip = 0; flip < 2; flip++) {
        k_butterfly<<<warps, 32>>>(x, xd, flip, got, want, gotd, wantd);
        bool eq = !memcmp(got, want, 6 * n * sizeof *got) && !memcmp(gotd, wantd, n * sizeof *gotd);
        if (flip)
            differs = !eq;
        else
            same = eq;
    }
    expect(same, "the op set's butterfly: the bits of 5 shuffles, every lane");
    expect(differs, "the butterfly in the other order differs (the values make order matter)");
    cudaFree(x), cudaFree(xd), cudaFree(got), cudaFree(want), cudaFree(gotd), cudaFree(wantd);
}

static void gather_mixed()
{
    uint32_t *x;
    cudaMalloc(&x, 32 * sizeof *x);
    k_gather_mixed<<<1, 32>>>(x);
}

__global__ void k_read(const float *x, int i, float *out)
{
    *out = x[i];
}

__global__ void k_add_one(int *x)
{
    x[threadIdx.x] += 1;
}

/* Run fn in a child process; true when it died by a signal having printed `needle` (or any
 * message, when needle is NULL) on stderr. */
static bool faults(void (*fn)(), const char *needle)
{
    int fds[2];
    if (pipe(fds))
        return false;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn();
        _exit(0);
    }
    close(fds[1]);
    char buf[1024] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)r;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && (!needle || strstr(buf, needle));
}

static void early_return()
{
    float *x;
    cudaMalloc(&x, 32 * sizeof *x);
    k_early_return<<<1, 32>>>(x);
}

static void overrun()
{
    float *x, *out;
    cudaMalloc(&x, 1024 * sizeof *x);
    cudaMalloc(&out, sizeof *out);
    k_read<<<1, 1>>>(x, 1024 + 64, out);
}

/* The f16 of bits h as m * 2^(e - 24), m a signed integer (finite values only). */
static void half_parts(uint16_t h, __int128 *m, int *e)
{
    int ex = (h >> 10) & 31, mant = h & 1023;
    *m = ex ? 1024 + mant : mant;
    *e = ex ? ex - 1 : 0; /* the value is m * 2^(e - 24) */
    if (h & 0x8000)
        *m = -*m;
}

/* The magnitude of a positive f16 code in units of 2^-48. */
static __int128 half_value(uint16_t h)
{
    __int128 m;
    int e;
    half_parts(h, &m, &e);
    return m * ((__int128)1 << (e + 24));
}

/* The f16 nearest to a * b + c, computed exactly in units of 2^-48, ties to the even code; inf
 * past the largest finite value's rounding range. */
static uint16_t exact_hfma(uint16_t a, uint16_t b, uint16_t c)
{
    __int128 ma, mb, mc;
    int ea, eb, ec;
    half_parts(a, &ma, &ea);
    half_parts(b, &mb, &eb);
    half_parts(c, &mc, &ec);
    __int128 v = ma * mb * ((__int128)1 << (ea + eb)) + mc * ((__int128)1 << (ec + 24));
    if (v == 0) /* an exact zero: -0 only as -0 + -0 */
        return ma * mb == 0 && ((a ^ b) & 0x8000) && (c & 0x8000) ? 0x8000 : 0;
    __int128 mag = v < 0 ? -v : v;
    /* the finite codes are in the order of their values: the last at or below mag, by halves */
    uint16_t lo = 0, hi = 0x7bff;
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if (half_value(mid) <= mag)
            lo = mid;
        else
            hi = (uint16_t)(mid - 1);
    }
    uint16_t best = lo;
    if (lo < 0x7bff) {
        __int128 below = mag - half_value(lo), above = half_value((uint16_t)(lo + 1)) - mag;
        if (above < below || (above == below && (lo & 1)))
            best = (uint16_t)(lo + 1);
    }
    /* beyond 65504 + 16 (half an ulp of the largest): inf */
    if (mag >= (__int128)(65504 + 16) << 48)
        best = 0x7c00;
    return v < 0 ? (uint16_t)(best | 0x8000) : best;
}

static void check_hfma()
{
    srand(7);
    int bad = 0, n = 0;
    for (int i = 0; i < 20000; i++, n++) {
        /* finite operands, exponents kept where the product stays finite */
        uint16_t a = (uint16_t)((rand() & 0x83ff) | (rand() % 24) << 10);
        uint16_t b = (uint16_t)((rand() & 0x83ff) | (rand() % 24) << 10);
        uint16_t c = (uint16_t)((rand() & 0x83ff) | (rand() % 30) << 10);
        bad += kemu_hfma(a, b, c) != exact_hfma(a, b, c);
    }
    expect(bad == 0, "f16 fused multiply-add, 20000 random operands, against the exact");
    /* 3 (1 + k 2^-10), k odd, lies midway between two f16 values: the addend, the smallest
     * subnormal of either sign, picks the side; with none, the even code */
    bad = 0;
    const uint16_t tiny[3] = {0x0001, 0x8001, 0x0000};
    for (int k = 1; k < 200; k += 2)
        for (int t = 0; t < 3; t++) {
            uint16_t a = 0x4200, b = (uint16_t)(0x3c00 + k);
            uint16_t got = kemu_hfma(a, b, tiny[t]), want = exact_hfma(a, b, tiny[t]);
            bad += got != want;
            /* the sides differ: up, down, even */
            if (t == 0 && got == kemu_hfma(a, b, tiny[1]))
                bad++;
        }
    expect(bad == 0, "f16 fused multiply-add on midpoints: the addend's sign picks the side");
}

int main()
{
    printf("the CUDA emulation against CUDA's rules:\n");
    check_hfma();
    int *coords;
    const int n_coords = 12 * 16;
    cudaMalloc(&coords, n_coords * sizeof *coords);
    k_coords<<<dim3(3, 2, 2), dim3(4, 2, 2)>>>(coords);
    bool ok = true;
    for (int i = 0; i < n_coords; i++)
        ok &= coords[i] == (i / 16) * 1000 + i % 16;
    expect(ok, "3-D grid and block coordinates");
    k_noargs<<<2, 3>>>();
    expect(noargs_ran == 6, "a launch without arguments runs every thread");

    const int n = 10000;
    int *in;
    long long *sum;
    cudaMalloc(&in, n * sizeof *in);
    cudaMalloc(&sum, sizeof *sum);
    for (int i = 0; i < n; i++)
        in[i] = i * 7 - 3000;
    k_block_sum<<<1, 256>>>(in, n, sum);
    long long want = 0;
    for (int i = 0; i < n; i++)
        want += in[i];
    expect(*sum == want, "block sum through shuffles, __shared__ and __syncthreads");

    int *rev;
    cudaMalloc(&rev, 64 * sizeof *rev);
    for (int i = 0; i < 64; i++)
        rev[i] = i * 3;
    k_reverse<<<1, 64>>>(rev);
    ok = true;
    for (int i = 0; i < 64; i++)
        ok &= rev[i] == (i / 32 * 32 + 31 - i % 32) * 3;
    expect(ok, "an indexed shuffle reads the lane each lane names, within its warp");
    expect(faults(early_return, "has returned"), "a shuffle whose lane returned faults");

    uint32_t *gat;
    cudaMalloc(&gat, 2 * 64 * 128 * sizeof *gat);
    k_gather<<<2, 64>>>(gat);
    ok = true;
    for (int t = 0; t < 128; t++)
        for (int j = 0; j < 32; j++) {
            const uint32_t *e = gat + t * 128 + j * 4;
            ok &= e[0] == (uint32_t)j && e[1] == (uint32_t)(t / 64) &&
                  e[2] == (uint32_t)(t % 64 / 32) && e[3] == (uint32_t)j * 5 + 1;
        }
    expect(ok, "a warp gather: every lane's bytes in lane order, in each lane of its warp");
    expect(faults(gather_mixed, "shuffle differently"),
           "a warp mixing a gather and a shuffle faults");
    check_butterfly();
    expect(faults(overrun, NULL), "a read past the end of device memory faults");
    cudaGetLastError();
    k_noargs<<<1, 2048>>>();
    expect(cudaGetLastError() == cudaErrorInvalidConfiguration && noargs_ran == 6,
           "a block of 2048 threads is refused");

    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaGraph_t graph;
    void *p;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    bool refused = cudaMalloc(&p, 64) == cudaErrorStreamCaptureUnsupported;
    expect(refused && cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated,
           "an allocation while recording invalidates the capture");
    int host[4] = {0};
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    refused = cudaMemcpyAsync(coords, host, sizeof host, cudaMemcpyHostToDevice, s) ==
              cudaErrorStreamCaptureUnsupported;
    expect(refused && cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated,
           "a captured copy of pageable memory is refused");
    int *x;
    cudaMalloc(&x, 4 * sizeof *x);
    cudaMemcpyAsync(x, host, sizeof host, cudaMemcpyHostToDevice, s);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    k_add_one<<<1, 4, 0, s>>>(x);
    k_add_one<<<1, 4, 0, s>>>(x);
    bool idle = x[0] == 0;
    cudaGraphExec_t exec;
    ok = cudaStreamEndCapture(s, &graph) == cudaSuccess &&
         cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    cudaGraphLaunch(exec, s);
    cudaGraphLaunch(exec, s);
    cudaStreamSynchronize(s);
    expect(ok && idle && x[0] == 4 && x[3] == 4, "a graph runs its kernels at each launch only");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);

    /* C (m x n) = A^T B with A stored k x m (lda = k + 1) and B k x n, column-major */
    const int m = 5, nn = 3, k = 7, lda = k + 1;
    float A[lda * m], Bm[k * nn], C[m * nn], ref[m * nn];
    for (int i = 0; i < lda * m; i++)
        A[i] = (float)((i * 37) % 11) - 5.0f;
    for (int i = 0; i < k * nn; i++)
        Bm[i] = (float)((i * 13) % 7) - 3.0f;
    for (int j = 0; j < nn; j++)
        for (int i = 0; i < m; i++) {
            float acc = 0;
            for (int q = 0; q < k; q++)
                acc += A[q + i * lda] * Bm[q + j * k];
            ref[i + j * m] = acc;
        }
    cublasHandle_t h;
    cublasCreate(&h);
    const float one = 1.0f, zero = 0.0f;
    ok = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, A, lda, Bm, k, &zero, C, m) ==
         CUBLAS_STATUS_SUCCESS;
    expect(ok && !memcmp(C, ref, sizeof C), "SGEMM with a transposed A");
    expect(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, A, k - 1, Bm, k, &zero, C,
                       m) == CUBLAS_STATUS_INVALID_VALUE,
           "SGEMM with a leading dimension below k is refused");
    cublasDestroy(h);
    cudaStreamDestroy(s);
    printf("%s\n", failures ? "unit_cuda_emu_self: FAILED" : "unit_cuda_emu_self: all agree");
    return failures ? 1 : 0;
}
