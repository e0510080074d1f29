/*
 * tests/unit/test_shard.c — column sharding is exact: computing every linear layer and the lm_head
 * as row ranges [0,a), [a,b), [b,n) and concatenating is bit-identical to computing them whole,
 * for every tensor type, batch width and thread count; and a whole forward split into 1, 2 or 3
 * column parts gives bit-identical logits. Workers depend on this.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>

#include "model/llama.h"
#include "tests/unit/testutil.h"

static const char *TYPES[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1"};

static void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int)(seed >> 9) % 2001 - 1000) / 500.0f;
    }
}

/* kmat_mul over three uneven ranges == one whole call, bit for bit. */
static void test_shard_matmul_ranges(void **state)
{
    const uint32_t types[] = {KT_F32, KT_F16, KT_BF16, KT_Q8_0, KT_Q4_0, KT_Q4_1};
    const int widths[] = {1, 3, 8, 64};
    int64_t rows = 97, cols = 256;
    kpool *pool = kpool_new(2);
    float *wf = malloc((size_t)(rows * cols) * 4);
    float *x = malloc((size_t)(64 * cols) * 4);
    float *full = malloc((size_t)(64 * rows) * 4), *part = malloc((size_t)(64 * rows) * 4);
    fill(wf, (size_t)(rows * cols), 1);
    fill(x, (size_t)(64 * cols), 2);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t rb = kt_row_bytes(types[t], (uint64_t)cols);
        uint8_t *wq = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++)
            kt_quantize_row(types[t], wf + r * cols, wq + (size_t)r * rb, cols);
        kmat w = {.type = types[t], .rows = rows, .cols = cols, .row_bytes = rb, .data = wq};
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
            int n = widths[wi];
            kmat_mul(NULL, &w, 0, rows, x, n, full, rows, NULL);
            kmat_mul(pool, &w, 0, 13, x, n, part, rows, NULL);
            kmat_mul(pool, &w, 13, 60, x, n, part, rows, NULL);
            kmat_mul(NULL, &w, 60, rows, x, n, part, rows, NULL);
            if (memcmp(full, part, (size_t)(n * rows) * 4))
                fail_msg("type %s width %d: sharded matmul differs from whole", kt_traits_of(types[t])->name, n);
        }
        free(wq);
    }
    free(wf);
    free(x);
    free(full);
    free(part);
    kpool_destroy(&pool);
}

/* Whole forward split in 1, 2 and 3 column parts, each part a thread with its own context over one
 * shared block, meeting at a pthread barrier (what worker processes do through the arena): the
 * logits are bit-identical to the single-part forward, for every tensor type. */
typedef struct {
    llama_model *m;
    int part, n_parts, n_tok;
    void *shared;
    pthread_barrier_t *barrier;
    float *logits;
    int rc;
    char err[256];
} part_arg;

static void *part_run(void *argp)
{
    part_arg *a = argp;
    static const int32_t ids[] = {3, 50, 201, 7, 7, 9, 120, 33};
    static const int32_t parent[] = {-1, 0, 1, 1, 3, -1, 5, 2};
    llama_ctx_params p = {.n_threads = 1, .max_width = 8, .n_ctx = 32, .kv = KV_F32, .part = a->part,
                          .n_parts = a->n_parts, .shared = a->shared, .sync = tu_barrier_sync,
                          .sync_arg = a->barrier};
    llama_ctx *ctx = llama_ctx_new(a->m, &p, a->err, sizeof a->err);
    if (!ctx) {
        a->rc = -1;
        return NULL;
    }
    /* a committed prefix of 3, then a tree of 8 */
    int32_t path[] = {0, 1, 2};
    llama_batch pre = {.n = 3, .tokens = ids};
    a->rc = llama_forward(ctx, &pre, NULL, a->err, sizeof a->err);
    if (!a->rc)
        a->rc = llama_commit(ctx, path, 3, a->err, sizeof a->err);
    llama_batch b = {.n = a->n_tok, .tokens = ids, .parent = parent};
    if (!a->rc)
        a->rc = llama_forward(ctx, &b, a->logits, a->err, sizeof a->err);
    llama_ctx_destroy(&ctx);
    return NULL;
}

static void run_parts(llama_model *m, int n_parts, float *logits)
{
    size_t bytes = llama_shared_layout(&m->cfg, 32, 8, 1, KV_F32, NULL);
    void *shared = calloc(1, bytes);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)n_parts);
    part_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < n_parts; i++) {
        args[i] = (part_arg){.m = m, .part = i, .n_parts = n_parts, .n_tok = 8, .shared = shared,
                             .barrier = &barrier, .logits = logits};
        pthread_create(&th[i], NULL, part_run, &args[i]);
    }
    for (int i = 0; i < n_parts; i++) {
        pthread_join(th[i], NULL);
        if (args[i].rc)
            fail_msg("part %d of %d: %s", i, n_parts, args[i].err);
    }
    pthread_barrier_destroy(&barrier);
    free(shared);
}

static void test_shard_forward_parts(void **state)
{
    char err[256];
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        /* 6 KV heads so that 1, 2 and 3 parts all divide them differently from the rows */
        llama_model *m = llama_model_load(
            tu_make_model("shard", TYPES[t], "--layers 2 --dim 96 --ffn 160 --heads 6 --kv-heads 3 "
                          "--vocab 301 --ctx 64"), err, sizeof err);
        if (!m)
            fail_msg("%s", err);
        size_t n = (size_t)8 * m->cfg.vocab;
        float *ref = calloc(n, 4), *got = calloc(n, 4);
        run_parts(m, 1, ref);
        for (int parts = 2; parts <= 3; parts++) {
            memset(got, 0, n * 4);
            run_parts(m, parts, got);
            if (memcmp(ref, got, n * 4))
                fail_msg("%s: %d parts: logits differ from 1 part (relative L2 %.3g)", TYPES[t], parts,
                         tu_rel_l2(got, ref, n));
        }
        free(ref);
        free(got);
        llama_model_destroy(&m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_matmul_ranges),
        cmocka_unit_test(test_shard_forward_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
