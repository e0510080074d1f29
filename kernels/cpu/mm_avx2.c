/*
 * kernels/cpu/mm_avx2.c — matmul micro-kernels for AVX2 + FMA + F16C (compiled with those flags
 * only; matmul.c calls them when cpuid reports them). Layouts and roundings: mm_isa.h.
 *
 * A 16-row group runs as two halves of 8 rows, one ymm lane per row; a single token (a decode
 * step) takes both halves in one pass, so each block is streamed once.
 *   - 4-bit weights: the nibbles are the unsigned operand of vpmaddubsw against the low and high
 *     signed bytes of the activations, four columns per instruction and lane; eight such products
 *     summed in int16 cannot overflow (8 * 2 * 15 * 128 < 32768), then one vpmaddwd widens the
 *     block to int32. Each block is unpacked once per tile of up to 4 tokens.
 *   - Q8_0: the int8 weights are widened to int16 pairs and multiplied with vpmaddwd.
 *   - The K family: codes assembled from nibbles and high-bit planes as in mm_avx512.c, each
 *     vpmaddubsw widened to int32 at once (codes up to 63); IQ4_NL's codes (up to 241) as two
 *     nibble dots. One 8-row half at a time, tiles of 2 tokens.
 *   - Float weights: per column, 8 rows' weights (F16 converted in registers with vcvtph2ps, BF16
 *     by a 16-bit shift) times the broadcast activation of up to 5 tokens, two accumulators per
 *     token; a single token (decode) takes both halves of both groups in one pass.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ktypes_k.h"
#include "kernels/cpu/mm_isa.h"

#define AI static inline __attribute__((always_inline))
#define QT 4 /* tokens per quantized tile */
#define FT 5 /* tokens per float tile (2 accumulators each) */

AI __m256i a2_bcast(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* One 8-row half (h) of a 4-bit group, tokens t0 .. t0 + NT - 1. */
/* Halves h0 .. h0 + NH - 1 (8 rows each) of a 4-bit group, tokens t0 .. t0 + NT - 1. A single
 * token takes both halves in one pass (NH = 2), so each block is streamed once; wider tiles run
 * the halves one after the other (NH = 1) to keep their accumulators in registers. */
AI void a2_q4_tile(bool q41, const int H, int NT, int NH, const uint8_t *pk, int h0, const mm_xq *xq,
                   int t0, float *out)
{
    const int64_t nb = xq->nb;
    const size_t gb = q41 ? 320 : 288;
    const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[QT][2];
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < NH; h++)
            acc[t][h] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = pk + (size_t)b * gb, *qs = p + (q41 ? 64 : 32);
        if (NT >= MM_PF_MIN_TOK)
            mm_prefetch(p, gb);
        __m256i lo[QT][2], hi[QT][2];
        for (int t = 0; t < NT; t++)
            for (int h = 0; h < NH; h++)
                lo[t][h] = hi[t][h] = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++)
            for (int h = 0; h < NH; h++) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 64 * k + 32 * (h0 + h)));
                __m256i wl = _mm256_and_si256(raw, mask);
                __m256i wh = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
                for (int t = 0; t < NT; t++) {
                    size_t xo = mm_xb(xq, t0 + t, b) * 32;
                    const int8_t *xl = xq->lo + xo, *xh = xq->hi + xo;
                    lo[t][h] =
                        _mm256_add_epi16(lo[t][h], _mm256_maddubs_epi16(wl, a2_bcast(xl + 4 * k)));
                    lo[t][h] = _mm256_add_epi16(
                        lo[t][h], _mm256_maddubs_epi16(wh, a2_bcast(xl + 16 + 4 * k)));
                    if (!H)
                        continue;
                    hi[t][h] =
                        _mm256_add_epi16(hi[t][h], _mm256_maddubs_epi16(wl, a2_bcast(xh + 4 * k)));
                    hi[t][h] = _mm256_add_epi16(
                        hi[t][h], _mm256_maddubs_epi16(wh, a2_bcast(xh + 16 + 4 * k)));
                }
            }
        for (int h = 0; h < NH; h++) {
            int hh = h0 + h;
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * hh)));
            __m256 mw = q41 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 32 + 16 * hh)))
                            : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
            for (int t = 0; t < NT; t++) {
                size_t xb = mm_xb(xq, t0 + t, b);
                __m256i dot = _mm256_madd_epi16(lo[t][h], ones);
                if (H)
                    dot = _mm256_add_epi32(
                        _mm256_slli_epi32(_mm256_madd_epi16(hi[t][h], ones), 8), dot);
                __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[xb]));
                acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, acc[t][h]);
                acc[t][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xq->s[xb]), acc[t][h]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < NH; h++)
            _mm256_storeu_ps(out + (size_t)(t0 + t) * MM_GROUP + 8 * (h0 + h), acc[t][h]);
}

/* Q8_0, the same halves scheme as a2_q4_tile. */
AI void a2_q8_tile(int NT, int NH, const uint8_t *pk, int h0, const mm_xq *xq, int t0, float *out)
{
    const int64_t nb = xq->nb;
    __m256 acc[QT][2];
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < NH; h++)
            acc[t][h] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = pk + (size_t)b * 544, *qs = p + 32;
        if (NT >= MM_PF_MIN_TOK)
            mm_prefetch(p, 544);
        __m256i dot[QT][2];
        for (int t = 0; t < NT; t++)
            for (int h = 0; h < NH; h++)
                dot[t][h] = _mm256_setzero_si256();
        for (int pr = 0; pr < 16; pr++)
            for (int h = 0; h < NH; h++) {
                __m256i w = _mm256_cvtepi8_epi16(
                    _mm_loadu_si128((const __m128i *)(qs + 32 * pr + 16 * (h0 + h))));
                for (int t = 0; t < NT; t++) {
                    const int16_t *x =
                        xq->q + mm_xb(xq, t0 + t, b) * 32 + 2 * pr;
                    int32_t v;
                    memcpy(&v, x, 4);
                    dot[t][h] =
                        _mm256_add_epi32(dot[t][h], _mm256_madd_epi16(w, _mm256_set1_epi32(v)));
                }
            }
        for (int h = 0; h < NH; h++) {
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * (h0 + h))));
            for (int t = 0; t < NT; t++) {
                size_t xb = mm_xb(xq, t0 + t, b);
                __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[xb]));
                acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t][h]), sc, acc[t][h]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int h = 0; h < NH; h++)
            _mm256_storeu_ps(out + (size_t)(t0 + t) * MM_GROUP + 8 * (h0 + h), acc[t][h]);
}

#define A2_Q_CASES(CALL)                                                                           \
    switch (nt) {                                                                                  \
    case 1: CALL(1); break;                                                                        \
    case 2: CALL(2); break;                                                                        \
    case 3: CALL(3); break;                                                                        \
    default: CALL(4); break;                                                                       \
    }

/* H: 1 with 16-bit activations (the high-byte dots), 0 with 8-bit ones; a constant in each call
 * below, so each precision gets its own straight-line tiles */
AI void a2_qgroup_h(const int H, uint32_t type, const uint8_t *pk, const mm_xq *xq, int n_tok,
                    float *out)
{
    if (n_tok == 1) { /* a decode step: both halves in one pass */
        if (type == KT_Q8_0)
            a2_q8_tile(1, 2, pk, 0, xq, 0, out);
        else
            a2_q4_tile(type == KT_Q4_1, H, 1, 2, pk, 0, xq, 0, out);
        return;
    }
    for (int h = 0; h < 2; h++)
        for (int t0 = 0; t0 < n_tok; t0 += QT) {
            int nt = n_tok - t0 < QT ? n_tok - t0 : QT;
            if (type == KT_Q8_0) {
#define C8(N) a2_q8_tile(N, 1, pk, h, xq, t0, out)
                A2_Q_CASES(C8)
            } else if (type == KT_Q4_1) {
#define C41(N) a2_q4_tile(true, H, N, 1, pk, h, xq, t0, out)
                A2_Q_CASES(C41)
            } else {
#define C40(N) a2_q4_tile(false, H, N, 1, pk, h, xq, t0, out)
                A2_Q_CASES(C40)
            }
        }
}

static void a2_qgroup(uint32_t type, const uint8_t *pk, const mm_xq *xq, int n_tok, float *out)
{
    if (xq->bits == 8)
        a2_qgroup_h(0, type, pk, xq, n_tok, out);
    else
        a2_qgroup_h(1, type, pk, xq, n_tok, out);
}

/* ===== the K family (layout: mm_isa.h) ===== */

#define KQT 2 /* tokens per K-family tile */

/* u8 x s8 dot of four columns per lane, widened to int32 at once (codes up to 63: a vpmaddubsw
 * pair sum stays below 2 * 63 * 128 < 32768) */
AI __m256i a2_dot4(__m256i w, __m256i x)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
}

/* IQ4_NL codes reach 241, too large for one vpmaddubsw pair: dot with the code's low and high
 * nibbles (tables tl, th) apart, the high one weighted 16 */
AI __m256i a2_dot4_lut(__m256i idx, __m256i tl, __m256i th, __m256i x)
{
    return _mm256_add_epi32(a2_dot4(_mm256_shuffle_epi8(tl, idx), x),
                            _mm256_slli_epi32(a2_dot4(_mm256_shuffle_epi8(th, idx), x), 4));
}

/* Half h (8 rows) of one packed K-family group, tokens t0 .. t0 + NT - 1 (see a5_k_tile in
 * mm_avx512.c for the same steps with 16 lanes). */
AI void a2_k_tile(const int NSC, const int MINS, const int HB, const int LUT, const int KB, int NT,
                  const uint8_t *pk, int h, const mm_xq *xq, float z, int t0, float *out)
{
    const int64_t nb = xq->nb;
    const size_t kbb = (size_t)NSC * 16 * (1 + MINS) + 256 + (size_t)HB * 64,
                 sb = MM_KHDR + (size_t)KB * kbb;
    const __m256i mask = _mm256_set1_epi8(0x0f), b4 = _mm256_set1_epi8(0x10),
                  b45 = _mm256_set1_epi8(0x30);
    __m256i tl = _mm256_setzero_si256(), th = _mm256_setzero_si256();
    if (LUT) {
        uint8_t lo[16], hi[16];
        for (int i = 0; i < 16; i++) {
            lo[i] = (uint8_t)((KTK_IQ4NL[i] + 128) & 15);
            hi[i] = (uint8_t)((KTK_IQ4NL[i] + 128) >> 4);
        }
        tl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lo));
        th = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)hi));
    }
    const __m256 zv = _mm256_set1_ps(z);
    __m256 acc[KQT], D = _mm256_setzero_ps(), M = _mm256_setzero_ps();
    for (int t = 0; t < NT; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sp = pk + (size_t)(b / KB) * sb;
        if (b % KB == 0) {
            D = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 16 * h)));
            M = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp + 32 + 16 * h)));
        }
        const uint8_t *p = sp + MM_KHDR + (size_t)(b % KB) * kbb;
        if (NT >= MM_PF_MIN_TOK)
            mm_prefetch(p, kbb);
        __m256 f[2], o[2];
        for (int r = 0; r < (NSC == 2 ? 2 : 1); r++) {
            __m256 sc = _mm256_set1_ps(1.0f), mn = _mm256_set1_ps(1.0f);
            if (NSC) {
                sc = _mm256_cvtepi32_ps(
                    _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16 * r + 8 * h))));
                mn = MINS ? _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                (const __m128i *)(p + 16 * (NSC + r) + 8 * h))))
                          : _mm256_setzero_ps();
            }
            f[r] = _mm256_mul_ps(D, sc);
            o[r] = _mm256_sub_ps(_mm256_mul_ps(M, mn), _mm256_mul_ps(zv, f[r]));
        }
        const uint8_t *q = p + (size_t)NSC * 16 * (1 + MINS);
        __m256i qh0 = _mm256_setzero_si256(), qh1 = _mm256_setzero_si256();
        if (HB >= 1)
            qh0 = _mm256_loadu_si256((const __m256i *)(q + 256 + 32 * h));
        if (HB == 2)
            qh1 = _mm256_loadu_si256((const __m256i *)(q + 320 + 32 * h));
        __m256i l0[KQT], l1[KQT], h0[KQT], h1[KQT];
        for (int t = 0; t < NT; t++)
            l0[t] = l1[t] = h0[t] = h1[t] = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(q + 64 * k + 32 * h));
            __m256i wl = _mm256_and_si256(raw, mask);
            __m256i wh = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
            if (HB == 1) {
                wl = _mm256_or_si256(
                    wl, _mm256_and_si256(_mm256_sll_epi16(qh0, _mm_cvtsi32_si128(4 - k)), b4));
                wh = _mm256_or_si256(
                    wh, _mm256_and_si256(_mm256_srl_epi16(qh0, _mm_cvtsi32_si128(k)), b4));
            }
            if (HB == 2) {
                __m256i a = k < 2 ? _mm256_sll_epi16(qh0, _mm_cvtsi32_si128(4 - 2 * k))
                                  : _mm256_srl_epi16(qh0, _mm_cvtsi32_si128(2 * k - 4));
                __m256i c = k < 2 ? _mm256_sll_epi16(qh1, _mm_cvtsi32_si128(4 - 2 * k))
                                  : _mm256_srl_epi16(qh1, _mm_cvtsi32_si128(2 * k - 4));
                wl = _mm256_or_si256(wl, _mm256_and_si256(a, b45));
                wh = _mm256_or_si256(wh, _mm256_and_si256(c, b45));
            }
            for (int t = 0; t < NT; t++) {
                size_t xo = mm_xb(xq, t0 + t, b) * 32;
                const int8_t *xl = xq->lo + xo, *xh = xq->hi + xo;
                __m256i xl0 = a2_bcast(xl + 4 * k), xl1 = a2_bcast(xl + 16 + 4 * k),
                        xh0 = a2_bcast(xh + 4 * k), xh1 = a2_bcast(xh + 16 + 4 * k);
                if (LUT) {
                    l0[t] = _mm256_add_epi32(l0[t], a2_dot4_lut(wl, tl, th, xl0));
                    l1[t] = _mm256_add_epi32(l1[t], a2_dot4_lut(wh, tl, th, xl1));
                    h0[t] = _mm256_add_epi32(h0[t], a2_dot4_lut(wl, tl, th, xh0));
                    h1[t] = _mm256_add_epi32(h1[t], a2_dot4_lut(wh, tl, th, xh1));
                } else {
                    l0[t] = _mm256_add_epi32(l0[t], a2_dot4(wl, xl0));
                    l1[t] = _mm256_add_epi32(l1[t], a2_dot4(wh, xl1));
                    h0[t] = _mm256_add_epi32(h0[t], a2_dot4(wl, xh0));
                    h1[t] = _mm256_add_epi32(h1[t], a2_dot4(wh, xh1));
                }
            }
        }
        for (int t = 0; t < NT; t++) {
            size_t xb = mm_xb(xq, t0 + t, b);
            __m256 dx = _mm256_set1_ps(xq->d[xb]);
            __m256i d0 = _mm256_add_epi32(_mm256_slli_epi32(h0[t], 8), l0[t]);
            __m256i d1 = _mm256_add_epi32(_mm256_slli_epi32(h1[t], 8), l1[t]);
            if (NSC < 2) {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(d0, d1)),
                                         _mm256_mul_ps(f[0], dx), acc[t]);
                acc[t] = _mm256_fmadd_ps(o[0], _mm256_set1_ps(xq->s[xb]), acc[t]);
            } else {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d0), _mm256_mul_ps(f[0], dx), acc[t]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d1), _mm256_mul_ps(f[1], dx), acc[t]);
                acc[t] = _mm256_fmadd_ps(o[0], _mm256_set1_ps(xq->s16[2 * xb]), acc[t]);
                acc[t] = _mm256_fmadd_ps(o[1], _mm256_set1_ps(xq->s16[2 * xb + 1]), acc[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        _mm256_storeu_ps(out + (size_t)(t0 + t) * MM_GROUP + 8 * h, acc[t]);
}

#define A2_K_CASES(NSC, MINS, HB, LUT, KB)                                                         \
    if (nt == 1)                                                                                   \
        a2_k_tile(NSC, MINS, HB, LUT, KB, 1, pk, h, xq, z, t0, out);                               \
    else                                                                                           \
        a2_k_tile(NSC, MINS, HB, LUT, KB, 2, pk, h, xq, z, t0, out);

static void a2_kgroup(const mm_kdesc *k, const uint8_t *pk, const mm_xq *xq, int n_tok, float *out)
{
    float z = (float)k->z;
    for (int h = 0; h < 2; h++)
        for (int t0 = 0; t0 < n_tok; t0 += KQT) {
            int nt = n_tok - t0 < KQT ? n_tok - t0 : KQT;
            if (k->lut) {
                A2_K_CASES(0, 0, 0, 1, 1)
            } else if (k->kb == 1) {
                A2_K_CASES(0, 0, 1, 0, 1) /* Q5_0, Q5_1 */
            } else if (k->nsc == 1 && k->hb == 0) {
                A2_K_CASES(1, 1, 0, 0, 8) /* Q4_K */
            } else if (k->nsc == 1) {
                A2_K_CASES(1, 1, 1, 0, 8) /* Q5_K */
            } else if (k->hb == 2) {
                A2_K_CASES(2, 0, 2, 0, 8) /* Q6_K */
            } else if (k->mins) {
                A2_K_CASES(2, 1, 0, 0, 8) /* Q2_K */
            } else {
                A2_K_CASES(2, 0, 0, 0, 8) /* Q3_K */
            }
        }
}

/* ===== float weights ===== */

AI __m256 a2_load_f(uint32_t type, const uint8_t *p)
{
    if (type == KT_F32)
        return _mm256_loadu_ps((const float *)(const void *)p);
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (type == KT_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Half h (8 rows) of one float group, tokens t0 .. t0 + NT - 1, two partial sums per token. */
AI void a2_f_tile(uint32_t type, int NT, const uint8_t *pk, int h, int64_t cols, const float *x,
                  int t0, float *out, int ostride)
{
    const size_t es = type == KT_F32 ? 4 : 2, col = MM_GROUP * es;
    __m256 acc[FT][2];
    for (int t = 0; t < NT; t++)
        acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    const uint8_t *base = pk + (size_t)8 * h * es;
    int64_t k = 0;
    for (; k + 2 <= cols; k += 2) {
        if (NT >= MM_PF_MIN_TOK)
            mm_prefetch(pk + (size_t)k * col, 2 * col);
        for (int p = 0; p < 2; p++) {
            __m256 w = a2_load_f(type, base + (size_t)(k + p) * col);
            for (int t = 0; t < NT; t++)
                acc[t][p] = _mm256_fmadd_ps(
                    w, _mm256_set1_ps(x[(size_t)(t0 + t) * (size_t)cols + k + p]), acc[t][p]);
        }
    }
    if (k < cols) {
        __m256 w = a2_load_f(type, base + (size_t)k * col);
        for (int t = 0; t < NT; t++)
            acc[t][0] = _mm256_fmadd_ps(w, _mm256_set1_ps(x[(size_t)(t0 + t) * (size_t)cols + k]),
                                        acc[t][0]);
    }
    for (int t = 0; t < NT; t++)
        _mm256_storeu_ps(out + (size_t)(t0 + t) * ostride + 8 * h,
                         _mm256_add_ps(acc[t][0], acc[t][1]));
}

/* One token (a decode step), both halves of one group in one pass: the group is streamed once
 * and each activation broadcast serves all 16 rows. The same per-lane roundings as a2_f_tile. */
AI void a2_f_one(uint32_t type, const uint8_t *pk, int64_t cols, const float *x, float *out)
{
    const size_t es = type == KT_F32 ? 4 : 2, col = MM_GROUP * es;
    __m256 acc[2][2];
    for (int h = 0; h < 2; h++)
        acc[h][0] = acc[h][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 2 <= cols; k += 2)
        for (int p = 0; p < 2; p++) {
            __m256 xv = _mm256_set1_ps(x[k + p]);
            for (int h = 0; h < 2; h++)
                acc[h][p] = _mm256_fmadd_ps(
                    a2_load_f(type, pk + (size_t)(k + p) * col + (size_t)8 * h * es), xv,
                    acc[h][p]);
        }
    if (k < cols) {
        __m256 xv = _mm256_set1_ps(x[k]);
        for (int h = 0; h < 2; h++)
            acc[h][0] = _mm256_fmadd_ps(a2_load_f(type, pk + (size_t)k * col + (size_t)8 * h * es),
                                        xv, acc[h][0]);
    }
    for (int h = 0; h < 2; h++)
        _mm256_storeu_ps(out + 8 * h, _mm256_add_ps(acc[h][0], acc[h][1]));
}

AI void a2_fgroup_t(uint32_t type, const uint8_t *pk, int ng, size_t gbytes, int64_t cols,
                    const float *x, int n_tok, float *out)
{
    if (n_tok == 1) {
        /* one group after the other: one sequential stream (two side by side stream slower) */
        for (int g = 0; g < ng; g++)
            a2_f_one(type, pk + (size_t)g * gbytes, cols, x, out + MM_GROUP * g);
        return;
    }
    for (int g = 0; g < ng; g++)
        for (int h = 0; h < 2; h++)
            for (int t0 = 0; t0 < n_tok; t0 += FT) {
                int nt = n_tok - t0 < FT ? n_tok - t0 : FT;
                const uint8_t *gp = pk + (size_t)g * gbytes;
                float *go = out + MM_GROUP * g;
                int os = MM_GROUP * ng;
                if (nt == 1)
                    a2_f_tile(type, 1, gp, h, cols, x, t0, go, os);
                else if (nt == 2)
                    a2_f_tile(type, 2, gp, h, cols, x, t0, go, os);
                else if (nt == 3)
                    a2_f_tile(type, 3, gp, h, cols, x, t0, go, os);
                else if (nt == 4)
                    a2_f_tile(type, 4, gp, h, cols, x, t0, go, os);
                else
                    a2_f_tile(type, 5, gp, h, cols, x, t0, go, os);
            }
}

static void a2_fgroup(uint32_t type, const uint8_t *pk, int ng, size_t gbytes, int64_t cols,
                      const float *x, int n_tok, float *out)
{
    if (type == KT_F16)
        a2_fgroup_t(KT_F16, pk, ng, gbytes, cols, x, n_tok, out);
    else if (type == KT_BF16)
        a2_fgroup_t(KT_BF16, pk, ng, gbytes, cols, x, n_tok, out);
    else
        a2_fgroup_t(KT_F32, pk, ng, gbytes, cols, x, n_tok, out);
}

const mm_isa mm_isa_avx2 = {
    .name = "avx2", .qgroup = a2_qgroup, .kgroup = a2_kgroup, .fgroup = a2_fgroup};
