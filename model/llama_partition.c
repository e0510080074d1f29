/*
 * model/llama_partition.c — partition plans (interface: model/llama.h): which part computes which
 * output rows of every linear layer and which query heads' dense and sparse attention, checked,
 * packed for the wire, and applied to a context (its ranges, the Megatron-style pair split, the
 * heads whose two halves are merged by online softmax). The forward: model/llama.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model/llama_internal.h"


const char *const llama_part_kind_names[LP_N] = {
    "qkv", "wo", "ffn_up", "ffn_down", "lm_head", "attention_dense", "attention_sparse"};


void llama_partition_even(llama_partition *p, int n_parts)
{
    memset(p, 0, sizeof *p);
    p->n_parts = n_parts;
    for (int k = 0; k < LP_N; k++)
        for (int i = 0; i < n_parts && i < LLAMA_MAX_PARTS; i++)
            p->frac[k][i] = 1.0f;
}

int llama_partition_check(const llama_partition *p, char *err, size_t errlen)
{
    if (p->n_parts < 1 || p->n_parts > LLAMA_MAX_PARTS) {
        snprintf(err, errlen, "partition plan of %d parts: must be 1..%d", p->n_parts,
                 LLAMA_MAX_PARTS);
        return -1;
    }
    if (p->style != LP_STYLE_HCMP && p->style != LP_STYLE_MEGATRON) {
        snprintf(err, errlen, "partition plan: style %d (0: hcmp, 1: megatron)", p->style);
        return -1;
    }
    for (int k = 0; k < LP_N; k++) {
        double sum = 0;
        for (int i = 0; i < p->n_parts; i++) {
            float f = p->frac[k][i];
            if (!isfinite(f) || f < 0) {
                snprintf(err, errlen,
                         "partition plan: the %s share of part %d is %g: must be a finite "
                         "number >= 0",
                         llama_part_kind_names[k], i, (double)f);
                return -1;
            }
            sum += f;
        }
        if (!(sum > 0)) {
            snprintf(err, errlen, "partition plan: the %s shares sum to 0: some part must take it",
                     llama_part_kind_names[k]);
            return -1;
        }
    }
    return 0;
}

size_t llama_partition_pack(const llama_partition *p, float *out)
{
    size_t n = 0;
    for (int k = 0; k < LP_N; k++)
        for (int i = 0; i < p->n_parts && i < LLAMA_MAX_PARTS; i++)
            out[n++] = p->frac[k][i];
    return n;
}

int llama_partition_unpack(llama_partition *p, int n_parts, const float *shares, size_t n,
                           int style, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (n_parts < 1 || n_parts > LLAMA_MAX_PARTS || n != (size_t)LP_N * (size_t)n_parts) {
        snprintf(err, errlen, "partition plan: %zu shares for %d parts (want %d per part, 1..%d "
                 "parts)", n, n_parts, LP_N, LLAMA_MAX_PARTS);
        return -1;
    }
    p->n_parts = n_parts;
    p->style = style;
    for (int k = 0; k < LP_N; k++)
        for (int i = 0; i < n_parts; i++)
            p->frac[k][i] = shares[(size_t)k * (size_t)n_parts + (size_t)i];
    return llama_partition_check(p, err, errlen);
}

/* Range boundaries of `units` split by shares frac[0..n): b[i] = the cumulative share of the
 * parts before i, times units, rounded to whole blocks (b[0] = 0, b[n] = units, never falling). */
static void part_bounds(const float *frac, int n, int64_t units, int64_t block, int64_t *b)
{
    double sum = 0, cum = 0;
    for (int i = 0; i < n; i++)
        sum += frac[i];
    b[0] = 0;
    for (int i = 1; i < n; i++) {
        cum += frac[i - 1];
        int64_t v = (int64_t)floor(cum / sum * (double)units / (double)block + 0.5) * block;
        b[i] = v > units ? units : v < b[i - 1] ? b[i - 1] : v;
    }
    b[n] = units;
}

/* The part whose range of boundaries b (n parts) holds unit u. */
static int part_owner(const int64_t *b, int n, int64_t u)
{
    int i = 0;
    while (i + 1 < n && u >= b[i + 1])
        i++;
    return i;
}

/* The input-column block of a matrix type (kmat_mul_cols' alignment). */
static int64_t col_block(uint32_t type)
{
    const kt_traits *t = kt_traits_of(type);
    return t && t->block > 1 ? t->block : 1;
}

/* Megatron: the gate/up rows of a part are the down projection's input columns, so they are
 * rounded to the down matrices' block (32, or 256 for the K family) rather than 16 rows. */
static int megatron_ffn_block(const llama_model *m)
{
    int64_t b = LLAMA_PART_BLOCK;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        int64_t d = col_block(m->layers[l].w_down.type);
        b = d > b ? d : b;
    }
    return (int)b;
}

/* Megatron: every part's wo input columns (its query heads) must fall on the wo matrices' block
 * boundaries. */
static int megatron_check(const llama_ctx *x, char *err, size_t errlen)
{
    const llama_model *m = x->m;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        int64_t b = col_block(m->layers[l].wo.type);
        for (int i = 0; i <= x->p.n_parts; i++)
            if ((x->bnd[LP_QKV][i] * m->cfg.head_dim) % b) {
                snprintf(err, errlen,
                         "megatron plan: part %d's attention output starts at column %lld, not "
                         "on a %s block of %lld (give the parts whole groups of heads)",
                         i, (long long)(x->bnd[LP_QKV][i] * m->cfg.head_dim),
                         kt_traits_of(m->layers[l].wo.type)->name, (long long)b);
                return -1;
            }
    }
    return 0;
}

int llama_ctx_set_partition(llama_ctx *x, const llama_partition *plan, char *err, size_t errlen)
{
    const llama_config *c = &x->m->cfg;
    int N = x->p.n_parts, me = x->p.part, group = c->n_heads / c->n_kv_heads;
    if (plan) {
        if (llama_partition_check(plan, err, errlen))
            return -1;
        if (plan->n_parts != N) {
            snprintf(err, errlen, "partition plan of %d parts for a context that is part %d of %d",
                     plan->n_parts, me, N);
            return -1;
        }
        int unit_block[LP_N] = {1, LLAMA_PART_BLOCK, LLAMA_PART_BLOCK, LLAMA_PART_BLOCK,
                                LLAMA_PART_BLOCK, 1, 1};
        if (plan->style == LP_STYLE_MEGATRON)
            unit_block[LP_FFN_UP] = megatron_ffn_block(x->m);
        const int64_t units[LP_N] = {c->n_heads, c->dim, c->ffn, c->dim, c->vocab, c->n_heads,
                                     c->n_heads};
        for (int k = 0; k < LP_N; k++)
            part_bounds(plan->frac[k], N, units[k], unit_block[k], x->bnd[k]);
        part_bounds(plan->frac[LP_QKV], N, c->n_kv_heads, 1, x->kvb);
        if (plan->style == LP_STYLE_MEGATRON) {
            /* attention on the part's own heads: its KV heads and their query heads */
            for (int i = 0; i <= N; i++)
                x->bnd[LP_QKV][i] = x->bnd[LP_ATT_DENSE][i] = x->bnd[LP_ATT_SPARSE][i] =
                    x->kvb[i] * group;
            if (megatron_check(x, err, errlen))
                return -1;
        }
    } else if (x->p.kv_dup) {
        if (N > c->n_heads) {
            snprintf(err, errlen, "%d parts without a partition plan: at most %d (one query head "
                     "each)", N, c->n_heads);
            return -1;
        }
        /* even by query heads; part i owns the KV heads whose first query head it has */
        for (int i = 0; i <= N; i++) {
            int64_t h = (int64_t)c->n_heads * i / N;
            x->bnd[LP_QKV][i] = x->bnd[LP_ATT_DENSE][i] = x->bnd[LP_ATT_SPARSE][i] = h;
            x->kvb[i] = (h + group - 1) / group;
            x->bnd[LP_WO][i] = x->bnd[LP_FFN_DOWN][i] = (int64_t)c->dim * i / N;
            x->bnd[LP_FFN_UP][i] = (int64_t)c->ffn * i / N;
            x->bnd[LP_LM_HEAD][i] = (int64_t)c->vocab * i / N;
        }
    } else {
        if (N > c->n_kv_heads) {
            snprintf(err, errlen, "%d parts without a partition plan: at most %d (one KV head each)",
                     N, c->n_kv_heads);
            return -1;
        }
        /* even: each part its KV heads and their query heads, every row range n * i / N */
        for (int i = 0; i <= N; i++) {
            x->kvb[i] = (int64_t)c->n_kv_heads * i / N;
            x->bnd[LP_QKV][i] = x->bnd[LP_ATT_DENSE][i] = x->bnd[LP_ATT_SPARSE][i] =
                x->kvb[i] * group;
            x->bnd[LP_WO][i] = x->bnd[LP_FFN_DOWN][i] = (int64_t)c->dim * i / N;
            x->bnd[LP_FFN_UP][i] = (int64_t)c->ffn * i / N;
            x->bnd[LP_LM_HEAD][i] = (int64_t)c->vocab * i / N;
        }
    }
    x->megatron = plan && plan->style == LP_STYLE_MEGATRON;
    bool dup = !plan && x->p.kv_dup;
    x->own0 = (int)x->kvb[me];
    x->own1 = (int)x->kvb[me + 1];
    /* kv_dup: every KV head of this part's query heads, owned or not */
    x->kvh0 = dup ? (int)(x->bnd[LP_QKV][me] / group) : x->own0;
    x->kvh1 = dup ? (int)((x->bnd[LP_QKV][me + 1] + group - 1) / group) : x->own1;
    if (x->kvh1 < x->kvh0)
        x->kvh1 = x->kvh0;
    if (dup && !x->kvp) {
        x->kvp = malloc((size_t)2 * (size_t)x->p.max_width * (size_t)x->kv_row * sizeof(float));
        if (!x->kvp) {
            snprintf(err, errlen, "out of memory for the private K/V projections");
            return -1;
        }
    }
    x->kv_private = dup;
    if (x->kvh0 < x->own0 || x->kvh1 > x->own1) {
        size_t need = (size_t)c->n_layers * 2 * (size_t)(x->kvh1 - x->kvh0) *
                      (size_t)x->p.max_width * (size_t)c->head_dim * x->kv_elem;
        if (need > x->priv_bytes) {
            uint8_t *t = realloc(x->priv_tree, need);
            if (!t) {
                snprintf(err, errlen, "out of memory for %zu bytes of private tree rows", need);
                return -1;
            }
            x->priv_tree = t;
            x->priv_bytes = need;
        }
    }
    /* Attention needs the others' projections first when a head's query, or the tree K/V its
     * sparse part reads, was computed by another part (every part decides the same way); a
     * head whose dense and sparse parts differ is merged after attention. */
    x->att_sync = false;
    x->n_split = x->n_units = x->n_singles = 0;
    for (int h = 0; h < c->n_heads; h++) {
        /* kv_dup: the part of a query head projects its KV head itself */
        int qo = part_owner(x->bnd[LP_QKV], N, h),
            ko = dup ? qo : part_owner(x->kvb, N, h / group);
        int dn = part_owner(x->bnd[LP_ATT_DENSE], N, h);
        int sp = part_owner(x->bnd[LP_ATT_SPARSE], N, h);
        if (dn != qo || sp != qo || sp != ko)
            x->att_sync = true;
        if (dn != sp)
            x->split_heads[x->n_split++] = h;
        int mode = dn == me && sp == me ? ATT_FULL : dn == me ? ATT_DENSE : sp == me ? ATT_SPARSE
                                                                                        : -1;
        if (mode < 0)
            continue;
        x->singles[x->n_singles++] = (struct att_unit){h, 1, h / group, mode};
        struct att_unit *u = x->n_units ? &x->units[x->n_units - 1] : NULL;
        if (u && u->kvh == h / group && u->mode == mode && u->h0 + u->nh == h)
            u->nh++;
        else
            x->units[x->n_units++] = (struct att_unit){h, 1, h / group, mode};
    }
    x->tree_open = false; /* the next forward starts a fresh tree under the new ranges */
    return 0;
}

void llama_ctx_part_range(const llama_ctx *x, int kind, int64_t *lo, int64_t *hi)
{
    *lo = x->bnd[kind][x->p.part];
    *hi = x->bnd[kind][x->p.part + 1];
}

void llama_part_cols_of(const llama_ctx *x, llama_part_cols *r)
{
    int64_t hd = x->m->cfg.head_dim;
    llama_ctx_part_range(x, LP_WO, &r->d0, &r->d1);
    llama_ctx_part_range(x, LP_FFN_DOWN, &r->e0, &r->e1);
    llama_ctx_part_range(x, LP_FFN_UP, &r->f0, &r->f1);
    llama_ctx_part_range(x, LP_QKV, &r->q0, &r->q1);
    llama_ctx_part_range(x, LP_LM_HEAD, &r->v0, &r->v1);
    r->q0 *= hd;
    r->q1 *= hd;
    r->k0 = (int64_t)x->kvh0 * hd;
    r->k1 = (int64_t)x->kvh1 * hd;
}

int llama_ctx_syncs_per_layer(const llama_ctx *x)
{
    return x->att_sync ? 5 : 4;
}
