/*
 * tests/unit/test_kquant.c — the quantisers of the K-quants (Q2_K..Q6_K), Q5_0/Q5_1 and IQ4_NL
 * (kt_quantize_row) and their reading (kt_dequantize_row), against the GGUF/ggml block layouts.
 *
 * The test carries its own element decoder, written from the layout description (ggml's), one
 * element at a time and independent of kernels/cpu. Checked:
 *   - relative RMS error of quantise -> dequantise per type on gaussian rows, rows with an
 *     outlier, very small and very large magnitudes, against bounds set from measured errors
 *     with some margin (the measured values are printed);
 *   - zero rows decode to exact zeros, constant rows nearly exactly, and rows far beyond what
 *     the f16 scales can hold (or far below) decode to finite values no worse than zeros;
 *   - every element of every quantised block decodes, with the test's decoder, to what
 *     kt_dequantize_row gives (so the bytes are where llama.cpp looks for them);
 *   - hand-built blocks of every type (random bytes with chosen scales, and a few literal
 *     elements worked out by hand) decode as the layout says.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/kernels.h"
#include "tests/unit/testutil.h"

/* The types, and bounds on the relative RMS error of quantise -> dequantise, from the errors this
 * quantiser measured (in the comments) with about 10% margin: on gaussian rows (also scaled by
 * 1e-3 and 1e4, where the error is the same), and on rows with an outlier, where the outlier's
 * block (or super-block: its sub-block scales share one f16 scale) gets a stretched scale. */
static const struct {
    uint32_t type;
    double gauss, outlier;
} KQ[] = {
    {KT_Q2_K, 0.29, 0.23},     /* 0.263, 0.204 */
    {KT_Q3_K, 0.16, 0.155},    /* 0.144, 0.138 */
    {KT_Q4_K, 0.078, 0.107},   /* 0.0701, 0.0955 */
    {KT_Q5_K, 0.039, 0.053},   /* 0.0346, 0.0469 */
    {KT_Q6_K, 0.019, 0.036},   /* 0.0170, 0.0317 */
    {KT_Q5_0, 0.045, 0.10},    /* 0.0402, 0.0897 */
    {KT_Q5_1, 0.038, 0.052},   /* 0.0337, 0.0457 */
    {KT_IQ4_NL, 0.082, 0.138}, /* 0.0735, 0.1234 */
};
#define NTYPES (sizeof KQ / sizeof KQ[0])

/* the IQ4_NL grid, as ggml defines it */
static const int IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                              1,    13,   25,  38,  53,  69,  89,  113};

/* ===== random numbers ===== */

static uint32_t rnd_u32(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return *s;
}

static double rnd_uniform(uint32_t *s) /* (0, 1) */
{
    return ((double)(rnd_u32(s) >> 8) + 0.5) / 16777216.0;
}

static float rnd_gauss(uint32_t *s)
{
    double u = rnd_uniform(s), v = rnd_uniform(s);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* ===== the test's own decoder ===== */

static double f16_at(const uint8_t *p)
{
    return (double)kt_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

/* Element e of the block at b, straight from the layout description. */
static double ref_elem(uint32_t type, const uint8_t *b, int e)
{
    switch (type) {
    case KT_Q5_0:
    case KT_Q5_1:
    case KT_IQ4_NL: {
        const uint8_t *qs = b + (type == KT_Q5_0 ? 6 : type == KT_Q5_1 ? 8 : 2);
        int nib = e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
        if (type == KT_IQ4_NL)
            return f16_at(b) * IQ4NL[nib];
        const uint8_t *qh = b + (type == KT_Q5_0 ? 2 : 4);
        int q = nib | ((qh[e / 8] >> (e % 8)) & 1) << 4;
        return type == KT_Q5_0 ? f16_at(b) * (q - 16) : f16_at(b) * q + f16_at(b + 2);
    }
    case KT_Q2_K: {
        int half = e / 128, j = (e % 128) / 32, l = e % 32, s = e / 16;
        int q = (b[16 + 32 * half + l] >> (2 * j)) & 3;
        return f16_at(b + 80) * (b[s] & 15) * q - f16_at(b + 82) * (b[s] >> 4);
    }
    case KT_Q3_K: {
        int half = e / 128, j = (e % 128) / 32, l = e % 32, s = e / 16;
        int q = (b[32 + 32 * half + l] >> (2 * j)) & 3;
        int h = (b[l] >> (4 * half + j)) & 1;
        int lo = (b[96 + s % 8] >> (4 * (s / 8))) & 15;
        int hi = (b[96 + 8 + s % 4] >> (2 * (s / 4))) & 3;
        return f16_at(b + 108) * ((lo | hi << 4) - 32) * (q - (h ? 0 : 4));
    }
    case KT_Q4_K:
    case KT_Q5_K: {
        int sub = e / 32, c = e / 64, l = e % 32;
        const uint8_t *s = b + 4, *qs = b + (type == KT_Q5_K ? 48 : 16);
        int sc, m;
        if (sub < 4) {
            sc = s[sub] & 63;
            m = s[sub + 4] & 63;
        } else {
            sc = (s[sub + 4] & 15) | (s[sub - 4] >> 6) << 4;
            m = (s[sub + 4] >> 4) | (s[sub] >> 6) << 4;
        }
        int q = sub % 2 == 0 ? qs[32 * c + l] & 15 : qs[32 * c + l] >> 4;
        if (type == KT_Q5_K)
            q |= ((b[16 + l] >> sub) & 1) << 4; /* bit 2c (even sub-block) or 2c + 1 (odd) */
        return f16_at(b) * sc * q - f16_at(b + 2) * m;
    }
    case KT_Q6_K: {
        int half = e / 128, g = (e % 128) / 32, l = e % 32;
        uint8_t lb = b[64 * half + 32 * (g & 1) + l];
        int q = (g < 2 ? lb & 15 : lb >> 4) | ((b[128 + 32 * half + l] >> (2 * g)) & 3) << 4;
        return f16_at(b + 208) * (int8_t)b[192 + e / 16] * (q - 32);
    }
    default: fail_msg("no reference decoder for type %u", type); return 0;
    }
}

/* The largest |term| that enters element e (for a rounding tolerance). */
static double ref_mag(uint32_t type, const uint8_t *b)
{
    switch (type) {
    case KT_Q5_0: return fabs(f16_at(b)) * 16;
    case KT_Q5_1: return fabs(f16_at(b)) * 31 + fabs(f16_at(b + 2));
    case KT_IQ4_NL: return fabs(f16_at(b)) * 127;
    case KT_Q2_K: return fabs(f16_at(b + 80)) * 45 + fabs(f16_at(b + 82)) * 15;
    case KT_Q3_K: return fabs(f16_at(b + 108)) * 128;
    case KT_Q4_K: return (fabs(f16_at(b)) * 15 + fabs(f16_at(b + 2))) * 63;
    case KT_Q5_K: return (fabs(f16_at(b)) * 31 + fabs(f16_at(b + 2))) * 63;
    case KT_Q6_K: return fabs(f16_at(b + 208)) * 128 * 32;
    default: return 0;
    }
}

/* kt_dequantize_row of row (n elements) agrees with ref_elem on every element. */
static void check_decode(uint32_t type, const uint8_t *row, int64_t n)
{
    const kt_traits *t = kt_traits_of(type);
    float *out = malloc((size_t)n * sizeof *out);
    kt_dequantize_row(type, row, out, n);
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *b = row + (i / t->block) * t->block_bytes;
        double want = ref_elem(type, b, (int)(i % t->block));
        double tol = 1e-6 * ref_mag(type, b) + 1e-30;
        if (fabs(out[i] - want) > tol)
            fail_msg("%s element %lld: kt_dequantize_row %.9g, layout %.9g", t->name, (long long)i,
                     (double)out[i], want);
    }
    free(out);
}

/* ===== quantise -> dequantise error ===== */

/* Quantise n floats, check the decoding of the bytes, and return the relative RMS error; out
 * gets the dequantised row. */
static double round_trip(uint32_t type, const float *x, float *out, int64_t n)
{
    size_t rb = kt_row_bytes(type, (uint64_t)n);
    assert_true(rb > 0);
    uint8_t *q = malloc(rb);
    kt_quantize_row(type, x, q, n);
    check_decode(type, q, n);
    kt_dequantize_row(type, q, out, n);
    free(q);
    for (int64_t i = 0; i < n; i++)
        assert_true(isfinite(out[i]));
    return tu_rel_l2(out, x, (size_t)n);
}

enum { ROW_GAUSS, ROW_OUTLIER, ROW_SMALL, ROW_LARGE, ROW_NKIND };
static const char *const KIND_NAME[ROW_NKIND] = {"gaussian", "outlier", "1e-3", "1e4"};

static void fill_row(float *x, int64_t n, int kind, uint32_t *seed)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rnd_gauss(seed);
    switch (kind) {
    case ROW_OUTLIER: /* one element 30 sigma out in every 256 */
        for (int64_t i = 0; i < n; i += 256)
            x[i + rnd_u32(seed) % 256] = (rnd_u32(seed) & 1 ? 30.0f : -30.0f);
        break;
    case ROW_SMALL:
        for (int64_t i = 0; i < n; i++)
            x[i] *= 1e-3f;
        break;
    case ROW_LARGE:
        for (int64_t i = 0; i < n; i++)
            x[i] *= 1e4f;
        break;
    default: break;
    }
}

static void test_kquant_error(void **state)
{
    const int64_t n = 4096;
    const int rows = 16;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    printf("relative RMS error, %d rows of %lld\n%-8s", rows, (long long)n, "type");
    for (int k = 0; k < ROW_NKIND; k++)
        printf(" %10s", KIND_NAME[k]);
    printf(" %10s %10s\n", "bound", "outl.bound");
    for (size_t ti = 0; ti < NTYPES; ti++) {
        uint32_t type = KQ[ti].type;
        double bound = KQ[ti].gauss, bound_out = KQ[ti].outlier;
        printf("%-8s", kt_traits_of(type)->name);
        for (int kind = 0; kind < ROW_NKIND; kind++) {
            uint32_t seed = 1234 + (uint32_t)kind;
            double num = 0, den = 0;
            for (int r = 0; r < rows; r++) {
                fill_row(x, n, kind, &seed);
                double e = round_trip(type, x, y, n);
                double ss = 0;
                for (int64_t i = 0; i < n; i++)
                    ss += (double)x[i] * x[i];
                num += e * e * ss;
                den += ss;
            }
            double err = sqrt(num / den);
            printf(" %10.5f", err);
            double limit = kind == ROW_OUTLIER ? bound_out : bound;
            if (!(err < limit))
                fail_msg("%s on %s rows: relative RMS error %.4f, bound %.4f",
                         kt_traits_of(type)->name, KIND_NAME[kind], err, limit);
        }
        printf(" %10.3f %10.3f\n", bound, bound_out);
    }
    free(x);
    free(y);
}

/* Zeros, constant rows, rows out of the f16 scales' reach in either direction. */
static void test_kquant_edges(void **state)
{
    const int64_t n = 512;
    float x[512], y[512];
    for (size_t ti = 0; ti < NTYPES; ti++) {
        uint32_t type = KQ[ti].type;
        const char *name = kt_traits_of(type)->name;

        memset(x, 0, sizeof x);
        round_trip(type, x, y, n);
        for (int64_t i = 0; i < n; i++)
            assert_true(y[i] == 0.0f);

        const float consts[] = {0.37f, -0.37f, 1000.0f, -2.5e-3f};
        for (size_t c = 0; c < sizeof consts / sizeof consts[0]; c++) {
            for (int64_t i = 0; i < n; i++)
                x[i] = consts[c];
            double e = round_trip(type, x, y, n);
            if (!(e < 0.01))
                fail_msg("%s, constant %g: relative error %.4f", name, (double)consts[c], e);
        }

        /* one spike in a zero row: kept to within the type's step */
        memset(x, 0, sizeof x);
        x[77] = 3.0f;
        x[300] = -0.5f;
        double e = round_trip(type, x, y, n);
        if (!(e < 0.05))
            fail_msg("%s, spikes in zeros: relative error %.4f", name, e);

        /* far beyond the f16 scales (saturated) and far below them: finite, no worse than 0 */
        const float mags[] = {1e9f, 1e37f, 1e-9f, 1e-25f, 1e-35f};
        for (size_t k = 0; k < sizeof mags / sizeof mags[0]; k++) {
            uint32_t seed = 99;
            for (int64_t i = 0; i < n; i++)
                x[i] = rnd_gauss(&seed) * mags[k];
            e = round_trip(type, x, y, n);
            if (!(e <= 1.0 + 1e-6))
                fail_msg("%s, gaussian * %g: relative error %.4f", name, (double)mags[k], e);
        }
    }
}

/* ===== hand-built blocks ===== */

static void put16(uint8_t *p, float v)
{
    uint16_t h = kt_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Random bytes with readable f16 scales, decoded by kt_dequantize_row and by the test. */
static void test_kquant_layout_random(void **state)
{
    uint32_t seed = 7;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        uint32_t type = KQ[ti].type;
        const kt_traits *t = kt_traits_of(type);
        uint8_t blk[4 * 210];
        for (int rep = 0; rep < 50; rep++) {
            for (int i = 0; i < 4 * t->block_bytes; i++)
                blk[i] = (uint8_t)(rnd_u32(&seed) >> 24);
            for (int b = 0; b < 4; b++) {
                uint8_t *p = blk + b * t->block_bytes;
                float d = 0.25f + 0.125f * (float)b, dm = -0.5f + 0.375f * (float)b;
                /* where d (and dmin / m) sit */
                int at_d = type == KT_Q2_K ? 80 : type == KT_Q3_K ? 108 : type == KT_Q6_K ? 208 : 0;
                bool has_m =
                    type == KT_Q5_1 || type == KT_Q2_K || type == KT_Q4_K || type == KT_Q5_K;
                put16(p + at_d, d);
                if (has_m)
                    put16(p + at_d + 2, dm);
            }
            check_decode(type, blk, 4 * t->block);
        }
    }
}

/* A few elements worked out by hand from ggml's layouts, one block of each K type. */
static void test_kquant_layout_literal(void **state)
{
    uint8_t b[256];
    float y[256];

    /* Q4_K: d = 2, dmin = 0.5; sub-block 1 (elements 32..63): scale = s[1] & 63 = 5, min =
     * s[5] & 63 = 3; sub-block 6 (elements 192..223): scale = (s[10] & 15) | (s[2] >> 6) << 4
     * = 0x9 | 2 << 4 = 41, min = (s[10] >> 4) | (s[6] >> 6) << 4 = 0x7 | 1 << 4 = 23.
     * qs[32 * 0 + 4] = 0xc3: element 4 low nibble 3 (sub-block 0), element 36 high nibble 12;
     * qs[32 * 3 + 1] = 0x5a: element 193 = 10 (sub-block 6), element 225 = 5 (sub-block 7). */
    memset(b, 0, 144);
    put16(b, 2.0f);
    put16(b + 2, 0.5f);
    b[4 + 1] = 5;
    b[4 + 5] = 3;
    b[4 + 2] = 2 << 6;
    b[4 + 6] = 1 << 6;
    b[4 + 10] = 0x79;
    b[16 + 4] = 0xc3;
    b[16 + 97] = 0x5a;
    kt_dequantize_row(KT_Q4_K, b, y, 256);
    assert_float_equal(y[4], 0.0f, 0); /* sub-block 0: scale 0, min 0 */
    assert_float_equal(y[36], 2.0f * 5 * 12 - 0.5f * 3, 0);
    assert_float_equal(y[193], 2.0f * 41 * 10 - 0.5f * 23, 0);
    assert_float_equal(y[225], 0.0f, 0); /* sub-block 7: (s[11] & 15) | s[3] >> 6 = 0 */

    /* Q5_K: the same scales; qh[4] = 0x22 sets the fifth bit of element 64 * 0 + 32 + 4 = 36
     * (bit 1) and of element 64 * 2 + 32 + 4 = 164 (bit 5). */
    uint8_t b5[176];
    memset(b5, 0, 176);
    memcpy(b5, b, 16);
    b5[16 + 4] = 0x22;
    b5[48 + 4] = 0xc3;
    b5[48 + 64 + 4] = 0x70; /* element 164: high nibble of qs[64 + 4] = 7 */
    b5[4 + 9] = 0x34;       /* sub-block 5: scale (s[9] & 15) | (s[1] >> 6) << 4 = 4, min 3 */
    kt_dequantize_row(KT_Q5_K, b5, y, 256);
    assert_float_equal(y[36], 2.0f * 5 * (12 + 16) - 0.5f * 3, 0);
    assert_float_equal(y[4], 0.0f, 0);
    assert_float_equal(y[164], 2.0f * 4 * (7 + 16) - 0.5f * 3, 0);

    /* Q6_K: d = 0.25; scales[2] = -3 (elements 32..47), scales[13] = 7 (elements 208..223).
     * Element 33 = half 0, group 1, l = 1: low 4 bits in ql[1 + 32] low nibble, high 2 bits in
     * qh[1] bits 2..3. Element 209 = half 1 (209 - 128 = 81 = 64 + 17: group 2, l = 17): the
     * high nibble of ql[64 + 17], bits 4..5 of qh[32 + 17]. */
    memset(b, 0, 210);
    put16(b + 208, 0.25f);
    b[192 + 2] = (uint8_t)(int8_t)-3;
    b[192 + 13] = 7;
    b[33] = 0x0b;                /* element 33 low bits 11 */
    b[128 + 1] = 0x3 << 2;       /* element 33 high bits 3: q = 11 + 48 = 59 */
    b[64 + 17] = 0x60;           /* element 209 low bits 6 */
    b[128 + 32 + 17] = 0x1 << 4; /* element 209 high bits 1: q = 22 */
    kt_dequantize_row(KT_Q6_K, b, y, 256);
    assert_float_equal(y[33], 0.25f * -3 * (59 - 32), 0);
    assert_float_equal(y[209], 0.25f * 7 * (22 - 32), 0);
    assert_float_equal(y[32], 0.25f * -3 * (0 - 32), 0);

    /* Q3_K: d = 0.5; sub-block 9 (elements 144..159): low 4 bits in scales[1] >> 4, high 2 bits
     * in scales[8 + 1] >> 4: 0xd | 2 << 4 = 45 -> 13. Element 150 = half 1, j = 0, l = 22:
     * qs[32 + 22] bits 0..1, hmask[22] bit 4. */
    memset(b, 0, 110);
    put16(b + 108, 0.5f);
    b[96 + 1] = 0xd0;
    b[96 + 9] = 2 << 4;
    b[32 + 32 + 22] = 0x2;
    b[22] = 1 << 4;
    kt_dequantize_row(KT_Q3_K, b, y, 256);
    assert_float_equal(y[150], 0.5f * 13 * 2, 0);       /* hmask bit set: q = 2 */
    assert_float_equal(y[151], 0.5f * 13 * (0 - 4), 0); /* no hmask bit, q = 0: -4 */
    /* sub-block 0 scale = (0 | 0) - 32 = -32 */
    assert_float_equal(y[0], 0.5f * -32 * -4, 0);

    /* Q2_K: d = 1, dmin = 0.25; scales[5] = 0x93: scale 3, min 9 (elements 80..95). Element 81
     * = half 0, j = 2, l = 17: qs[17] bits 4..5. */
    memset(b, 0, 84);
    put16(b + 80, 1.0f);
    put16(b + 82, 0.25f);
    b[5] = 0x93;
    b[16 + 17] = 0x3 << 4;
    kt_dequantize_row(KT_Q2_K, b, y, 256);
    assert_float_equal(y[81], 1.0f * 3 * 3 - 0.25f * 9, 0);
    assert_float_equal(y[80], -0.25f * 9, 0);

    /* Q5_0 / Q5_1: element 20's fifth bit is bit 20 of qh (byte 2, bit 4), its nibble the high
     * one of qs[4]. */
    memset(b, 0, 24);
    put16(b, 0.5f);
    b[2 + 2] = 1 << 4;
    b[6 + 4] = 0x90;
    kt_dequantize_row(KT_Q5_0, b, y, 32);
    assert_float_equal(y[20], 0.5f * (9 + 16 - 16), 0);
    assert_float_equal(y[4], 0.5f * -16, 0);
    memset(b, 0, 24);
    put16(b, 0.5f);
    put16(b + 2, -1.0f);
    b[4 + 2] = 1 << 4;
    b[8 + 4] = 0x90;
    kt_dequantize_row(KT_Q5_1, b, y, 32);
    assert_float_equal(y[20], 0.5f * 25 - 1.0f, 0);

    /* IQ4_NL: element 3 is the low nibble of qs[3], element 19 the high one */
    memset(b, 0, 18);
    put16(b, 2.0f);
    b[2 + 3] = 0xf2;
    kt_dequantize_row(KT_IQ4_NL, b, y, 32);
    assert_float_equal(y[3], 2.0f * -83, 0);
    assert_float_equal(y[19], 2.0f * 113, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kquant_error),
        cmocka_unit_test(test_kquant_edges),
        cmocka_unit_test(test_kquant_layout_random),
        cmocka_unit_test(test_kquant_layout_literal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
