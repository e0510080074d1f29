/*
 * model/llama.c — the Llama forward over a token tree, with a committed KV prefix: the context
 * (its state, the shared block's layout) and the forward. Loading: model/llama_load.c; partition
 * plans: model/llama_partition.c.
 *
 * Layout of the state (one llama_ctx per sequence):
 *   - per layer, K and V for `n_ctx` prefix positions (per sequence slot) and `max_width` tree
 *     slots, head-major: each KV head's rows of head_dim elements (f32 or f16) are contiguous;
 *   - activations for max_width tokens (x, normed x, q, k, v, attention output, ffn hidden);
 *   - per tree token, its ancestor list inside the tree (itself included): the sparse part of the
 *     tree mask in COO form.
 * A tree is the tokens of one fresh batch plus those of the batches appended to it since; an
 * appended batch's token i lives in tree slot (tree size before it) + i, so its K/V land next to
 * the earlier nodes' and its ancestor list, built from its parent's, names their slots. Activations
 * are per batch. Attention reads the same rows in the same order either way, which is why a tree
 * grown by appends has bit-identical logits to the same tree run at once.
 * A step reads like the math: embed -> per layer (rmsnorm -> q,k,v -> rope -> store K/V in the
 * tree area -> attention over prefix + ancestors -> wo -> residual -> rmsnorm -> gate/up ->
 * silu*mul -> down -> residual) -> final norm -> lm_head.
 *
 * Column split: a context can be one part of n_parts (one per worker process). Every linear layer
 * is then computed only for the part's output rows, attention only for the part's query heads —
 * the dense (prefix) and sparse (tree) parts of each head possibly on different parts — as a
 * partition plan says (llama_partition; by default each part its KV heads and their query heads),
 * and the parts meet at four synchronisation points per layer (after attention, after the wo
 * residual, after gate/up, after the down residual), five when attention reads projections
 * another part made, through the sync callback — an arena barrier between processes, a pthread
 * barrier between threads, nothing for a single part. The shared state (KV cache and the
 * activations other parts read) lives in one block whose layout llama_shared_layout describes, so
 * it can sit in a shared-memory arena. No all-reduce: every value is computed by exactly one part,
 * the same way whatever the plan, so any split gives bit-identical logits — except a head whose
 * dense and sparse parts are on different parts, whose two partials are merged by online softmax.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/llama_internal.h"


/* ===== context ===== */

static long online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : 1;
}

static size_t sh_align(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

size_t llama_shared_layout(const llama_config *c, int n_ctx, int max_width, int n_seq, kv_type kv,
                           llama_shared *offsets)
{
    size_t W = (size_t)max_width, qd = (size_t)c->n_heads * c->head_dim;
    size_t kv_row = (size_t)c->n_kv_heads * c->head_dim, esz = kv == KV_F16 ? 2 : 4;
    if (n_seq < 1)
        n_seq = 1;
    size_t layer_kv = sh_align(((size_t)n_seq * (size_t)n_ctx + W) * kv_row * esz);
    size_t off = 0;
    llama_shared o = {0};
#define SH_PLACE(field, bytes)                                                                     \
    o.field##_off = off;                                                                           \
    off += sh_align(bytes);
    SH_PLACE(kv, 2 * layer_kv * (size_t)c->n_layers)
    SH_PLACE(x, W * (size_t)c->dim * 4)
    SH_PLACE(q, W * qd * 4)
    SH_PLACE(att, W * qd * 4)
    SH_PLACE(xb2, W * (size_t)c->dim * 4)
    SH_PLACE(hg, W * (size_t)c->ffn * 4)
    SH_PLACE(hu, W * (size_t)c->ffn * 4)
    SH_PLACE(kk, W * kv_row * 4)
    SH_PLACE(vv, W * kv_row * 4)
    SH_PLACE(ap, W * (size_t)c->n_heads * 2 * ((size_t)c->head_dim + 2) * 4)
    SH_PLACE(mp, (size_t)LLAMA_MAX_PARTS * W * (size_t)c->dim * 4)
    SH_PLACE(epoch, (size_t)n_seq * 4)
    SH_PLACE(lend, (size_t)n_seq * 8)
#undef SH_PLACE
    o.layer_kv_bytes = layer_kv;
    if (offsets)
        *offsets = o;
    return off;
}

void llama_shared_bind(llama_shared *sh, void *base, const llama_config *c, int n_ctx,
                       int max_width, int n_seq, kv_type kv)
{
    llama_shared_layout(c, n_ctx, max_width, n_seq, kv, sh);
    uint8_t *b = base;
    sh->base = base;
    sh->kv = b + sh->kv_off;
    sh->x = (float *)(b + sh->x_off);
    sh->q = (float *)(b + sh->q_off);
    sh->att = (float *)(b + sh->att_off);
    sh->xb2 = (float *)(b + sh->xb2_off);
    sh->hg = (float *)(b + sh->hg_off);
    sh->hu = (float *)(b + sh->hu_off);
    sh->kk = (float *)(b + sh->kk_off);
    sh->vv = (float *)(b + sh->vv_off);
    sh->ap = (float *)(b + sh->ap_off);
    sh->mp = (float *)(b + sh->mp_off);
    sh->epoch = (uint32_t *)(b + sh->epoch_off);
    sh->lend = (int32_t *)(b + sh->lend_off);
}

/* The rows slot seq borrows (the shared block's lend table), and from which slot. */
static int sh_lent(const llama_shared *sh, int n_seq, int seq, int *from)
{
    int n = __atomic_load_n(&sh->lend[2 * seq + 1], __ATOMIC_ACQUIRE);
    int f = __atomic_load_n(&sh->lend[2 * seq], __ATOMIC_RELAXED);
    if (n <= 0 || f < 0 || f >= n_seq)
        n = 0, f = seq;
    if (from)
        *from = f;
    return n;
}

static void sh_lend(llama_shared *sh, int seq, int from, int n)
{
    __atomic_store_n(&sh->lend[2 * seq], from, __ATOMIC_RELAXED);
    __atomic_store_n(&sh->lend[2 * seq + 1], n, __ATOMIC_RELEASE);
}

/* The slot's committed rows changed other than by growing (llama_shared.epoch). */
static void kv_epoch_bump(llama_ctx *x, int seq)
{
    __atomic_fetch_add(&x->sh.epoch[seq], 1u, __ATOMIC_RELEASE);
}

/* K or V rows of layer l (which: 0 = K, 1 = V). */
static uint8_t *kv_layer(const llama_ctx *x, int l, int which)
{
    return x->sh.kv + (size_t)(2 * l + which) * x->sh.layer_kv_bytes;
}

llama_ctx *llama_ctx_new(const llama_model *m, const llama_ctx_params *p, char *err, size_t errlen)
{
    const llama_config *c = &m->cfg;
    llama_ctx *x = calloc(1, sizeof *x);
    if (!x)
        goto oom;
    x->m = m;
    x->p = *p;
    x->p.plan = NULL; /* copied into the ranges by llama_ctx_set_partition */
    if (x->p.n_threads <= 0)
        x->p.n_threads = (int)online_cores();
    if (x->p.max_width <= 0)
        x->p.max_width = 1;
    if (x->p.n_parts <= 0)
        x->p.n_parts = 1;
    if (x->p.n_seq <= 0)
        x->p.n_seq = 1;
    int even_max = x->p.kv_dup ? c->n_heads : c->n_kv_heads;
    if (even_max > LLAMA_MAX_PARTS)
        even_max = LLAMA_MAX_PARTS;
    if (x->p.max_width > KMAT_MAX_W || x->p.part < 0 || x->p.part >= x->p.n_parts ||
        x->p.n_parts > LLAMA_MAX_PARTS || (!p->plan && x->p.n_parts > even_max)) {
        snprintf(err, errlen,
                 "bad context parameters: width %d (max %d), part %d of %d (at most %d "
                 "parts: one %s head each, or %d with a partition plan)",
                 x->p.max_width, KMAT_MAX_W, x->p.part, x->p.n_parts, even_max,
                 x->p.kv_dup ? "query" : "KV", LLAMA_MAX_PARTS);
        free(x);
        return NULL;
    }
    if (x->p.n_ctx <= 0)
        x->p.n_ctx = c->ctx;
    if (x->p.screen_top > 0 && (!m->lm_screen.rows || x->p.n_parts != 1)) {
        snprintf(err, errlen, "bad context parameters: screen_top needs a model with a screening "
                              "head and one part");
        free(x);
        return NULL;
    }
    if (x->p.prefix_src && (x->p.n_parts != 1 || x->p.prefix_src_n_ctx <= 0 ||
                            x->p.prefix_src_max_width <= 0 || x->p.prefix_src_n_seq <= 0)) {
        snprintf(err, errlen, "bad context parameters: a prefix source needs one part and its "
                              "layout (n_ctx, width, sequence slots)");
        free(x);
        return NULL;
    }
    x->pool = kpool_new(x->p.n_threads);
    if (!x->pool)
        goto oom;
    x->kv_elem = x->p.kv == KV_F16 ? 2 : 4;
    x->kv_row = (int64_t)c->n_kv_heads * c->head_dim;
    if (x->p.shared) {
        llama_shared_bind(&x->sh, x->p.shared, c, x->p.n_ctx, x->p.max_width, x->p.n_seq, x->p.kv);
    } else {
        size_t bytes =
            llama_shared_layout(c, x->p.n_ctx, x->p.max_width, x->p.n_seq, x->p.kv, NULL);
        /* page-aligned and untouched until used, so a large n_ctx costs address space only */
        if (posix_memalign(&x->owned_shared, 4096, bytes))
            goto oom;
        llama_shared_bind(&x->sh, x->owned_shared, c, x->p.n_ctx, x->p.max_width, x->p.n_seq,
                          x->p.kv);
    }
    x->tree_row = (int64_t)x->p.n_seq * x->p.n_ctx;
    size_t W = (size_t)x->p.max_width;
    int64_t qd = (int64_t)c->n_heads * c->head_dim;
    int64_t wide = c->ffn > qd ? c->ffn : qd;
    if (wide < c->dim)
        wide = c->dim;
    x->xb = malloc(W * (size_t)c->dim * 4);
    x->row = malloc((size_t)c->dim * 4);
    x->anc = malloc(W * W * sizeof *x->anc);
    x->n_anc = malloc(W * sizeof *x->n_anc);
    x->pos = malloc(W * sizeof *x->pos);
    size_t half = (size_t)(c->rot_dim / 2 > 0 ? c->rot_dim / 2 : 1);
    x->rope_inv = malloc(half * sizeof *x->rope_inv);
    x->rope_cs = malloc(W * half * sizeof *x->rope_cs);
    x->rope_sn = malloc(W * half * sizeof *x->rope_sn);
    if (x->rope_inv)
        x->rope_mscale = llama_rope_inv(m, x->rope_inv);
    x->seq = malloc(W * sizeof *x->seq);
    x->prefix = calloc((size_t)x->p.n_seq, sizeof *x->prefix);
    x->src_of = calloc((size_t)x->p.n_seq, sizeof *x->src_of);
    for (int s = 0; x->src_of && x->p.prefix_src && s < x->p.n_seq; s++)
        x->src_of[s] = s < x->p.prefix_src_n_seq ? s : 0; /* slot s reads slot s */
    x->scratch = malloc(kmat_scratch_bytes(wide, (int)W, kpool_threads(x->pool)));
    x->split_heads = malloc((size_t)c->n_heads * sizeof *x->split_heads);
    x->units = malloc((size_t)c->n_heads * sizeof *x->units);
    x->singles = malloc((size_t)c->n_heads * sizeof *x->singles);
    x->attp = malloc(W * (size_t)qd * 4);
    x->xs = malloc(W * (size_t)wide * 4);
    if (!x->xb || !x->row || !x->anc || !x->n_anc || !x->pos || !x->seq || !x->prefix ||
        !x->src_of || !x->scratch || !x->rope_inv || !x->rope_cs || !x->rope_sn ||
        !x->split_heads || !x->units || !x->singles || !x->attp || !x->xs)
        goto oom;
    if (llama_ctx_set_partition(x, p->plan, err, errlen)) {
        llama_ctx_destroy(&x);
        return NULL;
    }
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
    free(x->owned_shared);
    free(x->priv_tree);
    free(x->kvp);
    free(x->xb);
    free(x->row);
    free(x->anc);
    free(x->n_anc);
    free(x->pos);
    free(x->rope_inv);
    free(x->rope_cs);
    free(x->rope_sn);
    free(x->seq);
    free(x->prefix);
    free(x->src_of);
    free(x->scratch);
    free(x->split_heads);
    free(x->units);
    free(x->singles);
    free(x->attp);
    free(x->xs);
    kpool_destroy(&x->pool);
    free(x);
    *ctx = NULL;
}

int llama_ctx_prefix_len(const llama_ctx *ctx)
{
    return ctx->prefix[0];
}

void llama_ctx_set_prefix_len(llama_ctx *ctx, int n)
{
    llama_ctx_set_seq_prefix_len(ctx, 0, n);
}

static void *kv_head_row(const llama_ctx *x, uint8_t *base, int kvh, int64_t p);

/* Copy the rows [a, b) of every layer and owned KV head from slot src's own rows to slot dst's
 * own rows. */
static void kv_copy_rows(llama_ctx *x, int src, int dst, int a, int b)
{
    if (b <= a || src == dst)
        return;
    size_t len = (size_t)(b - a) * (size_t)x->m->cfg.head_dim * x->kv_elem;
    for (int l = 0; l < x->m->cfg.n_layers; l++)
        for (int w = 0; w < 2; w++) {
            uint8_t *base = kv_layer(x, l, w);
            for (int kvh = x->own0; kvh < x->own1; kvh++)
                memcpy(kv_head_row(x, base, kvh, (int64_t)dst * x->p.n_ctx + a),
                       kv_head_row(x, base, kvh, (int64_t)src * x->p.n_ctx + a), len);
        }
}

static int kv_slot_check(const llama_ctx *x, const char *what, int src, int dst, int n, char *err,
                         size_t errlen)
{
    if (src >= 0 && dst >= 0 && src < x->p.n_seq && dst < x->p.n_seq && n >= 0 &&
        n <= x->p.n_ctx && !x->p.prefix_src)
        return 0;
    snprintf(err, errlen, "%s: %d rows from slot %d to slot %d (%d slots of %d)", what, n, src,
             dst, x->p.n_seq, x->p.n_ctx);
    return -1;
}

int llama_kv_copy_prefix(llama_ctx *x, int src, int dst, int n, char *err, size_t errlen)
{
    if (kv_slot_check(x, "copy prefix", src, dst, n, err, errlen))
        return -1;
    int from, lent = sh_lent(&x->sh, x->p.n_seq, src, &from);
    if (src == dst) {
        llama_kv_unshare(x, dst, n, false);
    } else {
        int cut = lent < n ? lent : n; /* rows [0, cut) lie in the lender's rows */
        sh_lend(&x->sh, dst, dst, 0);
        kv_copy_rows(x, from, dst, 0, cut);
        kv_copy_rows(x, src, dst, cut, n);
    }
    x->prefix[dst] = n;
    x->tree_open = false;
    kv_epoch_bump(x, dst);
    return 0;
}

int llama_kv_share_prefix(llama_ctx *x, int src, int dst, int n, char *err, size_t errlen)
{
    if (kv_slot_check(x, "share prefix", src, dst, n, err, errlen))
        return -1;
    if (src == dst)
        return llama_kv_copy_prefix(x, src, dst, n, err, errlen);
    int from, lent = sh_lent(&x->sh, x->p.n_seq, src, &from);
    if (lent == 0)
        from = src, lent = n;
    int cut = lent < n ? lent : n;
    /* a slot that lent src its rows has them in place: it need borrow none of them */
    sh_lend(&x->sh, dst, from, from == dst ? 0 : cut);
    kv_copy_rows(x, src, dst, cut, n);
    x->prefix[dst] = n;
    x->tree_open = false;
    kv_epoch_bump(x, dst);
    return 0;
}

int llama_kv_lent(const llama_ctx *x, int seq, int *from)
{
    if (seq < 0 || seq >= x->p.n_seq) {
        if (from)
            *from = seq;
        return 0;
    }
    return sh_lent(&x->sh, x->p.n_seq, seq, from);
}

void llama_kv_unshare(llama_ctx *x, int seq, int keep, bool copy)
{
    int from, lent = llama_kv_lent(x, seq, &from);
    if (keep < 0)
        keep = 0;
    if (lent <= keep)
        return;
    if (copy)
        kv_copy_rows(x, from, seq, keep, lent);
    sh_lend(&x->sh, seq, from, keep);
}

size_t llama_kv_release(llama_ctx *x, int seq, int from)
{
    if (seq < 0 || seq >= x->p.n_seq || from < 0 || from >= x->p.n_ctx || x->p.prefix_src)
        return 0;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    size_t freed = 0;
    for (int l = 0; l < x->m->cfg.n_layers; l++)
        for (int w = 0; w < 2; w++) {
            uint8_t *base = kv_layer(x, l, w);
            for (int kvh = x->own0; kvh < x->own1; kvh++) {
                int64_t row0 = (int64_t)seq * x->p.n_ctx;
                uintptr_t a = (uintptr_t)kv_head_row(x, base, kvh, row0 + from),
                          b = (uintptr_t)kv_head_row(x, base, kvh, row0 + x->p.n_ctx);
                a = (a + page - 1) / page * page;
                b = b / page * page;
                if (b > a && !madvise((void *)a, b - a, MADV_REMOVE))
                    freed += b - a;
            }
        }
    if (x->prefix[seq] > from)
        x->prefix[seq] = from;
    llama_kv_unshare(x, seq, from, false);
    x->tree_open = false;
    kv_epoch_bump(x, seq);
    return freed;
}

int llama_ctx_seq_prefix_len(const llama_ctx *ctx, int seq)
{
    return seq >= 0 && seq < ctx->p.n_seq ? ctx->prefix[seq] : 0;
}

void llama_ctx_set_seq_prefix_len(llama_ctx *ctx, int seq, int n)
{
    if (seq < 0 || seq >= ctx->p.n_seq)
        return;
    n = n < 0 ? 0 : n > ctx->p.n_ctx ? ctx->p.n_ctx : n;
    /* the tree's positions were derived from the old length: it can no longer grow */
    if (n != ctx->prefix[seq])
        ctx->tree_open = false;
    if (n < ctx->prefix[seq])
        kv_epoch_bump(ctx, seq);
    ctx->prefix[seq] = n;
}

int llama_ctx_threads(const llama_ctx *ctx)
{
    return kpool_threads(ctx->pool);
}

const llama_shared *llama_ctx_shared(const llama_ctx *ctx)
{
    return &ctx->sh;
}

void llama_ctx_map_prefix_source(llama_ctx *ctx, int seq, int src)
{
    if (!ctx->p.prefix_src || seq < 0 || seq >= ctx->p.n_seq || src < 0 ||
        src >= ctx->p.prefix_src_n_seq || ctx->src_of[seq] == src)
        return;
    ctx->src_of[seq] = src;
    ctx->tree_open = false; /* the tree attended to another prefix */
}

void llama_ctx_set_prefix_source_seq(llama_ctx *ctx, int seq)
{
    llama_ctx_map_prefix_source(ctx, 0, seq);
}

void llama_ctx_reset(llama_ctx *ctx)
{
    for (int s = 0; s < ctx->p.n_seq; s++) {
        if (ctx->prefix[s])
            kv_epoch_bump(ctx, s);
        sh_lend(&ctx->sh, s, s, 0);
    }
    memset(ctx->prefix, 0, (size_t)ctx->p.n_seq * sizeof *ctx->prefix);
    ctx->tree_open = false;
}

/* ===== the forward ===== */

int32_t llama_ctx_part_argmax(const llama_ctx *x, const float *logits, float *value)
{
    int64_t v0, v1;
    llama_ctx_part_range(x, LP_LM_HEAD, &v0, &v1);
    if (v1 <= v0) { /* no vocabulary rows: a best that never wins the merge */
        *value = -INFINITY;
        return 0;
    }
    int32_t i = (int32_t)v0 + k_argmax(logits + v0, (int)(v1 - v0));
    *value = logits[i];
    return i;
}

/* y[:, lo:hi] = W[lo:hi] x for n tokens. */
static void llama_linear(llama_ctx *x, const kmat *w, int64_t lo, int64_t hi, const float *in,
                         int n, float *out)
{
    kmat_mul(x->pool, w, lo, hi, in, n, out, w->rows, x->scratch);
}

int llama_part_sync(llama_ctx *x, char *err, size_t errlen)
{
    if (!x->p.sync || x->p.sync(x->p.sync_arg) == 0)
        return 0;
    x->tree_open = false; /* the batch's K/V rows are incomplete: nothing may grow on them */
    snprintf(err, errlen, "part %d of %d: a peer did not reach the step barrier (lost or too slow)",
             x->p.part, x->p.n_parts);
    return -1;
}

/* Head-major K/V: within a layer's K (or V) block, KV head h holds rows 0 .. rows-1 (every
 * sequence's prefix rows, then the tree rows) of head_dim elements each, so the attention of one
 * (token, KV head) streams one contiguous range instead of one slice of every row (measured: the
 * position-major layout made decode attention ~3x slower than the same math on cached rows). */
static void *kv_head_row(const llama_ctx *x, uint8_t *base, int kvh, int64_t p)
{
    return base + llama_kv_offset(x, kvh, p);
}

/* The first prefix row of KV head kvh of this context's sequence slot seq in layer rows `base` of
 * the prefix source (its layout: per KV head, n_seq * n_ctx prefix rows then max_width tree
 * rows; the slot read is src_of[seq]). */
static const void *src_head_row(const llama_ctx *x, const uint8_t *base, int kvh, int src_slot)
{
    const llama_ctx_params *p = &x->p;
    int64_t rows = (int64_t)p->prefix_src_n_seq * p->prefix_src_n_ctx + p->prefix_src_max_width;
    int64_t r = (int64_t)kvh * rows + (int64_t)src_slot * p->prefix_src_n_ctx;
    return base + (size_t)r * (size_t)x->m->cfg.head_dim * x->kv_elem;
}

/* Tree slot `slot` of KV head kvh in layer l, K (w = 0) or V (w = 1): the shared block's row, or,
 * for a head this part projects without owning it (kv_dup), its private copy. */
static void *llama_tree_row(const llama_ctx *x, int l, int w, int kvh, int64_t slot)
{
    /* shared: heads this part owns, and (plans with att_sync) heads another part projects */
    if ((kvh >= x->own0 && kvh < x->own1) || kvh < x->kvh0 || kvh >= x->kvh1)
        return kv_head_row(x, kv_layer(x, l, w), kvh, x->tree_row + slot);
    size_t row = (size_t)x->m->cfg.head_dim * x->kv_elem;
    size_t heads = (size_t)(x->kvh1 - x->kvh0);
    return x->priv_tree +
           ((((size_t)l * 2 + (size_t)w) * heads + (size_t)(kvh - x->kvh0)) *
                (size_t)x->p.max_width +
            (size_t)slot) *
               row;
}

/* Store this part's KV heads of one projected row (n_kv_heads * head_dim values) into tree slot
 * `slot` of layer l, K (w = 0) or V (w = 1). */
static void kv_store(const llama_ctx *x, int l, int w, int64_t slot, const float *src)
{
    int hd = x->m->cfg.head_dim;
    for (int kvh = x->kvh0; kvh < x->kvh1; kvh++) {
        uint8_t *dst = llama_tree_row(x, l, w, kvh, slot);
        const float *v = src + (int64_t)kvh * hd;
        if (x->p.kv == KV_F32) {
            memcpy(dst, v, (size_t)hd * 4);
            continue;
        }
        uint16_t *h = (uint16_t *)dst;
        for (int i = 0; i < hd; i++)
            h[i] = kt_f32_to_f16(v[i]);
    }
}

#define ATT_BLOCK_MAX 8 /* tokens of one sequence one attention item takes */

typedef struct {
    llama_ctx *x;
    int layer, n;
    const struct att_unit *units; /* this part's attention work, per token block */
    int n_units;
    int n_blocks;
    int block0[KMAT_MAX_W + 1]; /* token block k: tokens [block0[k], block0[k + 1]) */
} att_job;

/* One attention partial of token i, query head h: the dense (half 0) or sparse (half 1) one, as
 * head_dim outputs then max and sum. */
static float *att_partial(const llama_ctx *x, int i, int h, int half)
{
    const llama_config *c = &x->m->cfg;
    return x->sh.ap + (((size_t)i * c->n_heads + h) * 2 + half) * ((size_t)c->head_dim + 2);
}

/* Cut the step's n tokens into blocks of consecutive tokens of one sequence, at most `most`
 * tokens each (the tokens of a block share the loads of their common prefix). */
static void att_blocks(const llama_ctx *x, att_job *j, int most)
{
    j->n_blocks = 0;
    for (int i = 0; i < j->n;) {
        int e = i + 1, seq = x->seq[x->batch_base + i];
        while (e < j->n && e - i < most && x->seq[x->batch_base + e] == seq)
            e++;
        j->block0[j->n_blocks++] = i;
        i = e;
    }
    j->block0[j->n_blocks] = j->n;
}

/* One (token block, unit) pair per item. A unit is a run of this part's query heads that share a
 * KV head — or, when the pairs are too few to keep every thread busy (a decode step of a model
 * with 3 KV heads on 2 threads would split 2:1), a single query head. A token block is a run of
 * tokens of one sequence (a verification step's tree, a chunk of a prompt). The queries of an
 * item share every key and value load of their common prefix, and a query's arithmetic is the
 * same whether it shares its loads or not, so how heads and tokens are grouped never changes a
 * bit. A full unit attends to its key stream — the committed prefix, then its ancestors in the
 * tree (which continue the positions) — in one causal pass (see kernels/cpu/attention.c for why
 * one pass and not a merge of two partials); a dense unit to the prefix only and a sparse unit to
 * the ancestors only, each leaving its unnormalised partial in the shared block for the merge
 * after the next synchronisation. */
static void att_run(void *argp, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const att_job *j = argp;
    llama_ctx *x = j->x;
    const llama_config *c = &x->m->cfg;
    int hd = c->head_dim;
    float scale = 1.0f / sqrtf((float)hd);
    uint8_t *kl = kv_layer(x, j->layer, 0), *vl = kv_layer(x, j->layer, 1);
    const llama_shared *src = x->p.prefix_src;
    const uint8_t *src_kl = src ? src->kv + (size_t)(2 * j->layer) * src->layer_kv_bytes : NULL;
    const uint8_t *src_vl = src ? src_kl + src->layer_kv_bytes : NULL;
    katt_stat st[ATT_BLOCK_MAX * 64];
    katt_keys keys[ATT_BLOCK_MAX];
    const float *qs[ATT_BLOCK_MAX];
    float *outs[ATT_BLOCK_MAX];
    int n_keys[ATT_BLOCK_MAX];
    for (int64_t item = begin; item < end; item++) {
        int blk = (int)(item / j->n_units), i0 = j->block0[blk], nt = j->block0[blk + 1] - i0;
        const struct att_unit *u = &j->units[item % j->n_units];
        int kvh = u->kvh;
        int64_t out_stride = u->mode == ATT_FULL ? hd : 2 * (hd + 2);
        for (int t = 0; t < nt; t++) {
            int i = i0 + t;
            int slot = x->batch_base + i; /* activations are per batch, lists per tree slot */
            int seq = x->seq[slot], n_prefix = x->prefix[seq];
            int64_t seq_row = (int64_t)seq * x->p.n_ctx;
            qs[t] = x->sh.q + (int64_t)i * c->n_heads * hd + (int64_t)u->h0 * hd;
            keys[t] = (katt_keys){
                .type = x->p.kv,
                .stride = hd,
                .n_prefix = n_prefix,
                .tree_k = llama_tree_row(x, j->layer, 0, kvh, 0),
                .tree_v = llama_tree_row(x, j->layer, 1, kvh, 0),
                .tree_slot = x->anc + (int64_t)slot * x->p.max_width,
            };
            /* the slot's own rows, and the first ones another slot lends it */
            int lender;
            if (src) {
                int ss = x->src_of[seq];
                keys[t].n_lent = sh_lent(src, x->p.prefix_src_n_seq, ss, &lender);
                keys[t].k = src_head_row(x, src_kl, kvh, ss);
                keys[t].v = src_head_row(x, src_vl, kvh, ss);
                keys[t].lent_k = src_head_row(x, src_kl, kvh, lender);
                keys[t].lent_v = src_head_row(x, src_vl, kvh, lender);
            } else {
                keys[t].n_lent = sh_lent(&x->sh, x->p.n_seq, seq, &lender);
                keys[t].k = kv_head_row(x, kl, kvh, seq_row);
                keys[t].v = kv_head_row(x, vl, kvh, seq_row);
                keys[t].lent_k = kv_head_row(x, kl, kvh, (int64_t)lender * x->p.n_ctx);
                keys[t].lent_v = kv_head_row(x, vl, kvh, (int64_t)lender * x->p.n_ctx);
            }
            n_keys[t] = n_prefix + x->n_anc[slot];
            if (u->mode == ATT_FULL) {
                outs[t] = x->sh.att + (int64_t)i * c->n_heads * hd + (int64_t)u->h0 * hd;
            } else {
                if (u->mode == ATT_DENSE) {
                    n_keys[t] = n_prefix;
                } else {
                    keys[t].n_prefix = 0;
                    n_keys[t] = x->n_anc[slot];
                }
                outs[t] = att_partial(x, i, u->h0, u->mode == ATT_SPARSE);
            }
            if (keys[t].n_lent > keys[t].n_prefix)
                keys[t].n_lent = keys[t].n_prefix;
        }
        /* st holds ATT_BLOCK_MAX x 64 queries: heads 64 at a time (katt_causal_tokens cuts its
         * own work into what its stack arrays take) */
        for (int g0 = 0; g0 < u->nh; g0 += 64) {
            int ng = u->nh - g0 < 64 ? u->nh - g0 : 64;
            const float *qg[ATT_BLOCK_MAX];
            float *og[ATT_BLOCK_MAX];
            for (int t = 0; t < nt; t++) {
                qg[t] = qs[t] + (int64_t)g0 * hd;
                og[t] = outs[t] + (int64_t)g0 * out_stride;
            }
            katt_causal_tokens(nt, qg, hd, ng, keys, n_keys, hd, scale, st, og, out_stride);
            for (int t = 0; t < nt; t++)
                for (int g = 0; g < ng; g++) {
                    float *o = og[t] + (int64_t)g * out_stride;
                    const katt_stat *sg = &st[t * ng + g];
                    if (u->mode == ATT_FULL) {
                        katt_finish(sg, o, hd);
                    } else {
                        o[hd] = sg->max;
                        o[hd + 1] = sg->sum;
                    }
                }
        }
    }
}

/* The output projection's input when some heads were split between parts: the finished heads
 * as attention wrote them, each split head's dense and sparse partials merged (online softmax)
 * and finished. Every part merges all of them for itself (a few hundred floats per token). */
static const float *att_merged(llama_ctx *x, int n)
{
    const llama_config *c = &x->m->cfg;
    int hd = c->head_dim;
    int64_t qd = (int64_t)c->n_heads * hd;
    memcpy(x->attp, x->sh.att, (size_t)(n * qd) * 4);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < x->n_split; k++) {
            int h = x->split_heads[k];
            const float *d = att_partial(x, i, h, 0), *sp = att_partial(x, i, h, 1);
            float *o = x->attp + i * qd + (int64_t)h * hd;
            katt_stat a = {d[hd], d[hd + 1]}, b = {sp[hd], sp[hd + 1]};
            memcpy(o, d, (size_t)hd * 4);
            katt_merge(&a, o, &b, sp, hd);
            katt_finish(&a, o, hd);
        }
    return x->attp;
}

/* Ancestor lists (root first, self last) and positions from the parent indices, for tree slots
 * [base, base + n): base 0 for a fresh tree, the current tree size for an appended batch (whose
 * parents may then be tokens of earlier batches). On failure nothing of an existing tree changes
 * but its openness; a fresh tree that fails is empty. */
static int llama_tree_prepare(llama_ctx *x, const llama_batch *b, char *err, size_t errlen)
{
    int W = x->p.max_width, base = 0;
    if (b->append) {
        if (!x->tree_open) {
            snprintf(err, errlen,
                     "append: no tree to grow (none was run, or a commit, reset or prefix "
                     "change since the last one closed it)");
            return -1;
        }
        base = x->batch_n;
        if (base + b->n > W) {
            snprintf(err, errlen, "append: a tree of %d tokens plus %d would exceed the width %d",
                     base, b->n, W);
            return -1;
        }
    } else {
        x->batch_n = 0;
        x->tree_open = false;
    }
    for (int k = 0; k < b->n; k++) {
        int i = base + k; /* the token's tree slot */
        int par = b->parent ? b->parent[k] : i - 1;
        if (par >= i || par < -1) {
            snprintf(err, errlen, "token %d: parent %d must be -1 or an earlier tree index (< %d)",
                     k, par, i);
            return -1;
        }
        int seq = b->seq ? b->seq[k] : 0;
        if (seq < 0 || seq >= x->p.n_seq || (par >= 0 && x->seq[par] != seq)) {
            snprintf(err, errlen,
                     "token %d: sequence %d is not a slot of this context (0..%d) or differs "
                     "from its parent's",
                     k, seq, x->p.n_seq - 1);
            return -1;
        }
        x->seq[i] = seq;
        int32_t *a = x->anc + (int64_t)i * W;
        int n = 0;
        if (par >= 0) {
            memcpy(a, x->anc + (int64_t)par * W, (size_t)x->n_anc[par] * sizeof *a);
            n = x->n_anc[par];
        }
        a[n++] = i;
        x->n_anc[i] = n;
        x->pos[i] = b->pos ? b->pos[k] : x->prefix[seq] + n - 1;
        if (x->pos[i] < 0) {
            snprintf(err, errlen, "token %d: negative position %d", k, x->pos[i]);
            return -1;
        }
        if (x->prefix[seq] + n > x->p.n_ctx) {
            snprintf(err, errlen,
                     "context full: sequence %d has %d committed tokens; token %d at depth "
                     "%d would exceed %d",
                     seq, x->prefix[seq], k, n, x->p.n_ctx);
            return -1;
        }
    }
    x->batch_base = base;
    x->batch_n = base + b->n;
    x->tree_open = true;
    return 0;
}

int llama_batch_prepare(llama_ctx *x, const llama_batch *b, char *err, size_t errlen)
{
    const llama_config *c = &x->m->cfg;
    if (b->n < 1 || b->n > x->p.max_width) {
        snprintf(err, errlen, "batch of %d tokens: must be 1..%d", b->n, x->p.max_width);
        return -1;
    }
    for (int i = 0; i < b->n; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab) {
            snprintf(err, errlen, "token %d: id %d outside the vocabulary [0, %d)", i, b->tokens[i],
                     c->vocab);
            return -1;
        }
    return llama_tree_prepare(x, b, err, errlen);
}

int llama_ctx_set_batch(llama_ctx *x, const llama_batch *b, char *err, size_t errlen)
{
    return llama_batch_prepare(x, b, err, errlen);
}

/* x[t, lo:hi] += d[t * ld + lo:hi] for n tokens of width `dim`: ld = dim adds each token's row
 * of d, ld = 0 the one row d (a bias). */
static void add_cols(float *x, const float *d, int64_t ld, int n, int64_t dim, int64_t lo,
                     int64_t hi)
{
    for (int t = 0; t < n; t++)
        for (int64_t i = lo; i < hi; i++)
            x[t * dim + i] += d[t * ld + i];
}

/* Logits of n normed rows (x->xb) from the screening head, each row's screen_top best then
 * recomputed with the exact lm_head (its rows dequantized one at a time). */
static void screened_logits(llama_ctx *x, int n, float *logits)
{
    const llama_model *m = x->m;
    const kmat *exact = m->tied ? &m->tok_embd : &m->lm_head;
    int V = m->cfg.vocab, dim = m->cfg.dim, K = x->p.screen_top < 64 ? x->p.screen_top : 64;
    kmat_mul(x->pool, &m->lm_screen, 0, V, x->xb, n, logits, V, x->scratch);
    for (int i = 0; i < n; i++) {
        float *lg = logits + (size_t)i * V;
        int32_t ids[64];
        int k = k_top(lg, V, K, ids);
        const float *h = x->xb + (size_t)i * dim;
        for (int j = 0; j < k; j++) {
            kmat_row(exact, ids[j], x->row);
            double d = 0;
            for (int e = 0; e < dim; e++)
                d += (double)x->row[e] * h[e];
            lg[ids[j]] = (float)d;
        }
    }
}

/* Megatron: this part's partial sum of a linear over its input columns [c0, c1) of `in` (n rows
 * of `ld`), into its slot of the partial buffer; then, after the parts meet, the reduction of
 * every part's partial into x's columns [r0, r1) (parts in order, so every column is summed the
 * same way), and the parts meet again. ranges: each part's input column boundaries. */
static int megatron_linear(llama_ctx *x, const kmat *w, const float *bias, const float *in,
                           int64_t ld, int n, const int64_t *ranges, int64_t scale, int64_t r0,
                           int64_t r1, char *err, size_t errlen)
{
    int64_t dim = x->m->cfg.dim, W = x->p.max_width;
    int me = x->p.part;
    int64_t c0 = ranges[me] * scale, c1 = ranges[me + 1] * scale;
    float *mine = x->sh.mp + (size_t)me * (size_t)W * (size_t)dim;
    if (c1 > c0) {
        for (int t = 0; t < n; t++)
            memcpy(x->xs + (size_t)t * (size_t)(c1 - c0), in + t * ld + c0,
                   (size_t)(c1 - c0) * 4);
        if (kmat_mul_cols(x->pool, w, 0, dim, c0, c1, x->xs, n, mine, dim, x->scratch)) {
            snprintf(err, errlen, "megatron: input columns [%lld, %lld) are not on %s blocks",
                     (long long)c0, (long long)c1, kt_traits_of(w->type)->name);
            return -1;
        }
    }
    if (llama_part_sync(x, err, errlen))
        return -1;
    for (int p = 0; p < x->p.n_parts; p++) {
        if (ranges[p + 1] <= ranges[p])
            continue; /* a part with no input columns has no partial */
        add_cols(x->sh.x, x->sh.mp + (size_t)p * (size_t)W * (size_t)dim, dim, n, dim, r0, r1);
    }
    if (bias) /* the output bias once, after the parts' sums */
        add_cols(x->sh.x, bias, 0, n, dim, r0, r1);
    return llama_part_sync(x, err, errlen);
}

double llama_rope_inv(const llama_model *m, double *inv)
{
    const llama_config *c = &m->cfg;
    int half = c->rot_dim / 2;
    k_rope_freqs(inv, c->rot_dim, c->rope_base);
    switch (c->rope_scaling) {
    case LLAMA_ROPE_LLAMA3: /* Llama 3.1: each pair's frequency divided by its factor */
        for (int i = 0; i < half; i++)
            inv[i] /= m->rope_factors[i];
        return 1.0;
    case LLAMA_ROPE_LINEAR: /* positions divided by the factor */
        for (int i = 0; i < half; i++)
            inv[i] /= c->rope_factor;
        return 1.0;
    case LLAMA_ROPE_YARN: {
        /* YaRN: the pairs that turn fewer than beta_slow (1) times over the original context are
         * interpolated (divided by the factor), those that turn more than beta_fast (32) times
         * kept, a linear ramp between; cos and sin scaled by attn_factor (1 + 0.1 ln factor).
         * theta = pos * inv either way, so the mix is folded into the frequencies. */
        const double two_pi = 6.283185307179586;
        double lb = log(c->rope_base), n = c->rot_dim;
        double lo = floor(n * log(c->yarn_orig_ctx / (32.0 * two_pi)) / (2 * lb));
        double hi = ceil(n * log(c->yarn_orig_ctx / (1.0 * two_pi)) / (2 * lb));
        lo = lo < 0 ? 0 : lo;
        hi = hi > n - 1 ? n - 1 : hi;
        for (int i = 0; i < half; i++) {
            double y = (i - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
            double keep = 1.0 - (y < 0 ? 0 : y > 1 ? 1 : y); /* 1: extrapolate (keep) */
            inv[i] *= (1.0 - keep) / c->rope_factor + keep;
        }
        return c->yarn_attn * (1.0 + 0.1 * log(c->rope_factor));
    }
    default: return 1.0;
    }
}

void llama_rope_angles(const llama_ctx *x, int pos, float *cs, float *sn)
{
    int half = x->m->cfg.rot_dim / 2;
    k_rope_angles(cs, sn, x->rope_inv, half, pos);
    if (x->rope_mscale != 1.0)
        for (int i = 0; i < half; i++) {
            cs[i] = (float)(cs[i] * x->rope_mscale);
            sn[i] = (float)(sn[i] * x->rope_mscale);
        }
}

/* Before RoPE: the biases of the part's q (columns [c0, c0 + n_heads * hd)) or k columns, then
 * qwen3's per-head RMS norm, then the rotation in the model's layout. */
static void qk_prepare(const llama_config *c, float *p, const float *bias, const float *norm,
                       int64_t c0, int n_heads, const float *cs, const float *sn)
{
    int hd = c->head_dim, half = c->rot_dim / 2;
    if (bias)
        for (int64_t e = 0; e < (int64_t)n_heads * hd; e++)
            p[e] += bias[c0 + e];
    if (norm)
        for (int h = 0; h < n_heads; h++)
            k_rmsnorm(p + (int64_t)h * hd, p + (int64_t)h * hd, norm, hd, c->norm_eps);
    if (c->rope_neox)
        k_rope_apply_neox(p, n_heads, hd, half, cs, sn);
    else
        k_rope_apply(p, n_heads, hd, half, cs, sn);
}

/* A step's per-token work between its matmuls (norms, RoPE and the K/V store, silu * up): each
 * token's is independent of the others', so from LLAMA_PAR_TOKENS tokens on it is spread over
 * the pool instead of keeping the other threads waiting (a few percent of a wide step). Which
 * thread computes a token changes no bit. */
#define LLAMA_PAR_TOKENS 16

enum { TOK_ATTN_NORM, TOK_ROPE_STORE, TOK_FFN_NORM, TOK_SILU };

typedef struct {
    llama_ctx *x;
    int op, layer;
    float *kk; /* K and V projections of the step (TOK_ROPE_STORE) */
    float *vv;
    const llama_part_cols *pc; /* this part's columns */
} tok_job;

static void tok_run(void *argp, int64_t begin, int64_t end, int thread)
{
    (void)thread;
    const tok_job *j = argp;
    llama_ctx *x = j->x;
    const llama_config *c = &x->m->cfg;
    const llama_layer *L = &x->m->layers[j->layer];
    const llama_shared *sh = &x->sh;
    int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kvd = x->kv_row;
    int half = c->rot_dim / 2;
    const llama_part_cols *pc = j->pc;
    for (int64_t i = begin; i < end; i++) {
        switch (j->op) {
        case TOK_ATTN_NORM:
        case TOK_FFN_NORM:
            k_rmsnorm(x->xb + i * dim, sh->x + i * dim,
                      j->op == TOK_ATTN_NORM ? L->attn_norm : L->ffn_norm, (int)dim, c->norm_eps);
            break;
        case TOK_ROPE_STORE: {
            int slot = x->batch_base + (int)i;
            const float *cs = x->rope_cs + (size_t)i * half, *sn = x->rope_sn + (size_t)i * half;
            qk_prepare(c, sh->q + i * qd + pc->q0, L->bq, L->q_norm, pc->q0,
                       (int)((pc->q1 - pc->q0) / c->head_dim), cs, sn);
            qk_prepare(c, j->kk + i * kvd + pc->k0, L->bk, L->k_norm, pc->k0,
                       x->kvh1 - x->kvh0, cs, sn);
            if (L->bv)
                for (int64_t e = pc->k0; e < pc->k1; e++)
                    j->vv[i * kvd + e] += L->bv[e];
            kv_store(x, j->layer, 0, slot, j->kk + i * kvd);
            kv_store(x, j->layer, 1, slot, j->vv + i * kvd);
            break;
        }
        case TOK_SILU:
            k_silu_mul(sh->hg + i * c->ffn + pc->f0, sh->hu + i * c->ffn + pc->f0,
                       (int)(pc->f1 - pc->f0));
            break;
        }
    }
}

static void per_token(llama_ctx *x, const llama_part_cols *pc, int n, int op, int layer,
                      float *kk, float *vv)
{
    tok_job j = {.x = x, .op = op, .layer = layer, .kk = kk, .vv = vv, .pc = pc};
    if (n >= LLAMA_PAR_TOKENS && kpool_threads(x->pool) > 1)
        kpool_run(x->pool, n, 1, tok_run, &j);
    else
        tok_run(&j, 0, n, 0);
}

int llama_forward(llama_ctx *x, const llama_batch *b, float *logits, char *err, size_t errlen)
{
    const llama_model *m = x->m;
    const llama_config *c = &m->cfg;
    const llama_shared *sh = &x->sh;
    int n = b->n;
    if (llama_batch_prepare(x, b, err, errlen))
        return -1;

    int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kvd = x->kv_row, hd = c->head_dim;
    llama_part_cols pc;
    llama_part_cols_of(x, &pc);
    int64_t d0 = pc.d0, d1 = pc.d1, e0 = pc.e0, e1 = pc.e1, f0 = pc.f0, f1 = pc.f1;
    int64_t q0 = pc.q0, q1 = pc.q1, k0 = pc.k0, k1 = pc.k1;
    /* K and V projections: in the shared block, or privately under kv_dup */
    float *kk = x->kv_private ? x->kvp : sh->kk,
          *vv = x->kv_private ? x->kvp + (size_t)x->p.max_width * (size_t)kvd : sh->vv;

    int half = c->rot_dim / 2; /* RoPE: every layer rotates at the same positions */
    for (int i = 0; i < n; i++)
        llama_rope_angles(x, x->pos[x->batch_base + i], x->rope_cs + (size_t)i * half,
                          x->rope_sn + (size_t)i * half);
    for (int i = 0; i < n; i++) {
        kmat_row(&m->tok_embd, b->tokens[i], x->row);
        memcpy(sh->x + i * dim + d0, x->row + d0, (size_t)(d1 - d0) * 4);
    }
    if (llama_part_sync(x, err, errlen))
        return -1;

    for (int l = 0; l < c->n_layers; l++) {
        const llama_layer *L = &m->layers[l];
        per_token(x, &pc, n, TOK_ATTN_NORM, l, NULL, NULL);
        {
            const kmat *w3[3] = {&L->wq, &L->wk, &L->wv};
            int64_t lo3[3] = {q0, k0, k0}, hi3[3] = {q1, k1, k1};
            float *y3[3] = {sh->q, kk, vv};
            int64_t ld3[3] = {L->wq.rows, L->wk.rows, L->wv.rows};
            kmat_mul_n(x->pool, 3, w3, lo3, hi3, x->xb, n, y3, ld3, x->scratch);
        }
        per_token(x, &pc, n, TOK_ROPE_STORE, l, kk, vv);
        if (x->att_sync && llama_part_sync(x, err, errlen))
            return -1;
        int threads = kpool_threads(x->pool);
        bool few = (int64_t)n * x->n_units < 4 * (int64_t)threads;
        att_job aj = {.x = x, .layer = l, .n = n, .units = few ? x->singles : x->units,
                      .n_units = few ? x->n_singles : x->n_units};
        if (aj.n_units) {
            /* tokens per block: as many as leave about four items per thread */
            int most = aj.n_units ? n * aj.n_units / (4 * threads) : 1;
            att_blocks(x, &aj, most < 1 ? 1 : most > ATT_BLOCK_MAX ? ATT_BLOCK_MAX : most);
            kpool_run(x->pool, (int64_t)aj.n_blocks * aj.n_units, 1, att_run, &aj);
        }
        if (x->megatron) {
            if (megatron_linear(x, &L->wo, L->bo, sh->att, qd, n, x->bnd[LP_QKV], hd, d0, d1, err,
                                errlen))
                return -1;
        } else {
            if (llama_part_sync(x, err, errlen))
                return -1;
            llama_linear(x, &L->wo, d0, d1, x->n_split ? att_merged(x, n) : sh->att, n, sh->xb2);
            if (L->bo)
                add_cols(sh->xb2, L->bo, 0, n, dim, d0, d1);
            add_cols(sh->x, sh->xb2, dim, n, dim, d0, d1);
            if (llama_part_sync(x, err, errlen))
                return -1;
        }

        per_token(x, &pc, n, TOK_FFN_NORM, l, NULL, NULL);
        {
            const kmat *w2[2] = {&L->w_gate, &L->w_up};
            int64_t lo2[2] = {f0, f0}, hi2[2] = {f1, f1};
            float *y2[2] = {sh->hg, sh->hu};
            int64_t ld2[2] = {L->w_gate.rows, L->w_up.rows};
            kmat_mul_n(x->pool, 2, w2, lo2, hi2, x->xb, n, y2, ld2, x->scratch);
        }
        per_token(x, &pc, n, TOK_SILU, l, NULL, NULL);
        if (x->megatron) {
            if (megatron_linear(x, &L->w_down, NULL, sh->hg, c->ffn, n, x->bnd[LP_FFN_UP], 1, e0, e1,
                                err, errlen))
                return -1;
            continue;
        }
        if (llama_part_sync(x, err, errlen))
            return -1;
        llama_linear(x, &L->w_down, e0, e1, sh->hg, n, sh->xb2);
        add_cols(sh->x, sh->xb2, dim, n, dim, e0, e1);
        if (llama_part_sync(x, err, errlen))
            return -1;
    }

    int from = b->logits_from < 0 ? 0 : b->logits_from;
    if (logits && from < n) {
        int64_t v0 = pc.v0, v1 = pc.v1;
        for (int i = from; i < n; i++)
            k_rmsnorm(x->xb + (i - from) * dim, sh->x + i * dim, m->out_norm, (int)dim,
                      c->norm_eps);
        if (x->p.screen_top > 0)
            screened_logits(x, n - from, logits);
        else
            llama_linear(x, &m->lm_head, v0, v1, x->xb, n - from, logits);
    }
    return 0;
}

int llama_commit(llama_ctx *x, const int32_t *path, int n, char *err, size_t errlen)
{
    if (n <= 0)
        return 0;
    if (x->p.prefix_src) {
        snprintf(err, errlen, "commit: this context reads its prefix from another's K/V");
        return -1;
    }
    if (path[0] < 0 || path[0] >= x->batch_n) {
        snprintf(err, errlen, "commit: path[0] = %d is not a token of the tree (%d tokens)",
                 path[0], x->batch_n);
        return -1;
    }
    int seq = x->seq[path[0]], base_len = x->prefix[seq];
    if (base_len + n > x->p.n_ctx) {
        snprintf(err, errlen, "commit of %d tokens overflows sequence %d (%d of %d used)", n, seq,
                 base_len, x->p.n_ctx);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (path[i] < 0 || path[i] >= x->batch_n || x->seq[path[i]] != seq ||
            x->pos[path[i]] != base_len + i) {
            snprintf(err, errlen, "commit: path[%d] = %d is not at position %d of sequence %d", i,
                     path[i], base_len + i, seq);
            return -1;
        }
    }
    /* a part moves only its own KV heads, so parts can commit concurrently with each other */
    size_t len = (size_t)x->m->cfg.head_dim * x->kv_elem;
    int64_t dst = (int64_t)seq * x->p.n_ctx + base_len;
    for (int l = 0; l < x->m->cfg.n_layers; l++)
        for (int w = 0; w < 2; w++) {
            uint8_t *base = kv_layer(x, l, w);
            /* kv_dup: a head this part does not own is committed from its private tree rows;
             * its owner writes the same bytes from the shared ones */
            for (int kvh = x->kvh0; kvh < x->kvh1; kvh++)
                for (int i = 0; i < n; i++)
                    memcpy(kv_head_row(x, base, kvh, dst + i),
                           llama_tree_row(x, l, w, kvh, path[i]), len);
        }
    x->prefix[seq] += n;
    x->tree_open = false; /* positions of the rest of the tree no longer follow the prefix */
    return 0;
}

int llama_tree_keep_path(llama_ctx *x, const int32_t *path, int n, int drop, char *err,
                         size_t errlen)
{
    int W = x->p.max_width;
    if (n < 1 || drop < 0 || drop > n || x->batch_n < 1) {
        snprintf(err, errlen, "keep path: %d tokens (dropping %d) of a tree of %d", n, drop,
                 x->batch_n);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        int t = path[i];
        /* a root (its own ancestor list alone), then each the child of the one before */
        if (t < 0 || t >= x->batch_n || x->n_anc[t] != i + 1 ||
            (i > 0 && (t <= path[i - 1] || x->anc[(int64_t)t * W + i - 1] != path[i - 1]))) {
            snprintf(err, errlen, "keep path: index %d (tree index %d) does not continue the path",
                     i, t);
            return -1;
        }
    }
    int seq = x->seq[path[0]];
    if (x->prefix[seq] + drop > x->p.n_ctx) {
        snprintf(err, errlen, "keep path: %d more committed tokens overflow sequence %d", drop,
                 seq);
        return -1;
    }
    size_t len = (size_t)x->m->cfg.head_dim * x->kv_elem;
    for (int l = 0; l < x->m->cfg.n_layers; l++)
        for (int w = 0; w < 2; w++) {
            for (int kvh = x->kvh0; kvh < x->kvh1; kvh++)
                for (int i = drop; i < n; i++) /* i - drop <= path[i]: rows only move down */
                    if (path[i] != i - drop)
                        memmove(llama_tree_row(x, l, w, kvh, i - drop),
                                llama_tree_row(x, l, w, kvh, path[i]), len);
        }
    x->prefix[seq] += drop;
    x->batch_n = n - drop;
    x->batch_base = 0;
    for (int i = 0; i < x->batch_n; i++) {
        int32_t *a = x->anc + (int64_t)i * W;
        for (int j = 0; j <= i; j++)
            a[j] = j;
        x->n_anc[i] = i + 1;
        x->seq[i] = seq;
        x->pos[i] = x->prefix[seq] + i;
    }
    x->tree_open = x->batch_n > 0;
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
        if (llama_forward(x, &b, last ? last_logits : NULL, err, errlen) ||
            llama_commit(x, path, w, err, errlen))
            return -1;
        done += w;
    }
    return 0;
}
