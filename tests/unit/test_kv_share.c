/*
 * tests/unit/test_kv_share.c — slots that borrow a common beginning's K/V rows from another slot
 * (llama_kv_share_prefix) attend exactly as if they held those rows themselves: a tree verified
 * on a borrowing slot, on a slot borrowing through a borrower (the chain resolved to the first
 * lender, the rest copied), and by a drafter reading the borrowing slot through a prefix source
 * gives the logits of a private context that prefilled the same tokens, bit for bit, with f32
 * and f16 rows and heads of 16 and 64, the lent part ending inside an attention chunk. Unsharing keeps a borrower right
 * after its lender's rows are written again (and one that still borrows them is then wrong: the
 * lend table is what attention reads); releasing and resetting end what a slot borrows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model/llama.h"
#include "tests/unit/testutil.h"

#define N_CTX 64
#define WIDTH 16
#define N_SEQ 4
#define N_A 40 /* slot 0's sequence */
#define N_B 4  /* what slot 1 adds after the first SHARE of it */
#define SHARE 35 /* rows lent: the chunk of positions 32..47 is half lent, half own */

static const int32_t TREE[] = {40, 41, 42, 43, 44, 45};
static const int32_t PARENT[] = {-1, 0, 0, 1, 1, 2};
#define N_TREE 6

static int32_t tok_a(int i)
{
    return (int32_t)(3 + (i * 37) % 200);
}

static llama_ctx *new_ctx(const llama_model *m, int n_seq, kv_type kv)
{
    char err[256];
    llama_ctx_params p = {
        .n_threads = 2, .max_width = WIDTH, .n_ctx = N_CTX, .n_seq = n_seq, .kv = kv};
    llama_ctx *ctx = llama_ctx_new(m, &p, err, sizeof err);
    if (!ctx)
        fail_msg("%s", err);
    return ctx;
}

/* Append toks[0..n) to slot seq's committed rows, a chain of up to WIDTH tokens at a time. */
static void feed(llama_ctx *ctx, int seq, const int32_t *toks, int n)
{
    char err[256];
    for (int at = 0; at < n; at += WIDTH) {
        int w = n - at < WIDTH ? n - at : WIDTH;
        int32_t sq[WIDTH], path[WIDTH];
        for (int i = 0; i < w; i++)
            sq[i] = seq, path[i] = i;
        llama_batch b = {.n = w, .tokens = toks + at, .seq = sq};
        if (llama_forward(ctx, &b, NULL, err, sizeof err) ||
            llama_commit(ctx, path, w, err, sizeof err))
            fail_msg("feeding slot %d: %s", seq, err);
    }
}

/* The tree's logits on slot seq. */
static void tree_logits(llama_ctx *ctx, int seq, float *out)
{
    char err[256];
    int32_t sq[N_TREE];
    for (int i = 0; i < N_TREE; i++)
        sq[i] = seq;
    llama_batch b = {.n = N_TREE, .tokens = TREE, .parent = PARENT, .seq = sq};
    if (llama_forward(ctx, &b, out, err, sizeof err))
        fail_msg("the tree on slot %d: %s", seq, err);
}

/* What a private context holding toks[0..n) gives for the tree. */
static void reference(const llama_model *m, kv_type kv, const int32_t *toks, int n, float *out)
{
    llama_ctx *ref = new_ctx(m, 1, kv);
    feed(ref, 0, toks, n);
    tree_logits(ref, 0, out);
    llama_ctx_destroy(&ref);
}

static void expect_bits(const char *what, const float *got, const float *want, size_t n)
{
    if (memcmp(got, want, n * sizeof *got)) {
        size_t i = 0;
        while (got[i] == want[i])
            i++;
        fail_msg("%s: logit %zu is %.9g, the private context's %.9g", what, i, got[i], want[i]);
    }
}

/* extra: mkmodel's shape (NULL: the small default, heads of 16) */
static void run(kv_type kv, const char *tag, const char *extra)
{
    char err[256];
    llama_model *m = llama_model_load(tu_make_model(tag, "q4_1", extra), err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    size_t nl = (size_t)N_TREE * (size_t)m->cfg.vocab;
    float *want = malloc(nl * sizeof *want), *got = malloc(nl * sizeof *got);
    int32_t a[N_A], ab[SHARE + N_B], c[20];
    for (int i = 0; i < N_A; i++)
        a[i] = tok_a(i);
    memcpy(ab, a, SHARE * sizeof *ab);
    for (int i = 0; i < N_B; i++)
        ab[SHARE + i] = (int32_t)(210 + i);
    for (int i = 0; i < 20; i++)
        c[i] = (int32_t)(5 + i * 3);
    reference(m, kv, ab, SHARE + N_B, want);

    llama_ctx *ctx = new_ctx(m, N_SEQ, kv);
    feed(ctx, 0, a, N_A);
    int from = -1;
    assert_int_equal(llama_kv_lent(ctx, 1, &from), 0);
    /* slot 1 borrows slot 0's first SHARE rows and goes on with its own */
    assert_int_equal(llama_kv_share_prefix(ctx, 0, 1, SHARE, err, sizeof err), 0);
    assert_int_equal(llama_kv_lent(ctx, 1, &from), SHARE);
    assert_int_equal(from, 0);
    assert_int_equal(llama_ctx_seq_prefix_len(ctx, 1), SHARE);
    feed(ctx, 1, ab + SHARE, N_B);
    tree_logits(ctx, 1, got);
    expect_bits("a borrowing slot", got, want, nl);

    /* slot 2 from slot 1: the first SHARE rows borrowed from slot 0, the next N_B copied */
    assert_int_equal(llama_kv_share_prefix(ctx, 1, 2, SHARE + N_B, err, sizeof err), 0);
    assert_int_equal(llama_kv_lent(ctx, 2, &from), SHARE);
    assert_int_equal(from, 0);
    tree_logits(ctx, 2, got);
    expect_bits("a slot borrowing through a borrower", got, want, nl);

    /* a drafter reading slot 1 in place (prefix_src) follows what slot 1 borrows */
    llama_ctx_params dp = {.n_threads = 2,
                           .max_width = WIDTH,
                           .n_ctx = N_CTX,
                           .kv = kv,
                           .prefix_src = llama_ctx_shared(ctx),
                           .prefix_src_n_ctx = N_CTX,
                           .prefix_src_max_width = WIDTH,
                           .prefix_src_n_seq = N_SEQ};
    llama_ctx *drafter = llama_ctx_new(m, &dp, err, sizeof err);
    assert_non_null(drafter);
    llama_ctx_set_prefix_source_seq(drafter, 1);
    llama_ctx_set_prefix_len(drafter, SHARE + N_B);
    tree_logits(drafter, 0, got);
    expect_bits("a drafter reading a borrowing slot", got, want, nl);
    llama_ctx_destroy(&drafter);

    /* slot 1 keeps 20 borrowed rows and takes the rest into its own; slot 0 is then written
     * again from row 20 with other tokens: slot 1 is unchanged, slot 2 (still borrowing 35 rows
     * of slot 0) is not */
    llama_kv_unshare(ctx, 1, 20, true);
    assert_int_equal(llama_kv_lent(ctx, 1, &from), 20);
    llama_ctx_set_seq_prefix_len(ctx, 0, 20);
    feed(ctx, 0, c, 20);
    tree_logits(ctx, 1, got);
    expect_bits("a borrower unshared past its lender's rewritten rows", got, want, nl);
    tree_logits(ctx, 2, got);
    assert_true(memcmp(got, want, nl * sizeof *got) != 0);

    /* slot 0 takes slot 1's sequence, part of which it lent: those rows are its own already */
    assert_int_equal(llama_kv_share_prefix(ctx, 1, 0, SHARE + N_B, err, sizeof err), 0);
    assert_int_equal(llama_kv_lent(ctx, 0, &from), 0);
    tree_logits(ctx, 0, got);
    expect_bits("a lender taking its borrower's sequence", got, want, nl);

    /* a copy holds every row itself, wherever the source's lie */
    assert_int_equal(llama_kv_copy_prefix(ctx, 1, 3, SHARE + N_B, err, sizeof err), 0);
    assert_int_equal(llama_kv_lent(ctx, 3, &from), 0);
    tree_logits(ctx, 3, got);
    expect_bits("a copy of a borrowing slot", got, want, nl);

    /* errors name the slots; releasing and resetting end the borrowing */
    assert_int_equal(llama_kv_share_prefix(ctx, 0, N_SEQ, 4, err, sizeof err), -1);
    assert_string_equal(err, "share prefix: 4 rows from slot 0 to slot 4 (4 slots of 64)");
    llama_kv_release(ctx, 1, 8);
    assert_int_equal(llama_kv_lent(ctx, 1, &from), 8);
    assert_int_equal(llama_ctx_seq_prefix_len(ctx, 1), 8);
    llama_ctx_reset(ctx);
    assert_int_equal(llama_kv_lent(ctx, 1, NULL), 0);
    assert_int_equal(llama_kv_lent(ctx, 2, NULL), 0);
    llama_ctx_destroy(&ctx);
    free(want);
    free(got);
    llama_model_destroy(&m);
}

/* heads of 64: the AVX-512 chunk loop where the machine has it, f16 rows read raw */
#define HEAD64 "--layers 2 --dim 256 --ffn 256 --heads 4 --kv-heads 2 --vocab 300 --ctx 128"

static void test_kv_share_f32(void **state)
{
    (void)state;
    run(KV_F32, "kvshare", NULL);
    run(KV_F32, "kvshare64", HEAD64);
}

static void test_kv_share_f16(void **state)
{
    (void)state;
    run(KV_F16, "kvshare", NULL);
    run(KV_F16, "kvshare64", HEAD64);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_share_f32),
        cmocka_unit_test(test_kv_share_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
