/*
 * tests/cuda/test_cuda_forward.c — the GPU worker's forward (model/llama_cuda.h) against the CPU
 * forward on tiny random models of every type the GPU takes. Every run plays the same steps on
 * two sequence slots: a prompt each, committed; a token tree, then two tokens appended to it; a
 * commit and three one-token decode steps (the same shape each time: a recorded graph is
 * replayed); a tree on the second slot; then that slot's rows replaced by the first slot's (a
 * copied prefix of the same length, which a device mirror must notice through the slot's epoch)
 * and a tree on it again. The logits of every step are compared:
 *   - one part on the GPU, in each memory mode (mapped, mirror) with graphs off and on, against
 *     one part on the CPU: relative L2 within 1e-5 (F32, F16, BF16), 3e-3 (the 8- and 4-bit
 *     types, whose CPU kernels round activations to 16 bits), and every row's greedy token the
 *     same unless the reference's logits of the two tokens lie within the tolerance times the
 *     row's largest logit (a near tie, which the tolerance allows to flip); with graphs on, the
 *     decode steps must have been replayed;
 *   - a mixed group of two parts, part 0 on the GPU and part 1 on the CPU (threads meeting at a
 *     barrier, as worker processes meet in the arena), under an uneven plan whose heads have their
 *     dense part on the GPU and their sparse part on the CPU, in both memory modes: the same
 *     tolerances against one CPU part;
 *   - a pair where the GPU attends every head while the CPU projects half the KV heads (the
 *     GPU's attention reads another part's tree and prefix rows), in both memory modes;
 *   - the first pair under the Megatron plan (wo and down by input columns, partial sums reduced
 *     through the block), in both memory modes, against one CPU part;
 *   - one GPU part in each memory mode with one launch per op (llama_gpu_params.unfused) against
 *     the fused launches: the same bits, and exactly the launches fusion saves a layer fewer;
 *   - attention's key streams cut into 3 parts (llama_gpu_params.att_parts): one GPU part (graphs
 *     off, then on) and the mixed pair, against one CPU part, with exactly one launch more per
 *     layer of each forward (the parts' join), these with the tiles off; attention by tiles
 *     (att_tile on) on one GPU part and, cut in 3, on the mixed pair; every other case runs the
 *     defaults (no tiles at these short contexts, 2 groups in flight up to 4 columns);
 *   - with an f16 KV cache, one GPU part and the mixed pair (mirror) against one CPU part with
 *     f16 K/V (relative L2 5e-5 at the least);
 *   - a prefix growing past the tiles' threshold under graphs (test_tiles_by_default): a new
 *     recording at the crossing, the last step against the CPU;
 *   - the other types the CPU computes (test_more_types: Q2_K..Q6_K, Q5_0, Q5_1, IQ4_NL, dim 256):
 *     one GPU part on CUDA cores and on tensor cores, and the mixed pair, within 3e-3; on tensor
 *     cores with the inputs in fragment order from 1 token (matmul_frag, graphs on), and
 *     launched early (matmul_early, graphs on: programmatic dependent launches), the bits of
 *     the tensor cores reading them in place, launched plainly;
 *   - the families' pieces (test_families: qwen2, qwen3 with head size 96, a llama with biases and
 *     Llama 3.1's RoPE factors): one GPU part fused and one launch per op, the mixed pair and the
 *     Megatron pair, within 1e-5.
 * The parts meet after every forward, as the runtime's step boundary keeps them apart. Built twice:
 * against the GPU op set (unit_cuda_forward, on a GPU) and against its CPU stand-in
 * kernels/cuda/kcuda_fake.c (unit_gpu_host, everywhere: what runs around the kernels).
 * The shared block and the logits live in one page-aligned host block that the GPU maps, as the
 * arena is. Without a usable GPU it prints why and exits 77 (ctest: skipped).
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kcuda.h"
#include "model/llama.h"
#include "model/llama_cuda.h"
#include "tests/unit/testutil.h"

#define N_TOK 8
#define CTX 64
#define N_SEQ 2
#define MAXW (N_TOK + 2) /* the tree and the two tokens appended to it */
#define N_OUT 5 /* logits slots: tree, append, decode, tree on slot 1, the same after the copy */
#define N_FORWARDS 9 /* two prompts, the tree, the append, three decodes, the tree on slot 1 twice */
static const int32_t IDS[N_TOK] = {3, 50, 201, 7, 7, 9, 120, 33};
static const int32_t OTHER[N_TOK] = {11, 250, 4, 88, 19, 300, 2, 64};
static const int32_t PARENT[N_TOK] = {-1, 0, 1, 1, 3, -1, 5, 2};
static const int32_t ON_SLOT1[N_TOK] = {1, 1, 1, 1, 1, 1, 1, 1};
static int failures;
/* unit_gpu_host (OROCHI_GPU_HOST): the CPU stand-in computes the CPU part's bits, so where a plan
 * gives one process's bits (no head split into dense and sparse parts, no Megatron sums) the
 * logits must be equal, not merely close */
#ifdef OROCHI_GPU_HOST
#define EXACT(tol) 0.0
#else
#define EXACT(tol) (tol)
#endif

/* This file is built three times (on a GPU, over the emulation, over the stand-in) and ctest runs
 * them side by side: each makes its models under its own names, since a model rewritten while
 * another test maps it kills that test (SIGBUS) */
#if defined(OROCHI_GPU_HOST)
#define FWD_TAG(name) name "-host"
#elif defined(OROCHI_GPU_EMU)
#define FWD_TAG(name) name "-emu"
#else
#define FWD_TAG(name) name
#endif

typedef struct {
    llama_model *m;
    int part, n_parts, gpu;
    kv_type kv;
    llama_gpu_params gp;
    const llama_partition *plan;
    void *block; /* shared block, then N_OUT logits slots */
    size_t block_bytes, shared_bytes;
    pthread_barrier_t *barrier;
    long replayed, launches;
    const llama_partition *plan2; /* the plan both parts switch to after the prompts (or NULL) */
    llama_gpu_memory_used use; /* a GPU part's device memory at the end */
    size_t share;              /* llama_gpu_share_bytes at the start */
    size_t need;               /* llama_gpu_need_bytes at the end */
    int rc;
    char err[512];
} part_arg;

typedef struct {
    llama_ctx *ctx;
    llama_gpu *gpu;
    part_arg *a;
} part_run_ctx;

/* One forward, then the parts meet: a step's LM head reads the residual that the next step's
 * embeddings overwrite, so steps are apart, as the runtime keeps them (the coordinator's step
 * boundary, the free run's barrier). */
static int fwd(part_run_ctx *r, const llama_batch *b, int slot)
{
    part_arg *a = r->a;
    float *logits = slot < 0 ? NULL
                             : (float *)((char *)a->block + a->shared_bytes) +
                                   (size_t)slot * N_TOK * a->m->cfg.vocab;
    int rc = r->gpu ? llama_gpu_forward(r->gpu, b, logits, a->err, sizeof a->err)
                    : llama_forward(r->ctx, b, logits, a->err, sizeof a->err);
    if (a->n_parts > 1)
        pthread_barrier_wait(a->barrier);
    return rc;
}

/* The steps of the header comment; the commits and the copy move this part's K/V rows on the
 * host, through the mapping. */
static int part_steps(part_run_ctx *r)
{
    part_arg *a = r->a;
    llama_ctx *ctx = r->ctx;
    int32_t path[] = {0, 1, 2}, one = 0, tok = IDS[1], app_parent[] = {7, -1};
    llama_batch pre = {.n = 3, .tokens = IDS};
    llama_batch pre1 = {.n = 3, .tokens = OTHER, .seq = ON_SLOT1};
    llama_batch tree = {.n = N_TOK, .tokens = IDS, .parent = PARENT};
    llama_batch app = {.n = 2, .tokens = OTHER, .parent = app_parent, .append = true};
    llama_batch dec = {.n = 1, .tokens = &tok};
    llama_batch tree1 = {.n = N_TOK, .tokens = OTHER, .parent = PARENT, .seq = ON_SLOT1};
    if (fwd(r, &pre, -1) || llama_commit(ctx, path, 3, a->err, sizeof a->err) ||
        fwd(r, &pre1, -1) || llama_commit(ctx, path, 3, a->err, sizeof a->err) ||
        (a->plan2 && llama_ctx_set_partition(ctx, a->plan2, a->err, sizeof a->err)) ||
        fwd(r, &tree, 0) || fwd(r, &app, 1) || llama_commit(ctx, &one, 1, a->err, sizeof a->err))
        return -1;
    for (int k = 0; k < 3; k++)
        if (fwd(r, &dec, 2) || llama_commit(ctx, &one, 1, a->err, sizeof a->err))
            return -1;
    if (fwd(r, &tree1, 3) || llama_kv_copy_prefix(ctx, 0, 1, 3, a->err, sizeof a->err))
        return -1;
    /* every part has moved its rows before any reads them (the coordinator's copy comes before
     * the step it sends) */
    if (a->n_parts > 1)
        pthread_barrier_wait(a->barrier);
    return fwd(r, &tree1, 4);
}

static void *part_run(void *argp)
{
    part_arg *a = argp;
    llama_ctx_params p = {.n_threads = 1, .max_width = MAXW, .n_ctx = CTX, .n_seq = N_SEQ,
                          .kv = a->kv, .part = a->part, .n_parts = a->n_parts, .plan = a->plan,
                          .shared = a->block, .sync = tu_barrier_sync, .sync_arg = a->barrier};
    part_run_ctx r = {.ctx = llama_ctx_new(a->m, &p, a->err, sizeof a->err), .a = a};
    a->rc = -1;
    if (!r.ctx)
        return NULL;
    if (a->gpu && !(r.gpu = llama_gpu_new(r.ctx, &a->gp, a->block, a->block_bytes, a->err,
                                          sizeof a->err)))
        goto out;
    if (r.gpu)
        a->share = llama_gpu_share_bytes(r.ctx);
    a->rc = part_steps(&r);
    if (r.gpu) {
        long recorded;
        llama_gpu_graph_counts(r.gpu, &a->replayed, &recorded);
        a->launches = llama_gpu_launches(r.gpu);
        a->use = llama_gpu_memory_use(r.gpu);
        a->need = llama_gpu_need_bytes(r.gpu);
    }
out:
    llama_gpu_destroy(&r.gpu);
    llama_ctx_destroy(&r.ctx);
    return NULL;
}

/* Tiles by default once the prefix is long (kcuda_att_tiled): a sole GPU part with graphs on runs
 * two 16-token chains over a 992-token prefix (the longest stream 1008 keys: the plain kernel),
 * then two over 1008 (1024 keys; 16 tokens x 2 query heads a KV head x 1024 reach
 * KCUDA_ATT_TILE_MIN_WORK: tiles). Each pair's second step must replay its first's recording and
 * the crossing must record anew (counted after the prefill's own recording) (whether a step runs by tiles is part of a recording's key:
 * without it the plain kernel's graph would be replayed on); the last step's logits against the
 * CPU forward with the same history. Not over the emulation: a thousand keys there take minutes
 * (the stand-in and a GPU run it). */
#define TK_W 16
static void test_tiles_by_default(void)
{
#ifdef OROCHI_GPU_EMU
    printf("tiles by default: SKIPPED over the emulation (a 1024-key prefix takes it minutes); the "
           "stand-in (unit_gpu_host) and a GPU run it\n");
#else
    char err[512];
    const int ctx_len = 1100, pre = 992;
    llama_model *m = llama_model_load(
        tu_make_model(FWD_TAG("cudatile"), "f32", "--layers 2 --dim 128 --ffn 256 --heads 4 --kv-heads 2 "
                                         "--vocab 301 --ctx 1100"),
        err, sizeof err);
    if (!m) {
        printf("%s FAILED\n", err);
        failures++;
        return;
    }
    int V = m->cfg.vocab;
    int32_t *ids = malloc((size_t)(pre + 2 * TK_W) * sizeof *ids), path[TK_W];
    for (int i = 0; i < pre + 2 * TK_W; i++)
        ids[i] = (int32_t)((i * 37 + 11) % V);
    for (int i = 0; i < TK_W; i++)
        path[i] = i;
    size_t shared = llama_shared_layout(&m->cfg, ctx_len, TK_W, 1, KV_F32, NULL);
    size_t lbytes = (size_t)TK_W * V * 4, bytes = (shared + lbytes + 4095) & ~(size_t)4095;
    float *cpu_logits = malloc(lbytes), *gpu_logits = NULL;
    bool tiled[4] = {false};
    long counts[4][2] = {{0}};
    for (int side = 0; side < 2; side++) { /* 0: the CPU, 1: the GPU part */
        void *block = aligned_alloc(4096, bytes);
        memset(block, 0, bytes);
        pthread_barrier_t barrier;
        pthread_barrier_init(&barrier, NULL, 1);
        llama_ctx_params p = {.n_threads = 1, .max_width = TK_W, .n_ctx = ctx_len, .n_seq = 1,
                              .kv = KV_F32, .part = 0, .n_parts = 1, .shared = block,
                              .sync = tu_barrier_sync, .sync_arg = &barrier};
        llama_ctx *x = llama_ctx_new(m, &p, err, sizeof err);
        llama_gpu_params gp = {.memory = LLAMA_GPU_MIRROR, .graphs = true};
        llama_gpu *gpu = x && side ? llama_gpu_new(x, &gp, block, bytes, err, sizeof err) : NULL;
        float *logits = (float *)((char *)block + shared);
        int rc = !x || (side && !gpu);
#define TK_FWD(b, lg) (gpu ? llama_gpu_forward(gpu, b, lg, err, sizeof err) \
                           : llama_forward(x, b, lg, err, sizeof err))
        for (int at = 0; !rc && at < pre; at += TK_W) {
            llama_batch b = {.n = TK_W, .tokens = ids + at, .logits_from = TK_W};
            rc = TK_FWD(&b, NULL) || llama_commit(x, path, TK_W, err, sizeof err);
        }
        long base[2] = {0, 0}; /* the prefill's own recording and replays */
        if (!rc && gpu)
            llama_gpu_graph_counts(gpu, &base[0], &base[1]);
        for (int k = 0; !rc && k < 4; k++) {
            if (k == 2) /* the first chain committed: the prefix now 1008 tokens */
                rc = llama_commit(x, path, TK_W, err, sizeof err);
            llama_batch b = {.n = TK_W, .tokens = ids + pre + (k >= 2) * TK_W};
            rc = rc || TK_FWD(&b, logits);
            if (!rc && gpu) {
                tiled[k] = llama_gpu_last_step(gpu).att_tiles;
                llama_gpu_graph_counts(gpu, &counts[k][0], &counts[k][1]);
                counts[k][0] -= base[0];
                counts[k][1] -= base[1];
            }
        }
#undef TK_FWD
        if (rc) {
            printf("tiles by default (%s): %s FAILED\n", side ? "GPU" : "CPU", err);
            failures++;
        } else if (side) {
            gpu_logits = malloc(lbytes);
            memcpy(gpu_logits, logits, lbytes);
        } else {
            memcpy(cpu_logits, logits, lbytes);
        }
        llama_gpu_destroy(&gpu);
        llama_ctx_destroy(&x);
        pthread_barrier_destroy(&barrier);
        free(block);
    }
    if (gpu_logits) {
        static const char *const step[] = {"1008 keys, recorded", "1008 keys, replayed",
                                           "1024 keys, recorded anew", "1024 keys, replayed"};
        static const long want[4][2] = {{0, 1}, {1, 1}, {1, 2}, {2, 2}}; /* replayed, recorded */
        for (int k = 0; k < 4; k++) {
            bool ok = tiled[k] == (k >= 2) && counts[k][0] == want[k][0] &&
                      counts[k][1] == want[k][1];
            printf("  tiles by default, %s: %s, %ld replayed, %ld recorded %s\n", step[k],
                   tiled[k] ? "tiles" : "plain", counts[k][0], counts[k][1], ok ? "ok" : "FAILED");
            failures += !ok;
        }
        double e = tu_rel_l2(gpu_logits, cpu_logits, (size_t)TK_W * V);
        bool ok = e <= EXACT(1e-4);
        printf("  tiles by default: the last step against the CPU, relative L2 %.2g (tolerance "
               "%g) %s\n", e, EXACT(1e-4), ok ? "ok" : "FAILED");
        failures += !ok;
    }
    free(gpu_logits);
    free(cpu_logits);
    free(ids);
    llama_model_destroy(&m);
#endif
}

/* The device ops part 0 queued in the last run (llama_gpu_launches); the first GPU part's device
 * memory at the end (weights, the K/V cache's device copy, in all), the share of the weights it
 * needed at the start, the windows and K/V copies made again, and its refusal if it failed. run_plan2: the plan the next runs switch to
 * after their prompts. */
static long run_launches, run_rewindowed;
static size_t run_weights, run_total, run_share, run_kv, run_need;
static char run_err[512];
static const llama_partition *run_plan2;

/* Run the parts (gpu_mask: which run on the GPU, with gp); the logits slots are copied to out.
 * *replayed (may be NULL): the graph replays of part 0. */
static int run(llama_model *m, kv_type kv, int n_parts, unsigned gpu_mask,
               const llama_gpu_params *gp, const llama_partition *plan, float *out, long *replayed)
{
    size_t shared = llama_shared_layout(&m->cfg, CTX, MAXW, N_SEQ, kv, NULL);
    size_t lbytes = (size_t)N_OUT * N_TOK * m->cfg.vocab * 4;
    size_t bytes = (shared + lbytes + 4095) & ~(size_t)4095;
    void *block = aligned_alloc(4096, bytes);
    memset(block, 0, bytes);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)n_parts);
    part_arg args[2];
    pthread_t th[2];
    for (int i = 0; i < n_parts; i++) {
        args[i] = (part_arg){.m = m, .part = i, .n_parts = n_parts, .gpu = (gpu_mask >> i) & 1,
                             .kv = kv, .plan = plan, .block = block, .block_bytes = bytes,
                             .shared_bytes = shared, .barrier = &barrier, .plan2 = run_plan2};
        if (gp)
            args[i].gp = *gp;
        pthread_create(&th[i], NULL, part_run, &args[i]);
    }
    int rc = 0;
    for (int i = 0; i < n_parts; i++) {
        pthread_join(th[i], NULL);
        if (args[i].rc) {
            printf("  part %d of %d (%s): %s\n", i, n_parts, args[i].gpu ? "GPU" : "CPU",
                   args[i].err);
            rc = -1;
        }
    }
    if (replayed)
        *replayed = args[0].replayed;
    run_launches = args[0].launches;
    const part_arg *gpu = &args[gpu_mask & 1 ? 0 : 1]; /* the first GPU part */
    run_weights = gpu->use.weights;
    run_total = gpu->use.total;
    run_kv = gpu->use.kv;
    run_need = gpu->need;
    run_share = gpu->share;
    run_rewindowed = gpu->use.rewindowed;
    snprintf(run_err, sizeof run_err, "%.500s", rc ? gpu->err : "");
    memcpy(out, (char *)block + shared, lbytes);
    pthread_barrier_destroy(&barrier);
    free(block);
    return rc;
}

static const char *const slot_names[N_OUT] = {"tree", "append", "decode", "tree on slot 1",
                                              "after the copied prefix"};

/* Row r's greedy tokens agree, or differ on a near tie: the reference's logits of the two tokens
 * are within tol times the row's largest magnitude (the error the tolerance allows one logit). */
static bool same_greedy(const float *got, const float *ref, int vocab, double tol, int *ties)
{
    int a = k_argmax(got, vocab), b = k_argmax(ref, vocab);
    if (a == b)
        return true;
    double big = 0;
    for (int i = 0; i < vocab; i++)
        big = fabs(ref[i]) > big ? fabs(ref[i]) : big;
    if ((double)ref[b] - ref[a] > tol * big)
        return false;
    (*ties)++;
    return true;
}

/* Every slot's logits within tol, every row's greedy token the same but for near ties. */
static void compare(const char *what, const float *got, const float *ref, int vocab, double tol)
{
    bool ok = true;
    double worst = 0;
    int ties = 0;
    for (int s = 0; s < N_OUT; s++) {
        size_t off = (size_t)s * N_TOK * vocab;
        double e = tu_rel_l2(got + off, ref + off, (size_t)N_TOK * vocab);
        int same = 0;
        for (int r = 0; r < N_TOK; r++)
            same += same_greedy(got + off + (size_t)r * vocab, ref + off + (size_t)r * vocab,
                                vocab, tol, &ties);
        if (e > tol || same != N_TOK) {
            printf("    %s: relative L2 %.3g, greedy tokens %d/%d\n", slot_names[s], e, same,
                   N_TOK);
            ok = false;
        }
        worst = e > worst ? e : worst;
    }
    if (ties)
        printf("    %d greedy token(s) differ on a near tie\n", ties);
    printf("  %-52s worst relative L2 %.3g (tolerance %.3g) %s\n", what, worst, tol,
           ok ? "ok" : "FAILED");
    failures += !ok;
}

/* A tiny model (tu_make_model's arguments) loaded, or NULL with the reason printed. */
static llama_model *fwd_model(const char *tag, const char *type, const char *opts)
{
    char err[256];
    llama_model *m = llama_model_load(tu_make_model(tag, type, opts), err, sizeof err);
    if (!m)
        printf("%s\n", err);
    return m;
}

/* The uneven plan of the mixed pair: part 0 (the GPU) 0.7 of every kind, part 1 0.3. */
static void plan_07(llama_partition *plan)
{
    llama_partition_even(plan, 2);
    for (int k = 0; k < LP_N; k++) {
        plan->frac[k][0] = 0.7f;
        plan->frac[k][1] = 0.3f;
    }
}

/* The other types the CPU computes (the K-quants on a shape of whole 256-column super-blocks, Q5_0,
 * Q5_1, IQ4_NL): one GPU part (mirror, graphs on) on CUDA cores and on tensor cores
 * (llama_gpu_params.matmul_kind; f16 products, so within the tolerance, not the CPU's bits), and
 * the mixed pair, against one CPU part. */
static void test_more_types(void)
{
    static const char *types[] = {"q4_k", "q6_k", "q5_k", "q3_k", "q2_k", "q5_0", "q5_1", "iq4_nl"};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        llama_model *m = fwd_model(FWD_TAG("cudak"), types[t],
                                   "--layers 2 --dim 256 --ffn 512 --heads 4 --kv-heads 2 "
                                   "--vocab 301 --ctx 64");
        if (!m) {
            failures++;
            continue;
        }
        size_t n = (size_t)N_OUT * N_TOK * m->cfg.vocab;
        float *ref = calloc(n, 4), *got = calloc(n, 4);
        printf("%s:\n", types[t]);
        if (run(m, KV_F32, 1, 0, NULL, NULL, ref, NULL)) {
            failures++;
            continue;
        }
        llama_partition plan;
        plan_07(&plan);
        static const char *cases[5] = {"one part on the GPU, CUDA cores",
                                       "one part on the GPU, tensor cores",
                                       "GPU 0.7 (mirror) + CPU 0.3",
                                       "tensor cores, inputs in fragment order",
                                       "tensor cores launched early"};
        float *tc = calloc(n, 4);
        for (int k = 0; k < 5; k++) {
            llama_gpu_params gp = {.memory = LLAMA_GPU_MIRROR, .graphs = k != 2,
                                   .matmul_kind = k == 0   ? KCUDA_MM_SIMT
                                                  : k == 2 ? KCUDA_MM_AUTO
                                                           : KCUDA_MM_TC,
                                   .matmul_frag = k == 3 ? KCUDA_FRAG_ON : KCUDA_FRAG_AUTO,
                                   .matmul_early = k == 4};
            if (run(m, KV_F32, k == 2 ? 2 : 1, 1, &gp, k == 2 ? &plan : NULL, got, NULL)) {
                failures++;
                continue;
            }
            /* tensor cores: f16 weights and activations, not the CPU's bits anywhere */
            compare(cases[k], got, ref, m->cfg.vocab, k == 0 ? EXACT(3e-3) : 3e-3);
            if (k == 1)
                memcpy(tc, got, n * 4);
            if (k >= 3) { /* the same f16 values in the same sums: the bits of case 1 */
                bool same = !memcmp(tc, got, n * 4);
                printf("  %-52s %s\n",
                       k == 3 ? "... the bits of the inputs read in place"
                              : "... the bits of the matmul launched after the kernel ahead",
                       same ? "ok" : "FAILED");
                failures += !same;
            }
        }
        free(tc);
        free(ref);
        free(got);
        llama_model_destroy(&m);
    }
}

/* The families' pieces (docs/models.md) on the GPU: qwen2 (q/k/v biases, NEOX RoPE), qwen3 (per-head
 * q/k norms, NEOX RoPE, a head size of 96 over dim 256), a llama with q/k/v and output biases and
 * Llama 3.1's RoPE factors: one GPU part (mirror, graphs on; and with one launch per op, which
 * still applies them in the RoPE-and-store launch), the mixed pair and the Megatron pair, against
 * one CPU part (F32: 1e-5; the stand-in's bits). */
static void test_families(void)
{
    static const char *const archs[][2] = {
        {"qwen2", "--arch qwen2"},
        {"qwen3", "--arch qwen3 --head-dim 96"},
        {"llama-bias", "--arch llama31 --bias"},
    };
    for (size_t a = 0; a < sizeof archs / sizeof archs[0]; a++) {
        char opts[256];
        snprintf(opts, sizeof opts,
                 "--layers 2 --dim 256 --ffn 512 --heads 4 --kv-heads 2 --vocab 301 --ctx 64 %s",
                 archs[a][1]);
        char tag[64];
        snprintf(tag, sizeof tag, "%s%s", FWD_TAG("cudafam-"), archs[a][0]);
        llama_model *m = fwd_model(tag, "f32", opts);
        if (!m) {
            failures++;
            continue;
        }
        size_t n = (size_t)N_OUT * N_TOK * m->cfg.vocab;
        float *ref = calloc(n, 4), *got = calloc(n, 4);
        printf("%s:\n", archs[a][0]);
        if (run(m, KV_F32, 1, 0, NULL, NULL, ref, NULL)) {
            failures++;
            continue;
        }
        llama_partition plan, meg;
        plan_07(&plan);
        meg = plan;
        meg.style = LP_STYLE_MEGATRON;
        static const char *cases[4] = {"one part on the GPU, mirror, graphs",
                                       "one part on the GPU, one launch per op",
                                       "GPU 0.7 (mirror) + CPU 0.3",
                                       "Megatron: GPU 0.7 + CPU 0.3"};
        for (int k = 0; k < 4; k++) {
            llama_gpu_params gp = {.memory = LLAMA_GPU_MIRROR, .graphs = k == 0, .unfused = k == 1};
            const llama_partition *p = k == 2 ? &plan : k == 3 ? &meg : NULL;
            if (run(m, KV_F32, p ? 2 : 1, 1, &gp, p, got, NULL))
                failures++;
            else
                compare(cases[k], got, ref, m->cfg.vocab, k < 2 ? EXACT(1e-5) : 1e-5);
        }
        free(ref);
        free(got);
        llama_model_destroy(&m);
    }
}

/* One copy of the weights (llama_gpu_params.weights, memory_limit): a GPU part beside a CPU part
 * holds only its share of the rows (what llama_gpu_share_bytes says, well under the whole), and
 * its logits agree; a new partition that needs more rows uploads them (the windows grow) and the
 * logits still agree; mapped weights read the model file in place (no weight bytes on the
 * device) with the same bits; a mirror's K/V copy holds only the part's KV heads, and grows when
 * a partition needs more; a memory limit under the whole model refuses the GPU alone with the
 * bytes it needs, and takes the pair whose GPU share fits. */
static void test_one_copy(void)
{
    llama_model *m = fwd_model(FWD_TAG("cuda-onecopy"), "q4_0",
                               "--layers 2 --dim 128 --ffn 256 --heads 4 --kv-heads 2 "
                               "--vocab 301 --ctx 64");
    if (!m) {
        failures++;
        return;
    }
    size_t n = (size_t)N_OUT * N_TOK * m->cfg.vocab;
    float *ref = calloc(n, 4), *got = calloc(n, 4);
    printf("one copy of the weights (q4_0):\n");
    if (run(m, KV_F32, 1, 0, NULL, NULL, ref, NULL)) {
        failures++;
        goto out;
    }
    llama_gpu_params dev = {.memory = LLAMA_GPU_MAPPED, .weights = LLAMA_GPU_WEIGHTS_DEVICE};
    if (run(m, KV_F32, 1, 1, &dev, NULL, got, NULL)) {
        failures++;
        goto out;
    }
    compare("the GPU alone, device weights", got, ref, m->cfg.vocab, EXACT(3e-3));
    size_t whole = run_weights, whole_total = run_total;
    bool ok = whole == run_share && whole > 0;
    printf("    device memory %zu bytes, of which weights %zu (the whole model: %zu) %s\n",
           whole_total, whole, run_share, ok ? "ok" : "FAILED");
    failures += !ok;

    llama_partition p3, p7;
    plan_07(&p7);
    plan_07(&p3);
    for (int k = 0; k < LP_N; k++) {
        p3.frac[k][0] = 0.3f;
        p3.frac[k][1] = 0.7f;
    }
    if (run(m, KV_F32, 2, 1, &dev, &p3, got, NULL)) {
        failures++;
        goto out;
    }
    compare("GPU 0.3 + CPU 0.7, device weights", got, ref, m->cfg.vocab, EXACT(3e-3));
    size_t w3 = run_weights;
    ok = w3 == run_share && w3 < whole / 2 && run_rewindowed == 0 && run_need == run_total;
    printf("    weights on the device %zu bytes, its share %zu, the whole %zu (want the share, "
           "under half); in all %zu, llama_gpu_need_bytes %zu (want the same) %s\n",
           w3, run_share, whole, run_total, run_need, ok ? "ok" : "FAILED");
    failures += !ok;

    run_plan2 = &p7; /* 0.3 for the prompts, then 0.7: the windows grow */
    int rc = run(m, KV_F32, 2, 1, &dev, &p3, got, NULL);
    run_plan2 = NULL;
    if (rc) {
        failures++;
        goto out;
    }
    compare("GPU 0.3 then 0.7 + CPU, device weights", got, ref, m->cfg.vocab, EXACT(3e-3));
    ok = run_rewindowed > 0 && run_weights > w3 && run_weights < whole;
    printf("    windows uploaded again %ld, weights %zu bytes after (0.3: %zu, whole %zu) %s\n",
           run_rewindowed, run_weights, w3, whole, ok ? "ok" : "FAILED");
    failures += !ok;

    llama_gpu_params mapped = {.memory = LLAMA_GPU_MAPPED, .weights = LLAMA_GPU_WEIGHTS_MAPPED};
    for (int parts = 1; parts <= 2; parts++) {
        int rc_m = run(m, KV_F32, parts, 1, &mapped, parts == 2 ? &p3 : NULL, got, NULL);
        if (rc_m && strstr(run_err, "cudaHostRegister (read-only)")) {
            /* a device without read-only registration of pageable memory refuses mapped
             * weights by name (auto then keeps them on the device) */
            printf("  mapped weights: SKIPPED: this device refuses them (%s)\n", run_err);
            break;
        }
        if (rc_m) {
            failures++;
            continue;
        }
        compare(parts == 1 ? "the GPU alone, weights mapped in place"
                           : "GPU 0.3 + CPU 0.7, weights mapped in place",
                got, ref, m->cfg.vocab, EXACT(3e-3));
        ok = run_weights == 0 && run_total < whole_total - whole / 2;
        printf("    weights on the device %zu bytes, in all %zu %s\n", run_weights, run_total,
               ok ? "ok" : "FAILED");
        failures += !ok;
    }

    /* mirror mode: the K/V cache's device copy holds the KV heads the GPU part stores or reads.
     * The GPU as part 1 of an even pair takes KV head 1 (of 2): half the copy, its address one
     * head's region before it; then a plan that gives it all attention needs head 0 too: the copy
     * is made again for both and the rows of every slot copied again */
    llama_gpu_params mir = {.memory = LLAMA_GPU_MIRROR, .weights = LLAMA_GPU_WEIGHTS_DEVICE};
    if (run(m, KV_F32, 1, 1, &mir, NULL, got, NULL)) {
        failures++;
        goto out;
    }
    size_t kv_all = run_kv;
    llama_partition half, att;
    llama_partition_even(&half, 2);
    att = half;
    att.frac[LP_ATT_DENSE][0] = att.frac[LP_ATT_SPARSE][0] = 0;
    if (run(m, KV_F32, 2, 2, &mir, &half, got, NULL)) {
        failures++;
        goto out;
    }
    compare("CPU 0.5 + GPU 0.5 (part 1, mirror of head 1)", got, ref, m->cfg.vocab, EXACT(3e-3));
    ok = kv_all > 0 && run_kv * 2 == kv_all && run_need == run_total;
    printf("    the K/V cache's device copy %zu bytes, the GPU alone's %zu (want half); in all %zu, "
           "llama_gpu_need_bytes %zu %s\n",
           run_kv, kv_all, run_total, run_need, ok ? "ok" : "FAILED");
    failures += !ok;
    run_plan2 = &att;
    rc = run(m, KV_F32, 2, 2, &mir, &half, got, NULL);
    run_plan2 = NULL;
    if (rc) {
        failures++;
        goto out;
    }
    compare("... then all attention on the GPU (both heads)", got, ref, m->cfg.vocab, EXACT(3e-3));
    ok = run_kv == kv_all && run_rewindowed > 0;
    printf("    the copy %zu bytes after (want %zu), made again %ld %s\n", run_kv, kv_all,
           run_rewindowed, ok ? "ok" : "FAILED");
    failures += !ok;

    /* a limit under the whole model: the GPU alone is refused, naming what it needs */
    llama_gpu_params lim = dev;
    lim.memory_limit = whole_total - whole / 2;
    printf("  (a refusal is expected next)\n");
    rc = run(m, KV_F32, 1, 1, &lim, NULL, got, NULL);
    ok = rc && strstr(run_err, "over --gpu-memory-limit") && strstr(run_err, "its share");
    printf("  %-52s %s\n", "the GPU alone over --gpu-memory-limit: refused",
           ok ? "ok" : "FAILED");
    failures += !ok;
    if (run(m, KV_F32, 2, 1, &lim, &p3, got, NULL)) {
        failures++;
        goto out;
    }
    compare("GPU 0.3 + CPU 0.7 within --gpu-memory-limit", got, ref, m->cfg.vocab, EXACT(3e-3));
    ok = run_total <= lim.memory_limit;
    printf("    device memory %zu bytes, the limit %zu %s\n", run_total, lim.memory_limit,
           ok ? "ok" : "FAILED");
    failures += !ok;
out:
    free(ref);
    free(got);
    llama_model_destroy(&m);
}

int main(void)
{
    char why[256];
    if (kcuda_devices(why, sizeof why) < 1) {
        printf("unit_cuda_forward: SKIPPED: %s; the GPU forward is compiled but not run here\n",
               why);
        return 77;
    }
    char dev[160];
    kcuda *probe = kcuda_new(0, dev, sizeof dev);
    if (probe) {
        kcuda_describe(probe, dev, sizeof dev);
        kcuda_destroy(&probe);
    }
    printf("device: %s\n", dev);
    static const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"};
    static const double tol[] = {1e-5, 1e-5, 1e-5, 3e-3, 3e-3, 3e-3};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        llama_model *m = fwd_model(FWD_TAG("cuda"), types[t],
                                   "--layers 2 --dim 128 --ffn 256 --heads 4 --kv-heads 2 "
                                   "--vocab 301 --ctx 64");
        if (!m)
            return 1;
        size_t n = (size_t)N_OUT * N_TOK * m->cfg.vocab;
        float *ref = calloc(n, 4), *got = calloc(n, 4), *ref2 = calloc(n, 4);
        printf("%s:\n", types[t]);
        if (run(m, KV_F32, 1, 0, NULL, NULL, ref, NULL))
            return 1;
        char what[96];
        for (int mode = LLAMA_GPU_MAPPED; mode <= LLAMA_GPU_MIRROR; mode++)
            for (int graphs = 0; graphs < 2; graphs++) {
                llama_gpu_params gp = {.memory = (llama_gpu_memory)mode, .graphs = graphs};
                long replayed = 0;
                snprintf(what, sizeof what, "one part on the GPU, %s, graphs %s",
                         llama_gpu_memory_name(gp.memory), graphs ? "on" : "off");
                if (run(m, KV_F32, 1, 1, &gp, NULL, got, &replayed)) {
                    failures++;
                    continue;
                }
                compare(what, got, ref, m->cfg.vocab, EXACT(tol[t]));
                /* the three decode steps share one shape: the last two at least are replays */
                if (graphs && replayed < 2) {
                    printf("    graphs on but %ld steps replayed (want >= 2) FAILED\n", replayed);
                    failures++;
                }
            }
        /* one launch per op against the fused launches: the same bits, and per layer of each
         * forward 9 launches fewer (mapped: q/k/v 3 -> 1, RoPE and 2 stores -> 1, wo + add -> 1,
         * gate + up + silu -> 1, down + add -> 1) or 11 (mirror: 2 more stores) */
        for (int mode = LLAMA_GPU_MAPPED; mode <= LLAMA_GPU_MIRROR; mode++) {
            llama_gpu_params fu = {.memory = (llama_gpu_memory)mode}, un = fu;
            un.unfused = true;
            if (run(m, KV_F32, 1, 1, &un, NULL, ref2, NULL)) {
                failures++;
                continue;
            }
            long lu = run_launches;
            if (run(m, KV_F32, 1, 1, &fu, NULL, got, NULL)) {
                failures++;
                continue;
            }
            long lf = run_launches, want = (mode == LLAMA_GPU_MIRROR ? 11 : 9) *
                                           (long)m->cfg.n_layers * N_FORWARDS;
            bool same = !memcmp(got, ref2, n * 4);
            printf("  %-52s %s; launches %ld fused, %ld one per op (want %ld fewer) %s\n",
                   mode == LLAMA_GPU_MIRROR ? "fused launches (mirror)" : "fused launches (mapped)",
                   same ? "same bits" : "DIFFERENT BITS", lf, lu, want,
                   same && lu - lf == want ? "ok" : "FAILED");
            failures += !same || lu - lf != want;
        }
        llama_partition plan;
        plan_07(&plan);
        plan.frac[LP_ATT_DENSE][0] = 1, plan.frac[LP_ATT_DENSE][1] = 0;
        plan.frac[LP_ATT_SPARSE][0] = 0, plan.frac[LP_ATT_SPARSE][1] = 1;
        /* all attention on the GPU while the CPU projects half the KV heads (the GPU reads
         * another part's tree and prefix rows), and the Megatron baseline: wo and down by input
         * columns, partial sums reduced */
        llama_partition all = plan, meg = plan;
        for (int k = 0; k < LP_N; k++)
            all.frac[k][0] = all.frac[k][1] = 0.5f;
        all.frac[LP_ATT_DENSE][0] = all.frac[LP_ATT_SPARSE][0] = 1;
        all.frac[LP_ATT_DENSE][1] = all.frac[LP_ATT_SPARSE][1] = 0;
        meg.style = LP_STYLE_MEGATRON;
        const llama_partition *plans[3] = {&plan, &all, &meg};
        static const char *names[3] = {"GPU 0.7 + CPU 0.3, dense GPU, sparse CPU",
                                       "GPU 0.5 + CPU 0.5, all attention on the GPU",
                                       "Megatron: GPU 0.7 + CPU 0.3"};
        for (int k = 0; k < 6; k++) {
            llama_gpu_params gp = {.memory = k % 2 ? LLAMA_GPU_MIRROR : LLAMA_GPU_MAPPED,
                                   .graphs = true};
            snprintf(what, sizeof what, "%s (%s)", names[k / 2], llama_gpu_memory_name(gp.memory));
            if (run(m, KV_F32, 2, 1, &gp, plans[k / 2], got, NULL))
                failures++;
            else
                compare(what, got, ref, m->cfg.vocab, k / 2 == 1 ? EXACT(tol[t]) : tol[t]);
        }
        /* attention's key streams cut into 3 parts (llama_gpu_params.att_parts): one GPU part,
         * graphs off and on, and the mixed pair whose dense parts the GPU cuts, against one CPU
         * part; each attention launch of a forward has its join, one launch more per layer */
        for (int k = 0; k < 5; k++) {
            llama_gpu_params whole = {.memory = LLAMA_GPU_MIRROR, .graphs = k == 1, .att_parts = 1,
                                      .att_tile = KCUDA_TILE_OFF};
            llama_gpu_params cut = whole;
            cut.att_parts = k == 3 ? 1 : 3;
            cut.att_tile = k >= 3 ? KCUDA_TILE_ON : KCUDA_TILE_OFF;
            long replayed = 0, lw = 0;
            if (k == 0) {
                if (run(m, KV_F32, 1, 1, &whole, NULL, ref2, NULL)) {
                    failures++;
                    continue;
                }
                lw = run_launches;
            }
            static const char *const cases[5] = {
                "cut in 3: one part on the GPU, mirror", "cut in 3: one part on the GPU, graphs",
                "cut in 3: GPU 0.7 (mirror) + CPU 0.3", "by tiles: one part on the GPU, mirror",
                "by tiles, cut in 3: GPU 0.7 + CPU 0.3"};
            snprintf(what, sizeof what, "attention %s", cases[k]);
            bool pair = k == 2 || k == 4;
            if (run(m, KV_F32, pair ? 2 : 1, 1, &cut, pair ? &plan : NULL, got, &replayed)) {
                failures++;
                continue;
            }
            compare(what, got, ref, m->cfg.vocab, pair ? tol[t] : EXACT(tol[t]));
            long want = (long)m->cfg.n_layers * N_FORWARDS;
            if (k == 0 && run_launches - lw != want) {
                printf("    launches %ld cut, %ld whole (want %ld more) FAILED\n", run_launches, lw,
                       want);
                failures++;
            }
            if (k == 1 && replayed < 2) {
                printf("    graphs on but %ld steps replayed (want >= 2) FAILED\n", replayed);
                failures++;
            }
        }
        /* f16 K/V: the GPU rounds the rows it stores as the CPU does, and reads them back */
        if (run(m, KV_F16, 1, 0, NULL, NULL, ref, NULL))
            return 1;
        for (int parts = 1; parts <= 2; parts++) {
            llama_gpu_params gp = {.memory = LLAMA_GPU_MIRROR, .graphs = true};
            snprintf(what, sizeof what, "f16 K/V: %s", parts == 1 ? "one part on the GPU, mirror"
                                                                  : "GPU 0.7 (mirror) + CPU 0.3");
            /* f16 rows summed in another order than the CPU's: 5e-5 at the least */
            if (run(m, KV_F16, parts, 1, &gp, parts == 1 ? NULL : &plan, got, NULL))
                failures++;
            else
                compare(what, got, ref, m->cfg.vocab, tol[t] > 5e-5 ? tol[t] : 5e-5);
        }
        free(ref);
        free(got);
        free(ref2);
        llama_model_destroy(&m);
    }
    test_tiles_by_default();
    test_one_copy();
    test_more_types();
    test_families();
    printf("unit_cuda_forward: %s\n", failures ? "FAILED" : "all agree");
    return failures ? 1 : 0;
}
