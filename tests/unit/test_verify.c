/*
 * tests/unit/test_verify.c — the verification library on hand-made logits, where the right answer
 * is known exactly.
 *
 * - the sampler: draws are the same as a straightforward full-sort sampler's for the same seed
 *   (partial selection must not change results), and sampler_probs is the distribution
 *   sampler_sample draws from (exact values, and a chi-square on 200k draws);
 * - greedy verification: a chain all accepted, rejected at the first and in the middle, a tree
 * whose second branch is the accepted one, ties and repeated siblings, invalid trees;
 * - sampling verification: at a temperature so small that the distribution is one-hot it agrees
 *   with greedy on random trees; on a synthetic 5-token target with a two-level tree (including a
 *   repeated sibling and drafts outside the top-k support), the empirical joint frequency of the
 *   first two emitted tokens matches the exact product of the target's conditionals (200k draws,
 *   chi-square p > 0.001) for several temperature / top-k / top-p settings;
 * - the chi-square tail function against known quantiles.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "coordinator/verify.h"
#include "model/llama.h"
#include "tests/unit/chi2.h"
#include "tests/unit/testutil.h"

/* ===== a reference sampler: full sort, then the same arithmetic ===== */

typedef struct {
    int32_t id;
    float logit;
} ref_cand;

static int ref_cmp(const void *a, const void *b)
{
    const ref_cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static uint64_t ref_next(uint64_t *st)
{
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return *st * 0x2545f4914f6cdd1dull;
}

static int32_t ref_sample(uint64_t *rng, float temp, int top_k, float top_p, const float *lg, int n)
{
    ref_cand *c = malloc((size_t)n * sizeof *c);
    float *p = malloc((size_t)n * sizeof *p);
    for (int i = 0; i < n; i++)
        c[i] = (ref_cand){i, lg[i]};
    qsort(c, (size_t)n, sizeof *c, ref_cmp);
    int k = top_k > 0 && top_k < n ? top_k : n;
    double sum = 0;
    for (int i = 0; i < k; i++) {
        p[i] = expf((c[i].logit - c[0].logit) / temp);
        sum += p[i];
    }
    if (top_p > 0 && top_p < 1) {
        double cum = 0;
        for (int i = 0; i < k; i++) {
            cum += p[i] / sum;
            if (cum >= top_p) {
                k = i + 1;
                break;
            }
        }
        sum = 0;
        for (int i = 0; i < k; i++)
            sum += p[i];
    }
    double r = (double)(ref_next(rng) >> 11) * (1.0 / 9007199254740992.0) * sum;
    int32_t out = c[k - 1].id;
    for (int i = 0; i < k; i++) {
        r -= p[i];
        if (r < 0) {
            out = c[i].id;
            break;
        }
    }
    free(c);
    free(p);
    return out;
}

/* The exact distribution (double precision) of the sampler on logits lg[0..n) (distinct values). */
static void ref_probs(float temp, int top_k, float top_p, const float *lg, int n, double *out)
{
    ref_cand *c = malloc((size_t)n * sizeof *c);
    for (int i = 0; i < n; i++)
        c[i] = (ref_cand){i, lg[i]};
    qsort(c, (size_t)n, sizeof *c, ref_cmp);
    int k = top_k > 0 && top_k < n ? top_k : n;
    double sum = 0;
    for (int i = 0; i < k; i++)
        sum += exp(((double)c[i].logit - c[0].logit) / temp);
    if (top_p > 0 && top_p < 1) {
        double cum = 0;
        for (int i = 0; i < k; i++) {
            cum += exp(((double)c[i].logit - c[0].logit) / temp) / sum;
            if (cum >= top_p) {
                k = i + 1;
                break;
            }
        }
    }
    double s2 = 0;
    for (int i = 0; i < k; i++)
        s2 += exp(((double)c[i].logit - c[0].logit) / temp);
    for (int i = 0; i < n; i++)
        out[i] = 0;
    for (int i = 0; i < k; i++)
        out[c[i].id] = exp(((double)c[i].logit - c[0].logit) / temp) / s2;
    free(c);
}

/* A test-local generator for building inputs (not the sampler's). */
static double tv_rand(uint64_t *st)
{
    return (double)(ref_next(st) >> 11) * (1.0 / 9007199254740992.0);
}

typedef struct {
    float temp;
    int top_k;
    float top_p;
} tv_setting;

static void test_sampler_same_as_full_sort(void **state)
{
    (void)state;
    static const tv_setting set[] = {
        {0.8f, 40, 0.95f},  {1.0f, 0, 1.0f}, {0.7f, 0, 0.9f},   {1.3f, 5, 1.0f},
        {1.0f, 999, 0.5f},  {0.5f, 1, 1.0f}, {1.0f, 600, 1.0f}, {2.0f, 0, 0.3f},
        {1.0f, 1000, 1.0f}, {0.9f, 3, 0.6f},
    };
    /* a small vocabulary many times, and the default model's vocabulary size a few times */
    static const int sizes[] = {1000, 49152}, draws[] = {3000, 30};
    float *lg = malloc((size_t)49152 * sizeof *lg);
    void *work = malloc((size_t)49152 * 8);
    uint64_t st = 12345;
    for (int zi = 0; zi < 2; zi++) {
        int n = sizes[zi];
        for (size_t si = 0; si < sizeof set / sizeof set[0]; si++) {
            sampler s;
            sampler_init(&s, set[si].temp, set[si].top_k, set[si].top_p, 77 + si);
            uint64_t ref_rng = s.rng;
            for (int draw = 0; draw < draws[zi]; draw++) {
                if (draw % 10 == 0) {
                    /* every other vector is coarsely quantised so that ties (and -0 / +0) occur */
                    bool coarse = (draw / 10) % 2;
                    for (int i = 0; i < n; i++) {
                        double v = 6 * (tv_rand(&st) - 0.5);
                        lg[i] = coarse ? (float)(round(v * 2) / 2) : (float)v;
                        if (coarse && lg[i] == 0 && (i & 1))
                            lg[i] = -0.0f;
                    }
                }
                int32_t got = sampler_sample(&s, lg, n, work);
                int32_t want =
                    ref_sample(&ref_rng, set[si].temp, set[si].top_k, set[si].top_p, lg, n);
                if (got != want)
                    fail_msg("n %d setting %zu draw %d: sampler_sample %d, full-sort sampler %d", n,
                             si, draw, got, want);
            }
        }
    }
    /* greedy needs no randomness and is the argmax */
    sampler g;
    sampler_init(&g, 0, 0, 1, 5);
    assert_int_equal(sampler_sample(&g, lg, 1000, work), sampler_argmax(lg, 1000));
    free(lg);
    free(work);
}

static void test_sampler_probs(void **state)
{
    (void)state;
    static const tv_setting set[] = {
        {1.0f, 0, 1.0f}, {0.6f, 4, 1.0f}, {1.0f, 0, 0.7f}, {1.5f, 6, 0.8f}, {0.0f, 0, 1.0f},
    };
    enum { N = 12, DRAWS = 200000 };
    float lg[N];
    uint64_t st = 99;
    for (int i = 0; i < N; i++)
        lg[i] = (float)(3 * tv_rand(&st));
    float probs[N];
    double want[N];
    char work[N * 8];
    for (size_t si = 0; si < sizeof set / sizeof set[0]; si++) {
        sampler s;
        sampler_init(&s, set[si].temp, set[si].top_k, set[si].top_p, 1000 + si);
        int k = sampler_probs(&s, lg, N, probs, work);
        if (set[si].temp > 0) {
            ref_probs(set[si].temp, set[si].top_k, set[si].top_p, lg, N, want);
        } else {
            for (int i = 0; i < N; i++)
                want[i] = i == sampler_argmax(lg, N);
        }
        int nz = 0;
        for (int i = 0; i < N; i++) {
            nz += probs[i] > 0;
            if (fabs(probs[i] - want[i]) > 1e-6)
                fail_msg("setting %zu: p[%d] = %g, expected %g", si, i, probs[i], want[i]);
        }
        assert_int_equal(k, nz);
        uint64_t cnt[N] = {0};
        for (int d = 0; d < DRAWS; d++)
            cnt[sampler_sample(&s, lg, N, work)]++;
        double x;
        int dof;
        double pv = verify_chi2_gof(cnt, want, N, &x, &dof);
        printf("sampler_probs setting %zu: support %d, chi2 %.2f dof %d p %.4f\n", si, k, x, dof,
               pv);
        assert_true(pv > 0.001);
        /* sampler_draw from the dense vector follows it too */
        memset(cnt, 0, sizeof cnt);
        for (int d = 0; d < DRAWS; d++)
            cnt[sampler_draw(&s, probs, N)]++;
        pv = verify_chi2_gof(cnt, want, N, &x, &dof);
        assert_true(pv > 0.001);
    }
    float none[3] = {0, 0, 0};
    sampler s;
    sampler_init(&s, 1, 0, 1, 1);
    assert_int_equal(sampler_draw(&s, none, 3), -1);
}

/* ===== greedy ===== */

enum { GV = 8 };

/* logits rows whose argmax is best[i] (a runner-up at 0.5 so that nothing else ties) */
static void rows_with_argmax(float *lg, const int *best, int n)
{
    for (int i = 0; i < n; i++)
        for (int t = 0; t < GV; t++)
            lg[i * GV + t] = t == best[i]              ? 1.0f
                             : t == (best[i] + 1) % GV ? 0.5f
                                                       : -0.25f * (float)t;
}

static void expect_result(const verify_result *r, const int *path, int n_path, int32_t next)
{
    assert_int_equal(r->n_path, n_path);
    for (int i = 0; i < n_path; i++)
        assert_int_equal(r->path[i], path[i]);
    assert_int_equal(r->next, next);
}

static void test_greedy(void **state)
{
    (void)state;
    float lg[16 * GV];
    verify_result r;
    /* chain root -> 3 -> 5 -> 1 */
    const int32_t ctok[] = {7, 3, 5, 1}, cpar[] = {-1, 0, 1, 2};
    verify_tree chain = {4, ctok, cpar};
    assert_int_equal(verify_tree_check(&chain, GV, NULL, 0), 0);
    rows_with_argmax(lg, (const int[]){3, 5, 1, 6}, 4); /* all accepted, bonus 6 */
    verify_greedy(&chain, lg, GV, &r);
    expect_result(&r, (const int[]){0, 1, 2, 3}, 4, 6);
    int32_t out[VERIFY_MAX];
    assert_int_equal(verify_emit(&chain, &r, out), 4);
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 5);
    assert_int_equal(out[2], 1);
    assert_int_equal(out[3], 6);
    rows_with_argmax(lg, (const int[]){4, 5, 1, 6}, 4); /* first rejected */
    verify_greedy(&chain, lg, GV, &r);
    expect_result(&r, (const int[]){0}, 1, 4);
    assert_int_equal(verify_emit(&chain, &r, out), 1);
    assert_int_equal(out[0], 4);
    rows_with_argmax(lg, (const int[]){3, 2, 1, 6}, 4); /* rejected in the middle */
    verify_greedy(&chain, lg, GV, &r);
    expect_result(&r, (const int[]){0, 1}, 2, 2);

    /* tree: root -> {3 (1), 4 (2)}; 3 -> {5 (3)}; 4 -> {6 (4), 7 (5)}; the second branch wins */
    const int32_t ttok[] = {0, 3, 4, 5, 6, 7}, tpar[] = {-1, 0, 0, 1, 2, 2};
    verify_tree tree = {6, ttok, tpar};
    rows_with_argmax(lg, (const int[]){4, 5, 7, 1, 1, 0}, 6);
    verify_greedy(&tree, lg, GV, &r);
    expect_result(&r, (const int[]){0, 2, 5}, 3, 0);
    rows_with_argmax(lg, (const int[]){3, 5, 7, 2, 1, 0}, 6); /* first branch to its leaf */
    verify_greedy(&tree, lg, GV, &r);
    expect_result(&r, (const int[]){0, 1, 3}, 3, 2);

    /* ties: tokens 2 and 5 share the maximum; argmax is 2, so node 2 (token 2) is accepted */
    const int32_t xtok[] = {1, 5, 2}, xpar[] = {-1, 0, 0};
    verify_tree ties = {3, xtok, xpar};
    for (int i = 0; i < 3 * GV; i++)
        lg[i] = 0;
    lg[2] = lg[5] = 1;
    lg[2 * GV + 6] = 2;
    verify_greedy(&ties, lg, GV, &r);
    expect_result(&r, (const int[]){0, 2}, 2, 6);
    /* repeated siblings: the lower node wins */
    const int32_t dtok[] = {1, 2, 2}, dpar[] = {-1, 0, 0};
    verify_tree dup = {3, dtok, dpar};
    lg[GV + 3] = 4;
    verify_greedy(&dup, lg, GV, &r);
    expect_result(&r, (const int[]){0, 1}, 2, 3);
    /* a root alone: just the argmax */
    verify_tree root = {1, dtok, dpar};
    verify_greedy(&root, lg, GV, &r);
    expect_result(&r, (const int[]){0}, 1, 2);
}

static void test_invalid_trees(void **state)
{
    (void)state;
    float lg[4 * GV] = {0};
    char work[3 * GV * sizeof(float)];
    sampler s;
    sampler_init(&s, 1, 0, 1, 3);
    verify_result r;
    char err[128];
    const int32_t tok[] = {1, 2, 3, 4}, bad_tok[] = {1, 2, GV, 4};
    const int32_t par[] = {-1, 0, 1, 1}, bad_root[] = {0, 0, 1, 1}, fwd[] = {-1, 0, 3, 1};
    verify_tree cases[] = {
        {0, tok, par}, {VERIFY_MAX + 1, tok, par}, {4, bad_tok, par}, {4, tok, bad_root},
        {4, tok, fwd},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(verify_tree_check(&cases[i], GV, err, sizeof err), -1);
        assert_true(strlen(err) > 0);
        assert_int_equal(verify_sample(&cases[i], lg, GV, &s, work, &r), -1);
    }
}

/* ===== sampling ===== */

/* Random trees whose drafts often are the row's argmax, logits with gaps >= 1: at temperature 1e-4
 * the sampler's distribution is exactly one-hot, so sampling verification must equal greedy. */
static void test_sample_cold_is_greedy(void **state)
{
    (void)state;
    enum { V = 50, NMAX = 24 };
    float *lg = malloc((size_t)NMAX * V * sizeof *lg);
    void *work = malloc((size_t)3 * V * sizeof(float));
    uint64_t st = 7;
    sampler s;
    sampler_init(&s, 1e-4f, 0, 1, 42);
    sampler z;
    sampler_init(&z, 0, 0, 1, 42);
    int deep = 0;
    for (int trial = 0; trial < 2000; trial++) {
        int n = 1 + (int)(tv_rand(&st) * NMAX);
        int32_t tok[NMAX], par[NMAX];
        for (int i = 0; i < n; i++) {
            /* logits: a random permutation of 0..V-1 */
            float *row = lg + (size_t)i * V;
            for (int t = 0; t < V; t++)
                row[t] = (float)t;
            for (int t = V - 1; t > 0; t--) {
                int u = (int)(tv_rand(&st) * (t + 1));
                float tmp = row[t];
                row[t] = row[u];
                row[u] = tmp;
            }
        }
        tok[0] = 0;
        par[0] = -1;
        for (int i = 1; i < n; i++) {
            par[i] = (int32_t)(tv_rand(&st) * i);
            tok[i] = tv_rand(&st) < 0.6 ? sampler_argmax(lg + (size_t)par[i] * V, V)
                                        : (int32_t)(tv_rand(&st) * V);
        }
        verify_tree t = {n, tok, par};
        verify_result g, r, r0;
        verify_greedy(&t, lg, V, &g);
        assert_int_equal(verify_sample(&t, lg, V, &s, work, &r), 0);
        assert_int_equal(verify_sample(&t, lg, V, &z, work, &r0), 0);
        assert_int_equal(r.n_path, g.n_path);
        assert_int_equal(r0.n_path, g.n_path);
        for (int i = 0; i < g.n_path; i++) {
            assert_int_equal(r.path[i], g.path[i]);
            assert_int_equal(r0.path[i], g.path[i]);
        }
        assert_int_equal(r.next, g.next);
        assert_int_equal(r0.next, g.next);
        deep += g.n_path >= 3;
    }
    assert_true(deep > 100); /* the trees did exercise multi-token paths */
    free(lg);
    free(work);
}

/* The synthetic target: a distribution for the first token and one per first token for the second
 * (all values distinct so that top-k / top-p cuts are unambiguous). */
enum { SV = 5 };
static const float SYN0[SV] = {0.30f, 0.05f, 0.40f, 0.10f, 0.15f};
static const float SYN1[SV][SV] = {
    {0.50f, 0.20f, 0.04f, 0.16f, 0.10f}, {0.11f, 0.21f, 0.31f, 0.07f, 0.30f},
    {0.06f, 0.45f, 0.02f, 0.22f, 0.25f}, {0.33f, 0.12f, 0.19f, 0.27f, 0.09f},
    {0.08f, 0.14f, 0.36f, 0.03f, 0.39f},
};

/* ban: tokens a grammar refuses there (bit t), masked to -inf as the engine masks them */
static void syn_row(float *row, const float *prob, unsigned ban)
{
    for (int t = 0; t < SV; t++)
        row[t] = ban >> t & 1 ? -INFINITY : logf(prob[t]);
}

/* Run one sample of the first two tokens through verify_sample: step 1 verifies a 2-level tree
 * (root -> {2, 0, 2 again, 1}; 2 -> {4, 1}; 0 -> {3}); if it emits only one token, step 2 verifies
 * a small tree rooted at it. Returns the cell t1 * SV + t2; *acc counts accepted drafts. */
static int syn_draw(sampler *s, void *work, long *acc, unsigned ban0, unsigned ban1)
{
    const int32_t tok[] = {0, 2, 0, 2, 1, 4, 1, 3}, par[] = {-1, 0, 0, 0, 0, 1, 1, 2};
    float lg[8 * SV];
    syn_row(lg, SYN0, ban0);
    for (int i = 1; i < 8; i++) /* depth 2 rows: not measured */
        syn_row(lg + i * SV, par[i] == 0 ? SYN1[tok[i]] : SYN0, par[i] == 0 ? ban1 : 0);
    verify_tree t = {8, tok, par};
    verify_result r;
    assert_int_equal(verify_sample(&t, lg, SV, s, work, &r), 0);
    int32_t out[VERIFY_MAX];
    int n_out = verify_emit(&t, &r, out);
    *acc += r.n_path - 1;
    if (n_out >= 2)
        return out[0] * SV + out[1];
    int32_t t1 = out[0];
    const int32_t tok2[] = {t1, (t1 + 1) % SV, (t1 + 3) % SV}, par2[] = {-1, 0, 0};
    verify_tree t2 = {3, tok2, par2};
    syn_row(lg, SYN1[t1], ban1);
    syn_row(lg + SV, SYN0, 0);
    syn_row(lg + 2 * SV, SYN0, 0);
    assert_int_equal(verify_sample(&t2, lg, SV, s, work, &r), 0);
    *acc += r.n_path - 1;
    verify_emit(&t2, &r, out);
    return t1 * SV + out[0];
}

static void test_sample_distribution(void **state)
{
    (void)state;
    /* the last two: rows masked as a grammar masks them (tokens 1 and 3 refused first, token 2
     * second; the tree drafts 1 and 2 where they are refused) */
    static const tv_setting set[] = {{1.0f, 0, 1.0f}, {0.8f, 3, 1.0f}, {1.0f, 0, 0.8f},
                                     {1.7f, 4, 0.9f}, {1.0f, 0, 1.0f}, {0.9f, 4, 0.95f}};
    static const unsigned ban0[] = {0, 0, 0, 0, 0xA, 0xA}, ban1[] = {0, 0, 0, 0, 0x4, 0x4};
    enum { DRAWS = 200000 };
    void *work = malloc((size_t)3 * SV * sizeof(float));
    for (size_t si = 0; si < sizeof set / sizeof set[0]; si++) {
        tv_setting c = set[si];
        float row[SV];
        double p0[SV], p1[SV], prob[SV * SV];
        syn_row(row, SYN0, ban0[si]);
        ref_probs(c.temp, c.top_k, c.top_p, row, SV, p0);
        for (int a = 0; a < SV; a++) {
            syn_row(row, SYN1[a], ban1[si]);
            ref_probs(c.temp, c.top_k, c.top_p, row, SV, p1);
            for (int b = 0; b < SV; b++)
                prob[a * SV + b] = p0[a] * p1[b];
        }
        sampler s;
        sampler_init(&s, c.temp, c.top_k, c.top_p, 2024 + si);
        uint64_t cnt[SV * SV] = {0};
        long acc = 0;
        for (int d = 0; d < DRAWS; d++)
            cnt[syn_draw(&s, work, &acc, ban0[si], ban1[si])]++;
        double x;
        int dof;
        double pv = verify_chi2_gof(cnt, prob, SV * SV, &x, &dof);
        printf(
            "verify_sample temp %.1f top_k %d top_p %.2f%s: accepted %.3f drafts/draw, chi2 %.2f "
            "dof %d p %.4f\n",
            c.temp, c.top_k, c.top_p, ban0[si] ? " masked" : "", (double)acc / DRAWS, x, dof, pv);
        for (int a = 0; a < SV; a++) /* a refused token is never drawn */
            for (int b = 0; b < SV; b++)
                if ((ban0[si] >> a & 1) || (ban1[si] >> b & 1))
                    assert_int_equal(cnt[a * SV + b], 0);
        assert_true(acc > DRAWS / 4);
        if (pv <= 0.001)
            fail_msg("the first two tokens do not follow the target (p %.3g)", pv);
    }
    free(work);
}

static void test_chi2(void **state)
{
    (void)state;
    assert_true(fabs(verify_chi2_sf(3.841458820694124, 1) - 0.05) < 1e-9);
    assert_true(fabs(verify_chi2_sf(18.307038053275146, 10) - 0.05) < 1e-9);
    assert_true(fabs(verify_chi2_sf(1.0, 2) - exp(-0.5)) < 1e-12);
    assert_true(fabs(verify_chi2_sf(124.342113404, 100) - 0.05) < 1e-7);
    assert_true(fabs(verify_chi2_sf(-2 * log(0.995), 2) - 0.995) < 1e-12); /* small x: the series */
    assert_true(fabs(verify_chi2_sf(0.554298076728, 5) - 0.99) < 1e-9);
    assert_true(verify_chi2_sf(0, 3) == 1);
    double p = verify_chi2_sf(300, 10);
    assert_true(p > 0 && p < 1e-50);
    /* homogeneity: identical samples fit perfectly; disjoint ones do not */
    uint64_t a[4] = {100, 200, 300, 2}, b[4] = {100, 200, 300, 1}, c[4] = {300, 200, 100, 0};
    double x;
    int dof;
    assert_true(verify_chi2_homogeneity(a, a, 4, &x, &dof) > 0.999);
    assert_int_equal(dof, 2); /* the small last cell joined the smallest large one */
    assert_true(verify_chi2_homogeneity(a, b, 4, &x, &dof) > 0.5);
    assert_true(verify_chi2_homogeneity(a, c, 4, &x, &dof) < 1e-10);
    /* goodness of fit: an observation in a zero-probability cell is impossible */
    uint64_t o[3] = {50, 50, 1};
    const double pr[3] = {0.5, 0.5, 0};
    assert_true(verify_chi2_gof(o, pr, 3, &x, &dof) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sampler_same_as_full_sort),
        cmocka_unit_test(test_sampler_probs),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_invalid_trees),
        cmocka_unit_test(test_sample_cold_is_greedy),
        cmocka_unit_test(test_sample_distribution),
        cmocka_unit_test(test_chi2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
