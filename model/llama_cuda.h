/*
 * model/llama_cuda — one part of the Llama forward on a GPU (the GPU worker: orochi-worker
 * --device gpu). Built only with CUDA (CMake OROCHI_CUDA); this header's inline parts serve
 * every build.
 *
 * The part is an ordinary llama_ctx (its partition, tree lists, prefix lengths and shared block
 * are the CPU's), and llama_gpu_forward runs exactly the steps llama_forward runs, meeting the
 * other parts at the same synchronisation points, with the GPU op set (kernels/cuda): so CPU and
 * GPU workers mix in one group under any partition plan. The shared block — the KV cache and the
 * activations parts exchange, normally the shared-memory arena — stays in host memory and is
 * mapped for the device (cudaHostRegister); the norms are copied into device memory, and the weight
 * matrices either as the rows this part computes (grown when a new partition needs more) or not at
 * all, read in place from the model file (llama_gpu_weights). Where the forward keeps the rest is
 * the memory mode:
 *   - mapped: kernels read and write the shared block in place — the unified-memory path of
 *     machines whose CPU and GPU share memory;
 *   - mirror (discrete cards): the activations live in device memory and only the columns parts
 *     exchange cross the bus (this part's own before each synchronisation point, the others'
 *     after it); the K/V rows attention reads are kept in a device copy of the KV cache, which
 *     takes each newly committed row once from the shared block (the source of truth: a slot
 *     whose rows change other than by growing is read again, llama_shared.epoch).
 * A part that is the only one has no synchronisation points to meet: its whole step is queued at
 * once, and (graphs on) recorded as a CUDA graph per batch shape and replayed as one launch.
 * Attention cuts a long key stream into parts that run side by side when the batch has too few
 * (token, head) pairs to fill the device (kcuda_att_parts): the longer the context, the more.
 */
#ifndef OROCHI_LLAMA_CUDA_H
#define OROCHI_LLAMA_CUDA_H

#include <string.h>

#include "model/llama.h"

typedef struct llama_gpu llama_gpu;

typedef enum {
    LLAMA_GPU_AUTO,   /* mapped on an integrated GPU, mirror on a discrete one */
    LLAMA_GPU_MAPPED, /* activations and K/V read and written in the mapped shared block */
    LLAMA_GPU_MIRROR, /* activations and K/V in device memory, the shared block the source */
} llama_gpu_memory;

/* Where the weight matrices live (llama_gpu_params.weights):
 *   - device: in device memory, and only the rows this part computes under its partition (its
 *     share of each matrix's output rows; under a Megatron plan the whole of wo and down, which it
 *     reads by input columns; the token embedding whole). A new partition that needs rows a
 *     matrix lacks uploads that matrix again, holding the rows of both partitions when the
 *     memory limit allows it, so plans that take turns do not upload at every switch;
 *   - mapped: read in place from the model file's pages (registered read-only with the device):
 *     no copy at all — one copy of the weights on the machine, shared by every process that
 *     maps the file. The memory itself on an integrated GPU; over the bus on a discrete card;
 *   - auto: mapped on an integrated GPU, device on a discrete one. */
typedef enum { LLAMA_GPU_WEIGHTS_AUTO, LLAMA_GPU_WEIGHTS_DEVICE, LLAMA_GPU_WEIGHTS_MAPPED } llama_gpu_weights;

typedef struct {
    int device;              /* CUDA device index */
    llama_gpu_memory memory; /* where the activations and the K/V rows live */
    llama_gpu_weights weights; /* where the weight matrices live */
    size_t memory_limit;     /* device memory this part may take (0: no limit): a part whose
                                weights and buffers would need more is refused, naming both */
    bool graphs;             /* a sole part replays its steps as CUDA graphs */
    bool unfused;            /* one launch per op, not the fused launches (for comparison) */
    int matmul_unroll;       /* kcuda_set_matmul_unroll's groups (0: by the step's width) */
    int matmul_kind;         /* kcuda_set_matmul_kind's KCUDA_MM_AUTO (0), _SIMT (CUDA cores) or
                                _TC (tensor cores) for the quantized matrices */
    int att_parts;           /* attention's key streams cut into this many parts (0: by length,
                                kcuda_att_parts; 1: never cut) */
    int att_keys;            /* kcuda_set_att_keys's keys an attention warp scores at once (0: 4) */
    int att_tile;            /* attention by tiles: kcuda_set_att_tile's 0 (by the step's width
                                and longest key stream), 1 (always) or 2 (never: the plain
                                kernel) */
    int matmul_frag;         /* the tensor-core matmul's inputs in fragment order:
                                kcuda_set_matmul_frag's 0 (by the step's width), 1 (from 2
                                tokens) or 2 (never); the same bits */
    int matmul_groups;       /* the tensor-core matmul's token groups a launch:
                                kcuda_set_matmul_groups's 0 (the default), 1, 2, 4 or 8; the
                                same bits */
    bool matmul_early;       /* the tensor-core matmul launched early: kcuda_set_matmul_early (off
                                by default; the same bits) */
    int matmul_depth;        /* the tensor-core matmul's blocks in flight a warp in a step of up
                                to 8 tokens: kcuda_set_matmul_depth's 0 (by the launch's size),
                                4 or 8; the same bits */
} llama_gpu_params;

/* "auto", "mapped", "mirror" to the mode; -1 for another word. Inline, so that the roles that
 * only pass the word on (the coordinator, `orochi bench` without CUDA) check it the same way. */
static inline int llama_gpu_memory_parse(const char *s)
{
    return !strcmp(s, "auto")     ? LLAMA_GPU_AUTO
           : !strcmp(s, "mapped") ? LLAMA_GPU_MAPPED
           : !strcmp(s, "mirror") ? LLAMA_GPU_MIRROR
                                  : -1;
}

/* "auto", "cuda", "tensor" to llama_gpu_params.matmul_kind (KCUDA_MM_AUTO, _SIMT, _TC: 0, 1, 2);
 * -1 for another word. Inline, as llama_gpu_memory_parse. */
static inline int llama_gpu_matmul_parse(const char *s)
{
    return !strcmp(s, "auto") ? 0 : !strcmp(s, "cuda") ? 1 : !strcmp(s, "tensor") ? 2 : -1;
}

/* "auto" to 0, "1".."256" to that number of parts (llama_gpu_params.att_parts); -1 for another
 * word. Inline, as llama_gpu_memory_parse. */
static inline int llama_gpu_att_parts_parse(const char *s)
{
    if (!strcmp(s, "auto"))
        return 0;
    int v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || v > 256)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return *s && v >= 1 && v <= 256 ? v : -1; /* 256: KCUDA_ATT_MAX_PARTS */
}

/* "auto", "device", "mapped" to llama_gpu_weights; -1 for another word. */
static inline int llama_gpu_weights_parse(const char *s)
{
    return !strcmp(s, "auto")     ? LLAMA_GPU_WEIGHTS_AUTO
           : !strcmp(s, "device") ? LLAMA_GPU_WEIGHTS_DEVICE
           : !strcmp(s, "mapped") ? LLAMA_GPU_WEIGHTS_MAPPED
                                  : -1;
}
static inline const char *llama_gpu_weights_name(llama_gpu_weights w)
{
    return w == LLAMA_GPU_WEIGHTS_DEVICE ? "device" : w == LLAMA_GPU_WEIGHTS_MAPPED ? "mapped"
                                                                                     : "auto";
}
/* A byte count with an optional K, M, G or T suffix (powers of 1024; "0": no limit) into *out;
 * -1 for anything else. For --gpu-memory-limit. */
static inline int llama_gpu_bytes_parse(const char *s, size_t *out)
{
    double v = 0, scale = 1;
    int n = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++, n++)
        v = v * 10 + (*p - '0');
    if (*p == '.') {
        double f = 0.1;
        for (p++; *p >= '0' && *p <= '9'; p++, n++, f /= 10)
            v += (*p - '0') * f;
    }
    if (!n)
        return -1;
    switch (*p) {
    case 'K': case 'k': scale = 1024.0; p++; break;
    case 'M': case 'm': scale = 1024.0 * 1024; p++; break;
    case 'G': case 'g': scale = 1024.0 * 1024 * 1024; p++; break;
    case 'T': case 't': scale = 1024.0 * 1024 * 1024 * 1024; p++; break;
    default: break;
    }
    if (*p == 'B' || *p == 'b' || (*p == 'i' && p[1] == 'B'))
        p += *p == 'i' ? 2 : 1;
    if (*p || v * scale > 1e18)
        return -1;
    *out = (size_t)(v * scale + 0.5);
    return 0;
}
static inline const char *llama_gpu_memory_name(llama_gpu_memory m)
{
    return m == LLAMA_GPU_MAPPED ? "mapped" : m == LLAMA_GPU_MIRROR ? "mirror" : "auto";
}

/* Put ctx's forward on CUDA device p->device. [map_base, map_base + map_bytes) is host memory
 * that holds the context's shared block and the logits the forward writes (the arena): it is
 * registered with the device. Refused, with err naming the reason: a weight type the GPU does not
 * take, a KV cache that is not f32 or f16, a prefix source or screening head, a shared block
 * outside the map, no device, not enough device memory for the mirror. */
llama_gpu *llama_gpu_new(llama_ctx *ctx, const llama_gpu_params *p, void *map_base,
                         size_t map_bytes, char *err, size_t errlen);
void llama_gpu_destroy(llama_gpu **gpu);
/* llama_forward on the GPU: the same batch rules, results and synchronisation points; logits
 * (inside the map, or NULL) as llama_forward writes them. 0, or -1 with err. */
int llama_gpu_forward(llama_gpu *gpu, const llama_batch *b, float *logits, char *err,
                      size_t errlen);
/* The device's name and memory, and the memory mode taken, for logs ("NVIDIA H100 80GB HBM3,
 * 79 GiB, sm_90, 132 multiprocessors; memory mirror, graphs on"). */
const char *llama_gpu_describe(const llama_gpu *gpu);
/* Steps replayed from an earlier recording, and graphs recorded (each then launched once), since
 * the start (0 without graphs). */
void llama_gpu_graph_counts(const llama_gpu *gpu, long *replayed, long *recorded);
/* Ops queued on the device since the start (kcuda_launches: kernels, copies, graph launches). */
long llama_gpu_launches(const llama_gpu *gpu);
/* How the last step's kernels ran: the parts attention cut each token's key stream into
 * (kcuda_att_parts), whether attention ran by tiles (kcuda_att_tiles), the quantized matmul's
 * groups in flight (kcuda_matmul_unroll), whether the first layer's q projection ran on tensor
 * cores (kcuda_matmul_kind), with its inputs in fragment order (kcuda_matmul_frag), in how many
 * token groups (kcuda_matmul_groups) and with how many blocks in flight a warp in the fused q/k/v
 * launch of the whole matrices (kcuda_matmul_depth: 0 on CUDA cores). */
typedef struct {
    int att_parts;
    bool att_tiles;
    int unroll;
    bool tensor_cores;
    bool frag;
    int groups;
    int depth;
} llama_gpu_how;
llama_gpu_how llama_gpu_last_step(const llama_gpu *gpu);
/* The device memory the part holds: its weight matrices' (0 with mapped weights), the device
 * copy of the K/V cache (mirror mode: the KV heads it stores or reads), and in all (with the
 * norms, biases and activations); the windows and K/V copies made again for a new partition since
 * the start. */
typedef struct {
    size_t weights, kv, total;
    long rewindowed;
} llama_gpu_memory_used;
llama_gpu_memory_used llama_gpu_memory_use(const llama_gpu *gpu);
/* The device memory the part would hold under its context's partition as it stands now (set by
 * llama_ctx_set_partition; the part places itself at its next step): the buffers, the K/V copy of
 * the heads it would store or read (mirror mode), and its share of the weights (device weights).
 * A plan whose figure passes the memory limit would be refused at that step. */
size_t llama_gpu_need_bytes(const llama_gpu *gpu);
/* The device memory of the weight rows a part needs under ctx's current partition with device
 * weights (what llama_gpu_new would upload, the windows' exact rows): the part's share of every
 * matrix, the embedding whole. Needs no device (plans are sized with it). */
size_t llama_gpu_share_bytes(const llama_ctx *ctx);

#endif
