/*
 * tests/unit/test_shard.c — column sharding is exact: computing every linear layer and the lm_head
 * as row ranges [0,a), [a,b), [b,n) and concatenating is bit-identical to computing them whole,
 * for every tensor type, batch width and thread count. Workers depend on this: 1, 2 or 3 of
 * them must produce the same logits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

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

/* Whole forward: logits with 1, 2 and 3 shards per linear (and 1 vs 2 threads) are identical. */
static void test_shard_forward(void **state)
{
    char err[256];
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        llama_model *m = llama_model_load(tu_make_model("shard", TYPES[t], NULL), err, sizeof err);
        if (!m)
            fail_msg("%s", err);
        int V = m->cfg.vocab;
        int32_t ids[] = {3, 50, 201, 7, 7, 9, 120, 33};
        float *ref = malloc((size_t)8 * V * 4), *got = malloc((size_t)8 * V * 4);
        for (int shards = 1; shards <= 3; shards++)
            for (int threads = 1; threads <= 2; threads++) {
                llama_ctx_params p = {.n_threads = threads, .max_width = 8, .n_ctx = 32, .kv = KV_F32,
                                      .n_shards = shards};
                llama_ctx *ctx = llama_ctx_new(m, &p, err, sizeof err);
                assert_non_null(ctx);
                llama_batch b = {.n = 8, .tokens = ids};
                assert_int_equal(llama_forward(ctx, &b, shards == 1 && threads == 1 ? ref : got, err, sizeof err), 0);
                if ((shards > 1 || threads > 1) && memcmp(ref, got, (size_t)8 * V * 4))
                    fail_msg("%s: %d shards x %d threads: logits differ from 1 x 1", TYPES[t], shards, threads);
                llama_ctx_destroy(&ctx);
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
        cmocka_unit_test(test_shard_forward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
