/*
 * kernels/cpu/mm_avx512.c — matmul micro-kernels for AVX-512 F/BW/VL with VNNI (compiled with
 * those flags only; matmul.c calls them when cpuid reports them). Layouts and roundings: mm_isa.h.
 *
 * One zmm lane per row of the 16-row group.
 *   - 4-bit weights: the nibbles are the unsigned operand of vpdpbusd against the low and high
 *     signed bytes of the activations (four columns per instruction and lane, int32 accumulation:
 *     exact), combined as 256 * hi + lo per block. A block is unpacked once per tile of up to 8
 *     tokens (4 with 16-bit activations: QT4H), so a verification step of W <= 8 reads each
 *     weight from memory once.
 *   - Q8_0: int8 weights widened to int16 pairs, vpdpwssd; with 8-bit activations the weights
 *     (+128) take vpdpbusd four columns at a time (a5_q8_tile).
 *   - 8-bit activations (mm_xq.bits = 8): the 4-bit and K-family tiles leave out the high-byte
 *     dots (half the vpdpbusd).
 *   - The K family (Q2_K..Q6_K, Q5_0/1, IQ4_NL): the codes' low nibbles as for 4-bit weights, the
 *     bits above them shifted in from the high-bit planes (IQ4_NL: nibble to code by vpshufb),
 *     then the same vpdpbusd dots, kept apart for the first and second 16 columns of a block
 *     (their scales may differ); tiles of 4 tokens.
 *   - Float weights: per column, a group's weights (F16 converted in registers with vcvtph2ps,
 *     BF16 by a 16-bit shift) times the broadcast activation of up to 8 tokens, two accumulators
 *     per row and token; steps of more than 32 tokens take two groups side by side and 6 tokens
 *     a tile (24 accumulators, one broadcast per two FMAs).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ktypes_k.h"
#include "kernels/cpu/mm_isa.h"

#define AI static inline __attribute__((always_inline))
#define QT 8 /* tokens per quantized tile */
/* Tokens per Q4_0/Q4_1 tile with 16-bit activations: 8 tokens' low and high chains and float
 * sums (24 zmm) with the unpacked weights spill; 4 do not. AMD Zen 5, 2 threads, Q4_1
 * SmolLM2-135M, `orochi bench --widths 8,16,32 --act-bits 16` interleaved twice: W = 8 5.43/5.65
 * -> 5.03/4.83 ms, W = 16 10.05/10.16 -> 9.34/9.02, W = 32 19.94/19.45 -> 18.13/17.76 (6 tokens
 * in between). */
#define QT4H 4
#define FT 6  /* tokens per float tile of two groups (2 accumulators per group each) */
#define FT1 8 /* tokens per float tile of one group */
/* Steps of up to FT_ONE tokens work one group after the other (one sequential weight stream,
 * tiles of FT1 tokens re-reading the group from cache); wider ones two groups side by side. On
 * AMD Zen 5, 2 threads, F16 SmolLM2-135M (interleaved A/B, `orochi bench --widths`): W = 6..8
 * 9.5-12.2 -> 7.2-8.7 ms, W = 12..16 13.2-17.0 -> 11.5-13.9 ms, W = 32 about even, W = 64 two
 * groups ahead by ~5%. */
#define FT_ONE 32

AI __m512i a5_bcast(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

AI void a5_q4_tile(bool q41, const int H, int NT, const uint8_t *pk, const mm_xq *xq, int t0,
                   float *out)
{
    const int64_t nb = xq->nb;
    const size_t gb = q41 ? 320 : 288;
    const __m512i mask = _mm512_set1_epi8(0x0f);
    __m512 acc[QT];
    for (int t = 0; t < NT; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = pk + (size_t)b * gb;
        if (NT >= MM_PF_MIN_TOK)
            mm_prefetch(p, gb);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        __m512 mw = q41 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)))
                        : _mm512_mul_ps(dw, _mm512_set1_ps(-8.0f));
        const uint8_t *qs = p + (q41 ? 64 : 32);
        /* with few tokens the dependent vpdpbusd chains bound the loop, so each of lo and hi is
         * split in two (low and high nibbles); integer sums, so the split changes no bit */
        const int SPLIT = NT <= 2 ? 2 : 1;
        __m512i lo[QT][2], hi[QT][2];
        for (int t = 0; t < NT; t++)
            for (int h = 0; h < SPLIT; h++)
                lo[t][h] = hi[t][h] = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
            __m512i raw = _mm512_loadu_si512((const void *)(qs + 64 * k));
            __m512i wl = _mm512_and_si512(raw, mask);
            __m512i wh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
            for (int t = 0; t < NT; t++) {
                size_t xo = mm_xb(xq, t0 + t, b) * 32;
                const int8_t *xl = xq->lo + xo, *xh = xq->hi + xo;
                lo[t][0] = _mm512_dpbusd_epi32(lo[t][0], wl, a5_bcast(xl + 4 * k));
                lo[t][SPLIT - 1] =
                    _mm512_dpbusd_epi32(lo[t][SPLIT - 1], wh, a5_bcast(xl + 16 + 4 * k));
                if (H) {
                    hi[t][0] = _mm512_dpbusd_epi32(hi[t][0], wl, a5_bcast(xh + 4 * k));
                    hi[t][SPLIT - 1] =
                        _mm512_dpbusd_epi32(hi[t][SPLIT - 1], wh, a5_bcast(xh + 16 + 4 * k));
                }
            }
        }
        for (int t = 0; t < NT; t++) {
            size_t xb = mm_xb(xq, t0 + t, b);
            __m512i lot = lo[t][0], hit = hi[t][0];
            if (SPLIT == 2) {
                lot = _mm512_add_epi32(lot, lo[t][1]);
                hit = _mm512_add_epi32(hit, hi[t][1]);
            }
            __m512i dot = H ? _mm512_add_epi32(_mm512_slli_epi32(hit, 8), lot) : lot;
            __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(xq->d[xb]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, acc[t]);
            acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xq->s[xb]), acc[t]);
        }
    }
    for (int t = 0; t < NT; t++)
        _mm512_storeu_ps(out + (size_t)(t0 + t) * MM_GROUP, acc[t]);
}

/* Q8_0. 16-bit activations (E8 = 0): the weights widened to int16 pairs, vpdpwssd. 8-bit
 * activations (E8 = 1): four columns per vpdpbusd — pairs 2c and 2c + 1 of the packed block (64
 * bytes) interleaved into four bytes per row by vpermw, made unsigned (+128), dotted with the four
 * activation bytes, and 128 * the block's sum of q taken off: the same exact integer dot with half
 * the dot instructions. */
AI void a5_q8_tile(const int E8, int NT, const uint8_t *pk, const mm_xq *xq, int t0, float *out)
{
    const int64_t nb = xq->nb;
    /* 16-bit unit 2j <- row j of pair 2c, 2j + 1 <- row j of pair 2c + 1 */
    const __m512i perm = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                          24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                          16, 0);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    __m512 acc[QT];
    for (int t = 0; t < NT; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = pk + (size_t)b * 544;
        if (NT >= MM_PF_MIN_TOK)
            mm_prefetch(p, 544);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        const uint8_t *qs = p + 32;
        /* few tokens: two chains per token (even and odd steps) so the dot latency does not
         * bound the loop; integer sums, so the split changes no bit */
        const int SPLIT = NT <= 2 ? 2 : 1;
        __m512i dot[QT][2];
        for (int t = 0; t < NT; t++)
            for (int h = 0; h < SPLIT; h++)
                dot[t][h] = _mm512_setzero_si512();
        for (int c = 0; c < (E8 ? 8 : 16); c++) {
            __m512i w;
            if (E8)
                w = _mm512_xor_si512(_mm512_permutexvar_epi16(
                                         perm, _mm512_loadu_si512((const void *)(qs + 64 * c))),
                                     bias);
            else
                w = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(qs + 32 * c)));
            for (int t = 0; t < NT; t++) {
                size_t xo = mm_xb(xq, t0 + t, b) * 32;
                __m512i *dc = &dot[t][c % SPLIT];
                if (E8)
                    *dc = _mm512_dpbusd_epi32(*dc, w, a5_bcast(xq->lo + xo + 4 * c));
                else
                    *dc = _mm512_dpwssd_epi32(*dc, w, a5_bcast(xq->q + xo + 2 * c));
            }
        }
        for (int t = 0; t < NT; t++) {
            size_t xb = mm_xb(xq, t0 + t, b);
            __m512i d = SPLIT == 2 ? _mm512_add_epi32(dot[t][0], dot[t][SPLIT - 1]) : dot[t][0];
            if (E8)
                d = _mm512_sub_epi32(d, _mm512_set1_epi32(128 * xq->qsum[xb]));
            __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(xq->d[xb]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[t]);
        }
    }
    for (int t = 0; t < NT; t++)
        _mm512_storeu_ps(out + (size_t)(t0 + t) * MM_GROUP, acc[t]);
}

#define A5_Q_CASES(CALL)                                                                           \
    switch (nt) {                                                                                  \
    case 1: CALL(1); break;                                                                        \
    case 2: CALL(2); break;                                                                        \
    case 3: CALL(3); break;                                                                        \
    case 4: CALL(4); break;                                                                        \
    case 5: CALL(5); break;                                                                        \
    case 6: CALL(6); break;                                                                        \
    case 7: CALL(7); break;                                                                        \
    default: CALL(8); break;                                                                       \
    }

/* H: 1 with 16-bit activations (the high-byte dots), 0 with 8-bit ones; a constant in each call
 * below, so each precision gets its own straight-line tiles */
AI void a5_qgroup_h(const int H, uint32_t type, const uint8_t *pk, const mm_xq *xq, int n_tok,
                    float *out)
{
    const int qt = H && type != KT_Q8_0 ? QT4H : QT;
    for (int t0 = 0; t0 < n_tok; t0 += qt) {
        int nt = n_tok - t0 < qt ? n_tok - t0 : qt;
        if (type == KT_Q8_0) {
#define C8(N) a5_q8_tile(!H, N, pk, xq, t0, out)
            A5_Q_CASES(C8)
        } else if (type == KT_Q4_1) {
#define C41(N) a5_q4_tile(true, H, N, pk, xq, t0, out)
            A5_Q_CASES(C41)
        } else {
#define C40(N) a5_q4_tile(false, H, N, pk, xq, t0, out)
            A5_Q_CASES(C40)
        }
    }
}

static void a5_qgroup(uint32_t type, const uint8_t *pk, const mm_xq *xq, int n_tok, float *out)
{
    if (xq->bits == 8)
        a5_qgroup_h(0, type, pk, xq, n_tok, out);
    else
        a5_qgroup_h(1, type, pk, xq, n_tok, out);
}

/* ===== the K family (layout: mm_isa.h) ===== */

/* Tokens per K-family tile. Layouts with one scale per 32 columns (NSC < 2: Q4_K, Q5_K, Q5_0/Q5_1,
 * IQ4_NL) sum both halves of a block into one int32 chain per token and byte (exact integer sums:
 * no bit changes), so a tile holds 8 tokens with 8-bit activations and 6 with 16-bit ones; the
 * two-scale layouts (Q2_K, Q3_K, Q6_K) keep two chains per half and 4 tokens. A wider tile decodes
 * each block's weights once for more tokens. */
#define KQT 8
#define KQT_1SC(H) ((H) ? 4 : 8)
#define KQT_2SC 4

/* Tokens t0 .. t0 + NT - 1 of one packed K-family group. NSC, MINS, HB, LUT and KB are the
 * layout's constants (mm_kdesc), so each type gets its own straight-line loop. */
AI void a5_k_tile(const int NSC, const int MINS, const int HB, const int LUT, const int KB,
                  const int H, int NT, const uint8_t *pk, const mm_xq *xq, float z, int t0,
                  float *out)
{
    const int64_t nb = xq->nb;
    const size_t kbb = (size_t)NSC * 16 * (1 + MINS) + 256 + (size_t)HB * 64,
                 sb = MM_KHDR + (size_t)KB * kbb;
    const __m512i mask = _mm512_set1_epi8(0x0f), b4 = _mm512_set1_epi8(0x10),
                  b45 = _mm512_set1_epi8(0x30);
    __m512i lut = _mm512_setzero_si512();
    if (LUT) {
        uint8_t codes[16];
        for (int i = 0; i < 16; i++)
            codes[i] = (uint8_t)(KTK_IQ4NL[i] + 128);
        lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)codes));
    }
    const __m512 zv = _mm512_set1_ps(z);
    __m512 acc[KQT], D = _mm512_setzero_ps(), M = _mm512_setzero_ps();
    for (int t = 0; t < NT; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *sp = pk + (size_t)(b / KB) * sb;
        if (b % KB == 0) {
            D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sp));
            M = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp + 32)));
        }
        const uint8_t *p = sp + MM_KHDR + (size_t)(b % KB) * kbb;
        if (NT >= MM_PF_MIN_TOK)
            mm_prefetch(p, kbb);
        /* f = D * sc and o = M * mn - z * f per row (both products exact) */
        __m512 f[2], o[2];
        for (int h = 0; h < (NSC == 2 ? 2 : 1); h++) {
            __m512 sc = _mm512_set1_ps(1.0f), mn = _mm512_set1_ps(1.0f);
            if (NSC) {
                sc = _mm512_cvtepi32_ps(
                    _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * h))));
                mn = MINS ? _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                _mm_loadu_si128((const __m128i *)(p + 16 * (NSC + h)))))
                          : _mm512_setzero_ps();
            }
            f[h] = _mm512_mul_ps(D, sc);
            o[h] = _mm512_sub_ps(_mm512_mul_ps(M, mn), _mm512_mul_ps(zv, f[h]));
        }
        const uint8_t *q = p + (size_t)NSC * 16 * (1 + MINS);
        __m512i qh0 = _mm512_setzero_si512(), qh1 = _mm512_setzero_si512();
        if (HB >= 1)
            qh0 = _mm512_loadu_si512((const void *)(q + 256));
        if (HB == 2)
            qh1 = _mm512_loadu_si512((const void *)(q + 320));
        __m512i l0[KQT], l1[KQT], h0[KQT], h1[KQT];
        for (int t = 0; t < NT; t++)
            l0[t] = l1[t] = h0[t] = h1[t] = _mm512_setzero_si512();
        for (int k = 0; k < 4; k++) {
            __m512i raw = _mm512_loadu_si512((const void *)(q + 64 * k));
            __m512i wl = _mm512_and_si512(raw, mask);
            __m512i wh = _mm512_and_si512(_mm512_srli_epi16(raw, 4), mask);
            if (LUT) {
                wl = _mm512_shuffle_epi8(lut, wl);
                wh = _mm512_shuffle_epi8(lut, wh);
            }
            if (HB == 1) {
                wl = _mm512_or_si512(
                    wl, _mm512_and_si512(_mm512_sll_epi16(qh0, _mm_cvtsi32_si128(4 - k)), b4));
                wh = _mm512_or_si512(
                    wh, _mm512_and_si512(_mm512_srl_epi16(qh0, _mm_cvtsi32_si128(k)), b4));
            }
            if (HB == 2) {
                /* bits 2k, 2k+1 to bits 4, 5 */
                __m512i a = k < 2 ? _mm512_sll_epi16(qh0, _mm_cvtsi32_si128(4 - 2 * k))
                                  : _mm512_srl_epi16(qh0, _mm_cvtsi32_si128(2 * k - 4));
                __m512i c = k < 2 ? _mm512_sll_epi16(qh1, _mm_cvtsi32_si128(4 - 2 * k))
                                  : _mm512_srl_epi16(qh1, _mm_cvtsi32_si128(2 * k - 4));
                wl = _mm512_or_si512(wl, _mm512_and_si512(a, b45));
                wh = _mm512_or_si512(wh, _mm512_and_si512(c, b45));
            }
            for (int t = 0; t < NT; t++) {
                size_t xo = mm_xb(xq, t0 + t, b) * 32;
                const int8_t *xl = xq->lo + xo, *xh = xq->hi + xo;
                l0[t] = _mm512_dpbusd_epi32(l0[t], wl, a5_bcast(xl + 4 * k));
                if (NSC < 2) /* one scale: both halves into one chain */
                    l0[t] = _mm512_dpbusd_epi32(l0[t], wh, a5_bcast(xl + 16 + 4 * k));
                else
                    l1[t] = _mm512_dpbusd_epi32(l1[t], wh, a5_bcast(xl + 16 + 4 * k));
                if (H) {
                    h0[t] = _mm512_dpbusd_epi32(h0[t], wl, a5_bcast(xh + 4 * k));
                    if (NSC < 2)
                        h0[t] = _mm512_dpbusd_epi32(h0[t], wh, a5_bcast(xh + 16 + 4 * k));
                    else
                        h1[t] = _mm512_dpbusd_epi32(h1[t], wh, a5_bcast(xh + 16 + 4 * k));
                }
            }
        }
        for (int t = 0; t < NT; t++) {
            size_t xb = mm_xb(xq, t0 + t, b);
            __m512 dx = _mm512_set1_ps(xq->d[xb]);
            __m512i d0 = H ? _mm512_add_epi32(_mm512_slli_epi32(h0[t], 8), l0[t]) : l0[t];
            if (NSC < 2) { /* d0 holds both halves */
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_mul_ps(f[0], dx), acc[t]);
                acc[t] = _mm512_fmadd_ps(o[0], _mm512_set1_ps(xq->s[xb]), acc[t]);
            } else {
                __m512i d1 = H ? _mm512_add_epi32(_mm512_slli_epi32(h1[t], 8), l1[t]) : l1[t];
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_mul_ps(f[0], dx), acc[t]);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d1), _mm512_mul_ps(f[1], dx), acc[t]);
                acc[t] = _mm512_fmadd_ps(o[0], _mm512_set1_ps(xq->s16[2 * xb]), acc[t]);
                acc[t] = _mm512_fmadd_ps(o[1], _mm512_set1_ps(xq->s16[2 * xb + 1]), acc[t]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        _mm512_storeu_ps(out + (size_t)(t0 + t) * MM_GROUP, acc[t]);
}

#define A5_K_CASES(NSC, MINS, HB, LUT, KB)                                                         \
    switch (nt) {                                                                                  \
    case 1: a5_k_tile(NSC, MINS, HB, LUT, KB, H, 1, pk, xq, z, t0, out); break;                   \
    case 2: a5_k_tile(NSC, MINS, HB, LUT, KB, H, 2, pk, xq, z, t0, out); break;                   \
    case 3: a5_k_tile(NSC, MINS, HB, LUT, KB, H, 3, pk, xq, z, t0, out); break;                   \
    case 4: a5_k_tile(NSC, MINS, HB, LUT, KB, H, 4, pk, xq, z, t0, out); break;                   \
    case 5: a5_k_tile(NSC, MINS, HB, LUT, KB, H, 5, pk, xq, z, t0, out); break;                   \
    case 6: a5_k_tile(NSC, MINS, HB, LUT, KB, H, 6, pk, xq, z, t0, out); break;                   \
    case 7: a5_k_tile(NSC, MINS, HB, LUT, KB, H, 7, pk, xq, z, t0, out); break;                   \
    default: a5_k_tile(NSC, MINS, HB, LUT, KB, H, 8, pk, xq, z, t0, out); break;                  \
    }

/* H as in a5_qgroup_h */
AI void a5_kgroup_h(const int H, const mm_kdesc *k, const uint8_t *pk, const mm_xq *xq, int n_tok,
                    float *out)
{
    float z = (float)k->z;
    const int tile = k->nsc < 2 ? KQT_1SC(H) : KQT_2SC;
    for (int t0 = 0; t0 < n_tok; t0 += tile) {
        int nt = n_tok - t0 < tile ? n_tok - t0 : tile;
        if (k->lut)
            A5_K_CASES(0, 0, 0, 1, 1)
        else if (k->kb == 1)
            A5_K_CASES(0, 0, 1, 0, 1) /* Q5_0, Q5_1 */
        else if (k->nsc == 1 && k->hb == 0)
            A5_K_CASES(1, 1, 0, 0, 8) /* Q4_K */
        else if (k->nsc == 1)
            A5_K_CASES(1, 1, 1, 0, 8) /* Q5_K */
        else if (k->hb == 2)
            A5_K_CASES(2, 0, 2, 0, 8) /* Q6_K */
        else if (k->mins)
            A5_K_CASES(2, 1, 0, 0, 8) /* Q2_K */
        else
            A5_K_CASES(2, 0, 0, 0, 8) /* Q3_K */
    }
}

static void a5_kgroup(const mm_kdesc *k, const uint8_t *pk, const mm_xq *xq, int n_tok, float *out)
{
    if (xq->bits == 8)
        a5_kgroup_h(0, k, pk, xq, n_tok, out);
    else
        a5_kgroup_h(1, k, pk, xq, n_tok, out);
}

/* ===== float weights ===== */

AI __m512 a5_load_f(uint32_t type, const uint8_t *p)
{
    if (type == KT_F32)
        return _mm512_loadu_ps(p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (type == KT_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Tokens t0 .. t0 + NT - 1 of NG (1 or 2) adjacent float groups: two partial sums per row and
 * token (column k % 2). Two groups per pass let each activation broadcast feed two FMAs. */
AI void a5_f_tile(uint32_t type, int NG, int NT, const uint8_t *pk, size_t gbytes, int64_t cols,
                  const float *x, int t0, float *out)
{
    const size_t es = type == KT_F32 ? 4 : 2, col = MM_GROUP * es;
    __m512 acc[2][FT1][2];
    for (int g = 0; g < NG; g++)
        for (int t = 0; t < NT; t++)
            acc[g][t][0] = acc[g][t][1] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 2 <= cols; k += 2) {
        if (NT >= MM_PF_MIN_TOK)
            for (int g = 0; g < NG; g++)
                mm_prefetch(pk + (size_t)g * gbytes + (size_t)k * col, 2 * col);
        for (int p = 0; p < 2; p++) {
            __m512 w[2];
            for (int g = 0; g < NG; g++)
                w[g] = a5_load_f(type, pk + (size_t)g * gbytes + (size_t)(k + p) * col);
            for (int t = 0; t < NT; t++) {
                __m512 xv = _mm512_set1_ps(x[(size_t)(t0 + t) * (size_t)cols + k + p]);
                for (int g = 0; g < NG; g++)
                    acc[g][t][p] = _mm512_fmadd_ps(w[g], xv, acc[g][t][p]);
            }
        }
    }
    if (k < cols)
        for (int g = 0; g < NG; g++) {
            __m512 w = a5_load_f(type, pk + (size_t)g * gbytes + (size_t)k * col);
            for (int t = 0; t < NT; t++)
                acc[g][t][0] = _mm512_fmadd_ps(
                    w, _mm512_set1_ps(x[(size_t)(t0 + t) * (size_t)cols + k]), acc[g][t][0]);
        }
    for (int g = 0; g < NG; g++)
        for (int t = 0; t < NT; t++)
            _mm512_storeu_ps(out + (size_t)(t0 + t) * MM_GROUP * NG + MM_GROUP * g,
                             _mm512_add_ps(acc[g][t][0], acc[g][t][1]));
}

#define A5_F_CASES(NG, CALL)                                                                       \
    switch (nt) {                                                                                  \
    case 1: CALL(NG, 1); break;                                                                    \
    case 2: CALL(NG, 2); break;                                                                    \
    case 3: CALL(NG, 3); break;                                                                    \
    case 4: CALL(NG, 4); break;                                                                    \
    case 5: CALL(NG, 5); break;                                                                    \
    default: CALL(NG, 6); break;                                                                   \
    }

AI void a5_fgroup_t(uint32_t type, const uint8_t *pk, int ng, size_t gbytes, int64_t cols,
                    const float *x, int n_tok, float *out)
{
    if (n_tok <= FT_ONE && ng == 2) {
        /* one group after the other is one sequential stream, two groups side by side are two
         * (and stream slower: the weights arrive late even when the arithmetic could keep up);
         * each lane computes the same either way */
        float part[2][FT_ONE * MM_GROUP];
        for (int g = 0; g < 2; g++)
            a5_fgroup_t(type, pk + (size_t)g * gbytes, 1, gbytes, cols, x, n_tok, part[g]);
        for (int t = 0; t < n_tok; t++)
            for (int g = 0; g < 2; g++)
                memcpy(out + (size_t)t * 2 * MM_GROUP + MM_GROUP * g,
                       part[g] + (size_t)t * MM_GROUP, MM_GROUP * sizeof(float));
        return;
    }
    const int ft = ng == 2 ? FT : FT1;
    for (int t0 = 0; t0 < n_tok; t0 += ft) {
        int nt = n_tok - t0 < ft ? n_tok - t0 : ft;
#define CF(G, N) a5_f_tile(type, G, N, pk, gbytes, cols, x, t0, out)
        if (ng == 2) { /* nt <= FT */
            A5_F_CASES(2, CF)
        } else if (nt == 8) { /* one group: up to FT1 */
            CF(1, 8);
        } else if (nt == 7) {
            CF(1, 7);
        } else {
            A5_F_CASES(1, CF)
        }
    }
}

static void a5_fgroup(uint32_t type, const uint8_t *pk, int ng, size_t gbytes, int64_t cols,
                      const float *x, int n_tok, float *out)
{
    if (type == KT_F16)
        a5_fgroup_t(KT_F16, pk, ng, gbytes, cols, x, n_tok, out);
    else if (type == KT_BF16)
        a5_fgroup_t(KT_BF16, pk, ng, gbytes, cols, x, n_tok, out);
    else
        a5_fgroup_t(KT_F32, pk, ng, gbytes, cols, x, n_tok, out);
}

const mm_isa mm_isa_avx512 = {
    .name = "avx512", .qgroup = a5_qgroup, .kgroup = a5_kgroup, .fgroup = a5_fgroup};
