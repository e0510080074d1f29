/*
 * coordinator/coord_plan.c — the coordinator follows the plan `orochi profile` wrote (--plan FILE;
 * schema: docs/speculation.md, "The plan"). Per context-length bucket the plan gives the
 * verification width (1: do not speculate there), the speculation length to start from and the
 * tree shape: each step's merged drafts are fitted to that shape (ctl_tree_fit: only nodes whose
 * path of sibling ranks is in the tree) before the vote; the adaptive length then moves within
 * [1, width - 1] and the guard keeps watch on top. A bucket whose "speculate" is false (the
 * profile measured plain decoding faster) starts with the guard off and probing four times less
 * often. The file is checked once a second and reread when its modification time changes, so a
 * new profile takes effect without a restart; a plan that fails to parse at run time is reported
 * and the old one kept. The plan's "partition" (how the workers share each kind of a step's work:
 * model/llama.h, llama_partition) goes to the workers in Welcome and, when it changes, in a
 * Reconfigure; every step carries the generation it must run with, so the swap happens at a step
 * boundary on all of them at once.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "coordinator/coord.h"

#define PLAN_MAX_BUCKETS 16

struct coord_plan {
    llama_partition part; /* "partition" (part_set: given) */
    bool part_set;
    int n;
    int ctx[PLAN_MAX_BUCKETS], width[PLAN_MAX_BUCKETS], length[PLAN_MAX_BUCKETS];
    bool speculate[PLAN_MAX_BUCKETS];
    ctl_template tree[PLAN_MAX_BUCKETS]; /* n = 0: none given */
    /* curves.step_ms of each bucket as cost[w] = t(w) / t(1), interpolated between the measured
     * widths up to the largest one, cost_w (0: not measured) */
    float cost[PLAN_MAX_BUCKETS][RT_MAX_WIDTH + 1];
    int cost_w[PLAN_MAX_BUCKETS];
};

/* "tree": [[parent, rank], ...] — node i + 1 is the rank-th candidate below node parent (0: the
 * root), parents first. Returns 0, or -1 for a malformed tree. */
static int plan_tree(const cJSON *a, ctl_template *t)
{
    t->n = 0;
    if (!a)
        return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) >= CTL_TREE_CAP)
        return -1;
    t->n = 1;
    t->parent[0] = -1;
    t->rank[0] = t->depth[0] = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a)
    {
        const cJSON *p = cJSON_GetArrayItem(e, 0), *r = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || !cJSON_IsNumber(p) || !cJSON_IsNumber(r) || p->valueint < 0 ||
            p->valueint >= t->n || r->valueint < 0)
            return -1;
        int i = t->n++;
        t->parent[i] = p->valueint;
        t->rank[i] = r->valueint;
        t->depth[i] = t->depth[p->valueint] + 1;
    }
    if (t->n == 1)
        t->n = 0; /* an empty tree: no shape to apply */
    return 0;
}

static char *plan_read(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read the plan %s", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 && n < (64l << 20) ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        snprintf(err, errlen, "cannot read the plan %s", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* "partition": {"parts": N, "style": "hcmp" | "megatron", "all": [...], "qkv": [...], ...}: each
 * kind's shares, N numbers (model/llama.h, llama_partition); a kind not given takes "all", the
 * attention kinds "qkv" before that, and the even split when neither is there. N must be the
 * group's worker count. */
static int plan_partition(const coord *c, const cJSON *o, llama_partition *lp, char *err,
                          size_t errlen)
{
    const cJSON *np = cJSON_GetObjectItemCaseSensitive(o, "parts");
    if (!cJSON_IsObject(o) || !cJSON_IsNumber(np) || np->valueint != c->opt.n_workers) {
        snprintf(err, errlen,
                 "the plan %s: \"partition\" needs \"parts\": the group's worker count (%d)",
                 c->opt.plan_path, c->opt.n_workers);
        return -1;
    }
    int n = np->valueint;
    memset(lp, 0, sizeof *lp);
    lp->n_parts = n;
    const cJSON *style = cJSON_GetObjectItemCaseSensitive(o, "style");
    if (style && (!cJSON_IsString(style) || (strcmp(style->valuestring, "hcmp") &&
                                             strcmp(style->valuestring, "megatron")))) {
        snprintf(err, errlen, "the plan %s: the partition's \"style\" must be \"hcmp\" or "
                              "\"megatron\"",
                 c->opt.plan_path);
        return -1;
    }
    lp->style = style && !strcmp(style->valuestring, "megatron") ? LP_STYLE_MEGATRON
                                                                  : LP_STYLE_HCMP;
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(o, "all");
    for (int k = 0; k < LP_N; k++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, llama_part_kind_names[k]);
        if (!a && (k == LP_ATT_DENSE || k == LP_ATT_SPARSE))
            a = cJSON_GetObjectItemCaseSensitive(o, llama_part_kind_names[LP_QKV]);
        if (!a)
            a = all;
        for (int i = 0; i < n; i++) {
            const cJSON *v = a ? cJSON_GetArrayItem(a, i) : NULL;
            if (a && (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != n || !cJSON_IsNumber(v))) {
                snprintf(err, errlen,
                         "the plan %s: the partition's %s shares must be %d numbers, one per "
                         "worker",
                         c->opt.plan_path, llama_part_kind_names[k], n);
                return -1;
            }
            lp->frac[k][i] = a ? (float)v->valuedouble : 1.0f;
        }
    }
    /* "devices" (orochi bench --search writes it): the partition was found for workers of these
     * kinds in this order; shares for a GPU put on a CPU worker would be wrong, not slow */
    const cJSON *devs = cJSON_GetObjectItemCaseSensitive(o, "devices");
    for (int i = 0; devs && i < n; i++) {
        const cJSON *d = cJSON_GetArrayItem(devs, i);
        const char *mine = c->opt.worker_device[i][0] ? c->opt.worker_device[i] : "cpu";
        if (!cJSON_IsArray(devs) || cJSON_GetArraySize(devs) != n || !cJSON_IsString(d)) {
            snprintf(err, errlen, "the plan %s: the partition's \"devices\" must be %d words "
                                  "(cpu or gpu), one per worker", c->opt.plan_path, n);
            return -1;
        }
        if (strcmp(d->valuestring, mine)) {
            snprintf(err, errlen,
                     "the plan %s: the partition was found for worker %d on the %s, and this "
                     "group's worker %d runs on the %s (--workers: the same devices in the same "
                     "order, or a new search)",
                     c->opt.plan_path, i, d->valuestring, i, mine);
            return -1;
        }
    }
    const cJSON *reason = cJSON_GetObjectItemCaseSensitive(o, "why");
    if (cJSON_IsString(reason))
        rt_log("coordinator", "the plan's devices: %s", reason->valuestring);
    char why[256];
    if (llama_partition_check(lp, why, sizeof why)) {
        snprintf(err, errlen, "the plan %s: %s", c->opt.plan_path, why);
        return -1;
    }
    return 0;
}

static int plan_int(const cJSON *o, const char *key, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v))
        return -1;
    *out = v->valueint;
    return 0;
}

/* curves.step_ms["CTX"]: t(W) at each of "widths", for bucket i (ctx) as its cost curve, made
 * non-decreasing. A missing or malformed curve only leaves the bucket without one (cost_w 0). */
static void plan_costs(const cJSON *root, struct coord_plan *p, int i, int max_width)
{
    char key[24];
    snprintf(key, sizeof key, "%d", p->ctx[i]);
    const cJSON *widths = cJSON_GetObjectItemCaseSensitive(root, "widths");
    const cJSON *curves = cJSON_GetObjectItemCaseSensitive(root, "curves");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(curves, "step_ms");
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(steps, key);
    int n = cJSON_GetArraySize(widths), ws[RT_MAX_WIDTH];
    double ts[RT_MAX_WIDTH];
    p->cost_w[i] = 0;
    if (!cJSON_IsArray(widths) || !cJSON_IsArray(t) || n < 2 || n > RT_MAX_WIDTH ||
        cJSON_GetArraySize(t) != n)
        return;
    for (int j = 0; j < n; j++) {
        const cJSON *wj = cJSON_GetArrayItem(widths, j), *tj = cJSON_GetArrayItem(t, j);
        if (!cJSON_IsNumber(wj) || !cJSON_IsNumber(tj))
            return;
        ws[j] = wj->valueint;
        ts[j] = tj->valuedouble;
    }
    int cap = max_width < RT_MAX_WIDTH ? max_width : RT_MAX_WIDTH;
    p->cost_w[i] = ctl_cost_curve(ws, ts, n, cap, p->cost[i]);
}

static int plan_parse(const coord *c, const char *text, struct coord_plan *p, char *err,
                      size_t errlen)
{
    cJSON *root = cJSON_Parse(text);
    int version = 0, rc = -1;
    if (!root) {
        snprintf(err, errlen, "the plan %s is not JSON", c->opt.plan_path);
        return -1;
    }
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "buckets");
    if (plan_int(root, "orochi_plan", &version) || version != 1) {
        snprintf(err, errlen, "the plan %s lacks \"orochi_plan\": 1 (not a plan of this version)",
                 c->opt.plan_path);
    } else if (!cJSON_IsArray(b) || !cJSON_GetArraySize(b)) {
        snprintf(err, errlen, "the plan %s has no \"buckets\"", c->opt.plan_path);
    } else if (cJSON_GetArraySize(b) > PLAN_MAX_BUCKETS) {
        snprintf(err, errlen, "the plan %s has more than %d buckets", c->opt.plan_path,
                 PLAN_MAX_BUCKETS);
    } else {
        p->n = 0;
        int plan_bits = 0;
        if (!plan_int(root, "act_bits", &plan_bits) && plan_bits != c->opt.act_bits)
            rt_log("coordinator",
                   "the plan %s was profiled with activations %s and this group runs %s: its "
                   "step times, and so its widths, may not fit (orochi profile --act-bits %s)",
                   c->opt.plan_path, llama_act_bits_name(plan_bits), llama_act_bits_name(c->opt.act_bits),
                   llama_act_bits_name(c->opt.act_bits));
        const cJSON *kv = cJSON_GetObjectItemCaseSensitive(root, "kv");
        const char *group_kv = c->opt.kv_elem == KV_F16 ? "f16" : "f32";
        if (cJSON_IsString(kv) && strcmp(kv->valuestring, group_kv))
            rt_log("coordinator",
                   "the plan %s was profiled with %s K/V and this group runs %s: its step times "
                   "may not fit (orochi profile --kv %s)",
                   c->opt.plan_path, kv->valuestring, group_kv, group_kv);
        const cJSON *part = cJSON_GetObjectItemCaseSensitive(root, "partition");
        p->part_set = part != NULL;
        rc = part ? plan_partition(c, part, &p->part, err, errlen) : 0;
        int even_max = c->model ? (c->opt.kv_dup ? c->model->cfg.n_heads : c->model->cfg.n_kv_heads)
                                : 0;
        if (!part && c->model && c->opt.n_workers > even_max) {
            snprintf(err, errlen,
                     "the plan %s has no \"partition\": %d workers need one (the even split "
                     "takes at most %d)",
                     c->opt.plan_path, c->opt.n_workers, even_max);
            rc = -1;
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, b)
        {
            if (rc)
                break;
            int i = p->n, ctx, width, length;
            if (plan_int(e, "ctx", &ctx) || plan_int(e, "width", &width) ||
                plan_int(e, "length", &length) || ctx < 1 || width < 1 || length < 0 ||
                (i && ctx <= p->ctx[i - 1])) {
                snprintf(err, errlen,
                         "the plan %s: bucket %d needs integer ctx (increasing), width >= 1 and "
                         "length >= 0",
                         c->opt.plan_path, i);
                rc = -1;
                break;
            }
            p->ctx[i] = ctx;
            p->width[i] = width < c->opt.max_width ? width : c->opt.max_width;
            if (width > c->opt.max_width)
                rt_log("coordinator",
                       "the plan %s: bucket %d's width %d is capped to --max-width %d (start the "
                       "group with --max-width %d to verify the plan's tree whole)",
                       c->opt.plan_path, i, width, c->opt.max_width, width);
            p->length[i] = length;
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "speculate");
            p->speculate[i] = !cJSON_IsBool(sp) || cJSON_IsTrue(sp);
            if (plan_tree(cJSON_GetObjectItemCaseSensitive(e, "tree"), &p->tree[i])) {
                snprintf(err, errlen,
                         "the plan %s: bucket %d's tree must be [[parent, rank], ...] with each "
                         "parent an earlier node (0: the root)",
                         c->opt.plan_path, i);
                rc = -1;
                break;
            }
            plan_costs(root, p, i, c->opt.max_width);
            p->n++;
        }
    }
    cJSON_Delete(root);
    return rc;
}

static int64_t plan_mtime(const char *path)
{
    struct stat st;
    if (stat(path, &st))
        return -1;
    return (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
}

int coord_plan_load(coord *c, char *err, size_t errlen)
{
    int64_t mt = plan_mtime(c->opt.plan_path);
    char *text = plan_read(c->opt.plan_path, err, errlen);
    if (!text)
        return -1;
    struct coord_plan *p = calloc(1, sizeof *p);
    if (!p || plan_parse(c, text, p, err, errlen)) {
        free(p);
        free(text);
        return -1;
    }
    free(text);
    free(c->plan);
    c->plan = p;
    c->plan_mtime = mt;
    c->plan_bucket = -1;
    rt_log("coordinator", "plan %s: %d context buckets", c->opt.plan_path, p->n);
    for (int i = 0; i < p->n; i++)
        rt_log("coordinator", "  up to %d tokens: width %d, speculation length %d%s", p->ctx[i],
               p->width[i], p->length[i],
               p->speculate[i] ? "" : " (plain decoding measured faster: speculation starts off)");
    coord_plan_apply(c, 0);
    if (p->part_set != c->part_set ||
        (p->part_set && memcmp(&p->part, &c->part, sizeof p->part))) {
        c->part = p->part;
        c->part_set = p->part_set;
        c->part_gen++;
        /* one line: every kind's shares (16 parts x 7 kinds fit; a longer line is cut) */
        char line[2048];
        size_t at = (size_t)snprintf(line, sizeof line, "partition (generation %u)%s:",
                                     c->part_gen,
                                     c->part.style == LP_STYLE_MEGATRON ? ", megatron" : "");
        for (int k = 0; k < LP_N && c->part_set; k++)
            for (int i = 0; i < c->part.n_parts && at < sizeof line; i++)
                at += (size_t)(i ? snprintf(line + at, sizeof line - at, "/%g",
                                            (double)c->part.frac[k][i])
                                 : snprintf(line + at, sizeof line - at, " %s %g",
                                            llama_part_kind_names[k],
                                            (double)c->part.frac[k][i]));
        rt_log("coordinator", "%s", c->part_set ? line : "partition: even");
        coord_group_reconfigure(c);
    }
    return 0;
}

void coord_plan_poll(coord *c)
{
    if (!c->opt.plan_path)
        return;
    uint64_t now = rt_now_us();
    if (now - c->plan_checked_us < 1000000)
        return;
    c->plan_checked_us = now;
    int64_t mt = plan_mtime(c->opt.plan_path);
    if (mt < 0 || mt == c->plan_mtime)
        return;
    char err[512];
    if (coord_plan_load(c, err, sizeof err)) {
        rt_log("coordinator", "%s (the previous plan stays)", err);
        c->plan_mtime = mt; /* do not retry until it changes again */
    }
}

int coord_plan_costs(const coord *c, float *cost)
{
    const struct coord_plan *p = c->plan;
    if (!p || c->plan_bucket < 0 || c->plan_bucket >= p->n || p->cost_w[c->plan_bucket] < 2)
        return 0;
    int w = p->cost_w[c->plan_bucket];
    if (cost)
        memcpy(cost, p->cost[c->plan_bucket], (size_t)(w + 1) * sizeof *cost);
    return w;
}

const ctl_template *coord_plan_tree(const coord *c)
{
    const struct coord_plan *p = c->plan;
    if (!p || c->plan_bucket < 0 || c->plan_bucket >= p->n || !p->tree[c->plan_bucket].n)
        return NULL;
    return &p->tree[c->plan_bucket];
}

void coord_plan_apply(coord *c, int n_ctx)
{
    const struct coord_plan *p = c->plan;
    if (!p || !p->n)
        return;
    int i = 0;
    while (i + 1 < p->n && n_ctx > p->ctx[i])
        i++;
    int width = p->width[i];
    if (i == c->plan_bucket && width == c->width)
        return;
    c->plan_bucket = i;
    c->width = width;
    if (!p->speculate[i] && c->guard.on) {
        /* the profile found plain decoding faster here: start off and probe rarely (the guard
         * still turns speculation on where it pays in this group, on this text) */
        c->guard.on = false;
        c->guard.probe_now = 4 * c->guard.probe;
        c->guard.off_n = 0;
    }
    int len = p->length[i] < 1 ? 1 : p->length[i];
    if (width > 1 && len > width - 1)
        len = width - 1;
    ctl_length_init(&c->len, len, 1, width > 1 ? width - 1 : 1, c->opt.decision_threshold, 6);
    c->spec_len = c->len.len;
}
