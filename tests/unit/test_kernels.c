/*
 * tests/unit/test_kernels.c — the CPU kernels against plain scalar math: the batched matmul of
 * every type (float, legacy quantized, and the K family from random blocks) against a
 * double-precision dot of the dequantised weights, f16/bf16 conversion,
 * quantise/dequantise round trips, and attention partials merged by online softmax against a
 * direct softmax over all keys.
 */
#include <math.h>
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

/* Every instruction set this machine runs, for the rows x cols matrix wq of `type`, every width
 * W = 1..64, against a double-precision dot of the dequantised weights (relative L2 within tol);
 * packed and on-the-fly packed matrices agree bit for bit; a row range [lo, hi) that starts and
 * ends inside groups gives the same bits as the whole matrix; the result of a token does not
 * depend on W (its tile) or on the thread count; and every instruction set gives the same bits as
 * the portable reference. act_bits: the activation precision (kmat.act_bits) of quantized types. */
static void check_matmul(uint32_t type, const uint8_t *wq, int64_t rows, int64_t cols, double tol,
                         int act_bits)
{
    const char *tn = kt_traits_of(type)->name;
    const int n = KMAT_MAX_W;
    size_t rb = kt_row_bytes(type, (uint64_t)cols);
    float *deq = malloc((size_t)cols * 4), *x = malloc((size_t)(n * cols) * 4);
    float *y = malloc((size_t)(n * rows) * 4), *y2 = malloc((size_t)(n * rows) * 4);
    float *yw = malloc((size_t)(n * rows) * 4), *ref = malloc((size_t)(n * rows) * 4);
    float *portable = malloc((size_t)(n * rows) * 4);
    fill(x, (size_t)(n * cols), 6);
    kpool *pool1 = kpool_new(1), *pool3 = kpool_new(3);
    kisa initial = kisa_current();
    for (int64_t r = 0; r < rows; r++) {
        kt_dequantize_row(type, wq + (size_t)r * rb, deq, cols);
        for (int i = 0; i < n; i++) {
            double sum = 0;
            for (int64_t k = 0; k < cols; k++)
                sum += (double)deq[k] * x[i * cols + k];
            ref[i * rows + r] = (float)sum;
        }
    }
    kmat plain = {
        .type = type, .rows = rows, .cols = cols, .row_bytes = rb, .data = wq, .act_bits = act_bits};
    kmat packed = plain;
    assert_int_equal(kmat_pack(pool3, &packed), 0);
    assert_non_null(packed.packed);
    for (int isa = KISA_PORTABLE; isa <= KISA_AVX512; isa++) {
        if (!kisa_supported((kisa)isa)) {
            print_message("note: %s %s kernels not run: this CPU lacks the instructions\n",
                          kisa_name((kisa)isa), tn);
            continue;
        }
        assert_int_equal(kisa_select((kisa)isa), 0);
        const char *in = kisa_name((kisa)isa);
        /* W = 64 on the packed matrix, 3 threads: the reference result of this set */
        kmat_mul(pool3, &packed, 0, rows, x, n, y, rows, NULL);
        double e = tu_rel_l2(y, ref, (size_t)(n * rows));
        if (e > tol)
            fail_msg("%s %s (%d-bit activations): matmul relative L2 %.3g > %.1g", in, tn,
                     act_bits, e, tol);
        if (isa == KISA_PORTABLE)
            memcpy(portable, y, (size_t)(n * rows) * 4);
        else if (memcmp(portable, y, (size_t)(n * rows) * 4))
            fail_msg("%s %s: result differs from the portable kernels' bits", in, tn);
        /* the unpacked matrix (packed on the fly), one thread */
        kmat_mul(pool1, &plain, 0, rows, x, n, y2, rows, NULL);
        if (memcmp(y, y2, (size_t)(n * rows) * 4))
            fail_msg("%s %s: unpacked / 1 thread differs from packed / 3 threads", in, tn);
        /* a row range starting and ending inside groups, written into a zeroed output */
        memset(y2, 0, (size_t)(n * rows) * 4);
        kmat_mul(pool3, &packed, 5, 37, x, n, y2, rows, NULL);
        for (int t = 0; t < n; t++)
            for (int64_t r = 0; r < rows; r++) {
                float want = r >= 5 && r < 37 ? y[t * rows + r] : 0.0f;
                if (memcmp(&want, &y2[t * rows + r], 4))
                    fail_msg("%s %s: rows [5, 37): token %d row %lld wrong or written", in, tn, t,
                             (long long)r);
            }
        /* every width: each token's row equals its bits in the W = 64 batch */
        for (int w = 1; w <= n; w++) {
            kmat_mul(pool3, &packed, 0, rows, x, w, yw, rows, NULL);
            if (memcmp(yw, y, (size_t)(w * rows) * 4))
                fail_msg("%s %s: W = %d gives other bits than W = 64 for the same tokens", in, tn,
                         w);
        }
    }
    kmat_unpack(&packed);
    assert_null(packed.packed);
    assert_int_equal(kisa_select(initial), 0);
    kpool_destroy(&pool1);
    kpool_destroy(&pool3);
    free(deq);
    free(x);
    free(y);
    free(y2);
    free(yw);
    free(ref);
    free(portable);
}

/* rows x cols floats quantized to `type`, row by row (malloc'd; *rb gets the row's bytes) */
static uint8_t *quantize_rows(uint32_t type, const float *wf, int64_t rows, int64_t cols,
                              size_t *rb)
{
    *rb = kt_row_bytes(type, (uint64_t)cols);
    uint8_t *wq = malloc(*rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++)
        kt_quantize_row(type, wf + r * cols, wq + (size_t)r * *rb, cols);
    return wq;
}

/* The float and legacy quantized types: weights quantized from floats (the round trip within the
 * type's error), then check_matmul. */
static void test_kernels_matmul_types(void **state)
{
    const uint32_t types[] = {KT_F32, KT_F16, KT_BF16, KT_Q8_0, KT_Q4_0, KT_Q4_1};
    /* float weights: f32 arithmetic; quantized: 16-bit activations (|q| <= 32639 per block) */
    const double tol[] = {1e-6, 1e-6, 1e-6, 1e-4, 1e-4, 1e-4};
    const int64_t rows = 43, cols = 352; /* 43 = 2 groups + 11 rows; 352 = 11 blocks, % 16 == 0 */
    float *wf = malloc((size_t)(rows * cols) * 4), *deq = malloc((size_t)cols * 4);
    fill(wf, (size_t)(rows * cols), 5);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti];
        size_t rb;
        uint8_t *wq = quantize_rows(type, wf, rows, cols, &rb);
        for (int64_t r = 0; r < rows; r++) {
            kt_dequantize_row(type, wq + (size_t)r * rb, deq, cols);
            double qe = tu_rel_l2(deq, wf + r * cols, (size_t)cols);
            assert_true(qe < (type == KT_F32 ? 1e-9 : type == KT_Q4_0 || type == KT_Q4_1 ? 0.2 : 0.01));
        }
        check_matmul(type, wq, rows, cols, tol[ti], KMAT_ACT16);
        /* 8-bit activations: |q| <= 127 per block, so ~1/254 of a block's largest value */
        check_matmul(type, wq, rows, cols, ti < 3 ? tol[ti] : 1e-2, KMAT_ACT8);
        free(wq);
    }
    free(wf);
    free(deq);
}

/* 8-bit activations mean exactly this: per token and block of 32, x is replaced by d * q with
 * d = max|x| / 127 and q = round(x / d) (ties to even), while Q4_0 / Q4_1's offset term (-8 d_w,
 * m_w) still takes the block's exact float sum. Against a double reference built that way from
 * the dequantised weights the only error left is the kernels' float accumulation; and the 16-bit
 * path is not this close to it (so the setting is really in effect). */
static void test_kernels_matmul_act8_exact(void **state)
{
    const uint32_t types[] = {KT_Q8_0, KT_Q4_0, KT_Q4_1};
    const int64_t rows = 37, cols = 256;
    const int n = 9;
    float *wf = malloc((size_t)(rows * cols) * 4), *x = malloc((size_t)(n * cols) * 4);
    float *deq = malloc((size_t)cols * 4), *ref = malloc((size_t)(n * rows) * 4);
    float *y = malloc((size_t)(n * rows) * 4);
    fill(wf, (size_t)(rows * cols), 21);
    fill(x, (size_t)(n * cols), 22);
    kpool *pool = kpool_new(2);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti];
        size_t rb;
        uint8_t *wq = quantize_rows(type, wf, rows, cols, &rb);
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *row = wq + (size_t)r * rb;
            kt_dequantize_row(type, row, deq, cols);
            for (int t = 0; t < n; t++) {
                double sum = 0;
                for (int64_t b = 0; b < cols / 32; b++) {
                    const float *v = x + t * cols + b * 32;
                    const float *wb = deq + b * 32;
                    float amax = 0;
                    for (int i = 0; i < 32; i++)
                        amax = fmaxf(amax, fabsf(v[i]));
                    /* the weight's offset: Q4_0 -8 d, Q4_1 its m (both f16 after the scale) */
                    const uint8_t *blk = row + (size_t)b * kt_traits_of(type)->block_bytes;
                    double off = type == KT_Q4_0   ? -8.0 * kt_f16_to_f32(*(const uint16_t *)blk)
                                 : type == KT_Q4_1 ? kt_f16_to_f32(*(const uint16_t *)(blk + 2))
                                                   : 0.0;
                    float d = amax / 127.0f, id = amax ? 127.0f / amax : 0.0f;
                    for (int i = 0; i < 32; i++) {
                        double xq = (double)d * (double)lrintf(v[i] * id);
                        sum += ((double)wb[i] - off) * xq + off * (double)v[i];
                    }
                }
                ref[t * rows + r] = (float)sum;
            }
        }
        kmat w = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb, .data = wq};
        assert_int_equal(kmat_pack(pool, &w), 0);
        w.act_bits = KMAT_ACT8;
        kmat_mul(pool, &w, 0, rows, x, n, y, rows, NULL);
        double e8 = tu_rel_l2(y, ref, (size_t)(n * rows));
        w.act_bits = KMAT_ACT16;
        kmat_mul(pool, &w, 0, rows, x, n, y, rows, NULL);
        double e16 = tu_rel_l2(y, ref, (size_t)(n * rows));
        if (e8 > 1e-5 || e16 < 10 * e8)
            fail_msg("%s: 8-bit result %.3g from the 8-bit reference (bound 1e-5), 16-bit %.3g",
                     kt_traits_of(type)->name, e8, e16);
        kmat_unpack(&w);
        free(wq);
    }
    kpool_destroy(&pool);
    free(wf);
    free(x);
    free(deq);
    free(ref);
    free(y);
}

/* The K-quants, Q5_0/Q5_1 and IQ4_NL: blocks of random bytes (every code, scale and min bit
 * pattern) with sane f16 scales, rows of 3 super-blocks (768 columns), then check_matmul. */
static void test_kernels_matmul_k(void **state)
{
    /* the f16 fields (d, and dmin or m) of each type's block */
    static const struct {
        uint32_t type;
        int d, m; /* byte offsets, -1: none */
    } types[] = {{KT_Q5_0, 0, -1}, {KT_Q5_1, 0, 2},  {KT_IQ4_NL, 0, -1}, {KT_Q2_K, 80, 82},
                 {KT_Q3_K, 108, -1}, {KT_Q4_K, 0, 2}, {KT_Q5_K, 0, 2},    {KT_Q6_K, 208, -1}};
    const int64_t rows = 43, cols = 768;
    uint32_t seed = 11;
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti].type;
        const kt_traits *tr = kt_traits_of(type);
        assert_true(tr->supported);
        size_t rb = kt_row_bytes(type, (uint64_t)cols);
        uint8_t *wq = malloc(rb * (size_t)rows);
        for (size_t i = 0; i < rb * (size_t)rows; i++) {
            seed = seed * 1664525u + 1013904223u;
            wq[i] = (uint8_t)(seed >> 24);
        }
        for (size_t b = 0; b < rb * (size_t)rows / (size_t)tr->block_bytes; b++) {
            uint8_t *blk = wq + b * (size_t)tr->block_bytes;
            seed = seed * 1664525u + 1013904223u;
            uint16_t d = kt_f32_to_f16(0.001f + (float)(seed >> 20) / 4096.0f * 0.01f);
            memcpy(blk + types[ti].d, &d, 2);
            if (types[ti].m >= 0) {
                uint16_t m = kt_f32_to_f16((float)((int)(seed >> 8) % 201 - 100) / 1000.0f);
                memcpy(blk + types[ti].m, &m, 2);
            }
        }
        check_matmul(type, wq, rows, cols, 2e-4, KMAT_ACT16);
        check_matmul(type, wq, rows, cols, 1e-2, KMAT_ACT8);
        free(wq);
    }
}

/* The instruction-set choice: the portable set always runs, the best is supported, and a set the
 * CPU lacks is refused. */
static void test_kernels_isa(void **state)
{
    assert_true(kisa_supported(KISA_PORTABLE));
    assert_true(kisa_supported(kisa_best()));
    assert_string_equal(kisa_name(KISA_AVX512), "avx512");
    for (int i = KISA_PORTABLE; i <= KISA_AVX512; i++)
        assert_int_equal(kisa_select((kisa)i), kisa_supported((kisa)i) ? 0 : -1);
    assert_int_equal(kisa_select(kisa_best()), 0);
    assert_int_equal(kisa_current(), kisa_best());
    print_message("note: this CPU's best matmul kernels: %s\n", kisa_name(kisa_best()));
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

/* katt_causal_tokens with head size 64 runs the AVX-512 build of its chunk loop when the matmuls
 * run on AVX-512 (kernels/cpu/att_chunk.h): under every instruction set this CPU has beyond the
 * portable one, the same bits, for 1 / 5 / 8 tokens of 1..7 heads (groups of three value
 * accumulators and the 1- and 2-head rest), f32 and f16 rows, prefixes of 5 / 37 / 130 positions
 * (a partial last chunk, whole chunks) and tree ancestors. */
static void test_kernels_attention_isa_bits(void **state)
{
    enum { HD = 64, P_MAX = 130, TREE = 8, NT_MAX = 8, NQ_MAX = 7 };
    static float k[(P_MAX + TREE) * HD], v[(P_MAX + TREE) * HD], q[NT_MAX * NQ_MAX * HD];
    static uint16_t kh[(P_MAX + TREE) * HD], vh[(P_MAX + TREE) * HD];
    static float out[2][NT_MAX * NQ_MAX * HD];
    static katt_stat st[2][NT_MAX * NQ_MAX];
    fill(k, (P_MAX + TREE) * HD, 41);
    fill(v, (P_MAX + TREE) * HD, 42);
    fill(q, NT_MAX * NQ_MAX * HD, 43);
    for (int i = 0; i < (P_MAX + TREE) * HD; i++) {
        kh[i] = kt_f32_to_f16(k[i]);
        vh[i] = kt_f32_to_f16(v[i]);
    }
#if !defined(__AVX2__)
    /* this test binary links the kernels built without SIMD flags: their attention is plain C
     * (its own roundings), which the AVX-512 build does not claim to match */
    print_message("note: attention's AVX-512 build not compared: these kernels' own chunk loop is "
                  "the plain C one, not the AVX2 one\n");
    return;
#endif
    if (!kisa_supported(KISA_AVX2) || !kisa_supported(KISA_AVX512)) {
        print_message("note: attention's AVX-512 build not compared: this CPU lacks %s\n",
                      kisa_supported(KISA_AVX2) ? "AVX-512" : "AVX2");
        return;
    }
    kisa initial = kisa_current();
    int32_t slots[NT_MAX][TREE];
    for (int t = 0; t < NT_MAX; t++)
        for (int j = 0; j < TREE; j++)
            slots[t][j] = (j * 3 + t) % TREE;
    static const int nts[] = {1, 5, 8}, nqs[] = {1, 2, 3, 4, 7}, ps[] = {5, 37, 130};
    int cases = 0;
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 5; b++)
            for (size_t c = 0; c < 3; c++)
                for (int f16 = 0; f16 < 2; f16++) {
                    int nt = nts[a], nq = nqs[b], P = ps[c];
                    katt_keys keys[NT_MAX];
                    int n[NT_MAX];
                    const float *qs[NT_MAX];
                    for (int t = 0; t < nt; t++) {
                        keys[t] = (katt_keys){.type = f16 ? KV_F16 : KV_F32, .stride = HD,
                                              .n_prefix = P, .tree_slot = slots[t]};
                        keys[t].k = f16 ? (const void *)kh : (const void *)k;
                        keys[t].v = f16 ? (const void *)vh : (const void *)v;
                        keys[t].tree_k = f16 ? (const void *)(kh + P * HD) : (const void *)(k + P * HD);
                        keys[t].tree_v = f16 ? (const void *)(vh + P * HD) : (const void *)(v + P * HD);
                        n[t] = P + 1 + t % TREE;
                        qs[t] = q + t * nq * HD;
                    }
                    for (int i = 0; i < 2; i++) {
                        assert_int_equal(kisa_select(i ? KISA_AVX512 : KISA_AVX2), 0);
                        float *os[NT_MAX];
                        for (int t = 0; t < nt; t++)
                            os[t] = out[i] + t * nq * HD;
                        katt_causal_tokens(nt, qs, HD, nq, keys, n, HD, 0.125f, st[i], os, HD);
                    }
                    if (memcmp(out[0], out[1], sizeof(float) * (size_t)(nt * nq * HD)) ||
                        memcmp(st[0], st[1], sizeof(katt_stat) * (size_t)(nt * nq)))
                        fail_msg("%d tokens x %d heads, prefix %d, %s: AVX-512 and AVX2 differ", nt,
                                 nq, P, f16 ? "f16" : "f32");
                    cases++;
                }
    assert_int_equal(kisa_select(initial), 0);
    print_message("attention: AVX2 and AVX-512 bit-identical in %d cases\n", cases);
}

/* katt_causal_tokens: five tokens of one sequence (a shared prefix of 37 positions, each its own
 * tree ancestors), three query heads each, head sizes 64 / 128 / 80 / 72 and f32 / f16 keys:
 * every query's result equals katt_causal_group on its own bit for bit and matches a
 * double-precision softmax. */
static void test_kernels_attention_tokens(void **state)
{
    enum { NT = 5, NQ = 3, P = 37, TREE = 6, MAXHD = 128 };
    static const int hds[] = {64, 128, 80, 72};
    static float k[(P + TREE) * MAXHD], v[(P + TREE) * MAXHD], q[NT * NQ * MAXHD];
    static uint16_t kh[(P + TREE) * MAXHD], vh[(P + TREE) * MAXHD];
    static float out[NT * NQ * MAXHD], one[NQ * MAXHD];
    fill(k, (P + TREE) * MAXHD, 31);
    fill(v, (P + TREE) * MAXHD, 32);
    fill(q, NT * NQ * MAXHD, 33);
    for (int i = 0; i < (P + TREE) * MAXHD; i++) {
        kh[i] = kt_f32_to_f16(k[i]);
        vh[i] = kt_f32_to_f16(v[i]);
    }
    /* token t's ancestors: tree rows 0..t (slots in order), so it sees P + t + 1 positions */
    int32_t slots[NT][TREE];
    for (int t = 0; t < NT; t++)
        for (int j = 0; j < TREE; j++)
            slots[t][j] = j;
    float scale = 0.2f;
    for (size_t hi = 0; hi < sizeof hds / sizeof hds[0]; hi++)
        for (int f16 = 0; f16 < 2; f16++) {
            int hd = hds[hi];
            katt_keys keys[NT];
            int n[NT];
            const float *qs[NT];
            for (int t = 0; t < NT; t++) {
                keys[t] = (katt_keys){.type = f16 ? KV_F16 : KV_F32, .stride = hd, .n_prefix = P,
                                      .tree_slot = slots[t]};
                keys[t].k = f16 ? (const void *)kh : (const void *)k;
                keys[t].v = f16 ? (const void *)vh : (const void *)v;
                keys[t].tree_k = f16 ? (const void *)(kh + P * hd) : (const void *)(k + P * hd);
                keys[t].tree_v = f16 ? (const void *)(vh + P * hd) : (const void *)(v + P * hd);
                n[t] = P + t + 1;
                qs[t] = q + t * NQ * hd;
            }
            {
                float *o = out;
                float *os[NT];
                katt_stat st[NT * NQ];
                for (int t = 0; t < NT; t++)
                    os[t] = o + t * NQ * hd;
                katt_causal_tokens(NT, qs, hd, NQ, keys, n, hd, scale, st, os, hd);
                for (int t = 0; t < NT; t++) {
                    katt_stat s1[NQ];
                    katt_causal_group(qs[t], hd, NQ, &keys[t], n[t], hd, scale, s1, one, hd);
                    if (memcmp(one, os[t], sizeof(float) * NQ * hd) ||
                        memcmp(s1, &st[t * NQ], sizeof s1))
                        fail_msg("hd %d %s: token %d differs alone and in the batch", hd,
                                 f16 ? "f16" : "f32", t);
                    for (int h = 0; h < NQ; h++) {
                        float *oh = os[t] + h * hd;
                        katt_finish(&st[t * NQ + h], oh, hd);
                        /* the reference: softmax over the rows as stored (f16 rounded) */
                        double sc[P + TREE], mx = -1e300, sum = 0, ref[MAXHD] = {0};
                        for (int p = 0; p < n[t]; p++) {
                            double d = 0;
                            for (int i = 0; i < hd; i++) {
                                float kv = f16 ? kt_f16_to_f32(kh[p * hd + i]) : k[p * hd + i];
                                d += (double)qs[t][h * hd + i] * kv;
                            }
                            sc[p] = d * scale;
                            mx = sc[p] > mx ? sc[p] : mx;
                        }
                        for (int p = 0; p < n[t]; p++) {
                            sc[p] = exp(sc[p] - mx);
                            sum += sc[p];
                            for (int i = 0; i < hd; i++)
                                ref[i] += sc[p] * (f16 ? kt_f16_to_f32(vh[p * hd + i])
                                                       : v[p * hd + i]);
                        }
                        double e2 = 0, n2 = 0;
                        for (int i = 0; i < hd; i++) {
                            double r = ref[i] / sum;
                            e2 += (oh[i] - r) * (oh[i] - r);
                            n2 += r * r;
                        }
                        if (sqrt(e2 / n2) > 1e-5)
                            fail_msg("hd %d %s: token %d head %d relative L2 %.3g", hd,
                                     f16 ? "f16" : "f32", t, h, sqrt(e2 / n2));
                    }
                }
            }
        }
}

static void test_kernels_traits(void **state)
{
    assert_int_equal(kt_row_bytes(KT_Q4_1, 64), 40);
    assert_int_equal(kt_row_bytes(KT_Q8_0, 32), 34);
    assert_int_equal(kt_row_bytes(KT_Q4_0, 33), 0);
    assert_null(kt_traits_of(4));
    assert_true(kt_traits_of(KT_Q4_K)->supported);
    assert_int_equal(kt_row_bytes(KT_Q4_K, 512), 288);
    assert_int_equal(kt_row_bytes(KT_Q6_K, 128), 0); /* not a whole super-block */
    assert_false(kt_traits_of(15)->supported);      /* Q8_K: known, not computed */
    assert_string_equal(kt_traits_of(KT_BF16)->name, "BF16");
}

/* A block whose f16 scale or min is not finite is found and named; sound rows pass. */
static void test_kernels_check_row(void **state)
{
    float x[512];
    fill(x, 512, 9);
    uint8_t q[2 * 144];
    char why[96];
    kt_quantize_row(KT_Q4_1, x, q, 64);
    assert_int_equal(kt_check_row(KT_Q4_1, q, 64, why, sizeof why), -1);
    uint16_t nan = 0x7e00, inf = 0xfc00;
    memcpy(q + 20 + 2, &nan, 2); /* block 1's m */
    assert_int_equal(kt_check_row(KT_Q4_1, q, 64, why, sizeof why), 1);
    assert_string_equal(why, "m = nan");
    memset(q, 0, sizeof q);
    memcpy(q + 144 + 2, &inf, 2); /* Q4_K super-block 1's dmin */
    assert_int_equal(kt_check_row(KT_Q4_K, q, 512, why, sizeof why), 1);
    assert_string_equal(why, "dmin = -inf");
    assert_int_equal(kt_check_matrix(KT_Q4_K, q, 2, 256, 144, why, sizeof why), -1);
    assert_string_equal(why, "row 1 block 0: dmin = -inf");
    assert_int_equal(kt_check_row(KT_F16, q, 64, why, sizeof why), -1); /* float types: no scales */
}

/* k_top: the k largest, largest first, ties to the lower index, NaNs left out, k past the count
 * clipped. */
static void test_kernels_top(void **state)
{
    (void)state;
    float x[] = {1.0f, 5.0f, NAN, 3.0f, 5.0f, -2.0f, 4.0f};
    int32_t ids[8];
    assert_int_equal(k_top(x, 7, 4, ids), 4);
    int32_t want[] = {1, 4, 6, 3};
    assert_memory_equal(ids, want, sizeof want);
    assert_int_equal(k_top(x, 7, 1, ids), 1);
    assert_int_equal(ids[0], 1);
    float y[] = {NAN, 2.0f, 2.0f};
    assert_int_equal(k_top(y, 3, 8, ids), 2); /* the NaN is not one of them */
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(k_top(y, 3, 0, ids), 0);
}

/* k_argmax: the first of the largest, NaNs never taken, at every length around the vector width
 * and every position of the maximum; checked against a plain scan (that skips NaNs). */
static void test_kernels_argmax(void **state)
{
    (void)state;
    float x[80];
    for (int n = 1; n <= 80; n++)
        for (int at = 0; at < n; at++) {
            for (int i = 0; i < n; i++)
                x[i] = (float)((i * 37) % 11) - 20.0f;
            x[at] = 7.0f;
            if (at + 3 < n)
                x[at + 3] = 7.0f; /* a tie later: the first wins */
            if (at > 0)
                x[at - 1] = NAN;
            assert_int_equal(k_argmax(x, n), at);
        }
    float nan3[] = {NAN, NAN, NAN};
    assert_int_equal(k_argmax(nan3, 3), 0);
    float ninf[] = {-INFINITY, NAN, -INFINITY};
    assert_int_equal(k_argmax(ninf, 3), 0);
    float zeros[] = {-1.0f, -0.0f, 0.0f};
    assert_int_equal(k_argmax(zeros, 3), 1); /* -0 and +0 are equal: the first */
    float head[] = {NAN, 1.0f, 2.0f, 2.0f}; /* a NaN first is skipped, not kept */
    assert_int_equal(k_argmax(head, 4), 2);
}

/* RoPE in parts (the forward pass's way: angles once per token) rotates bit for bit as the
 * direct formula (each pair's angle pos * base^(-2i/rot_dim) in double, its cos and sin rounded
 * to float), keeps each pair's norm, and leaves the dimensions past rot_dim alone. */
static void test_kernels_rope_parts(void **state)
{
    (void)state;
    enum { HEADS = 3, HD = 64, ROT = 48 };
    float a[HEADS * HD], b[HEADS * HD];
    double inv[ROT / 2];
    float cs[ROT / 2], sn[ROT / 2];
    k_rope_freqs(inv, ROT, 10000.0f);
    for (int pos = 0; pos < 300; pos += 37) {
        for (int i = 0; i < HEADS * HD; i++)
            a[i] = b[i] = sinf(0.37f * (float)i + (float)pos);
        for (int h = 0; h < HEADS; h++)
            for (int i = 0; i < ROT / 2; i++) {
                double theta = pos * pow(10000.0f, -2.0 * i / ROT);
                float c = (float)cos(theta), s = (float)sin(theta), *p = a + h * HD + 2 * i;
                float x0 = p[0], x1 = p[1];
                p[0] = x0 * c - x1 * s;
                p[1] = x0 * s + x1 * c;
            }
        k_rope_angles(cs, sn, inv, ROT / 2, pos);
        k_rope_apply(b, HEADS, HD, ROT / 2, cs, sn);
        assert_memory_equal(a, b, sizeof a);
        float x0 = sinf(0.0f + (float)pos), x1 = sinf(0.37f + (float)pos);
        assert_true(fabsf(hypotf(b[0], b[1]) - hypotf(x0, x1)) < 1e-5f);
        assert_true(b[ROT] == sinf(0.37f * ROT + (float)pos)); /* past rot_dim: untouched */
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kernels_f16),
        cmocka_unit_test(test_kernels_argmax),
        cmocka_unit_test(test_kernels_rope_parts),
        cmocka_unit_test(test_kernels_matmul_types),
        cmocka_unit_test(test_kernels_matmul_act8_exact),
        cmocka_unit_test(test_kernels_matmul_k),
        cmocka_unit_test(test_kernels_isa),
        cmocka_unit_test(test_kernels_attention_merge),
        cmocka_unit_test(test_kernels_attention_causal),
        cmocka_unit_test(test_kernels_attention_tokens),
        cmocka_unit_test(test_kernels_attention_isa_bits),
        cmocka_unit_test(test_kernels_traits),
        cmocka_unit_test(test_kernels_check_row),
        cmocka_unit_test(test_kernels_top),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
