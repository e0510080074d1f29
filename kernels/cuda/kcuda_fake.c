/*
 * kernels/cuda/kcuda_fake.c — the GPU op set's interface (kcuda.h) carried out on the CPU, so that
 * what runs around the kernels — model/llama_cuda.c's memory modes, its exchanges at the
 * synchronisation points, the K/V mirror and its epochs, the Megatron partial sums, the graph
 * recordings and their keys — is checked on machines without a GPU (ctest unit_gpu_host: the GPU
 * forward test linked against this file).
 *
 * Each op is done by its CPU twin (kernels/cpu: kmat_mul, k_rmsnorm, katt_dense/katt_sparse, ...);
 * "device memory" is host memory, filled with 0xff bytes (NaN as floats) when allocated so that a
 * read of memory nothing wrote shows in the logits; copies are memcpy. Ops run when they are
 * queued, except while a capture is open: then they are recorded, and kcuda_graph_launch runs the
 * recording again with the arguments it was recorded with, as a CUDA graph does. What this cannot
 * check is the kernels' own arithmetic and anything that depends on the stream running behind
 * the host (test_cuda_kernels and test_cuda_forward on a GPU do).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kcuda.h"
#include "kernels/cuda/kcuda_check.h"

#define FAKE_ARGS 512 /* bytes of the largest op's arguments */

typedef struct {
    void (*run)(const void *args);
    _Alignas(16) unsigned char args[FAKE_ARGS];
} fake_op;

struct kcuda {
    int capturing;
    fake_op *rec;
    int n_rec, cap_rec;
    int failed; /* an op could not be recorded */
    long launches; /* ops queued (kcuda_launches) */
    int att_tile;  /* kcuda_set_att_tile's setting: the stand-in decides as a device would */
    int mm_kind;   /* kcuda_set_matmul_kind's, reported as a device would */
    int frag;      /* kcuda_set_matmul_frag's: the launches counted as a device counts them */
    int groups;    /* kcuda_set_matmul_groups', reported as a device would */
};

/* The launch a device queues before a tensor-core matmul whose inputs go into fragment order
 * (kcuda_matmul_frag): counted, with nothing to do (the CPU twins read the f32 rows). */
static void fake_frag(kcuda *g, uint32_t type, int n)
{
    g->launches += kcuda_matmul_frag(g, type, n);
}

struct kcuda_graph {
    fake_op *ops;
    int n;
};

/* Run the op now, or record it while a capture is open. */
static void fake_queue(kcuda *g, void (*run)(const void *), const void *args, size_t bytes)
{
    g->launches++;
    if (!g->capturing) {
        run(args);
        return;
    }
    if (g->n_rec == g->cap_rec) {
        int cap = g->cap_rec ? 2 * g->cap_rec : 256;
        fake_op *r = realloc(g->rec, (size_t)cap * sizeof *r);
        if (!r) {
            g->failed = 1;
            return;
        }
        g->rec = r;
        g->cap_rec = cap;
    }
    fake_op *op = &g->rec[g->n_rec++];
    op->run = run;
    memcpy(op->args, args, bytes);
}

#define FAKE_QUEUE(g, fn, a)                                                                       \
    do {                                                                                           \
        _Static_assert(sizeof(a) <= FAKE_ARGS, "op arguments too large");                          \
        fake_queue(g, fn, &(a), sizeof(a));                                                        \
    } while (0)

int kcuda_devices(char *why, size_t whylen)
{
    if (whylen)
        why[0] = '\0';
    return 1;
}

kcuda *kcuda_new(int device, char *err, size_t errlen)
{
    (void)device;
    kcuda *g = calloc(1, sizeof *g);
    if (!g)
        snprintf(err, errlen, "out of memory");
    return g;
}

void kcuda_destroy(kcuda **gp)
{
    if (!*gp)
        return;
    free((*gp)->rec);
    free(*gp);
    *gp = NULL;
}

void kcuda_describe(const kcuda *g, char *out, size_t len)
{
    (void)g;
    snprintf(out, len, "the CPU standing in for a GPU (kernels/cuda/kcuda_fake.c)");
}

int kcuda_integrated(const kcuda *g)
{
    (void)g;
    return 0;
}

int kcuda_sync(kcuda *g, char *err, size_t errlen)
{
    (void)g;
    (void)err;
    (void)errlen;
    return 0;
}

void *kcuda_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p)
        memset(p, 0xff, bytes); /* NaN floats: what nothing wrote shows */
    return p;
}

void kcuda_free(void *p)
{
    free(p);
}

typedef struct {
    void *dst;
    const void *src;
    size_t dpitch, spitch, width, rows;
} copy2d_args;

static void copy2d_run(const void *p)
{
    const copy2d_args *a = p;
    for (size_t r = 0; r < a->rows; r++)
        memmove((char *)a->dst + r * a->dpitch, (const char *)a->src + r * a->spitch, a->width);
}

int kcuda_copy2d(kcuda *g, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                 size_t rows, char *err, size_t errlen)
{
    if (width > dpitch || width > spitch) {
        snprintf(err, errlen, "2-D copy: width %zu over a pitch (%zu, %zu)", width, dpitch, spitch);
        return -1;
    }
    copy2d_args a = {dst, src, dpitch, spitch, width, rows};
    FAKE_QUEUE(g, copy2d_run, a);
    return 0;
}

int kcuda_upload(kcuda *g, void *dst, const void *src, size_t bytes, char *err, size_t errlen)
{
    return kcuda_copy2d(g, dst, bytes, src, bytes, bytes, 1, err, errlen);
}

int kcuda_download(kcuda *g, void *dst, const void *src, size_t bytes, char *err, size_t errlen)
{
    return kcuda_copy2d(g, dst, bytes, src, bytes, bytes, 1, err, errlen);
}

int kcuda_register(void *host, size_t bytes, void **dev, char *err, size_t errlen)
{
    (void)bytes;
    (void)err;
    (void)errlen;
    *dev = host;
    return 0;
}

int kcuda_register_ro(const void *host, size_t bytes, void **dev, char *err, size_t errlen)
{
    return kcuda_register((void *)host, bytes, dev, err, errlen);
}

void kcuda_unregister(void *host)
{
    (void)host;
}

typedef struct {
    void *dst;
    const void *src;
    size_t width, height, pitch_y, depth, dst_pitch_z, src_pitch_z;
} copy3d_args;

static void copy3d_run(const void *p)
{
    const copy3d_args *a = p;
    for (size_t z = 0; z < a->depth; z++)
        for (size_t y = 0; y < a->height; y++)
            memmove((char *)a->dst + z * a->dst_pitch_z + y * a->pitch_y,
                    (const char *)a->src + z * a->src_pitch_z + y * a->pitch_y, a->width);
}

void kcuda_copy3d_pz(kcuda *g, void *dst, size_t dst_pitch_z, const void *src, size_t src_pitch_z,
                     size_t width, size_t height, size_t pitch_y, size_t depth)
{
    copy3d_args a = {dst, src, width, height, pitch_y, depth, dst_pitch_z, src_pitch_z};
    FAKE_QUEUE(g, copy3d_run, a);
}

void kcuda_copy3d(kcuda *g, void *dst, const void *src, size_t width, size_t height,
                  size_t pitch_y, size_t depth, size_t pitch_z)
{
    kcuda_copy3d_pz(g, dst, pitch_z, src, pitch_z, width, height, pitch_y, depth);
}

int kcuda_reserve(kcuda *g, size_t bytes, char *err, size_t errlen)
{
    (void)g;
    (void)bytes;
    (void)err;
    (void)errlen;
    return 0;
}

int kcuda_capture_begin(kcuda *g, char *err, size_t errlen)
{
    if (g->capturing) {
        snprintf(err, errlen, "a capture is already open");
        return -1;
    }
    g->capturing = 1;
    g->n_rec = 0;
    g->failed = 0;
    return 0;
}

kcuda_graph *kcuda_capture_end(kcuda *g, char *err, size_t errlen)
{
    g->capturing = 0;
    kcuda_graph *kg = g->failed ? NULL : calloc(1, sizeof *kg);
    if (kg && g->n_rec && !(kg->ops = malloc((size_t)g->n_rec * sizeof *kg->ops))) {
        free(kg);
        kg = NULL;
    }
    if (!kg) {
        snprintf(err, errlen, "out of memory recording a graph");
        return NULL;
    }
    if (g->n_rec)
        memcpy(kg->ops, g->rec, (size_t)g->n_rec * sizeof *kg->ops);
    kg->n = g->n_rec;
    return kg;
}

int kcuda_graph_launch(kcuda *g, kcuda_graph *graph, char *err, size_t errlen)
{
    if (g->capturing) {
        snprintf(err, errlen, "a graph launched inside a capture");
        return -1;
    }
    g->launches++;
    for (int i = 0; i < graph->n; i++)
        graph->ops[i].run(graph->ops[i].args);
    return 0;
}

void kcuda_graph_destroy(kcuda_graph **graph)
{
    if (!*graph)
        return;
    free((*graph)->ops);
    free(*graph);
    *graph = NULL;
}

/* ===== the ops, each its CPU twin ===== */

typedef struct {
    kmat w;
    int64_t lo, hi, c0, c1, ldy;
    const float *x;
    float *y;
    int n;
} matmul_args;

static void matmul_run(const void *p)
{
    const matmul_args *a = p;
    if (a->c0 == 0 && a->c1 == a->w.cols)
        kmat_mul(NULL, &a->w, a->lo, a->hi, a->x, a->n, a->y, a->ldy, NULL);
    else
        kmat_mul_cols(NULL, &a->w, a->lo, a->hi, a->c0, a->c1, a->x, a->n, a->y, a->ldy, NULL);
}

int kcuda_matmul_cols(kcuda *g, const kmat *w, int64_t lo, int64_t hi, int64_t c0, int64_t c1,
                      const float *x, int n, float *y, int64_t ldy, char *err, size_t errlen)
{
    if (n <= 0 || hi <= lo)
        return 0;
    if (kcuda_check_matmul(w, c0, c1, err, errlen))
        return -1;
    matmul_args a = {*w, lo, hi, c0, c1, ldy, x, y, n};
    a.w.packed = NULL; /* the GGUF rows at w->data */
    fake_frag(g, w->type, n);
    FAKE_QUEUE(g, matmul_run, a);
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
    return kcuda_matmul(g, w, lo, hi, x, n, y, ldy, err, errlen);
}

typedef struct {
    float *out, *x;
    const float *cs, *sn, *w, *d;
    int64_t stride, lo, hi, dim;
    int n, n_heads, head_dim, half;
    float eps;
} rows_args;

static void rmsnorm_run(const void *p)
{
    const rows_args *a = p;
    for (int t = 0; t < a->n; t++)
        k_rmsnorm(a->out + (int64_t)t * a->dim, a->x + (int64_t)t * a->dim, a->w, (int)a->dim,
                  a->eps);
}

void kcuda_rmsnorm(kcuda *g, float *out, const float *x, const float *weight, int dim, int n,
                   float eps)
{
    rows_args a = {.out = out, .x = (float *)x, .w = weight, .dim = dim, .n = n, .eps = eps};
    FAKE_QUEUE(g, rmsnorm_run, a);
}

static void rope_run(const void *p)
{
    const rows_args *a = p;
    for (int t = 0; t < a->n; t++)
        k_rope_apply(a->x + (int64_t)t * a->stride, a->n_heads, a->head_dim, a->half,
                     a->cs + (int64_t)t * a->half, a->sn + (int64_t)t * a->half);
}

void kcuda_rope(kcuda *g, float *x, int n, int64_t stride, int n_heads, int head_dim, int half,
                const float *cs, const float *sn)
{
    if (n <= 0 || n_heads <= 0 || half <= 0)
        return;
    rows_args a = {.x = x, .n = n, .stride = stride, .n_heads = n_heads, .head_dim = head_dim,
                   .half = half, .cs = cs, .sn = sn};
    FAKE_QUEUE(g, rope_run, a);
}

static void silu_run(const void *p)
{
    const rows_args *a = p;
    for (int t = 0; t < a->n; t++)
        k_silu_mul(a->x + (int64_t)t * a->stride, a->d + (int64_t)t * a->stride, (int)a->dim);
}

void kcuda_silu_mul(kcuda *g, float *gate, const float *up, int n, int64_t stride, int64_t count)
{
    rows_args a = {.x = gate, .d = up, .n = n, .stride = stride, .dim = count};
    FAKE_QUEUE(g, silu_run, a);
}

/* x[t * dim + c] += d[t * stride + c] (stride 0: one row, a bias) */
static void add_cols_run(const void *p)
{
    const rows_args *a = p;
    for (int t = 0; t < a->n; t++)
        for (int64_t c = a->lo; c < a->hi; c++)
            a->x[t * a->dim + c] += a->d[t * a->stride + c];
}

void kcuda_add_cols(kcuda *g, float *x, const float *d, int n, int64_t dim, int64_t lo,
                    int64_t hi)
{
    rows_args a = {.x = x, .d = d, .n = n, .stride = dim, .dim = dim, .lo = lo, .hi = hi};
    FAKE_QUEUE(g, add_cols_run, a);
}

void kcuda_add_bias(kcuda *g, float *x, const float *bias, int n, int64_t dim, int64_t lo,
                    int64_t hi)
{
    if (n <= 0 || hi <= lo)
        return;
    rows_args a = {.x = x, .d = bias, .n = n, .stride = 0, .dim = dim, .lo = lo, .hi = hi};
    FAKE_QUEUE(g, add_cols_run, a);
}

/* The fused forms: one queued op each, computing what the unfused ops compute (so their bits). */
typedef struct {
    matmul_args m;
    kmat up;  /* fused_silu's */
    int op;   /* 0: add into y; 1: silu(gate) * up */
} fused_args;

/* The product (the up projection's under silu) into a scratch block laid out as y, then the
 * residual add's or silu*mul's own run over it. */
static void fused_run(const void *p)
{
    const fused_args *a = p;
    const matmul_args *m = &a->m;
    float *tmp = malloc((size_t)m->n * (size_t)m->ldy * sizeof *tmp);
    if (!tmp)
        abort();
    kmat_mul(NULL, a->op ? &a->up : &m->w, m->lo, m->hi, m->x, m->n, tmp, m->ldy, NULL);
    if (a->op) {
        kmat_mul(NULL, &m->w, m->lo, m->hi, m->x, m->n, m->y, m->ldy, NULL);
        rows_args r = {.x = m->y + m->lo, .d = tmp + m->lo, .n = m->n, .stride = m->ldy,
                       .dim = m->hi - m->lo};
        silu_run(&r);
    } else {
        rows_args r = {.x = m->y, .d = tmp, .n = m->n, .stride = m->ldy, .dim = m->ldy,
                      .lo = m->lo, .hi = m->hi};
        add_cols_run(&r);
    }
    free(tmp);
}

static int fused_queue(kcuda *g, const kmat *w, const kmat *up, int64_t lo, int64_t hi,
                       const float *x, int n, float *y, int64_t ldy, char *err, size_t errlen)
{
    if (n <= 0 || hi <= lo)
        return 0;
    if (kcuda_check_matmul(w, 0, w->cols, err, errlen) ||
        (up && kcuda_check_same(w, up, "gate and up", err, errlen)))
        return -1;
    fused_args a = {.m = {*w, lo, hi, 0, w->cols, ldy, x, y, n}, .op = up != NULL};
    a.m.w.packed = NULL;
    if (up) {
        a.up = *up;
        a.up.packed = NULL;
    }
    fake_frag(g, w->type, n);
    FAKE_QUEUE(g, fused_run, a);
    return 0;
}

int kcuda_matmul_add(kcuda *g, const kmat *w, int64_t lo, int64_t hi, const float *x, int n,
                     float *y, int64_t ldy, char *err, size_t errlen)
{
    return fused_queue(g, w, NULL, lo, hi, x, n, y, ldy, err, errlen);
}

int kcuda_matmul_silu(kcuda *g, const kmat *gate, const kmat *up, int64_t lo, int64_t hi,
                      const float *x, int n, float *y, int64_t ldy, char *err, size_t errlen)
{
    return fused_queue(g, gate, up, lo, hi, x, n, y, ldy, err, errlen);
}

typedef struct {
    matmul_args m[KCUDA_MM_MAX];
    int count;
} multi_args;

static void multi_run(const void *p)
{
    const multi_args *a = p;
    for (int i = 0; i < a->count; i++)
        matmul_run(&a->m[i]);
}

int kcuda_matmul_multi(kcuda *g, const kcuda_mm *mm, int count, const float *x, int n, char *err,
                       size_t errlen)
{
    if (kcuda_check_multi(mm, count, err, errlen))
        return -1;
    multi_args a = {.count = 0};
    for (int i = 0; i < count; i++)
        if (mm[i].hi > mm[i].lo) {
            matmul_args *m = &a.m[a.count++];
            *m = (matmul_args){*mm[i].w, mm[i].lo, mm[i].hi, 0, mm[i].w->cols, mm[i].ldy, x,
                               mm[i].y, n};
            m->w.packed = NULL;
        }
    if (n > 0 && a.count) {
        fake_frag(g, mm[0].w->type, n);
        FAKE_QUEUE(g, multi_run, a);
    }
    return 0;
}

typedef struct {
    kmat table;
    const int32_t *ids;
    float *out;
    int64_t ldo, c0, c1;
    int n;
} embed_args;

static void embed_run(const void *p)
{
    const embed_args *a = p;
    float *row = malloc((size_t)a->table.cols * sizeof *row);
    if (!row)
        abort();
    for (int t = 0; t < a->n; t++) {
        kmat_row(&a->table, a->ids[t], row);
        memcpy(a->out + (int64_t)t * a->ldo, row + a->c0, (size_t)(a->c1 - a->c0) * sizeof *row);
    }
    free(row);
}

int kcuda_embed(kcuda *g, const kmat *table, const int32_t *ids, int n, float *out, int64_t ldo,
                int64_t c0, int64_t c1, char *err, size_t errlen)
{
    if (kcuda_check_embed(table, err, errlen))
        return -1;
    if (n <= 0 || c1 <= c0)
        return 0;
    embed_args a = {*table, ids, out, ldo, c0, c1, n};
    a.table.packed = NULL;
    FAKE_QUEUE(g, embed_run, a);
    return 0;
}

typedef struct {
    kv_type type;
    void *dst;
    const float *src;
    int64_t head_rows, r0, src_stride;
    int h0, h1, head_dim, n;
} kv_store_args;

static void kv_store_run(const void *p)
{
    const kv_store_args *a = p;
    for (int h = a->h0; h < a->h1; h++)
        for (int t = 0; t < a->n; t++) {
            const float *s = a->src + (int64_t)t * a->src_stride + (int64_t)h * a->head_dim;
            int64_t at = ((int64_t)h * a->head_rows + a->r0 + t) * a->head_dim;
            for (int e = 0; e < a->head_dim; e++) {
                if (a->type == KV_F16)
                    ((uint16_t *)a->dst)[at + e] = kt_f32_to_f16(s[e]);
                else
                    ((float *)a->dst)[at + e] = s[e];
            }
        }
}

void kcuda_kv_store(kcuda *g, kv_type type, void *dst, int64_t head_rows, int64_t r0,
                    const float *src, int64_t src_stride, int h0, int h1, int head_dim, int n)
{
    kv_store_args a = {type, dst, src, head_rows, r0, src_stride, h0, h1, head_dim, n};
    FAKE_QUEUE(g, kv_store_run, a);
}

static void rope_store_run(const void *p)
{
    const struct {
        kcuda_rope_kv a;
        int n;
    } *r = p;
    const kcuda_rope_kv *a = &r->a;
    int hd = a->head_dim, nkh = a->kv_h1 - a->kv_h0;
    int64_t k0 = (int64_t)a->kv_h0 * hd;
    for (int t = 0; t < r->n; t++) { /* as model/llama.c's qk_prepare: biases, norms, rotation */
        float *q = a->q + (int64_t)t * a->q_stride, *k = a->k + (int64_t)t * a->kv_stride + k0;
        float *v = (float *)a->v + (int64_t)t * a->kv_stride + k0;
        for (int64_t e = 0; e < (int64_t)a->q_heads * hd && a->bq; e++)
            q[e] += a->bq[e];
        for (int64_t e = 0; e < (int64_t)nkh * hd; e++) {
            if (a->bk)
                k[e] += a->bk[k0 + e];
            if (a->bv)
                v[e] += a->bv[k0 + e];
        }
        for (int h = 0; a->q_norm && h < a->q_heads; h++)
            k_rmsnorm(q + (int64_t)h * hd, q + (int64_t)h * hd, a->q_norm, hd, a->eps);
        for (int h = 0; a->k_norm && h < nkh; h++)
            k_rmsnorm(k + (int64_t)h * hd, k + (int64_t)h * hd, a->k_norm, hd, a->eps);
        const float *cs = a->cs + (int64_t)t * a->half, *sn = a->sn + (int64_t)t * a->half;
        if (a->neox) {
            k_rope_apply_neox(q, a->q_heads, hd, a->half, cs, sn);
            k_rope_apply_neox(k, nkh, hd, a->half, cs, sn);
        } else {
            k_rope_apply(q, a->q_heads, hd, a->half, cs, sn);
            k_rope_apply(k, nkh, hd, a->half, cs, sn);
        }
    }
    for (int d = 0; d < a->n_dst; d++)
        for (int kv = 0; kv < 2; kv++) {
            kv_store_args s = {a->type,     kv ? a->v_dst[d] : a->k_dst[d],
                               kv ? a->v : a->k, a->head_rows, a->r0, a->kv_stride, a->kv_h0,
                               a->kv_h1, hd, r->n};
            kv_store_run(&s);
        }
}

void kcuda_rope_store(kcuda *g, const kcuda_rope_kv *a, int n)
{
    if (n <= 0)
        return;
    struct {
        kcuda_rope_kv a;
        int n;
    } r = {*a, n};
    FAKE_QUEUE(g, rope_store_run, r);
}

void kcuda_set_matmul_unroll(kcuda *g, int groups)
{
    (void)g, (void)groups; /* the CPU twins have no such knob */
}

int kcuda_copy_gbps(kcuda *g, size_t bytes, int reps, double *gbps, char *err, size_t errlen)
{
    (void)g, (void)bytes, (void)reps, (void)gbps;
    snprintf(err, errlen, "copy bandwidth: the CPU stand-in has no device memory to time");
    return -1;
}

int kcuda_mma_tflops(kcuda *g, double seconds, double *tflops, char *err, size_t errlen)
{
    (void)g, (void)seconds, (void)tflops;
    snprintf(err, errlen, "tensor cores: the CPU stand-in has none to time");
    return -1;
}

void kcuda_set_matmul_kind(kcuda *g, int kind)
{
    g->mm_kind = kind; /* the CPU twins compute the same answer either way */
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
    (void)g, (void)on; /* the CPU twins run one op after another */
}

void kcuda_set_matmul_depth(kcuda *g, int blocks)
{
    (void)g, (void)blocks; /* the CPU twins load no blocks ahead */
}

int kcuda_matmul_depth(kcuda *g, uint32_t type, int64_t rows, int n)
{
    (void)g, (void)type, (void)rows, (void)n;
    return 0; /* no tensor cores */
}

void kcuda_matmul_prepare(kcuda *g, uint32_t type)
{
    (void)g, (void)type;
}

void kcuda_set_att_keys(kcuda *g, int keys)
{
    (void)g, (void)keys; /* nor these */
}

void kcuda_set_att_tile(kcuda *g, int how)
{
    g->att_tile = how == KCUDA_TILE_ON || how == KCUDA_TILE_OFF ? how : KCUDA_TILE_AUTO;
}

int kcuda_matmul_unroll(const kcuda *g, int n)
{
    (void)g, (void)n;
    return 1; /* the CPU twins' loop */
}

/* Decided as the device decides, so that the host side's graph keys and reports follow the rule;
 * the CPU twins compute the same answer either way. */
int kcuda_att_tiles(const kcuda *g, const kcuda_att *a, int n)
{
    return kcuda_att_tiled(a, n, g->att_tile);
}

long kcuda_launches(const kcuda *g)
{
    return g->launches;
}

typedef struct {
    kcuda_att att;
    const float *q;
    float *out;
    int64_t q_stride, out_stride, rec_stride;
    int mode, n, h0, h1;
} att_args;

/* As the CPU forward attends (model/llama.c att_run): the key stream of prefix rows then tree
 * ancestors, walked by katt_causal_group — the prefix alone for DENSE, the ancestors alone for
 * SPARSE — so a part here computes the CPU part's bits. */
static void att_run(const void *p)
{
    const att_args *a = p;
    const kcuda_att *s = &a->att;
    int hd = s->head_dim;
    size_t esz = s->type == KV_F16 ? 2 : 4;
    float *o = malloc((size_t)hd * sizeof *o);
    if (!o)
        abort();
    for (int i = 0; i < a->n; i++)
        for (int h = a->h0; h < a->h1; h++) {
            int kvh = h / (s->n_heads / s->n_kv_heads);
            const float *q = a->q + (int64_t)i * a->q_stride + (int64_t)h * hd;
            const char *kh = (const char *)s->k + (size_t)kvh * (size_t)s->head_rows * hd * esz;
            const char *vh = (const char *)s->v + (size_t)kvh * (size_t)s->head_rows * hd * esz;
            int np = a->mode & KCUDA_ATT_DENSE ? s->n_prefix[i] : 0;
            int na = a->mode & KCUDA_ATT_SPARSE ? s->n_anc[i] : 0;
            katt_keys keys = {.type = s->type, .stride = hd, .n_prefix = np,
                              .k = kh + (size_t)s->seq_row[i] * hd * esz,
                              .v = vh + (size_t)s->seq_row[i] * hd * esz,
                              .tree_k = kh + (size_t)s->tree_row * hd * esz,
                              .tree_v = vh + (size_t)s->tree_row * hd * esz,
                              .tree_slot = s->anc + (int64_t)i * s->anc_stride};
            katt_stat st;
            katt_causal_group(q, 0, 1, &keys, np + na, hd, s->scale, &st, o, 0);
            if (a->mode == KCUDA_ATT_FULL) {
                katt_finish(&st, o, hd);
                memcpy(a->out + (int64_t)i * a->out_stride + (int64_t)h * hd, o,
                       (size_t)hd * sizeof *o);
            } else {
                float *rec = a->out + (int64_t)i * a->out_stride + (int64_t)h * a->rec_stride;
                memcpy(rec, o, (size_t)hd * sizeof *o);
                rec[hd] = st.max;
                rec[hd + 1] = st.sum;
            }
        }
    free(o);
}

int kcuda_attention(kcuda *g, const kcuda_att *s, int mode, const float *q, int64_t q_stride,
                    int n, int h0, int h1, float *out, int64_t out_stride, int64_t rec_stride,
                    char *err, size_t errlen)
{
    if (kcuda_check_attention(s, mode, err, errlen))
        return -1;
    if (n <= 0 || h1 <= h0)
        return 0;
    att_args a = {*s, q, out, q_stride, out_stride, rec_stride, mode, n, h0, h1};
    FAKE_QUEUE(g, att_run, a);
    if (kcuda_att_parts(g, s, n) > 1)
        g->launches++; /* the GPU's join of the parts: the CPU twins need none */
    return 0;
}

int kcuda_att_parts(const kcuda *g, const kcuda_att *a, int n)
{
    (void)g;
    return kcuda_att_parts_rule(a, n, 1, KCUDA_TILE_OFF); /* as a device of one multiprocessor */
}

typedef struct {
    const float *pd, *ps;
    const int32_t *heads;
    float *out;
    int64_t rec_tok, rec_head, out_stride;
    int n_heads_list, n, head_dim;
} merge_args;

static void merge_run(const void *p)
{
    const merge_args *a = p;
    int hd = a->head_dim;
    float *o = malloc((size_t)hd * sizeof *o);
    if (!o)
        abort();
    for (int i = 0; i < a->n; i++)
        for (int j = 0; j < a->n_heads_list; j++) {
            int h = a->heads[j];
            const float *d = a->pd + (int64_t)i * a->rec_tok + (int64_t)h * a->rec_head;
            const float *s = a->ps + (int64_t)i * a->rec_tok + (int64_t)h * a->rec_head;
            katt_stat sd = {d[hd], d[hd + 1]}, ss = {s[hd], s[hd + 1]};
            memcpy(o, d, (size_t)hd * sizeof *o);
            katt_merge(&sd, o, &ss, s, hd);
            katt_finish(&sd, o, hd);
            memcpy(a->out + (int64_t)i * a->out_stride + (int64_t)h * hd, o,
                   (size_t)hd * sizeof *o);
        }
    free(o);
}

void kcuda_att_merge(kcuda *g, const float *pd, const float *ps, int64_t rec_tok, int64_t rec_head,
                     const int32_t *heads, int n_heads_list, int n, int head_dim, float *out,
                     int64_t out_stride)
{
    merge_args a = {pd, ps, heads, out, rec_tok, rec_head, out_stride, n_heads_list, n, head_dim};
    FAKE_QUEUE(g, merge_run, a);
}
