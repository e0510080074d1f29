/*
 * cli/cmd_profile.c — `orochi profile`: ARCA's profiling, in one process, minutes on the default
 * model. It writes the plan the coordinator follows (`--plan`), prints its tables and asks
 * bench/plot_plan.py for the plot.
 *
 *   Hardware   the target's step time t(W) for each width at each context bucket, with the
 *              threads the group's workers have together (the whole group busy at once), and each
 *              model speculator's one-token draft step at the same thread count (for Medusa
 *              heads: one head's evaluation).
 *   Acceptance the target decodes every calibration prompt greedily; each speculator then reads
 *              the same tokens teacher-forced and records, at every position, the rank of the
 *              target's token among its top --ranks candidates. A verification starting at
 *              position i accepts depth d exactly when the candidates at i+1 .. i+d ranked as the
 *              tree allows, so these rank paths give the real acceptance of any tree template.
 *              Medusa heads do not read the drafted tokens: at a verification whose committed
 *              context ends at i, head d ranks token i+1+d from the target's hidden state of
 *              position i-1 (the last one the target has computed), so their rank paths come
 *              from one teacher-forced target pass that keeps every position's hidden state.
 *   Plan       per speculator and width: the tree built from per-depth/rank accuracies by adding
 *              the most likely node one at a time, refined by moving leaves on the calibration
 *              category's paths (policy/control.c); per context bucket the (speculator, W)
 *              with the most tokens per second, counting t(W) and the drafting (depth x draft
 *              step); W = 1, no speculation, is a candidate. The trees calibrated on one category
 *              are applied to every category in the acceptance table (Ghidorah's Table I).
 * Schema of the plan file: docs/speculation.md ("The plan").
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "policy/control.h"
#include "model/llama.h"
#include "model/llama_cuda.h"
#include "model/medusa.h"
#include "model/ngram.h"
#include "model/tokenizer.h"

#define PF_MAX_W 16
#define PF_MAX_CTX 8
#define PF_MAX_SPEC 4
#define PF_MAX_CAT 16
#define PF_MAX_DEPTH 16
#define PF_CHUNK 64
#define PF_ALL PF_MAX_CAT

typedef struct {
    char kind[16]; /* layerskip, model, ngram, medusa */
    char arg[1024];
    int ngram, layer_lo, layer_hi;
    llama_model *m; /* the drafter (NULL: ngram, medusa) */
    medusa *md;     /* Medusa heads on the target */
    double draft_ms[PF_MAX_CTX];
    /* rank paths per category: n x depth */
    int8_t *paths[PF_MAX_CAT + 1]; /* [PF_ALL]: every category's */
    int n_paths[PF_MAX_CAT + 1], cap_paths[PF_MAX_CAT + 1];
    ctl_template tree[PF_MAX_W];
    double tokens[PF_MAX_W]; /* per width, on the calibration category */
} pf_spec;

typedef struct {
    const char *model, *prompts, *calib, *out, *plot;
    /* --devices (the group's workers, in order: its partition is searched and the devices
     * chosen), and the GPU settings the search passes on */
    const char *devices, *gpu_limit, *gpu_weights;
    int threads, n_gen, depth, ranks, per_cat, reps, act_bits;
    int search_rounds; /* --search-rounds: passed on to the search (0: its default) */
    kv_type kv; /* --kv: the K/V type the group runs with (the step times) */
    bool plain; /* --plain: prompts as completions, not chat messages */
    int widths[PF_MAX_W], n_widths, ctxs[PF_MAX_CTX], n_ctxs;
    pf_spec spec[PF_MAX_SPEC];
    int n_spec;
    char cats[PF_MAX_CAT][32];
    int n_cats, calib_cat;
    double t_ms[PF_MAX_CTX][PF_MAX_W];
} pf_opts;

static void pf_usage(FILE *out)
{
    fprintf(out,
            "usage: orochi profile --model M [--speculator KIND[:k=v]]... [--threads T]\n"
            "                      [--widths 1,2,4,8,16] [--ctx 256,1024] [--prompts FILE]\n"
            "                      [--calibrate CATEGORY] [--per-category N] [-n TOKENS]\n"
            "                      [--depth D] [--ranks R] [--reps N] [--out plan.json]\n"
            "                      [--plot plan.png] [--plain] [--act-bits auto|16|8] [--kv f32|f16]\n"
            "                      [--devices cpu,gpu,...] [--gpu-memory-limit BYTES]\n"
            "                      [--gpu-weights auto|device|mapped] [--search-rounds N]\n"
            "  Measures the step time per width and context bucket and each speculator's\n"
            "  acceptance by depth and candidate rank on a calibration prompt set (JSON lines\n"
            "  with id, category, prompt; default bench/prompts.jsonl), then writes the plan:\n"
            "  per context bucket the width (1: no speculation), speculation length and tree\n"
            "  with the most tokens per second. KIND: layerskip[:layers=A-B] (default the first\n"
            "  half), model:draft=PATH, ngram[:n=N], medusa:heads=PATH; default layerskip and\n"
            "  ngram. --threads: the group's worker threads together (default the online\n"
            "  cores). Trees and widths are calibrated on the category --calibrate names\n"
            "  (default: every prompt of the file), and the acceptance table applies them to\n"
            "  every category. --plain: the prompts\n"
            "  are completions (no chat template). --act-bits: the activation precision the\n"
            "  group runs with (orochi-coordinator --act-bits; it sets the step times), --kv\n"
            "  its K/V type (orochi-coordinator --kv; the step times too). The plot needs\n"
            "  python3 with matplotlib. --devices: the group's workers in order (as its\n"
            "  --workers gives them); with two or more, the partition is searched too and the\n"
            "  devices chosen by measurement (orochi bench --plans --search: the fastest device\n"
            "  alone unless a split beats it; a GPU over --gpu-memory-limit never alone), and\n"
            "  the plan's \"partition\" says which and why (docs/gpu.md, \"Which devices\").\n"
            "  --search-rounds N: that search's rounds at most (1..100; default 12, 20 under a\n"
            "  --gpu-memory-limit): fewer is quicker and coarser.\n");
}

static int pf_list(const char *opt, const char *s, int *out, int max, long lo, long hi)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        long v;
        if (n == max || !cli_int("profile", opt, t, lo, hi, &v))
            return n == max
                       ? (fprintf(stderr, "orochi profile: %s takes at most %d values\n", opt, max),
                          -1)
                       : -1;
        out[n++] = (int)v;
    }
    return n;
}

static int pf_add_spec(pf_opts *o, const char *s)
{
    if (o->n_spec == PF_MAX_SPEC) {
        fprintf(stderr, "orochi profile: at most %d speculators\n", PF_MAX_SPEC);
        return -1;
    }
    pf_spec *p = &o->spec[o->n_spec];
    memset(p, 0, sizeof *p);
    const char *colon = strchr(s, ':');
    size_t kl = colon ? (size_t)(colon - s) : strlen(s);
    snprintf(p->kind, sizeof p->kind, "%.*s", (int)kl, s);
    snprintf(p->arg, sizeof p->arg, "%s", colon ? colon + 1 : "");
    p->ngram = 3;
    p->layer_lo = p->layer_hi = -1;
    if (!strcmp(p->kind, "ngram")) {
        if (p->arg[0] && sscanf(p->arg, "n=%d", &p->ngram) != 1) {
            fprintf(stderr, "orochi profile: ngram takes n=N, not '%s'\n", p->arg);
            return -1;
        }
    } else if (!strcmp(p->kind, "layerskip")) {
        if (p->arg[0] && sscanf(p->arg, "layers=%d-%d", &p->layer_lo, &p->layer_hi) != 2) {
            fprintf(stderr, "orochi profile: layerskip takes layers=A-B, not '%s'\n", p->arg);
            return -1;
        }
    } else if (!strcmp(p->kind, "model")) {
        if (strncmp(p->arg, "draft=", 6) || !p->arg[6]) {
            fprintf(stderr, "orochi profile: model needs draft=PATH\n");
            return -1;
        }
    } else if (!strcmp(p->kind, "medusa")) {
        if (strncmp(p->arg, "heads=", 6) || !p->arg[6]) {
            fprintf(stderr, "orochi profile: medusa needs heads=PATH\n");
            return -1;
        }
    } else {
        fprintf(stderr,
                "orochi profile: unknown speculator kind '%s' (layerskip, model, ngram, medusa)\n",
                p->kind);
        return -1;
    }
    o->n_spec++;
    return 0;
}

static int pf_parse(pf_opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long x;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            pf_usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--plain")) {
            o->plain = true;
            continue;
        }
        if (!(v = cli_value("profile", argc, argv, &i)))
            return -1;
        if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--speculator")) {
            if (pf_add_spec(o, v))
                return -1;
        } else if (!strcmp(a, "--prompts"))
            o->prompts = v;
        else if (!strcmp(a, "--calibrate"))
            o->calib = v;
        else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--plot"))
            o->plot = v;
        else if (!strcmp(a, "--devices"))
            o->devices = v;
        else if (!strcmp(a, "--gpu-memory-limit"))
            o->gpu_limit = v;
        else if (!strcmp(a, "--gpu-weights"))
            o->gpu_weights = v;
        else if (!strcmp(a, "--widths")) {
            if ((o->n_widths = pf_list(a, v, o->widths, PF_MAX_W, 1, PF_CHUNK)) < 1)
                return -1;
        } else if (!strcmp(a, "--ctx")) {
            if ((o->n_ctxs = pf_list(a, v, o->ctxs, PF_MAX_CTX, 16, 1 << 20)) < 1)
                return -1;
        } else if (!strcmp(a, "--threads") && cli_int("profile", a, v, 1, 256, &x))
            o->threads = (int)x;
        else if (!strcmp(a, "-n") && cli_int("profile", a, v, 2, 4096, &x))
            o->n_gen = (int)x;
        else if (!strcmp(a, "--depth") && cli_int("profile", a, v, 1, PF_MAX_DEPTH, &x))
            o->depth = (int)x;
        else if (!strcmp(a, "--ranks") && cli_int("profile", a, v, 1, 16, &x))
            o->ranks = (int)x;
        else if (!strcmp(a, "--per-category") && cli_int("profile", a, v, 1, 1000, &x))
            o->per_cat = (int)x;
        else if (!strcmp(a, "--reps") && cli_int("profile", a, v, 1, 64, &x))
            o->reps = (int)x;
        else if (!strcmp(a, "--search-rounds") && cli_int("profile", a, v, 1, 100, &x))
            o->search_rounds = (int)x;
        else if (!strcmp(a, "--act-bits") && llama_act_bits_parse(v) >= 0)
            o->act_bits = llama_act_bits_parse(v);
        else if (!strcmp(a, "--act-bits")) {
            fprintf(stderr, "orochi profile: --act-bits takes 8, 16 or auto, got '%s'\n", v);
            return -1;
        } else if (!strcmp(a, "--kv") && (!strcmp(v, "f32") || !strcmp(v, "f16")))
            o->kv = !strcmp(v, "f16") ? KV_F16 : KV_F32;
        else if (!strcmp(a, "--kv")) {
            fprintf(stderr, "orochi profile: --kv takes f32 or f16, got '%s'\n", v);
            return -1;
        }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-n") || !strcmp(a, "--depth") ||
                 !strcmp(a, "--ranks") || !strcmp(a, "--per-category") || !strcmp(a, "--reps") ||
                 !strcmp(a, "--search-rounds"))
            return -1; /* cli_int said why */
        else {
            fprintf(stderr, "orochi profile: unknown option '%s'\n", a);
            pf_usage(stderr);
            return -1;
        }
    }
    if (!o->model) {
        fprintf(stderr, "orochi profile: --model is required\n");
        return -1;
    }
    /* what the search at the end takes, checked before the minutes of profiling */
    char devs[256];
    snprintf(devs, sizeof devs, "%s", o->devices ? o->devices : "");
    for (char *save = NULL, *t = strtok_r(devs, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (strcmp(t, "cpu") && strcmp(t, "gpu")) {
            fprintf(stderr, "orochi profile: --devices %s: cpu or gpu for each worker\n",
                    o->devices);
            return -1;
        }
#ifndef OROCHI_HAVE_CUDA
    if (o->devices && strstr(o->devices, "gpu")) {
        fprintf(stderr, "orochi profile: --devices %s: this build has no CUDA (CMake builds the "
                        "GPU worker when it finds nvcc)\n", o->devices);
        return -1;
    }
#endif
    size_t bytes;
    if (o->gpu_limit && llama_gpu_bytes_parse(o->gpu_limit, &bytes)) {
        fprintf(stderr, "orochi profile: --gpu-memory-limit %s: a byte count (40G, 512M)\n",
                o->gpu_limit);
        return -1;
    }
    if (o->gpu_weights && llama_gpu_weights_parse(o->gpu_weights) < 0) {
        fprintf(stderr, "orochi profile: --gpu-weights %s: auto, device or mapped\n",
                o->gpu_weights);
        return -1;
    }
    if (o->widths[0] != 1) {
        fprintf(stderr,
                "orochi profile: --widths must start with 1 (plain decoding is a candidate)\n");
        return -1;
    }
    if (!o->n_spec && (pf_add_spec(o, "layerskip") || pf_add_spec(o, "ngram")))
        return -1;
    return 0;
}

static void pf_progress(const char *what, int done, int total)
{
    if (!isatty(2) && done > 0 && done < total)
        return; /* a log gets the start and the end */
    int width = 30, fill = total > 0 ? done * width / total : width;
    fprintf(stderr, "\rorochi profile: %-28s [%.*s%*s] %d/%d", what, fill,
            "##############################", width - fill, "", done, total);
    if (done >= total)
        fputc('\n', stderr);
    fflush(stderr);
}

/* Median ms of a W-token step at a committed context of ctx tokens, for each W of ws. */
static int pf_step_ms(const llama_model *m, int threads, kv_type kv, int ctx_len, const int *ws,
                      int n_w, int reps, double *out)
{
    char err[256];
    int maxw = 1;
    for (int i = 0; i < n_w; i++)
        maxw = ws[i] > maxw ? ws[i] : maxw;
    llama_ctx_params cp = {
        .n_threads = threads, .max_width = PF_CHUNK, .n_ctx = ctx_len + maxw + 8, .kv = kv};
    llama_ctx *ctx = llama_ctx_new(m, &cp, err, sizeof err);
    int32_t *ids = malloc((size_t)(ctx_len + PF_CHUNK) * sizeof *ids);
    float *logits = malloc((size_t)PF_CHUNK * (size_t)m->cfg.vocab * sizeof *logits);
    int rc = -1;
    if (!ctx || !ids || !logits)
        goto done;
    cli_synthetic_ids(ids, ctx_len + PF_CHUNK, m->cfg.vocab);
    if (llama_prefill(ctx, ids, ctx_len, NULL, err, sizeof err))
        goto done;
    /* the widths in turn within each repetition (a warm-up round first), so a change of the
     * machine's speed during the measurement falls on every width alike */
    double t[PF_MAX_W][64];
    for (int r = -1; r < reps; r++)
        for (int i = 0; i < n_w && i < PF_MAX_W; i++) {
            llama_batch b = {.n = ws[i], .tokens = ids + ctx_len};
            double t0 = cli_now();
            if (llama_forward(ctx, &b, logits, err, sizeof err))
                goto done;
            if (r >= 0)
                t[i][r] = (cli_now() - t0) * 1e3;
        }
    for (int i = 0; i < n_w && i < PF_MAX_W; i++)
        out[i] = cli_median(t[i], reps);
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "orochi profile: step timing failed: %s\n", ctx ? err : "no context");
    free(ids);
    free(logits);
    llama_ctx_destroy(&ctx);
    return rc;
}

/* ===== calibration ===== */

typedef struct {
    int cat;
    int32_t *ids;
    int n, n_prompt;
} pf_seq;

/* Greedy decoding of n_gen tokens after the prompt, with the target. */
static int pf_generate(const llama_model *m, int threads, pf_seq *s, int n_gen, int eos)
{
    char err[256];
    llama_ctx_params cp = {.n_threads = threads, .max_width = PF_CHUNK, .n_ctx = s->n + n_gen + 8};
    llama_ctx *ctx = llama_ctx_new(m, &cp, err, sizeof err);
    float *logits = malloc((size_t)m->cfg.vocab * sizeof *logits);
    int rc = -1;
    if (!ctx || !logits || llama_prefill(ctx, s->ids, s->n, logits, err, sizeof err))
        goto done;
    for (int i = 0; i < n_gen; i++) {
        int32_t id = sampler_argmax(logits, m->cfg.vocab), zero = 0;
        s->ids[s->n++] = id;
        if (id == eos || i + 1 == n_gen)
            break;
        llama_batch b = {.n = 1, .tokens = &id};
        if (llama_forward(ctx, &b, logits, err, sizeof err) ||
            llama_commit(ctx, &zero, 1, err, sizeof err))
            goto done;
    }
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "orochi profile: decoding failed: %s\n", ctx ? err : "no context");
    free(logits);
    llama_ctx_destroy(&ctx);
    return rc;
}

/* rank of token t among the logits (ties: the lower id first), or -1 when >= ranks */
static int pf_rank(const float *l, int V, int32_t t, int ranks)
{
    int r = 0;
    for (int j = 0; j < V && r < ranks; j++)
        r += l[j] > l[t] || (l[j] == l[t] && j < t);
    return r < ranks ? r : -1;
}

/* rank[j] for j in [n_prompt - 1, n - 1): the speculator's rank of ids[j + 1] given ids[0..j] */
static int pf_ranks(const pf_opts *o, const pf_spec *p, const pf_seq *s, int8_t *rank)
{
    if (!p->m) {
        for (int j = s->n_prompt - 1; j < s->n - 1; j++) {
            int pos = ngram_lookup(s->ids, j + 1, p->ngram, NULL);
            rank[j] = pos >= 0 && s->ids[pos] == s->ids[j + 1] ? 0 : -1;
        }
        return 0;
    }
    char err[256];
    int V = p->m->cfg.vocab;
    llama_ctx_params cp = {.n_threads = o->threads, .max_width = PF_CHUNK, .n_ctx = s->n + 8};
    llama_ctx *ctx = llama_ctx_new(p->m, &cp, err, sizeof err);
    float *logits = malloc((size_t)PF_CHUNK * (size_t)V * sizeof *logits);
    int32_t path[PF_CHUNK];
    int rc = -1;
    for (int i = 0; i < PF_CHUNK; i++)
        path[i] = i;
    if (!ctx || !logits)
        goto done;
    for (int at = 0; at < s->n - 1; at += PF_CHUNK) {
        int w = s->n - 1 - at < PF_CHUNK ? s->n - 1 - at : PF_CHUNK;
        int from = s->n_prompt - 1 - at > 0 ? s->n_prompt - 1 - at : 0;
        if (from > w)
            from = w;
        llama_batch b = {.n = w, .tokens = s->ids + at, .logits_from = from};
        if (llama_forward(ctx, &b, logits, err, sizeof err) ||
            llama_commit(ctx, path, w, err, sizeof err))
            goto done;
        for (int j = from; j < w; j++)
            rank[at + j] =
                (int8_t)pf_rank(logits + (size_t)(j - from) * V, V, s->ids[at + j + 1], o->ranks);
    }
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "orochi profile: drafting failed: %s\n", ctx ? err : "no context");
    free(logits);
    llama_ctx_destroy(&ctx);
    return rc;
}

/* rank_of(rank, stride, i, d): the rank of the token at depth d of the verification starting at i.
 * A chain drafter's ranks depend on the position only (stride 0: rank[i + d]); Medusa's on the
 * start and the head (rank[d * stride + i]). */
static int pf_rank_at(const int8_t *rank, int stride, int i, int d)
{
    return stride ? rank[(size_t)d * (size_t)stride + (size_t)i] : rank[i + d];
}

static int pf_add_paths_to(const pf_opts *o, pf_spec *p, int c, const pf_seq *s, const int8_t *rank,
                           int stride)
{
    int D = o->depth;
    for (int i = s->n_prompt - 1; i < s->n - 1; i++) {
        if (p->n_paths[c] == p->cap_paths[c]) {
            int cap = p->cap_paths[c] ? 2 * p->cap_paths[c] : 256;
            int8_t *np = realloc(p->paths[c], (size_t)cap * (size_t)D);
            if (!np)
                return -1;
            p->paths[c] = np;
            p->cap_paths[c] = cap;
        }
        int8_t *row = p->paths[c] + (size_t)p->n_paths[c]++ * (size_t)D;
        bool alive = true;
        for (int d = 0; d < D; d++) {
            int j = i + d;
            alive = alive && j < s->n - 1 && pf_rank_at(rank, stride, i, d) >= 0;
            row[d] = alive ? (int8_t)pf_rank_at(rank, stride, i, d) : -1;
        }
    }
    return 0;
}

/* the rank paths of every verification start of s, into its category and into PF_ALL */
static int pf_add_paths(const pf_opts *o, pf_spec *p, const pf_seq *s, const int8_t *rank,
                        int stride)
{
    return pf_add_paths_to(o, p, s->cat, s, rank, stride) ||
                   pf_add_paths_to(o, p, PF_ALL, s, rank, stride)
               ? -1
               : 0;
}

/* Medusa's ranks, rank[d * s->n + i] for i in [n_prompt - 1, n - 1) and d < depth: head d's rank
 * of ids[i + 1 + d] from the target's hidden state at position i - 1 (-1 beyond the heads, the
 * sequence or --ranks). One teacher-forced pass of the target keeps every position's state. */
static int pf_medusa_ranks(const pf_opts *o, const pf_spec *p, const llama_model *target,
                           kpool *pool, const pf_seq *s, int8_t *rank)
{
    char err[256];
    int V = target->cfg.vocab, dim = target->cfg.dim, K = medusa_heads(p->md);
    memset(rank, -1, (size_t)o->depth * (size_t)s->n);
    llama_ctx_params cp = {.n_threads = o->threads, .max_width = PF_CHUNK, .n_ctx = s->n + 8};
    llama_ctx *ctx = llama_ctx_new(target, &cp, err, sizeof err);
    float *hidden = malloc((size_t)s->n * (size_t)dim * sizeof *hidden);
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t path[PF_CHUNK];
    int rc = -1;
    for (int i = 0; i < PF_CHUNK; i++)
        path[i] = i;
    if (!ctx || !hidden || !logits)
        goto done;
    const llama_shared *sh = llama_ctx_shared(ctx);
    for (int at = 0; at < s->n; at += PF_CHUNK) {
        int w = s->n - at < PF_CHUNK ? s->n - at : PF_CHUNK;
        llama_batch b = {.n = w, .tokens = s->ids + at, .logits_from = w};
        if (llama_forward(ctx, &b, NULL, err, sizeof err) ||
            llama_commit(ctx, path, w, err, sizeof err))
            goto done;
        memcpy(hidden + (size_t)at * dim, sh->x, (size_t)w * dim * sizeof *hidden);
    }
    for (int i = s->n_prompt - 1 > 1 ? s->n_prompt - 1 : 1; i < s->n - 1; i++)
        for (int d = 0; d < K && d < o->depth && i + 1 + d < s->n; d++) {
            if (medusa_head_logits(p->md, pool, d, hidden + (size_t)(i - 1) * dim, logits)) {
                snprintf(err, sizeof err, "medusa head %d failed", d);
                goto done;
            }
            rank[(size_t)d * (size_t)s->n + (size_t)i] =
                (int8_t)pf_rank(logits, V, s->ids[i + 1 + d], o->ranks);
        }
    rc = 0;
done:
    if (rc)
        fprintf(stderr, "orochi profile: medusa ranks failed: %s\n", ctx ? err : "no context");
    free(hidden);
    free(logits);
    llama_ctx_destroy(&ctx);
    return rc;
}

/* Median ms of one Medusa head's evaluation (its draft cost per tree level). */
static int pf_medusa_ms(const llama_model *target, const medusa *md, kpool *pool, int reps,
                        double *out)
{
    int dim = target->cfg.dim;
    float *h = calloc((size_t)dim, sizeof *h), *l = malloc((size_t)target->cfg.vocab * sizeof *l);
    double t[64];
    int rc = -1;
    if (!h || !l)
        goto done;
    for (int i = 0; i < dim; i++)
        h[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int r = -1; r < reps; r++) {
        double t0 = cli_now();
        if (medusa_head_logits(md, pool, 0, h, l))
            goto done;
        if (r >= 0)
            t[r] = (cli_now() - t0) * 1e3;
    }
    *out = cli_median(t, reps);
    rc = 0;
done:
    free(h);
    free(l);
    return rc;
}

/* acc[d][r] from paths: P(rank r at depth d | the path reached depth d) */
static void pf_accuracy(const int8_t *paths, int n, int D, int R, double *acc)
{
    for (int d = 0; d < D; d++) {
        long reach = 0, hit[16] = {0};
        for (int i = 0; i < n; i++) {
            const int8_t *r = paths + (size_t)i * (size_t)D;
            bool ok = true;
            for (int k = 0; k < d && ok; k++)
                ok = r[k] >= 0;
            if (!ok)
                continue;
            reach++;
            if (r[d] >= 0 && r[d] < R)
                hit[r[d]]++;
        }
        for (int r = 0; r < R; r++)
            acc[d * R + r] = reach ? (double)hit[r] / (double)reach : 0;
    }
}

static int pf_tree_depth(const ctl_template *t)
{
    int d = 0;
    for (int i = 0; i < t->n; i++)
        d = t->depth[i] > d ? t->depth[i] : d;
    return d;
}

/* ===== prompts ===== */

static int pf_load_prompts(pf_opts *o, const tokenizer *tok, pf_seq **out)
{
    FILE *f = fopen(o->prompts, "r");
    if (!f) {
        fprintf(stderr, "orochi profile: cannot read the prompt file %s\n", o->prompts);
        return -1;
    }
    char line[65536];
    int n = 0, cap = 0, per[PF_MAX_CAT] = {0}, lineno = 0;
    pf_seq *v = NULL;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (line[strspn(line, " \t\r\n")] == 0)
            continue;
        cJSON *j = cJSON_Parse(line);
        const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        const cJSON *ca = cJSON_GetObjectItemCaseSensitive(j, "category");
        if (!cJSON_IsString(pr)) {
            fprintf(stderr,
                    "orochi profile: %s line %d: not a JSON object with a \"prompt\" string\n",
                    o->prompts, lineno);
            cJSON_Delete(j);
            fclose(f);
            free(v);
            return -1;
        }
        const char *cat = cJSON_IsString(ca) ? ca->valuestring : "all";
        int c = 0;
        while (c < o->n_cats && strcmp(o->cats[c], cat))
            c++;
        if (c == o->n_cats && o->n_cats < PF_MAX_CAT)
            snprintf(o->cats[o->n_cats++], sizeof o->cats[0], "%s", cat);
        if (c < o->n_cats && per[c] < o->per_cat) {
            char *text =
                o->plain ? strdup(pr->valuestring) : tokenizer_chat_prompt(tok, pr->valuestring);
            size_t len = text ? strlen(text) : 0;
            int32_t *ids = malloc((len + 2 + (size_t)o->n_gen + 8) * sizeof *ids);
            int off = tokenizer_add_bos(tok) && tokenizer_bos(tok) >= 0 ? 1 : 0, needed = 0;
            int k = ids && text
                        ? tokenizer_encode(tok, text, len, true, ids + off, (int)len + 1, &needed)
                        : -1;
            free(text);
            if (k >= 0 && n == cap) {
                cap = cap ? 2 * cap : 16;
                pf_seq *nv = realloc(v, (size_t)cap * sizeof *v);
                if (nv)
                    v = nv;
                else
                    k = -1;
            }
            if (k < 0) {
                fprintf(stderr, "orochi profile: %s line %d: the prompt could not be tokenized\n",
                        o->prompts, lineno);
                free(ids);
                cJSON_Delete(j);
                fclose(f);
                free(v);
                return -1;
            }
            if (off)
                ids[0] = tokenizer_bos(tok);
            v[n++] = (pf_seq){.cat = c, .ids = ids, .n = k + off, .n_prompt = k + off};
            per[c]++;
        }
        cJSON_Delete(j);
    }
    fclose(f);
    if (!n) {
        fprintf(stderr, "orochi profile: %s holds no prompts\n", o->prompts);
        return -1;
    }
    *out = v;
    return n;
}

/* ===== the plan ===== */

/* [[parent, rank], ...] for nodes 1.. of t (empty for none) */
static cJSON *pf_tree_json(const ctl_template *t, bool any)
{
    cJSON *tree = cJSON_CreateArray();
    for (int i = 1; t && any && i < t->n; i++) {
        cJSON *node = cJSON_CreateArray();
        cJSON_AddItemToArray(node, cJSON_CreateNumber(t->parent[i]));
        cJSON_AddItemToArray(node, cJSON_CreateNumber(t->rank[i]));
        cJSON_AddItemToArray(tree, node);
    }
    return tree;
}

static int pf_write(const pf_opts *o, const int *best_s, const int *best_w, const double *best_rate,
                    const double *plain_rate)
{
    cJSON *root = cJSON_CreateObject(), *b = cJSON_CreateArray(), *curves = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "orochi_plan", 1);
    cJSON_AddStringToObject(root, "target", o->model);
    cJSON_AddNumberToObject(root, "threads", o->threads);
    cJSON_AddNumberToObject(root, "act_bits", o->act_bits);
    cJSON_AddStringToObject(root, "kv", o->kv == KV_F16 ? "f16" : "f32");
    cJSON_AddStringToObject(root, "calibrated_on",
                            o->calib_cat < 0 ? "all" : o->cats[o->calib_cat]);
    for (int c = 0; c < o->n_ctxs; c++) {
        cJSON *e = cJSON_CreateObject();
        int s = best_s[c], wi = best_w[c], w = o->widths[wi];
        cJSON_AddNumberToObject(e, "ctx", o->ctxs[c]);
        cJSON_AddNumberToObject(e, "width", w);
        const ctl_template *t = s >= 0 ? &o->spec[s].tree[wi] : NULL;
        cJSON_AddNumberToObject(e, "length", t && w > 1 ? pf_tree_depth(t) : 0);
        cJSON_AddBoolToObject(e, "speculate", best_rate[c] > plain_rate[c]);
        cJSON_AddStringToObject(e, "speculator", s >= 0 && w > 1 ? o->spec[s].kind : "none");
        cJSON_AddNumberToObject(e, "tokens_per_second", best_rate[c]);
        cJSON_AddNumberToObject(e, "plain_tokens_per_second", plain_rate[c]);
        cJSON_AddItemToObject(e, "tree", pf_tree_json(t, w > 1));
        cJSON_AddItemToArray(b, e);
    }
    cJSON_AddItemToObject(root, "buckets", b);
    cJSON_AddItemToObject(root, "widths", cJSON_CreateIntArray(o->widths, o->n_widths));
    cJSON *steps = cJSON_CreateObject();
    for (int c = 0; c < o->n_ctxs; c++) {
        char k[32];
        snprintf(k, sizeof k, "%d", o->ctxs[c]);
        cJSON_AddItemToObject(steps, k, cJSON_CreateDoubleArray(o->t_ms[c], o->n_widths));
    }
    cJSON_AddItemToObject(curves, "step_ms", steps);
    cJSON *sp = cJSON_CreateObject();
    for (int s = 0; s < o->n_spec; s++) {
        const pf_spec *p = &o->spec[s];
        cJSON *x = cJSON_CreateObject(), *cat = cJSON_CreateObject();
        cJSON_AddItemToObject(x, "draft_ms", cJSON_CreateDoubleArray(p->draft_ms, o->n_ctxs));
        cJSON_AddItemToObject(x, "tokens_per_step",
                              cJSON_CreateDoubleArray(p->tokens, o->n_widths));
        for (int ci = 0; ci < o->n_cats; ci++) {
            double v[PF_MAX_W];
            for (int wi = 0; wi < o->n_widths; wi++)
                v[wi] = ctl_plan_eval(&p->tree[wi], p->paths[ci], p->n_paths[ci], o->depth);
            cJSON_AddItemToObject(cat, o->cats[ci], cJSON_CreateDoubleArray(v, o->n_widths));
        }
        cJSON_AddItemToObject(x, "tokens_per_step_by_category", cat);
        cJSON *trees = cJSON_CreateArray();
        for (int wi = 0; wi < o->n_widths; wi++)
            cJSON_AddItemToArray(trees, pf_tree_json(&p->tree[wi], o->widths[wi] > 1));
        cJSON_AddItemToObject(x, "trees", trees);
        cJSON_AddItemToObject(sp, p->kind, x);
    }
    cJSON_AddItemToObject(curves, "speculators", sp);
    cJSON_AddItemToObject(root, "curves", curves);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = text ? fopen(o->out, "w") : NULL;
    int rc = f && fputs(text, f) >= 0 && fputc('\n', f) != EOF ? 0 : -1;
    if (f && fclose(f))
        rc = -1;
    free(text);
    if (rc)
        fprintf(stderr, "orochi profile: cannot write %s\n", o->out);
    return rc;
}

/* --devices with two or more: the partition search on the profiled widths (bench --plans
 * --search, the parts' threads the group's shared out), which chooses the devices and writes
 * the partition into the plan just written. 0, or its exit status. */
static int pf_devices(const pf_opts *o)
{
    int parts = 1;
    for (const char *p = o->devices; *p; p++)
        parts += *p == ',';
    if (parts < 2)
        return 0; /* one worker: nothing to split */
    char np[16], tpp[16], widths[128], ctx[16], reps[16], rounds[16];
    snprintf(np, sizeof np, "%d", parts);
    snprintf(tpp, sizeof tpp, "%d", o->threads / parts > 0 ? o->threads / parts : 1);
    size_t at = 0;
    for (int i = 0; i < o->n_widths && at < sizeof widths; i++)
        at += (size_t)snprintf(widths + at, sizeof widths - at, "%s%d", i ? "," : "",
                               o->widths[i]);
    snprintf(ctx, sizeof ctx, "%d", o->ctxs[0]);
    snprintf(reps, sizeof reps, "%d", o->reps < 3 ? o->reps : 3);
    const char *argv[32] = {"--plans", "--model", o->model, "--parts", np, "--devices",
                            o->devices, "--threads-per-part", tpp, "--widths", widths, "--ctx",
                            ctx, "--reps", reps, "--search", o->out, "--json", "/dev/null"};
    int argc = 19;
    if (o->gpu_limit) {
        argv[argc++] = "--gpu-memory-limit";
        argv[argc++] = o->gpu_limit;
    }
    if (o->gpu_weights) {
        argv[argc++] = "--gpu-weights";
        argv[argc++] = o->gpu_weights;
    }
    if (o->search_rounds) {
        snprintf(rounds, sizeof rounds, "%d", o->search_rounds);
        argv[argc++] = "--search-rounds";
        argv[argc++] = rounds;
    }
    fprintf(stderr, "orochi profile: the partition for workers %s and the choice of devices "
                    "(bench --plans --search)...\n", o->devices);
    return bench_plans(argc, (char **)argv);
}

int cmd_profile(int argc, char **argv)
{
    static pf_opts o;
    memset(&o, 0, sizeof o);
    o.prompts = "bench/prompts.jsonl";
    o.out = "plan.json";
    o.n_gen = 48;
    o.depth = 8;
    o.ranks = 4;
    o.per_cat = 2;
    o.reps = 5;
    o.act_bits = LLAMA_ACT_AUTO;
    o.threads = cli_online_cores();
    int w0[] = {1, 2, 4, 8, 16}, c0[] = {256, 1024};
    memcpy(o.widths, w0, sizeof w0);
    o.n_widths = 5;
    memcpy(o.ctxs, c0, sizeof c0);
    o.n_ctxs = 2;
    if (pf_parse(&o, argc, argv))
        return 2;
    char err[512];
    llama_model *m = llama_model_load(o.model, err, sizeof err);
    if (!m) {
        fprintf(stderr, "orochi profile: %s\n", err);
        return 2;
    }
    llama_model_set_act_bits(m, o.act_bits, err, sizeof err);
    tokenizer *tok = tokenizer_new(m->file, err, sizeof err);
    kpool *pool = kpool_new(o.threads); /* Medusa heads' evaluation */
    pf_seq *seqs = NULL;
    int rc = 1, n_seq = tok ? pf_load_prompts(&o, tok, &seqs) : -1;
    if (!tok)
        fprintf(stderr, "orochi profile: %s\n", err);
    if (n_seq < 0) {
        rc = 2;
        goto done;
    }
    o.calib_cat = -1; /* all prompts */
    if (o.calib) {
        o.calib_cat = 0;
        while (o.calib_cat < o.n_cats && strcmp(o.cats[o.calib_cat], o.calib))
            o.calib_cat++;
        if (o.calib_cat == o.n_cats) {
            fprintf(stderr, "orochi profile: no category '%s' in %s\n", o.calib, o.prompts);
            rc = 2;
            goto done;
        }
    }
    /* the drafters */
    for (int s = 0; s < o.n_spec; s++) {
        pf_spec *p = &o.spec[s];
        if (!strcmp(p->kind, "ngram"))
            continue;
        if (!strcmp(p->kind, "medusa")) {
            if (!(p->md = medusa_load(p->arg + 6, m, err, sizeof err))) {
                fprintf(stderr, "orochi profile: %s\n", err);
                rc = 2;
                goto done;
            }
            continue;
        }
        p->m = llama_model_load(!strcmp(p->kind, "model") ? p->arg + 6 : o.model, err, sizeof err);
        if (!p->m) {
            fprintf(stderr, "orochi profile: %s\n", err);
            rc = 2;
            goto done;
        }
        if (p->m->cfg.vocab != m->cfg.vocab) {
            fprintf(stderr,
                    "orochi profile: the draft model's vocabulary (%d) differs from the "
                    "target's (%d)\n",
                    p->m->cfg.vocab, m->cfg.vocab);
            rc = 2;
            goto done;
        }
        if (!strcmp(p->kind, "layerskip")) {
            int L = m->cfg.n_layers, lo = p->layer_lo < 0 ? 0 : p->layer_lo;
            int hi = p->layer_hi < 0 ? L / 2 - 1 : p->layer_hi, keep[512], n = 0;
            for (int l = lo; l <= hi && l < L && n < 512; l++)
                keep[n++] = l;
            if (llama_model_keep_layers(p->m, keep, n, err, sizeof err)) {
                fprintf(stderr, "orochi profile: layerskip: %s\n", err);
                rc = 2;
                goto done;
            }
        }
    }
    /* hardware */
    int steps_total = o.n_ctxs * (1 + o.n_spec), steps_done = 0;
    for (int c = 0; c < o.n_ctxs; c++) {
        pf_progress("step time per width", steps_done, steps_total);
        if (pf_step_ms(m, o.threads, o.kv, o.ctxs[c], o.widths, o.n_widths, o.reps, o.t_ms[c]))
            goto done;
        steps_done++;
        for (int s = 0; s < o.n_spec; s++, steps_done++) {
            int one = 1;
            pf_progress("step time per width", steps_done, steps_total);
            if (o.spec[s].m && pf_step_ms(o.spec[s].m, o.threads, o.kv, o.ctxs[c], &one, 1, o.reps,
                                          &o.spec[s].draft_ms[c]))
                goto done;
            if (o.spec[s].md && pf_medusa_ms(m, o.spec[s].md, pool, o.reps, &o.spec[s].draft_ms[c]))
                goto done;
        }
    }
    pf_progress("step time per width", steps_total, steps_total);
    /* acceptance */
    int eos = tokenizer_eos(tok);
    for (int i = 0; i < n_seq; i++) {
        pf_progress("calibration prompts", i, n_seq);
        if (pf_generate(m, o.threads, &seqs[i], o.n_gen, eos))
            goto done;
        int8_t *rank = malloc((size_t)seqs[i].n * (size_t)o.depth);
        for (int s = 0; s < o.n_spec; s++) {
            pf_spec *p = &o.spec[s];
            int stride = p->md ? seqs[i].n : 0;
            if (!rank ||
                (p->md ? pf_medusa_ranks(&o, p, m, pool, &seqs[i], rank)
                       : pf_ranks(&o, p, &seqs[i], rank)) ||
                pf_add_paths(&o, p, &seqs[i], rank, stride)) {
                free(rank);
                goto done;
            }
        }
        free(rank);
    }
    pf_progress("calibration prompts", n_seq, n_seq);
    /* trees per speculator and width, on the calibration category */
    for (int s = 0; s < o.n_spec; s++) {
        pf_spec *p = &o.spec[s];
        double acc[PF_MAX_DEPTH * 16];
        int cc = o.calib_cat < 0 ? PF_ALL : o.calib_cat, R = p->m || p->md ? o.ranks : 1;
        pf_accuracy(p->paths[cc], p->n_paths[cc], o.depth, R, acc);
        for (int wi = 0; wi < o.n_widths; wi++) {
            ctl_plan_tree(acc, o.depth, R, o.widths[wi], &p->tree[wi]);
            p->tokens[wi] =
                ctl_plan_refine(&p->tree[wi], p->paths[cc], p->n_paths[cc], o.depth, R, 4);
        }
    }
    /* the plan */
    int best_s[PF_MAX_CTX], best_w[PF_MAX_CTX];
    double best_rate[PF_MAX_CTX], plain_rate[PF_MAX_CTX];
    printf("step time (ms) by width, %d threads\n%-8s", o.threads, "ctx");
    for (int wi = 0; wi < o.n_widths; wi++)
        printf(" %8d", o.widths[wi]);
    printf("\n");
    for (int c = 0; c < o.n_ctxs; c++) {
        printf("%-8d", o.ctxs[c]);
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" %8.2f", o.t_ms[c][wi]);
        /* the perfect-drafter bound, W t(1) / t(W): what no drafter can beat at this width */
        printf("\n%-8s", "  perfect");
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" %7.2fx", o.widths[wi] * o.t_ms[c][0] / o.t_ms[c][wi]); /* widths[0] is 1 */
        printf("\n");
        /* the best speculative choice (W > 1); whether it beats W = 1 is the plan's "speculate" */
        best_s[c] = -1;
        best_w[c] = 0;
        best_rate[c] = 0;
        plain_rate[c] = 1e3 / o.t_ms[c][0];
        for (int s = 0; s < o.n_spec && o.n_widths > 1; s++) {
            double sec[PF_MAX_W], tok_[PF_MAX_W];
            for (int wi = 0; wi < o.n_widths; wi++) {
                const ctl_template *t = &o.spec[s].tree[wi];
                sec[wi] = (o.t_ms[c][wi] + pf_tree_depth(t) * o.spec[s].draft_ms[c]) / 1e3;
                tok_[wi] = o.spec[s].tokens[wi];
            }
            int wi = 1 + ctl_plan_best_width(o.widths + 1, sec + 1, tok_ + 1, o.n_widths - 1);
            if (wi >= 1 && tok_[wi] / sec[wi] > best_rate[c]) {
                best_rate[c] = tok_[wi] / sec[wi];
                best_s[c] = s;
                best_w[c] = wi;
            }
        }
    }
    printf("\ntokens per step by width (trees calibrated on '%s')\n%-12s %-12s",
           o.calib_cat < 0 ? "all" : o.cats[o.calib_cat], "speculator", "category");
    for (int wi = 0; wi < o.n_widths; wi++)
        printf(" %6d", o.widths[wi]);
    printf("\n");
    for (int s = 0; s < o.n_spec; s++)
        for (int ci = 0; ci < o.n_cats; ci++) {
            printf("%-12s %-12s", o.spec[s].kind, o.cats[ci]);
            for (int wi = 0; wi < o.n_widths; wi++)
                printf(" %6.2f", o.widths[wi] > 1
                                     ? ctl_plan_eval(&o.spec[s].tree[wi], o.spec[s].paths[ci],
                                                     o.spec[s].n_paths[ci], o.depth)
                                     : 1.0);
            printf("\n");
        }
    printf("\nplan (%s)\n%-8s %-12s %6s %7s %10s %12s %12s\n", o.out, "ctx", "speculator", "width",
           "length", "speculate", "tok/s", "plain tok/s");
    for (int c = 0; c < o.n_ctxs; c++) {
        int s = best_s[c];
        printf("%-8d %-12s %6d %7d %10s %12.1f %12.1f\n", o.ctxs[c],
               s >= 0 ? o.spec[s].kind : "none", o.widths[best_w[c]],
               s >= 0 ? pf_tree_depth(&o.spec[s].tree[best_w[c]]) : 0,
               best_rate[c] > plain_rate[c] ? "yes" : "no", best_rate[c], plain_rate[c]);
    }
    if (pf_write(&o, best_s, best_w, best_rate, plain_rate))
        goto done;
    rc = o.devices ? pf_devices(&o) : 0;
    if (rc)
        goto done;
    if (o.plot) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s '%s/bench/plot_plan.py' '%s' '%s'",
                 access("/usr/bin/python3", X_OK) ? "python3" : "/usr/bin/python3",
                 getenv("OROCHI_SOURCE") ? getenv("OROCHI_SOURCE") : ".", o.out, o.plot);
        if (system(cmd))
            fprintf(stderr, "orochi profile: no plot (bench/plot_plan.py needs python3 and "
                            "matplotlib); the plan is written\n");
    }
done:
    for (int i = 0; i < n_seq; i++)
        free(seqs[i].ids);
    free(seqs);
    for (int s = 0; s < o.n_spec; s++) {
        llama_model_destroy(&o.spec[s].m);
        medusa_destroy(&o.spec[s].md);
        for (int c = 0; c <= PF_MAX_CAT; c++)
            free(o.spec[s].paths[c]);
    }
    kpool_destroy(&pool);
    tokenizer_destroy(&tok);
    llama_model_destroy(&m);
    return rc;
}
