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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_f32),
        cmocka_unit_test(test_tree_q4_1),
        cmocka_unit_test(test_tree_bad_parent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
