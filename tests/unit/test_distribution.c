/*
 * tests/unit/test_distribution.c — speculative sampling emits tokens with exactly the distribution
 * of sequential sampling, end to end on a real (tiny, random) model.
 *
 * The sampled object is the joint distribution of the first 3 tokens after a fixed prompt, with
 * temperature 1 and top-k 3 so that it has at most 27 cells and a chi-square on it is meaningful
 * with 20000 samples per side:
 *   (a) sequential: llama_forward one token at a time, sampler_sample on each row;
 *   (b) speculative: a drafter (the target with its second layer skipped, llama_model_keep_layers)
 *       proposes either a CHAIN of 3 tokens (its argmax) or a TREE (top-2 children at each of two
 *       levels plus one more level under the first: 8 nodes with the root); the target computes
 *       logits for every node in ONE llama_forward with parents, verify_sample picks the path and
 *       the next token, llama_commit keeps the path, and steps repeat until 3 tokens exist.
 * A two-sample chi-square test of homogeneity compares (b) against (a); both chain and tree must
 * give p > 0.01. So that the test cannot pass vacuously, the speculative runs must have accepted
 * drafts, and two deliberately wrong verifiers (one accepting every first child, one forgetting to
 * remove rejected mass) must FAIL the same test: the test has power against exactly the mistakes
 * a verifier is likely to make.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "coordinator/verify.h"
#include "model/llama.h"
#include "tests/unit/chi2.h"
#include "tests/unit/testutil.h"

enum { DIST_SAMPLES = 20000, DIST_TOKENS = 3, DIST_MAX_CELLS = 4096 };
static const int32_t DIST_PROMPT[] = {1, 17, 42, 99, 5, 250, 7, 64};
#define DIST_N_PROMPT ((int)(sizeof DIST_PROMPT / sizeof DIST_PROMPT[0]))
#define DIST_TEMP 1.0f
#define DIST_TOP_K 3

/* A verifier: verify_sample or one of the broken ones below. */
typedef int (*dist_verifier)(const verify_tree *t, const float *logits, int V, sampler *s, void *work,
                             verify_result *r);

typedef struct {
    llama_model *target, *draft;
    llama_ctx *tc, *dc;
    int V;
    float *tlog, *dlog, *work;
} dist_env;

static const char *dist_make_model(const char *tag, int seed)
{
    static char path[512];
    const char *bin = getenv("OROCHI_BIN"), *tmp = getenv("OROCHI_TMP");
    if (!bin || !tmp)
        fail_msg("OROCHI_BIN and OROCHI_TMP must be set (ctest sets them)");
    snprintf(path, 512, "%s/unit-distribution-%s.gguf", tmp, tag);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' mkmodel --out '%s' --layers 2 --dim 64 --ffn 128 --heads 4 --kv-heads 2 --vocab 300 "
             "--ctx 64 --type f32 --seed %d 2>/dev/null",
             bin, path, seed);
    if (system(cmd) != 0)
        fail_msg("mkmodel failed: %s", cmd);
    return path;
}

static llama_ctx *dist_ctx(const llama_model *m)
{
    char err[256];
    llama_ctx_params p = {.n_threads = 1, .max_width = 16, .n_ctx = 64};
    llama_ctx *c = llama_ctx_new(m, &p, err, sizeof err);
    if (!c)
        fail_msg("llama_ctx_new: %s", err);
    return c;
}

static void dist_setup(dist_env *e)
{
    char err[256];
    const char *path = dist_make_model("target", 3);
    e->target = llama_model_load(path, err, sizeof err);
    if (!e->target)
        fail_msg("%s", err);
    /* the drafter: the target with its second layer skipped (self-speculation); a separate random
     * model with the same vocabulary would agree with the target's top-3 too rarely to test much */
    e->draft = llama_model_load(path, err, sizeof err);
    const int keep = 0;
    if (!e->draft || llama_model_keep_layers(e->draft, &keep, 1, err, sizeof err))
        fail_msg("%s", err);
    e->V = e->target->cfg.vocab;
    assert_int_equal(e->draft->cfg.vocab, e->V);
    e->tc = dist_ctx(e->target);
    e->dc = dist_ctx(e->draft);
    e->tlog = malloc((size_t)VERIFY_MAX * e->V * sizeof *e->tlog);
    e->dlog = malloc((size_t)VERIFY_MAX * e->V * sizeof *e->dlog);
    e->work = malloc((size_t)3 * e->V * sizeof *e->work);
    assert_true(e->tlog && e->dlog && e->work);
}

static void dist_teardown(dist_env *e)
{
    llama_ctx_destroy(&e->tc);
    llama_ctx_destroy(&e->dc);
    llama_model_destroy(&e->target);
    llama_model_destroy(&e->draft);
    free(e->tlog);
    free(e->dlog);
    free(e->work);
}

static void dist_forward(llama_ctx *c, int n, const int32_t *tok, const int32_t *par, int from, float *out)
{
    char err[256];
    llama_batch b = {.n = n, .tokens = tok, .parent = par, .logits_from = from};
    if (llama_forward(c, &b, out, err, sizeof err))
        fail_msg("llama_forward: %s", err);
}

static void dist_commit(llama_ctx *c, const int32_t *path, int n)
{
    char err[256];
    if (llama_commit(c, path, n, err, sizeof err))
        fail_msg("llama_commit: %s", err);
}

/* (a) sequential sampling: out[i * 3 + j] = token j of sample i. */
static void dist_sequential(dist_env *e, uint64_t seed, int32_t *out)
{
    char err[256];
    int V = e->V;
    float *first = malloc((size_t)V * sizeof *first);
    llama_ctx_reset(e->tc);
    if (llama_prefill(e->tc, DIST_PROMPT, DIST_N_PROMPT, first, err, sizeof err))
        fail_msg("prefill: %s", err);
    sampler s;
    sampler_init(&s, DIST_TEMP, DIST_TOP_K, 1.0f, seed);
    const int32_t zero = 0;
    for (int i = 0; i < DIST_SAMPLES; i++) {
        llama_ctx_set_prefix_len(e->tc, DIST_N_PROMPT);
        int32_t *o = out + (size_t)i * DIST_TOKENS;
        o[0] = sampler_sample(&s, first, V, e->work);
        for (int j = 1; j < DIST_TOKENS; j++) {
            dist_forward(e->tc, 1, &o[j - 1], NULL, 0, e->tlog);
            dist_commit(e->tc, &zero, 1);
            o[j] = sampler_sample(&s, e->tlog, V, e->work);
        }
    }
    free(first);
}

/* The two highest logits (lowest id first on ties). */
static void dist_top2(const float *row, int V, int32_t *a, int32_t *b)
{
    *a = sampler_argmax(row, V);
    *b = *a == 0 ? 1 : 0;
    for (int t = 0; t < V; t++)
        if (t != *a && row[t] > row[*b])
            *b = t;
}

/* The drafter, from the committed context seq[0..n_seq) (the last token is the root): its prefix is
 * set back to the prompt's and the generated tokens are fed in the forward that gives its logits
 * after the root; then a chain (its argmax, 3 deep) or a tree (top-2 at two levels, then the argmax
 * under the first grandchild). Returns the node count; tok/par receive the tree, root first. */
static int dist_draft(dist_env *e, bool tree, const int32_t *seq, int n_seq, int32_t *tok, int32_t *par)
{
    int V = e->V, base = DIST_N_PROMPT - 1;
    int pending = n_seq - 1 - base; /* generated tokens before the root */
    llama_ctx_set_prefix_len(e->dc, base);
    dist_forward(e->dc, pending + 1, seq + base, NULL, pending, e->dlog);
    int32_t path[VERIFY_MAX];
    for (int i = 0; i < pending; i++)
        path[i] = i;
    dist_commit(e->dc, path, pending);
    tok[0] = seq[n_seq - 1];
    par[0] = -1;
    if (!tree) {
        tok[1] = sampler_argmax(e->dlog, V);
        for (int i = 1; i <= 2; i++) {
            par[i] = i - 1;
            dist_forward(e->dc, i + 1, tok, NULL, 0, e->dlog);
            tok[i + 1] = sampler_argmax(e->dlog + (size_t)i * V, V);
        }
        par[3] = 2;
        return 4;
    }
    dist_top2(e->dlog, V, &tok[1], &tok[2]);
    par[1] = par[2] = 0;
    dist_forward(e->dc, 3, tok, par, 0, e->dlog);
    dist_top2(e->dlog + (size_t)1 * V, V, &tok[3], &tok[4]);
    dist_top2(e->dlog + (size_t)2 * V, V, &tok[5], &tok[6]);
    par[3] = par[4] = 1;
    par[5] = par[6] = 2;
    dist_forward(e->dc, 7, tok, par, 0, e->dlog);
    tok[7] = sampler_argmax(e->dlog + (size_t)3 * V, V);
    par[7] = 3;
    return 8;
}

/* Drafts are a deterministic function of the context, and only a handful of contexts occur (the
 * generated tokens so far, fewer than 3 of them), so they are computed once per context and kept:
 * the target's forward, the verification and the commit still run for every step. */
enum { DIST_MEMO = 1024 };
typedef struct {
    int n;
    struct {
        int n_gen, n_tree;
        int32_t gen[DIST_TOKENS], tok[8], par[8];
    } e[DIST_MEMO];
} dist_memo;

static int dist_draft_cached(dist_env *e, dist_memo *m, bool tree, const int32_t *seq, int n_seq,
                             int32_t *tok, int32_t *par)
{
    int n_gen = n_seq - DIST_N_PROMPT;
    const int32_t *gen = seq + DIST_N_PROMPT;
    for (int i = 0; i < m->n; i++)
        if (m->e[i].n_gen == n_gen && !memcmp(m->e[i].gen, gen, (size_t)n_gen * sizeof *gen)) {
            memcpy(tok, m->e[i].tok, (size_t)m->e[i].n_tree * sizeof *tok);
            memcpy(par, m->e[i].par, (size_t)m->e[i].n_tree * sizeof *par);
            return m->e[i].n_tree;
        }
    int n = dist_draft(e, tree, seq, n_seq, tok, par);
    if (m->n < DIST_MEMO) {
        m->e[m->n].n_gen = n_gen;
        m->e[m->n].n_tree = n;
        memcpy(m->e[m->n].gen, gen, (size_t)n_gen * sizeof *gen);
        memcpy(m->e[m->n].tok, tok, (size_t)n * sizeof *tok);
        memcpy(m->e[m->n].par, par, (size_t)n * sizeof *par);
        m->n++;
    }
    return n;
}

typedef struct {
    long steps, accepted;
    long by_accepted[VERIFY_MAX]; /* steps by the number of drafts they accepted */
} dist_stats;

/* (b) speculative sampling with `verify`; out as for dist_sequential. */
static void dist_speculative(dist_env *e, bool tree, dist_verifier verify, uint64_t seed, int32_t *out,
                             dist_stats *st)
{
    char err[256];
    int V = e->V, base = DIST_N_PROMPT - 1;
    /* both models hold the prompt but its last token, which is the first step's root */
    llama_ctx_reset(e->tc);
    llama_ctx_reset(e->dc);
    if (llama_prefill(e->tc, DIST_PROMPT, base, NULL, err, sizeof err) ||
        llama_prefill(e->dc, DIST_PROMPT, base, NULL, err, sizeof err))
        fail_msg("prefill: %s", err);
    sampler s;
    sampler_init(&s, DIST_TEMP, DIST_TOP_K, 1.0f, seed);
    memset(st, 0, sizeof *st);
    dist_memo *memo = calloc(1, sizeof *memo);
    assert_non_null(memo);
    for (int i = 0; i < DIST_SAMPLES; i++) {
        llama_ctx_set_prefix_len(e->tc, base);
        int32_t seq[DIST_N_PROMPT + VERIFY_MAX + DIST_TOKENS];
        memcpy(seq, DIST_PROMPT, sizeof DIST_PROMPT);
        int n_seq = DIST_N_PROMPT, produced = 0;
        while (produced < DIST_TOKENS) {
            int32_t tok[VERIFY_MAX], par[VERIFY_MAX];
            int n = dist_draft_cached(e, memo, tree, seq, n_seq, tok, par);
            dist_forward(e->tc, n, tok, par, 0, e->tlog);
            verify_tree t = {n, tok, par};
            verify_result r;
            assert_int_equal(verify(&t, e->tlog, V, &s, e->work, &r), 0);
            int32_t path[VERIFY_MAX];
            for (int j = 0; j < r.n_path; j++)
                path[j] = r.path[j];
            dist_commit(e->tc, path, r.n_path);
            n_seq += verify_emit(&t, &r, seq + n_seq);
            produced += r.n_path;
            st->steps++;
            st->accepted += r.n_path - 1;
            st->by_accepted[r.n_path - 1]++;
        }
        memcpy(out + (size_t)i * DIST_TOKENS, seq + DIST_N_PROMPT, DIST_TOKENS * sizeof *out);
    }
    free(memo);
}

/* Broken verifier 1: accepts the first child at every node with probability 1, then draws the next
 * token from the leaf's distribution. */
static int dist_accept_all(const verify_tree *t, const float *logits, int V, sampler *s, void *work,
                           verify_result *r)
{
    float *p = work;
    int node = 0;
    r->path[0] = 0;
    r->n_path = 1;
    for (;;) {
        int child = -1;
        for (int i = node + 1; i < t->n && child < 0; i++)
            if (t->parent[i] == node)
                child = i;
        if (child < 0)
            break;
        r->path[r->n_path++] = child;
        node = child;
    }
    sampler_probs(s, logits + (size_t)node * V, V, p, p + V);
    r->next = sampler_draw(s, p, V);
    return 0;
}

/* Broken verifier 2: accepts child c with probability p(c) but never removes rejected mass: later
 * siblings and the correction token are drawn against the full p (the classic residual bug). */
static int dist_no_residual(const verify_tree *t, const float *logits, int V, sampler *s, void *work,
                            verify_result *r)
{
    float *p = work;
    int node = 0;
    r->path[0] = 0;
    r->n_path = 1;
    for (;;) {
        sampler_probs(s, logits + (size_t)node * V, V, p, p + V);
        int child = -1;
        for (int i = node + 1; i < t->n && child < 0; i++)
            if (t->parent[i] == node && sampler_uniform(s) < p[t->tokens[i]])
                child = i;
        if (child < 0)
            break;
        r->path[r->n_path++] = child;
        node = child;
    }
    r->next = sampler_draw(s, p, V);
    return 0;
}

/* Two-sample chi-square of the joint distribution of the 3 tokens: cells are the distinct triples
 * seen in either sample. Returns the p-value. */
static double dist_compare(const char *what, const int32_t *a, const int32_t *b)
{
    static int32_t key[DIST_MAX_CELLS][DIST_TOKENS];
    static uint64_t ca[DIST_MAX_CELLS], cb[DIST_MAX_CELLS];
    int cells = 0;
    for (int side = 0; side < 2; side++) {
        const int32_t *smp = side ? b : a;
        for (int i = 0; i < DIST_SAMPLES; i++) {
            const int32_t *tri = smp + (size_t)i * DIST_TOKENS;
            int c = 0;
            while (c < cells && memcmp(key[c], tri, sizeof key[c]))
                c++;
            if (c == cells) {
                assert_true(cells < DIST_MAX_CELLS);
                memcpy(key[c], tri, sizeof key[c]);
                ca[c] = cb[c] = 0;
                cells++;
            }
            (side ? cb : ca)[c]++;
        }
    }
    double x;
    int dof;
    double p = verify_chi2_homogeneity(ca, cb, cells, &x, &dof);
    printf("%-34s %3d cells  chi2 %9.2f  dof %2d  p %.3g\n", what, cells, x, dof, p);
    return p;
}

static double dist_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_distribution(void **state)
{
    (void)state;
    dist_env e;
    dist_setup(&e);
    int32_t *seq = malloc((size_t)DIST_SAMPLES * DIST_TOKENS * sizeof *seq);
    int32_t *spec = malloc((size_t)DIST_SAMPLES * DIST_TOKENS * sizeof *spec);
    assert_true(seq && spec);
    double t0 = dist_now();
    dist_sequential(&e, 1, seq);
    printf("sequential: %d samples of %d tokens in %.1f s\n", DIST_SAMPLES, DIST_TOKENS, dist_now() - t0);

    static const struct {
        const char *name;
        bool tree;
        dist_verifier verify;
        bool correct;
    } runs[] = {
        {"chain, verify_sample", false, verify_sample, true},
        {"tree, verify_sample", true, verify_sample, true},
        {"chain, broken: accept all", false, dist_accept_all, false},
        {"tree, broken: no residual", true, dist_no_residual, false},
    };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        dist_stats st;
        t0 = dist_now();
        dist_speculative(&e, runs[k].tree, runs[k].verify, 2 + k, spec, &st);
        printf("%s: %ld steps, %.3f accepted drafts per step (steps accepting 0/1/2/3: %ld/%ld/%ld/%ld), "
               "%.1f s\n", runs[k].name, st.steps, (double)st.accepted / st.steps, st.by_accepted[0],
               st.by_accepted[1], st.by_accepted[2], st.by_accepted[3], dist_now() - t0);
        double p = dist_compare(runs[k].name, seq, spec);
        assert_true(st.accepted > 0);
        if (runs[k].correct)
            assert_true(st.by_accepted[2] > 0); /* paths two drafts deep were exercised too */
        if (runs[k].correct && !(p > 0.01))
            fail_msg("%s: speculative sampling differs from sequential (p = %.3g)", runs[k].name, p);
        if (!runs[k].correct && !(p < 0.01))
            fail_msg("%s: a broken verifier passed (p = %.3g): the test has no power", runs[k].name, p);
    }
    free(seq);
    free(spec);
    dist_teardown(&e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
