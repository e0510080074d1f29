/*
 * bench/tree_attention.c — `orochi bench --tree-attention`: the tree part of verification
 * attention computed three ways, after Figure 10(b) of the Ghidorah paper (naive sparse vs
 * optimised sparse vs treating the tree part as dense).
 *
 * A token tree of W nodes (each width of --widths) is built deterministically: node 0 is a child
 * of the committed prefix; node i > 0 continues the chain (parent i - 1) with probability 1/2,
 * else its parent is uniform in [-1, i - 1], where -1 means another child of the prefix. Every
 * node has --heads query heads sharing --kv-heads KV heads of --head-dim (SmolLM2-135M's shape by
 * default), and the tree's own K/V rows (f32, or f16 with --kv f16) in the engine's layout: per
 * KV head, W rows of head_dim. Each query attends to its ancestors and itself, root first, and
 * every strategy leaves the same unnormalised partial (katt_stat + out) per (node, query head):
 *   naive_sparse       per node and head, the ancestor list walked with plain scalar loops (dot
 *                      product, running max and sum, AV accumulation): what a straightforward
 *                      implementation writes;
 *   katt_sparse        the engine's sparse (COO) kernel, per node and head, idx = the ancestors;
 *   katt_causal_group  the engine's grouped path, what the forward runs: per node and KV head, the
 *                      query heads sharing it in one call over a key stream with no prefix
 *                      (n_prefix = 0) and tree_slot = the node's ancestors;
 *   dense              katt_dense over all W tree rows per node and head, non-ancestors included:
 *                      the cost of treating the tree part as dense (its result differs).
 * Before timing, naive_sparse, katt_sparse, katt_causal_group and a masked dense pass (all W
 * scores, non-ancestors set to -inf before the softmax) must agree after normalisation (relative
 * max error <= 1e-4), else exit 1. Timing: one thread; after a warm-up pass of each, the
 * strategies run in turn, one whole tree (all nodes, all heads) each per repetition, so load on
 * the machine falls on all of them alike; each reports its median over --reps in microseconds. A
 * table goes to stdout and one JSON object per (W, strategy) is appended to --json FILE
 * (bench/results/tree_attention.jsonl by default).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "kernels/cpu/kernels.h"

#define TA_MAX_WIDTHS 16
#define TA_MAX_WIDTH 1024
#define TA_MAX_HEAD_DIM 512 /* the kernels' limit (ATT_MAX_HEAD_DIM in kernels/cpu/attention.c) */
#define TA_TOLERANCE 1e-4
#define TA_N_STRATEGIES 4

enum { TA_NAIVE, TA_SPARSE, TA_GROUP, TA_DENSE };
static const char *const ta_names[TA_N_STRATEGIES] = {"naive_sparse", "katt_sparse",
                                                      "katt_causal_group", "dense"};

typedef struct {
    int widths[TA_MAX_WIDTHS], n_widths;
    long heads, kv_heads, head_dim, reps;
    kv_type kv;
    const char *json;
} ta_opts;

/* One tree with its queries, K/V rows and ancestor lists. */
typedef struct {
    int w, heads, kv_heads, head_dim, group;
    kv_type kv;
    float scale;
    int32_t *parent; /* w: the parent's index, -1 = a child of the prefix */
    int32_t *anc;    /* w * w: node i's ancestors at anc + i * w, root first, itself last */
    int *n_anc;      /* w */
    float *q;        /* [w][heads][head_dim] */
    void *k, *v;     /* [kv_heads][w][head_dim] of kv */
} ta_tree;

/* The partial results of one strategy. */
typedef struct {
    katt_stat *st; /* [w][heads] */
    float *out;    /* [w][heads][head_dim] */
} ta_result;

static volatile float ta_sink; /* keeps the timed passes from being optimised away */

static uint32_t ta_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(*s >> 33);
}

static float ta_uniform(uint64_t *s) /* in [-1, 1) */
{
    return (float)ta_rand(s) / (float)(1u << 30) - 1.0f;
}

static size_t ta_esz(kv_type kv)
{
    return kv == KV_F16 ? 2 : 4;
}

/* KV head h's rows (K or V). */
static const void *ta_head_rows(const ta_tree *t, const void *base, int h)
{
    return (const uint8_t *)base + (size_t)h * (size_t)t->w * (size_t)t->head_dim * ta_esz(t->kv);
}

static float ta_elem(const void *base, kv_type kv, int64_t i)
{
    return kv == KV_F32 ? ((const float *)base)[i] : kt_f16_to_f32(((const uint16_t *)base)[i]);
}

static void ta_tree_free(ta_tree *t)
{
    free(t->parent);
    free(t->anc);
    free(t->n_anc);
    free(t->q);
    free(t->k);
    free(t->v);
    memset(t, 0, sizeof *t);
}

/* Build the tree of width w (the rule in the top comment, a fixed seed per width) and fill q, k
 * and v with uniform values in [-1, 1). -1 when out of memory. */
static int ta_tree_new(ta_tree *t, int w, const ta_opts *o)
{
    *t = (ta_tree){.w = w,
                   .heads = (int)o->heads,
                   .kv_heads = (int)o->kv_heads,
                   .head_dim = (int)o->head_dim,
                   .group = (int)(o->heads / o->kv_heads),
                   .kv = o->kv,
                   .scale = 1.0f / sqrtf((float)o->head_dim)};
    size_t nq = (size_t)w * (size_t)t->heads * (size_t)t->head_dim;
    size_t nkv = (size_t)t->kv_heads * (size_t)w * (size_t)t->head_dim;
    t->parent = malloc((size_t)w * sizeof *t->parent);
    t->anc = malloc((size_t)w * (size_t)w * sizeof *t->anc);
    t->n_anc = malloc((size_t)w * sizeof *t->n_anc);
    t->q = malloc(nq * sizeof *t->q);
    t->k = malloc(nkv * ta_esz(t->kv));
    t->v = malloc(nkv * ta_esz(t->kv));
    if (!t->parent || !t->anc || !t->n_anc || !t->q || !t->k || !t->v) {
        ta_tree_free(t);
        return -1;
    }
    uint64_t s = 0x7265655f61747400ull + (uint64_t)w;
    for (int i = 0; i < w; i++) {
        if (i == 0)
            t->parent[i] = -1;
        else if (ta_rand(&s) & 1)
            t->parent[i] = i - 1;
        else
            t->parent[i] = (int32_t)(ta_rand(&s) % (uint32_t)(i + 1)) - 1;
        int32_t *a = t->anc + (size_t)i * (size_t)w, p = t->parent[i];
        int n = 0;
        if (p >= 0) {
            n = t->n_anc[p];
            memcpy(a, t->anc + (size_t)p * (size_t)w, (size_t)n * sizeof *a);
        }
        a[n++] = i;
        t->n_anc[i] = n;
    }
    for (size_t i = 0; i < nq; i++)
        t->q[i] = ta_uniform(&s);
    for (int m = 0; m < 2; m++) {
        void *dst = m ? t->v : t->k;
        for (size_t i = 0; i < nkv; i++) {
            float x = ta_uniform(&s);
            if (t->kv == KV_F32)
                ((float *)dst)[i] = x;
            else
                ((uint16_t *)dst)[i] = kt_f32_to_f16(x);
        }
    }
    return 0;
}

/* naive_sparse: every (node, head) over its ancestor list, plain scalar loops. */
static void ta_naive(const ta_tree *t, ta_result *r)
{
    int hd = t->head_dim;
    for (int i = 0; i < t->w; i++) {
        const int32_t *anc = t->anc + (size_t)i * (size_t)t->w;
        for (int h = 0; h < t->heads; h++) {
            size_t row = (size_t)i * (size_t)t->heads + (size_t)h;
            const float *q = t->q + row * (size_t)hd;
            float *o = r->out + row * (size_t)hd;
            const void *kb = ta_head_rows(t, t->k, h / t->group);
            const void *vb = ta_head_rows(t, t->v, h / t->group);
            float mx = -INFINITY, sum = 0;
            for (int d = 0; d < hd; d++)
                o[d] = 0;
            for (int a = 0; a < t->n_anc[i]; a++) {
                int64_t base = (int64_t)anc[a] * hd;
                float s = 0;
                for (int d = 0; d < hd; d++)
                    s += q[d] * ta_elem(kb, t->kv, base + d);
                s *= t->scale;
                if (s > mx) { /* rescale what was summed to the new max */
                    float c = expf(mx - s);
                    for (int d = 0; d < hd; d++)
                        o[d] *= c;
                    sum *= c;
                    mx = s;
                }
                float e = expf(s - mx);
                for (int d = 0; d < hd; d++)
                    o[d] += e * ta_elem(vb, t->kv, base + d);
                sum += e;
            }
            r->st[row].max = mx;
            r->st[row].sum = sum;
        }
    }
}

/* Per (node, head): katt_sparse over the node's ancestors, or (dense) katt_dense over all w tree
 * rows. */
static void ta_per_head(const ta_tree *t, ta_result *r, bool dense)
{
    int hd = t->head_dim;
    for (int i = 0; i < t->w; i++)
        for (int h = 0; h < t->heads; h++) {
            size_t row = (size_t)i * (size_t)t->heads + (size_t)h;
            katt_kv kv = {.type = t->kv,
                          .k = ta_head_rows(t, t->k, h / t->group),
                          .v = ta_head_rows(t, t->v, h / t->group),
                          .stride = hd};
            float *out = r->out + row * (size_t)hd;
            if (dense)
                katt_dense(t->q + row * (size_t)hd, &kv, t->w, hd, t->scale, &r->st[row], out);
            else
                katt_sparse(t->q + row * (size_t)hd, &kv, t->anc + (size_t)i * (size_t)t->w,
                            t->n_anc[i], hd, t->scale, &r->st[row], out);
        }
}

static void ta_sparse(const ta_tree *t, ta_result *r)
{
    ta_per_head(t, r, false);
}

static void ta_dense(const ta_tree *t, ta_result *r)
{
    ta_per_head(t, r, true);
}

/* katt_causal_group per (node, KV head): its query heads in one call over the key stream of the
 * node's ancestors (no prefix). */
static void ta_group(const ta_tree *t, ta_result *r)
{
    int hd = t->head_dim;
    for (int i = 0; i < t->w; i++)
        for (int kvh = 0; kvh < t->kv_heads; kvh++) {
            size_t row = (size_t)i * (size_t)t->heads + (size_t)kvh * (size_t)t->group;
            const void *k = ta_head_rows(t, t->k, kvh), *v = ta_head_rows(t, t->v, kvh);
            katt_keys s = {.type = t->kv,
                           .k = k,
                           .v = v,
                           .tree_k = k,
                           .tree_v = v,
                           .stride = hd,
                           .n_prefix = 0,
                           .tree_slot = t->anc + (size_t)i * (size_t)t->w};
            katt_causal_group(t->q + row * (size_t)hd, hd, t->group, &s, t->n_anc[i], hd, t->scale,
                              &r->st[row], r->out + row * (size_t)hd, hd);
        }
}

/* Masked dense (the check only): all w scores per (node, head), non-ancestors set to -inf, then
 * one softmax pass — the sparse partial computed the dense way. sc holds w floats, mask w * w. */
static void ta_masked_dense(const ta_tree *t, const uint8_t *mask, float *sc, ta_result *r)
{
    int hd = t->head_dim;
    for (int i = 0; i < t->w; i++)
        for (int h = 0; h < t->heads; h++) {
            size_t row = (size_t)i * (size_t)t->heads + (size_t)h;
            const float *q = t->q + row * (size_t)hd;
            float *o = r->out + row * (size_t)hd;
            const void *kb = ta_head_rows(t, t->k, h / t->group);
            const void *vb = ta_head_rows(t, t->v, h / t->group);
            float mx = -INFINITY, sum = 0;
            for (int p = 0; p < t->w; p++) {
                float s = 0;
                for (int d = 0; d < hd; d++)
                    s += q[d] * ta_elem(kb, t->kv, (int64_t)p * hd + d);
                sc[p] = mask[(size_t)i * (size_t)t->w + (size_t)p] ? s * t->scale : -INFINITY;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            for (int d = 0; d < hd; d++)
                o[d] = 0;
            for (int p = 0; p < t->w; p++) {
                float e = expf(sc[p] - mx); /* 0 for the masked */
                sum += e;
                for (int d = 0; d < hd; d++)
                    o[d] += e * ta_elem(vb, t->kv, (int64_t)p * hd + d);
            }
            r->st[row].max = mx;
            r->st[row].sum = sum;
        }
}

/* The largest relative difference between two results after katt_finish: per (node, head), the
 * largest |a - b| over the largest |b| of the row, and the log-sum-exp (max + log sum) difference
 * relative to max(1, |lse|). tmp holds 2 * head_dim floats. */
static double ta_rel_error(const ta_tree *t, const ta_result *a, const ta_result *b, float *tmp)
{
    int hd = t->head_dim;
    size_t rows = (size_t)t->w * (size_t)t->heads;
    double worst = 0;
    for (size_t row = 0; row < rows; row++) {
        float *x = tmp, *y = tmp + hd;
        memcpy(x, a->out + row * (size_t)hd, (size_t)hd * sizeof *x);
        memcpy(y, b->out + row * (size_t)hd, (size_t)hd * sizeof *y);
        katt_finish(&a->st[row], x, hd);
        katt_finish(&b->st[row], y, hd);
        double diff = 0, mag = 0;
        for (int d = 0; d < hd; d++) {
            diff = fmax(diff, fabs((double)x[d] - (double)y[d]));
            mag = fmax(mag, fabs((double)y[d]));
        }
        double e = mag > 0 ? diff / mag : diff;
        double la = a->st[row].max + log(a->st[row].sum), lb = b->st[row].max + log(b->st[row].sum);
        double el = fabs(la - lb) / fmax(1.0, fabs(lb));
        if (!(e <= worst)) /* NaN counts as the worst */
            worst = e;
        if (!(el <= worst))
            worst = el;
    }
    return worst;
}

static void ta_run(int strategy, const ta_tree *t, ta_result *r)
{
    switch (strategy) {
    case TA_NAIVE: ta_naive(t, r); break;
    case TA_SPARSE: ta_sparse(t, r); break;
    case TA_GROUP: ta_group(t, r); break;
    default: ta_dense(t, r); break;
    }
    ta_sink += r->out[0];
}

static void ta_usage(FILE *out)
{
    fprintf(out,
            "usage: orochi bench --tree-attention [--widths 4,8,16,32,64] [--heads 9]\n"
            "                    [--kv-heads 3] [--head-dim 64] [--kv f32|f16] [--reps 50]\n"
            "                    [--json FILE]\n"
            "  The tree part of verification attention (Ghidorah Fig. 10(b)), one thread: each\n"
            "  node of a W-node token tree attends to its ancestors, computed by naive scalar\n"
            "  loops, by katt_sparse, by katt_causal_group, and densely over all W rows\n"
            "  (katt_dense). Checks that the sparse results agree, then prints the median us per\n"
            "  tree over --reps and appends JSON lines to --json FILE\n"
            "  (bench/results/tree_attention.jsonl by default).\n");
}

/* Check and time one width: us[strategy] gets the medians. 0, 1 on disagreement (message
 * printed), -1 when out of memory. */
static int ta_width(const ta_opts *o, int w, double *us, double *anc_per_node)
{
    ta_tree t;
    if (ta_tree_new(&t, w, o))
        return -1;
    size_t rows = (size_t)w * (size_t)t.heads, hd = (size_t)t.head_dim;
    ta_result res[TA_N_STRATEGIES + 1] = {{0}}; /* the last: masked dense */
    uint8_t *mask = calloc((size_t)w * (size_t)w, 1);
    float *sc = malloc((size_t)w * sizeof *sc), *tmp = malloc(2 * hd * sizeof *tmp);
    double *times = malloc((size_t)TA_N_STRATEGIES * (size_t)o->reps * sizeof *times);
    int rc = -1;
    bool ok = mask && sc && tmp && times;
    for (int s = 0; s <= TA_N_STRATEGIES; s++) {
        res[s].st = malloc(rows * sizeof *res[s].st);
        res[s].out = malloc(rows * hd * sizeof *res[s].out);
        ok = ok && res[s].st && res[s].out;
    }
    if (!ok)
        goto done;

    long pairs = 0;
    for (int i = 0; i < w; i++) {
        pairs += t.n_anc[i];
        for (int a = 0; a < t.n_anc[i]; a++)
            mask[(size_t)i * (size_t)w + (size_t)t.anc[(size_t)i * (size_t)w + (size_t)a]] = 1;
    }
    *anc_per_node = (double)pairs / w;

    /* agreement (the passes double as the warm-up) */
    for (int s = 0; s < TA_N_STRATEGIES; s++)
        ta_run(s, &t, &res[s]);
    ta_masked_dense(&t, mask, sc, &res[TA_N_STRATEGIES]);
    static const struct {
        int s;
        const char *name;
    } checks[] = {{TA_SPARSE, "katt_sparse"},
                  {TA_GROUP, "katt_causal_group"},
                  {TA_N_STRATEGIES, "masked dense"}};
    for (size_t c = 0; c < sizeof checks / sizeof *checks; c++) {
        double e = ta_rel_error(&t, &res[checks[c].s], &res[TA_NAIVE], tmp);
        if (!(e <= TA_TOLERANCE)) {
            fprintf(stderr,
                    "orochi bench: tree attention W=%d: %s disagrees with naive sparse "
                    "(relative max error %.3g > %g)\n",
                    w, checks[c].name, e, TA_TOLERANCE);
            rc = 1;
            goto done;
        }
    }

    for (long r = 0; r < o->reps; r++)
        for (int s = 0; s < TA_N_STRATEGIES; s++) {
            double t0 = cli_now();
            ta_run(s, &t, &res[s]);
            times[(size_t)s * (size_t)o->reps + (size_t)r] = cli_now() - t0;
        }
    for (int s = 0; s < TA_N_STRATEGIES; s++)
        us[s] = 1e6 * cli_median(times + (size_t)s * (size_t)o->reps, (int)o->reps);
    rc = 0;
done:
    for (int s = 0; s <= TA_N_STRATEGIES; s++) {
        free(res[s].st);
        free(res[s].out);
    }
    free(mask);
    free(sc);
    free(tmp);
    free(times);
    ta_tree_free(&t);
    return rc;
}

int bench_tree_attention(int argc, char **argv)
{
    ta_opts o = {.heads = 9,
                 .kv_heads = 3,
                 .head_dim = 64,
                 .reps = 50,
                 .kv = KV_F32,
                 .json = "bench/results/tree_attention.jsonl"};
    o.n_widths = cli_int_list("bench", "--widths", "4,8,16,32,64", 1, TA_MAX_WIDTH, o.widths,
                              TA_MAX_WIDTHS);
    for (int i = 1; i < argc; i++) { /* argv[0] is --tree-attention */
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            ta_usage(stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) || !strcmp(a, "--")) {
            fprintf(stderr, "orochi bench: unexpected argument '%s'\n", a);
            return 2;
        }
        if (strcmp(a, "--widths") && strcmp(a, "--heads") && strcmp(a, "--kv-heads") &&
            strcmp(a, "--head-dim") && strcmp(a, "--reps") && strcmp(a, "--kv") &&
            strcmp(a, "--json")) {
            fprintf(stderr, "orochi bench: unknown option '%s' for --tree-attention\n", a);
            return 2;
        }
        if (!(v = cli_value("bench", argc, argv, &i)))
            return 2;
        if (!strcmp(a, "--widths")) {
            o.n_widths = cli_int_list("bench", "--widths", v, 1, TA_MAX_WIDTH, o.widths,
                                      TA_MAX_WIDTHS);
            if (o.n_widths < 1)
                return 2;
        } else if (!strcmp(a, "--heads")) {
            if (!cli_int("bench", a, v, 1, 256, &o.heads))
                return 2;
        } else if (!strcmp(a, "--kv-heads")) {
            if (!cli_int("bench", a, v, 1, 256, &o.kv_heads))
                return 2;
        } else if (!strcmp(a, "--head-dim")) {
            if (!cli_int("bench", a, v, 1, TA_MAX_HEAD_DIM, &o.head_dim))
                return 2;
        } else if (!strcmp(a, "--reps")) {
            if (!cli_int("bench", a, v, 1, 100000, &o.reps))
                return 2;
        } else if (!strcmp(a, "--kv")) {
            if (strcmp(v, "f32") && strcmp(v, "f16")) {
                fprintf(stderr, "orochi bench: --kv expects f32 or f16, got '%s'\n", v);
                return 2;
            }
            o.kv = strcmp(v, "f16") ? KV_F32 : KV_F16;
        } else {
            o.json = v;
        }
    }
    if (o.heads % o.kv_heads) {
        fprintf(stderr, "orochi bench: --kv-heads %ld must divide --heads %ld\n", o.kv_heads,
                o.heads);
        return 2;
    }

    FILE *js = cli_open_append(o.json);
    if (!js)
        fprintf(stderr, "orochi bench: cannot open %s for JSON lines; table only\n", o.json);
    const char *kvname = o.kv == KV_F16 ? "f16" : "f32";
    printf("tree attention, tree part only: %ld query heads over %ld KV heads, head_dim %ld, KV "
           "%s, 1 thread\n",
           o.heads, o.kv_heads, o.head_dim, kvname);
    printf("tree: node 0 a child of the prefix; node i continues the chain with probability 1/2, "
           "else its parent is uniform in [-1, i-1]\n");
    printf("us per tree (all nodes, all heads), median of %ld after a warm-up\n\n", o.reps);
    printf("%5s %8s %12s %12s %18s %10s %7s %7s %7s %7s\n", "", "", "", "", "", "", "naive/",
           "dense/", "naive/", "dense/");
    printf("%5s %8s %12s %12s %18s %10s %7s %7s %7s %7s\n", "W", "anc/node", "naive_sparse",
           "katt_sparse", "katt_causal_group", "dense", "sparse", "sparse", "group", "group");
    int rc = 0;
    for (int wi = 0; wi < o.n_widths; wi++) {
        int w = o.widths[wi];
        double us[TA_N_STRATEGIES], anc;
        int r = ta_width(&o, w, us, &anc);
        if (r) {
            if (r < 0)
                fprintf(stderr, "orochi bench: out of memory for the tree of width %d\n", w);
            rc = 1;
            break;
        }
        printf("%5d %8.2f %12.2f %12.2f %18.2f %10.2f %6.2fx %6.2fx %6.2fx %6.2fx\n", w, anc,
               us[TA_NAIVE], us[TA_SPARSE], us[TA_GROUP], us[TA_DENSE],
               us[TA_NAIVE] / us[TA_SPARSE], us[TA_DENSE] / us[TA_SPARSE],
               us[TA_NAIVE] / us[TA_GROUP], us[TA_DENSE] / us[TA_GROUP]);
        fflush(stdout);
        double la = cli_loadavg();
        for (int s = 0; js && s < TA_N_STRATEGIES; s++)
            fprintf(js,
                    "{\"bench\":\"tree_attention\",\"width\":%d,\"strategy\":\"%s\",\"us\":%.3f,"
                    "\"heads\":%ld,\"kv_heads\":%ld,\"head_dim\":%ld,\"kv\":\"%s\",\"reps\":%ld,"
                    "\"anc_per_node\":%.3f,\"loadavg\":%.2f}\n",
                    w, ta_names[s], us[s], o.heads, o.kv_heads, o.head_dim, kvname, o.reps, anc,
                    la);
    }
    if (js) {
        fclose(js);
        if (!rc)
            fprintf(stderr, "orochi bench: JSON lines appended to %s\n", o.json);
    }
    if (!rc)
        printf("\nnaive_sparse, katt_sparse, katt_causal_group and masked dense agreed "
               "(relative max error <= %g)\n",
               TA_TOLERANCE);
    return rc;
}
