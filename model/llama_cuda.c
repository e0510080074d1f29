/*
 * model/llama_cuda.c — one part of the Llama forward on a GPU (model/llama_cuda.h).
 *
 * llama_gpu_forward follows llama_forward step by step (model/llama.c): the batch is prepared on
 * the host (ancestor lists, positions, RoPE angles), the per-token arrays the attention kernel
 * reads are uploaded, and then per layer: rmsnorm, the part's q/k/v rows, RoPE, the K/V rows into
 * the tree area, attention for the part's units (full, dense or sparse), the merge of split heads,
 * the output projection and residual, rmsnorm, gate/up, SiLU, down and residual — each result
 * where the CPU part would have written it in the shared block, so the other parts (CPU or GPU)
 * read it there.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kcuda.h"
#include "model/llama_cuda.h"
#include "model/llama_internal.h"

typedef struct {
    kmat wq, wk, wv, wo, w_gate, w_up, w_down;
    float *attn_norm, *ffn_norm;
} gpu_layer;

struct llama_gpu {
    llama_ctx *x;
    kcuda *g;
    uint8_t *host_base, *dev_base;
    size_t map_bytes;
    bool registered;
    gpu_layer *layers;
    kmat tok_embd, lm_head;
    float *out_norm;
    void **allocs; /* device blocks owned */
    int n_allocs, cap_allocs;
    float *xb, *attp;
    int32_t *d_tokens, *d_seq_row, *d_n_prefix, *d_anc, *d_n_anc, *d_split;
    float *d_cs, *d_sn;
    int32_t *h_seq_row, *h_n_prefix, *h_n_anc, *h_anc;
    char describe[160];
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
    if (p)
        gp->allocs[gp->n_allocs++] = p;
    return p;
}

static bool gpu_type_ok(uint32_t t)
{
    return t == KT_F32 || t == KT_F16 || t == KT_BF16 || t == KT_Q8_0 || t == KT_Q4_0 ||
           t == KT_Q4_1;
}

/* A device copy of a matrix's GGUF rows. */
static int gpu_matrix(llama_gpu *gp, const kmat *src, kmat *dst, const char *what, char *err,
                      size_t errlen)
{
    if (!gpu_type_ok(src->type)) {
        snprintf(err, errlen,
                 "%s is %s: the GPU worker takes F32, F16, BF16, Q8_0, Q4_0 and Q4_1 matrices "
                 "(orochi quantize converts a model)",
                 what, kt_traits_of(src->type) ? kt_traits_of(src->type)->name : "unknown");
        return -1;
    }
    *dst = *src;
    dst->packed = NULL;
    size_t bytes = (size_t)src->rows * src->row_bytes;
    void *d = gpu_alloc(gp, bytes);
    if (!d) {
        snprintf(err, errlen, "%s: cannot allocate %zu bytes of GPU memory", what, bytes);
        return -1;
    }
    dst->data = d;
    return kcuda_upload(gp->g, d, src->data, bytes, err, errlen);
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

llama_gpu *llama_gpu_new(llama_ctx *x, int device, void *map_base, size_t map_bytes, char *err,
                         size_t errlen)
{
    const llama_model *m = x->m;
    const llama_config *c = &m->cfg;
    if (x->p.kv != KV_F32 || x->p.prefix_src || x->p.screen_top > 0) {
        snprintf(err, errlen, "the GPU forward needs an f32 KV cache of its own and no screening "
                              "head");
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
    kcuda_describe(gp->g, gp->describe, sizeof gp->describe);
    void *dev;
    if (kcuda_register(map_base, map_bytes, &dev, err, errlen))
        goto fail;
    gp->registered = true;
    gp->dev_base = dev;
    gp->layers = calloc((size_t)c->n_layers, sizeof *gp->layers);
    if (!gp->layers)
        goto oom;
    char what[64];
    for (int l = 0; l < c->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        gpu_layer *G = &gp->layers[l];
        const kmat *src[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        kmat *dst[7] = {&G->wq, &G->wk, &G->wv, &G->wo, &G->w_gate, &G->w_up, &G->w_down};
        static const char *names[7] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                       "ffn_up", "ffn_down"};
        for (int k = 0; k < 7; k++) {
            snprintf(what, sizeof what, "blk.%d.%s", l, names[k]);
            if (gpu_matrix(gp, src[k], dst[k], what, err, errlen))
                goto fail;
        }
        if (!(G->attn_norm = gpu_floats(gp, L->attn_norm, (size_t)c->dim, err, errlen)) ||
            !(G->ffn_norm = gpu_floats(gp, L->ffn_norm, (size_t)c->dim, err, errlen)))
            goto fail;
    }
    if (gpu_matrix(gp, &m->tok_embd, &gp->tok_embd, "token_embd", err, errlen))
        goto fail;
    if (m->tied)
        gp->lm_head = gp->tok_embd;
    else if (gpu_matrix(gp, &m->lm_head, &gp->lm_head, "output", err, errlen))
        goto fail;
    if (!(gp->out_norm = gpu_floats(gp, m->out_norm, (size_t)c->dim, err, errlen)))
        goto fail;
    size_t W = (size_t)x->p.max_width, qd = (size_t)c->n_heads * c->head_dim;
    size_t half = (size_t)(c->rot_dim / 2 > 0 ? c->rot_dim / 2 : 1);
    gp->xb = gpu_alloc(gp, W * (size_t)c->dim * 4);
    gp->attp = gpu_alloc(gp, W * qd * 4);
    gp->d_tokens = gpu_alloc(gp, W * 4);
    gp->d_seq_row = gpu_alloc(gp, W * 4);
    gp->d_n_prefix = gpu_alloc(gp, W * 4);
    gp->d_n_anc = gpu_alloc(gp, W * 4);
    gp->d_anc = gpu_alloc(gp, W * W * 4);
    gp->d_split = gpu_alloc(gp, (size_t)c->n_heads * 4);
    gp->d_cs = gpu_alloc(gp, W * half * 4);
    gp->d_sn = gpu_alloc(gp, W * half * 4);
    gp->h_seq_row = malloc(W * 4);
    gp->h_n_prefix = malloc(W * 4);
    gp->h_n_anc = malloc(W * 4);
    gp->h_anc = calloc(W * W, 4);
    if (!gp->xb || !gp->attp || !gp->d_tokens || !gp->d_seq_row || !gp->d_n_prefix ||
        !gp->d_n_anc || !gp->d_anc || !gp->d_split || !gp->d_cs || !gp->d_sn || !gp->h_seq_row ||
        !gp->h_n_prefix || !gp->h_n_anc || !gp->h_anc)
        goto oom;
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
    for (int i = 0; i < gp->n_allocs; i++)
        kcuda_free(gp->allocs[i]);
    free(gp->allocs);
    if (gp->registered)
        kcuda_unregister(gp->host_base);
    kcuda_destroy(&gp->g);
    free(gp->layers);
    free(gp->h_seq_row);
    free(gp->h_n_prefix);
    free(gp->h_n_anc);
    free(gp->h_anc);
    free(gp);
    *gpp = NULL;
}

const char *llama_gpu_describe(const llama_gpu *gp)
{
    return gp->describe;
}

/* Drain the stream, then meet the other parts. */
static int gpu_sync(llama_gpu *gp, char *err, size_t errlen)
{
    if (kcuda_sync(gp->g, err, errlen))
        return -1;
    return llama_part_sync(gp->x, err, errlen);
}

/* The part's K/V rows of the batch (kk or vv, n tokens) into the tree area of layer block `kvl`. */
static int gpu_kv_store(llama_gpu *gp, uint8_t *kvl, const float *rows, int n, char *err,
                        size_t errlen)
{
    llama_ctx *x = gp->x;
    size_t hd = (size_t)x->m->cfg.head_dim;
    int64_t head_rows = x->tree_row + x->p.max_width;
    for (int kvh = x->kvh0; kvh < x->kvh1; kvh++) {
        uint8_t *dst = kvl + ((size_t)kvh * (size_t)head_rows + (size_t)(x->tree_row + x->batch_base)) *
                                 hd * 4;
        if (kcuda_copy2d(gp->g, gpu_dev(gp, dst), hd * 4, rows + (size_t)kvh * hd,
                         (size_t)x->kv_row * 4, hd * 4, (size_t)n, err, errlen))
            return -1;
    }
    return 0;
}

int llama_gpu_forward(llama_gpu *gp, const llama_batch *b, float *logits, char *err,
                      size_t errlen)
{
    llama_ctx *x = gp->x;
    kcuda *g = gp->g;
    const llama_model *m = x->m;
    const llama_config *c = &m->cfg;
    const llama_shared *sh = &x->sh;
    int n = b->n, W = x->p.max_width;
    if (x->megatron) {
        snprintf(err, errlen, "the GPU forward runs HCMP plans only (not megatron)");
        return -1;
    }
    if (llama_batch_prepare(x, b, err, errlen))
        return -1;
    if (logits && !gpu_in_map(gp, logits, (size_t)n * (size_t)c->vocab * 4)) {
        snprintf(err, errlen, "the logits lie outside the GPU's mapped memory");
        return -1;
    }
    int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kvd = x->kv_row,
            hd = c->head_dim, ffn = c->ffn;
    llama_part_cols pc;
    llama_part_cols_of(x, &pc);
    int64_t d0 = pc.d0, d1 = pc.d1, e0 = pc.e0, e1 = pc.e1, f0 = pc.f0, f1 = pc.f1;
    int64_t q0 = pc.q0, q1 = pc.q1, k0 = pc.k0, k1 = pc.k1, v0 = pc.v0, v1 = pc.v1;
    int half = c->rot_dim / 2;

    /* the step's small arrays: RoPE angles, and what attention needs per token */
    for (int i = 0; i < n; i++) {
        int slot = x->batch_base + i, seq = x->seq[slot];
        k_rope_angles(x->rope_cs + (size_t)i * half, x->rope_sn + (size_t)i * half, x->rope_inv,
                      half, x->pos[slot]);
        gp->h_seq_row[i] = seq * x->p.n_ctx;
        gp->h_n_prefix[i] = x->prefix[seq];
        gp->h_n_anc[i] = x->n_anc[slot];
        memcpy(gp->h_anc + (size_t)i * W, x->anc + (size_t)slot * W,
               (size_t)x->n_anc[slot] * sizeof *gp->h_anc);
    }
    size_t nb = (size_t)n * 4, rb = (size_t)n * (size_t)half * 4;
    if (kcuda_upload(g, gp->d_tokens, b->tokens, nb, err, errlen) ||
        kcuda_upload(g, gp->d_cs, x->rope_cs, rb, err, errlen) ||
        kcuda_upload(g, gp->d_sn, x->rope_sn, rb, err, errlen) ||
        kcuda_upload(g, gp->d_seq_row, gp->h_seq_row, nb, err, errlen) ||
        kcuda_upload(g, gp->d_n_prefix, gp->h_n_prefix, nb, err, errlen) ||
        kcuda_upload(g, gp->d_n_anc, gp->h_n_anc, nb, err, errlen) ||
        kcuda_upload(g, gp->d_anc, gp->h_anc, (size_t)n * (size_t)W * 4, err, errlen) ||
        (x->n_split && kcuda_upload(g, gp->d_split, x->split_heads, (size_t)x->n_split * 4, err,
                                    errlen)))
        return -1;
    float *X = gpu_dev(gp, sh->x), *Q = gpu_dev(gp, sh->q), *ATT = gpu_dev(gp, sh->att);
    float *XB2 = gpu_dev(gp, sh->xb2), *HG = gpu_dev(gp, sh->hg), *HU = gpu_dev(gp, sh->hu);
    float *KK = gpu_dev(gp, sh->kk), *VV = gpu_dev(gp, sh->vv), *AP = gpu_dev(gp, sh->ap);
    int64_t rec = hd + 2, rec_tok = (int64_t)c->n_heads * 2 * rec;

    if (kcuda_embed(g, &gp->tok_embd, gp->d_tokens, n, X + d0, dim, d0, d1, err, errlen) ||
        gpu_sync(gp, err, errlen))
        return -1;
    for (int l = 0; l < c->n_layers; l++) {
        const gpu_layer *L = &gp->layers[l];
        uint8_t *kl = sh->kv + (size_t)(2 * l) * sh->layer_kv_bytes, *vl = kl + sh->layer_kv_bytes;
        kcuda_rmsnorm(g, gp->xb, X, L->attn_norm, (int)dim, n, c->norm_eps);
        if (kcuda_matmul(g, &L->wq, q0, q1, gp->xb, n, Q, qd, err, errlen) ||
            kcuda_matmul(g, &L->wk, k0, k1, gp->xb, n, KK, kvd, err, errlen) ||
            kcuda_matmul(g, &L->wv, k0, k1, gp->xb, n, VV, kvd, err, errlen))
            return -1;
        kcuda_rope(g, Q + q0, n, qd, (int)((q1 - q0) / hd), (int)hd, half, gp->d_cs, gp->d_sn);
        kcuda_rope(g, KK + k0, n, kvd, x->kvh1 - x->kvh0, (int)hd, half, gp->d_cs, gp->d_sn);
        if (gpu_kv_store(gp, kl, KK, n, err, errlen) || gpu_kv_store(gp, vl, VV, n, err, errlen))
            return -1;
        if (x->att_sync && gpu_sync(gp, err, errlen))
            return -1;
        kcuda_att a = {.type = KV_F32,
                       .k = gpu_dev(gp, kl),
                       .v = gpu_dev(gp, vl),
                       .head_rows = x->tree_row + W,
                       .tree_row = x->tree_row,
                       .head_dim = (int)hd,
                       .n_heads = c->n_heads,
                       .n_kv_heads = c->n_kv_heads,
                       .scale = 1.0f / sqrtf((float)hd),
                       .seq_row = gp->d_seq_row,
                       .n_prefix = gp->d_n_prefix,
                       .anc = gp->d_anc,
                       .n_anc = gp->d_n_anc,
                       .anc_stride = W};
        for (int u = 0; u < x->n_units; u++) {
            const struct att_unit *un = &x->units[u];
            int rc = un->mode == ATT_FULL
                         ? kcuda_attention(g, &a, KCUDA_ATT_FULL, Q, qd, n, un->h0,
                                           un->h0 + un->nh, ATT, qd, 0, err, errlen)
                         : kcuda_attention(g, &a,
                                           un->mode == ATT_DENSE ? KCUDA_ATT_DENSE
                                                                 : KCUDA_ATT_SPARSE,
                                           Q, qd, n, un->h0, un->h0 + un->nh,
                                           AP + (un->mode == ATT_SPARSE ? rec : 0), rec_tok,
                                           2 * rec, err, errlen);
            if (rc)
                return -1;
        }
        if (gpu_sync(gp, err, errlen))
            return -1;
        const float *att_in = ATT;
        if (x->n_split) {
            if (kcuda_copy2d(g, gp->attp, (size_t)qd * 4, ATT, (size_t)qd * 4, (size_t)qd * 4,
                             (size_t)n, err, errlen))
                return -1;
            kcuda_att_merge(g, AP, AP + rec, rec_tok, 2 * rec, gp->d_split, x->n_split, n, (int)hd,
                            gp->attp, qd);
            att_in = gp->attp;
        }
        if (kcuda_matmul(g, &L->wo, d0, d1, att_in, n, XB2, dim, err, errlen))
            return -1;
        kcuda_add_cols(g, X, XB2, n, dim, d0, d1);
        if (gpu_sync(gp, err, errlen))
            return -1;
        kcuda_rmsnorm(g, gp->xb, X, L->ffn_norm, (int)dim, n, c->norm_eps);
        if (kcuda_matmul(g, &L->w_gate, f0, f1, gp->xb, n, HG, ffn, err, errlen) ||
            kcuda_matmul(g, &L->w_up, f0, f1, gp->xb, n, HU, ffn, err, errlen))
            return -1;
        kcuda_silu_mul(g, HG + f0, HU + f0, n, ffn, f1 - f0);
        if (gpu_sync(gp, err, errlen))
            return -1;
        if (kcuda_matmul(g, &L->w_down, e0, e1, HG, n, XB2, dim, err, errlen))
            return -1;
        kcuda_add_cols(g, X, XB2, n, dim, e0, e1);
        if (gpu_sync(gp, err, errlen))
            return -1;
    }
    int from = b->logits_from < 0 ? 0 : b->logits_from;
    if (logits && from < n) {
        kcuda_rmsnorm(g, gp->xb, X + (int64_t)from * dim, gp->out_norm, (int)dim, n - from,
                      c->norm_eps);
        if (kcuda_matmul(g, &gp->lm_head, v0, v1, gp->xb, n - from, gpu_dev(gp, logits), c->vocab,
                         err, errlen))
            return -1;
    }
    return kcuda_sync(g, err, errlen);
}
