/*
 * tests/unit/test_medusa.c — Medusa heads (model/medusa, `orochi mkmedusa`).
 *
 * Tiny targets come from `orochi mkmodel`, heads from `orochi mkmedusa`; broken head files are
 * made by patching bytes of good ones (a renamed tensor, a changed u32), so each check fails in
 * exactly one place. Checked:
 *   - load validation: wrong dim, vocab, architecture, head count, missing and unexpected
 *     tensors, wrong shapes -> NULL and one line naming the key or tensor;
 *   - head logits against a double-precision evaluation of z = h + silu(W h + b),
 *     logits = lm_head(rmsnorm(z) * output_norm) on dequantised weights, for every tensor type,
 *     shared and own lm_head; zero heads reproduce the target's own logits bit for bit (which pins
 *     down that h is the pre-norm residual stream); thread count does not change a bit;
 *   - the draft tree: parents first, level by level, the template respected, candidates of head d
 *     under every parent of level d, siblings distinct, confidences = the head's softmax, pruning
 *     keeps a prefix of the full tree, bounds and bad arguments;
 *   - mkmedusa is deterministic: same seed, same bytes; another seed, other bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "model/medusa.h"
#include "tests/unit/testutil.h"

#define SMALL_SHAPE "--layers 2 --dim 64 --ffn 96 --heads 4 --kv-heads 2 --vocab 300 --ctx 128"

/* ===== files ===== */

/* tu_make_model into a caller buffer (its own buffers rotate). */
static void make_target(char *out, size_t n, const char *tag, const char *type, const char *shape)
{
    snprintf(out, n, "%s", tu_make_model(tag, type, shape));
}

/* Run mkmedusa for target into OROCHI_TMP/medusa-<tag>.gguf; returns its exit status. */
static int run_mkmedusa(char *out, size_t n, const char *tag, const char *target, const char *args)
{
    const char *bin = getenv("OROCHI_BIN"), *tmp = getenv("OROCHI_TMP");
    assert_non_null(bin);
    assert_non_null(tmp);
    snprintf(out, n, "%s/medusa-%s.gguf", tmp, tag);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' mkmedusa --target '%s' --out '%s' %s 2>/dev/null", bin, target,
             out, args);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static void make_heads(char *out, size_t n, const char *tag, const char *target, const char *args)
{
    if (run_mkmedusa(out, n, tag, target, args) != 0)
        fail_msg("mkmedusa %s failed for %s", args, target);
}

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

static void write_all(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static size_t find_bytes(const uint8_t *p, size_t n, const char *s)
{
    size_t len = strlen(s);
    for (size_t i = 0; i + len <= n; i++)
        if (!memcmp(p + i, s, len))
            return i;
    fail_msg("'%s' not in the file", s);
    return 0;
}

/* Copy src to OROCHI_TMP/medusa-patched-<tag>.gguf replacing the first `from` by `to` (same
 * length). */
static void patch_str(char *out, size_t n, const char *tag, const char *src, const char *from,
                      const char *to)
{
    size_t len;
    uint8_t *p = read_all(src, &len);
    assert_int_equal(strlen(from), strlen(to));
    memcpy(p + find_bytes(p, len, from), to, strlen(to));
    snprintf(out, n, "%s/medusa-patched-%s.gguf", getenv("OROCHI_TMP"), tag);
    write_all(out, p, len);
    free(p);
}

/* Same, setting the u32 value of metadata key `key`. */
static void patch_u32(char *out, size_t n, const char *tag, const char *src, const char *key,
                      uint32_t v)
{
    size_t len;
    uint8_t *p = read_all(src, &len);
    size_t at = find_bytes(p, len, key) + strlen(key);
    uint32_t type;
    memcpy(&type, p + at, 4);
    assert_int_equal(type, GGUF_UINT32);
    memcpy(p + at + 4, &v, 4);
    snprintf(out, n, "%s/medusa-patched-%s.gguf", getenv("OROCHI_TMP"), tag);
    write_all(out, p, len);
    free(p);
}

static llama_model *load_target(const char *path)
{
    char err[512];
    llama_model *m = llama_model_load(path, err, sizeof err);
    if (!m)
        fail_msg("target: %s", err);
    return m;
}

/* Loading must fail with an error line that contains each of the given words. */
static void expect_load_error(const char *path, const llama_model *target, const char *w1,
                              const char *w2)
{
    char err[512] = "";
    medusa *m = medusa_load(path, target, err, sizeof err);
    if (m) {
        medusa_destroy(&m);
        fail_msg("%s loaded; expected an error about %s", path, w1);
    }
    if (!strstr(err, w1) || (w2 && !strstr(err, w2)))
        fail_msg("error '%s' does not name '%s'%s%s", err, w1, w2 ? " and " : "", w2 ? w2 : "");
    if (strchr(err, '\n'))
        fail_msg("error is not one line: '%s'", err);
}

/* ===== load validation ===== */

static void test_medusa_load_ok(void **state)
{
    char tp[512], hp[512], op[512], err[512];
    make_target(tp, sizeof tp, "medusa", "f32", SMALL_SHAPE);
    make_heads(hp, sizeof hp, "load-ok", tp, "--heads 3");
    make_heads(op, sizeof op, "load-own", tp, "--heads 2 --own-out --no-bias --type q4_0");
    llama_model *t = load_target(tp);
    medusa *m = medusa_load(hp, t, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    assert_int_equal(medusa_heads(m), 3);
    for (int k = 0; k < 3; k++)
        assert_int_equal(medusa_head_own_out(m, k), 0);
    assert_string_equal(medusa_target_name(m), "orochi-mkmodel");
    medusa_destroy(&m);
    assert_null(m);
    medusa_destroy(&m); /* idempotent */
    m = medusa_load(op, t, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    assert_int_equal(medusa_heads(m), 2);
    assert_int_equal(medusa_head_own_out(m, 0), 1);
    assert_int_equal(medusa_head_own_out(m, 1), 1);
    assert_int_equal(medusa_head_own_out(m, 2), 0);
    medusa_destroy(&m);
    llama_model_destroy(&t);
}

static void test_medusa_load_mismatch(void **state)
{
    char tp[512], t32[512], tv[512], hp[512], own[512], p[512];
    make_target(tp, sizeof tp, "medusa", "f32", SMALL_SHAPE);
    make_target(t32, sizeof t32, "medusa-dim32", "f32",
                "--layers 1 --dim 32 --ffn 64 --heads 4 --kv-heads 2 --vocab 300 --ctx 64");
    make_target(tv, sizeof tv, "medusa-vocab320", "f32",
                "--layers 1 --dim 64 --ffn 64 --heads 4 --kv-heads 2 --vocab 320 --ctx 64");
    make_heads(hp, sizeof hp, "mismatch", tp, "--heads 3");
    make_heads(own, sizeof own, "mismatch-own", tp, "--heads 2 --own-out");
    llama_model *t = load_target(tp), *d32 = load_target(t32), *v320 = load_target(tv);

    /* heads made for another target */
    expect_load_error(hp, d32, "medusa.embedding_length", "32");
    expect_load_error(hp, v320, "medusa.vocab_size", "320");
    /* the right sizes declared, the wrong tensors inside */
    patch_u32(p, sizeof p, "dim32", hp, "medusa.embedding_length", 32);
    expect_load_error(p, d32, "medusa.0.res.weight", "shape");
    patch_u32(p, sizeof p, "vocab320", own, "medusa.vocab_size", 320);
    expect_load_error(p, v320, "medusa.0.out.weight", "shape");
    /* not a medusa file */
    expect_load_error(tp, t, "general.architecture", "llama");
    patch_str(p, sizeof p, "arch", hp, "orochi-medusa", "orochi-medusx");
    expect_load_error(p, t, "general.architecture", "orochi-medusx");
    /* keys */
    patch_str(p, sizeof p, "nokey", hp, "medusa.vocab_size", "medusa.vocab_sizX");
    expect_load_error(p, t, "medusa.vocab_size", NULL);
    patch_u32(p, sizeof p, "zeroheads", hp, "medusa.head_count", 0);
    expect_load_error(p, t, "medusa.head_count", NULL);
    patch_u32(p, sizeof p, "manyheads", hp, "medusa.head_count", 1000);
    expect_load_error(p, t, "medusa.head_count", NULL);
    /* tensors */
    patch_u32(p, sizeof p, "fourheads", hp, "medusa.head_count", 4);
    expect_load_error(p, t, "missing tensor", "'medusa.3.res.weight'");
    patch_str(p, sizeof p, "missing", hp, "medusa.1.res.weight", "medusa.1.res.weighx");
    expect_load_error(p, t, "missing tensor", "'medusa.1.res.weight'");
    patch_str(p, sizeof p, "unexpected", hp, "medusa.2.res.bias", "medusa.9.res.bias");
    expect_load_error(p, t, "unexpected tensor", "'medusa.9.res.bias'");
    patch_u32(p, sizeof p, "twoheads", hp, "medusa.head_count", 2);
    expect_load_error(p, t, "unexpected tensor", "'medusa.2.res.weight'");
    /* no file at all */
    char err[512] = "";
    assert_null(medusa_load("/nonexistent/medusa.gguf", t, err, sizeof err));
    assert_true(strlen(err) > 0);
    llama_model_destroy(&t);
    llama_model_destroy(&d32);
    llama_model_destroy(&v320);
}

static void test_medusa_mkmedusa_usage(void **state)
{
    char tp[512], hp[512];
    make_target(tp, sizeof tp, "medusa", "f32", SMALL_SHAPE);
    assert_int_equal(run_mkmedusa(hp, sizeof hp, "bad-type", tp, "--heads 2 --type q5_k"), 2);
    assert_int_equal(run_mkmedusa(hp, sizeof hp, "bad-heads", tp, "--heads 0"), 2);
    assert_int_equal(run_mkmedusa(hp, sizeof hp, "no-heads", tp, ""), 2);
    assert_int_equal(run_mkmedusa(hp, sizeof hp, "bad-target", "/nonexistent.gguf", "--heads 1"), 2);
}

/* ===== head logits ===== */

/* The pre-norm hidden state and the target's logits of the last of a few tokens. */
static void target_hidden(const llama_model *t, int n_prompt, float *hidden, float *logits)
{
    static const int32_t ids[] = {5, 77, 123, 9, 250, 31, 64, 200, 18, 140, 3, 99};
    assert_true(n_prompt >= 1 && n_prompt <= (int)(sizeof ids / sizeof ids[0]));
    char err[512];
    llama_ctx_params p = {.n_threads = 1, .max_width = 4, .n_ctx = 32};
    llama_ctx *ctx = llama_ctx_new(t, &p, err, sizeof err);
    assert_non_null(ctx);
    if (n_prompt > 1)
        assert_int_equal(llama_prefill(ctx, ids, n_prompt - 1, NULL, err, sizeof err), 0);
    llama_batch b = {.n = 1, .tokens = &ids[n_prompt - 1]};
    assert_int_equal(llama_forward(ctx, &b, logits, err, sizeof err), 0);
    memcpy(hidden, llama_ctx_shared(ctx)->x, (size_t)t->cfg.dim * sizeof *hidden);
    llama_ctx_destroy(&ctx);
}

static void deq_row(const gguf_tensor *w, int64_t r, float *out)
{
    size_t rb = kt_row_bytes(w->type, w->ne[0]);
    kt_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)r * rb, out, (int64_t)w->ne[0]);
}

/* The formula in double precision on dequantised weights. */
static void reference_logits(const gguf_file *hf, const llama_model *t, int k, const float *h,
                             double *ref)
{
    int dim = t->cfg.dim, vocab = t->cfg.vocab;
    char name[64];
    snprintf(name, sizeof name, "medusa.%d.res.weight", k);
    const gguf_tensor *w = gguf_tensor_find(hf, name);
    assert_non_null(w);
    snprintf(name, sizeof name, "medusa.%d.res.bias", k);
    const gguf_tensor *b = gguf_tensor_find(hf, name);
    snprintf(name, sizeof name, "medusa.%d.out.weight", k);
    const gguf_tensor *o = gguf_tensor_find(hf, name);
    float *row = malloc((size_t)dim * sizeof *row);
    double *z = malloc((size_t)dim * sizeof *z);
    double ss = 0;
    for (int i = 0; i < dim; i++) {
        deq_row(w, i, row);
        double a = 0;
        for (int j = 0; j < dim; j++)
            a += (double)row[j] * h[j];
        if (b)
            a += ((const float *)b->data)[i];
        z[i] = h[i] + a / (1.0 + exp(-a));
        ss += z[i] * z[i];
    }
    double scale = 1.0 / sqrt(ss / dim + (double)t->cfg.norm_eps);
    for (int i = 0; i < dim; i++)
        z[i] *= scale * t->out_norm[i];
    for (int v = 0; v < vocab; v++) {
        if (o)
            deq_row(o, v, row);
        else
            kmat_row(&t->lm_head, v, row);
        double a = 0;
        for (int j = 0; j < dim; j++)
            a += (double)row[j] * z[j];
        ref[v] = a;
    }
    free(row);
    free(z);
}

static double rel_l2_d(const float *got, const double *ref, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void check_logits(const char *target_type, const char *head_args, double tol)
{
    char tp[512], hp[512], err[512], tag[128], args[256];
    snprintf(tag, sizeof tag, "medusa-%s", target_type);
    make_target(tp, sizeof tp, tag, target_type, SMALL_SHAPE);
    snprintf(tag, sizeof tag, "logits-%s", target_type);
    snprintf(args, sizeof args, "--heads 3 --seed 5 --scale 0.5 %s", head_args);
    make_heads(hp, sizeof hp, tag, tp, args);
    llama_model *t = load_target(tp);
    medusa *m = medusa_load(hp, t, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    gguf_file *hf = gguf_open(hp, err, sizeof err);
    assert_non_null(hf);
    int dim = t->cfg.dim, vocab = t->cfg.vocab;
    float *h = malloc((size_t)dim * sizeof *h), *tl = malloc((size_t)vocab * sizeof *tl);
    float *got = malloc((size_t)vocab * sizeof *got), *got2 = malloc((size_t)vocab * sizeof *got2);
    double *ref = malloc((size_t)vocab * sizeof *ref);
    kpool *pool = kpool_new(3);
    for (int pos = 1; pos <= 8; pos += 7) {
        target_hidden(t, pos, h, tl);
        for (int k = 0; k < medusa_heads(m); k++) {
            assert_int_equal(medusa_head_logits(m, NULL, k, h, got), 0);
            reference_logits(hf, t, k, h, ref);
            double e = rel_l2_d(got, ref, vocab);
            if (!(e <= tol))
                fail_msg("target %s, heads '%s', head %d, pos %d: relative L2 %.3g > %.3g",
                         target_type, head_args, k, pos, e, tol);
            /* the heads move the logits (else this test would only check the lm_head) */
            assert_true(tu_rel_l2(got, tl, (size_t)vocab) > 1e-3);
            assert_int_equal(medusa_head_logits(m, pool, k, h, got2), 0);
            if (memcmp(got, got2, (size_t)vocab * sizeof *got))
                fail_msg("head %d: 3 threads differ from 1", k);
        }
    }
    assert_int_equal(medusa_head_logits(m, NULL, 3, h, got), -1);
    assert_int_equal(medusa_head_logits(m, NULL, -1, h, got), -1);
    assert_int_equal(medusa_head_logits(m, NULL, 0, NULL, got), -1);
    kpool_destroy(&pool);
    free(h);
    free(tl);
    free(got);
    free(got2);
    free(ref);
    gguf_close(&hf);
    medusa_destroy(&m);
    llama_model_destroy(&t);
}

static void test_medusa_logits_f32(void **state)
{
    check_logits("f32", "--type f32", 1e-4);
    check_logits("f32", "--type f32 --own-out", 1e-4);
    check_logits("f32", "--type f32 --no-bias", 1e-4);
}

static void test_medusa_logits_float_types(void **state)
{
    check_logits("f32", "--type f16", 1e-4);
    check_logits("f32", "--type bf16 --own-out", 1e-4);
    check_logits("f16", "--type f16", 1e-4);
}

static void test_medusa_logits_quant(void **state)
{
    check_logits("q8_0", "--type q8_0", 1e-2);
    check_logits("q8_0", "--type q8_0 --own-out", 1e-2);
    check_logits("q4_1", "--type q4_1", 1e-2);
    check_logits("f32", "--type q4_0 --own-out", 1e-2);
}

/* Zero heads: z = h, so every head must give exactly the target's logits for h. */
static void check_identity(const char *type)
{
    char tp[512], hp[512], err[512], tag[64];
    snprintf(tag, sizeof tag, "medusa-%s", type);
    make_target(tp, sizeof tp, tag, type, SMALL_SHAPE);
    snprintf(tag, sizeof tag, "zero-%s", type);
    char args[128];
    snprintf(args, sizeof args, "--heads 2 --scale 0 --no-bias --type %s", type);
    make_heads(hp, sizeof hp, tag, tp, args);
    llama_model *t = load_target(tp);
    medusa *m = medusa_load(hp, t, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    int dim = t->cfg.dim, vocab = t->cfg.vocab;
    float *h = malloc((size_t)dim * sizeof *h), *tl = malloc((size_t)vocab * sizeof *tl);
    float *got = malloc((size_t)vocab * sizeof *got);
    for (int pos = 1; pos <= 6; pos++) {
        target_hidden(t, pos, h, tl);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(medusa_head_logits(m, NULL, k, h, got), 0);
            if (memcmp(got, tl, (size_t)vocab * sizeof *got))
                fail_msg("%s: zero head %d at pos %d differs from the target (relative L2 %.3g)", type,
                         k, pos, tu_rel_l2(got, tl, (size_t)vocab));
        }
    }
    free(h);
    free(tl);
    free(got);
    medusa_destroy(&m);
    llama_model_destroy(&t);
}

static void test_medusa_zero_heads_are_target(void **state)
{
    check_identity("f32");
    check_identity("q8_0");
}

/* Default mkmedusa heads stay close to h, so head 0's top token mostly equals the target's own
 * next-token guess for the same h (what makes random heads usable in speculation tests). */
static void test_medusa_default_heads_informative(void **state)
{
    char tp[512], hp[512], err[512];
    make_target(tp, sizeof tp, "medusa", "f32", SMALL_SHAPE);
    make_heads(hp, sizeof hp, "default", tp, "--heads 2");
    llama_model *t = load_target(tp);
    medusa *m = medusa_load(hp, t, err, sizeof err);
    if (!m)
        fail_msg("%s", err);
    int dim = t->cfg.dim, vocab = t->cfg.vocab, agree = 0, n = 12;
    float *h = malloc((size_t)dim * sizeof *h), *tl = malloc((size_t)vocab * sizeof *tl);
    float *got = malloc((size_t)vocab * sizeof *got);
    for (int pos = 1; pos <= n; pos++) {
        target_hidden(t, pos, h, tl);
        assert_int_equal(medusa_head_logits(m, NULL, 0, h, got), 0);
        assert_true(memcmp(got, tl, (size_t)vocab * sizeof *got) != 0);
        agree += sampler_argmax(got, vocab) == sampler_argmax(tl, vocab);
    }
    if (agree < n * 3 / 4)
        fail_msg("head 0 agrees with the target's argmax at only %d of %d positions", agree, n);
    free(h);
    free(tl);
    free(got);
    medusa_destroy(&m);
    llama_model_destroy(&t);
}

/* ===== draft tree ===== */

typedef struct {
    llama_model *t;
    medusa *m;
    float *h;
    float **logits; /* per head */
} tree_fixture;

static void tree_setup(tree_fixture *f, const char *tag, const char *head_args)
{
    char tp[512], hp[512], err[512];
    make_target(tp, sizeof tp, "medusa", "f32", SMALL_SHAPE);
    make_heads(hp, sizeof hp, tag, tp, head_args);
    f->t = load_target(tp);
    f->m = medusa_load(hp, f->t, err, sizeof err);
    if (!f->m)
        fail_msg("%s", err);
    int dim = f->t->cfg.dim, vocab = f->t->cfg.vocab, K = medusa_heads(f->m);
    f->h = malloc((size_t)dim * sizeof *f->h);
    float *tl = malloc((size_t)vocab * sizeof *tl);
    target_hidden(f->t, 5, f->h, tl);
    free(tl);
    f->logits = calloc((size_t)K, sizeof *f->logits);
    for (int k = 0; k < K; k++) {
        f->logits[k] = malloc((size_t)vocab * sizeof **f->logits);
        assert_int_equal(medusa_head_logits(f->m, NULL, k, f->h, f->logits[k]), 0);
    }
}

static void tree_teardown(tree_fixture *f)
{
    for (int k = 0; k < medusa_heads(f->m); k++)
        free(f->logits[k]);
    free(f->logits);
    free(f->h);
    medusa_destroy(&f->m);
    llama_model_destroy(&f->t);
}

/* Rank of token v in head logits (0 = best; ties to the lower id), and its softmax probability. */
static int token_rank(const float *l, int vocab, int v, double *prob)
{
    int rank = 0;
    double mx = l[0], sum = 0;
    for (int i = 0; i < vocab; i++)
        mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < vocab; i++) {
        sum += exp((double)l[i] - mx);
        if (l[i] > l[v] || (l[i] == l[v] && i < v))
            rank++;
    }
    *prob = exp((double)l[v] - mx) / sum;
    return rank;
}

/* Structural checks of a tree against the template; returns the node count per level in lvl. */
static void check_tree(const tree_fixture *f, const int *tmpl, int depth, int n, const int32_t *tok,
                       const int32_t *par, const float *conf, int *lvl)
{
    int vocab = f->t->cfg.vocab, K = medusa_heads(f->m);
    int *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    double *path = malloc((size_t)(n > 0 ? n : 1) * sizeof *path);
    memset(lvl, 0, (size_t)(K + 1) * sizeof *lvl);
    for (int i = 0; i < n; i++) {
        if (par[i] < -1 || par[i] >= i)
            fail_msg("node %d: parent %d does not come first", i, par[i]);
        d[i] = par[i] < 0 ? 0 : d[par[i]] + 1; /* head index = level - 1 */
        if (i > 0 && d[i] < d[i - 1])
            fail_msg("node %d: level %d after level %d (not breadth-first)", i, d[i] + 1,
                     d[i - 1] + 1);
        assert_true(d[i] < depth && d[i] < K);
        double p;
        int rank = token_rank(f->logits[d[i]], vocab, tok[i], &p);
        if (rank >= tmpl[d[i]])
            fail_msg("node %d: token %d is candidate %d of head %d, template allows %d", i, tok[i],
                     rank, d[i], tmpl[d[i]]);
        if (fabs(conf[i] - p) > 1e-6 * (p > 1 ? p : 1) + 1e-7)
            fail_msg("node %d: conf %.9g, softmax %.9g", i, (double)conf[i], p);
        path[i] = (par[i] < 0 ? 1.0 : path[par[i]]) * conf[i];
        if (i > 0 && d[i] == d[i - 1] && path[i] > path[i - 1] * (1 + 1e-6))
            fail_msg("node %d: path probability %.6g above the previous node's %.6g", i, path[i],
                     path[i - 1]);
        for (int j = 0; j < i; j++)
            if (par[j] == par[i] && tok[j] == tok[i])
                fail_msg("nodes %d and %d: siblings with the same token %d", j, i, tok[i]);
        lvl[d[i] + 1]++;
    }
    free(d);
    free(path);
}

static void test_medusa_tree_structure(void **state)
{
    tree_fixture f;
    tree_setup(&f, "tree", "--heads 3 --seed 9 --scale 0.5");
    enum { CAP = 400 };
    int32_t tok[CAP], par[CAP];
    float conf[CAP];
    int lvl[4];

    /* the full {3, 2, 2} tree: 3 + 6 + 12 nodes, every candidate under every parent */
    const int tmpl[] = {3, 2, 2};
    int n = medusa_draft_tree(f.m, NULL, f.h, tmpl, 3, CAP, tok, par, conf);
    assert_int_equal(n, 21);
    check_tree(&f, tmpl, 3, n, tok, par, conf, lvl);
    assert_int_equal(lvl[1], 3);
    assert_int_equal(lvl[2], 6);
    assert_int_equal(lvl[3], 12);
    for (int i = 0; i < n; i++) {
        int children = 0;
        for (int j = 0; j < n; j++)
            children += par[j] == i;
        assert_int_equal(children, i < 3 ? 2 : i < 9 ? 2 : 0);
    }
    /* level 1 is exactly the top 3 of head 0, best first */
    for (int i = 0; i < 3; i++) {
        double p;
        assert_int_equal(token_rank(f.logits[0], f.t->cfg.vocab, tok[i], &p), i);
        assert_int_equal(par[i], -1);
    }

    /* pruning keeps a prefix of the full tree, whatever max_nodes */
    for (int max = 0; max <= 22; max++) {
        int32_t t2[CAP], p2[CAP];
        float c2[CAP];
        int n2 = medusa_draft_tree(f.m, NULL, f.h, tmpl, 3, max, t2, p2, c2);
        assert_int_equal(n2, max < 21 ? max : 21);
        if (n2 > 0 && (memcmp(t2, tok, (size_t)n2 * 4) || memcmp(p2, par, (size_t)n2 * 4) ||
                       memcmp(c2, conf, (size_t)n2 * 4)))
            fail_msg("max_nodes %d: not a prefix of the full tree", max);
    }

    /* threads change nothing */
    kpool *pool = kpool_new(3);
    int32_t t3[CAP], p3[CAP];
    float c3[CAP];
    assert_int_equal(medusa_draft_tree(f.m, pool, f.h, tmpl, 3, CAP, t3, p3, c3), 21);
    assert_memory_equal(t3, tok, 21 * 4);
    assert_memory_equal(p3, par, 21 * 4);
    assert_memory_equal(c3, conf, 21 * 4);
    kpool_destroy(&pool);

    /* depth beyond the heads is clamped; a zero entry ends the tree; depth limits it */
    const int deep[] = {2, 1, 1, 4, 4};
    n = medusa_draft_tree(f.m, NULL, f.h, deep, 5, CAP, tok, par, conf);
    assert_int_equal(n, 2 + 2 + 2);
    check_tree(&f, deep, 5, n, tok, par, conf, lvl);
    const int stop[] = {4, 0, 3};
    assert_int_equal(medusa_draft_tree(f.m, NULL, f.h, stop, 3, CAP, tok, par, conf), 4);
    assert_int_equal(medusa_draft_tree(f.m, NULL, f.h, tmpl, 1, CAP, tok, par, conf), 3);
    assert_int_equal(medusa_draft_tree(f.m, NULL, f.h, tmpl, 0, CAP, tok, par, conf), 0);

    /* a chain {1, 1, 1}: the argmax of each head */
    const int chain[] = {1, 1, 1};
    n = medusa_draft_tree(f.m, NULL, f.h, chain, 3, CAP, tok, par, conf);
    assert_int_equal(n, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(par[i], i - 1);
        assert_int_equal(tok[i], sampler_argmax(f.logits[i], f.t->cfg.vocab));
    }

    /* bad arguments */
    assert_int_equal(medusa_draft_tree(NULL, NULL, f.h, tmpl, 3, CAP, tok, par, conf), -1);
    assert_int_equal(medusa_draft_tree(f.m, NULL, NULL, tmpl, 3, CAP, tok, par, conf), -1);
    assert_int_equal(medusa_draft_tree(f.m, NULL, f.h, NULL, 3, CAP, tok, par, conf), -1);
    assert_int_equal(medusa_draft_tree(f.m, NULL, f.h, tmpl, 3, -1, tok, par, conf), -1);
    assert_int_equal(medusa_draft_tree(f.m, NULL, f.h, tmpl, 3, CAP, NULL, par, conf), -1);
    tree_teardown(&f);
}

static void test_medusa_tree_wide(void **state)
{
    tree_fixture f;
    tree_setup(&f, "tree-own", "--heads 3 --seed 9 --scale 0.5 --own-out");
    int vocab = f.t->cfg.vocab;
    enum { CAP = 400 };
    int32_t tok[CAP], par[CAP];
    float conf[CAP];
    int lvl[4];

    /* a template wider than the vocabulary: level 1 is the whole vocabulary, in rank order */
    const int all[] = {1000};
    int n = medusa_draft_tree(f.m, NULL, f.h, all, 1, CAP, tok, par, conf);
    assert_int_equal(n, vocab);
    check_tree(&f, all, 1, n, tok, par, conf, lvl);
    for (int i = 0; i < n; i++) {
        double p;
        assert_int_equal(token_rank(f.logits[0], vocab, tok[i], &p), i);
    }

    /* a huge template with a small budget: exactly max_nodes, breadth first, so all on level 1 */
    const int huge[] = {300, 300, 300};
    for (int max = 1; max <= 64; max = max * 2 + 1) {
        n = medusa_draft_tree(f.m, NULL, f.h, huge, 3, max, tok, par, conf);
        assert_int_equal(n, max);
        check_tree(&f, huge, 3, n, tok, par, conf, lvl);
        assert_int_equal(lvl[1], max);
    }
    /* a cut level keeps the likeliest paths: no (parent, candidate) pair left out of level 2 has
     * a higher path probability than one emitted (brute force over all 8 x 8 pairs) */
    int *byrank = malloc((size_t)vocab * sizeof *byrank);
    for (int u = 0; u < vocab; u++) {
        double pr;
        byrank[token_rank(f.logits[1], vocab, u, &pr)] = u;
    }
    const int two[] = {8, 8};
    n = medusa_draft_tree(f.m, NULL, f.h, two, 2, 20, tok, par, conf);
    assert_int_equal(n, 20);
    check_tree(&f, two, 2, n, tok, par, conf, lvl);
    assert_int_equal(lvl[1], 8);
    assert_int_equal(lvl[2], 12);
    double worst = 1;
    for (int i = 8; i < n; i++)
        worst = fmin(worst, (double)conf[par[i]] * conf[i]);
    for (int p = 0; p < 8; p++)
        for (int c = 0; c < 8; c++) {
            int v = byrank[c];
            bool emitted = false;
            for (int i = 8; i < n; i++)
                emitted |= par[i] == p && tok[i] == v;
            double pp, pc;
            token_rank(f.logits[0], vocab, tok[p], &pp);
            token_rank(f.logits[1], vocab, v, &pc);
            if (!emitted && pp * pc > worst * (1 + 1e-5))
                fail_msg("pair (%d, rank %d) with path probability %.6g left out for one of %.6g", p,
                         c, pp * pc, worst);
        }
    free(byrank);
    tree_teardown(&f);
}

/* ===== mkmedusa determinism ===== */

/* The plan's shape drafted exactly: every node is the shape's rank-th candidate of its depth's
 * head, siblings come in rank order under parents in emission order, and nodes beyond the depth,
 * the heads or max_nodes drop with their subtrees. */
static void test_medusa_shape(void **state)
{
    (void)state;
    tree_fixture f;
    tree_setup(&f, "shape", "--heads 3 --seed 9 --scale 0.5");
    int vocab = f.t->cfg.vocab;
    enum { CAP = 64 };
    int32_t tok[CAP], par[CAP];
    float conf[CAP];
    /* root -> ranks 1, 0 (listed out of order); under the rank-0 node: ranks 0, 2; under that
     * node's rank-0 child: rank 0 (depth 3); and a depth-4 node, beyond the three heads */
    const int32_t sp[] = {0, 0, 2, 2, 3, 5}, sr[] = {1, 0, 0, 2, 0, 0};
    const int want_depth[] = {1, 1, 2, 2, 3};
    const int want_rank[] = {0, 1, 0, 2, 0};
    int n = medusa_draft_shape(f.m, NULL, f.h, sp, sr, 6, 8, CAP, tok, par, conf);
    assert_int_equal(n, 5);
    const int32_t want_par[] = {-1, -1, 0, 0, 2};
    for (int i = 0; i < n; i++) {
        assert_int_equal(par[i], want_par[i]);
        double prob;
        int rank = token_rank(f.logits[want_depth[i] - 1], vocab, tok[i], &prob);
        if (rank != want_rank[i])
            fail_msg("node %d: token %d is candidate %d of head %d, the shape says %d", i, tok[i],
                     rank, want_depth[i] - 1, want_rank[i]);
        if (fabs(conf[i] - prob) > 1e-6 * (prob > 1 ? prob : 1) + 1e-7)
            fail_msg("node %d: conf %.9g, softmax %.9g", i, (double)conf[i], prob);
    }
    /* depth 2: the depth-3 node goes */
    assert_int_equal(medusa_draft_shape(f.m, NULL, f.h, sp, sr, 6, 2, CAP, tok, par, conf), 4);
    /* max_nodes 2: the first two shape nodes (ranks 1 and 0 of head 0), nothing below them */
    assert_int_equal(medusa_draft_shape(f.m, NULL, f.h, sp, sr, 6, 8, 2, tok, par, conf), 2);
    assert_int_equal(par[0], -1);
    assert_int_equal(par[1], -1);
    /* a rank repeated under one parent is one node */
    const int32_t dp[] = {0, 0}, dr[] = {0, 0};
    assert_int_equal(medusa_draft_shape(f.m, NULL, f.h, dp, dr, 2, 8, CAP, tok, par, conf), 1);
    /* no shape, bad shapes */
    assert_int_equal(medusa_draft_shape(f.m, NULL, f.h, sp, sr, 0, 8, CAP, tok, par, conf), 0);
    const int32_t fwd[] = {2, 0}, neg[] = {0, -1};
    assert_int_equal(medusa_draft_shape(f.m, NULL, f.h, fwd, sr, 2, 8, CAP, tok, par, conf), -1);
    assert_int_equal(medusa_draft_shape(f.m, NULL, f.h, sp, neg, 2, 8, CAP, tok, par, conf), -1);
    assert_int_equal(medusa_draft_shape(NULL, NULL, f.h, sp, sr, 6, 8, CAP, tok, par, conf), -1);
    tree_teardown(&f);
}

static void test_medusa_mkmedusa_deterministic(void **state)
{
    char tp[512], a[512], b[512], c[512];
    make_target(tp, sizeof tp, "medusa", "f32", SMALL_SHAPE);
    static const char *const variants[] = {"--heads 2 --seed 7",
                                           "--heads 3 --seed 7 --type q4_1 --own-out",
                                           "--heads 1 --seed 7 --type bf16 --no-bias"};
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        char args[256];
        make_heads(a, sizeof a, "det-a", tp, variants[i]);
        make_heads(b, sizeof b, "det-b", tp, variants[i]);
        snprintf(args, sizeof args, "%s --seed 8", variants[i]); /* the later --seed wins */
        make_heads(c, sizeof c, "det-c", tp, args);
        size_t na, nb, nc;
        uint8_t *pa = read_all(a, &na), *pb = read_all(b, &nb), *pc = read_all(c, &nc);
        assert_true(na > 0);
        if (na != nb || memcmp(pa, pb, na))
            fail_msg("'%s': two runs with the same seed differ", variants[i]);
        assert_int_equal(na, nc);
        if (!memcmp(pa, pc, na))
            fail_msg("'%s': seeds 7 and 8 give the same bytes", variants[i]);
        free(pa);
        free(pb);
        free(pc);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_medusa_load_ok),
        cmocka_unit_test(test_medusa_load_mismatch),
        cmocka_unit_test(test_medusa_mkmedusa_usage),
        cmocka_unit_test(test_medusa_logits_f32),
        cmocka_unit_test(test_medusa_logits_float_types),
        cmocka_unit_test(test_medusa_logits_quant),
        cmocka_unit_test(test_medusa_zero_heads_are_target),
        cmocka_unit_test(test_medusa_default_heads_informative),
        cmocka_unit_test(test_medusa_tree_structure),
        cmocka_unit_test(test_medusa_tree_wide),
        cmocka_unit_test(test_medusa_shape),
        cmocka_unit_test(test_medusa_mkmedusa_deterministic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
