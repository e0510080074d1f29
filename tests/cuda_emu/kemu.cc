/*
 * tests/cuda_emu/kemu.cc — the CUDA emulation's runtime (kemu.h): launches as fibers, device
 * memory with guard pages, streams that record while capturing, graphs, a reference cuBLAS
 * GEMM, and the warp gather (every lane's bytes to each lane in one meeting). A fault that
 * would be a device error or undefined on one (a shuffle a lane cannot reach, lanes shuffling
 * differently) stops the process with a message naming the block and thread.
 */
#include "tests/cuda_emu/kemu.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

/* ===== fibers ===== */

enum { F_READY, F_BARRIER, F_SHFL, F_DONE };

#define KEMU_STACK ((size_t)64 << 10) /* bytes per thread's stack, below a guard page */
#define KEMU_MAX_THREADS 1024

/* Switching between the scheduler and a fiber. On x86-64, six callee-saved registers and the
 * stack pointer (kemu_switch below: a few nanoseconds); elsewhere, a ucontext for the first
 * start and _setjmp/_longjmp after it. */
#if defined(__x86_64__)
#define KEMU_ASM_SWITCH 1
/* Save the callee-saved registers on this stack, store its pointer at *save, continue on `to`. */
extern "C" void kemu_switch(void **save, void *to);
asm(".text\n"
    ".globl kemu_switch\n"
    ".type kemu_switch,@function\n"
    "kemu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size kemu_switch,.-kemu_switch\n");
#endif

struct kemu_fiber {
#if KEMU_ASM_SWITCH
    void *sp;
#else
    ucontext_t uc; /* the first start only; every switch after it is _setjmp/_longjmp */
    jmp_buf jb;
#endif
    bool started;
    int state;
    uint3 tid;
    uint64_t val; /* a shuffle's operand, then its result (4 or 8 bytes) */
    unsigned bytes, mask;
    int xr;      /* the lane mask of an xor shuffle, or the source lane of an indexed one */
    bool direct; /* an indexed shuffle (__shfl_sync) */
    /* a gather (kemu_warp_gather): this lane's bytes, and where every lane's go */
    const void *in;
    void *out;
};

struct kemu_block {
    dim3 grid, block;
    uint3 bidx;
    kemu_fiber *f;
    int n, cur;
#if KEMU_ASM_SWITCH
    void *sched_sp;
#else
    jmp_buf sched;
    ucontext_t sched_uc;
#endif
    const std::function<void()> *body;
};

static thread_local kemu_block *B;

/* ===== 16-bit floats ===== */

float kemu_half_f32[65536];

__attribute__((constructor)) static void kemu_half_table()
{
    for (uint32_t b = 0; b < 65536; b++) {
        _Float16 v;
        const uint16_t h = (uint16_t)b;
        memcpy(&v, &h, 2);
        kemu_half_f32[b] = (float)v;
    }
}

/* This thread's fiber stacks and fibers, kept for its later launches and given back when it ends
 * (a test that runs many short-lived host threads would otherwise run out of mappings). */
struct kemu_thread_mem {
    std::vector<char *> stacks;
    kemu_fiber *fibers = nullptr;
    ~kemu_thread_mem()
    {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        for (char *s : stacks)
            munmap(s - page, KEMU_STACK + page);
        delete[] fibers;
    }
};
static thread_local kemu_thread_mem mem;
static std::atomic<long> n_launches{0};

const uint3 &kemu_thread_idx()
{
    return B->f[B->cur].tid;
}
const uint3 &kemu_block_idx()
{
    return B->bidx;
}
const dim3 &kemu_block_dim()
{
    return B->block;
}
const dim3 &kemu_grid_dim()
{
    return B->grid;
}

long kemu_launches()
{
    return n_launches.load();
}

[[noreturn]] static void kemu_fault(const char *what)
{
    kemu_fiber *f = &B->f[B->cur];
    fprintf(stderr,
            "kemu: device fault in block (%u,%u,%u) of grid (%u,%u,%u), thread (%u,%u,%u) of "
            "(%u,%u,%u): %s\n",
            B->bidx.x, B->bidx.y, B->bidx.z, B->grid.x, B->grid.y, B->grid.z, f->tid.x, f->tid.y,
            f->tid.z, B->block.x, B->block.y, B->block.z, what);
    abort();
}

/* From a fiber back to the block's scheduler, in `state`. */
static void kemu_yield(int state)
{
    kemu_fiber *f = &B->f[B->cur];
    f->state = state;
#if KEMU_ASM_SWITCH
    kemu_switch(&f->sp, B->sched_sp);
#else
    if (!_setjmp(f->jb))
        _longjmp(B->sched, 1);
#endif
}

/* A fiber runs one thread of a block, then waits to run the same thread slot of the next block
 * (of this launch or a later one): only its first start sets a stack up. */
static void kemu_fiber_main()
{
    for (;;) {
        (*B->body)();
        kemu_yield(F_DONE);
    }
}

void kemu_syncthreads()
{
    kemu_yield(F_BARRIER);
}

/* kemu_shfl_xor and kemu_shfl: lane is the xor mask, or (direct) the lane read. */
static void kemu_shfl_any(unsigned mask, void *v, size_t bytes, int xor_mask, bool direct)
{
    kemu_fiber *f = &B->f[B->cur];
    if (bytes != 4 && bytes != 8)
        kemu_fault("a shuffle of other than 4 or 8 bytes");
    if (xor_mask < 0 || xor_mask > 31)
        kemu_fault(direct ? "a shuffle's source lane is outside 0..31"
                          : "a shuffle's lane mask is outside 0..31");
    f->direct = direct;
    f->in = nullptr;
    f->val = 0;
    if (bytes == 4)
        memcpy(&f->val, v, 4);
    else
        memcpy(&f->val, v, 8);
    f->bytes = (unsigned)bytes;
    f->xr = xor_mask;
    f->mask = mask;
    kemu_yield(F_SHFL);
    if (bytes == 4)
        memcpy(v, &f->val, 4);
    else
        memcpy(v, &f->val, 8);
}

void kemu_shfl_xor(unsigned mask, void *v, size_t bytes, int xor_mask)
{
    kemu_shfl_any(mask, v, bytes, xor_mask, false);
}

void kemu_shfl(unsigned mask, void *v, size_t bytes, int src_lane)
{
    kemu_shfl_any(mask, v, bytes, src_lane, true);
}

void kemu_warp_gather(unsigned mask, const void *v, size_t bytes, void *all)
{
    kemu_fiber *f = &B->f[B->cur];
    if (bytes == 0 || bytes > KEMU_GATHER_MAX)
        kemu_fault("a warp gather of no bytes or of more than KEMU_GATHER_MAX");
    f->in = v;
    f->out = all;
    f->bytes = (unsigned)bytes;
    f->mask = mask;
    f->direct = false;
    f->xr = 0;
    kemu_yield(F_SHFL);
}

static char *kemu_stack(int i)
{
    while ((int)mem.stacks.size() <= i) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        char *s = (char *)mmap(nullptr, KEMU_STACK + page, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s == MAP_FAILED) {
            fprintf(stderr, "kemu: cannot map a thread stack\n");
            abort();
        }
        mprotect(s, page, PROT_NONE); /* a stack overflow faults */
        mem.stacks.push_back(s + page);
    }
    return mem.stacks[(size_t)i];
}

/* Resume fiber i until it next yields. */
static void kemu_resume(int i)
{
    kemu_fiber *f = &B->f[i];
    B->cur = i;
#if KEMU_ASM_SWITCH
    if (!f->started) {
        /* a stack that kemu_switch "returns" into kemu_fiber_main from: six zero registers, the
         * entry, and a null return address where a call would have left one */
        f->started = true;
        void **top = (void **)(kemu_stack(i) + KEMU_STACK);
        void **sp = top - 8;
        for (int r = 0; r < 6; r++)
            sp[r] = nullptr;
        sp[6] = (void *)kemu_fiber_main;
        sp[7] = nullptr;
        f->sp = sp;
    }
    kemu_switch(&B->sched_sp, f->sp);
#else
    if (_setjmp(B->sched))
        return;
    if (f->started)
        _longjmp(f->jb, 1);
    f->started = true;
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = kemu_stack(i);
    f->uc.uc_stack.ss_size = KEMU_STACK;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, kemu_fiber_main, 0);
    swapcontext(&B->sched_uc, &f->uc);
    abort(); /* fibers come back through _longjmp only */
#endif
}

/* Warp w's shuffle once its lanes have all stopped: false when none waits at one, a fault when
 * some lane cannot take part. */
static bool kemu_shuffle(int w)
{
    kemu_fiber *lane = &B->f[32 * w];
    int waiting = 0, n = B->n - 32 * w < 32 ? B->n - 32 * w : 32;
    for (int i = 0; i < n; i++)
        waiting += lane[i].state == F_SHFL;
    if (!waiting)
        return false;
    if (n < 32) {
        B->cur = 32 * w;
        kemu_fault("a full-warp shuffle in a warp of fewer than 32 threads");
    }
    if (waiting < 32)
        for (int i = 0; i < 32; i++)
            if (lane[i].state != F_SHFL) {
                for (int j = 0; j < 32; j++)
                    if (lane[j].state == F_SHFL)
                        B->cur = 32 * w + j;
                kemu_fault(lane[i].state == F_DONE
                               ? "a shuffle waits for a lane of its warp that has returned"
                               : "a shuffle waits for a lane of its warp that waits at a barrier");
            }
    const bool gather = lane[0].in != nullptr;
    uint64_t got[32];
    for (int i = 0; i < 32; i++) {
        if (lane[i].mask != 0xffffffffu || (lane[i].in != nullptr) != gather ||
            lane[i].direct != lane[0].direct || (!lane[i].direct && lane[i].xr != lane[0].xr) ||
            lane[i].bytes != lane[0].bytes) {
            B->cur = 32 * w + i;
            kemu_fault("the lanes of a warp shuffle differently (mask, kind, lane mask or size)");
        }
        if (!gather)
            got[i] = lane[lane[i].direct ? lane[i].xr : i ^ lane[i].xr].val;
    }
    if (gather) {
        /* every lane's bytes into lane 0's out, then copies of it: the fibers are stopped, so
         * their stacks hold still */
        const size_t n = lane[0].bytes;
        for (int j = 0; j < 32; j++)
            memcpy((char *)lane[0].out + j * n, lane[j].in, n);
        for (int i = 1; i < 32; i++)
            memcpy(lane[i].out, lane[0].out, 32 * n);
    }
    for (int i = 0; i < 32; i++) {
        if (!gather)
            lane[i].val = got[i];
        lane[i].state = F_READY;
    }
    return true;
}

/* One block: each warp in turn runs until its lanes all wait at a barrier or have returned
 * (its shuffles exchanged as they come); then the barrier opens, until every thread returns. */
static void kemu_run_block()
{
    int n = B->n;
    for (int i = 0; i < n; i++) {
        kemu_fiber *f = &B->f[i];
        f->state = F_READY;
        f->tid = uint3{(unsigned)i % B->block.x, (unsigned)i / B->block.x % B->block.y,
                       (unsigned)i / (B->block.x * B->block.y)};
    }
    for (;;) {
        for (int w = 0; w * 32 < n; w++) {
            int end = 32 * w + 32 < n ? 32 * w + 32 : n;
            do {
                for (int i = 32 * w; i < end; i++)
                    if (B->f[i].state == F_READY)
                        kemu_resume(i);
            } while (kemu_shuffle(w));
        }
        int at_barrier = 0;
        for (int i = 0; i < n; i++)
            at_barrier += B->f[i].state == F_BARRIER;
        if (!at_barrier)
            return; /* every thread has returned */
        for (int i = 0; i < n; i++)
            if (B->f[i].state == F_BARRIER)
                B->f[i].state = F_READY;
    }
}

/* ===== errors, devices ===== */

static thread_local cudaError_t last_error = cudaSuccess;

static cudaError_t kemu_err(cudaError_t e)
{
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range "
                                                      "is already mapped";
    case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered "
                                                  "memory region";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is "
                                                   "capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error "
                                                   "during capture";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError()
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    return device == 0 ? cudaSuccess : kemu_err(cudaErrorInvalidDevice);
}

/* The multiprocessors the emulated device reports: 1, or OROCHI_KEMU_SMS (1..1024) to play a
 * larger card's launch-shape choices (attention's parts, kcuda_att_parts). */
static int kemu_sms()
{
    const char *e = getenv("OROCHI_KEMU_SMS");
    int v = e ? atoi(e) : 1;
    return v >= 1 && v <= 1024 ? v : 1;
}

int kemu_resident()
{
    const char *e = getenv("OROCHI_KEMU_RESIDENT");
    int v = e ? atoi(e) : 64;
    return v >= 1 && v <= 1024 ? v : 64;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (device != 0)
        return kemu_err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CUDA emulator on the CPU");
    p->totalGlobalMem = (size_t)8 << 30;
    p->major = 9;
    p->multiProcessorCount = kemu_sms();
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int device)
{
    if (device != 0)
        return kemu_err(cudaErrorInvalidDevice);
    if (attr == cudaDevAttrMultiProcessorCount) {
        *v = kemu_sms();
        return cudaSuccess;
    }
    /* discrete unless OROCHI_KEMU_INTEGRATED=1 says to play a unified-memory machine */
    const char *e = getenv("OROCHI_KEMU_INTEGRATED");
    *v = attr == cudaDevAttrIntegrated && e && *e == '1';
    return cudaSuccess;
}

/* ===== memory ===== */

struct kemu_alloc {
    char *map;
    size_t map_bytes, bytes;
};

static std::mutex mem_lock;
static std::map<uintptr_t, kemu_alloc> allocs;     /* by start */
static std::map<uintptr_t, size_t> registered;     /* host ranges, by start */

/* The device allocation or registered range holding [p, p + n); false when there is none. */
static bool kemu_known(const void *p, size_t n)
{
    std::lock_guard<std::mutex> l(mem_lock);
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it != allocs.begin()) {
        --it;
        if (a - it->first + n <= it->second.bytes)
            return true;
    }
    auto r = registered.upper_bound(a);
    if (r == registered.begin())
        return false;
    --r;
    return a - r->first + n <= r->second;
}

/* false when [p, p + n) starts inside a device allocation and runs past its end */
static bool kemu_in_bounds(const void *p, size_t n)
{
    std::lock_guard<std::mutex> l(mem_lock);
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin())
        return true;
    --it;
    size_t span = ((it->second.bytes + 255) & ~(size_t)255);
    if (a - it->first >= span)
        return true;
    return a - it->first + n <= it->second.bytes;
}

/* ===== streams and capture ===== */

struct kemu_stream {
    bool capturing, invalidated;
    std::vector<std::function<void()>> ops;
};
struct kemu_graph {
    std::vector<std::function<void()>> ops;
};

static thread_local kemu_stream *capturing_here; /* the stream this thread records into */

/* An operation the capture rules forbid while this thread records: it invalidates the capture. */
static bool kemu_unsafe_in_capture()
{
    if (!capturing_here)
        return false;
    capturing_here->invalidated = true;
    last_error = cudaErrorStreamCaptureUnsupported;
    return true;
}

static void kemu_submit(cudaStream_t s, std::function<void()> op)
{
    if (s && s->capturing)
        s->ops.push_back(std::move(op));
    else
        op();
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    *s = new kemu_stream();
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if ((s && s->capturing) || kemu_unsafe_in_capture()) {
        if (s)
            s->invalidated = true;
        return kemu_err(cudaErrorStreamCaptureUnsupported);
    }
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    *p = nullptr;
    if (kemu_unsafe_in_capture())
        return cudaErrorStreamCaptureUnsupported;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t span = (bytes + 255) & ~(size_t)255; /* allocations are 256-byte aligned */
    size_t body = (span + page - 1) / page * page;
    char *m = (char *)mmap(nullptr, body + page, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return kemu_err(cudaErrorMemoryAllocation);
    mprotect(m + body, page, PROT_NONE); /* a read or write past the end faults */
    char *start = m + body - span;
    memset(start, 0xff, span); /* NaN in every float: a read of what nothing wrote shows */
    std::lock_guard<std::mutex> l(mem_lock);
    allocs[(uintptr_t)start] = kemu_alloc{m, body + page, bytes};
    *p = start;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (!p)
        return cudaSuccess;
    if (kemu_unsafe_in_capture())
        return cudaErrorStreamCaptureUnsupported;
    std::lock_guard<std::mutex> l(mem_lock);
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end())
        return kemu_err(cudaErrorInvalidDevicePointer);
    munmap(it->second.map, it->second.map_bytes);
    allocs.erase(it);
    return cudaSuccess;
}

/* A copy's checks: its ranges within their allocations, and while capturing, only device or
 * registered memory (a graph copies no pageable memory). */
static cudaError_t kemu_copy_ok(cudaStream_t s, const void *dst, size_t dn, const void *src,
                                size_t sn)
{
    if (!kemu_in_bounds(dst, dn) || !kemu_in_bounds(src, sn))
        return cudaErrorInvalidValue;
    if (s && s->capturing && (!kemu_known(dst, dn) || !kemu_known(src, sn))) {
        s->invalidated = true;
        return cudaErrorStreamCaptureUnsupported;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    (void)kind;
    if (!bytes)
        return cudaSuccess;
    cudaError_t e = kemu_copy_ok(s, dst, bytes, src, bytes);
    if (e != cudaSuccess)
        return kemu_err(e);
    kemu_submit(s, [=]() { memmove(dst, src, bytes); });
    return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t rows, cudaMemcpyKind kind, cudaStream_t s)
{
    (void)kind;
    if (width > dpitch || width > spitch)
        return kemu_err(cudaErrorInvalidValue); /* the runtime's "invalid pitch argument" */
    if (!width || !rows)
        return cudaSuccess;
    cudaError_t e = kemu_copy_ok(s, dst, dpitch * (rows - 1) + width, src,
                                 spitch * (rows - 1) + width);
    if (e != cudaSuccess)
        return kemu_err(e);
    kemu_submit(s, [=]() {
        for (size_t r = 0; r < rows; r++)
            memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    });
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *host, size_t bytes, unsigned flags)
{
    (void)flags;
    if (kemu_unsafe_in_capture())
        return cudaErrorStreamCaptureUnsupported;
    std::lock_guard<std::mutex> l(mem_lock);
    uintptr_t a = (uintptr_t)host;
    auto r = registered.upper_bound(a + bytes - 1);
    if (r != registered.begin()) {
        --r;
        if (r->first + r->second > a)
            return kemu_err(cudaErrorHostMemoryAlreadyRegistered);
    }
    registered[a] = bytes;
    return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned flags)
{
    (void)flags;
    if (!kemu_known(host, 1))
        return kemu_err(cudaErrorInvalidValue);
    *dev = host; /* the emulated device sees host memory where the host does */
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *host)
{
    std::lock_guard<std::mutex> l(mem_lock);
    if (!registered.erase((uintptr_t)host))
        return kemu_err(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    (void)mode;
    if (!s || s->capturing || capturing_here)
        return kemu_err(cudaErrorIllegalState);
    s->capturing = true;
    s->invalidated = false;
    s->ops.clear();
    capturing_here = s;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    *graph = nullptr;
    if (!s || !s->capturing || capturing_here != s)
        return kemu_err(cudaErrorIllegalState);
    s->capturing = false;
    capturing_here = nullptr;
    if (s->invalidated) {
        s->ops.clear();
        return kemu_err(cudaErrorStreamCaptureInvalidated);
    }
    *graph = new kemu_graph{std::move(s->ops)};
    s->ops.clear();
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags)
{
    (void)flags;
    *exec = new kemu_graph{graph->ops};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    for (auto &op : exec->ops)
        kemu_submit(s, op);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}

/* ===== launches ===== */

static const char *kemu_config_fault(const kemu_cfg_t &c)
{
    unsigned long long threads = (unsigned long long)c.block.x * c.block.y * c.block.z;
    if (!c.grid.x || !c.grid.y || !c.grid.z || !threads)
        return "an empty grid or block";
    if (threads > KEMU_MAX_THREADS || c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64)
        return "more than 1024 threads per block";
    if (c.grid.x > 0x7fffffffu || c.grid.y > 65535 || c.grid.z > 65535)
        return "a grid beyond 2^31-1 x 65535 x 65535 blocks";
    if (c.shared > 48 << 10)
        return "more than 48 KiB of dynamic shared memory";
    return nullptr;
}

static void kemu_execute(const kemu_cfg_t &c, const std::function<void()> &body)
{
    int n = (int)(c.block.x * c.block.y * c.block.z);
    if (!mem.fibers)
        mem.fibers = new kemu_fiber[KEMU_MAX_THREADS](); /* zeroed: none started */
    kemu_block blk;
    blk.grid = c.grid;
    blk.block = c.block;
    blk.f = mem.fibers;
    blk.n = n;
    blk.cur = 0;
    blk.body = &body;
    kemu_block *outer = B;
    B = &blk;
    for (unsigned z = 0; z < c.grid.z; z++)
        for (unsigned y = 0; y < c.grid.y; y++)
            for (unsigned x = 0; x < c.grid.x; x++) {
                blk.bidx = uint3{x, y, z};
                kemu_run_block();
            }
    B = outer;
    n_launches++;
}

void kemu_run(const kemu_cfg_t &cfg, std::function<void()> body)
{
    if (const char *why = kemu_config_fault(cfg)) {
        fprintf(stderr, "kemu: launch of grid (%u,%u,%u) x block (%u,%u,%u) refused: %s\n",
                cfg.grid.x, cfg.grid.y, cfg.grid.z, cfg.block.x, cfg.block.y, cfg.block.z, why);
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    kemu_submit(cfg.stream, [cfg, body]() { kemu_execute(cfg, body); });
}

/* ===== cuBLAS ===== */

struct kemu_blas {
    cudaStream_t stream;
};

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new kemu_blas{nullptr};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    (void)h;
    return ws && bytes && !kemu_known(ws, bytes) ? CUBLAS_STATUS_INVALID_VALUE
                                                 : CUBLAS_STATUS_SUCCESS;
}

static float kemu_elem(const void *p, cudaDataType_t t, size_t i)
{
    switch (t) {
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* C = alpha op(A) op(B) + beta C, column-major; C is not read when beta is 0. */
static cublasStatus_t kemu_gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                int m, int n, int k, float alpha, const void *a, cudaDataType_t at,
                                int lda, const void *b, cudaDataType_t bt, int ldb, float beta,
                                float *c, int ldc)
{
    int a_rows = ta == CUBLAS_OP_N ? m : k, b_rows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < (a_rows > 1 ? a_rows : 1) ||
        ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    kemu_submit(h->stream, [=]() {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                float s = 0.0f;
                for (int p = 0; p < k; p++) {
                    size_t ai = ta == CUBLAS_OP_N ? (size_t)i + (size_t)p * lda
                                                  : (size_t)p + (size_t)i * lda;
                    size_t bi = tb == CUBLAS_OP_N ? (size_t)p + (size_t)j * ldb
                                                  : (size_t)j + (size_t)p * ldb;
                    s += kemu_elem(a, at, ai) * kemu_elem(b, bt, bi);
                }
                float *o = c + (size_t)i + (size_t)j * ldc;
                *o = beta == 0.0f ? alpha * s : alpha * s + beta * *o;
            }
    });
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *a, int lda,
                           const float *b, int ldb, const float *beta, float *c, int ldc)
{
    return kemu_gemm(h, ta, tb, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, *beta, c,
                     ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *a, cudaDataType_t at,
                            int lda, const void *b, cudaDataType_t bt, int ldb, const void *beta,
                            void *c, cudaDataType_t ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    /* the combinations kernels/cuda uses: 16-bit (or f32) inputs of one type, f32 output */
    if (at != bt || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return kemu_gemm(h, ta, tb, m, n, k, *(const float *)alpha, a, at, lda, b, bt, ldb,
                     *(const float *)beta, (float *)c, ldc);
}
