/*
 * model/medusa.c — load Medusa heads from their side GGUF, evaluate them, grow a draft tree.
 *
 * Loading binds every tensor as a view into the mapping (like the target's weights) after checking
 * it against the target: the file must say it is an "orochi-medusa" file, agree with the target on
 * dim and vocab, and hold exactly the tensors of K heads with the right shapes and supported
 * types, so a mismatched file fails at load with one line rather than producing nonsense logits.
 *
 * Evaluation uses the engine's own kernels (kmat_mul, k_rmsnorm), so a head whose residual is zero
 * gives exactly the target's logits for the same hidden state. The draft tree evaluates all heads
 * it needs in one call: heads that share the target's lm_head go through it as one batch of
 * tokens, which streams the (large) lm_head from memory once rather than once per head. All
 * scratch is per call, so one medusa can serve several threads.
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/medusa.h"

#define MEDUSA_ARCH "orochi-medusa"

/* all heads of a draft tree go through one kmat_mul batch */
_Static_assert(MEDUSA_MAX_HEADS <= KMAT_MAX_W, "a batch of heads must fit one matmul");

typedef struct {
    kmat res;          /* W_k: dim outputs x dim inputs */
    const float *bias; /* b_k (dim) or NULL */
    kmat out;          /* the head's own out.weight, or the target's lm_head */
    bool own_out;
} medusa_head;

struct medusa {
    gguf_file *file;
    const llama_model *target;
    int n_heads, dim, vocab;
    medusa_head *heads;
    char target_name[128];
};

/* ===== loading ===== */

typedef struct {
    const gguf_file *f;
    char *err;
    size_t errlen;
} medusa_loader;

/* One line "path: message" into err; returns -1 so callers can `return medusa_fail(...)`. */
static int medusa_fail(medusa_loader *ld, const char *fmt, ...)
{
    if (!ld->err || !ld->errlen)
        return -1;
    int n = snprintf(ld->err, ld->errlen, "%s: ", ld->f->path);
    if (n < 0 || (size_t)n >= ld->errlen)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ld->err + n, ld->errlen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static int medusa_check_meta(medusa_loader *ld, const llama_model *target, uint32_t *heads,
                             char *name, size_t name_len)
{
    gguf_str arch;
    if (!gguf_get_str(ld->f, "general.architecture", &arch))
        return medusa_fail(ld, "missing metadata key 'general.architecture' (expected '%s')",
                           MEDUSA_ARCH);
    if (!gguf_str_eq(arch, MEDUSA_ARCH))
        return medusa_fail(ld, "metadata key 'general.architecture' is '%.*s', expected '%s'",
                           (int)(arch.len > 64 ? 64 : arch.len), arch.ptr, MEDUSA_ARCH);
    uint32_t dim, vocab;
    if (!gguf_get_u32(ld->f, "medusa.head_count", heads))
        return medusa_fail(ld, "missing or invalid metadata key 'medusa.head_count'");
    if (*heads < 1 || *heads > MEDUSA_MAX_HEADS)
        return medusa_fail(ld, "metadata key 'medusa.head_count' is %u, must be 1..%d", *heads,
                           MEDUSA_MAX_HEADS);
    if (!gguf_get_u32(ld->f, "medusa.embedding_length", &dim))
        return medusa_fail(ld, "missing or invalid metadata key 'medusa.embedding_length'");
    if (dim != (uint32_t)target->cfg.dim)
        return medusa_fail(ld,
                           "metadata key 'medusa.embedding_length' is %u, the target's dim "
                           "is %d",
                           dim, target->cfg.dim);
    if (!gguf_get_u32(ld->f, "medusa.vocab_size", &vocab))
        return medusa_fail(ld, "missing or invalid metadata key 'medusa.vocab_size'");
    if (vocab != (uint32_t)target->cfg.vocab)
        return medusa_fail(ld, "metadata key 'medusa.vocab_size' is %u, the target's vocab is %d",
                           vocab, target->cfg.vocab);
    name[0] = 0;
    if (gguf_find(ld->f, "medusa.target")) {
        gguf_str s;
        if (!gguf_get_str(ld->f, "medusa.target", &s))
            return medusa_fail(ld, "metadata key 'medusa.target' must be a string");
        size_t n = s.len < name_len - 1 ? (size_t)s.len : name_len - 1;
        memcpy(name, s.ptr, n);
        name[n] = 0;
    }
    return 0;
}

/* Bind 2-D weight `name` of shape [cols, rows] (ggml order) as a kmat. A missing tensor is an
 * error only when `required`; then *found stays false. */
static int medusa_bind_mat(medusa_loader *ld, const char *name, int64_t cols, int64_t rows,
                           bool required, kmat *out, bool *found)
{
    const gguf_tensor *t = gguf_tensor_find(ld->f, name);
    *found = t != NULL;
    if (!t)
        return required ? medusa_fail(ld, "missing tensor '%s'", name) : 0;
    const kt_traits *tr = kt_traits_of(t->type);
    if (!tr || !tr->supported)
        return medusa_fail(ld,
                           "tensor '%s' has unsupported type %s (supported: " KT_SUPPORTED_LIST ")",
                           name, tr ? tr->name : "unknown");
    uint64_t ne1 = t->n_dims >= 2 ? t->ne[1] : 1;
    if (t->n_dims != 2 || t->ne[0] != (uint64_t)cols || ne1 != (uint64_t)rows)
        return medusa_fail(ld,
                           "tensor '%s' has shape [%llu, %llu] (%u dims), expected "
                           "[%lld, %lld]",
                           name, (unsigned long long)t->ne[0], (unsigned long long)ne1, t->n_dims,
                           (long long)cols, (long long)rows);
    size_t row_bytes = kt_row_bytes(t->type, (uint64_t)cols);
    if (!row_bytes)
        return medusa_fail(ld, "tensor '%s': row length %lld is not a multiple of the %s block",
                           name, (long long)cols, tr->name);
    size_t align = t->type == KT_F32 ? 4 : 2;
    if ((uintptr_t)t->data % align)
        return medusa_fail(ld, "tensor '%s' data is not %zu-byte aligned", name, align);
    char why[96];
    if (kt_check_matrix(t->type, t->data, rows, cols, row_bytes, why, sizeof why))
        return medusa_fail(ld, "tensor '%s' (%s): %s (a malformed block)", name, tr->name, why);
    *out = (kmat){
        .type = t->type, .rows = rows, .cols = cols, .row_bytes = row_bytes, .data = t->data};
    return 0;
}

static int medusa_bind_bias(medusa_loader *ld, const char *name, int64_t n, const float **out)
{
    const gguf_tensor *t = gguf_tensor_find(ld->f, name);
    *out = NULL;
    if (!t)
        return 0;
    if (t->type != KT_F32 || t->n_dims != 1 || t->ne[0] != (uint64_t)n)
        return medusa_fail(ld, "tensor '%s' must be F32 of shape [%lld]", name, (long long)n);
    if ((uintptr_t)t->data % 4)
        return medusa_fail(ld, "tensor '%s' data is not 4-byte aligned", name);
    *out = t->data;
    return 0;
}

/* Is `name` one of the tensors a K-head file may hold? */
static bool medusa_known_tensor(gguf_str name, int heads)
{
    static const char *const suffixes[] = {"res.weight", "res.bias", "out.weight"};
    char want[64];
    for (int k = 0; k < heads; k++)
        for (size_t s = 0; s < sizeof suffixes / sizeof suffixes[0]; s++) {
            snprintf(want, sizeof want, "medusa.%d.%s", k, suffixes[s]);
            if (gguf_str_eq(name, want))
                return true;
        }
    return false;
}

medusa *medusa_load(const char *path, const llama_model *target, char *err, size_t errlen)
{
    if (!path || !target) {
        if (err && errlen)
            snprintf(err, errlen, "medusa_load: NULL path or target");
        return NULL;
    }
    gguf_file *f = gguf_open(path, err, errlen);
    if (!f)
        return NULL;
    medusa *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(&f);
        if (err && errlen)
            snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    m->file = f;
    m->target = target;
    m->dim = target->cfg.dim;
    m->vocab = target->cfg.vocab;
    medusa_loader ld = {f, err, errlen};
    uint32_t heads;
    if (medusa_check_meta(&ld, target, &heads, m->target_name, sizeof m->target_name))
        goto fail;
    m->n_heads = (int)heads;
    m->heads = calloc(heads, sizeof *m->heads);
    if (!m->heads) {
        medusa_fail(&ld, "out of memory");
        goto fail;
    }
    for (int k = 0; k < m->n_heads; k++) {
        medusa_head *h = &m->heads[k];
        char name[64];
        bool found;
        snprintf(name, sizeof name, "medusa.%d.res.weight", k);
        if (medusa_bind_mat(&ld, name, m->dim, m->dim, true, &h->res, &found))
            goto fail;
        snprintf(name, sizeof name, "medusa.%d.res.bias", k);
        if (medusa_bind_bias(&ld, name, m->dim, &h->bias))
            goto fail;
        snprintf(name, sizeof name, "medusa.%d.out.weight", k);
        if (medusa_bind_mat(&ld, name, m->dim, m->vocab, false, &h->out, &found))
            goto fail;
        h->own_out = found;
        if (!found)
            h->out = target->lm_head;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_str name = f->tensors[i].name;
        if (!medusa_known_tensor(name, m->n_heads)) {
            medusa_fail(&ld,
                        "unexpected tensor '%.*s' (a %d-head file holds "
                        "medusa.<k>.res.weight, .res.bias, .out.weight for k < %d)",
                        (int)(name.len > 96 ? 96 : name.len), name.ptr, m->n_heads, m->n_heads);
            goto fail;
        }
    }
    return m;
fail:
    medusa_destroy(&m);
    return NULL;
}

void medusa_destroy(medusa **mp)
{
    if (!mp || !*mp)
        return;
    medusa *m = *mp;
    gguf_close(&m->file);
    free(m->heads);
    free(m);
    *mp = NULL;
}

int medusa_heads(const medusa *m)
{
    return m ? m->n_heads : 0;
}

int medusa_head_own_out(const medusa *m, int k)
{
    return m && k >= 0 && k < m->n_heads && m->heads[k].own_out;
}

const char *medusa_target_name(const medusa *m)
{
    return m ? m->target_name : "";
}

/* ===== evaluation ===== */

/* Logits of heads [first, first + n) for one hidden state into logits (n x vocab). Heads that
 * share the target's lm_head and are adjacent go through it as one batch. */
static int medusa_eval(const medusa *m, kpool *pool, int first, int n, const float *hidden,
                       float *logits)
{
    int64_t dim = m->dim, vocab = m->vocab;
    const llama_config *c = &m->target->cfg;
    float *u = malloc((size_t)dim * sizeof *u);
    float *zn = malloc((size_t)n * (size_t)dim * sizeof *zn);
    void *scratch = malloc(kmat_scratch_bytes(dim, n, kpool_threads(pool)));
    if (!u || !zn || !scratch) {
        free(u);
        free(zn);
        free(scratch);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        const medusa_head *h = &m->heads[first + i];
        kmat_mul(pool, &h->res, 0, dim, hidden, 1, u, dim, scratch);
        for (int64_t j = 0; j < dim; j++) {
            float a = h->bias ? u[j] + h->bias[j] : u[j];
            u[j] = hidden[j] + a / (1.0f + expf(-a)); /* z = h + silu(W h + b) */
        }
        k_rmsnorm(zn + i * dim, u, m->target->out_norm, (int)dim, c->norm_eps);
    }
    for (int i = 0; i < n;) {
        const medusa_head *h = &m->heads[first + i];
        int run = 1;
        if (!h->own_out)
            while (i + run < n && !m->heads[first + i + run].own_out)
                run++;
        kmat_mul(pool, &h->out, 0, vocab, zn + i * dim, run, logits + i * vocab, vocab, scratch);
        i += run;
    }
    free(u);
    free(zn);
    free(scratch);
    return 0;
}

int medusa_head_logits(const medusa *m, kpool *pool, int k, const float *hidden, float *logits)
{
    if (!m || k < 0 || k >= m->n_heads || !hidden || !logits)
        return -1;
    return medusa_eval(m, pool, k, 1, hidden, logits);
}

/* ===== draft tree ===== */

/* The k best tokens of one head's logits (highest first, ties to the lower id) with their softmax
 * probabilities. */
static void medusa_topk(const float *logits, int vocab, int k, int32_t *tok, float *prob)
{
    k_top(logits, vocab, k, tok);
    float mx = logits[tok[0]];
    double sum = 0;
    for (int v = 0; v < vocab; v++)
        sum += expf(logits[v] - mx);
    for (int j = 0; j < k; j++)
        prob[j] = (float)(expf(logits[tok[j]] - mx) / sum);
}

typedef struct {
    double score; /* path probability */
    int32_t p, c; /* parent's rank in the previous level, candidate rank */
} medusa_cand;

static int medusa_cand_cmp(const void *a, const void *b)
{
    const medusa_cand *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    if (x->p != y->p)
        return x->p < y->p ? -1 : 1;
    return (x->c > y->c) - (x->c < y->c);
}

int medusa_draft_shape(const medusa *m, kpool *pool, const float *hidden, const int32_t *sparent,
                       const int32_t *srank, int n_shape, int depth, int max_nodes, int32_t *tokens,
                       int32_t *parent, float *conf)
{
    if (!m || !hidden || n_shape < 0 || (n_shape > 0 && (!sparent || !srank)) || max_nodes < 0 ||
        (max_nodes > 0 && (!tokens || !parent || !conf)))
        return -1;
    int cap = n_shape < max_nodes ? n_shape : max_nodes, use = 0;
    int *dep = malloc(((size_t)cap + 1) * sizeof *dep),
        *out = malloc(((size_t)cap + 1) * sizeof *out);
    int kd[MEDUSA_MAX_HEADS] = {0};
    float *logits = NULL, *top_prob = NULL;
    int32_t *top_tok = NULL;
    int n_out = -1;
    if (!dep || !out)
        goto done;
    /* node i + 1 of the shape: its depth, and which heads (and how many candidates) it needs; a
     * node below the heads, the depth limit or a dropped parent is dropped with its subtree */
    dep[0] = 0;
    for (int i = 0; i < cap; i++) {
        int p = sparent[i], r = srank[i];
        if (p < 0 || p > i || r < 0) /* parents first */
            goto done;
        dep[i + 1] = p == 0 || dep[p] > 0 ? dep[p] + 1 : -1;
        if (dep[i + 1] > depth || dep[i + 1] > m->n_heads || r >= m->vocab)
            dep[i + 1] = -1;
        if (dep[i + 1] > 0) {
            int d = dep[i + 1] - 1;
            kd[d] = r + 1 > kd[d] ? r + 1 : kd[d];
            use = d + 1 > use ? d + 1 : use;
        }
    }
    n_out = 0;
    if (!use)
        goto done;
    size_t n_top = 0, off[MEDUSA_MAX_HEADS];
    for (int d = 0; d < use; d++) {
        off[d] = n_top;
        n_top += (size_t)kd[d];
    }
    logits = malloc((size_t)use * (size_t)m->vocab * sizeof *logits);
    top_tok = malloc(n_top * sizeof *top_tok);
    top_prob = malloc(n_top * sizeof *top_prob);
    if (!logits || !top_tok || !top_prob || medusa_eval(m, pool, 0, use, hidden, logits)) {
        n_out = -1;
        goto done;
    }
    for (int d = 0; d < use; d++)
        if (kd[d])
            medusa_topk(logits + (size_t)d * (size_t)m->vocab, m->vocab, kd[d], top_tok + off[d],
                        top_prob + off[d]);
    /* emitted level by level; under each parent (in emission order) its children by rank, so a
     * node's rank among its siblings in the draft is its rank in the shape. out[i]: node i's
     * index in the draft (-1: the root, -2: dropped) */
    out[0] = -1;
    for (int i = 1; i <= cap; i++)
        out[i] = -2;
    int prev_lo = -1, prev_hi = 0; /* the previous level's draft indices ([-1, 0): the root) */
    for (int d = 1; d <= use; d++) {
        int lo = n_out;
        for (int pe = prev_lo; pe < prev_hi; pe++) {
            for (;;) { /* the unemitted child of pe with the lowest rank */
                int best = 0;
                for (int i = 1; i <= cap; i++)
                    if (dep[i] == d && out[i] == -2 && out[sparent[i - 1]] == pe &&
                        (!best || srank[i - 1] < srank[best - 1]))
                        best = i;
                if (!best)
                    break;
                int r = srank[best - 1];
                bool dup = n_out > lo && parent[n_out - 1] == pe &&
                           tokens[n_out - 1] == top_tok[off[d - 1] + (size_t)r];
                if (dup) { /* the same rank twice under one parent: siblings never share a token */
                    dep[best] = -1;
                    continue;
                }
                out[best] = n_out;
                tokens[n_out] = top_tok[off[d - 1] + (size_t)r];
                conf[n_out] = top_prob[off[d - 1] + (size_t)r];
                parent[n_out] = pe;
                n_out++;
            }
        }
        prev_lo = lo;
        prev_hi = n_out;
    }
done:
    free(dep);
    free(out);
    free(logits);
    free(top_tok);
    free(top_prob);
    return n_out;
}

int medusa_draft_tree(const medusa *m, kpool *pool, const float *hidden, const int *tmpl, int depth,
                      int max_nodes, int32_t *tokens, int32_t *parent, float *conf)
{
    if (!m || !hidden || (depth > 0 && !tmpl) || max_nodes < 0 ||
        (max_nodes > 0 && (!tokens || !parent || !conf)))
        return -1;
    /* how many heads the tree reaches, and the width each level can use */
    int kd[MEDUSA_MAX_HEADS];
    int use = 0;
    int64_t level = 1, total = 0;
    for (int d = 0; d < depth && d < m->n_heads && total < max_nodes; d++) {
        if (tmpl[d] <= 0)
            break;
        int k = tmpl[d] < m->vocab ? tmpl[d] : m->vocab;
        k = k < max_nodes ? k : max_nodes;
        kd[use++] = k;
        level = level * k < max_nodes ? level * k : max_nodes;
        total += level;
    }
    if (!use)
        return 0;
    int cap = total < max_nodes ? (int)total : max_nodes;

    int64_t vocab = m->vocab;
    size_t n_top = 0;
    for (int d = 0; d < use; d++)
        n_top += (size_t)kd[d];
    float *logits = malloc((size_t)use * (size_t)vocab * sizeof *logits);
    int32_t *top_tok = malloc(n_top * sizeof *top_tok);
    float *top_prob = malloc(n_top * sizeof *top_prob);
    int32_t *prev = malloc(((size_t)cap + 1) * sizeof *prev);
    double *prev_score = malloc(((size_t)cap + 1) * sizeof *prev_score);
    medusa_cand *cand = NULL;
    int n_out = -1;
    if (!logits || !top_tok || !top_prob || !prev || !prev_score)
        goto done;
    if (medusa_eval(m, pool, 0, use, hidden, logits))
        goto done;
    size_t off = 0;
    for (int d = 0; d < use; d++) {
        medusa_topk(logits + d * vocab, (int)vocab, kd[d], top_tok + off, top_prob + off);
        off += (size_t)kd[d];
    }

    /* Level by level. The previous level is sorted by path probability and each head's
     * candidates by probability, so pair (p, c) is preceded by every (p' <= p, c' <= c): it can be
     * among the best R only if (p + 1) * (c + 1) <= R. That bounds the pairs looked at by
     * R * (1 + ln R) whatever the template. */
    n_out = 0;
    int n_prev = 1;
    prev[0] = -1;
    prev_score[0] = 1.0;
    off = 0;
    for (int d = 0; d < use && n_out < max_nodes; d++) {
        int64_t R = max_nodes - n_out, n_cand = 0;
        for (int p = 0; p < n_prev && p < R; p++)
            for (int c = 0; c < kd[d] && (int64_t)(p + 1) * (c + 1) <= R; c++)
                n_cand++;
        medusa_cand *nc = realloc(cand, (size_t)n_cand * sizeof *cand);
        if (!nc) {
            n_out = -1;
            goto done;
        }
        cand = nc;
        n_cand = 0;
        for (int p = 0; p < n_prev && p < R; p++)
            for (int c = 0; c < kd[d] && (int64_t)(p + 1) * (c + 1) <= R; c++)
                cand[n_cand++] = (medusa_cand){prev_score[p] * top_prob[off + (size_t)c], p, c};
        qsort(cand, (size_t)n_cand, sizeof *cand, medusa_cand_cmp);
        int emit = n_cand < R ? (int)n_cand : (int)R;
        for (int i = 0; i < emit; i++) {
            int node = n_out + i;
            tokens[node] = top_tok[off + (size_t)cand[i].c];
            parent[node] = prev[cand[i].p];
            conf[node] = top_prob[off + (size_t)cand[i].c];
        }
        /* the emitted level becomes the previous one (in emission order, so sorted) */
        for (int i = 0; i < emit; i++) {
            prev_score[i] = cand[i].score;
            prev[i] = n_out + i;
        }
        n_prev = emit;
        n_out += emit;
        off += (size_t)kd[d];
    }
done:
    free(logits);
    free(top_tok);
    free(top_prob);
    free(prev);
    free(prev_score);
    free(cand);
    return n_out;
}
