/*
 * tests/cuda/test_cuda_forward.c — the GPU worker's forward (model/llama_cuda.h) against the CPU
 * forward on tiny random models of every type the GPU takes:
 *   - one part on the GPU against one part on the CPU: a committed prefix, then a token tree; the
 *     logits within a relative L2 of 1e-5 (F32), 3e-3 (the 8- and 4-bit types, whose CPU kernels
 *     round activations to 16 bits; F16), 1.5e-2 (BF16), and every row's greedy token the same;
 *   - a mixed group of two parts, part 0 on the GPU and part 1 on the CPU (threads meeting at a
 *     barrier, as worker processes meet in the arena), under an uneven plan whose heads have their
 *     dense part on the GPU and their sparse part on the CPU: the same tolerances against one CPU
 *     part.
 * The shared block and the logits live in one page-aligned host block that the GPU maps, as the
 * arena is. Without a usable GPU it prints why and exits 77 (ctest: skipped).
 */
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
static const int32_t IDS[N_TOK] = {3, 50, 201, 7, 7, 9, 120, 33};
static const int32_t PARENT[N_TOK] = {-1, 0, 1, 1, 3, -1, 5, 2};
static int failures;

typedef struct {
    llama_model *m;
    int part, n_parts, gpu;
    const llama_partition *plan;
    void *block; /* shared block, then the logits */
    size_t block_bytes, shared_bytes;
    pthread_barrier_t *barrier;
    int rc;
    char err[512];
} part_arg;

static void *part_run(void *argp)
{
    part_arg *a = argp;
    float *logits = (float *)((char *)a->block + a->shared_bytes);
    llama_ctx_params p = {.n_threads = 1, .max_width = N_TOK, .n_ctx = CTX, .kv = KV_F32,
                          .part = a->part, .n_parts = a->n_parts, .plan = a->plan,
                          .shared = a->block, .sync = tu_barrier_sync, .sync_arg = a->barrier};
    llama_ctx *ctx = llama_ctx_new(a->m, &p, a->err, sizeof a->err);
    llama_gpu *gpu = NULL;
    a->rc = -1;
    if (!ctx)
        return NULL;
    if (a->gpu && !(gpu = llama_gpu_new(ctx, 0, a->block, a->block_bytes, a->err, sizeof a->err)))
        goto out;
    int32_t path[] = {0, 1, 2};
    llama_batch pre = {.n = 3, .tokens = IDS};
    llama_batch tree = {.n = N_TOK, .tokens = IDS, .parent = PARENT};
    a->rc = gpu ? llama_gpu_forward(gpu, &pre, NULL, a->err, sizeof a->err)
                : llama_forward(ctx, &pre, NULL, a->err, sizeof a->err);
    /* the commit moves this part's K/V rows on the host, through the mapping */
    if (!a->rc)
        a->rc = llama_commit(ctx, path, 3, a->err, sizeof a->err);
    if (!a->rc)
        a->rc = gpu ? llama_gpu_forward(gpu, &tree, logits, a->err, sizeof a->err)
                    : llama_forward(ctx, &tree, logits, a->err, sizeof a->err);
out:
    llama_gpu_destroy(&gpu);
    llama_ctx_destroy(&ctx);
    return NULL;
}

/* Run the parts (gpu_mask: which run on the GPU); the logits are copied to out. */
static int run(llama_model *m, int n_parts, unsigned gpu_mask, const llama_partition *plan,
               float *out)
{
    size_t shared = llama_shared_layout(&m->cfg, CTX, N_TOK, 1, KV_F32, NULL);
    size_t lbytes = (size_t)N_TOK * m->cfg.vocab * 4;
    size_t bytes = (shared + lbytes + 4095) & ~(size_t)4095;
    void *block = aligned_alloc(4096, bytes);
    memset(block, 0, bytes);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)n_parts);
    part_arg args[2];
    pthread_t th[2];
    for (int i = 0; i < n_parts; i++) {
        args[i] = (part_arg){.m = m, .part = i, .n_parts = n_parts, .gpu = (gpu_mask >> i) & 1,
                             .plan = plan, .block = block, .block_bytes = bytes,
                             .shared_bytes = shared, .barrier = &barrier};
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
    memcpy(out, (char *)block + shared, lbytes);
    pthread_barrier_destroy(&barrier);
    free(block);
    return rc;
}

static void compare(const char *what, const float *got, const float *ref, int vocab, double tol)
{
    double e = tu_rel_l2(got, ref, (size_t)N_TOK * vocab);
    int same = 0;
    for (int r = 0; r < N_TOK; r++)
        same += k_argmax(got + (size_t)r * vocab, vocab) == k_argmax(ref + (size_t)r * vocab, vocab);
    bool ok = e <= tol && same == N_TOK;
    printf("  %-44s relative L2 %.3g (tolerance %.3g), greedy tokens %d/%d %s\n", what, e, tol,
           same, N_TOK, ok ? "ok" : "FAILED");
    failures += !ok;
}

int main(void)
{
    char why[256];
    if (kcuda_devices(why, sizeof why) < 1) {
        printf("unit_cuda_forward: SKIPPED: %s; the GPU forward is compiled but not run here\n",
               why);
        return 77;
    }
    static const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"};
    static const double tol[] = {1e-5, 3e-3, 1.5e-2, 3e-3, 3e-3, 3e-3};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        char err[256];
        llama_model *m = llama_model_load(
            tu_make_model("cuda", types[t], "--layers 2 --dim 128 --ffn 256 --heads 4 "
                                            "--kv-heads 2 --vocab 301 --ctx 64"),
            err, sizeof err);
        if (!m) {
            printf("%s\n", err);
            return 1;
        }
        size_t n = (size_t)N_TOK * m->cfg.vocab;
        float *ref = calloc(n, 4), *got = calloc(n, 4);
        printf("%s:\n", types[t]);
        if (run(m, 1, 0, NULL, ref))
            return 1;
        char what[96];
        snprintf(what, sizeof what, "one part on the GPU");
        if (run(m, 1, 1, NULL, got))
            failures++;
        else
            compare(what, got, ref, m->cfg.vocab, tol[t]);
        llama_partition plan;
        llama_partition_even(&plan, 2);
        for (int k = 0; k < LP_N; k++) {
            plan.frac[k][0] = 0.7f;
            plan.frac[k][1] = 0.3f;
        }
        plan.frac[LP_ATT_DENSE][0] = 1, plan.frac[LP_ATT_DENSE][1] = 0;
        plan.frac[LP_ATT_SPARSE][0] = 0, plan.frac[LP_ATT_SPARSE][1] = 1;
        if (run(m, 2, 1, &plan, got))
            failures++;
        else
            compare("GPU 0.7 + CPU 0.3, dense on GPU, sparse on CPU", got, ref, m->cfg.vocab,
                    tol[t]);
        free(ref);
        free(got);
        llama_model_destroy(&m);
    }
    printf("unit_cuda_forward: %s\n", failures ? "FAILED" : "all agree");
    return failures ? 1 : 0;
}
