/*
 * tests/unit/test_tree.c — a token tree verified in one forward gives, node by node, the logits of
 * sequential decoding along that node's root-to-node path; committing a path then continues
 * exactly like sequential decoding. This is the property tree verification rests on. The engine
 * makes it bit-exact (same operations in the same order), so the check is exact equality, with
 * the relative error printed when it fails.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "model/llama.h"
#include "tests/unit/testutil.h"


static const int32_t PROMPT[] = {5, 77, 123, 9, 250, 31};
#define N_PROMPT ((int)(sizeof PROMPT / sizeof PROMPT[0]))

/* A tree of 11 nodes: two roots, branches of different depths. */
static const int32_t TOKENS[] = {40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50};
static const int32_t PARENT[] = {-1, 0, 0, 1, 1, 2, -1, 6, 3, 8, 7};
#define N_TREE ((int)(sizeof TOKENS / sizeof TOKENS[0]))

static llama_ctx *new_ctx(const llama_model *m, int width, int threads, kv_type kv)
{
    char err[256];
    llama_ctx_params p = {.n_threads = threads, .max_width = width, .n_ctx = 64, .kv = kv};
    llama_ctx *ctx = llama_ctx_new(m, &p, err, sizeof err);
    assert_non_null(ctx);
    return ctx;
}

/* Sequential logits after prompt + path to `node`. */
static void sequential_logits(const llama_model *m, int node, float *out, kv_type kv)
{
    char err[256];
    llama_ctx *ctx = new_ctx(m, 8, 1, kv);
    int32_t path[N_TREE];
    int n = 0;
    for (int i = node; i >= 0; i = PARENT[i])
        path[n++] = TOKENS[i];
    assert_int_equal(llama_prefill(ctx, PROMPT, N_PROMPT, out, err, sizeof err), 0);
    for (int i = n - 1; i >= 0; i--) {
        int32_t zero = 0;
        llama_batch b = {.n = 1, .tokens = &path[i]};
        assert_int_equal(llama_forward(ctx, &b, out, err, sizeof err), 0);
        assert_int_equal(llama_commit(ctx, &zero, 1, err, sizeof err), 0);
    }
    llama_ctx_destroy(&ctx);
}

static void expect_same(const char *what, const char *type, int node, const float *got, const float *want, int V)
{
    if (memcmp(got, want, (size_t)V * sizeof *got))
        fail_msg("%s: %s %d: tree logits differ from sequential (relative L2 %.3g)", type, what, node,
                 tu_rel_l2(got, want, (size_t)V));
}

static void check_tree(const char *type, kv_type kv)
{
    char err[256];
    llama_model *m = llama_model_load(tu_make_model("tree", type, NULL), err, sizeof err);
    assert_non_null(m);
    int V = m->cfg.vocab;
    float *tree = malloc((size_t)N_TREE * V * sizeof *tree), *seq = malloc((size_t)V * sizeof *seq);
    llama_ctx_params p = {.n_threads = 2, .max_width = 16, .n_ctx = 64, .kv = kv};
    llama_ctx *ctx = llama_ctx_new(m, &p, err, sizeof err);
    assert_non_null(ctx);
    assert_int_equal(llama_prefill(ctx, PROMPT, N_PROMPT, seq, err, sizeof err), 0);
    llama_batch b = {.n = N_TREE, .tokens = TOKENS, .parent = PARENT};
    assert_int_equal(llama_forward(ctx, &b, tree, err, sizeof err), 0);
    for (int i = 0; i < N_TREE; i++) {
        sequential_logits(m, i, seq, kv);
        expect_same("node", type, i, tree + (size_t)i * V, seq, V);
    }
    /* accept root 0 -> 2 -> 5 and continue with one more token: must equal sequential */
    int32_t path[] = {0, 2, 5};
    assert_int_equal(llama_commit(ctx, path, 3, err, sizeof err), 0);
    assert_int_equal(llama_ctx_prefix_len(ctx), N_PROMPT + 3);
    int32_t next = 99, zero = 0;
    llama_batch nb = {.n = 1, .tokens = &next};
    assert_int_equal(llama_forward(ctx, &nb, tree, err, sizeof err), 0);

    llama_ctx *sc = new_ctx(m, 8, 1, kv);
    int32_t all[N_PROMPT + 4];
    memcpy(all, PROMPT, sizeof PROMPT);
    all[N_PROMPT] = TOKENS[0];
    all[N_PROMPT + 1] = TOKENS[2];
    all[N_PROMPT + 2] = TOKENS[5];
    all[N_PROMPT + 3] = next;
    for (int i = 0; i < N_PROMPT + 4; i++) {
        llama_batch one = {.n = 1, .tokens = &all[i]};
        assert_int_equal(llama_forward(sc, &one, seq, err, sizeof err), 0);
        assert_int_equal(llama_commit(sc, &zero, 1, err, sizeof err), 0);
    }
    expect_same("after commit, token", type, 0, tree, seq, V);
    llama_ctx_destroy(&sc);
    llama_ctx_destroy(&ctx);
    free(tree);
    free(seq);
    llama_model_destroy(&m);
}

static void test_tree_f32(void **state)
{
    check_tree("f32", KV_F32);
}

static void test_tree_q4_1(void **state)
{
    check_tree("q4_1", KV_F32);
    check_tree("q8_0", KV_F16);
}

static void test_tree_bad_parent(void **state)
{
    char err[256];
    llama_model *m = llama_model_load(tu_make_model("tree", "f32", NULL), err, sizeof err);
    assert_non_null(m);
    llama_ctx *ctx = new_ctx(m, 4, 1, KV_F32);
    int32_t toks[] = {1, 2}, par[] = {-1, 1};
    llama_batch b = {.n = 2, .tokens = toks, .parent = par};
    assert_int_equal(llama_forward(ctx, &b, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "parent"));
    int32_t bad[] = {1, 100000};
    llama_batch b2 = {.n = 2, .tokens = bad};
    assert_int_equal(llama_forward(ctx, &b2, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "outside the vocabulary"));
    llama_ctx_destroy(&ctx);
    llama_model_destroy(&m);
}

/* Two sequences in one batch (batched verification of two requests): each sequence's logits are
 * bit-identical to running it alone, and committing one does not disturb the other. */
static void test_tree_two_sequences(void **state)
{
    char err[256];
    llama_model *m = llama_model_load(tu_make_model("tree", "q4_1", NULL), err, sizeof err);
    assert_non_null(m);
    int V = m->cfg.vocab;
    static const int32_t pa[] = {5, 6, 7, 8}, pb[] = {100, 101, 102};
    float *alone = malloc((size_t)4 * V * sizeof *alone), *both = malloc((size_t)8 * V * sizeof *both);
    llama_ctx_params p1 = {.n_threads = 1, .max_width = 8, .n_ctx = 32, .kv = KV_F32};
    llama_ctx_params p2 = {.n_threads = 2, .max_width = 8, .n_ctx = 32, .n_seq = 2, .kv = KV_F32};
    llama_ctx *two = llama_ctx_new(m, &p2, err, sizeof err);
    assert_non_null(two);
    /* prefixes: seq 0 gets pa[0..2), seq 1 gets pb[0..1) */
    int32_t seq0[] = {0, 0}, seq1[] = {1}, path2[] = {0, 1}, path1[] = {0};
    llama_batch b0 = {.n = 2, .tokens = pa, .seq = seq0};
    assert_int_equal(llama_forward(two, &b0, NULL, err, sizeof err), 0);
    assert_int_equal(llama_commit(two, path2, 2, err, sizeof err), 0);
    llama_batch b1 = {.n = 1, .tokens = pb, .seq = seq1};
    assert_int_equal(llama_forward(two, &b1, NULL, err, sizeof err), 0);
    assert_int_equal(llama_commit(two, path1, 1, err, sizeof err), 0);
    /* one step: chain pa[2..4) for seq 0 and chain pb[1..3) for seq 1 */
    int32_t toks[] = {7, 8, 101, 102}, par[] = {-1, 0, -1, 2}, seqs[] = {0, 0, 1, 1};
    llama_batch b = {.n = 4, .tokens = toks, .parent = par, .seq = seqs};
    assert_int_equal(llama_forward(two, &b, both, err, sizeof err), 0);
    for (int which = 0; which < 2; which++) {
        llama_ctx *one = llama_ctx_new(m, &p1, err, sizeof err);
        const int32_t *ids = which ? pb : pa;
        int n = which ? 3 : 4;
        assert_int_equal(llama_prefill(one, ids, n - 2, NULL, err, sizeof err), 0);
        llama_batch c = {.n = 2, .tokens = ids + n - 2};
        assert_int_equal(llama_forward(one, &c, alone, err, sizeof err), 0);
        for (int i = 0; i < 2; i++)
            expect_same("two-sequence batch, token", which ? "seq 1" : "seq 0", i,
                        both + (size_t)(2 * which + i) * V, alone + (size_t)i * V, V);
        llama_ctx_destroy(&one);
    }
    /* committing seq 1's chain extends only seq 1 */
    int32_t p3[] = {2, 3};
    assert_int_equal(llama_commit(two, p3, 2, err, sizeof err), 0);
    assert_int_equal(llama_ctx_seq_prefix_len(two, 0), 2);
    assert_int_equal(llama_ctx_seq_prefix_len(two, 1), 3);
    /* a path that mixes sequences is refused */
    assert_int_equal(llama_forward(two, &b, NULL, err, sizeof err), 0);
    int32_t bad[] = {0, 3};
    assert_int_equal(llama_commit(two, bad, 2, err, sizeof err), -1);
    llama_ctx_destroy(&two);
    free(alone);
    free(both);
    llama_model_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_f32),
        cmocka_unit_test(test_tree_q4_1),
        cmocka_unit_test(test_tree_bad_parent),
        cmocka_unit_test(test_tree_two_sequences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
