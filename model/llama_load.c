/*
 * model/llama_load.c — a model from a GGUF file (interface: model/llama.h): the architecture's
 * keys read and checked, the matrices bound to the file's mapping and packed (through the shared
 * pack cache, model/packcache.h), the activation precision, the screening head and the layers a
 * layerskip drafter keeps. The forward: model/llama.c; the partition plans:
 * model/llama_partition.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/llama_internal.h"


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
        snprintf(ld->err, ld->errlen,
                 "%s: tensor '%s' has unsupported type %s (supported: " KT_SUPPORTED_LIST ")",
                 ld->f->path, name, tr ? tr->name : "unknown");
        return -1;
    }
    uint64_t ne1 = t->n_dims >= 2 ? t->ne[1] : 1;
    if (t->ne[0] != (uint64_t)cols || ne1 != (uint64_t)rows || t->n_dims > 2) {
        snprintf(ld->err, ld->errlen,
                 "%s: tensor '%s' has shape [%llu, %llu], expected [%lld, %lld]", ld->f->path, name,
                 (unsigned long long)t->ne[0], (unsigned long long)ne1, (long long)cols,
                 (long long)rows);
        return -1;
    }
    if (tr->block > 1 && cols % tr->block) {
        snprintf(ld->err, ld->errlen,
                 "%s: tensor '%s': row length %lld is not a multiple of %d (the %s block)",
                 ld->f->path, name, (long long)cols, tr->block, tr->name);
        return -1;
    }
    *out = (kmat){.type = t->type,
                  .rows = rows,
                  .cols = cols,
                  .row_bytes = kt_row_bytes(t->type, (uint64_t)cols),
                  .data = t->data};
    char why[96];
    if (kt_check_matrix(t->type, t->data, rows, cols, out->row_bytes, why, sizeof why)) {
        snprintf(ld->err, ld->errlen, "%s: tensor '%s' (%s): %s (a malformed block)", ld->f->path,
                 name, tr->name, why);
        return -1;
    }
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
        snprintf(ld->err, ld->errlen, "%s: tensor '%s' data is not 4-byte aligned", ld->f->path,
                 name);
        return -1;
    }
    *out = t->data;
    return 0;
}

/* Metadata keys (after "ARCH.") that change the computation in ways orochi does not implement:
 * a file carrying one is refused, naming it, rather than run with a different result. */
static const struct {
    const char *suffix, *what;
} llama_refused_keys[] = {
    {"attention.sliding_window", "sliding-window attention"},
    {"attn_logit_softcapping", "attention logit soft-capping"},
    {"final_logit_softcapping", "final logit soft-capping"},
    {"attention.clamp_kqv", "clamped q/k/v"},
    {"attention.layer_norm_epsilon", "LayerNorm (orochi computes RMSNorm)"},
    {"attention.scale", "a custom attention scale"},
    {"logit_scale", "scaled logits"},
    {"embedding_scale", "a scaled embedding"},
    {"residual_scale", "scaled residuals"},
    {"expert_count", "mixture of experts"},
    {"rope.scaling.yarn_log_multiplier", "YaRN's log multiplier"},
    {"attention.value_length_mla", "multi-head latent attention"},
};

/* A float key ARCH.suffix, or dflt. */
static float load_f32(llama_loader *ld, const char *arch, const char *suffix, float dflt)
{
    char key[128];
    float v;
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return gguf_get_f32(ld->f, key, &v) ? v : dflt;
}

static int load_config(llama_loader *ld, llama_config *c)
{
    gguf_str arch_s;
    char arch[64];
    if (!gguf_get_str(ld->f, "general.architecture", &arch_s) || arch_s.len >= sizeof arch) {
        snprintf(ld->err, ld->errlen, "%s: missing metadata key 'general.architecture'",
                 ld->f->path);
        return -1;
    }
    memcpy(arch, arch_s.ptr, arch_s.len);
    arch[arch_s.len] = 0;
    if (!strcmp(arch, "llama"))
        c->arch = LLAMA_ARCH_LLAMA;
    else if (!strcmp(arch, "qwen2"))
        c->arch = LLAMA_ARCH_QWEN2;
    else if (!strcmp(arch, "qwen3"))
        c->arch = LLAMA_ARCH_QWEN3;
    else {
        snprintf(ld->err, ld->errlen,
                 "%s: architecture '%s' is not supported (orochi runs llama, qwen2 and qwen3)",
                 ld->f->path, arch);
        return -1;
    }
    for (size_t i = 0; i < sizeof llama_refused_keys / sizeof llama_refused_keys[0]; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s.%s", arch, llama_refused_keys[i].suffix);
        const gguf_kv *kv = gguf_find(ld->f, key);
        uint32_t u;
        /* a zero expert count or sliding window is the plain model */
        if (kv && !(gguf_get_u32(ld->f, key, &u) && u == 0)) {
            snprintf(ld->err, ld->errlen, "%s: metadata key '%s' asks for %s, which orochi does not "
                     "compute", ld->f->path, key, llama_refused_keys[i].what);
            return -1;
        }
    }
    uint32_t layers, dim, ffn, heads, kv_heads, ctx, rot, vocab = 0, klen, vlen;
    if (load_u32(ld, arch, "block_count", &layers, true, 0) ||
        load_u32(ld, arch, "embedding_length", &dim, true, 0) ||
        load_u32(ld, arch, "feed_forward_length", &ffn, true, 0) ||
        load_u32(ld, arch, "attention.head_count", &heads, true, 0) ||
        load_u32(ld, arch, "attention.head_count_kv", &kv_heads, false, heads) ||
        load_u32(ld, arch, "context_length", &ctx, false, 2048))
        return -1;
    if (!layers || !dim || !ffn || !heads || !kv_heads || layers > 4096 || dim > 65536 ||
        ffn > 1048576 || heads > 1024 || heads % kv_heads) {
        snprintf(ld->err, ld->errlen,
                 "%s: inconsistent shape: layers %u dim %u ffn %u heads %u "
                 "kv_heads %u",
                 ld->f->path, layers, dim, ffn, heads, kv_heads);
        return -1;
    }
    /* the head size: attention.key_length where the file gives it (Qwen3, Mistral Nemo), else
     * dim / heads; the values' must be the keys' */
    if (load_u32(ld, arch, "attention.key_length", &klen, false, dim % heads ? 0 : dim / heads) ||
        load_u32(ld, arch, "attention.value_length", &vlen, false, klen))
        return -1;
    if (!klen || klen != vlen) {
        snprintf(ld->err, ld->errlen,
                 "%s: head size: key_length %u, value_length %u, dim %u over %u heads (orochi "
                 "needs one head size for keys and values)",
                 ld->f->path, klen, vlen, dim, heads);
        return -1;
    }
    if (load_u32(ld, arch, "rope.dimension_count", &rot, false, klen))
        return -1;
    const gguf_tensor *emb = gguf_tensor_find(ld->f, "token_embd.weight");
    if (!emb || emb->n_dims != 2 || emb->ne[1] == 0 || emb->ne[1] > (1u << 24)) {
        snprintf(ld->err, ld->errlen, "%s: missing or malformed tensor 'token_embd.weight'",
                 ld->f->path);
        return -1;
    }
    vocab = (uint32_t)emb->ne[1];
    c->n_layers = (int)layers;
    c->dim = (int)dim;
    c->ffn = (int)ffn;
    c->n_heads = (int)heads;
    c->n_kv_heads = (int)kv_heads;
    c->head_dim = (int)klen;
    c->rot_dim = (int)rot;
    c->vocab = (int)vocab;
    c->ctx = (int)ctx;
    if (c->head_dim > 512 || rot > (uint32_t)c->head_dim || rot % 2 || rot == 0) {
        snprintf(ld->err, ld->errlen, "%s: head size %d with %u rotary dimensions not supported "
                 "(at most 512, rotary dimensions even and at most the head size)",
                 ld->f->path, c->head_dim, rot);
        return -1;
    }
    c->rope_base = load_f32(ld, arch, "rope.freq_base", 10000.0f);
    c->norm_eps = load_f32(ld, arch, "attention.layer_norm_rms_epsilon", 1e-5f);
    c->rope_neox = c->arch != LLAMA_ARCH_LLAMA;
    /* rope scaling: rope.scaling.type (none, linear, yarn) with its factor, or the older
     * rope.scale_linear; Llama 3.1's per-pair factors come as the tensor rope_freqs.weight */
    char key[128];
    gguf_str st;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    c->rope_scaling = LLAMA_ROPE_NONE;
    c->rope_factor = load_f32(ld, arch, "rope.scaling.factor", 1.0f);
    if (gguf_get_str(ld->f, key, &st)) {
        if (st.len == 4 && !memcmp(st.ptr, "none", 4))
            c->rope_scaling = LLAMA_ROPE_NONE;
        else if (st.len == 6 && !memcmp(st.ptr, "linear", 6))
            c->rope_scaling = LLAMA_ROPE_LINEAR;
        else if (st.len == 4 && !memcmp(st.ptr, "yarn", 4))
            c->rope_scaling = LLAMA_ROPE_YARN;
        else {
            snprintf(ld->err, ld->errlen,
                     "%s: rope scaling type '%.*s' is not supported (none, linear, yarn)",
                     ld->f->path, (int)(st.len > 32 ? 32 : st.len), st.ptr);
            return -1;
        }
    } else if (load_f32(ld, arch, "rope.scale_linear", 1.0f) != 1.0f) {
        c->rope_scaling = LLAMA_ROPE_LINEAR;
        c->rope_factor = load_f32(ld, arch, "rope.scale_linear", 1.0f);
    }
    if (c->rope_scaling != LLAMA_ROPE_NONE && !(c->rope_factor > 0.0f)) {
        snprintf(ld->err, ld->errlen, "%s: rope scaling factor %g", ld->f->path,
                 (double)c->rope_factor);
        return -1;
    }
    c->yarn_attn = load_f32(ld, arch, "rope.scaling.attn_factor", 1.0f);
    uint32_t orig;
    if (load_u32(ld, arch, "rope.scaling.original_context_length", &orig, false, ctx))
        return -1;
    c->yarn_orig_ctx = (int)orig;
    if (gguf_tensor_find(ld->f, "rope_freqs.weight")) {
        if (c->rope_scaling != LLAMA_ROPE_NONE) {
            snprintf(ld->err, ld->errlen, "%s: both rope_freqs.weight and a rope scaling type",
                     ld->f->path);
            return -1;
        }
        c->rope_scaling = LLAMA_ROPE_LLAMA3;
    }
    return 0;
}

/* Every tensor of the file is one the model reads: a block's tensor orochi would not apply (a
 * bias of the FFN, a norm it does not compute) fails the load, naming it. */
static int check_tensor_names(llama_loader *ld, const llama_config *c)
{
    static const char *const top[] = {"token_embd.weight", "output_norm.weight", "output.weight",
                                      "rope_freqs.weight"};
    static const char *const blk[] = {
        "attn_norm.weight",   "ffn_norm.weight",   "attn_q.weight",     "attn_k.weight",
        "attn_v.weight",      "attn_output.weight", "ffn_gate.weight",  "ffn_up.weight",
        "ffn_down.weight",    "attn_q.bias",       "attn_k.bias",       "attn_v.bias",
        "attn_output.bias",   "attn_q_norm.weight", "attn_k_norm.weight", "attn_rot_embd"};
    for (uint64_t i = 0; i < ld->f->n_tensors; i++) {
        const gguf_str *n = &ld->f->tensors[i].name;
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)(n->len > 90 ? 90 : n->len), n->ptr);
        bool ok = false;
        for (size_t k = 0; k < sizeof top / sizeof top[0] && !ok; k++)
            ok = !strcmp(name, top[k]);
        int layer = -1, at = 0;
        if (!ok && sscanf(name, "blk.%d.%n", &layer, &at) == 1 && at > 0 && layer >= 0 &&
            layer < c->n_layers)
            for (size_t k = 0; k < sizeof blk / sizeof blk[0] && !ok; k++)
                ok = !strcmp(name + at, blk[k]);
        /* the per-head q/k norms belong to qwen3 */
        if (ok && c->arch != LLAMA_ARCH_QWEN3 && strstr(name, "_norm.weight") &&
            (strstr(name, "attn_q_norm") || strstr(name, "attn_k_norm")))
            ok = false;
        if (!ok) {
            snprintf(ld->err, ld->errlen, "%s: tensor '%s' is not part of the %s model orochi "
                     "computes (it would be ignored, changing the result)", ld->f->path, name,
                     c->arch == LLAMA_ARCH_QWEN3 ? "qwen3" : c->arch == LLAMA_ARCH_QWEN2 ? "qwen2"
                                                                                         : "llama");
            return -1;
        }
    }
    return 0;
}

/* An optional F32 vector of n (a bias, a norm weight): *out NULL when absent. */
static int load_opt_vec(llama_loader *ld, const char *name, int64_t n, const float **out)
{
    *out = NULL;
    return gguf_tensor_find(ld->f, name) ? load_norm(ld, name, n, out) : 0;
}

int llama_read_config(const char *path, llama_config *c, char *err, size_t errlen)
{
    gguf_file *f = gguf_open(path, err, errlen);
    if (!f)
        return -1;
    llama_loader ld = {f, err, errlen};
    int rc = load_config(&ld, c);
    gguf_close(&f);
    return rc;
}

bool llama_config_same_kv(const llama_config *a, const llama_config *b)
{
    return a->n_layers == b->n_layers && a->dim == b->dim && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
           a->rot_dim == b->rot_dim && a->rope_base == b->rope_base &&
           a->rope_neox == b->rope_neox && a->rope_scaling == b->rope_scaling &&
           a->rope_factor == b->rope_factor;
}

static int llama_model_pack(llama_model *m, const char *path, char *err, size_t errlen);

static llama_model *llama_model_open(const char *path, bool pack, char *err, size_t errlen)
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
    m->identity = packcache_identity(path);
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
#define LAYER_T(field, suffix, fn, ...)                                                            \
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, suffix);                                    \
    if (fn(&ld, name, __VA_ARGS__, &L->field))                                                     \
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
#define LAYER_V(field, suffix, n)                                                                  \
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);                                           \
    if (load_opt_vec(&ld, name, n, &L->field))                                                     \
        goto fail;
        LAYER_V(bq, "attn_q.bias", qd)
        LAYER_V(bk, "attn_k.bias", kvd)
        LAYER_V(bv, "attn_v.bias", kvd)
        LAYER_V(bo, "attn_output.bias", c->dim)
        LAYER_V(q_norm, "attn_q_norm.weight", c->head_dim)
        LAYER_V(k_norm, "attn_k_norm.weight", c->head_dim)
#undef LAYER_V
        if (c->arch == LLAMA_ARCH_QWEN3 && (!L->q_norm || !L->k_norm)) {
            snprintf(err, errlen, "%s: qwen3 layer %d lacks its attn_q_norm / attn_k_norm",
                     path, l);
            goto fail;
        }
    }
    if (c->rope_scaling == LLAMA_ROPE_LLAMA3 &&
        load_norm(&ld, "rope_freqs.weight", c->rot_dim / 2, &m->rope_factors))
        goto fail;
    if (check_tensor_names(&ld, c))
        goto fail;
    if (pack && llama_model_pack(m, path, err, errlen))
        goto fail;
    return m;
fail:
    llama_model_destroy(&m);
    return NULL;
}

llama_model *llama_model_load(const char *path, char *err, size_t errlen)
{
    return llama_model_open(path, true, err, errlen);
}

llama_model *llama_model_load_unpacked(const char *path, char *err, size_t errlen)
{
    return llama_model_open(path, false, err, errlen);
}

/* Every quantized matrix repacked into the matmul's 16-row group layout (kernels/cpu/mm_isa.h).
 * The packed copy is what every step streams, so the file's pages of those matrices are dropped
 * from this process's resident set (they stay in the page cache; the embedding rows, read one at
 * a time for lookups, fault back in as needed). */
static void mat_drop_pages(const kmat *w)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)w->data + page - 1) & ~(page - 1);
    uintptr_t b = ((uintptr_t)w->data + (size_t)w->rows * w->row_bytes) & ~(page - 1);
    if (w->packed && b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

/* the model's matrices in the order a step reads them (layer by layer, then the lm_head) */
static int model_mats(llama_model *m, kmat **mats)
{
    int n = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        llama_layer *L = &m->layers[l];
        kmat *ms[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            mats[n++] = ms[i];
    }
    mats[n++] = &m->lm_head;
    return n;
}

typedef struct {
    kmat **mats;
    const size_t *off;
    int n;
    const char *path; /* the model file, for progress lines */
} pack_job;

static void pack_fill(void *dst, size_t len, void *arg)
{
    const pack_job *j = arg;
    kpool *pool = kpool_new((int)sysconf(_SC_NPROCESSORS_ONLN));
    int told = 0;
    for (int i = 0; i < j->n; i++) {
        kmat_pack_into(pool, j->mats[i], (uint8_t *)dst + j->off[i]);
        int pct = (int)(100.0 * (double)(j->off[i] + kmat_packed_bytes(j->mats[i])) / (double)len);
        if (len >= ((size_t)1 << 30) && pct >= told + 25 && i + 1 < j->n) { /* long work: say so */
            fprintf(stderr, "orochi: packing %s: %d%%\n", j->path, pct);
            told = pct / 25 * 25;
        }
    }
    kpool_destroy(&pool);
}

static int llama_model_pack(llama_model *m, const char *path, char *err, size_t errlen)
{
    /* every matrix in the order a step reads it, in one block (a decode step is then one long
     * sequential stream), made once per machine and mapped shared (model/packcache.h) */
    int cap = 7 * m->cfg.n_layers + 1;
    kmat **mats = malloc((size_t)cap * sizeof *mats);
    size_t *off = malloc((size_t)cap * sizeof *off);
    uint64_t *desc = malloc((size_t)cap * 4 * sizeof *desc);
    int rc = -1;
    if (!mats || !off || !desc) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    int n = model_mats(m, mats);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        off[i] = total;
        desc[4 * i] = mats[i]->type;
        desc[4 * i + 1] = (uint64_t)mats[i]->rows;
        desc[4 * i + 2] = (uint64_t)mats[i]->cols;
        desc[4 * i + 3] = total;
        total += (kmat_packed_bytes(mats[i]) + 63) & ~(size_t)63;
    }
    pack_job job = {mats, off, n, path};
    if (packcache_get(path, m->identity, desc, (size_t)n * 4 * sizeof *desc, total, pack_fill,
                      &job, &m->pack, err, errlen))
        goto done;
    for (int i = 0; i < n; i++) {
        if (!kmat_packed_bytes(mats[i]))
            continue;
        kmat_set_packed(mats[i], (uint8_t *)m->pack.base + off[i]);
        if (mats[i] != &m->lm_head || !m->tied)
            mat_drop_pages(mats[i]);
    }
    rc = 0;
done:
    free(mats);
    free(off);
    free(desc);
    return rc;
}

/* The precision LLAMA_ACT_AUTO gives a matrix of this type: 8 bits for the K-quants (256-element
 * super-blocks), 16 for the rest. */
static uint8_t act_bits_auto(uint32_t type)
{
    const kt_traits *t = kt_traits_of(type);
    return t && t->block == KT_KBLOCK ? KMAT_ACT8 : KMAT_ACT16;
}

int llama_model_set_act_bits(llama_model *m, int bits, char *err, size_t errlen)
{
    if (bits != KMAT_ACT8 && bits != KMAT_ACT16 && bits != LLAMA_ACT_AUTO) {
        snprintf(err, errlen, "activation precision %d bits: must be 8, 16 or auto", bits);
        return -1;
    }
    kmat *top[3] = {&m->tok_embd, &m->lm_head, &m->lm_screen};
    for (int l = 0; l < m->cfg.n_layers; l++) {
        llama_layer *L = &m->layers[l];
        kmat *ms[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            ms[i]->act_bits = bits == LLAMA_ACT_AUTO ? act_bits_auto(ms[i]->type) : (uint8_t)bits;
    }
    for (int i = 0; i < 3; i++)
        top[i]->act_bits = bits == LLAMA_ACT_AUTO ? act_bits_auto(top[i]->type) : (uint8_t)bits;
    return 0;
}

int llama_act_bits_parse(const char *s)
{
    if (!strcmp(s, "8"))
        return KMAT_ACT8;
    if (!strcmp(s, "16"))
        return KMAT_ACT16;
    if (!strcmp(s, "auto"))
        return LLAMA_ACT_AUTO;
    return -1;
}

const char *llama_act_bits_name(int bits)
{
    return bits == KMAT_ACT8 ? "8" : bits == KMAT_ACT16 ? "16" : "auto";
}

static void llama_layer_unpack(llama_layer *L)
{
    kmat *mats[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    for (int i = 0; i < 7; i++)
        kmat_unpack(mats[i]);
}

void llama_model_destroy(llama_model **model)
{
    llama_model *m = *model;
    if (!m)
        return;
    kmat_unpack(&m->lm_head);
    kmat_unpack(&m->lm_screen);
    free(m->screen_data);
    for (int l = 0; m->layers && l < m->cfg.n_layers; l++)
        llama_layer_unpack(&m->layers[l]);
    packcache_release(&m->pack);
    gguf_close(&m->file);
    free(m->layers);
    free(m);
    *model = NULL;
}

int llama_model_screen_head(llama_model *m, uint32_t type, char *err, size_t errlen)
{
    const kmat *h = m->tied ? &m->tok_embd : &m->lm_head;
    if ((type != KT_Q4_0 && type != KT_Q4_1) || h->cols % 32) {
        snprintf(err, errlen, "screening head: type %u is not Q4_0/Q4_1, or %lld columns are not "
                              "whole blocks", type, (long long)h->cols);
        return -1;
    }
    size_t rb = kt_row_bytes(type, (uint64_t)h->cols);
    uint8_t *data = malloc(rb * (size_t)h->rows);
    float *row = malloc((size_t)h->cols * sizeof *row);
    if (!data || !row) {
        free(data);
        free(row);
        snprintf(err, errlen, "screening head: out of memory");
        return -1;
    }
    for (int64_t r = 0; r < h->rows; r++) {
        kmat_row(h, r, row);
        kt_quantize_row(type, row, data + (size_t)r * rb, h->cols);
    }
    free(row);
    kmat_unpack(&m->lm_screen);
    free(m->screen_data);
    m->screen_data = data;
    m->lm_screen =
        (kmat){.type = type, .rows = h->rows, .cols = h->cols, .row_bytes = rb, .data = data};
    kpool *pool = kpool_new((int)sysconf(_SC_NPROCESSORS_ONLN));
    int rc = pool ? kmat_pack(pool, &m->lm_screen) : -1;
    kpool_destroy(&pool);
    if (rc)
        snprintf(err, errlen, "screening head: out of memory packing it");
    return rc;
}

int llama_model_keep_layers(llama_model *m, const int *layers, int n, char *err, size_t errlen)
{
    if (n < 1 || n > m->cfg.n_layers) {
        snprintf(err, errlen, "layer list of %d entries: need 1..%d", n, m->cfg.n_layers);
        return -1;
    }
    llama_layer *kept = malloc((size_t)n * sizeof *kept);
    if (!kept) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (layers[i] < 0 || layers[i] >= m->cfg.n_layers) {
            snprintf(err, errlen, "layer %d does not exist (the model has %d)", layers[i],
                     m->cfg.n_layers);
            free(kept);
            return -1;
        }
        kept[i] = m->layers[layers[i]];
    }
    /* the packed rows live in the model's one block (m->pack): a layer listed twice shares
     * them, and layers left out keep theirs there until the model goes */
    free(m->layers);
    m->layers = kept;
    m->cfg.n_layers = n;
    return 0;
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
