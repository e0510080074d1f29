/*
 * tests/unit/test_kernels.c — the CPU kernels against plain scalar math: the batched matmul of
 * every type against a double-precision dot of the dequantised weights, f16/bf16 conversion,
 * quantise/dequantise round trips, and attention partials merged by online softmax against a
 * direct softmax over all keys.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/kernels.h"
#include "tests/unit/testutil.h"

static void fill(float *x, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int)(seed >> 9) % 2001 - 1000) / 700.0f;
    }
}

static void test_kernels_f16(void **state)
{
    const float vals[] = {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        assert_float_equal(kt_f16_to_f32(kt_f32_to_f16(vals[i])), vals[i], 0);
    assert_int_equal(kt_f32_to_f16(1e6f), 0x7c00);
    assert_int_equal(kt_f32_to_f16(1.0f), 0x3c00);
    assert_float_equal(kt_bf16_to_f32(kt_f32_to_bf16(1.5f)), 1.5f, 0);
    /* every half value converts back to itself */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue; /* nan */
        assert_int_equal(kt_f32_to_f16(kt_f16_to_f32((uint16_t)h)), h);
    }
}

static void test_kernels_matmul_types(void **state)
{
    const uint32_t types[] = {KT_F32, KT_F16, KT_BF16, KT_Q8_0, KT_Q4_0, KT_Q4_1};
    /* float weights: exact math up to rounding; quantized: 8-bit activations */
    const double tol[] = {1e-6, 1e-6, 1e-6, 1e-2, 1e-2, 1e-2};
    int64_t rows = 40, cols = 320;
    int n = 11;
    float *wf = malloc((size_t)(rows * cols) * 4), *deq = malloc((size_t)cols * 4);
    float *x = malloc((size_t)(n * cols) * 4), *y = malloc((size_t)(n * rows) * 4);
    float *ref = malloc((size_t)(n * rows) * 4);
    fill(wf, (size_t)(rows * cols), 5);
    fill(x, (size_t)(n * cols), 6);
    kpool *pool = kpool_new(2);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t rb = kt_row_bytes(types[t], (uint64_t)cols);
        uint8_t *wq = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++)
            kt_quantize_row(types[t], wf + r * cols, wq + (size_t)r * rb, cols);
        for (int64_t r = 0; r < rows; r++) {
            kt_dequantize_row(types[t], wq + (size_t)r * rb, deq, cols);
            /* the quantiser itself is close to the input */
            double qe = tu_rel_l2(deq, wf + r * cols, (size_t)cols);
            assert_true(qe < (types[t] == KT_F32 ? 1e-9 : types[t] == KT_Q4_0 || types[t] == KT_Q4_1 ? 0.2 : 0.01));
            for (int i = 0; i < n; i++) {
                double s = 0;
                for (int64_t k = 0; k < cols; k++)
                    s += (double)deq[k] * x[i * cols + k];
                ref[i * rows + r] = (float)s;
            }
        }
        kmat w = {.type = types[t], .rows = rows, .cols = cols, .row_bytes = rb, .data = wq};
        kmat_mul(pool, &w, 0, rows, x, n, y, rows, NULL);
        double e = tu_rel_l2(y, ref, (size_t)(n * rows));
        if (e > tol[t])
            fail_msg("type %s: matmul relative L2 %.3g > %.1g", kt_traits_of(types[t])->name, e, tol[t]);
        free(wq);
    }
    kpool_destroy(&pool);
    free(wf);
    free(deq);
    free(x);
    free(y);
    free(ref);
}

static void test_kernels_attention_merge(void **state)
{
    enum { HD = 64, NK = 37 };
    float q[HD], k[NK * HD], v[NK * HD], ref[HD] = {0}, scores[NK];
    fill(q, HD, 1);
    fill(k, NK * HD, 2);
    fill(v, NK * HD, 3);
    float scale = 0.125f;
    for (int p = 0; p < NK; p++)
        scores[p] = k_dot(q, k + p * HD, HD) * scale;
    k_softmax(scores, NK);
    for (int p = 0; p < NK; p++)
        for (int i = 0; i < HD; i++)
            ref[i] += scores[p] * v[p * HD + i];
    /* dense over the first 20, sparse over a scattered subset of the rest, merged */
    katt_kv kv = {.type = KV_F32, .k = k, .v = v, .stride = HD};
    int32_t idx[NK - 20];
    for (int i = 0; i < NK - 20; i++)
        idx[i] = NK - 1 - i; /* reverse order: the merge must not care */
    katt_stat a, b;
    float oa[HD], ob[HD];
    katt_dense(q, &kv, 20, HD, scale, &a, oa);
    katt_sparse(q, &kv, idx, NK - 20, HD, scale, &b, ob);
    katt_merge(&a, oa, &b, ob, HD);
    katt_finish(&a, oa, HD);
    assert_true(tu_rel_l2(oa, ref, HD) < 1e-5);
    /* merging with an empty partial is the identity */
    katt_stat e;
    float oe[HD];
    katt_dense(q, &kv, 0, HD, scale, &e, oe);
    katt_dense(q, &kv, NK, HD, scale, &a, oa);
    katt_merge(&a, oa, &e, oe, HD);
    katt_finish(&a, oa, HD);
    assert_true(tu_rel_l2(oa, ref, HD) < 1e-5);
}

/* katt_causal over a stream split as prefix + tree rows equals a direct softmax, and the split
 * point does not change a single bit. */
static void test_kernels_attention_causal(void **state)
{
    enum { HD = 64, NK = 45 };
    float q[HD], k[NK * HD], v[NK * HD], ref[HD] = {0}, scores[NK];
    fill(q, HD, 7);
    fill(k, NK * HD, 8);
    fill(v, NK * HD, 9);
    float scale = 0.3f;
    for (int p = 0; p < NK; p++)
        scores[p] = k_dot(q, k + p * HD, HD) * scale;
    k_softmax(scores, NK);
    for (int p = 0; p < NK; p++)
        for (int i = 0; i < HD; i++)
            ref[i] += scores[p] * v[p * HD + i];
    /* tree rows: the same keys stored in reverse slot order */
    float tk[NK * HD], tv[NK * HD];
    int32_t slot[NK];
    for (int p = 0; p < NK; p++) {
        memcpy(tk + (NK - 1 - p) * HD, k + p * HD, sizeof(float) * HD);
        memcpy(tv + (NK - 1 - p) * HD, v + p * HD, sizeof(float) * HD);
    }
    float first[HD];
    for (int split = 0; split <= NK; split += 4) {
        for (int p = split; p < NK; p++)
            slot[p - split] = NK - 1 - p;
        katt_keys s = {.type = KV_F32, .k = k, .v = v, .tree_k = tk, .tree_v = tv, .stride = HD,
                       .n_prefix = split, .tree_slot = slot};
        katt_stat st;
        float out[HD];
        katt_causal(q, &s, NK, HD, scale, &st, out);
        katt_finish(&st, out, HD);
        assert_true(tu_rel_l2(out, ref, HD) < 1e-5);
        if (split == 0)
            memcpy(first, out, sizeof out);
        else if (memcmp(first, out, sizeof out))
            fail_msg("katt_causal result changes with the prefix/tree split at %d", split);
    }
}

static void test_kernels_traits(void **state)
{
    assert_int_equal(kt_row_bytes(KT_Q4_1, 64), 40);
    assert_int_equal(kt_row_bytes(KT_Q8_0, 32), 34);
    assert_int_equal(kt_row_bytes(KT_Q4_0, 33), 0);
    assert_null(kt_traits_of(4));
    assert_false(kt_traits_of(12)->supported); /* Q4_K known, not computed */
    assert_string_equal(kt_traits_of(KT_BF16)->name, "BF16");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_f16),
        cmocka_unit_test(test_kernels_matmul_types),
        cmocka_unit_test(test_kernels_attention_merge),
        cmocka_unit_test(test_kernels_attention_causal),
        cmocka_unit_test(test_kernels_traits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
