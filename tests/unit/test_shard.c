/*
 * tests/unit/test_shard.c — column sharding is exact: computing every linear layer and the lm_head
 * as row ranges [0,a), [a,b), [b,n) and concatenating is bit-identical to computing them whole,
 * for every tensor type, batch width and thread count; a whole forward split into 1, 2 or 3
 * column parts gives bit-identical logits, and so do partition plans with uneven shares, more
 * parts than KV heads and a plan swapped between steps; the dense/sparse attention split and the
 * Megatron-style plan (partial sums reduced) agree within float rounding and keep every greedy
 * token; kmat_mul_cols over a column block range equals the sub-matrix. Workers depend on this.
 * A slot's epoch in the shared block moves exactly when its committed rows change other than by
 * growing (what a GPU worker's device mirror of the K/V relies on).
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

/* kmat_mul_cols over a block-aligned input column range, packed or not, is bit-identical to
 * kmat_mul over a matrix holding only those columns (the same bytes); misaligned ranges are
 * refused. */
static void test_shard_matmul_cols(void **state)
{
    const uint32_t types[] = {KT_F32, KT_F16, KT_BF16, KT_Q8_0, KT_Q4_0, KT_Q4_1, KT_Q4_K, KT_Q6_K};
    int64_t rows = 40, cols = 1024, c0 = 256, c1 = 768;
    kpool *pool = kpool_new(2);
    float *wf = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)(8 * cols) * 4);
    float *ref = malloc((size_t)(8 * rows) * 4), *got = malloc((size_t)(8 * rows) * 4);
    fill(wf, (size_t)(rows * cols), 3);
    fill(x, (size_t)(8 * cols), 4);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t rb = kt_row_bytes(types[t], (uint64_t)cols), sb = kt_row_bytes(types[t], (uint64_t)(c1 - c0));
        const kt_traits *tr = kt_traits_of(types[t]);
        uint8_t *wq = malloc(rb * (size_t)rows), *sub = malloc(sb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) {
            kt_quantize_row(types[t], wf + r * cols, wq + (size_t)r * rb, cols);
            memcpy(sub + (size_t)r * sb, wq + (size_t)r * rb + (size_t)(c0 / tr->block) * tr->block_bytes, sb);
        }
        for (int packed = 0; packed < 2; packed++) {
            kmat w = {.type = types[t], .rows = rows, .cols = cols, .row_bytes = rb, .data = wq};
            kmat s = {.type = types[t], .rows = rows, .cols = c1 - c0, .row_bytes = sb, .data = sub};
            if (packed && (kmat_pack(pool, &w) || kmat_pack(pool, &s)))
                fail_msg("%s: pack failed", tr->name);
            for (int n = 1; n <= 8; n += 7) {
                kmat_mul(pool, &s, 3, 37, x, n, ref, rows, NULL);
                if (kmat_mul_cols(pool, &w, 3, 37, c0, c1, x, n, got, rows, NULL))
                    fail_msg("%s: kmat_mul_cols refused an aligned range", tr->name);
                for (int i = 0; i < n; i++)
                    if (memcmp(ref + i * rows + 3, got + i * rows + 3, 34 * 4))
                        fail_msg("%s %s width %d: columns [%lld, %lld) differ from the sub-matrix",
                                 tr->name, packed ? "packed" : "unpacked", n, (long long)c0,
                                 (long long)c1);
            }
            kmat_unpack(&w);
            kmat_unpack(&s);
        }
        if (tr->block > 1)
            assert_int_equal(kmat_mul_cols(pool, &(kmat){.type = types[t], .rows = rows,
                                                         .cols = cols, .row_bytes = rb, .data = wq},
                                           0, 4, 16, 512, x, 1, got, rows, NULL),
                             -1);
        free(wq);
        free(sub);
    }
    free(wf);
    free(x);
    free(ref);
    free(got);
    kpool_destroy(&pool);
}

/* Whole forward split in 1, 2 and 3 column parts, each part a thread with its own context over one
 * shared block, meeting at a pthread barrier (what worker processes do through the arena): the
 * logits are bit-identical to the single-part forward, for every tensor type. */
typedef struct {
    llama_model *m;
    int part, n_parts, n_tok;
    bool kv_dup;
    const llama_partition *plan, *swap; /* the plan, and the one the tree runs with (or NULL) */
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
                          .n_parts = a->n_parts, .plan = a->plan, .kv_dup = a->kv_dup,
                          .shared = a->shared, .sync = tu_barrier_sync, .sync_arg = a->barrier};
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
    if (!a->rc && a->swap) /* a plan swapped between steps: the next step runs under it */
        a->rc = llama_ctx_set_partition(ctx, a->swap, a->err, sizeof a->err);
    if (!a->rc)
        a->rc = llama_forward(ctx, &b, a->logits, a->err, sizeof a->err);
    llama_ctx_destroy(&ctx);
    return NULL;
}

static void run_plan_dup(llama_model *m, int n_parts, const llama_partition *plan,
                         const llama_partition *swap, bool kv_dup, float *logits)
{
    size_t bytes = llama_shared_layout(&m->cfg, 32, 8, 1, KV_F32, NULL);
    void *shared = calloc(1, bytes);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)n_parts);
    part_arg args[LLAMA_MAX_PARTS];
    pthread_t th[LLAMA_MAX_PARTS];
    for (int i = 0; i < n_parts; i++) {
        args[i] = (part_arg){.m = m, .part = i, .n_parts = n_parts, .n_tok = 8, .kv_dup = kv_dup,
                             .plan = plan, .swap = swap, .shared = shared, .barrier = &barrier,
                             .logits = logits};
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

static void run_plan(llama_model *m, int n_parts, const llama_partition *plan,
                     const llama_partition *swap, float *logits)
{
    run_plan_dup(m, n_parts, plan, swap, false, logits);
}

static void run_parts(llama_model *m, int n_parts, float *logits)
{
    run_plan(m, n_parts, NULL, NULL, logits);
}

/* kv_dup: the even split by query heads, a KV head shared by two parts projected by both (the
 * one that does not own it keeps its tree rows privately and commits from them): 9 query heads
 * of 3 KV heads in 2, 4 and 5 parts (more parts than KV heads, heads split 5/4, 3/2/2/2, ...)
 * and 6 of 3 in 4 parts, the committed prefix and the tree both crossing the shared heads — the
 * logits are bit-identical to one part. */
static void test_shard_forward_kv_dup(void **state)
{
    char err[256];
    static const struct {
        const char *shape;
        int parts[3];
    } cases[] = {{"--layers 2 --dim 288 --ffn 160 --heads 9 --kv-heads 3 --vocab 301 --ctx 64",
                  {2, 4, 5}},
                 {"--layers 2 --dim 96 --ffn 160 --heads 6 --kv-heads 3 --vocab 301 --ctx 64",
                  {4, 5, 2}}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
            llama_model *m =
                llama_model_load(tu_make_model("shard-dup", TYPES[t], cases[ci].shape), err,
                                 sizeof err);
            if (!m)
                fail_msg("%s", err);
            size_t n = (size_t)8 * m->cfg.vocab;
            float *ref = calloc(n, 4), *got = calloc(n, 4);
            run_parts(m, 1, ref);
            for (int k = 0; k < 3; k++) {
                int parts = cases[ci].parts[k];
                memset(got, 0, n * 4);
                run_plan_dup(m, parts, NULL, NULL, true, got);
                if (memcmp(ref, got, n * 4))
                    fail_msg("%s, %d heads: %d parts with kv_dup: logits differ from 1 part "
                             "(relative L2 %.3g)",
                             TYPES[t], m->cfg.n_heads, parts, tu_rel_l2(got, ref, n));
            }
            free(ref);
            free(got);
            llama_model_destroy(&m);
        }
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

/* A plan with the same shares for every kind, or with the attention kinds given apart. */
static void plan_set(llama_partition *p, int n, const float *shares, const float *dense,
                     const float *sparse)
{
    memset(p, 0, sizeof *p);
    p->n_parts = n;
    for (int k = 0; k < LP_N; k++)
        for (int i = 0; i < n; i++)
            p->frac[k][i] = k == LP_ATT_DENSE && dense     ? dense[i]
                            : k == LP_ATT_SPARSE && sparse ? sparse[i]
                                                           : shares[i];
}

/* The greedy token of every logits row is the same. */
static void expect_same_argmax(const float *got, const float *ref, int rows, int vocab,
                               const char *what)
{
    for (int r = 0; r < rows; r++)
        if (sampler_argmax(got + (size_t)r * vocab, vocab) !=
            sampler_argmax(ref + (size_t)r * vocab, vocab))
            fail_msg("%s: row %d: greedy token differs from 1 part", what, r);
}

/* Partition plans: uneven shares (0.1/0.2/0.3/0.4), more parts than KV heads, parts with nothing
 * of a kind, and a plan swapped between steps are bit-identical to one part as long as each
 * head's dense and sparse attention stay together; with them apart (the dense/sparse split, the
 * partials merged by online softmax), or with the Megatron-style plan (partial sums reduced),
 * the logits agree within float rounding and every row's greedy token is the same. */
static void test_shard_forward_plans(void **state)
{
    char err[256];
    static const float uneven[] = {0.1f, 0.2f, 0.3f, 0.4f}, five[] = {1, 1, 1, 1, 1},
                       idle[] = {0, 3, 0, 1}, dense[] = {0.7f, 0.3f, 0, 0},
                       sparse[] = {0, 0, 0.5f, 0.5f}, half_d[] = {1, 1, 0, 0},
                       half_s[] = {0, 1, 1, 0};
    for (size_t t = 0; t < sizeof TYPES / sizeof TYPES[0]; t++) {
        llama_model *m = llama_model_load(
            tu_make_model("shard", TYPES[t], "--layers 2 --dim 96 --ffn 160 --heads 6 --kv-heads 3 "
                          "--vocab 301 --ctx 64"), err, sizeof err);
        if (!m)
            fail_msg("%s", err);
        int V = m->cfg.vocab;
        size_t n = (size_t)8 * V;
        float *ref = calloc(n, 4), *got = calloc(n, 4);
        run_parts(m, 1, ref);
        llama_partition a, b;
        struct {
            int parts;
            const float *shares, *dense, *sparse, *swap;
            bool exact;
            const char *what;
            int style;
        } cases[] = {
            {4, uneven, NULL, NULL, NULL, true, "4 parts 0.1/0.2/0.3/0.4", LP_STYLE_HCMP},
            {5, five, NULL, NULL, NULL, true, "5 even parts over 3 KV heads", LP_STYLE_HCMP},
            {4, idle, NULL, NULL, NULL, true, "parts 0 and 2 idle", LP_STYLE_HCMP},
            {4, uneven, NULL, NULL, idle, true, "0.1/0.2/0.3/0.4 swapped for 0/3/0/1", LP_STYLE_HCMP},
            {4, uneven, dense, sparse, NULL, false, "dense on parts 0-1, sparse on 2-3", LP_STYLE_HCMP},
            {4, uneven, half_d, half_s, NULL, false, "dense and sparse overlapping", LP_STYLE_HCMP},
            {1, five, NULL, NULL, NULL, true, "megatron, one part", LP_STYLE_MEGATRON},
            {3, five, NULL, NULL, NULL, false, "megatron, 3 even parts", LP_STYLE_MEGATRON},
            {4, uneven, NULL, NULL, NULL, false, "megatron 0.1/0.2/0.3/0.4", LP_STYLE_MEGATRON},
        };
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            plan_set(&a, cases[k].parts, cases[k].shares, cases[k].dense, cases[k].sparse);
            a.style = cases[k].style;
            if (cases[k].swap)
                plan_set(&b, cases[k].parts, cases[k].swap, NULL, NULL);
            memset(got, 0, n * 4);
            run_plan(m, cases[k].parts, &a, cases[k].swap ? &b : NULL, got);
            if (cases[k].exact && memcmp(ref, got, n * 4))
                fail_msg("%s: %s: logits differ from 1 part (relative L2 %.3g)", TYPES[t],
                         cases[k].what, tu_rel_l2(got, ref, n));
            /* the merge's rounding, which the quantized types' activation rounding can amplify
             * by a step of their input quantization (measured: 2.7e-5 for q8_0) */
            if (!cases[k].exact && tu_rel_l2(got, ref, n) > 1e-4)
                fail_msg("%s: %s: relative L2 %.3g from 1 part", TYPES[t], cases[k].what,
                         tu_rel_l2(got, ref, n));
            expect_same_argmax(got, ref, 8, V, cases[k].what);
        }
        free(ref);
        free(got);
        llama_model_destroy(&m);
    }
}

/* A one-layer f32 model of 3 KV heads (6 query heads). */
static llama_model *one_layer_model(void)
{
    char err[256];
    llama_model *m = llama_model_load(
        tu_make_model("shard", "f32", "--layers 1 --dim 96 --ffn 160 --heads 6 --kv-heads 3 "
                      "--vocab 301 --ctx 64"), err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    return m;
}

/* Bad plans are refused with what is wrong. */
static void test_shard_plan_errors(void **state)
{
    char err[256];
    llama_model *m = one_layer_model();
    llama_partition p;
    llama_partition_even(&p, 4);
    llama_ctx_params cp = {.n_threads = 1, .max_width = 4, .n_ctx = 16, .part = 0, .n_parts = 4};
    llama_ctx *ctx = llama_ctx_new(m, &cp, err, sizeof err);
    assert_null(ctx);
    assert_non_null(strstr(err, "at most 3 parts: one KV head each"));
    p.frac[LP_FFN_UP][2] = -1;
    cp.plan = &p;
    assert_null(llama_ctx_new(m, &cp, err, sizeof err));
    assert_string_equal(err, "partition plan: the ffn_up share of part 2 is -1: must be a finite "
                             "number >= 0");
    llama_partition_even(&p, 4);
    for (int i = 0; i < 4; i++)
        p.frac[LP_ATT_SPARSE][i] = 0;
    assert_null(llama_ctx_new(m, &cp, err, sizeof err));
    assert_string_equal(err, "partition plan: the attention_sparse shares sum to 0: some part "
                             "must take it");
    llama_partition_even(&p, 3);
    assert_null(llama_ctx_new(m, &cp, err, sizeof err));
    assert_string_equal(err, "partition plan of 3 parts for a context that is part 0 of 4");
    llama_partition_even(&p, 4);
    ctx = llama_ctx_new(m, &cp, err, sizeof err);
    assert_non_null(ctx);
    llama_partition_even(&p, 2);
    assert_int_equal(llama_ctx_set_partition(ctx, &p, err, sizeof err), -1);
    assert_string_equal(err, "partition plan of 2 parts for a context that is part 0 of 4");
    llama_ctx_destroy(&ctx);
    llama_model_destroy(&m);
}

/* llama_shared.epoch: unchanged by commits and growth, bumped by a lower length, a reset and a
 * copied prefix, per slot. */
static void test_shard_kv_epoch(void **state)
{
    (void)state;
    char err[256];
    llama_model *m = one_layer_model();
    llama_ctx_params cp = {.n_threads = 1, .max_width = 4, .n_ctx = 16, .n_seq = 2};
    llama_ctx *ctx = llama_ctx_new(m, &cp, err, sizeof err);
    assert_non_null(ctx);
    const uint32_t *ep = llama_ctx_shared(ctx)->epoch;
    uint32_t e0 = ep[0], e1 = ep[1];
    int32_t ids[] = {5, 6, 7}, path[] = {0, 1, 2};
    llama_batch b = {.n = 3, .tokens = ids};
    assert_int_equal(llama_forward(ctx, &b, NULL, err, sizeof err), 0);
    assert_int_equal(llama_commit(ctx, path, 3, err, sizeof err), 0);
    llama_ctx_set_seq_prefix_len(ctx, 0, 3); /* the same length: no change */
    assert_true(ep[0] == e0 && ep[1] == e1);
    llama_ctx_set_seq_prefix_len(ctx, 0, 2);
    assert_true(ep[0] != e0 && ep[1] == e1);
    e0 = ep[0];
    llama_ctx_set_seq_prefix_len(ctx, 0, 3); /* growing back: rows 2.. come from commits */
    assert_true(ep[0] == e0);
    assert_int_equal(llama_kv_copy_prefix(ctx, 0, 1, 3, err, sizeof err), 0);
    assert_true(ep[0] == e0 && ep[1] != e1);
    e1 = ep[1];
    llama_ctx_reset(ctx);
    assert_true(ep[0] != e0 && ep[1] != e1);
    e0 = ep[0], e1 = ep[1];
    llama_ctx_reset(ctx); /* nothing committed: nothing changed */
    assert_true(ep[0] == e0 && ep[1] == e1);
    llama_ctx_destroy(&ctx);
    llama_model_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_matmul_ranges),
        cmocka_unit_test(test_shard_matmul_cols),
        cmocka_unit_test(test_shard_forward_parts),
        cmocka_unit_test(test_shard_forward_kv_dup),
        cmocka_unit_test(test_shard_forward_plans),
        cmocka_unit_test(test_shard_plan_errors),
        cmocka_unit_test(test_shard_kv_epoch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
