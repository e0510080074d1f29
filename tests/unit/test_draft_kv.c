/*
 * tests/unit/test_draft_kv.c — a token tree grown by appended batches (what a drafter does round
 * by round: the root, then its children, then theirs, with branches) gives bit-identical logits
 * to one forward over the whole tree, for f32 and f16 KV and for a column split; committing a
 * path of the grown tree then continues exactly like sequential decoding; and appends are refused
 * with a clear error past the width or once the tree is closed. This is the property the model
 * speculator's incremental draft KV rests on: its drafts equal those of recomputing the tree.
 * A context that reads its prefix from another's K/V (prefix_src: a drafter attending to the
 * target's committed rows in the arena) grows the same tree with the same logits as the context
 * that owns those rows, reads the sequence slot it is told, and refuses to commit. A drafter's
 * screened output layer (a 4-bit copy, the best candidates recomputed exactly) picks the exact
 * head's best token with its exact logit. Keeping one path of a grown tree as the tree (a drafter
 * keeping its main branch, or the rest of a chain the target confirmed) continues exactly like
 * forwarding that chain afresh.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>

#include "model/llama.h"
#include "tests/unit/testutil.h"

static const int32_t PROMPT[] = {5, 77, 123, 9, 250, 31};
#define N_PROMPT ((int)(sizeof PROMPT / sizeof PROMPT[0]))

/* A tree in tree-index order, grown in the batches BATCH: round 0 the root (0); round 1 its
 * children 1, 2; round 2 grandchildren 3, 4 (of 1) and 5 (of 2) plus a second root 6; round 3
 * 7 (of 3), 8 (of 5), 9 (of 6); round 4 10 (of 7); round 5 11 (of 10) as a parent-less chain. */
static const int32_t TOKENS[] = {40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51};
static const int32_t PARENT[] = {-1, 0, 0, 1, 1, 2, -1, 3, 5, 6, 7, 10};
static const int BATCH[] = {1, 2, 4, 3, 1, 1}; /* tokens per appended batch */
#define N_TREE ((int)(sizeof TOKENS / sizeof TOKENS[0]))
#define N_BATCH ((int)(sizeof BATCH / sizeof BATCH[0]))
#define WIDTH 16

static llama_model *load(const char *tag, const char *type, const char *extra)
{
    char err[256];
    llama_model *m = llama_model_load(tu_make_model(tag, type, extra), err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    return m;
}

static llama_ctx *new_ctx(const llama_model *m, int width, int threads, kv_type kv)
{
    char err[256];
    llama_ctx_params p = {.n_threads = threads, .max_width = width, .n_ctx = 64, .kv = kv};
    llama_ctx *ctx = llama_ctx_new(m, &p, err, sizeof err);
    if (!ctx)
        fail_msg("%s", err);
    return ctx;
}

static void forward_ok(llama_ctx *ctx, const llama_batch *b, float *logits)
{
    char err[256];
    if (llama_forward(ctx, b, logits, err, sizeof err))
        fail_msg("forward of %d tokens%s: %s", b->n, b->append ? " (append)" : "", err);
}

/* Grow the tree batch by batch; the last batch is a chain (parent NULL). */
static void grow(llama_ctx *ctx, float *logits, int V)
{
    for (int k = 0, at = 0; k < N_BATCH; at += BATCH[k], k++) {
        bool chain = k == N_BATCH - 1;
        llama_batch b = {.n = BATCH[k],
                         .tokens = TOKENS + at,
                         .parent = chain ? NULL : PARENT + at,
                         .append = k > 0};
        forward_ok(ctx, &b, logits + (size_t)at * V);
    }
}

static void expect_same(const char *what, const char *type, const char *kv, int node,
                        const float *got, const float *want, int V)
{
    if (memcmp(got, want, (size_t)V * sizeof *got))
        fail_msg("%s, %s KV: %s %d: logits differ (relative L2 %.3g)", type, kv, what, node,
                 tu_rel_l2(got, want, (size_t)V));
}

static void check_append(const char *type, kv_type kv)
{
    const char *kvs = kv == KV_F16 ? "f16" : "f32";
    char err[256];
    llama_model *m = load("draftkv", type, NULL);
    int V = m->cfg.vocab;
    float *whole = malloc((size_t)N_TREE * V * sizeof *whole);
    float *grown = malloc((size_t)N_TREE * V * sizeof *grown),
          *seq = malloc((size_t)V * sizeof *seq);

    llama_ctx *ref = new_ctx(m, WIDTH, 2, kv);
    assert_int_equal(llama_prefill(ref, PROMPT, N_PROMPT, NULL, err, sizeof err), 0);
    llama_batch all = {.n = N_TREE, .tokens = TOKENS, .parent = PARENT};
    forward_ok(ref, &all, whole);

    llama_ctx *ctx = new_ctx(m, WIDTH, 2, kv);
    assert_int_equal(llama_prefill(ctx, PROMPT, N_PROMPT, NULL, err, sizeof err), 0);
    grow(ctx, grown, V);
    for (int i = 0; i < N_TREE; i++)
        expect_same("appended node", type, kvs, i, grown + (size_t)i * V, whole + (size_t)i * V, V);

    /* logits_from counts within the appended batch: only the new tokens' rows come back */
    llama_batch one = {.n = 2, .tokens = TOKENS, .parent = (const int32_t[]){-1, 0}};
    forward_ok(ctx, &one, grown);
    llama_batch tail = {.n = 2,
                        .tokens = TOKENS + 2,
                        .parent = (const int32_t[]){0, 2},
                        .logits_from = 1,
                        .append = true};
    forward_ok(ctx, &tail, grown);
    llama_batch w4 = {.n = 4, .tokens = TOKENS, .parent = (const int32_t[]){-1, 0, 0, 2}};
    forward_ok(ref, &w4, whole);
    expect_same("logits_from of an append, node", type, kvs, 3, grown, whole + (size_t)3 * V, V);

    /* commit root -> 2 -> 5 -> 8 of the grown tree, then one more token: as sequential */
    grow(ctx, grown, V);
    int32_t path[] = {0, 2, 5, 8};
    assert_int_equal(llama_commit(ctx, path, 4, err, sizeof err), 0);
    assert_int_equal(llama_ctx_prefix_len(ctx), N_PROMPT + 4);
    int32_t next = 99, zero = 0;
    llama_batch nb = {.n = 1, .tokens = &next};
    forward_ok(ctx, &nb, grown);
    llama_ctx *sc = new_ctx(m, 8, 1, kv);
    int32_t ids[N_PROMPT + 5];
    memcpy(ids, PROMPT, sizeof PROMPT);
    for (int i = 0; i < 4; i++)
        ids[N_PROMPT + i] = TOKENS[path[i]];
    ids[N_PROMPT + 4] = next;
    for (int i = 0; i < N_PROMPT + 5; i++) {
        llama_batch b = {.n = 1, .tokens = &ids[i]};
        forward_ok(sc, &b, seq);
        assert_int_equal(llama_commit(sc, &zero, 1, err, sizeof err), 0);
    }
    expect_same("after committing an appended path, token", type, kvs, 0, grown, seq, V);

    llama_ctx_destroy(&sc);
    llama_ctx_destroy(&ctx);
    llama_ctx_destroy(&ref);
    free(whole);
    free(grown);
    free(seq);
    llama_model_destroy(&m);
}

static void test_draft_kv_f32(void **state)
{
    (void)state;
    check_append("f32", KV_F32);
    check_append("f32", KV_F16);
}

static void test_draft_kv_quantized(void **state)
{
    (void)state;
    check_append("q4_1", KV_F32);
    check_append("q8_0", KV_F16);
}

/* Appends are refused, with a message saying why, past the width and once the tree is closed;
 * a refused append leaves the tree as it was. */
static void test_draft_kv_refused(void **state)
{
    (void)state;
    char err[256];
    llama_model *m = load("draftkv", "f32", NULL);
    int V = m->cfg.vocab;
    float *lg = malloc((size_t)4 * V * sizeof *lg), *again = malloc((size_t)V * sizeof *again);
    llama_ctx *ctx = new_ctx(m, 4, 1, KV_F32);
    int32_t toks[] = {1, 2, 3, 4, 5};
    llama_batch app = {.n = 1, .tokens = toks, .append = true};
    assert_int_equal(llama_forward(ctx, &app, NULL, err, sizeof err), -1); /* nothing to grow */
    assert_non_null(strstr(err, "append"));
    llama_batch root = {.n = 3, .tokens = toks};
    forward_ok(ctx, &root, lg);
    llama_batch wide = {.n = 2, .tokens = toks + 3, .append = true};
    assert_int_equal(llama_forward(ctx, &wide, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "width"));
    int32_t self[] = {3};
    llama_batch bad = {.n = 1, .tokens = toks + 3, .parent = self, .append = true};
    assert_int_equal(llama_forward(ctx, &bad, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "parent"));
    llama_batch fits = {
        .n = 1, .tokens = toks + 3, .append = true}; /* still open, still 3 tokens */
    forward_ok(ctx, &fits, again);
    int32_t path[] = {0, 1, 2, 3};
    assert_int_equal(llama_commit(ctx, path, 4, err, sizeof err), 0);
    assert_int_equal(llama_forward(ctx, &app, NULL, err, sizeof err), -1); /* committed: closed */
    assert_non_null(strstr(err, "append"));
    forward_ok(ctx, &root, lg);
    llama_ctx_set_prefix_len(ctx, 2);
    assert_int_equal(llama_forward(ctx, &app, NULL, err, sizeof err),
                     -1); /* prefix moved: closed */
    assert_non_null(strstr(err, "append"));
    llama_ctx_destroy(&ctx);
    free(lg);
    free(again);
    llama_model_destroy(&m);
}

/* A drafter context reading its prefix from owner's K/V (64 positions per slot, WIDTH tree rows,
 * n_seq slots). */
static llama_ctx_params drafter_params(const llama_ctx *owner, int n_seq)
{
    return (llama_ctx_params){.n_threads = 2,
                              .max_width = WIDTH,
                              .n_ctx = 64,
                              .kv = KV_F32,
                              .prefix_src = llama_ctx_shared(owner),
                              .prefix_src_n_ctx = 64,
                              .prefix_src_max_width = WIDTH,
                              .prefix_src_n_seq = n_seq};
}

/* The drafter of a re-quantized copy reads the target's committed K/V in place: a context whose
 * prefix is another context's (slot 1 of a two-slot cache) grows the tree to the same logits as the
 * owner, bit for bit, since the keys and values it attends to are the same rows. */
static void test_draft_kv_prefix_source(void **state)
{
    (void)state;
    char err[256];
    llama_model *m = load("draftkv", "q4_1", NULL);
    int V = m->cfg.vocab;
    float *want = malloc((size_t)N_TREE * V * sizeof *want);
    float *got = malloc((size_t)N_TREE * V * sizeof *got);
    /* the owner: two sequence slots, the prompt in slot 1, something else in slot 0 */
    llama_ctx_params op = {.n_threads = 2, .max_width = WIDTH, .n_ctx = 64, .n_seq = 2};
    llama_ctx *owner = llama_ctx_new(m, &op, err, sizeof err);
    assert_non_null(owner);
    int32_t seq1[WIDTH], other[] = {7, 8, 9};
    for (int i = 0; i < WIDTH; i++)
        seq1[i] = 1;
    llama_batch b0 = {.n = 3, .tokens = other};
    forward_ok(owner, &b0, NULL);
    int32_t p3[] = {0, 1, 2};
    assert_int_equal(llama_commit(owner, p3, 3, err, sizeof err), 0);
    llama_batch b1 = {.n = N_PROMPT, .tokens = PROMPT, .seq = seq1};
    forward_ok(owner, &b1, NULL);
    int32_t pp[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        pp[i] = i;
    assert_int_equal(llama_commit(owner, pp, N_PROMPT, err, sizeof err), 0);
    /* the reference: a private context with the same prompt committed */
    llama_ctx *ref = new_ctx(m, WIDTH, 2, KV_F32);
    assert_int_equal(llama_prefill(ref, PROMPT, N_PROMPT, NULL, err, sizeof err), 0);
    llama_batch all = {.n = N_TREE, .tokens = TOKENS, .parent = PARENT};
    forward_ok(ref, &all, want);

    llama_ctx_params dp = drafter_params(owner, 2);
    llama_ctx *drafter = llama_ctx_new(m, &dp, err, sizeof err);
    assert_non_null(drafter);
    llama_ctx_set_prefix_source_seq(drafter, 1);
    llama_ctx_set_prefix_len(drafter, N_PROMPT);
    grow(drafter, got, V);
    for (int i = 0; i < N_TREE; i++)
        expect_same("prefix source, node", "q4_1", "f32", i, got + (size_t)i * V,
                    want + (size_t)i * V, V);
    /* slot 0 holds other tokens: reading it gives other logits */
    llama_ctx_set_prefix_source_seq(drafter, 0);
    forward_ok(drafter, &all, got);
    assert_true(memcmp(got, want, (size_t)V * sizeof *got) != 0);
    /* two requests in one batch: the drafter's slot 0 reads the owner's slot 1, its slot 1 the
     * owner's slot 0; each tree's logits are those of the same tree drafted alone */
    enum { HALF = 6 };
    float *other_want = malloc((size_t)HALF * V * sizeof *other_want);
    llama_ctx_set_prefix_len(drafter, 3);
    llama_batch half = {.n = HALF, .tokens = TOKENS, .parent = PARENT};
    forward_ok(drafter, &half, other_want); /* alone: slot 0 reading the owner's slot 0 */
    llama_ctx_params dp2 = drafter_params(owner, 2);
    dp2.n_seq = 2;
    llama_ctx *two = llama_ctx_new(m, &dp2, err, sizeof err);
    assert_non_null(two);
    llama_ctx_map_prefix_source(two, 0, 1);
    llama_ctx_map_prefix_source(two, 1, 0);
    llama_ctx_set_seq_prefix_len(two, 0, N_PROMPT);
    llama_ctx_set_seq_prefix_len(two, 1, 3);
    int32_t tok2[2 * HALF], par2[2 * HALF], seq2[2 * HALF];
    for (int i = 0; i < HALF; i++) {
        tok2[i] = tok2[HALF + i] = TOKENS[i];
        par2[i] = PARENT[i];
        par2[HALF + i] = PARENT[i] < 0 ? -1 : PARENT[i] + HALF;
        seq2[i] = 0;
        seq2[HALF + i] = 1;
    }
    llama_batch both = {.n = 2 * HALF, .tokens = tok2, .parent = par2, .seq = seq2};
    forward_ok(two, &both, got);
    for (int i = 0; i < HALF; i++) {
        expect_same("two requests, the first", "q4_1", "f32", i, got + (size_t)i * V,
                    want + (size_t)i * V, V);
        expect_same("two requests, the second", "q4_1", "f32", i, got + (size_t)(HALF + i) * V,
                    other_want + (size_t)i * V, V);
    }
    llama_ctx_destroy(&two);
    free(other_want);
    /* its prefix is not its own to change */
    int32_t root[] = {0};
    assert_int_equal(llama_commit(drafter, root, 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "another"));
    /* a prefix source with several parts, or without its layout, is refused */
    dp.n_parts = 2;
    assert_null(llama_ctx_new(m, &dp, err, sizeof err));
    assert_non_null(strstr(err, "prefix source"));
    llama_ctx_destroy(&drafter);
    llama_ctx_destroy(&ref);
    llama_ctx_destroy(&owner);
    free(want);
    free(got);
    llama_model_destroy(&m);
}

/* The screened lm_head: every row's best token is the exact head's, with the exact logit (to float
 * rounding); contexts without screen_top keep the exact head; screen_top without a screening head
 * is refused. */
static void test_draft_kv_screened_head(void **state)
{
    (void)state;
    char err[256];
    llama_model *m = load("draftkv-screen", "q8_0", "--layers 2 --dim 128 --ffn 256 --heads 4 "
                                                     "--kv-heads 2 --vocab 3000 --ctx 64");
    int V = m->cfg.vocab;
    llama_ctx_params sp = {.n_threads = 2, .max_width = WIDTH, .n_ctx = 64, .screen_top = 8};
    assert_null(llama_ctx_new(m, &sp, err, sizeof err));
    assert_non_null(strstr(err, "screening head"));
    assert_int_equal(llama_model_screen_head(m, KT_Q8_0, err, sizeof err), -1);
    assert_int_equal(llama_model_screen_head(m, KT_Q4_0, err, sizeof err), 0);
    float *want = malloc((size_t)N_TREE * V * sizeof *want);
    float *got = malloc((size_t)N_TREE * V * sizeof *got);
    llama_ctx *exact = new_ctx(m, WIDTH, 2, KV_F32);
    llama_ctx *screened = llama_ctx_new(m, &sp, err, sizeof err);
    assert_non_null(screened);
    llama_batch all = {.n = N_TREE, .tokens = TOKENS, .parent = PARENT};
    forward_ok(exact, &all, want);
    forward_ok(screened, &all, got);
    int differ = 0;
    for (int i = 0; i < N_TREE; i++) {
        const float *w = want + (size_t)i * V, *g = got + (size_t)i * V;
        int32_t a = sampler_argmax(w, V), b = sampler_argmax(g, V);
        if (a != b)
            fail_msg("node %d: screened best %d (%g), exact best %d (%g)", i, b, g[b], a, w[a]);
        assert_float_equal(g[a], w[a], 1e-3 * (fabsf(w[a]) + 1));
        for (int v = 0; v < V; v++)
            differ += g[v] != w[v];
    }
    assert_true(differ > 0); /* the rest of the row is the 4-bit screen's */
    llama_ctx_destroy(&screened);
    llama_ctx_destroy(&exact);
    free(want);
    free(got);
    llama_model_destroy(&m);
}

/* llama_tree_keep_path: a path of the grown tree kept as the whole tree (drop 0), or with its
 * first tokens handed to the prefix (drop 2: a prefix source that has committed them), then one
 * more token appended: its logits equal those of forwarding the chain afresh. Not-a-path is
 * refused. */
static void test_draft_kv_keep_path(void **state)
{
    (void)state;
    char err[256];
    llama_model *m = load("draftkv", "q4_1", NULL);
    int V = m->cfg.vocab;
    float *lg = malloc((size_t)N_TREE * V * sizeof *lg), *want = malloc((size_t)V * sizeof *want);
    /* root 0 -> 2 -> 5 -> 8 is a path of the tree (PARENT) */
    int32_t path[] = {0, 2, 5, 8}, next = 99;
    int32_t chain[] = {TOKENS[0], TOKENS[2], TOKENS[5], TOKENS[8], 99};
    llama_ctx *ref = new_ctx(m, WIDTH, 2, KV_F32);
    assert_int_equal(llama_prefill(ref, PROMPT, N_PROMPT, NULL, err, sizeof err), 0);
    llama_batch all5 = {.n = 5, .tokens = chain, .logits_from = 4};
    forward_ok(ref, &all5, want);

    llama_ctx *ctx = new_ctx(m, WIDTH, 2, KV_F32);
    assert_int_equal(llama_prefill(ctx, PROMPT, N_PROMPT, NULL, err, sizeof err), 0);
    grow(ctx, lg, V);
    int32_t bad[] = {0, 2, 4}; /* 4 is a child of 1, not of 2 */
    assert_int_equal(llama_tree_keep_path(ctx, bad, 3, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "path"));
    assert_int_equal(llama_tree_keep_path(ctx, path, 4, 0, err, sizeof err), 0);
    llama_batch one = {.n = 1, .tokens = &next, .append = true};
    forward_ok(ctx, &one, lg);
    expect_same("kept path + 1, token", "q4_1", "f32", 4, lg, want, V);

    /* drop 2: a drafter reading an owner's prefix, after the owner committed root and node 2 */
    llama_ctx *owner = new_ctx(m, WIDTH, 2, KV_F32);
    assert_int_equal(llama_prefill(owner, PROMPT, N_PROMPT, NULL, err, sizeof err), 0);
    llama_ctx_params dp = drafter_params(owner, 1);
    llama_ctx *drafter = llama_ctx_new(m, &dp, err, sizeof err);
    assert_non_null(drafter);
    llama_ctx_set_prefix_len(drafter, N_PROMPT);
    grow(drafter, lg, V);
    assert_int_equal(llama_prefill(owner, chain, 2, NULL, err, sizeof err), 0);
    assert_int_equal(llama_tree_keep_path(drafter, path, 4, 2, err, sizeof err), 0);
    assert_int_equal(llama_ctx_prefix_len(drafter), N_PROMPT + 2);
    forward_ok(drafter, &one, lg);
    expect_same("kept path (2 dropped) + 1, token", "q4_1", "f32", 4, lg, want, V);
    llama_ctx_destroy(&drafter);
    llama_ctx_destroy(&owner);
    llama_ctx_destroy(&ctx);
    llama_ctx_destroy(&ref);
    free(lg);
    free(want);
    llama_model_destroy(&m);
}

/* A column split grows the tree the same way: each part gets the same batches. */
typedef struct {
    llama_model *m;
    int part, n_parts;
    void *shared;
    pthread_barrier_t *barrier;
    float *logits;
    bool append;
    int rc;
    char err[256];
} part_arg;

static void *part_run(void *argp)
{
    part_arg *a = argp;
    int V = a->m->cfg.vocab;
    llama_ctx_params p = {.n_threads = 1,
                          .max_width = WIDTH,
                          .n_ctx = 32,
                          .kv = KV_F16,
                          .part = a->part,
                          .n_parts = a->n_parts,
                          .shared = a->shared,
                          .sync = tu_barrier_sync,
                          .sync_arg = a->barrier};
    llama_ctx *ctx = llama_ctx_new(a->m, &p, a->err, sizeof a->err);
    if (!ctx) {
        a->rc = -1;
        return NULL;
    }
    a->rc = llama_prefill(ctx, PROMPT, N_PROMPT, NULL, a->err, sizeof a->err);
    if (!a->append) {
        llama_batch b = {.n = N_TREE, .tokens = TOKENS, .parent = PARENT};
        if (!a->rc)
            a->rc = llama_forward(ctx, &b, a->logits, a->err, sizeof a->err);
    }
    for (int k = 0, at = 0; a->append && !a->rc && k < N_BATCH; at += BATCH[k], k++) {
        llama_batch b = {
            .n = BATCH[k], .tokens = TOKENS + at, .parent = PARENT + at, .append = k > 0};
        a->rc = llama_forward(ctx, &b, a->logits + (size_t)at * V, a->err, sizeof a->err);
        /* a part may still read the shared activations for its logits: the next batch waits (the
         * workers' step barrier does this between steps) */
        tu_barrier_sync(a->barrier);
    }
    llama_ctx_destroy(&ctx);
    return NULL;
}

static void run_parts(llama_model *m, int n_parts, bool append, float *logits)
{
    size_t bytes = llama_shared_layout(&m->cfg, 32, WIDTH, 1, KV_F16, NULL);
    void *shared = calloc(1, bytes);
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)n_parts);
    part_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < n_parts; i++) {
        args[i] = (part_arg){.m = m,
                             .part = i,
                             .n_parts = n_parts,
                             .shared = shared,
                             .barrier = &barrier,
                             .logits = logits,
                             .append = append};
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

static void test_draft_kv_parts(void **state)
{
    (void)state;
    llama_model *m =
        load("draftkv-parts", "q4_1",
             "--layers 2 --dim 96 --ffn 160 --heads 6 --kv-heads 3 --vocab 301 --ctx 64");
    size_t n = (size_t)N_TREE * m->cfg.vocab;
    float *ref = calloc(n, 4), *got = calloc(n, 4);
    run_parts(m, 1, false, ref);
    for (int parts = 1; parts <= 3; parts++) {
        memset(got, 0, n * 4);
        run_parts(m, parts, true, got);
        if (memcmp(ref, got, n * 4))
            fail_msg("%d parts: the appended tree's logits differ from the whole tree's (relative "
                     "L2 %.3g)",
                     parts, tu_rel_l2(got, ref, n));
    }
    free(ref);
    free(got);
    llama_model_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_draft_kv_f32),
        cmocka_unit_test(test_draft_kv_quantized),
        cmocka_unit_test(test_draft_kv_refused),
        cmocka_unit_test(test_draft_kv_prefix_source),
        cmocka_unit_test(test_draft_kv_screened_head),
        cmocka_unit_test(test_draft_kv_keep_path),
        cmocka_unit_test(test_draft_kv_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
