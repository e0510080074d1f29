/*
 * model/llama_cuda.c — one part of the Llama forward on a GPU (model/llama_cuda.h).
 *
 * llama_gpu_forward follows llama_forward step by step (model/llama.c): the batch is prepared on
 * the host (ancestor lists, positions, RoPE angles), the per-token arrays the attention kernel
 * reads are uploaded, and then per layer: rmsnorm, the part's q/k/v rows, RoPE, the K/V rows into
 * the tree area, attention for the part's units (full, dense or sparse), the merge of split heads,
 * the output projection and residual, rmsnorm, gate/up, SiLU, down and residual — each result
 * where the CPU part would have written it in the shared block, so the other parts (CPU or GPU)
 * read it there. By default these run as fused launches (kcuda.h): q/k/v as one matmul, RoPE with
 * the K/V stores, each residual add inside its matmul, gate/up with SiLU: a sole part's layer
 * is 8 launches where one per op (llama_gpu_params.unfused, for comparison) takes 17, or 19 in
 * mirror mode; the bits are the same either way.
 *
 * Mapped mode works in the shared block itself. Mirror mode works in device buffers of the same
 * shapes (gpu_bufs) and meets the others through the block: before a synchronisation point its
 * own columns go out, after it the others' come in (gpu_meet). Its K/V cache is a device copy of
 * the block's, laid out alike: the rows of the heads its attention reads, brought up to each
 * slot's committed length at the start of a step (gpu_mirror_prefix), and the tree rows of the
 * step (its own heads' stored on both sides, another part's read after the projections' sync).
 * A sole part has no synchronisation points: the step is queued whole and, with graphs on,
 * recorded once per shape (width, logits start, appended-batch offset, logits address, the parts
 * attention cuts its key streams into) and replayed; a new partition drops the recordings.
 * The weights (gpu_win): each matrix a window of the rows the partition gives this part, uploaded
 * again (grown) before a step whose partition needs rows it lacks, within the part's memory limit;
 * or the model file's own pages, registered read-only (mapped weights).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kcuda.h"
#include "kernels/cuda/kcuda_check.h"
#include "model/llama_cuda.h"
#include "model/llama_internal.h"

typedef struct {
    kmat wq, wk, wv, wo, w_gate, w_up, w_down;
    float *attn_norm, *ffn_norm;
    float *bq, *bk, *bv, *bo, *q_norm, *k_norm; /* device copies of the layer's, or NULL */
    bool qkv_alike, ffn_alike; /* q, k, v (gate, up) of one type and width: one fused launch */
} gpu_layer;

/* Where a step's activations and K/V are, as device addresses: the mapped shared block, or the
 * mirror's buffers. */
typedef struct {
    float *x, *q, *att, *xb2, *hg, *hu, *kk, *vv, *ap, *mp, *logits;
    uint8_t *kv;
} gpu_bufs;

/* What a step's kernels read besides activations: each token's id, first prefix row, prefix
 * length and ancestor count, its RoPE angles and ancestor list (W apart), and the split heads. */
typedef struct {
    int32_t *tokens, *seq_row, *n_prefix, *n_anc, *split, *anc;
    float *cs, *sn;
} gpu_stage;

static void *gpu_stage_take(uint8_t *base, size_t *off, size_t count)
{
    void *p = base ? base + *off : NULL;
    *off += count * 4;
    return p;
}

/* The arrays' places from base for width W (NULL base: only the size); the bytes they take. */
static size_t gpu_stage_at(gpu_stage *s, uint8_t *base, size_t W, size_t heads, size_t half)
{
    size_t off = 0;
    s->tokens = gpu_stage_take(base, &off, W);
    s->seq_row = gpu_stage_take(base, &off, W);
    s->n_prefix = gpu_stage_take(base, &off, W);
    s->n_anc = gpu_stage_take(base, &off, W);
    s->split = gpu_stage_take(base, &off, heads);
    s->cs = gpu_stage_take(base, &off, W * half);
    s->sn = gpu_stage_take(base, &off, W * half);
    s->anc = gpu_stage_take(base, &off, W * W);
    return off;
}

#define GPU_MAX_GRAPHS 256
#define GPU_WIN_ALIGN 16 /* a weight window's rows start and end on multiples of this */

/* A layer's seven matrices in the order every loop over them takes, and the rows each needs */
#define GPU_LAYER_MATS(L) {&(L)->wq, &(L)->wk, &(L)->wv, &(L)->wo, &(L)->w_gate, &(L)->w_up, &(L)->w_down}

/* One weight matrix on the device: rows [lo, hi) of src in `block` (dst->data points lo rows
 * before it, so a kernel finds row r where a whole copy would have it; only rows inside the
 * window are ever read). The window's kind (gpu_win_need) says which rows a partition needs. */
typedef enum { GW_Q, GW_KV, GW_WO, GW_FFN_UP, GW_DOWN, GW_LM_HEAD, GW_ALL } gpu_win_kind;
typedef struct {
    const kmat *src;
    kmat *dst;
    gpu_win_kind kind;
    void *block;
    int64_t lo, hi;
} gpu_win;
static const gpu_win_kind gpu_layer_kind[7] = {GW_Q,      GW_KV,     GW_KV,  GW_WO,
                                               GW_FFN_UP, GW_FFN_UP, GW_DOWN};

typedef struct {
    int n, from, base, att_parts;
    bool att_tiles;
    float *logits;
    kcuda_graph *graph;
} gpu_graph;

struct llama_gpu {
    llama_ctx *x;
    kcuda *g;
    uint8_t *host_base, *dev_base;
    size_t map_bytes;
    bool registered;
    gpu_layer *layers;
    kmat tok_embd, lm_head;
    float *out_norm;
    void **allocs; /* device blocks owned (the buffers, the norms and biases) */
    int n_allocs, cap_allocs;
    /* the weight matrices: with device weights each a window of the rows the part computes
     * (gpu_win_fit), grown when a new partition needs rows it lacks; with mapped weights the
     * model file's own pages, registered (wmap_*) */
    gpu_win *wins;
    int n_wins;
    llama_gpu_weights weights; /* DEVICE or MAPPED once resolved */
    const uint8_t *wmap_host; /* the file's mapping, registered by this part (wmap_registered) */
    bool wmap_registered;
    size_t limit;            /* llama_gpu_params.memory_limit (0: none) */
    size_t buf_bytes;        /* device memory of the allocs */
    size_t win_bytes;        /* device memory of the windows */
    long rewindowed;         /* windows uploaded again for a new partition */
    llama_part_cols win_pc;  /* the ranges the windows were last fitted to (win_megatron too) */
    bool win_megatron;
    bool placed;             /* the weights placed at the start (llama_gpu_new) */
    float *xb, *attp, *xs; /* normed x; merged attention; a Megatron linear's input slice */
    /* the step's small arrays (gpu_stage_at): filled on the host in a registered (page-locked)
     * block, sent to the device's twin in one copy */
    uint8_t *h_block, *d_block;
    size_t stage_bytes;
    bool stage_registered;
    gpu_stage h, d;
    llama_gpu_memory memory; /* MAPPED or MIRROR once resolved */
    gpu_bufs shb, dev;       /* the shared block's addresses; where the step works */
    /* mirror: the device copy of the K/V cache holds KV heads [m0, m1) only — every head this
     * part stores or whose rows its attention reads — each layer's K and V blocks mlkv bytes
     * (the shared block's hold every head, layer_kv_bytes); kv_pitch: a head's region */
    size_t kv_bytes, mlkv, kv_pitch;
    int m0, m1;
    void *mkv; /* its allocation (dev.kv), replaced when a partition needs other heads */
    /* mirror: per slot the committed rows copied so far and the epoch they were copied under;
     * per KV head whether attention reads its prefix (need_p) and tree rows (need_t) */
    int *mir_len, *mir_stamp;
    uint32_t *mir_epoch;
    uint8_t *need_p, *need_t, *prev_need_p;
    long steps;
    /* graphs (a sole part): the recordings, and the partition they were recorded under */
    bool graphs;
    bool fuse; /* the fused launches (kcuda.h) where a layer's matrices allow them */
    /* attention: the parts asked (llama_gpu_params.att_parts); this step's longest key stream;
     * how the step runs (its parts and whether by tiles are a recording's key) */
    int att_ask, att_keys;
    llama_gpu_how how;
    gpu_graph *rec;
    int n_rec;
    int64_t rec_bnd[LP_N][LLAMA_MAX_PARTS + 1];
    long replayed, recorded;
    char describe[480];
};

static void *gpu_alloc(llama_gpu *gp, size_t bytes)
{
    if (gp->n_allocs == gp->cap_allocs) {
        int cap = gp->cap_allocs ? 2 * gp->cap_allocs : 64;
        void **a = realloc(gp->allocs, (size_t)cap * sizeof *a);
        if (!a)
            return NULL;
        gp->allocs = a;
        gp->cap_allocs = cap;
    }
    void *p = kcuda_alloc(bytes);
    if (p) {
        gp->allocs[gp->n_allocs++] = p;
        gp->buf_bytes += bytes;
    }
    return p;
}

#define LLAMA_MAX_KV_HEADS_GPU 256 /* KV heads a step's per-head lists hold */

static void gpu_graphs_drop(llama_gpu *gp);

/* A weight matrix of the part: checked for a type the GPU takes, its window empty until
 * gpu_win_fit (or, with mapped weights, gpu_win_map) places it. */
static int gpu_win_add(llama_gpu *gp, const kmat *src, kmat *dst, gpu_win_kind kind,
                       const char *what, char *err, size_t errlen)
{
    if (!kcuda_type_ok(src->type)) {
        snprintf(err, errlen,
                 "%s is %s: the GPU worker takes " KT_SUPPORTED_LIST
                 " matrices (orochi quantize converts a model)",
                 what, kt_traits_of(src->type) ? kt_traits_of(src->type)->name : "unknown");
        return -1;
    }
    *dst = *src;
    dst->packed = NULL;
    dst->data = NULL;
    gp->wins[gp->n_wins++] = (gpu_win){src, dst, kind, NULL, 0, 0};
    return 0;
}

/* The rows [lo, hi) of a window's matrix (rows in all) that the context's partition gives it. */
static void gpu_win_need(const llama_ctx *x, const llama_part_cols *pc, gpu_win_kind k,
                         int64_t rows, int64_t *lo, int64_t *hi)
{
    int64_t r[GW_ALL][2] = {{pc->q0, pc->q1}, {pc->k0, pc->k1}, {pc->d0, pc->d1},
                            {pc->f0, pc->f1}, {pc->e0, pc->e1}, {pc->v0, pc->v1}};
    /* Megatron: wo and down by input columns, every output row */
    bool whole = k == GW_ALL || (x->megatron && (k == GW_WO || k == GW_DOWN));
    *lo = whole ? 0 : r[k][0];
    *hi = whole ? rows : r[k][1];
    /* whole groups of GPU_WIN_ALIGN rows: a range need not fall on them (an even split of a
     * 300-token vocabulary gives rows 150..299), and the CPU stand-in's twin (kmat_mul) reads the
     * 16-row groups its range touches */
    if (*hi > *lo) {
        *lo -= *lo % GPU_WIN_ALIGN;
        *hi = (*hi + GPU_WIN_ALIGN - 1) / GPU_WIN_ALIGN * GPU_WIN_ALIGN;
        *hi = *hi < rows ? *hi : rows;
    }
}

static size_t gpu_rows_bytes(const kmat *m, int64_t lo, int64_t hi)
{
    return hi > lo ? (size_t)(hi - lo) * m->row_bytes : 0;
}

static double gpu_mib(size_t bytes)
{
    return (double)bytes / (1 << 20);
}

size_t llama_gpu_share_bytes(const llama_ctx *x)
{
    const llama_model *m = x->m;
    llama_part_cols pc;
    llama_part_cols_of(x, &pc);
    int64_t lo, hi;
    size_t sum = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        const kmat *w[7] = GPU_LAYER_MATS(L);
        for (int k = 0; k < 7; k++) {
            gpu_win_need(x, &pc, gpu_layer_kind[k], w[k]->rows, &lo, &hi);
            sum += gpu_rows_bytes(w[k], lo, hi);
        }
    }
    sum += gpu_rows_bytes(&m->tok_embd, 0, m->tok_embd.rows);
    if (!m->tied) {
        gpu_win_need(x, &pc, GW_LM_HEAD, m->lm_head.rows, &lo, &hi);
        sum += gpu_rows_bytes(&m->lm_head, lo, hi);
    }
    return sum;
}

/* Window w as rows [lo, hi) of its matrix in a device block of their own (its old block freed
 * first): the kmat the kernels get points lo rows before the block, so row r is where a whole
 * copy would have it and rows before lo are never read. 0, or -1 with err. */
static int gpu_win_load(llama_gpu *gp, gpu_win *w, int64_t lo, int64_t hi, char *err,
                        size_t errlen)
{
    kcuda_free(w->block);
    gp->win_bytes -= gpu_rows_bytes(w->src, w->lo, w->hi);
    w->block = NULL;
    w->lo = w->hi = 0;
    w->dst->data = NULL;
    size_t bytes = gpu_rows_bytes(w->src, lo, hi);
    if (!bytes)
        return 0; /* none of its rows needed: the window stays empty */
    void *d = kcuda_alloc(bytes);
    if (!d) {
        snprintf(err, errlen, "cannot allocate %.1f MiB of GPU memory for a weight matrix",
                 gpu_mib(bytes));
        return -1;
    }
    const uint8_t *src = (const uint8_t *)w->src->data + (size_t)lo * w->src->row_bytes;
    if (kcuda_upload(gp->g, d, src, bytes, err, errlen)) {
        kcuda_free(d);
        return -1;
    }
    w->block = d;
    w->lo = lo;
    w->hi = hi;
    w->dst->data = (uint8_t *)d - (size_t)lo * w->src->row_bytes;
    gp->win_bytes += bytes;
    return 0;
}

/* Device weights: every window holds at least the rows the current partition needs. A window
 * that lacks some is uploaded again, holding its old rows too (the union) while the memory limit
 * allows it, else exactly the rows needed — every window then, so the whole fits wherever the
 * needed rows do. The recordings (which hold the old addresses) are dropped. 0, or -1 with err
 * naming the bytes needed against the limit. Called between steps, the stream drained. */
static int gpu_win_fit(llama_gpu *gp, char *err, size_t errlen)
{
    if (gp->weights != LLAMA_GPU_WEIGHTS_DEVICE)
        return 0;
    llama_part_cols pc;
    llama_part_cols_of(gp->x, &pc);
    if (gp->placed && gp->win_megatron == gp->x->megatron &&
        !memcmp(&pc, &gp->win_pc, sizeof pc))
        return 0; /* the partition of the last fit: every window holds its rows */
    size_t exact = 0, uni = 0;
    bool lacking = false;
    for (int i = 0; i < gp->n_wins; i++) {
        gpu_win *w = &gp->wins[i];
        int64_t lo, hi;
        gpu_win_need(gp->x, &pc, w->kind, w->src->rows, &lo, &hi);
        exact += gpu_rows_bytes(w->src, lo, hi);
        bool has = hi <= lo || (lo >= w->lo && hi <= w->hi);
        lacking |= !has;
        if (has || w->hi <= w->lo)
            uni += has ? gpu_rows_bytes(w->src, w->lo, w->hi) : gpu_rows_bytes(w->src, lo, hi);
        else
            uni += gpu_rows_bytes(w->src, lo < w->lo ? lo : w->lo, hi > w->hi ? hi : w->hi);
    }
    if (!lacking)
        goto fitted;
    if (gp->limit && gp->buf_bytes + exact > gp->limit) {
        char mirror[160] = "";
        if (gp->kv_bytes) /* mirror mode: the device copy of the K/V cache is among the buffers */
            snprintf(mirror, sizeof mirror,
                     ", of which the K/V cache's device copy %.1f MiB (--gpu-memory mapped reads "
                     "it in place; --kv f16 halves it)",
                     gpu_mib(gp->kv_bytes));
        snprintf(err, errlen,
                 "the GPU part needs %.1f MiB of device memory (its share of the weights %.1f "
                 "MiB, buffers %.1f MiB%s), over --gpu-memory-limit %.1f MiB: give the GPU a "
                 "smaller share (orochi bench --plans --search PLAN --devices gpu,cpu "
                 "--gpu-memory-limit finds one) or --gpu-weights mapped",
                 gpu_mib(gp->buf_bytes + exact), gpu_mib(exact), gpu_mib(gp->buf_bytes), mirror,
                 gpu_mib(gp->limit));
        return -1;
    }
    bool tight = gp->limit && gp->buf_bytes + uni > gp->limit;
    gpu_graphs_drop(gp);
    for (int i = 0; i < gp->n_wins; i++) {
        gpu_win *w = &gp->wins[i];
        int64_t lo, hi;
        gpu_win_need(gp->x, &pc, w->kind, w->src->rows, &lo, &hi);
        bool has = hi <= lo || (lo >= w->lo && hi <= w->hi);
        bool exactly = hi <= lo ? w->hi <= w->lo : w->lo == lo && w->hi == hi;
        if (tight ? exactly : has)
            continue;
        if (!tight && w->hi > w->lo) { /* the union */
            lo = lo < w->lo ? lo : w->lo;
            hi = hi > w->hi ? hi : w->hi;
        }
        if (gpu_win_load(gp, w, lo, hi, err, errlen))
            return -1;
        gp->rewindowed += gp->placed && hi > lo;
    }
    if (kcuda_sync(gp->g, err, errlen))
        return -1;
fitted:
    gp->win_pc = pc;
    gp->win_megatron = gp->x->megatron;
    return 0;
}

/* Mapped weights: the model file's pages registered read-only; every matrix read where the file
 * has it (one that lies outside the file is uploaded whole). 0, or -1 with err. */
static int gpu_win_map(llama_gpu *gp, char *err, size_t errlen)
{
    const gguf_file *f = gp->x->m->file;
    void *dev;
    int rc = kcuda_register_ro(f->base, f->size, &dev, err, errlen);
    if (rc < 0)
        return -1;
    gp->wmap_registered = rc == 0;
    gp->wmap_host = f->base;
    for (int i = 0; i < gp->n_wins; i++) {
        gpu_win *w = &gp->wins[i];
        const uint8_t *p = w->src->data;
        /* in place where the file holds it at an address the kernels can read (kcuda_aligned:
         * GGUF aligns tensor data to 32 bytes unless the file says otherwise), else uploaded */
        if (p >= f->base && p + gpu_rows_bytes(w->src, 0, w->src->rows) <= f->base + f->size &&
            kcuda_aligned(w->src)) {
            w->dst->data = (uint8_t *)dev + (p - f->base);
            w->lo = 0;
            w->hi = w->src->rows;
        } else if (gpu_win_load(gp, w, 0, w->src->rows, err, errlen)) {
            return -1;
        }
    }
    return 0;
}

static float *gpu_floats(llama_gpu *gp, const float *src, size_t n, char *err, size_t errlen)
{
    float *d = gpu_alloc(gp, n * 4);
    if (!d) {
        snprintf(err, errlen, "cannot allocate %zu bytes of GPU memory", n * 4);
        return NULL;
    }
    return kcuda_upload(gp->g, d, src, n * 4, err, errlen) ? NULL : d;
}

/* The device address of host memory inside the map. */
static void *gpu_dev(const llama_gpu *gp, const void *host)
{
    return gp->dev_base + ((const uint8_t *)host - gp->host_base);
}

static bool gpu_in_map(const llama_gpu *gp, const void *p, size_t bytes)
{
    const uint8_t *b = p;
    return b >= gp->host_base && b + bytes <= gp->host_base + gp->map_bytes;
}

static void gpu_mirror_needs(llama_gpu *gp);

/* The K (v = 0) or V (v = 1) block of layer l where the step works (dev: the mirror in mirror
 * mode) or in the shared block, as the address of KV head 0's region: the kernels add a head's.
 * The mirror's blocks hold heads [m0, m1) only, so its address lies m0 regions before them. */
static uint8_t *gpu_kv(const llama_gpu *gp, bool dev, int l, int v)
{
    if (dev && gp->memory == LLAMA_GPU_MIRROR)
        return gp->dev.kv + (size_t)(2 * l + v) * gp->mlkv - (size_t)gp->m0 * gp->kv_pitch;
    return gp->shb.kv + (size_t)(2 * l + v) * gp->x->sh.layer_kv_bytes;
}

/* The KV heads [*m0, *m1) a mirror needs under the context's partition: those the part stores
 * (its own) and those its attention units read. */
static void gpu_mirror_range(const llama_ctx *x, int *m0, int *m1)
{
    *m0 = x->kvh1 > x->kvh0 ? x->kvh0 : x->m->cfg.n_kv_heads;
    *m1 = x->kvh1 > x->kvh0 ? x->kvh1 : 0;
    for (int u = 0; u < x->n_units; u++) {
        int h = x->units[u].kvh;
        *m0 = h < *m0 ? h : *m0;
        *m1 = h + 1 > *m1 ? h + 1 : *m1;
    }
}

static size_t gpu_mirror_bytes(const llama_gpu *gp, int m0, int m1)
{
    return m1 > m0 ? 2 * (size_t)gp->x->m->cfg.n_layers * (size_t)(m1 - m0) * gp->kv_pitch : 0;
}

/* Mirror: the device copy of the K/V cache holds every KV head the partition has this part store
 * or read. When it lacks one, it is allocated again for the heads of both partitions (the union,
 * within the memory limit; else exactly the heads needed) and every slot's rows are copied again
 * (the recordings, holding the old address, are dropped). 0, or -1 with err. */
static int gpu_mirror_fit(llama_gpu *gp, char *err, size_t errlen)
{
    llama_ctx *x = gp->x;
    gpu_mirror_needs(gp);
    int m0, m1;
    gpu_mirror_range(x, &m0, &m1);
    if (m1 <= m0 || (gp->mkv && m0 >= gp->m0 && m1 <= gp->m1))
        return 0;
    size_t others = gp->buf_bytes - gp->kv_bytes + gp->win_bytes;
    if (gp->limit && others + gpu_mirror_bytes(gp, m0, m1) > gp->limit) {
        snprintf(err, errlen,
                 "the GPU part needs %.1f MiB of device memory for the device copy of the K/V "
                 "cache of KV heads %d..%d beside %.1f MiB, over --gpu-memory-limit %.1f MiB "
                 "(--gpu-memory mapped reads it in place; --kv f16 halves it)",
                 gpu_mib(gpu_mirror_bytes(gp, m0, m1)), m0, m1 - 1, gpu_mib(others),
                 gpu_mib(gp->limit));
        return -1;
    }
    if (gp->mkv) { /* the union, where the limit allows it */
        int u0 = m0 < gp->m0 ? m0 : gp->m0, u1 = m1 > gp->m1 ? m1 : gp->m1;
        if (!gp->limit || others + gpu_mirror_bytes(gp, u0, u1) <= gp->limit) {
            m0 = u0;
            m1 = u1;
        }
    }
    size_t mlkv = (size_t)(m1 - m0) * gp->kv_pitch, bytes = gpu_mirror_bytes(gp, m0, m1);
    gpu_graphs_drop(gp);
    kcuda_free(gp->mkv);
    gp->buf_bytes -= gp->kv_bytes;
    gp->mkv = gp->dev.kv = NULL;
    gp->kv_bytes = 0;
    if (!(gp->mkv = kcuda_alloc(bytes))) {
        snprintf(err, errlen,
                 "mirror: cannot allocate the device copy of the KV cache (%.1f MiB for KV heads "
                 "%d..%d); --gpu-memory mapped reads it in place",
                 gpu_mib(bytes), m0, m1 - 1);
        return -1;
    }
    gp->dev.kv = gp->mkv;
    gp->kv_bytes = bytes;
    gp->buf_bytes += bytes;
    gp->mlkv = mlkv;
    gp->m0 = m0;
    gp->m1 = m1;
    gp->rewindowed += gp->placed;
    memset(gp->mir_len, 0, (size_t)x->p.n_seq * sizeof *gp->mir_len); /* copied again */
    return 0;
}

/* The mirror's device buffers, each the shape of its shared-block twin. */
static int gpu_mirror_new(llama_gpu *gp, char *err, size_t errlen)
{
    llama_ctx *x = gp->x;
    const llama_config *c = &x->m->cfg;
    size_t W = (size_t)x->p.max_width, qd = (size_t)c->n_heads * c->head_dim;
    size_t kvr = (size_t)x->kv_row, rec = (size_t)c->n_heads * 2 * ((size_t)c->head_dim + 2);
    gpu_bufs *d = &gp->dev;
    d->kv = NULL; /* gpu_mirror_fit: the heads the partition needs */
    d->x = gpu_alloc(gp, W * (size_t)c->dim * 4);
    d->q = gpu_alloc(gp, W * qd * 4);
    d->att = gpu_alloc(gp, W * qd * 4);
    d->xb2 = gpu_alloc(gp, W * (size_t)c->dim * 4);
    d->hg = gpu_alloc(gp, W * (size_t)c->ffn * 4);
    d->hu = gpu_alloc(gp, W * (size_t)c->ffn * 4);
    d->kk = gpu_alloc(gp, W * kvr * 4);
    d->vv = gpu_alloc(gp, W * kvr * 4);
    d->ap = gpu_alloc(gp, W * rec * 4);
    d->mp = gpu_alloc(gp, (size_t)x->p.n_parts * W * (size_t)c->dim * 4);
    d->logits = gpu_alloc(gp, W * (size_t)c->vocab * 4);
    if (!d->x || !d->q || !d->att || !d->xb2 || !d->hg || !d->hu || !d->kk || !d->vv || !d->ap ||
        !d->mp || !d->logits) {
        snprintf(err, errlen, "mirror: cannot allocate the device copies of the activations; "
                              "--gpu-memory mapped reads them in place");
        return -1;
    }
    int ns = x->p.n_seq, nkv = c->n_kv_heads;
    gp->mir_len = calloc((size_t)ns, sizeof *gp->mir_len);
    gp->mir_stamp = calloc((size_t)ns, sizeof *gp->mir_stamp);
    gp->mir_epoch = calloc((size_t)ns, sizeof *gp->mir_epoch);
    gp->need_p = calloc((size_t)nkv, 3);
    if (!gp->mir_len || !gp->mir_stamp || !gp->mir_epoch || !gp->need_p) {
        snprintf(err, errlen, "out of memory setting up the GPU mirror");
        return -1;
    }
    gp->need_t = gp->need_p + nkv;
    gp->prev_need_p = gp->need_t + nkv;
    gp->kv_pitch = llama_kv_offset(x, 1, 0);
    return gpu_mirror_fit(gp, err, errlen);
}

llama_gpu *llama_gpu_new(llama_ctx *x, const llama_gpu_params *prm, void *map_base,
                         size_t map_bytes, char *err, size_t errlen)
{
    int device = prm->device;
    const llama_model *m = x->m;
    const llama_config *c = &m->cfg;
    if ((x->p.kv != KV_F32 && x->p.kv != KV_F16) || x->p.prefix_src || x->p.screen_top > 0) {
        snprintf(err, errlen, "the GPU forward needs an f32 or f16 KV cache of its own and no "
                              "screening head");
        return NULL;
    }
    if (c->n_kv_heads > LLAMA_MAX_KV_HEADS_GPU) {
        snprintf(err, errlen, "the GPU forward takes at most %d KV heads (the model has %d)",
                 LLAMA_MAX_KV_HEADS_GPU, c->n_kv_heads);
        return NULL;
    }
    if (x->p.kv_dup) {
        snprintf(err, errlen, "the GPU forward reads every tree row from the shared block: a "
                              "context with kv_dup (query heads split across parts) cannot run it");
        return NULL;
    }
    char why[256];
    if (kcuda_devices(why, sizeof why) <= device) {
        snprintf(err, errlen, "CUDA device %d: %s", device,
                 why[0] ? why : "fewer devices than that");
        return NULL;
    }
    llama_gpu *gp = calloc(1, sizeof *gp);
    if (!gp) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    gp->x = x;
    gp->host_base = map_base;
    gp->map_bytes = map_bytes;
    size_t shared_bytes = llama_shared_layout(c, x->p.n_ctx, x->p.max_width, x->p.n_seq, x->p.kv,
                                              NULL);
    if (!gpu_in_map(gp, x->sh.base, shared_bytes)) {
        snprintf(err, errlen, "the context's shared block lies outside the mapped memory");
        free(gp);
        return NULL;
    }
    gp->g = kcuda_new(device, err, errlen);
    if (!gp->g) {
        free(gp);
        return NULL;
    }
    gp->memory = prm->memory != LLAMA_GPU_AUTO ? prm->memory
                 : kcuda_integrated(gp->g)   ? LLAMA_GPU_MAPPED
                                             : LLAMA_GPU_MIRROR;
    gp->graphs = prm->graphs;
    gp->fuse = !prm->unfused;
    kcuda_set_matmul_unroll(gp->g, prm->matmul_unroll);
    kcuda_set_matmul_kind(gp->g, prm->matmul_kind);
    gp->att_ask = prm->att_parts > 0 ? prm->att_parts : 0;
    if (prm->att_keys)
        kcuda_set_att_keys(gp->g, prm->att_keys);
    kcuda_set_att_tile(gp->g, prm->att_tile);
    kcuda_set_matmul_frag(gp->g, prm->matmul_frag);
    kcuda_set_matmul_groups(gp->g, prm->matmul_groups);
    kcuda_set_matmul_depth(gp->g, prm->matmul_depth);
    kcuda_set_matmul_early(gp->g, prm->matmul_early);
    /* what the tensor cores' depth rule asks of the runtime, asked before any step is captured */
    for (int l = 0; l < c->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        const kmat *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
            kcuda_matmul_prepare(gp->g, ws[i]->type);
    }
    kcuda_matmul_prepare(gp->g, m->lm_head.type);
    void *dev;
    if (kcuda_register(map_base, map_bytes, &dev, err, errlen))
        goto fail;
    gp->registered = true;
    gp->dev_base = dev;
    gp->layers = calloc((size_t)c->n_layers, sizeof *gp->layers);
    gp->wins = calloc((size_t)c->n_layers * 7 + 2, sizeof *gp->wins);
    if (!gp->layers || !gp->wins)
        goto oom;
    gp->limit = prm->memory_limit;
    char what[64];
    for (int l = 0; l < c->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        gpu_layer *G = &gp->layers[l];
        const kmat *src[7] = GPU_LAYER_MATS(L);
        kmat *dst[7] = GPU_LAYER_MATS(G);
        static const char *names[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                       "ffn_up", "ffn_down"};
        for (int k = 0; k < 7; k++) {
            snprintf(what, sizeof what, "blk.%d.%s", l, names[k]);
            if (gpu_win_add(gp, src[k], dst[k], gpu_layer_kind[k], what, err, errlen))
                goto fail;
        }
        G->qkv_alike = G->wq.type == G->wk.type && G->wq.type == G->wv.type;
        G->ffn_alike = G->w_gate.type == G->w_up.type;
        if (!(G->attn_norm = gpu_floats(gp, L->attn_norm, (size_t)c->dim, err, errlen)) ||
            !(G->ffn_norm = gpu_floats(gp, L->ffn_norm, (size_t)c->dim, err, errlen)))
            goto fail;
        /* the optional pieces: biases (qwen2, some llamas), per-head q/k norms (qwen3) */
        size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
        const float *vs[6] = {L->bq, L->bk, L->bv, L->bo, L->q_norm, L->k_norm};
        float **vd[6] = {&G->bq, &G->bk, &G->bv, &G->bo, &G->q_norm, &G->k_norm};
        size_t vn[6] = {qd, kvd, kvd, (size_t)c->dim, (size_t)c->head_dim, (size_t)c->head_dim};
        for (int k = 0; k < 6; k++)
            if (vs[k] && !(*vd[k] = gpu_floats(gp, vs[k], vn[k], err, errlen)))
                goto fail;
    }
    if (gpu_win_add(gp, &m->tok_embd, &gp->tok_embd, GW_ALL, "token_embd", err, errlen) ||
        (!m->tied && gpu_win_add(gp, &m->lm_head, &gp->lm_head, GW_LM_HEAD, "output", err,
                                 errlen)))
        goto fail;
    if (!(gp->out_norm = gpu_floats(gp, m->out_norm, (size_t)c->dim, err, errlen)))
        goto fail;
    size_t W = (size_t)x->p.max_width, qd = (size_t)c->n_heads * c->head_dim;
    size_t half = (size_t)(c->rot_dim / 2 > 0 ? c->rot_dim / 2 : 1);
    gp->xb = gpu_alloc(gp, W * (size_t)c->dim * 4);
    gp->attp = gpu_alloc(gp, W * qd * 4);
    gp->xs = gpu_alloc(gp, W * (qd > (size_t)c->ffn ? qd : (size_t)c->ffn) * 4);
    gpu_stage none;
    size_t heads = (size_t)c->n_heads, sb = gpu_stage_at(&none, NULL, W, heads, half);
    gp->stage_bytes = (sb + 4095) & ~(size_t)4095;
    gp->d_block = gpu_alloc(gp, gp->stage_bytes);
    gp->h_block = aligned_alloc(4096, gp->stage_bytes);
    if (!gp->xb || !gp->attp || !gp->xs || !gp->d_block || !gp->h_block)
        goto oom;
    /* the tensor-core matmul's inputs in fragment order (kcuda_set_matmul_frag) for the widest
     * step over the longest rows: made before any step is captured, counted with the buffers */
    if (prm->matmul_kind != KCUDA_MM_SIMT && kcuda_frag_rule(prm->matmul_frag, (int)W)) {
        size_t cols = qd > (size_t)c->ffn ? qd : (size_t)c->ffn; /* as gp->xs's rows */
        cols = cols > (size_t)c->dim ? cols : (size_t)c->dim;
        size_t fb = kcuda_frag_bytes((int)W, (int64_t)cols);
        if (kcuda_reserve(gp->g, fb, err, errlen))
            goto fail;
        gp->buf_bytes += fb;
    }
    memset(gp->h_block, 0, gp->stage_bytes);
    gpu_stage_at(&gp->h, gp->h_block, W, heads, half);
    gpu_stage_at(&gp->d, gp->d_block, W, heads, half);
    void *stage_dev;
    if (kcuda_register(gp->h_block, gp->stage_bytes, &stage_dev, err, errlen))
        goto fail;
    gp->stage_registered = true;
    const llama_shared *sh = &x->sh;
    gp->shb = (gpu_bufs){.x = gpu_dev(gp, sh->x),
                         .q = gpu_dev(gp, sh->q),
                         .att = gpu_dev(gp, sh->att),
                         .xb2 = gpu_dev(gp, sh->xb2),
                         .hg = gpu_dev(gp, sh->hg),
                         .hu = gpu_dev(gp, sh->hu),
                         .kk = gpu_dev(gp, sh->kk),
                         .vv = gpu_dev(gp, sh->vv),
                         .ap = gpu_dev(gp, sh->ap),
                         .mp = gpu_dev(gp, sh->mp),
                         .kv = gpu_dev(gp, sh->kv)};
    if (gp->memory == LLAMA_GPU_MIRROR) {
        if (gpu_mirror_new(gp, err, errlen))
            goto fail;
    } else {
        gp->dev = gp->shb;
    }
    /* the weights last, when the buffers' bytes are known (the limit counts both) */
    gp->weights = prm->weights != LLAMA_GPU_WEIGHTS_AUTO ? prm->weights
                  : kcuda_integrated(gp->g)              ? LLAMA_GPU_WEIGHTS_MAPPED
                                                         : LLAMA_GPU_WEIGHTS_DEVICE;
    if (gp->weights == LLAMA_GPU_WEIGHTS_MAPPED && gpu_win_map(gp, err, errlen)) {
        if (prm->weights == LLAMA_GPU_WEIGHTS_MAPPED)
            goto fail;
        fprintf(stderr, "GPU: weights in device memory: the model file could not be mapped for "
                        "the device (%s)\n", err);
        gp->weights = LLAMA_GPU_WEIGHTS_DEVICE;
    }
    if (gp->weights == LLAMA_GPU_WEIGHTS_MAPPED && gp->limit &&
        gp->buf_bytes + gp->win_bytes > gp->limit) {
        snprintf(err, errlen, "the GPU part needs %.1f MiB of device memory (buffers), over "
                              "--gpu-memory-limit %.1f MiB",
                 gpu_mib(gp->buf_bytes + gp->win_bytes), gpu_mib(gp->limit));
        goto fail;
    }
    if (gpu_win_fit(gp, err, errlen))
        goto fail;
    gp->placed = true;
    if (m->tied)
        gp->lm_head = gp->tok_embd;
    char weights[200], limit[64] = "";
    if (gp->limit)
        snprintf(limit, sizeof limit, "; %.1f MiB of %.1f MiB allowed", gpu_mib(gp->buf_bytes + gp->win_bytes),
                 gpu_mib(gp->limit));
    if (gp->weights == LLAMA_GPU_WEIGHTS_MAPPED)
        snprintf(weights, sizeof weights, "weights mapped in place%s", limit);
    else
        snprintf(weights, sizeof weights, "weights on the device (the part's rows, %.1f MiB%s)",
                 gpu_mib(gp->win_bytes), limit);
    char dev_name[160];
    kcuda_describe(gp->g, dev_name, sizeof dev_name);
    char parts[32] = "by length";
    if (gp->att_ask)
        snprintf(parts, sizeof parts, "%d", gp->att_ask);
    snprintf(gp->describe, sizeof gp->describe,
             "%s; %s, memory %s, graphs %s, launches %s, attention parts %s, tiles %s", dev_name,
             weights, llama_gpu_memory_name(gp->memory),
             !gp->graphs ? "off" : x->p.n_parts > 1 ? "on (not used: several parts)" : "on",
             gp->fuse ? "fused" : "one per op", parts,
             prm->att_tile == KCUDA_TILE_ON    ? "on"
             : prm->att_tile == KCUDA_TILE_OFF ? "off"
                                               : "by width and length");
    if (kcuda_sync(gp->g, err, errlen))
        goto fail;
    return gp;
oom:
    snprintf(err, errlen, "out of memory setting up the GPU forward");
fail:
    llama_gpu_destroy(&gp);
    return NULL;
}

void llama_gpu_destroy(llama_gpu **gpp)
{
    llama_gpu *gp = *gpp;
    if (!gp)
        return;
    if (gp->g) {
        char err[128];
        kcuda_sync(gp->g, err, sizeof err);
    }
    for (int i = 0; i < gp->n_rec; i++)
        kcuda_graph_destroy(&gp->rec[i].graph);
    free(gp->rec);
    for (int i = 0; i < gp->n_allocs; i++)
        kcuda_free(gp->allocs[i]);
    free(gp->allocs);
    kcuda_free(gp->mkv);
    for (int i = 0; i < gp->n_wins; i++)
        kcuda_free(gp->wins[i].block);
    free(gp->wins);
    if (gp->wmap_registered)
        kcuda_unregister((void *)gp->wmap_host);
    if (gp->registered)
        kcuda_unregister(gp->host_base);
    if (gp->stage_registered)
        kcuda_unregister(gp->h_block);
    kcuda_destroy(&gp->g);
    free(gp->layers);
    free(gp->h_block);
    free(gp->mir_len);
    free(gp->mir_stamp);
    free(gp->mir_epoch);
    free(gp->need_p);
    free(gp);
    *gpp = NULL;
}

const char *llama_gpu_describe(const llama_gpu *gp)
{
    return gp->describe;
}

void llama_gpu_graph_counts(const llama_gpu *gp, long *replayed, long *recorded)
{
    *replayed = gp->replayed;
    *recorded = gp->recorded;
}

long llama_gpu_launches(const llama_gpu *gp)
{
    return kcuda_launches(gp->g);
}

llama_gpu_how llama_gpu_last_step(const llama_gpu *gp)
{
    return gp->how;
}

size_t llama_gpu_need_bytes(const llama_gpu *gp)
{
    size_t kv = 0;
    if (gp->memory == LLAMA_GPU_MIRROR) {
        int m0, m1;
        gpu_mirror_range(gp->x, &m0, &m1);
        kv = gpu_mirror_bytes(gp, m0, m1);
    }
    size_t w = gp->weights == LLAMA_GPU_WEIGHTS_DEVICE ? llama_gpu_share_bytes(gp->x) : gp->win_bytes;
    return gp->buf_bytes - gp->kv_bytes + kv + w;
}

llama_gpu_memory_used llama_gpu_memory_use(const llama_gpu *gp)
{
    return (llama_gpu_memory_used){gp->win_bytes, gp->kv_bytes, gp->win_bytes + gp->buf_bytes,
                                   gp->rewindowed};
}

/* The attention arguments of layer l (the step's K/V blocks of that layer). */
static kcuda_att gpu_att_of(const llama_gpu *gp, int l)
{
    const llama_ctx *x = gp->x;
    const llama_config *c = &x->m->cfg;
    return (kcuda_att){.type = x->p.kv,
                       .k = gp->dev.kv ? gpu_kv(gp, true, l, 0) : NULL,
                       .v = gp->dev.kv ? gpu_kv(gp, true, l, 1) : NULL,
                       .head_rows = x->tree_row + x->p.max_width,
                       .tree_row = x->tree_row,
                       .head_dim = c->head_dim,
                       .n_heads = c->n_heads,
                       .n_kv_heads = c->n_kv_heads,
                       .scale = 1.0f / sqrtf((float)c->head_dim),
                       .seq_row = gp->d.seq_row,
                       .n_prefix = gp->d.n_prefix,
                       .anc = gp->d.anc,
                       .n_anc = gp->d.n_anc,
                       .anc_stride = x->p.max_width,
                       .max_keys = gp->att_keys,
                       .parts = gp->att_ask};
}

/* Drain the stream, then meet the other parts. */
static int gpu_sync(llama_gpu *gp, char *err, size_t errlen)
{
    if (kcuda_sync(gp->g, err, errlen))
        return -1;
    return llama_part_sync(gp->x, err, errlen);
}

/* Mirror mode beside other parts: the columns parts exchange cross between the device buffers
 * and the shared block. */
static bool gpu_exchanges(const llama_gpu *gp)
{
    return gp->memory == LLAMA_GPU_MIRROR && gp->x->p.n_parts > 1;
}

/* Columns [c0, c1) of n rows (ld floats apart) from one side to the other. */
static int gpu_cols(llama_gpu *gp, float *dst, const float *src, int n, int64_t ld, int64_t c0,
                    int64_t c1, char *err, size_t errlen)
{
    if (c1 <= c0)
        return 0;
    return kcuda_copy2d(gp->g, dst + c0, (size_t)ld * 4, src + c0, (size_t)ld * 4,
                        (size_t)(c1 - c0) * 4, (size_t)n, err, errlen);
}

/* A synchronisation point after which the other parts read this part's columns [c0, c1) of a
 * buffer (dev; sh its twin in the shared block) and this part reads theirs. */
static int gpu_meet(llama_gpu *gp, float *dev, float *sh, int n, int64_t ld, int64_t c0,
                    int64_t c1, char *err, size_t errlen)
{
    if (gp->x->p.n_parts <= 1)
        return 0;
    bool ex = gpu_exchanges(gp);
    if (ex && gpu_cols(gp, sh, dev, n, ld, c0, c1, err, errlen))
        return -1;
    if (gpu_sync(gp, err, errlen))
        return -1;
    return ex ? gpu_cols(gp, dev, sh, n, ld, 0, c0, err, errlen) ||
                    gpu_cols(gp, dev, sh, n, ld, c1, ld, err, errlen)
              : 0;
}

/* Rows [r, r + count) of the KV heads `want` marks, from the shared block to the mirror: layer l
 * (K and V), or every layer when l < 0. One copy per run of consecutive heads. */
static void gpu_mirror_rows(llama_gpu *gp, const uint8_t *want, int l, int64_t r, int count)
{
    const llama_ctx *x = gp->x;
    const llama_config *c = &x->m->cfg;
    size_t lkv = x->sh.layer_kv_bytes, pitch = gp->kv_pitch;
    int first = l < 0 ? 0 : l, depth = l < 0 ? 2 * c->n_layers : 2;
    for (int h = 0; h < c->n_kv_heads;) {
        if (!want[h]) {
            h++;
            continue;
        }
        int h1 = h;
        while (h1 < c->n_kv_heads && want[h1])
            h1++;
        size_t off = llama_kv_offset(x, h, r); /* within a layer's block, either side */
        kcuda_copy3d_pz(gp->g, gpu_kv(gp, true, first, 0) + off, gp->mlkv,
                        gpu_kv(gp, false, first, 0) + off, lkv,
                        (size_t)count * (size_t)c->head_dim * x->kv_elem, (size_t)(h1 - h), pitch,
                        (size_t)depth);
        h = h1;
    }
}

/* Mirror: which KV heads this part's attention reads (prefix, tree) under the current partition;
 * when the prefix set changed, every slot's rows are copied again from row 0. */
static void gpu_mirror_needs(llama_gpu *gp)
{
    llama_ctx *x = gp->x;
    int nkv = x->m->cfg.n_kv_heads;
    memset(gp->need_p, 0, (size_t)nkv * 2);
    for (int u = 0; u < x->n_units; u++) {
        const struct att_unit *un = &x->units[u];
        gp->need_p[un->kvh] |= un->mode != ATT_SPARSE;
        gp->need_t[un->kvh] |= un->mode != ATT_DENSE;
    }
    if (memcmp(gp->need_p, gp->prev_need_p, (size_t)nkv)) {
        memset(gp->mir_len, 0, (size_t)x->p.n_seq * sizeof *gp->mir_len);
        memcpy(gp->prev_need_p, gp->need_p, (size_t)nkv);
    }
}

/* Mirror: the committed rows of the batch's slots that the device copy lacks, copied from the
 * shared block. A slot whose epoch moved, or whose length fell, is copied again from row 0. */
static void gpu_mirror_prefix(llama_gpu *gp, int n)
{
    llama_ctx *x = gp->x;
    gp->steps++;
    for (int i = 0; i < n; i++) {
        int seq = x->seq[x->batch_base + i];
        if (gp->mir_stamp[seq] == (int)gp->steps)
            continue;
        gp->mir_stamp[seq] = (int)gp->steps;
        uint32_t e = __atomic_load_n(&x->sh.epoch[seq], __ATOMIC_ACQUIRE);
        int have = x->prefix[seq];
        if (e != gp->mir_epoch[seq] || have < gp->mir_len[seq]) {
            gp->mir_epoch[seq] = e;
            gp->mir_len[seq] = 0;
        }
        if (have > gp->mir_len[seq])
            gpu_mirror_rows(gp, gp->need_p, -1, (int64_t)seq * x->p.n_ctx + gp->mir_len[seq],
                            have - gp->mir_len[seq]);
        gp->mir_len[seq] = have;
    }
}

/* The part's K/V rows of the batch (kk or vv, n tokens) into the tree area of the layer block at
 * kvl (the shared block's, or the mirror's), in the cache's type. */
static void gpu_kv_store(llama_gpu *gp, uint8_t *kvl, const float *rows, int n)
{
    llama_ctx *x = gp->x;
    kcuda_kv_store(gp->g, x->p.kv, kvl, x->tree_row + x->p.max_width, x->tree_row + x->batch_base,
                   rows, x->kv_row, x->kvh0, x->kvh1, x->m->cfg.head_dim, n);
}

/* Attention's synchronisation point. Mirror beside others: this part's outputs go out (whole
 * heads' columns of att, split heads' records of ap), and after it the others' come in. */
static int gpu_meet_attention(llama_gpu *gp, int n, char *err, size_t errlen)
{
    llama_ctx *x = gp->x;
    const llama_config *c = &x->m->cfg;
    if (x->p.n_parts <= 1)
        return 0;
    bool ex = gpu_exchanges(gp);
    int64_t hd = c->head_dim, qd = (int64_t)c->n_heads * hd, rec = hd + 2;
    int64_t rec_tok = (int64_t)c->n_heads * 2 * rec;
    for (int u = 0; ex && u < x->n_units; u++) {
        const struct att_unit *un = &x->units[u];
        if (un->mode == ATT_FULL) {
            if (gpu_cols(gp, gp->shb.att, gp->dev.att, n, qd, un->h0 * hd, (un->h0 + un->nh) * hd,
                         err, errlen))
                return -1;
        } else {
            int64_t off = (int64_t)un->h0 * 2 * rec + (un->mode == ATT_SPARSE ? rec : 0);
            kcuda_copy3d(gp->g, gp->shb.ap + off, gp->dev.ap + off, (size_t)rec * 4,
                         (size_t)un->nh, (size_t)(2 * rec) * 4, (size_t)n, (size_t)rec_tok * 4);
        }
    }
    if (gpu_sync(gp, err, errlen))
        return -1;
    if (!ex)
        return 0;
    /* the whole of both: this part's own columns come back as it sent them */
    if (gpu_cols(gp, gp->dev.att, gp->shb.att, n, qd, 0, qd, err, errlen))
        return -1;
    return x->n_split ? gpu_cols(gp, gp->dev.ap, gp->shb.ap, n, rec_tok, 0, rec_tok, err, errlen)
                      : 0;
}

/* Megatron (llama.c's megatron_linear): this part's partial sum of a linear over its input
 * columns (ranges[part] * scale ..) of `in` (n rows of ld), into its slot of the partial buffer;
 * after the parts meet, every part's partial added into x's columns [r0, r1) (parts in order, as
 * the CPU adds them), and the parts meet again. */
static int gpu_megatron(llama_gpu *gp, const kmat *w, const float *bias, const float *in,
                        int64_t ld, int n, const int64_t *ranges, int64_t scale, int64_t r0,
                        int64_t r1, char *err, size_t errlen)
{
    llama_ctx *x = gp->x;
    const gpu_bufs *D = &gp->dev, *S = &gp->shb;
    int64_t dim = x->m->cfg.dim;
    size_t slot = (size_t)x->p.max_width * (size_t)dim;
    int me = x->p.part, parts = x->p.n_parts;
    int64_t c0 = ranges[me] * scale, c1 = ranges[me + 1] * scale;
    bool ex = gpu_exchanges(gp);
    if (c1 > c0) {
        if (kcuda_copy2d(gp->g, gp->xs, (size_t)(c1 - c0) * 4, in + c0, (size_t)ld * 4,
                         (size_t)(c1 - c0) * 4, (size_t)n, err, errlen) ||
            kcuda_matmul_cols(gp->g, w, 0, dim, c0, c1, gp->xs, n, D->mp + (size_t)me * slot, dim,
                              err, errlen) ||
            (ex && gpu_cols(gp, S->mp + (size_t)me * slot, D->mp + (size_t)me * slot, n, dim, 0,
                            dim, err, errlen)))
            return -1;
    }
    if (parts > 1 && gpu_sync(gp, err, errlen))
        return -1;
    for (int p = 0; p < parts; p++) {
        if (ranges[p + 1] <= ranges[p])
            continue; /* a part with no input columns has no partial */
        if (ex && p != me &&
            gpu_cols(gp, D->mp + (size_t)p * slot, S->mp + (size_t)p * slot, n, dim, r0, r1, err,
                     errlen))
            return -1;
        kcuda_add_cols(gp->g, D->x, D->mp + (size_t)p * slot, n, dim, r0, r1);
    }
    if (bias) /* the output bias once, after the parts' sums (as the CPU) */
        kcuda_add_bias(gp->g, D->x, bias, n, dim, r0, r1);
    return gpu_meet(gp, D->x, S->x, n, dim, r0, r1, err, errlen);
}

/* A layer's q, k and v rows of the part, RoPE, and its K/V rows into the tree area of layer l's
 * blocks (gpu_kv) — the shared block's, which commits move, and a mirror's own.
 * Fused: one matmul launch and one RoPE-and-store launch. */
static int gpu_qkv(llama_gpu *gp, const gpu_layer *L, int n, int l, const llama_part_cols *pc,
                   char *err, size_t errlen)
{
    llama_ctx *x = gp->x;
    kcuda *g = gp->g;
    const llama_config *c = &x->m->cfg;
    const gpu_bufs *D = &gp->dev;
    bool mirror = gp->memory == LLAMA_GPU_MIRROR;
    int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = x->kv_row, hd = c->head_dim;
    int half = c->rot_dim / 2, qh = (int)((pc->q1 - pc->q0) / hd);
    /* biases, q/k norms or NEOX RoPE: the RoPE-and-store launch applies them (fused or not) */
    bool extras = L->bq || L->bk || L->bv || L->q_norm || c->rope_neox;
    if (!gp->fuse || !L->qkv_alike) {
        if (kcuda_matmul(g, &L->wq, pc->q0, pc->q1, gp->xb, n, D->q, qd, err, errlen) ||
            kcuda_matmul(g, &L->wk, pc->k0, pc->k1, gp->xb, n, D->kk, kvd, err, errlen) ||
            kcuda_matmul(g, &L->wv, pc->k0, pc->k1, gp->xb, n, D->vv, kvd, err, errlen))
            return -1;
    } else {
        kcuda_mm mm[3] = {{&L->wq, pc->q0, pc->q1, D->q, qd},
                          {&L->wk, pc->k0, pc->k1, D->kk, kvd},
                          {&L->wv, pc->k0, pc->k1, D->vv, kvd}};
        if (kcuda_matmul_multi(g, mm, 3, gp->xb, n, err, errlen))
            return -1;
    }
    if (!gp->fuse && !extras) {
        kcuda_rope(g, D->q + pc->q0, n, qd, qh, (int)hd, half, gp->d.cs, gp->d.sn);
        kcuda_rope(g, D->kk + pc->k0, n, kvd, x->kvh1 - x->kvh0, (int)hd, half, gp->d.cs,
                   gp->d.sn);
        gpu_kv_store(gp, gpu_kv(gp, false, l, 0), D->kk, n);
        gpu_kv_store(gp, gpu_kv(gp, false, l, 1), D->vv, n);
        if (mirror) {
            gpu_kv_store(gp, gpu_kv(gp, true, l, 0), D->kk, n);
            gpu_kv_store(gp, gpu_kv(gp, true, l, 1), D->vv, n);
        }
        return 0;
    }
    kcuda_rope_kv a = {.q = D->q + pc->q0,
                       .q_stride = qd,
                       .q_heads = qh,
                       .k = D->kk,
                       .v = D->vv,
                       .kv_stride = kvd,
                       .kv_h0 = x->kvh0,
                       .kv_h1 = x->kvh1,
                       .head_dim = (int)hd,
                       .half = half,
                       .cs = gp->d.cs,
                       .sn = gp->d.sn,
                       .type = x->p.kv,
                       .head_rows = x->tree_row + x->p.max_width,
                       .r0 = x->tree_row + x->batch_base,
                       .k_dst = {gpu_kv(gp, false, l, 0), gpu_kv(gp, true, l, 0)},
                       .v_dst = {gpu_kv(gp, false, l, 1), gpu_kv(gp, true, l, 1)},
                       .n_dst = mirror ? 2 : 1,
                       .neox = c->rope_neox,
                       .bq = L->bq ? L->bq + pc->q0 : NULL,
                       .bk = L->bk,
                       .bv = L->bv,
                       .q_norm = L->q_norm,
                       .k_norm = L->k_norm,
                       .eps = c->norm_eps};
    kcuda_rope_store(g, &a, n);
    return 0;
}

/* x's rows [r0, r1) += W . in (+ bias) (the output projection or down, and the residual): one
 * launch fused, else (or with a bias, added to the product first, as the CPU adds it) the product
 * into xb2 and an add. */
static int gpu_residual(llama_gpu *gp, const kmat *w, const float *bias, int64_t r0, int64_t r1,
                        const float *in, int n, char *err, size_t errlen)
{
    const gpu_bufs *D = &gp->dev;
    int64_t dim = gp->x->m->cfg.dim;
    if (gp->fuse && !bias)
        return kcuda_matmul_add(gp->g, w, r0, r1, in, n, D->x, dim, err, errlen);
    if (kcuda_matmul(gp->g, w, r0, r1, in, n, D->xb2, dim, err, errlen))
        return -1;
    if (bias)
        kcuda_add_bias(gp->g, D->xb2, bias, n, dim, r0, r1);
    kcuda_add_cols(gp->g, D->x, D->xb2, n, dim, r0, r1);
    return 0;
}

/* Queue one step (after the batch's arrays are on the device): every layer, then the logits of
 * rows [from, n) into `logits` (a device address of the mapped block, or NULL). A sole part
 * queues it without waiting anywhere, so that it can be recorded as a graph. */
static int gpu_step(llama_gpu *gp, int n, int from, float *logits, char *err, size_t errlen)
{
    llama_ctx *x = gp->x;
    kcuda *g = gp->g;
    const llama_config *c = &x->m->cfg;
    const gpu_bufs *D = &gp->dev, *S = &gp->shb;
    bool mirror = gp->memory == LLAMA_GPU_MIRROR;
    int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim, hd = c->head_dim, ffn = c->ffn;
    llama_part_cols pc;
    llama_part_cols_of(x, &pc);
    int64_t d0 = pc.d0, d1 = pc.d1, e0 = pc.e0, e1 = pc.e1, f0 = pc.f0, f1 = pc.f1;
    int64_t q0 = pc.q0, q1 = pc.q1, v0 = pc.v0, v1 = pc.v1;
    int64_t rec = hd + 2, rec_tok = (int64_t)c->n_heads * 2 * rec;
    /* the tree rows of heads another part projects, which a mirror reads after they are stored */
    uint8_t foreign[LLAMA_MAX_KV_HEADS_GPU];
    bool any_foreign = false;
    for (int h = 0; h < c->n_kv_heads; h++) { /* at most LLAMA_MAX_KV_HEADS_GPU (llama_gpu_new) */
        foreign[h] = mirror && gp->need_t[h] && (h < x->kvh0 || h >= x->kvh1);
        any_foreign |= foreign[h];
    }

    if (kcuda_embed(g, &gp->tok_embd, gp->d.tokens, n, D->x + d0, dim, d0, d1, err, errlen) ||
        gpu_meet(gp, D->x, S->x, n, dim, d0, d1, err, errlen))
        return -1;
    /* beside other parts, their commits of the last step (each part moves its own heads' rows)
     * are done once all have met here */
    if (mirror && x->p.n_parts > 1)
        gpu_mirror_prefix(gp, n);
    for (int l = 0; l < c->n_layers; l++) {
        const gpu_layer *L = &gp->layers[l];
        kcuda_rmsnorm(g, gp->xb, D->x, L->attn_norm, (int)dim, n, c->norm_eps);
        if (gpu_qkv(gp, L, n, l, &pc, err, errlen))
            return -1;
        if (x->att_sync && gpu_meet(gp, D->q, S->q, n, qd, q0, q1, err, errlen))
            return -1;
        if (any_foreign)
            gpu_mirror_rows(gp, foreign, l, x->tree_row + x->batch_base, n);
        kcuda_att a = gpu_att_of(gp, l);
        /* one launch per run of units of one mode over consecutive query heads */
        for (int u = 0, u1; u < x->n_units; u = u1) {
            const struct att_unit *un = &x->units[u];
            int h1 = un->h0 + un->nh;
            for (u1 = u + 1; u1 < x->n_units && x->units[u1].mode == un->mode &&
                             x->units[u1].h0 == h1;
                 u1++)
                h1 += x->units[u1].nh;
            int rc = un->mode == ATT_FULL
                         ? kcuda_attention(g, &a, KCUDA_ATT_FULL, D->q, qd, n, un->h0, h1, D->att,
                                           qd, 0, err, errlen)
                         : kcuda_attention(g, &a,
                                           un->mode == ATT_DENSE ? KCUDA_ATT_DENSE
                                                                 : KCUDA_ATT_SPARSE,
                                           D->q, qd, n, un->h0, h1,
                                           D->ap + (un->mode == ATT_SPARSE ? rec : 0), rec_tok,
                                           2 * rec, err, errlen);
            if (rc)
                return -1;
        }
        if (x->megatron) {
            if (gpu_megatron(gp, &L->wo, L->bo, D->att, qd, n, x->bnd[LP_QKV], hd, d0, d1, err,
                             errlen))
                return -1;
        } else {
            if (gpu_meet_attention(gp, n, err, errlen))
                return -1;
            const float *att_in = D->att;
            if (x->n_split) {
                if (kcuda_copy2d(g, gp->attp, (size_t)qd * 4, D->att, (size_t)qd * 4,
                                 (size_t)qd * 4, (size_t)n, err, errlen))
                    return -1;
                kcuda_att_merge(g, D->ap, D->ap + rec, rec_tok, 2 * rec, gp->d.split, x->n_split, n,
                                (int)hd, gp->attp, qd);
                att_in = gp->attp;
            }
            if (gpu_residual(gp, &L->wo, L->bo, d0, d1, att_in, n, err, errlen) ||
                gpu_meet(gp, D->x, S->x, n, dim, d0, d1, err, errlen))
                return -1;
        }
        kcuda_rmsnorm(g, gp->xb, D->x, L->ffn_norm, (int)dim, n, c->norm_eps);
        if (gp->fuse && L->ffn_alike) {
            if (kcuda_matmul_silu(g, &L->w_gate, &L->w_up, f0, f1, gp->xb, n, D->hg, ffn, err,
                                  errlen))
                return -1;
        } else {
            if (kcuda_matmul(g, &L->w_gate, f0, f1, gp->xb, n, D->hg, ffn, err, errlen) ||
                kcuda_matmul(g, &L->w_up, f0, f1, gp->xb, n, D->hu, ffn, err, errlen))
                return -1;
            kcuda_silu_mul(g, D->hg + f0, D->hu + f0, n, ffn, f1 - f0);
        }
        if (x->megatron) { /* its own gate/up columns are its input columns of down */
            if (gpu_megatron(gp, &L->w_down, NULL, D->hg, ffn, n, x->bnd[LP_FFN_UP], 1, e0, e1,
                             err, errlen))
                return -1;
            continue;
        }
        if (gpu_meet(gp, D->hg, S->hg, n, ffn, f0, f1, err, errlen))
            return -1;
        if (gpu_residual(gp, &L->w_down, NULL, e0, e1, D->hg, n, err, errlen) ||
            gpu_meet(gp, D->x, S->x, n, dim, e0, e1, err, errlen))
            return -1;
    }
    /* the hidden states stay readable in the shared block (a Medusa head reads them there);
     * beside other parts the last meeting already put them there */
    if (mirror && x->p.n_parts <= 1 && gpu_cols(gp, S->x, D->x, n, dim, 0, dim, err, errlen))
        return -1;
    if (logits && from < n) {
        kcuda_rmsnorm(g, gp->xb, D->x + (int64_t)from * dim, gp->out_norm, (int)dim, n - from,
                      c->norm_eps);
        /* a mirror computes its logits columns in device memory and sends them in one copy */
        float *y = mirror ? D->logits : logits;
        if (kcuda_matmul(g, &gp->lm_head, v0, v1, gp->xb, n - from, y, c->vocab, err, errlen) ||
            (mirror && gpu_cols(gp, logits, y, n - from, c->vocab, v0, v1, err, errlen)))
            return -1;
    }
    return 0;
}

static void gpu_graphs_drop(llama_gpu *gp)
{
    for (int i = 0; i < gp->n_rec; i++)
        kcuda_graph_destroy(&gp->rec[i].graph);
    gp->n_rec = 0;
}

/* The recording of this step's shape, recorded now if there is none; NULL when graphs cannot be
 * used (they are then turned off for good, saying why on stderr) — the caller runs the step. */
static kcuda_graph *gpu_graph_for(llama_gpu *gp, int n, int from, float *logits)
{
    llama_ctx *x = gp->x;
    if (memcmp(gp->rec_bnd, x->bnd, sizeof gp->rec_bnd)) { /* a new partition */
        gpu_graphs_drop(gp);
        memcpy(gp->rec_bnd, x->bnd, sizeof gp->rec_bnd);
    }
    for (int i = 0; i < gp->n_rec; i++) {
        gpu_graph *r = &gp->rec[i];
        if (r->n == n && r->from == from && r->base == x->batch_base && r->logits == logits &&
            r->att_parts == gp->how.att_parts && r->att_tiles == gp->how.att_tiles)
            return r->graph;
    }
    if (!gp->rec && !(gp->rec = calloc(GPU_MAX_GRAPHS, sizeof *gp->rec)))
        return NULL;
    if (gp->n_rec == GPU_MAX_GRAPHS)
        gpu_graphs_drop(gp);
    char err[400], err2[400];
    if (kcuda_capture_begin(gp->g, err, sizeof err)) {
        fprintf(stderr, "GPU: graphs off: %s\n", err);
        gp->graphs = false;
        return NULL;
    }
    int rc = gpu_step(gp, n, from, logits, err, sizeof err);
    kcuda_graph *kg = kcuda_capture_end(gp->g, err2, sizeof err2);
    if (rc || !kg) {
        fprintf(stderr, "GPU: graphs off: recording a step of %d tokens failed: %s\n", n,
                rc ? err : err2);
        kcuda_graph_destroy(&kg);
        gpu_graphs_drop(gp);
        gp->graphs = false;
        return NULL;
    }
    gp->rec[gp->n_rec++] =
        (gpu_graph){n, from, x->batch_base, gp->how.att_parts, gp->how.att_tiles, logits, kg};
    gp->recorded++;
    return kg;
}

int llama_gpu_forward(llama_gpu *gp, const llama_batch *b, float *logits, char *err,
                      size_t errlen)
{
    llama_ctx *x = gp->x;
    kcuda *g = gp->g;
    const llama_config *c = &x->m->cfg;
    int n = b->n, W = x->p.max_width;
    if (llama_batch_prepare(x, b, err, errlen) || gpu_win_fit(gp, err, errlen))
        return -1;
    int from = b->logits_from < 0 ? 0 : b->logits_from;
    if (logits && from < n && !gpu_in_map(gp, logits, (size_t)(n - from) * (size_t)c->vocab * 4)) {
        snprintf(err, errlen, "the logits lie outside the GPU's mapped memory");
        return -1;
    }
    int half = c->rot_dim / 2;

    /* the step's small arrays: RoPE angles, and what attention needs per token; the last step's
     * copy of the block is done (it ended with a sync) */
    const gpu_stage *h = &gp->h;
    memcpy(h->tokens, b->tokens, (size_t)n * sizeof *h->tokens);
    gp->att_keys = 0;
    for (int i = 0; i < n; i++) {
        int slot = x->batch_base + i, seq = x->seq[slot];
        llama_rope_angles(x, x->pos[slot], h->cs + (size_t)i * half, h->sn + (size_t)i * half);
        h->seq_row[i] = seq * x->p.n_ctx;
        h->n_prefix[i] = x->prefix[seq];
        h->n_anc[i] = x->n_anc[slot];
        memcpy(h->anc + (size_t)i * W, x->anc + (size_t)slot * W,
               (size_t)x->n_anc[slot] * sizeof *h->anc);
        if (h->n_prefix[i] + h->n_anc[i] > gp->att_keys)
            gp->att_keys = h->n_prefix[i] + h->n_anc[i];
    }
    kcuda_att a = gpu_att_of(gp, 0);
    const llama_layer *l0 = &x->m->layers[0];
    uint32_t wq = l0->wq.type;
    int64_t qkv_rows = l0->wq.rows + l0->wk.rows + l0->wv.rows;
    gp->how = (llama_gpu_how){kcuda_att_parts(g, &a, n),
                              kcuda_att_tiles(g, &a, n) != 0,
                              kcuda_matmul_unroll(g, n),
                              kcuda_matmul_kind(g, wq) == KCUDA_MM_TC,
                              kcuda_matmul_frag(g, wq, n) != 0,
                              kcuda_matmul_groups(g, wq, n),
                              kcuda_matmul_depth(g, wq, qkv_rows, n)};
    if (x->n_split)
        memcpy(h->split, x->split_heads, (size_t)x->n_split * sizeof *h->split);
    /* up to the last ancestor list this step uses (the arrays before it are whole) */
    size_t used = (size_t)((uint8_t *)(h->anc + (size_t)n * W) - gp->h_block);
    if (kcuda_upload(g, gp->d_block, gp->h_block, used, err, errlen))
        return -1;
    if (gp->memory == LLAMA_GPU_MIRROR) {
        if (gpu_mirror_fit(gp, err, errlen)) /* calls gpu_mirror_needs */
            return -1;
        if (x->p.n_parts <= 1)
            gpu_mirror_prefix(gp, n);
    }
    float *dlog = logits ? gpu_dev(gp, logits) : NULL;
    long recorded = gp->recorded;
    kcuda_graph *kg = gp->graphs && x->p.n_parts <= 1 ? gpu_graph_for(gp, n, from, dlog) : NULL;
    if (kg) {
        if (kcuda_graph_launch(g, kg, err, errlen))
            return -1;
        gp->replayed += gp->recorded == recorded; /* not the launch that follows a recording */
    } else if (gpu_step(gp, n, from, dlog, err, errlen)) {
        return -1;
    }
    return kcuda_sync(g, err, errlen);
}
