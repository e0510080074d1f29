/*
 * model/llama.c — the Llama forward over a token tree, with a committed KV prefix.
 *
 * Layout of the state (one llama_ctx per sequence):
 *   - per layer, K and V for `n_ctx` prefix positions and `max_width` tree slots, each row
 *     n_kv_heads * head_dim elements (f32 or f16);
 *   - activations for max_width tokens (x, normed x, q, k, v, attention output, ffn hidden);
 *   - per token, its ancestor list inside the batch (itself included): the sparse part of the
 *     tree mask in COO form.
 * A step reads like the math: embed -> per layer (rmsnorm -> q,k,v -> rope -> store K/V in the
 * tree area -> attention(prefix dense + tree sparse, merged) -> wo -> residual -> rmsnorm ->
 * gate/up -> silu*mul -> down -> residual) -> final norm -> lm_head. Every matmul goes through
 * llama_linear, which computes the output rows in `n_shards` ranges the way workers will.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/llama.h"

struct llama_ctx {
    const llama_model *m;
    llama_ctx_params p;
    kpool *pool;
    int n_prefix;
    size_t kv_elem;   /* bytes per KV element */
    int64_t kv_row;   /* elements per position: n_kv_heads * head_dim */
    uint8_t **k, **v; /* per layer: n_ctx prefix rows then max_width tree rows */
    /* activations, max_width rows each */
    float *x, *xb, *xb2, *q, *kk, *vv, *att, *hg, *hu;
    int32_t *anc;     /* max_width x max_width ancestor lists */
    int32_t *n_anc;
    int32_t *pos;     /* positions of the current batch */
    void *scratch;    /* matmul scratch */
};

/* ===== loading ===== */

typedef struct {
    const gguf_file *f;
    char *err;
    size_t errlen;
} llama_loader;

static int load_u32(llama_loader *ld, const char *arch, const char *suffix, uint32_t *out,
                    bool required, uint32_t dflt)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_get_u32(ld->f, key, out))
        return 0;
    if (!required) {
        *out = dflt;
        return 0;
    }
    snprintf(ld->err, ld->errlen, "%s: missing or invalid metadata key '%s'", ld->f->path, key);
    return -1;
}

/* Bind a 2-D weight of shape [cols, rows] (ggml order) to a kmat. */
static int load_mat(llama_loader *ld, const char *name, int64_t cols, int64_t rows, kmat *out)
{
    const gguf_tensor *t = gguf_tensor_find(ld->f, name);
    if (!t) {
        snprintf(ld->err, ld->errlen, "%s: missing tensor '%s'", ld->f->path, name);
        return -1;
    }
    const kt_traits *tr = kt_traits_of(t->type);
    if (!tr || !tr->supported) {
        snprintf(ld->err, ld->errlen, "%s: tensor '%s' has unsupported type %s (supported: F32, F16, "
                 "BF16, Q8_0, Q4_0, Q4_1)", ld->f->path, name, tr ? tr->name : "unknown");
        return -1;
    }
    uint64_t ne1 = t->n_dims >= 2 ? t->ne[1] : 1;
    if (t->ne[0] != (uint64_t)cols || ne1 != (uint64_t)rows || t->n_dims > 2) {
        snprintf(ld->err, ld->errlen, "%s: tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]",
                 ld->f->path, name, (unsigned long long)t->ne[0], (unsigned long long)ne1,
                 (long long)cols, (long long)rows);
        return -1;
    }
    if (tr->block > 1 && cols % 32) {
        snprintf(ld->err, ld->errlen, "%s: tensor '%s': row length %lld is not a multiple of 32",
                 ld->f->path, name, (long long)cols);
        return -1;
    }
    *out = (kmat){.type = t->type, .rows = rows, .cols = cols,
                  .row_bytes = kt_row_bytes(t->type, (uint64_t)cols), .data = t->data};
    return 0;
}

static int load_norm(llama_loader *ld, const char *name, int64_t n, const float **out)
{
    const gguf_tensor *t = gguf_tensor_find(ld->f, name);
    if (!t) {
        snprintf(ld->err, ld->errlen, "%s: missing tensor '%s'", ld->f->path, name);
        return -1;
    }
    if (t->type != KT_F32 || t->ne[0] != (uint64_t)n || t->n_dims != 1) {
        snprintf(ld->err, ld->errlen, "%s: tensor '%s' must be F32 of shape [%lld]", ld->f->path,
                 name, (long long)n);
        return -1;
    }
    if ((uintptr_t)t->data % 4) {
        snprintf(ld->err, ld->errlen, "%s: tensor '%s' data is not 4-byte aligned", ld->f->path, name);
        return -1;
    }
    *out = t->data;
    return 0;
}

static int load_config(llama_loader *ld, llama_config *c)
{
    gguf_str arch_s;
    char arch[64];
    if (!gguf_get_str(ld->f, "general.architecture", &arch_s) || arch_s.len >= sizeof arch) {
        snprintf(ld->err, ld->errlen, "%s: missing metadata key 'general.architecture'", ld->f->path);
        return -1;
    }
    memcpy(arch, arch_s.ptr, arch_s.len);
    arch[arch_s.len] = 0;
    if (strcmp(arch, "llama")) {
        snprintf(ld->err, ld->errlen, "%s: architecture '%s' is not supported (orochi runs 'llama')",
                 ld->f->path, arch);
        return -1;
    }
    uint32_t layers, dim, ffn, heads, kv_heads, ctx, rot, vocab = 0;
    if (load_u32(ld, arch, "block_count", &layers, true, 0) ||
        load_u32(ld, arch, "embedding_length", &dim, true, 0) ||
        load_u32(ld, arch, "feed_forward_length", &ffn, true, 0) ||
        load_u32(ld, arch, "attention.head_count", &heads, true, 0) ||
        load_u32(ld, arch, "attention.head_count_kv", &kv_heads, false, heads) ||
        load_u32(ld, arch, "context_length", &ctx, false, 2048))
        return -1;
    if (!layers || !dim || !ffn || !heads || !kv_heads || layers > 4096 || dim > 65536 ||
        ffn > 1048576 || heads > 1024 || dim % heads || heads % kv_heads) {
        snprintf(ld->err, ld->errlen, "%s: inconsistent shape: layers %u dim %u ffn %u heads %u "
                 "kv_heads %u", ld->f->path, layers, dim, ffn, heads, kv_heads);
        return -1;
    }
    if (load_u32(ld, arch, "rope.dimension_count", &rot, false, dim / heads))
        return -1;
    const gguf_tensor *emb = gguf_tensor_find(ld->f, "token_embd.weight");
    if (!emb || emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > (1u << 24)) {
        snprintf(ld->err, ld->errlen, "%s: missing or malformed tensor 'token_embd.weight'", ld->f->path);
        return -1;
    }
    vocab = (uint32_t)emb->ne[1];
    c->n_layers = (int)layers;
    c->dim = (int)dim;
    c->ffn = (int)ffn;
    c->n_heads = (int)heads;
    c->n_kv_heads = (int)kv_heads;
    c->head_dim = (int)(dim / heads);
    c->rot_dim = (int)rot;
    c->vocab = (int)vocab;
    c->ctx = (int)ctx;
    if (c->head_dim > 512 || rot > (uint32_t)c->head_dim || rot % 2) {
        snprintf(ld->err, ld->errlen, "%s: head_dim %d / rope dims %u not supported", ld->f->path,
                 c->head_dim, rot);
        return -1;
    }
    char key[128];
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if (!gguf_get_f32(ld->f, key, &c->rope_base))
        c->rope_base = 10000.0f;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    if (!gguf_get_f32(ld->f, key, &c->norm_eps))
        c->norm_eps = 1e-5f;
    return 0;
}

llama_model *llama_model_load(const char *path, char *err, size_t errlen)
{
    gguf_file *f = gguf_open(path, err, errlen);
    if (!f)
        return NULL;
    llama_model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(&f);
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    m->file = f;
    llama_loader ld = {f, err, errlen};
    llama_config *c = &m->cfg;
    if (load_config(&ld, c))
        goto fail;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto fail;
    }
    int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    if (load_mat(&ld, "token_embd.weight", c->dim, c->vocab, &m->tok_embd) ||
        load_norm(&ld, "output_norm.weight", c->dim, &m->out_norm))
        goto fail;
    if (gguf_tensor_find(f, "output.weight")) {
        if (load_mat(&ld, "output.weight", c->dim, c->vocab, &m->lm_head))
            goto fail;
    } else {
        m->lm_head = m->tok_embd;
        m->tied = 1;
    }
    for (int l = 0; l < c->n_layers; l++) {
        llama_layer *L = &m->layers[l];
        char name[96];
#define LAYER_T(field, suffix, fn, ...)                                   \
        snprintf(name, sizeof name, "blk.%d.%s.weight", l, suffix);        \
        if (fn(&ld, name, __VA_ARGS__, &L->field))                         \
            goto fail;
        LAYER_T(attn_norm, "attn_norm", load_norm, c->dim)
        LAYER_T(ffn_norm, "ffn_norm", load_norm, c->dim)
        LAYER_T(wq, "attn_q", load_mat, c->dim, qd)
        LAYER_T(wk, "attn_k", load_mat, c->dim, kvd)
        LAYER_T(wv, "attn_v", load_mat, c->dim, kvd)
        LAYER_T(wo, "attn_output", load_mat, qd, c->dim)
        LAYER_T(w_gate, "ffn_gate", load_mat, c->dim, c->ffn)
        LAYER_T(w_up, "ffn_up", load_mat, c->dim, c->ffn)
        LAYER_T(w_down, "ffn_down", load_mat, c->ffn, c->dim)
#undef LAYER_T
    }
    return m;
fail:
    llama_model_destroy(&m);
    return NULL;
}

void llama_model_destroy(llama_model **model)
{
    llama_model *m = *model;
    if (!m)
        return;
    gguf_close(&m->file);
    free(m->layers);
    free(m);
    *model = NULL;
}

static size_t mat_bytes(const kmat *w)
{
    return (size_t)w->rows * w->row_bytes;
}

size_t llama_model_step_bytes(const llama_model *m)
{
    size_t total = mat_bytes(&m->lm_head);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        total += mat_bytes(&L->wq) + mat_bytes(&L->wk) + mat_bytes(&L->wv) + mat_bytes(&L->wo) +
                 mat_bytes(&L->w_gate) + mat_bytes(&L->w_up) + mat_bytes(&L->w_down);
    }
    return total;
}

double llama_model_step_macs(const llama_model *m)
{
    const llama_config *c = &m->cfg;
    double qd = (double)c->n_heads * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
    double per_layer = c->dim * (qd + 2 * kvd) + qd * c->dim + 3.0 * c->dim * c->ffn;
    return per_layer * c->n_layers + (double)c->dim * c->vocab;
}

/* ===== context ===== */

static long online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

llama_ctx *llama_ctx_new(const llama_model *m, const llama_ctx_params *p, char *err, size_t errlen)
{
    const llama_config *c = &m->cfg;
    llama_ctx *x = calloc(1, sizeof *x);
    if (!x)
        goto oom;
    x->m = m;
    x->p = *p;
    if (x->p.n_threads <= 0)
        x->p.n_threads = (int)online_cores();
    if (x->p.max_width <= 0)
        x->p.max_width = 1;
    if (x->p.max_width > KMAT_MAX_W) {
        snprintf(err, errlen, "max width %d exceeds %d", x->p.max_width, KMAT_MAX_W);
        free(x);
        return NULL;
    }
    if (x->p.n_ctx <= 0)
        x->p.n_ctx = c->ctx;
    if (x->p.n_shards <= 0)
        x->p.n_shards = 1;
    x->pool = kpool_new(x->p.n_threads);
    if (!x->pool)
        goto oom;
    x->kv_elem = x->p.kv == KV_F16 ? 2 : 4;
    x->kv_row = (int64_t)c->n_kv_heads * c->head_dim;
    x->k = calloc((size_t)c->n_layers, sizeof *x->k);
    x->v = calloc((size_t)c->n_layers, sizeof *x->v);
    if (!x->k || !x->v)
        goto oom;
    size_t layer_bytes = (size_t)(x->p.n_ctx + x->p.max_width) * (size_t)x->kv_row * x->kv_elem;
    for (int l = 0; l < c->n_layers; l++) {
        x->k[l] = malloc(layer_bytes);
        x->v[l] = malloc(layer_bytes);
        if (!x->k[l] || !x->v[l])
            goto oom;
    }
    size_t W = (size_t)x->p.max_width;
    int64_t qd = (int64_t)c->n_heads * c->head_dim;
    int64_t wide = c->ffn > qd ? c->ffn : qd;
    if (wide < c->dim)
        wide = c->dim;
    x->x = malloc(W * (size_t)c->dim * 4);
    x->xb = malloc(W * (size_t)wide * 4);
    x->xb2 = malloc(W * (size_t)c->dim * 4);
    x->q = malloc(W * (size_t)qd * 4);
    x->kk = malloc(W * (size_t)x->kv_row * 4);
    x->vv = malloc(W * (size_t)x->kv_row * 4);
    x->att = malloc(W * (size_t)qd * 4);
    x->hg = malloc(W * (size_t)c->ffn * 4);
    x->hu = malloc(W * (size_t)c->ffn * 4);
    x->anc = malloc(W * W * sizeof *x->anc);
    x->n_anc = malloc(W * sizeof *x->n_anc);
    x->pos = malloc(W * sizeof *x->pos);
    x->scratch = malloc(kmat_scratch_bytes(wide, (int)W, kpool_threads(x->pool)));
    if (!x->x || !x->xb || !x->xb2 || !x->q || !x->kk || !x->vv || !x->att || !x->hg || !x->hu ||
        !x->anc || !x->n_anc || !x->pos || !x->scratch)
        goto oom;
    return x;
oom:
    snprintf(err, errlen, "out of memory allocating the context (n_ctx %d, width %d)",
             p->n_ctx ? p->n_ctx : c->ctx, p->max_width);
    llama_ctx_destroy(&x);
    return NULL;
}

void llama_ctx_destroy(llama_ctx **ctx)
{
    llama_ctx *x = *ctx;
    if (!x)
        return;
    for (int l = 0; x->k && x->v && l < x->m->cfg.n_layers; l++) {
        free(x->k[l]);
        free(x->v[l]);
    }
    free(x->k);
    free(x->v);
    free(x->x);
    free(x->xb);
    free(x->xb2);
    free(x->q);
    free(x->kk);
    free(x->vv);
    free(x->att);
    free(x->hg);
    free(x->hu);
    free(x->anc);
    free(x->n_anc);
    free(x->pos);
    free(x->scratch);
    kpool_destroy(&x->pool);
    free(x);
    *ctx = NULL;
}

int llama_ctx_prefix_len(const llama_ctx *ctx)
{
    return ctx->n_prefix;
}

int llama_ctx_threads(const llama_ctx *ctx)
{
    return kpool_threads(ctx->pool);
}

void llama_ctx_reset(llama_ctx *ctx)
{
    ctx->n_prefix = 0;
}

/* ===== the forward ===== */

/* y = W x for n tokens, output rows computed as n_shards ranges (what column-split workers do). */
static void llama_linear(llama_ctx *x, const kmat *w, const float *in, int n, float *out)
{
    int s = x->p.n_shards;
    for (int i = 0; i < s; i++) {
        int64_t lo = w->rows * i / s, hi = w->rows * (i + 1) / s;
        kmat_mul(x->pool, w, lo, hi, in, n, out, w->rows, x->scratch);
    }
}

static void *kv_slot(const llama_ctx *x, uint8_t *base, int64_t p)
{
    return base + (size_t)p * (size_t)x->kv_row * x->kv_elem;
}

static void kv_store(const llama_ctx *x, uint8_t *base, int64_t p, const float *src)
{
    void *dst = kv_slot(x, base, p);
    if (x->p.kv == KV_F32) {
        memcpy(dst, src, (size_t)x->kv_row * 4);
        return;
    }
    uint16_t *h = dst;
    for (int64_t i = 0; i < x->kv_row; i++)
        h[i] = kt_f32_to_f16(src[i]);
}

typedef struct {
    llama_ctx *x;
    int layer, n;
} att_job;

/* One (token, query head) pair per item: the token attends to its key stream — the committed
 * prefix, then its ancestors in the tree (which continue the positions) — in one causal pass (see
 * kernels/cpu/attention.c for why one pass and not a merge of two partials). */
static void att_run(void *argp, int64_t begin, int64_t end, int thread)
{
    const att_job *j = argp;
    llama_ctx *x = j->x;
    const llama_config *c = &x->m->cfg;
    int hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t item = begin; item < end; item++) {
        int i = (int)(item / c->n_heads), h = (int)(item % c->n_heads), kvh = h / group;
        const float *q = x->q + (int64_t)i * c->n_heads * hd + (int64_t)h * hd;
        float *out = x->att + (int64_t)i * c->n_heads * hd + (int64_t)h * hd;
        size_t head_off = (size_t)kvh * hd * x->kv_elem;
        katt_keys keys = {
            .type = x->p.kv, .stride = x->kv_row, .n_prefix = x->n_prefix,
            .k = (uint8_t *)x->k[j->layer] + head_off,
            .v = (uint8_t *)x->v[j->layer] + head_off,
            .tree_k = (uint8_t *)kv_slot(x, x->k[j->layer], x->p.n_ctx) + head_off,
            .tree_v = (uint8_t *)kv_slot(x, x->v[j->layer], x->p.n_ctx) + head_off,
            .tree_slot = x->anc + (int64_t)i * x->p.max_width,
        };
        katt_stat st;
        katt_causal(q, &keys, x->n_prefix + x->n_anc[i], hd, scale, &st, out);
        katt_finish(&st, out, hd);
    }
}

/* Ancestor lists (root first, self last) and positions from the parent indices. */
static int llama_tree_prepare(llama_ctx *x, const llama_batch *b, char *err, size_t errlen)
{
    int W = x->p.max_width;
    for (int i = 0; i < b->n; i++) {
        int par = b->parent ? b->parent[i] : i - 1;
        if (par >= i || par < -1) {
            snprintf(err, errlen, "token %d: parent %d must be -1 or an earlier batch index", i, par);
            return -1;
        }
        int32_t *a = x->anc + (int64_t)i * W;
        int n = 0;
        if (par >= 0) {
            memcpy(a, x->anc + (int64_t)par * W, (size_t)x->n_anc[par] * sizeof *a);
            n = x->n_anc[par];
        }
        a[n++] = i;
        x->n_anc[i] = n;
        x->pos[i] = b->pos ? b->pos[i] : x->n_prefix + n - 1;
        if (x->pos[i] < 0) {
            snprintf(err, errlen, "token %d: negative position %d", i, x->pos[i]);
            return -1;
        }
    }
    return 0;
}

static void add_into(float *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] += src[i];
}

int llama_forward(llama_ctx *x, const llama_batch *b, float *logits, char *err, size_t errlen)
{
    const llama_model *m = x->m;
    const llama_config *c = &m->cfg;
    int n = b->n;
    if (n < 1 || n > x->p.max_width) {
        snprintf(err, errlen, "batch of %d tokens: must be 1..%d", n, x->p.max_width);
        return -1;
    }
    if (x->n_prefix + n > x->p.n_ctx) {
        snprintf(err, errlen, "context full: %d committed + %d new tokens exceed %d", x->n_prefix, n,
                 x->p.n_ctx);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab) {
            snprintf(err, errlen, "token %d: id %d outside the vocabulary [0, %d)", i, b->tokens[i],
                     c->vocab);
            return -1;
        }
    if (llama_tree_prepare(x, b, err, errlen))
        return -1;

    int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kvd = x->kv_row;
    for (int i = 0; i < n; i++)
        kmat_row(&m->tok_embd, b->tokens[i], x->x + i * dim);

    for (int l = 0; l < c->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        for (int i = 0; i < n; i++)
            k_rmsnorm(x->xb + i * dim, x->x + i * dim, L->attn_norm, (int)dim, c->norm_eps);
        llama_linear(x, &L->wq, x->xb, n, x->q);
        llama_linear(x, &L->wk, x->xb, n, x->kk);
        llama_linear(x, &L->wv, x->xb, n, x->vv);
        for (int i = 0; i < n; i++) {
            k_rope(x->q + i * qd, c->n_heads, c->head_dim, c->rot_dim, x->pos[i], c->rope_base);
            k_rope(x->kk + i * kvd, c->n_kv_heads, c->head_dim, c->rot_dim, x->pos[i], c->rope_base);
            kv_store(x, x->k[l], x->p.n_ctx + i, x->kk + i * kvd);
            kv_store(x, x->v[l], x->p.n_ctx + i, x->vv + i * kvd);
        }
        att_job aj = {x, l, n};
        kpool_run(x->pool, (int64_t)n * c->n_heads, 1, att_run, &aj);
        llama_linear(x, &L->wo, x->att, n, x->xb2);
        add_into(x->x, x->xb2, n * dim);

        for (int i = 0; i < n; i++)
            k_rmsnorm(x->xb + i * dim, x->x + i * dim, L->ffn_norm, (int)dim, c->norm_eps);
        llama_linear(x, &L->w_gate, x->xb, n, x->hg);
        llama_linear(x, &L->w_up, x->xb, n, x->hu);
        k_silu_mul(x->hg, x->hu, n * c->ffn);
        llama_linear(x, &L->w_down, x->hg, n, x->xb2);
        add_into(x->x, x->xb2, n * dim);
    }

    int from = b->logits_from < 0 ? 0 : b->logits_from;
    if (logits && from < n) {
        for (int i = from; i < n; i++)
            k_rmsnorm(x->xb + (i - from) * dim, x->x + i * dim, m->out_norm, (int)dim, c->norm_eps);
        llama_linear(x, &m->lm_head, x->xb, n - from, logits);
    }
    return 0;
}

int llama_commit(llama_ctx *x, const int32_t *path, int n, char *err, size_t errlen)
{
    if (x->n_prefix + n > x->p.n_ctx) {
        snprintf(err, errlen, "commit of %d tokens overflows the context (%d of %d used)", n,
                 x->n_prefix, x->p.n_ctx);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (path[i] < 0 || path[i] >= x->p.max_width || x->pos[path[i]] != x->n_prefix + i) {
            snprintf(err, errlen, "commit: path[%d] = %d is not at position %d", i, path[i],
                     x->n_prefix + i);
            return -1;
        }
    }
    size_t row = (size_t)x->kv_row * x->kv_elem;
    for (int l = 0; l < x->m->cfg.n_layers; l++)
        for (int i = 0; i < n; i++) {
            memcpy(kv_slot(x, x->k[l], x->n_prefix + i), kv_slot(x, x->k[l], x->p.n_ctx + path[i]), row);
            memcpy(kv_slot(x, x->v[l], x->n_prefix + i), kv_slot(x, x->v[l], x->p.n_ctx + path[i]), row);
        }
    x->n_prefix += n;
    return 0;
}

int llama_prefill(llama_ctx *x, const int32_t *ids, int n, float *last_logits, char *err,
                  size_t errlen)
{
    int32_t path[KMAT_MAX_W];
    for (int i = 0; i < KMAT_MAX_W; i++)
        path[i] = i;
    for (int done = 0; done < n;) {
        int w = n - done < x->p.max_width ? n - done : x->p.max_width;
        bool last = done + w == n;
        llama_batch b = {.n = w, .tokens = ids + done, .logits_from = w - 1};
        if (llama_forward(x, &b, last ? last_logits : NULL, err, errlen) || llama_commit(x, path, w, err, errlen))
            return -1;
        done += w;
    }
    return 0;
}
