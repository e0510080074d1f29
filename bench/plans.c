/*
 * bench/plans.c — `orochi bench --plans`: the verification step time against width for partition
 * plans (docs/speculation.md, "The partition"; docs/gpu.md), so one plan's gain over another is
 * measured, not assumed.
 *
 * The parts of a column split run in this process, one thread each (with --threads-per-part pool
 * threads), over one shared block and an arena barrier with spinning — what worker processes do
 * through the shared-memory arena, without the processes. Each part runs on the CPU or, in a
 * build with CUDA, on the GPU (--devices cpu,gpu: part i on device i). A context of --ctx tokens
 * is prefilled once; then, for every repetition, every plan in turn (the parts switch plans
 * together between steps, as a Reconfigure does) runs a W-token chain with logits for every token
 * at each width, so load on the machine falls on all plans alike. A plan is
 *   hcmp:S       every kind by shares S (a/b/...; "even" for equal shares),
 *   split:S      the linear kinds by S; each head's dense (prefix) attention on part 0 and its
 *                sparse (tree) attention on the last part (Ghidorah's GPU/CPU assignment),
 *   megatron:S   the Megatron-style baseline: the second linear of each pair by input columns,
 *                partial sums reduced (S: the reduce and gate/up shares; heads by KV heads).
 * Reported per plan and width: the median step time over --reps, t(W)/t(1), and the weight bytes
 * read per step over that time (GB/s); a table on stdout and JSON lines in --json FILE. With
 * --prompt P, each repetition also times, per plan, a P-token prompt from position 0 in chunks of
 * 64 committed one after another (the last chunk's last token with logits), as a server takes a
 * prompt: its time, tokens/s and, on a GPU, its matmul flops over the tensor cores' rate.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/util.h"
#include "policy/control.h"
#include "model/llama.h"
#include "model/llama_cuda.h"
#ifdef OROCHI_HAVE_CUDA
#include "kernels/cuda/kcuda.h"
#endif
#include "shm/arena.h"

#define PB_MAX_PLANS 64 /* --plan at most 8; a search round times up to 64 candidates at once */
#define PB_MAX_USER_PLANS 8
#define PB_MAX_WIDTHS 16
#define PB_SPIN 200000

typedef struct {
    const char *model, *json;
    int parts, threads, ctx, reps;
    int widths[PB_MAX_WIDTHS], n_widths;
    char names[PB_MAX_PLANS][64];
    llama_partition plans[PB_MAX_PLANS];
    int n_plans;
    bool gpu[LLAMA_MAX_PARTS];
    const char *gpu_memory; /* --gpu-memory: auto, mapped, mirror */
    bool gpu_graphs, gpu_fuse;
    int gpu_unroll; /* --gpu-unroll: the quantized matmul's groups in flight (0: by width) */
    int gpu_matmul; /* --gpu-matmul: llama_gpu_params.matmul_kind (pb_matmul_word's index) */
    int gpu_att_parts; /* --gpu-att-parts: attention's key streams cut into N (0: by length) */
    int gpu_att_keys;  /* --gpu-att-keys: keys an attention warp scores at once (0: the default) */
    int gpu_att_tile;  /* --gpu-att-tile: attention by tiles, llama_gpu_params.att_tile */
    int gpu_frag;      /* --gpu-frag: llama_gpu_params.matmul_frag (pb_tile_word's index) */
    int gpu_groups;    /* --gpu-groups: llama_gpu_params.matmul_groups (0: the default) */
    int gpu_depth;     /* --gpu-depth: llama_gpu_params.matmul_depth (0: by the launch's size) */
    bool gpu_early;    /* --gpu-early on|off: llama_gpu_params.matmul_early */
    const char *search; /* --search FILE: find the partition, write it there */
    const char *gpu_weights; /* --gpu-weights: auto, device, mapped */
    size_t gpu_limit;        /* --gpu-memory-limit (0: none) */
    int prompt;              /* --prompt: the tokens of a prompt timed from position 0 (0: none) */
    int search_rounds;       /* --search-rounds: the search's rounds at most (0: 12, 20 under a
                              * --gpu-memory-limit) */
} pb_opts;

/* What the part threads share. */
typedef struct {
    const pb_opts *o;
    llama_model *m;
    void *block;
    size_t block_bytes;
    float *logits;
    arena_barrier barrier;
    double *ms; /* [rep][plan][width] step times of part 0 */
    double *pms; /* [rep][plan] --prompt's times */
    long *ops;  /* [plan][width] device ops part 0 queued for its last such step (a GPU part) */
    llama_gpu_how *how; /* [plan][width] how its kernels ran then (attention's parts, tiles,
                           the matmul's groups in flight) */
    int failed;
    char err[512];
    /* --gpu-memory-limit: the plan the contexts start and prefill under (the GPU parts given
     * nothing, so any limit holds their start); per plan, whether a GPU part's share is over the
     * limit (the plan is not timed: its times read INFINITY) and the most device memory a GPU part
     * would need for it */
    llama_partition start;
    bool over[PB_MAX_PLANS];
    size_t need[PB_MAX_PLANS];
    pthread_mutex_t lock;
} pb_run;

typedef struct {
    pb_run *r;
    int part;
} pb_part;

static int pb_sync(void *arg)
{
    return arena_barrier_wait(arg, -1, PB_SPIN);
}

/* The flops of every matmul of a step, per token: 2 per weight of the layers' seven matrices
 * and the LM head (what a wide step's time is set against the tensor cores' rate with). */
static double pb_matmul_flops(const llama_config *c)
{
    double dim = c->dim, qd = (double)c->n_heads * c->head_dim,
           kvd = (double)c->n_kv_heads * c->head_dim;
    double layer = dim * qd + 2 * dim * kvd + qd * dim + 3 * dim * c->ffn;
    return 2.0 * (layer * c->n_layers + (double)c->vocab * dim);
}

static void pb_usage(FILE *out)
{
    fprintf(out,
            "usage: orochi bench --plans [--model M] [--parts 2] [--threads-per-part 1]\n"
            "                    [--devices cpu,...] [--widths 1,2,4,8,16,32,64] [--ctx 256]\n"
            "                    [--reps 5] [--plan hcmp|split|megatron:S]... [--json FILE]\n"
            "                    [--gpu-memory auto|mapped|mirror] [--gpu-graphs on|off]\n"
            "                    [--gpu-fuse on|off] [--gpu-unroll auto|1|2|4]\n"
            "                    [--gpu-matmul auto|cuda|tensor] [--gpu-frag auto|on|off]\n"
            "                    [--gpu-groups auto|1|2|4|8] [--gpu-depth auto|4|8]\n"
            "                    [--gpu-early on|off]\n"
            "                    [--gpu-att-parts auto|N] [--gpu-att-keys 1|4]\n"
            "                    [--gpu-att-tile auto|on|off] [--gpu-weights auto|device|mapped]\n"
            "                    [--gpu-memory-limit BYTES] [--search PLAN] [--search-rounds N]\n"
            "                    [--prompt P]\n"
            "  Verification step time against width for partition plans, the parts run as\n"
            "  threads over one shared block (as worker processes share the arena). A plan is\n"
            "  hcmp:S (every kind by shares S, e.g. 0.7/0.3 or even), split:S (linears by S,\n"
            "  dense attention on part 0, sparse on the last part) or megatron:S (the baseline:\n"
            "  the second linear of each pair by input columns, partial sums reduced). Default:\n"
            "  hcmp:even, split:even, megatron:even. --devices: cpu or gpu per part (gpu needs a\n"
            "  build with CUDA; --gpu-memory, --gpu-graphs and --gpu-fuse as orochi-worker\n"
            "  takes them, docs/gpu.md); --gpu-unroll: the groups a lane of the GPU's quantized\n"
            "  matmul loads before it adds them (the same bits; auto: 2 up to width 4, else 1);\n"
            "  --gpu-matmul: the quantized matmul on CUDA cores or tensor cores (f16 products;\n"
            "  auto: tensor cores); --gpu-frag: the tensor-core matmul's inputs rounded once\n"
            "  into fragment order by a launch of their own, the same bits (auto: from 17\n"
            "  tokens; on: from 2; off: every warp reads the f32 rows); --gpu-groups: the\n"
            "  tensor-core matmul's token groups a launch, each its own blocks (the same bits;\n"
            "  auto: 1); --gpu-depth: the blocks a warp of it loads before it multiplies in a\n"
            "  step of up to 8 tokens (the same bits; auto: 8 where the device holds all the\n"
            "  launch's blocks at once with 8, else 4); --gpu-early: the tensor-core matmul\n"
            "  launched while the kernel ahead finishes, its first weights into L2 meanwhile\n"
            "  (the same bits; off by default);\n"
            "  --gpu-att-parts: the parts GPU attention cuts each key stream into (auto: by\n"
            "  length and width; 1: never; the same answer within rounding); --gpu-att-keys: the\n"
            "  keys a warp of it scores at once (4; 1 to compare); --gpu-att-tile: the tiled\n"
            "  attention kernel, where the queries of a KV head and a sequence share each K/V\n"
            "  load (auto: streams of 1024 keys or more whose queries a KV head x keys reach\n"
            "  28672; on; off). JSON lines go to --json FILE (bench/results/plans.jsonl).\n"
            "  --prompt P: each repetition also times a P-token prompt from position 0 per\n"
            "  plan, in chunks of 64 (1..16384; not with --search).\n"
            "  --search PLAN: instead of timing plans, find the partition for these parts (ARCA's\n"
            "  split per device): each part alone first, then shares moved between parts kind\n"
            "  by kind while the step time summed over --widths falls (policy/control.h,\n"
            "  ctl_split_search); the found partition is printed and put into the plan file\n"
            "  PLAN (its other keys kept; a new file holds the partition alone). Then the\n"
            "  devices are chosen (ctl_device_choice): the fastest part alone unless the split\n"
            "  beats it by 1%%; the plan's partition says which and why (\"devices\", \"why\").\n"
            "  --search-rounds N: the search's rounds at most (1..100; default 12, 20 under a\n"
            "  --gpu-memory-limit): fewer is quicker and coarser.\n"
            "  --gpu-weights and --gpu-memory-limit as orochi-worker takes them: under a limit\n"
            "  a split whose GPU share would not fit is not timed (over the limit), and a GPU\n"
            "  that cannot hold the model is never chosen alone.\n");
}

/* "hcmp:0.7/0.3" into a plan of n parts; false with one line. */
static bool pb_plan(const char *spec, int n, llama_partition *p, char *name, size_t namelen)
{
    const char *colon = strchr(spec, ':');
    char style[16] = "";
    snprintf(style, sizeof style, "%.*s", colon ? (int)(colon - spec) : (int)strlen(spec), spec);
    const char *shares = colon ? colon + 1 : "even";
    llama_partition_even(p, n);
    float f[LLAMA_MAX_PARTS];
    if (strcmp(shares, "even")) {
        char *dup = strdup(shares), *save = NULL;
        int k = 0;
        for (char *t = strtok_r(dup, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
            char *end;
            double v = strtod(t, &end);
            if (*end || v < 0 || k == n) {
                k = -1;
                break;
            }
            f[k++] = (float)v;
        }
        free(dup);
        if (k != n) {
            fprintf(stderr, "orochi bench: --plan %s: want %d shares a/b/... (>= 0) or 'even'\n",
                    spec, n);
            return false;
        }
        for (int kind = 0; kind < LP_N; kind++)
            for (int i = 0; i < n; i++)
                p->frac[kind][i] = f[i];
    }
    if (!strcmp(style, "megatron")) {
        p->style = LP_STYLE_MEGATRON;
    } else if (!strcmp(style, "split")) {
        for (int i = 0; i < n; i++) {
            p->frac[LP_ATT_DENSE][i] = i == 0;
            p->frac[LP_ATT_SPARSE][i] = i == n - 1;
        }
    } else if (strcmp(style, "hcmp")) {
        fprintf(stderr, "orochi bench: --plan %s: the style must be hcmp, split or megatron\n",
                spec);
        return false;
    }
    char why[256];
    if (llama_partition_check(p, why, sizeof why)) {
        fprintf(stderr, "orochi bench: --plan %s: %s\n", spec, why);
        return false;
    }
    snprintf(name, namelen, "%s:%s", style, shares);
    return true;
}

static void pb_fail(pb_run *r, int part, const char *err)
{
    if (!__atomic_exchange_n(&r->failed, 1, __ATOMIC_ACQ_REL))
        snprintf(r->err, sizeof r->err, "part %d: %s", part, err);
    arena_barrier_break(&r->barrier);
}

/* One part: prefill, then the timed steps. */
/* The positions a context holds: the timed steps' (--ctx, then up to 64 tokens), or a --prompt's
 * chunks of 64 from position 0, whichever reaches further. */
static int pb_ctx_len(const pb_opts *o)
{
    return (o->prompt > o->ctx ? o->prompt : o->ctx) + 64;
}

/* One forward step of a part: on its GPU where it has one. */
static int pb_forward(llama_ctx *x, llama_gpu *gpu, const llama_batch *b, float *logits, char *err,
                      size_t errlen)
{
#ifdef OROCHI_HAVE_CUDA
    if (gpu)
        return llama_gpu_forward(gpu, b, logits, err, errlen);
#else
    (void)gpu;
#endif
    return llama_forward(x, b, logits, err, errlen);
}

/* --prompt's tokens ids[0, P) from position 0 in chunks of 64, each committed, the last token's
 * logits into `logits`; then the committed length back at --ctx. 0, or -1 with err. */
static int pb_prompt(llama_ctx *x, llama_gpu *gpu, const pb_opts *o, const int32_t *ids,
                     const int32_t *path, float *logits, char *err, size_t errlen)
{
    int rc = 0;
    llama_ctx_set_prefix_len(x, 0);
    for (int at = 0; at < o->prompt && !rc; at += 64) {
        int n = o->prompt - at < 64 ? o->prompt - at : 64;
        bool last = at + n >= o->prompt;
        llama_batch b = {.n = n, .tokens = ids + at, .logits_from = last ? n - 1 : n};
        rc = pb_forward(x, gpu, &b, last ? logits : NULL, err, errlen) ||
             llama_commit(x, path, n, err, errlen);
    }
    llama_ctx_set_prefix_len(x, o->ctx);
    return rc ? -1 : 0;
}

static void *pb_part_main(void *argp)
{
    pb_part *pp = argp;
    pb_run *r = pp->r;
    const pb_opts *o = r->o;
    int me = pp->part, W = 64;
    char err[400];
    llama_ctx_params cp = {.n_threads = o->threads, .max_width = W, .n_ctx = pb_ctx_len(o),
                           .kv = KV_F32, .part = me, .n_parts = o->parts,
                           .plan = o->gpu_limit ? &r->start : &o->plans[0], .shared = r->block,
                           .sync = pb_sync, .sync_arg = &r->barrier};
    llama_ctx *x = llama_ctx_new(r->m, &cp, err, sizeof err);
    if (!x) {
        pb_fail(r, me, err);
        return NULL;
    }
    llama_gpu *gpu = NULL;
#ifdef OROCHI_HAVE_CUDA
    llama_gpu_params gprm = {.memory = (llama_gpu_memory)llama_gpu_memory_parse(o->gpu_memory),
                             .graphs = o->gpu_graphs,
                             .unfused = !o->gpu_fuse,
                             .matmul_unroll = o->gpu_unroll,
                             .matmul_kind = o->gpu_matmul,
                             .att_parts = o->gpu_att_parts,
                             .att_keys = o->gpu_att_keys,
                             .att_tile = o->gpu_att_tile,
                             .matmul_frag = o->gpu_frag,
                             .matmul_groups = o->gpu_groups,
                             .matmul_depth = o->gpu_depth,
                             .matmul_early = o->gpu_early,
                             .weights = (llama_gpu_weights)llama_gpu_weights_parse(o->gpu_weights),
                             .memory_limit = o->gpu_limit};
    if (o->gpu[me] && !(gpu = llama_gpu_new(x, &gprm, r->block, r->block_bytes, err, sizeof err))) {
        pb_fail(r, me, err);
        llama_ctx_destroy(&x);
        return NULL;
    }
#endif
#define PB_FORWARD(b, lg) pb_forward(x, gpu, b, lg, err, sizeof err)
    int32_t *ids = malloc((size_t)pb_ctx_len(o) * sizeof *ids), path[64];
    cli_synthetic_ids(ids, pb_ctx_len(o), r->m->cfg.vocab);
    for (int i = 0; i < W; i++)
        path[i] = i;
    /* the context, in chunks of the width, committed */
    for (int at = 0; at < o->ctx && !r->failed; at += W) {
        int n = o->ctx - at < W ? o->ctx - at : W;
        llama_batch b = {.n = n, .tokens = ids + at, .logits_from = n};
        if (PB_FORWARD(&b, NULL) || llama_commit(x, path, n, err, sizeof err)) {
            pb_fail(r, me, err);
            break;
        }
    }
#ifdef OROCHI_HAVE_CUDA
    /* a memory limit: which plans give a GPU part more than it may hold */
    for (int pl = 0; gpu && o->gpu_limit && pl < o->n_plans && !r->failed; pl++) {
        if (llama_ctx_set_partition(x, &o->plans[pl], err, sizeof err)) {
            pb_fail(r, me, err);
            break;
        }
        size_t need = llama_gpu_need_bytes(gpu);
        if (llama_ctx_set_partition(x, &r->start, err, sizeof err)) {
            pb_fail(r, me, err);
            break;
        }
        pthread_mutex_lock(&r->lock);
        r->need[pl] = need > r->need[pl] ? need : r->need[pl];
        r->over[pl] |= need > o->gpu_limit;
        pthread_mutex_unlock(&r->lock);
    }
#endif
    if (o->gpu_limit && pb_sync(&r->barrier)) /* every part reads the same verdicts */
        pb_fail(r, me, "a part was lost");
    for (int rep = -1; rep < o->reps && !r->failed; rep++) /* rep -1: the warm-up */
        for (int pl = 0; pl < o->n_plans && !r->failed; pl++) {
            if (r->over[pl])
                continue;
            if (llama_ctx_set_partition(x, &o->plans[pl], err, sizeof err)) {
                pb_fail(r, me, err);
                break;
            }
            /* under a limit a GPU part's windows may be uploaded again at a switch: not timed */
            llama_batch one = {.n = 1, .tokens = ids + o->ctx, .logits_from = 0};
            if (o->gpu_limit && (pb_sync(&r->barrier) || PB_FORWARD(&one, r->logits))) {
                pb_fail(r, me, err);
                break;
            }
            for (int wi = 0; wi < o->n_widths && !r->failed; wi++) {
                llama_batch b = {.n = o->widths[wi], .tokens = ids + o->ctx, .logits_from = 0};
                if (pb_sync(&r->barrier)) /* start together */
                    break;
                double t0 = cli_now();
#ifdef OROCHI_HAVE_CUDA
                long ops0 = gpu ? llama_gpu_launches(gpu) : 0;
#endif
                if (PB_FORWARD(&b, r->logits)) {
                    pb_fail(r, me, err);
                    break;
                }
#ifdef OROCHI_HAVE_CUDA
                if (me == 0 && gpu) {
                    r->ops[(size_t)pl * o->n_widths + wi] = llama_gpu_launches(gpu) - ops0;
                    r->how[(size_t)pl * o->n_widths + wi] = llama_gpu_last_step(gpu);
                }
#endif
                if (pb_sync(&r->barrier)) /* the step ends when its last part ends */
                    break;
                if (me == 0 && rep >= 0)
                    r->ms[((size_t)rep * o->n_plans + pl) * o->n_widths + wi] =
                        (cli_now() - t0) * 1e3;
            }
            /* a prompt from position 0 over the context's rows: the same ids as the context's
             * prefill, so the rows [0, ctx) it leaves are the ones the widths read */
            if (o->prompt && !r->failed && !pb_sync(&r->barrier)) {
                double t0 = cli_now();
                if (pb_prompt(x, gpu, o, ids, path, r->logits, err, sizeof err)) {
                    pb_fail(r, me, err);
                    break;
                }
                if (pb_sync(&r->barrier))
                    break;
                if (me == 0 && rep >= 0)
                    r->pms[(size_t)rep * o->n_plans + pl] = (cli_now() - t0) * 1e3;
            }
        }
    free(ids);
#ifdef OROCHI_HAVE_CUDA
    llama_gpu_destroy(&gpu);
#endif
    llama_ctx_destroy(&x);
    return NULL;
}

/* --gpu-att-tile's words by pb_opts.gpu_att_tile (KCUDA_TILE_AUTO, _ON, _OFF), and --gpu-frag's
 * by pb_opts.gpu_frag (KCUDA_FRAG_AUTO, _ON, _OFF) */
static const char *const pb_tile_word[] = {"auto", "on", "off"};
/* --gpu-matmul's words by pb_opts.gpu_matmul (KCUDA_MM_AUTO, _SIMT, _TC) */
static const char *const pb_matmul_word[] = {"auto", "cuda", "tensor"};

/* A word's index in a table of n words; -1 (said, with the words) for another. */
static int pb_word(const char *opt, const char *val, const char *const *words, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(val, words[i]))
            return i;
    fprintf(stderr, "orochi bench: %s %s: ", opt, val); /* "a, b or c" */
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%s%s", words[i], i + 2 < n ? ", " : i + 2 == n ? " or " : "\n");
    return -1;
}

/* An on|off option's value into *on; false (said) for another word. */
static bool pb_on_off(const char *opt, const char *val, bool *on)
{
    if (strcmp(val, "on") && strcmp(val, "off")) {
        fprintf(stderr, "orochi bench: %s %s: on or off\n", opt, val);
        return false;
    }
    *on = !strcmp(val, "on");
    return true;
}

static int pb_parse(pb_opts *o, int argc, char **argv)
{
    const char *plans[PB_MAX_USER_PLANS], *devices = NULL;
    int n_plans = 0;
    long v;
    for (int i = 1; i < argc; i++) { /* argv[0] is --plans */
        const char *a = argv[i], *val;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            pb_usage(stdout);
            exit(0);
        }
        if (!(val = cli_value("bench", argc, argv, &i)))
            return 2;
        if (!strcmp(a, "--model")) {
            o->model = val;
        } else if (!strcmp(a, "--json")) {
            o->json = val;
        } else if (!strcmp(a, "--devices")) {
            devices = val;
        } else if (!strcmp(a, "--search")) {
            o->search = val;
        } else if (!strcmp(a, "--gpu-memory")) {
            if (llama_gpu_memory_parse(val) < 0) {
                fprintf(stderr, "orochi bench: --gpu-memory %s: auto, mapped or mirror\n", val);
                return 2;
            }
            o->gpu_memory = val;
        } else if (!strcmp(a, "--gpu-graphs")) {
            if (!pb_on_off(a, val, &o->gpu_graphs))
                return 2;
        } else if (!strcmp(a, "--gpu-unroll")) {
            if (strcmp(val, "auto") && strcmp(val, "1") && strcmp(val, "2") && strcmp(val, "4")) {
                fprintf(stderr, "orochi bench: --gpu-unroll %s: auto, 1, 2 or 4\n", val);
                return 2;
            }
            o->gpu_unroll = atoi(val); /* auto: 0 */
        } else if (!strcmp(a, "--gpu-groups")) {
            if (strcmp(val, "auto") && strcmp(val, "1") && strcmp(val, "2") && strcmp(val, "4") &&
                strcmp(val, "8")) {
                fprintf(stderr, "orochi bench: --gpu-groups %s: auto, 1, 2, 4 or 8\n", val);
                return 2;
            }
            o->gpu_groups = atoi(val); /* auto: 0 */
        } else if (!strcmp(a, "--gpu-early")) {
            if (!pb_on_off(a, val, &o->gpu_early))
                return 2;
        } else if (!strcmp(a, "--gpu-depth")) {
            if (strcmp(val, "auto") && strcmp(val, "4") && strcmp(val, "8")) {
                fprintf(stderr, "orochi bench: --gpu-depth %s: auto, 4 or 8\n", val);
                return 2;
            }
            o->gpu_depth = atoi(val); /* auto: 0 */
        } else if (!strcmp(a, "--gpu-att-parts")) {
            if ((o->gpu_att_parts = llama_gpu_att_parts_parse(val)) < 0) {
                fprintf(stderr, "orochi bench: --gpu-att-parts %s: auto or 1..256\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--gpu-att-keys")) {
            if (strcmp(val, "1") && strcmp(val, "4")) {
                fprintf(stderr, "orochi bench: --gpu-att-keys %s: 1 or 4\n", val);
                return 2;
            }
            o->gpu_att_keys = atoi(val);
        } else if (!strcmp(a, "--gpu-att-tile")) {
            /* the word's index: llama_gpu_params.att_tile */
            if ((o->gpu_att_tile = pb_word(a, val, pb_tile_word, 3)) < 0)
                return 2;
        } else if (!strcmp(a, "--gpu-frag")) {
            /* the word's index: llama_gpu_params.matmul_frag */
            if ((o->gpu_frag = pb_word(a, val, pb_tile_word, 3)) < 0)
                return 2;
        } else if (!strcmp(a, "--gpu-matmul")) {
            /* the word's index: llama_gpu_params.matmul_kind */
            if ((o->gpu_matmul = pb_word(a, val, pb_matmul_word, 3)) < 0)
                return 2;
        } else if (!strcmp(a, "--gpu-weights")) {
            if (llama_gpu_weights_parse(val) < 0) {
                fprintf(stderr, "orochi bench: --gpu-weights %s: auto, device or mapped\n", val);
                return 2;
            }
            o->gpu_weights = val;
        } else if (!strcmp(a, "--gpu-memory-limit")) {
            if (llama_gpu_bytes_parse(val, &o->gpu_limit)) {
                fprintf(stderr, "orochi bench: --gpu-memory-limit %s: a byte count (40G, 512M; 0: "
                                "none)\n", val);
                return 2;
            }
        } else if (!strcmp(a, "--gpu-fuse")) {
            if (!pb_on_off(a, val, &o->gpu_fuse))
                return 2;
        } else if (!strcmp(a, "--plan")) {
            if (n_plans == PB_MAX_USER_PLANS) {
                fprintf(stderr, "orochi bench: at most %d plans\n", PB_MAX_USER_PLANS);
                return 2;
            }
            plans[n_plans++] = val;
        } else if (!strcmp(a, "--widths")) {
            if ((o->n_widths = cli_int_list("bench", a, val, 1, 64, o->widths, PB_MAX_WIDTHS)) < 1)
                return 2;
        } else if (!strcmp(a, "--parts") || !strcmp(a, "--threads-per-part") ||
                   !strcmp(a, "--ctx") || !strcmp(a, "--reps") || !strcmp(a, "--prompt") ||
                   !strcmp(a, "--search-rounds")) {
            long hi = !strcmp(a, "--parts")           ? LLAMA_MAX_PARTS
                      : !strcmp(a, "--ctx")           ? 65536
                      : !strcmp(a, "--prompt")        ? 16384
                      : !strcmp(a, "--search-rounds") ? 100
                                                      : 1000;
            if (!cli_int("bench", a, val, 1, hi, &v))
                return 2;
            *(!strcmp(a, "--parts")           ? &o->parts
              : !strcmp(a, "--threads-per-part") ? &o->threads
              : !strcmp(a, "--ctx")           ? &o->ctx
              : !strcmp(a, "--prompt")        ? &o->prompt
              : !strcmp(a, "--search-rounds") ? &o->search_rounds
                                              : &o->reps) = (int)v;
        } else {
            fprintf(stderr, "orochi bench: unknown option '%s' for --plans\n", a);
            return 2;
        }
    }
    if (o->search_rounds && !o->search) {
        fprintf(stderr, "orochi bench: --search-rounds is for --search\n");
        return 2;
    }
    if (o->prompt && o->search) {
        fprintf(stderr, "orochi bench: --prompt times plans; --search finds one: not both\n");
        return 2;
    }
    if (!n_plans) {
        plans[n_plans++] = "hcmp:even";
        plans[n_plans++] = "split:even";
        plans[n_plans++] = "megatron:even";
    }
    for (int k = 0; k < n_plans; k++)
        if (!pb_plan(plans[k], o->parts, &o->plans[k], o->names[k], sizeof o->names[k]))
            return 2;
    o->n_plans = n_plans;
    if (devices) {
        int n = 0;
        char *dup = strdup(devices), *save = NULL;
        for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save), n++) {
            if (n == o->parts || (strcmp(t, "cpu") && strcmp(t, "gpu"))) {
                fprintf(stderr, "orochi bench: --devices %s: cpu or gpu for each of %d parts\n",
                        devices, o->parts);
                free(dup);
                return 2;
            }
            o->gpu[n] = !strcmp(t, "gpu");
        }
        free(dup);
#ifndef OROCHI_HAVE_CUDA
        for (int i = 0; i < o->parts; i++)
            if (o->gpu[i]) {
                fprintf(stderr, "orochi bench: --devices gpu: this build has no CUDA (CMake "
                                "builds it when it finds nvcc)\n");
                return 2;
            }
#endif
    }
    return 0;
}

/* Every plan of o at every width, reps times, the parts as threads: r->ms[rep][plan][width]. 0,
 * or -1 with the reason in r->err. */
static int pb_measure(pb_run *r)
{
    const pb_opts *o = r->o;
    free(r->ms);
    free(r->pms);
    free(r->ops);
    free(r->how);
    r->ms = calloc((size_t)o->reps * (size_t)o->n_plans * (size_t)o->n_widths, sizeof *r->ms);
    r->pms = calloc((size_t)o->reps * (size_t)o->n_plans, sizeof *r->pms);
    r->ops = calloc((size_t)o->n_plans * (size_t)o->n_widths, sizeof *r->ops);
    r->how = calloc((size_t)o->n_plans * (size_t)o->n_widths, sizeof *r->how);
    if (!r->ms || !r->pms || !r->ops || !r->how) {
        snprintf(r->err, sizeof r->err, "out of memory");
        return -1;
    }
    r->failed = 0;
    memset(r->over, 0, sizeof r->over);
    memset(r->need, 0, sizeof r->need);
    arena_barrier_init(&r->barrier, (uint32_t)o->parts);
    pthread_t th[LLAMA_MAX_PARTS];
    pb_part pp[LLAMA_MAX_PARTS];
    for (int i = 0; i < o->parts; i++) {
        pp[i] = (pb_part){r, i};
        pthread_create(&th[i], NULL, pb_part_main, &pp[i]);
    }
    for (int i = 0; i < o->parts; i++)
        pthread_join(th[i], NULL);
    return r->failed ? -1 : 0;
}

/* The median over reps of plan pl's times[rep * per_rep + at] (INFINITY where a GPU part could
 * not hold the plan's share: not timed). */
static double pb_median_of(const pb_run *r, const double *times, size_t per_rep, size_t at, int pl)
{
    double v[1000];
    if (r->over[pl])
        return INFINITY;
    for (int k = 0; k < r->o->reps; k++)
        v[k] = times[(size_t)k * per_rep + at];
    return cli_median(v, r->o->reps);
}

/* The median step time over reps of plan pl at width index wi. */
static double pb_median(const pb_run *r, int pl, int wi)
{
    const pb_opts *o = r->o;
    return pb_median_of(r, r->ms, (size_t)o->n_plans * o->n_widths, (size_t)pl * o->n_widths + wi,
                        pl);
}

/* ===== --search: the partition for parts that differ ===== */

typedef struct {
    pb_opts *o;
    pb_run *r;
    int round, evals;
} pb_search;

static void pb_shares_plan(const pb_opts *o, const float *shares, llama_partition *p)
{
    llama_partition_even(p, o->parts);
    for (int k = 0; k < LP_N; k++)
        for (int i = 0; i < o->parts; i++)
            p->frac[k][i] = shares[k * o->parts + i];
}

/* ctl_split_eval: each candidate's step time summed over the widths, the candidates timed side by
 * side (PB_MAX_PLANS at a time). */
static int pb_search_eval(const float *cands, int n, double *ms, void *arg)
{
    pb_search *s = arg;
    pb_opts *o = s->o;
    size_t one = (size_t)LP_N * (size_t)o->parts;
    for (int at = 0; at < n; at += PB_MAX_PLANS) {
        o->n_plans = n - at < PB_MAX_PLANS ? n - at : PB_MAX_PLANS;
        for (int i = 0; i < o->n_plans; i++) {
            pb_shares_plan(o, cands + (size_t)(at + i) * one, &o->plans[i]);
            snprintf(o->names[i], sizeof o->names[i], "candidate %d", at + i);
        }
        if (pb_measure(s->r))
            return -1;
        for (int i = 0; i < o->n_plans; i++) {
            ms[at + i] = 0;
            for (int wi = 0; wi < o->n_widths; wi++)
                ms[at + i] += pb_median(s->r, i, wi);
        }
    }
    double lo = ms[0];
    for (int i = 1; i < n; i++)
        lo = ms[i] < lo ? ms[i] : lo;
    fprintf(stderr, "orochi bench --search: %s %d: %d splits timed, the current %.3f ms, the best "
                    "%.3f ms\n",
            s->evals ? "round" : "start", s->round, n, ms[0], lo);
    s->round += s->evals++ > 0;
    return 0;
}

/* The partition as the plan file's "partition" object (docs/speculation.md, "The partition"). */
static void pb_partition_json(FILE *f, const pb_opts *o, const float *shares, const char *why,
                              const char *indent)
{
    fprintf(f, "{\n%s  \"parts\": %d,\n%s  \"style\": \"hcmp\",\n%s  \"devices\": [", indent,
            o->parts, indent, indent);
    for (int i = 0; i < o->parts; i++)
        fprintf(f, "%s\"%s\"", i ? ", " : "", o->gpu[i] ? "gpu" : "cpu");
    fprintf(f, "]");
    if (why) /* the sentence holds no quote or backslash (ctl_device_choice's names and times) */
        fprintf(f, ",\n%s  \"why\": \"%s\"", indent, why);
    for (int k = 0; k < LP_N; k++) {
        fprintf(f, ",\n%s  \"%s\": [", indent, llama_part_kind_names[k]);
        for (int i = 0; i < o->parts; i++)
            fprintf(f, "%s%.4f", i ? ", " : "", shares[k * o->parts + i]);
        fprintf(f, "]");
    }
    fprintf(f, "\n%s}", indent);
}

#ifndef OROCHI_CORE_ONLY
#include <cjson/cJSON.h>
/* Put the partition into the plan file at path (its other keys kept). 0, or -1 with err. */
static int pb_merge_partition(const char *path, const pb_opts *o, const float *shares,
                              const char *why, char *err, size_t errlen)
{
    char *text = cli_read_file(path, NULL); /* none yet: a new plan */
    cJSON *plan = text ? cJSON_Parse(text) : cJSON_CreateObject();
    free(text);
    if (!plan || !cJSON_IsObject(plan)) {
        snprintf(err, errlen, "%s is not a JSON object (a plan orochi profile wrote)", path);
        cJSON_Delete(plan);
        return -1;
    }
    char *printed = NULL; /* the object as stdout shows it, parsed: one writer of the format */
    size_t printed_len = 0;
    FILE *mf = open_memstream(&printed, &printed_len);
    if (mf) {
        pb_partition_json(mf, o, shares, why, "");
        fclose(mf);
    }
    cJSON *part = printed ? cJSON_Parse(printed) : NULL;
    free(printed);
    if (!part) {
        snprintf(err, errlen, "out of memory writing the partition");
        cJSON_Delete(plan);
        return -1;
    }
    cJSON_DeleteItemFromObject(plan, "partition");
    cJSON_AddItemToObject(plan, "partition", part);
    char *out = cJSON_Print(plan);
    cJSON_Delete(plan);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = out ? fopen(tmp, "w") : NULL;
    bool ok = f && fputs(out, f) >= 0 && fputc('\n', f) != EOF;
    ok = f && !fclose(f) && ok && !rename(tmp, path);
    free(out);
    if (!ok)
        snprintf(err, errlen, "cannot write %s", path);
    return ok ? 0 : -1;
}
#endif

/* Search the split (ctl_split_search), starting from each part's time with all the work, then
 * time the even split against the found one and write the partition. */
static int pb_search_run(pb_opts *o, pb_run *r)
{
    int P = o->parts;
    size_t one = (size_t)LP_N * (size_t)P;
    float *c = calloc((size_t)(P + 1) * one, sizeof *c), best[LP_N * LLAMA_MAX_PARTS];
    double ms[LLAMA_MAX_PARTS + 1], part_ms[LLAMA_MAX_PARTS], best_ms;
    pb_search s = {.o = o, .r = r};
    if (!c)
        return -1;
    /* each part alone: all of every kind on it */
    for (int p = 0; p < P; p++)
        for (int k = 0; k < LP_N; k++)
            c[(size_t)p * one + (size_t)k * P + (size_t)p] = 1.0f;
    int rc = pb_search_eval(c, P, ms, &s);
    const char *names[LLAMA_MAX_PARTS];
    char name_buf[LLAMA_MAX_PARTS][32];
    for (int p = 0; !rc && p < P; p++) {
        part_ms[p] = ms[p];
        snprintf(name_buf[p], sizeof name_buf[p], "part %d (%s)", p, o->gpu[p] ? "gpu" : "cpu");
        names[p] = name_buf[p];
        if (isfinite(ms[p]))
            fprintf(stderr, "orochi bench --search: %s alone: %.3f ms\n", names[p], ms[p]);
        else
            fprintf(stderr, "orochi bench --search: %s alone: needs %.1f MiB of device memory, "
                            "over --gpu-memory-limit %.1f MiB: not timed\n",
                    names[p], (double)r->need[p] / (1 << 20), (double)o->gpu_limit / (1 << 20));
    }
    ctl_split_opts so = {.groups = LP_N, .parts = P, .delta = 0.1, .min_delta = 0.02,
                         .margin = 0.01,
                         .max_rounds = o->search_rounds ? o->search_rounds
                                       : o->gpu_limit   ? 20
                                                        : 12};
    int rounds = 0;
    if (!rc)
        rc = ctl_split_search(&so, part_ms, pb_search_eval, &s, best, &best_ms, &rounds);
    if (!rc) { /* the even split and the found one, side by side */
        for (size_t i = 0; i < one; i++)
            c[i] = 1.0f / (float)P;
        memcpy(c + one, best, one * sizeof *c);
        rc = pb_search_eval(c, 2, ms, &s);
    }
    free(c);
    if (rc) {
        fprintf(stderr, "orochi bench: %s\n", r->err);
        return 1;
    }
    printf("partition search: %d parts, %d rounds; summed over the widths, the even split %.3f ms, "
           "the found one %.3f ms (%.2fx); load average %.2f\n",
           P, rounds, ms[0], ms[1], ms[0] / ms[1], cli_loadavg());
    /* ARCA's choice of devices: a part alone where the split does not pay */
    char why[512];
    int alone = ctl_device_choice(part_ms, names, P, ms[1], so.margin, why, sizeof why);
    if (alone >= 0)
        for (int k = 0; k < LP_N; k++)
            for (int p = 0; p < P; p++)
                best[k * P + p] = p == alone ? 1.0f : 0.0f;
    printf("devices: %s%s\n", why,
           alone >= 0 ? " (a group of that worker alone skips the others' synchronisation)" : "");
    pb_partition_json(stdout, o, best, why, "");
    printf("\n");
#ifndef OROCHI_CORE_ONLY
    char err[512];
    if (pb_merge_partition(o->search, o, best, why, err, sizeof err)) {
        fprintf(stderr, "orochi bench: %s\n", err);
        return 1;
    }
    fprintf(stderr, "orochi bench: the partition is in %s\n", o->search);
#else
    FILE *f = fopen(o->search, "w");
    if (!f) {
        fprintf(stderr, "orochi bench: cannot write %s\n", o->search);
        return 1;
    }
    fprintf(f, "{\n  \"partition\": ");
    pb_partition_json(f, o, best, why, "  ");
    fprintf(f, "\n}\n");
    fclose(f);
    fprintf(stderr, "orochi bench: the partition is in %s (this build writes a plan of its own)\n",
            o->search);
#endif
    return 0;
}

/* --prompt's line per plan (the median over reps; a plan over the memory limit: not timed) and
 * its JSON line: the time, tokens/s and the matmuls' flops over the tensor cores' rate (tc > 0). */
static void pb_prompt_report(const pb_run *r, FILE *js, double tflop, double tc, double la,
                             const char *devs)
{
    const pb_opts *o = r->o;
    const char *base = strrchr(o->model, '/');
    printf("a %d-token prompt from position 0 in chunks of 64 (ms, median of %d; tokens/s%s):\n",
           o->prompt, o->reps, tc > 0 ? "; the matmuls' flops over the tensor cores' rate" : "");
    for (int p = 0; p < o->n_plans; p++) {
        double med = pb_median_of(r, r->pms, (size_t)o->n_plans, (size_t)p, p);
        if (isinf(med)) {
            printf("  %-22s not timed: a GPU part's share is over --gpu-memory-limit\n", o->names[p]);
            continue;
        }
        double tps = o->prompt / (med / 1e3), share = tc > 0 ? tflop * tps / tc : 0.0;
        printf("  %-22s %9.2f ms %9.1f tok/s", o->names[p], med, tps);
        if (tc > 0)
            printf(" %5.1f%% of the tensor cores", 100.0 * share);
        printf("\n");
        if (js)
            fprintf(js,
                    "{\"bench\":\"plans_prompt\",\"plan\":\"%s\",\"prompt\":%d,\"ms\":%.4f,"
                    "\"tok_s\":%.2f,\"parts\":%d,\"devices\":\"%s\",\"threads\":%d,"
                    "\"reps\":%d,\"model\":\"%s\",\"loadavg\":%.2f,\"gpu_matmul_ask\":\"%s\","
                    "\"gpu_frag_ask\":\"%s\",\"gpu_groups_ask\":%d,\"mma_tflops\":%.4g,"
                    "\"tc_share\":%.4f}\n",
                    o->names[p], o->prompt, med, tps, o->parts, devs, o->threads, o->reps,
                    base ? base + 1 : o->model, la, pb_matmul_word[o->gpu_matmul],
                    pb_tile_word[o->gpu_frag], o->gpu_groups, tc, share);
    }
}

int bench_plans(int argc, char **argv)
{
    pb_opts o = {.model = "models/SmolLM2-135M-Instruct.Q4_1.gguf",
                 .json = "bench/results/plans.jsonl",
                 .parts = 2,
                 .threads = 1,
                 .ctx = 256,
                 .reps = 5,
                 .gpu_memory = "auto",
                 .gpu_weights = "auto",
                 .gpu_graphs = true,
                 .gpu_fuse = true};
    o.n_widths = cli_int_list("bench", "--widths", "1,2,4,8,16,32,64", 1, 64, o.widths,
                              PB_MAX_WIDTHS);
    int rc = pb_parse(&o, argc, argv);
    if (rc)
        return rc;
    char err[512];
    pb_run r = {.o = &o, .lock = PTHREAD_MUTEX_INITIALIZER};
    /* under a memory limit the contexts start with nothing on their GPU parts */
    bool all_gpu = true, any_gpu = false; /* all: no part multiplies on the CPU, no repacking */
    for (int i = 0; i < o.parts; i++) {
        all_gpu &= o.gpu[i];
        any_gpu |= o.gpu[i];
    }
    llama_partition_even(&r.start, o.parts);
    for (int k = 0; k < LP_N && !all_gpu; k++)
        for (int i = 0; i < o.parts; i++)
            r.start.frac[k][i] = o.gpu[i] ? 0.0f : 1.0f;
    r.m = all_gpu ? llama_model_load_unpacked(o.model, err, sizeof err)
                  : llama_model_load(o.model, err, sizeof err);
    if (!r.m) {
        fprintf(stderr, "orochi bench: %s\n", err);
        return 2;
    }
    size_t shared = llama_shared_layout(&r.m->cfg, pb_ctx_len(&o), 64, 1, KV_F32, NULL);
    size_t lbytes = (size_t)64 * (size_t)r.m->cfg.vocab * 4;
    r.block_bytes = (shared + lbytes + 4095) & ~(size_t)4095;
    r.block = aligned_alloc(4096, r.block_bytes);
    if (!r.block) {
        fprintf(stderr, "orochi bench: out of memory (%zu bytes of shared block)\n",
                r.block_bytes);
        return 1;
    }
    memset(r.block, 0, r.block_bytes);
    r.logits = (float *)((char *)r.block + shared);
    char devs[128] = "";
    for (int i = 0, at = 0; i < o.parts && at < (int)sizeof devs - 5; i++)
        at += snprintf(devs + at, sizeof devs - (size_t)at, "%s%s", i ? "," : "",
                       o.gpu[i] ? "gpu" : "cpu");
    if (o.search) {
        fprintf(stderr, "orochi bench --plans --search: %d parts (%s) x %d threads, context %d, "
                        "widths x %d reps per split...\n",
                o.parts, devs, o.threads, o.ctx, o.reps);
        rc = pb_search_run(&o, &r);
        free(r.ms);
        free(r.pms);
        free(r.ops);
        free(r.how);
        free(r.block);
        llama_model_destroy(&r.m);
        return rc;
    }
    fprintf(stderr, "orochi bench --plans: %d parts (%s) x %d threads, context %d, %d plans x %d "
                    "widths x %d reps...\n",
            o.parts, devs, o.threads, o.ctx, o.n_plans, o.n_widths, o.reps);
    if (pb_measure(&r)) {
        fprintf(stderr, "orochi bench: %s\n", r.err);
        return 1;
    }
    /* the roofline: the device's copy bandwidth (read + write), where a part ran on it; and the
     * rate of the tensor cores' instruction, which a wide step's matmul flops are set against */
    double copy = 0, tc = 0;
#ifdef OROCHI_HAVE_CUDA
    if (any_gpu) {
        kcuda *kg = kcuda_new(0, err, sizeof err);
        if (!kg || kcuda_copy_gbps(kg, (size_t)256 << 20, 20, &copy, err, sizeof err)) {
            fprintf(stderr, "orochi bench: %s (no roofline fraction reported)\n", err);
            copy = 0;
        }
        if (kg && kcuda_mma_tflops(kg, 0.3, &tc, err, sizeof err)) {
            fprintf(stderr, "orochi bench: %s (no tensor-core fraction reported)\n", err);
            tc = 0;
        }
        kcuda_destroy(&kg);
    }
#else
    (void)any_gpu;
#endif
    double gb = (double)llama_model_step_bytes(r.m) / 1e9, la = cli_loadavg();
    double tflop = pb_matmul_flops(&r.m->cfg) / 1e12; /* a token's, every matmul of a step */
    FILE *js = cli_open_append(o.json);
    const char *base = strrchr(o.model, '/');
    printf("model %s, %d parts (%s) x %d threads, context %d, load average %.2f\n",
           base ? base + 1 : o.model, o.parts, devs, o.threads, o.ctx, la);
    printf("step time (ms, median of %d), the weight bytes read per step over it (GB/s), and the "
           "first plan's time over each plan's (x)\n%4s",
           o.reps, "W");
    for (int p = 0; p < o.n_plans; p++)
        printf(" | %-22s", o.names[p]);
    printf("\n");
    double first = 0;
    for (int wi = 0; wi < o.n_widths; wi++) {
        printf("%4d", o.widths[wi]);
        for (int p = 0; p < o.n_plans; p++) {
            double med = pb_median(&r, p, wi);
            llama_gpu_how how = r.how[(size_t)p * o.n_widths + wi];
            first = p ? first : med;
            printf(" | %7.3f %6.1f %6.2fx", med, gb / (med / 1e3), first / med);
            if (js)
                fprintf(js,
                        "{\"bench\":\"plans\",\"plan\":\"%s\",\"width\":%d,\"ms\":%.4f,"
                        "\"gbps\":%.3f,\"parts\":%d,\"devices\":\"%s\",\"threads\":%d,"
                        "\"ctx\":%d,\"reps\":%d,\"model\":\"%s\",\"loadavg\":%.2f,"
                        "\"gpu_memory\":\"%s\",\"gpu_graphs\":%s,\"gpu_fuse\":%s,"
                        "\"gpu_ops\":%ld,\"gpu_unroll_ask\":%d,\"gpu_unroll\":%d,"
                        "\"gpu_att_ask\":%d,\"gpu_att_parts\":%d,\"gpu_att_keys\":%d,"
                        "\"gpu_att_tile_ask\":\"%s\",\"gpu_att_tile\":%s,"
                        "\"gpu_matmul_ask\":\"%s\",\"gpu_matmul\":\"%s\","
                        "\"gpu_frag_ask\":\"%s\",\"gpu_frag\":%s,"
                        "\"gpu_groups_ask\":%d,\"gpu_groups\":%d,"
                        "\"gpu_depth_ask\":%d,\"gpu_depth\":%d,\"gpu_early\":%s,"
                        "\"copy_gbps\":%.1f,\"roofline\":%.4f,\"mma_tflops\":%.4g,"
                        "\"tc_share\":%.4f}\n",
                        o.names[p], o.widths[wi], med, gb / (med / 1e3), o.parts, devs,
                        o.threads, o.ctx, o.reps, base ? base + 1 : o.model, la, o.gpu_memory,
                        o.gpu_graphs ? "true" : "false", o.gpu_fuse ? "true" : "false",
                        r.ops[(size_t)p * o.n_widths + wi], o.gpu_unroll, how.unroll,
                        o.gpu_att_parts, how.att_parts, o.gpu_att_keys ? o.gpu_att_keys : 4,
                        pb_tile_word[o.gpu_att_tile], how.att_tiles ? "true" : "false",
                        pb_matmul_word[o.gpu_matmul], how.tensor_cores ? "tensor" : "cuda",
                        pb_tile_word[o.gpu_frag], how.frag ? "true" : "false", o.gpu_groups,
                        how.groups, o.gpu_depth, how.depth, o.gpu_early ? "true" : "false", copy,
                        copy > 0 ? gb / (med / 1e3) / copy : 0.0, tc,
                        tc > 0 ? tflop * o.widths[wi] / (med / 1e3) / tc : 0.0);
        }
        printf("\n");
    }
    if (o.gpu[0]) { /* what the GPU part queued a step: kernels, copies (a graph: one launch) */
        printf("device ops a step of part 0 (GPU, %s, graphs %s, launches %s%s), %s:",
               o.gpu_memory, o.gpu_graphs ? "on" : "off", o.gpu_fuse ? "fused" : "one per op",
               o.gpu_early ? ", the tensor-core matmul early" : "", o.names[0]);
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" W=%d %ld", o.widths[wi], r.ops[wi]);
        printf("\nattention parts a key stream (%s):", o.gpu_att_parts ? "asked" : "by length");
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" W=%d %d", o.widths[wi], r.how[wi].att_parts);
        printf("\nattention by tiles (%s):", pb_tile_word[o.gpu_att_tile]);
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" W=%d %s", o.widths[wi], r.how[wi].att_tiles ? "yes" : "no");
        printf("\nquantized matmul groups in flight (%s):", o.gpu_unroll ? "asked" : "by width");
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" W=%d %d", o.widths[wi], r.how[wi].unroll);
        printf("\nquantized matmul on (%s): %s cores", pb_matmul_word[o.gpu_matmul],
               r.how[0].tensor_cores ? "tensor" : "CUDA");
        printf("\ntensor-core inputs in fragment order (%s):", pb_tile_word[o.gpu_frag]);
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" W=%d %s", o.widths[wi], r.how[wi].frag ? "yes" : "no");
        printf("\ntensor-core token groups (%s):", o.gpu_groups ? "asked" : "auto");
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" W=%d %d", o.widths[wi], r.how[wi].groups);
        printf("\ntensor-core blocks in flight a warp, q/k/v (%s):",
               o.gpu_depth ? "asked" : "by size");
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" W=%d %d", o.widths[wi], r.how[wi].depth);
        printf("\n");
    }
    if (copy > 0) { /* the weights' GB/s over the device's copy GB/s (read + write) */
        printf("device copy bandwidth %.0f GB/s (read + write); the weights read a step over it, "
               "%s:",
               copy, o.names[0]);
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" W=%d %.1f%%", o.widths[wi], 100.0 * gb / (pb_median(&r, 0, wi) / 1e3) / copy);
        printf("\n");
    }
    if (tc > 0) { /* the matmuls' flops a step over the tensor cores' rate */
        printf("tensor cores %.4g TFLOP/s (mma.sync f16, f32 sums); the matmuls' flops a step "
               "over it, %s:",
               tc, o.names[0]);
        for (int wi = 0; wi < o.n_widths; wi++)
            printf(" W=%d %.1f%%", o.widths[wi],
                   100.0 * tflop * o.widths[wi] / (pb_median(&r, 0, wi) / 1e3) / tc);
        printf("\n");
    }
    if (o.prompt)
        pb_prompt_report(&r, js, tflop, tc, la, devs);
    if (js)
        fclose(js);
    fprintf(stderr, "orochi bench: JSON lines appended to %s\n", o.json);
    free(r.ms);
    free(r.pms);
    free(r.ops);
    free(r.how);
    free(r.block);
    llama_model_destroy(&r.m);
    return 0;
}
