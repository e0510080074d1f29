/*
 * kernels/cpu/mm_portable.c — the matmul micro-kernels in plain C.
 *
 * The reference for the SIMD paths (same packed layout, same roundings: see mm_isa.h) and the
 * path for CPUs with neither AVX2 nor AVX-512 (and for non-x86 builds). Slow but exact: its results
 * are bit-identical to mm_avx2.c and mm_avx512.c, which tests/unit/test_kernels.c checks.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ktypes_k.h"
#include "kernels/cpu/mm_isa.h"

static float pt_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kt_f16_to_f32(h);
}

static void pt_qgroup(uint32_t type, const uint8_t *pk, const mm_xq *xq, int n_tok, float *out)
{
    int64_t nb = xq->nb;
    size_t gb = mm_group_block_bytes(type);
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < MM_GROUP; j++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *p = pk + (size_t)b * gb;
                const int16_t *xqv = xq->q + mm_xb(xq, t, b) * 32;
                float dw = pt_f16(p + 2 * j), dx = xq->d[mm_xb(xq, t, b)];
                int32_t dot = 0;
                if (type == KT_Q8_0) {
                    const int8_t *qs = (const int8_t *)(p + 32);
                    for (int e = 0; e < 32; e++)
                        dot += qs[(e / 2) * 32 + j * 2 + e % 2] * xqv[e];
                    acc = fmaf((float)dot, dw * dx, acc);
                    continue;
                }
                const uint8_t *qs = p + (type == KT_Q4_1 ? 64 : 32);
                for (int e = 0; e < 16; e++) {
                    uint8_t byte = qs[(e / 4) * 64 + j * 4 + e % 4];
                    dot += (byte & 0x0f) * xqv[e] + (byte >> 4) * xqv[e + 16];
                }
                float mw = type == KT_Q4_1 ? pt_f16(p + 32 + 2 * j) : dw * -8.0f;
                acc = fmaf((float)dot, dw * dx, acc);
                acc = fmaf(mw, xq->s[mm_xb(xq, t, b)], acc);
            }
            out[t * MM_GROUP + j] = acc;
        }
}

/* Code of element e (0..31) of row j in a packed kblock p (after its scales and mins). */
static int pt_kcode(const mm_kdesc *k, const uint8_t *q, int j, int e)
{
    int half = e / 16, i = e % 4, step = (e % 16) / 4;
    int c = (q[step * 64 + j * 4 + i] >> (4 * half)) & 15;
    if (k->lut)
        return KTK_IQ4NL[c] + 128;
    const uint8_t *qh = q + 256;
    if (k->hb == 1)
        c |= ((qh[j * 4 + i] >> (step + 4 * half)) & 1) << 4;
    if (k->hb == 2)
        c |= ((qh[64 * half + j * 4 + i] >> (2 * step)) & 3) << 4;
    return c;
}

static void pt_kgroup(const mm_kdesc *k, const uint8_t *pk, const mm_xq *xq, int n_tok, float *out)
{
    int64_t nb = xq->nb;
    size_t kbb = mm_kblock_bytes(k), sb = mm_ksuper_bytes(k);
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < MM_GROUP; j++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *sp = pk + (size_t)(b / k->kb) * sb;
                const uint8_t *p = sp + MM_KHDR + (size_t)(b % k->kb) * kbb;
                float D = pt_f16(sp + 2 * j), M = pt_f16(sp + 32 + 2 * j);
                const int16_t *xqv = xq->q + mm_xb(xq, t, b) * 32;
                float dx = xq->d[mm_xb(xq, t, b)];
                const uint8_t *q = p + (size_t)k->nsc * 16 * (1 + k->mins);
                int32_t dot[2] = {0, 0};
                for (int e = 0; e < 32; e++)
                    dot[e / 16] += pt_kcode(k, q, j, e) * xqv[e];
                float f[2], o[2];
                for (int h = 0; h < 2; h++) {
                    int r = k->nsc == 2 ? h : 0;
                    float sc = k->nsc ? (float)(int8_t)p[16 * r + j] : 1.0f;
                    float mn = k->nsc ? (k->mins ? (float)(int8_t)p[16 * (k->nsc + r) + j] : 0.0f)
                                      : 1.0f;
                    f[h] = D * sc;
                    float pm = M * mn, pz = (float)k->z * f[h];
                    o[h] = pm - pz;
                }
                if (k->nsc < 2) {
                    acc = fmaf((float)(dot[0] + dot[1]), f[0] * dx, acc);
                    acc = fmaf(o[0], xq->s[mm_xb(xq, t, b)], acc);
                } else {
                    const float *s16 = xq->s16 + 2 * mm_xb(xq, t, b);
                    acc = fmaf((float)dot[0], f[0] * dx, acc);
                    acc = fmaf((float)dot[1], f[1] * dx, acc);
                    acc = fmaf(o[0], s16[0], acc);
                    acc = fmaf(o[1], s16[1], acc);
                }
            }
            out[t * MM_GROUP + j] = acc;
        }
}

static float pt_weight(uint32_t type, const uint8_t *pk, int64_t k, int j)
{
    if (type == KT_F32) {
        float f;
        memcpy(&f, pk + ((size_t)k * MM_GROUP + (size_t)j) * 4, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, pk + ((size_t)k * MM_GROUP + (size_t)j) * 2, 2);
    return type == KT_F16 ? kt_f16_to_f32(h) : kt_bf16_to_f32(h);
}

static void pt_fgroup(uint32_t type, const uint8_t *pk, int ng, size_t gbytes, int64_t cols,
                      const float *x, int n_tok, float *out)
{
    for (int g = 0; g < ng; g++)
        for (int t = 0; t < n_tok; t++)
            for (int j = 0; j < MM_GROUP; j++) {
                const float *xt = x + (size_t)t * (size_t)cols;
                float part[2] = {0};
                for (int64_t k = 0; k < cols; k++)
                    part[k % 2] =
                        fmaf(pt_weight(type, pk + (size_t)g * gbytes, k, j), xt[k], part[k % 2]);
                out[(size_t)t * MM_GROUP * ng + MM_GROUP * g + j] = part[0] + part[1];
            }
}

const mm_isa mm_isa_portable = {
    .name = "portable", .qgroup = pt_qgroup, .kgroup = pt_kgroup, .fgroup = pt_fgroup};
