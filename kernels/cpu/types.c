/*
 * kernels/cpu/types.c — the scalar (de)quantisers of the legacy types, and the entry points that
 * dispatch every type (the traits and the half-precision conversions they stand on: traits.c).
 *
 * Block layouts follow GGUF/ggml: a quantized row is a sequence of 32-element blocks.
 *   Q8_0: f16 d, int8 q[32]                value = d * q
 *   Q4_0: f16 d, uint8 qs[16]              value = d * (nibble - 8)
 *   Q4_1: f16 d, f16 m, uint8 qs[16]       value = d * nibble + m
 * where element j < 16 is the low nibble of qs[j] and element j + 16 the high nibble.
 * The K-quants, Q5_0/Q5_1 and IQ4_NL are read in ktypes_k.c and written in kquantize.c.
 * These scalar routines are the reference the SIMD matmul is tested against, the embedding
 * lookup, and what `orochi mkmodel` uses to write quantized weights.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ktypes_k.h"

/* ===== quantize / dequantize rows ===== */

static void quantize_q8_0(const float *x, uint8_t *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32, out += 34) {
        float amax = 0;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f;
        float id = d ? 1.0f / d : 0.0f;
        uint16_t dh = kt_f32_to_f16(d);
        memcpy(out, &dh, 2);
        for (int i = 0; i < 32; i++)
            out[2 + i] = (uint8_t)(int8_t)lrintf(x[i] * id);
    }
}

static void quantize_q4_0(const float *x, uint8_t *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32, out += 18) {
        float amax = 0, maxv = 0;
        for (int i = 0; i < 32; i++)
            if (fabsf(x[i]) > amax) {
                amax = fabsf(x[i]);
                maxv = x[i];
            }
        float d = maxv / -8.0f;
        float id = d ? 1.0f / d : 0.0f;
        uint16_t dh = kt_f32_to_f16(d);
        memcpy(out, &dh, 2);
        for (int j = 0; j < 16; j++) {
            int lo = (int)fminf(15.0f, floorf(x[j] * id + 8.5f));
            int hi = (int)fminf(15.0f, floorf(x[j + 16] * id + 8.5f));
            out[2 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

static void quantize_q4_1(const float *x, uint8_t *out, int64_t n)
{
    for (int64_t b = 0; b < n / 32; b++, x += 32, out += 20) {
        float mn = x[0], mx = x[0];
        for (int i = 1; i < 32; i++) {
            mn = fminf(mn, x[i]);
            mx = fmaxf(mx, x[i]);
        }
        float d = (mx - mn) / 15.0f;
        float id = d ? 1.0f / d : 0.0f;
        uint16_t dh = kt_f32_to_f16(d), mh = kt_f32_to_f16(mn);
        memcpy(out, &dh, 2);
        memcpy(out + 2, &mh, 2);
        for (int j = 0; j < 16; j++) {
            int lo = (int)fminf(15.0f, floorf((x[j] - mn) * id + 0.5f));
            int hi = (int)fminf(15.0f, floorf((x[j + 16] - mn) * id + 0.5f));
            out[4 + j] = (uint8_t)(lo | (hi << 4));
        }
    }
}

void kt_quantize_row(uint32_t type, const float *x, void *out, int64_t n)
{
    uint8_t *o = out;
    switch (type) {
    case KT_F32:
        memcpy(o, x, (size_t)n * 4);
        break;
    case KT_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = kt_f32_to_f16(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        break;
    case KT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = kt_f32_to_bf16(x[i]);
            memcpy(o + 2 * i, &h, 2);
        }
        break;
    case KT_Q8_0:
        quantize_q8_0(x, o, n);
        break;
    case KT_Q4_0:
        quantize_q4_0(x, o, n);
        break;
    case KT_Q4_1:
        quantize_q4_1(x, o, n);
        break;
    default:
        if (ktk_is_k(type))
            ktk_quantize_row(type, x, out, n);
        break;
    }
}

static float load_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kt_f16_to_f32(h);
}

/* The f16 fields of one block of each quantized type: byte offsets and names (-1: none). */
static const struct {
    uint32_t type;
    int off[2];
    const char *name[2];
} SCALE_FIELDS[] = {
    {KT_Q4_0, {0, -1}, {"d", NULL}},    {KT_Q4_1, {0, 2}, {"d", "m"}},
    {KT_Q8_0, {0, -1}, {"d", NULL}},    {KT_Q5_0, {0, -1}, {"d", NULL}},
    {KT_Q5_1, {0, 2}, {"d", "m"}},      {KT_IQ4_NL, {0, -1}, {"d", NULL}},
    {KT_Q2_K, {80, 82}, {"d", "dmin"}}, {KT_Q3_K, {108, -1}, {"d", NULL}},
    {KT_Q4_K, {0, 2}, {"d", "dmin"}},   {KT_Q5_K, {0, 2}, {"d", "dmin"}},
    {KT_Q6_K, {208, -1}, {"d", NULL}},
};

int64_t kt_check_row(uint32_t type, const void *row, int64_t n, char *why, size_t whylen)
{
    const kt_traits *tr = kt_traits_of(type);
    for (size_t i = 0; tr && i < sizeof SCALE_FIELDS / sizeof SCALE_FIELDS[0]; i++) {
        if (SCALE_FIELDS[i].type != type)
            continue;
        const uint8_t *p = row;
        for (int64_t b = 0; b < n / tr->block; b++, p += tr->block_bytes)
            for (int f = 0; f < 2 && SCALE_FIELDS[i].off[f] >= 0; f++) {
                float v = load_f16(p + SCALE_FIELDS[i].off[f]);
                if (!isfinite(v)) {
                    snprintf(why, whylen, "%s = %s", SCALE_FIELDS[i].name[f],
                             isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
                    return b;
                }
            }
    }
    return -1;
}

int kt_check_matrix(uint32_t type, const void *data, int64_t rows, int64_t cols, size_t row_bytes,
                    char *why, size_t whylen)
{
    char r[64];
    for (int64_t i = 0; i < rows; i++) {
        int64_t b = kt_check_row(type, (const uint8_t *)data + (size_t)i * row_bytes, cols, r,
                                 sizeof r);
        if (b >= 0) {
            snprintf(why, whylen, "row %lld block %lld: %s", (long long)i, (long long)b, r);
            return -1;
        }
    }
    return 0;
}

void kt_dequantize_row(uint32_t type, const void *row, float *out, int64_t n)
{
    const uint8_t *p = row;
    switch (type) {
    case KT_F32:
        memcpy(out, p, (size_t)n * 4);
        break;
    case KT_F16:
        for (int64_t i = 0; i < n; i++)
            out[i] = load_f16(p + 2 * i);
        break;
    case KT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = kt_bf16_to_f32(h);
        }
        break;
    case KT_Q8_0:
        for (int64_t b = 0; b < n / 32; b++, p += 34, out += 32) {
            float d = load_f16(p);
            for (int i = 0; i < 32; i++)
                out[i] = d * (float)(int8_t)p[2 + i];
        }
        break;
    case KT_Q4_0:
        for (int64_t b = 0; b < n / 32; b++, p += 18, out += 32) {
            float d = load_f16(p);
            for (int j = 0; j < 16; j++) {
                out[j] = d * (float)((p[2 + j] & 0xf) - 8);
                out[j + 16] = d * (float)((p[2 + j] >> 4) - 8);
            }
        }
        break;
    case KT_Q4_1:
        for (int64_t b = 0; b < n / 32; b++, p += 20, out += 32) {
            float d = load_f16(p), m = load_f16(p + 2);
            for (int j = 0; j < 16; j++) {
                out[j] = d * (float)(p[4 + j] & 0xf) + m;
                out[j + 16] = d * (float)(p[4 + j] >> 4) + m;
            }
        }
        break;
    default:
        if (ktk_is_k(type))
            ktk_dequantize_row(type, row, out, n);
        break;
    }
}
