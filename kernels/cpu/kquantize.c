/*
 * kernels/cpu/kquantize.c — the quantisers of the K-quants (Q2_K..Q6_K), Q5_0/Q5_1 and IQ4_NL:
 * ktk_quantize_row, writing ggml's block layouts exactly as ktypes_k.h documents them, so that
 * llama.cpp reads the same values orochi does.
 *
 * How a block is chosen, aiming at the least squared error rather than the crudest rounding:
 *   1. the block is scaled so its largest |x| is 1, so huge and tiny rows take the same path and
 *      no sum can overflow (the factor goes back into the f16 scales when they are stored);
 *   2. every sub-block gets the float scale (and offset) that minimises its squared error over a
 *      grid of candidate scales around the one that maps the extreme element to the end of the
 *      code range, each candidate's codes followed by a least-squares scale (and offset);
 *   3. a K-quant's sub-block scales and mins are rounded to their 4/6/8-bit codes under an f16
 *      super-scale, each code is tried with its neighbours against the elements re-quantised with
 *      it, and the f16 super-scales are refitted by least squares over the whole super-block
 *      (kept only where that lowers the error).
 * Elements are always re-quantised with the scales exactly as stored. The f16 scales saturate at
 * 65504 instead of becoming infinite, and a block whose largest |x| is below 1e-30 is stored as
 * zeros; inputs must be finite.
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ktypes_k.h"

#define F16_MAX 65504.0f
#define TINY 1e-30f

/* ===== helpers ===== */

/* v rounded to the nearest integer (ties to even) and clamped to [lo, hi], as a float. Adding
 * 1.5 * 2^23 leaves the rounded value in the low mantissa bits; read as an integer, that is
 * exact for |v| < 2^22 and beyond it still orders with v (NaN lands on a bound), so the integer
 * clamp is right for every input. Integer min/max and no float-int conversion of v keep the
 * inner loops free of branches and vectorisable. */
static inline float rclamp(float v, float lo, float hi)
{
    float t = v + 12582912.0f;
    int32_t i, l = (int32_t)lo, h = (int32_t)hi;
    memcpy(&i, &t, sizeof i);
    i -= 0x4B400000;
    i = i < l ? l : i;
    i = i > h ? h : i;
    return (float)i;
}

static inline int round_clamp(float v, int lo, int hi)
{
    return (int)rclamp(v, (float)lo, (float)hi);
}

/* The inner loops run over a multiple of 16 elements in LANES partial sums, the lane loop marked
 * not to be unrolled: unrolled early (GCC -O3), it is no longer vectorised as a loop. */
#define LANES 8

static inline float lane_sum(const float *acc)
{
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* The squared error of x[0..len) ~ A * q - B with the codes q = round((x + B) / A) clamped to
 * [lo, hi] (all 0 for A = 0), which go to qf. */
static float try_scale(const float *x, int len, float A, float B, float lo, float hi, float *qf)
{
    float iA = A != 0 ? 1.0f / A : 0, acc[LANES] = {0};
    for (int i = 0; i < len; i += LANES)
#pragma GCC unroll 1
        for (int k = 0; k < LANES; k++) {
            float qi = rclamp((x[i + k] + B) * iA, lo, hi);
            float e = A * qi - B - x[i + k];
            qf[i + k] = qi;
            acc[k] += e * e;
        }
    return lane_sum(acc);
}

/* Copy x[0..n) into xn scaled so the largest |x| is 1 and return that |x|; 0 (xn all zero) for a
 * block that is zero for all practical purposes. */
static float normalise(const float *x, float *xn, int n)
{
    float amax = 0;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    if (!(amax > TINY)) {
        memset(xn, 0, (size_t)n * sizeof *xn);
        return 0;
    }
    float inv = 1.0f / amax;
    for (int i = 0; i < n; i++)
        xn[i] = x[i] * inv;
    return amax;
}

/* The f16 code of the scale v * amax (v in normalised units): the nearest one or, with up, the
 * smallest one not below it (so codes derived from it never overflow their range); saturates at
 * +-65504. *eff gets the value the code stands for, back in normalised units. */
static uint16_t scale_code(float v, float amax, bool up, float *eff)
{
    float s = v * amax;
    if (s != s)
        s = 0;
    s = s > F16_MAX ? F16_MAX : s < -F16_MAX ? -F16_MAX : s;
    uint16_t h = kt_f32_to_f16(s);
    if (up && s > 0 && kt_f16_to_f32(h) < s && h < 0x7bff)
        h++;
    *eff = amax > 0 ? kt_f16_to_f32(h) / amax : 0;
    return h;
}

static void put_f16(uint8_t *p, uint16_t h)
{
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* ===== one scale per sub-block ===== */

/* sum x q and sum q q for the codes q = round(x * is) in [lo, hi] */
static void sums_sym(const float *x, int n, float is, float lo, float hi, float *sxq, float *sqq)
{
    float axq[LANES] = {0}, aqq[LANES] = {0};
    for (int i = 0; i < n; i += LANES)
#pragma GCC unroll 1
        for (int k = 0; k < LANES; k++) {
            float qi = rclamp(x[i + k] * is, lo, hi);
            axq[k] += x[i + k] * qi;
            aqq[k] += qi * qi;
        }
    *sxq = lane_sum(axq);
    *sqq = lane_sum(aqq);
}

/* sum q, sum q q and sum x q for the codes q = round((x - o) * is) in [0, top] */
static void sums_min(const float *x, int n, float o, float is, float top, float *sq, float *sqq,
                     float *sxq)
{
    float aq[LANES] = {0}, aqq[LANES] = {0}, axq[LANES] = {0};
    for (int i = 0; i < n; i += LANES)
#pragma GCC unroll 1
        for (int k = 0; k < LANES; k++) {
            float qi = rclamp((x[i + k] - o) * is, 0, top);
            aq[k] += qi;
            aqq[k] += qi * qi;
            axq[k] += x[i + k] * qi;
        }
    *sq = lane_sum(aq);
    *sqq = lane_sum(aqq);
    *sxq = lane_sum(axq);
}

/* Symmetric: the a for x ~ a * q over n elements, q an integer in [-nneg, npos], minimising the
 * squared error over candidates that put the signed extreme element near either end of the
 * range (the range is lopsided, so both signs of a are tried), each with its least-squares a,
 * then refined by re-quantising with the best a. 0 for an all-zero x. */
static float fit_sym(const float *x, int n, int nneg, int npos)
{
    float maxv = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) {
            amax = a;
            maxv = x[i];
        }
    }
    if (!(amax > TINY))
        return 0;
    /* best so far as (sxq, sqq): the error is sum x^2 - sxq^2 / sqq at a = sxq / sqq */
    float best_xq = 0, best_qq = 0;
    const float lo = -(float)nneg, hi = (float)npos;
    const int steps = nneg >= 16 ? 2 : 4;
    const float step = nneg >= 16 ? 0.4f : 0.2f;
    for (int side = 0; side < 2; side++) {
        float end = side ? (float)npos : -(float)nneg;
        for (int k = -steps; k <= steps; k++) {
            float level = end + (side ? 1.0f : -1.0f) * step * (float)k;
            float is = level / maxv, sxq, sqq;
            sums_sym(x, n, is, lo, hi, &sxq, &sqq);
            if (sqq > 0 && (best_qq == 0 || sxq * sxq * best_qq > best_xq * best_xq * sqq)) {
                best_xq = sxq;
                best_qq = sqq;
            }
        }
    }
    for (int it = 0; it < 2 && best_qq > 0 && best_xq != 0; it++) {
        float is = best_qq / best_xq, sxq, sqq;
        sums_sym(x, n, is, lo, hi, &sxq, &sqq);
        if (!(sqq > 0 && sxq * sxq * best_qq > best_xq * best_xq * sqq))
            break;
        best_xq = sxq;
        best_qq = sqq;
    }
    return best_qq > 0 ? best_xq / best_qq : 0;
}

/* With offset: a >= 0 and b for x ~ a * q + b over n elements, q in [0, nmax]; neg_b keeps
 * b <= 0 (the K-quants store the offset as -dmin * m with m >= 0). Candidates are inverse scales
 * around nmax / (max - min), each with the least-squares (a, b) of its codes, then refined by
 * re-quantising with the best pair. */
static void fit_min(const float *x, int n, int nmax, bool neg_b, float *pa, float *pb)
{
    float mn = x[0], mx = x[0], sx = 0, sxx = 0;
    for (int i = 0; i < n; i++) {
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
        sx += x[i];
        sxx += x[i] * x[i];
    }
    if (neg_b && mn > 0)
        mn = 0;
    if (!(mx - mn > TINY)) { /* constant (or zero) */
        *pa = 0;
        *pb = mn;
        return;
    }
    float best_a = (mx - mn) / (float)nmax, best_b = mn;
    float best_err = INFINITY;
    const float fn = (float)n, top = (float)nmax;
    /* k < 0: the plain min/max scale; 0..10: nmax - 1 .. nmax + 1 levels over the range; then
     * refinements from the best pair so far */
    for (int k = -1; k <= 12; k++) {
        float is = (float)nmax / (mx - mn), o = mn;
        if (k >= 0 && k <= 10) {
            is = ((float)nmax - 1.0f + 0.2f * (float)k) / (mx - mn);
        } else if (k > 10) {
            if (!(best_a > 0))
                break;
            is = 1.0f / best_a;
            o = best_b;
        }
        float sq, sqq, sxq;
        sums_min(x, n, o, is, top, &sq, &sqq, &sxq);
        float a, b, den = fn * sqq - sq * sq;
        if (den > 0) {
            a = (fn * sxq - sq * sx) / den;
            b = (sqq * sx - sq * sxq) / den;
        } else { /* every code the same: only a * q + b = mean is determined */
            a = 0;
            b = sx / fn;
        }
        if (neg_b && b > 0) {
            b = 0;
            a = sqq > 0 ? sxq / sqq : 0;
        }
        if (a < 0) {
            a = 0;
            b = sx / fn;
            if (neg_b && b > 0)
                b = 0;
        }
        float err = sxx - 2 * a * sxq - 2 * b * sx + a * a * sqq + 2 * a * b * sq + fn * b * b;
        if (err < best_err) {
            best_err = err;
            best_a = a;
            best_b = b;
        } else if (k > 10) {
            break;
        }
    }
    *pa = best_a;
    *pb = best_b;
}

/* ===== super-blocks with integer sub-block scales ===== */

/* Codes of a symmetric K-quant (Q3_K, Q6_K) for the normalised super-block xn under the
 * super-scale d: sub-block scale codes in [-smax - 1, smax] near a[s] / d, each tried with its
 * neighbours, and element codes in [-nneg, npos]. Returns the squared error. */
static float codes_sym(const float *xn, int nsub, int len, int nneg, int npos, int smax,
                       const float *a, float d, int8_t *sc, int8_t *q)
{
    float total = 0;
    const float lo = -(float)nneg, hi = (float)npos;
    float tmp[32], best_q[32] = {0};
    for (int s = 0; s < nsub; s++) {
        const float *x = xn + s * len;
        int c0 = d > 0 ? round_clamp(a[s] / d, -smax - 1, smax) : 0;
        float best = INFINITY;
        sc[s] = 0;
        for (int c = c0 - 1; c <= c0 + 1; c++) {
            if (c < -smax - 1 || c > smax || (d <= 0 && c != 0))
                continue;
            float err = try_scale(x, len, d * (float)c, 0, lo, hi, tmp);
            if (err < best) {
                best = err;
                sc[s] = (int8_t)c;
                memcpy(best_q, tmp, sizeof tmp);
            }
        }
        for (int i = 0; i < len; i++)
            q[s * len + i] = (int8_t)best_q[i];
        total += best;
    }
    return total;
}

/* A symmetric K-quant super-block x ~ d * sc[s] * q: fills sc and q, returns the f16 code of d. */
static uint16_t kquant_sym(const float *x, int nsub, int len, int nneg, int npos, int smax,
                           int8_t *sc, int8_t *q)
{
    float xn[256], a[16];
    int n = nsub * len;
    float amax = normalise(x, xn, n);
    float amx = 0;
    for (int s = 0; s < nsub; s++) {
        a[s] = fit_sym(xn + s * len, len, nneg, npos);
        amx = fabsf(a[s]) > amx ? fabsf(a[s]) : amx;
    }
    if (amax == 0 || !(amx > 0)) {
        memset(sc, 0, (size_t)nsub);
        memset(q, 0, (size_t)n);
        return 0;
    }
    float d;
    uint16_t dh = scale_code(amx / (float)smax, amax, true, &d);
    float err = codes_sym(xn, nsub, len, nneg, npos, smax, a, d, sc, q);
    /* refit d to the chosen codes by least squares */
    for (int it = 0; it < 2; it++) {
        float sxu = 0, suu = 0;
        for (int s = 0; s < nsub; s++)
            for (int i = s * len; i < (s + 1) * len; i++) {
                float u = (float)sc[s] * (float)q[i];
                sxu += xn[i] * u;
                suu += u * u;
            }
        if (!(suu > 0) || !(sxu > 0))
            break;
        float d2;
        uint16_t dh2 = scale_code(sxu / suu, amax, false, &d2);
        if (dh2 == dh || !(d2 > 0))
            break;
        int8_t sc2[16], q2[256];
        float err2 = codes_sym(xn, nsub, len, nneg, npos, smax, a, d2, sc2, q2);
        if (!(err2 < err))
            break;
        err = err2;
        dh = dh2;
        d = d2;
        memcpy(sc, sc2, (size_t)nsub);
        memcpy(q, q2, (size_t)n);
    }
    return dh;
}

/* Codes of a scale+min K-quant (Q2_K, Q4_K, Q5_K) for the normalised super-block xn under the
 * super-scales d and dm: scale codes near a[s] / d and min codes near -b[s] / dm, in [0, smax],
 * each pair tried with its neighbours; element codes in [0, nmax]. Returns the squared error. */
static float codes_min(const float *xn, int nsub, int len, int nmax, int smax, const float *a,
                       const float *b, float d, float dm, uint8_t *sc, uint8_t *m, uint8_t *q)
{
    float total = 0;
    const float top = (float)nmax;
    float tmp[32], best_q[32] = {0};
    for (int s = 0; s < nsub; s++) {
        const float *x = xn + s * len;
        int c0 = d > 0 ? round_clamp(a[s] / d, 0, smax) : 0;
        int m0 = dm > 0 ? round_clamp(-b[s] / dm, 0, smax) : 0;
        float best = INFINITY;
        sc[s] = m[s] = 0;
        for (int c = c0 - 1; c <= c0 + 1; c++) {
            if (c < 0 || c > smax || (d <= 0 && c != 0))
                continue;
            for (int mm = m0 - 1; mm <= m0 + 1; mm++) {
                if (mm < 0 || mm > smax || (dm <= 0 && mm != 0))
                    continue;
                float err = try_scale(x, len, d * (float)c, dm * (float)mm, 0, top, tmp);
                if (err < best) {
                    best = err;
                    sc[s] = (uint8_t)c;
                    m[s] = (uint8_t)mm;
                    memcpy(best_q, tmp, sizeof tmp);
                }
            }
        }
        for (int i = 0; i < len; i++)
            q[s * len + i] = (uint8_t)best_q[i];
        total += best;
    }
    return total;
}

/* A scale+min K-quant super-block x ~ d * sc[s] * q - dmin * m[s]: fills sc, m and q and the
 * f16 codes of d and dmin. */
static void kquant_min(const float *x, int nsub, int len, int nmax, int smax, uint16_t *dh,
                       uint16_t *mh, uint8_t *sc, uint8_t *m, uint8_t *q)
{
    float xn[256], a[16], b[16];
    int n = nsub * len;
    float amax = normalise(x, xn, n);
    float amx = 0, bmx = 0;
    for (int s = 0; s < nsub; s++) {
        fit_min(xn + s * len, len, nmax, true, &a[s], &b[s]);
        amx = a[s] > amx ? a[s] : amx;
        bmx = -b[s] > bmx ? -b[s] : bmx;
    }
    if (amax == 0) {
        *dh = *mh = 0;
        memset(sc, 0, (size_t)nsub);
        memset(m, 0, (size_t)nsub);
        memset(q, 0, (size_t)n);
        return;
    }
    float d, dm;
    *dh = scale_code(amx / (float)smax, amax, true, &d);
    *mh = scale_code(bmx / (float)smax, amax, true, &dm);
    float err = codes_min(xn, nsub, len, nmax, smax, a, b, d, dm, sc, m, q);
    /* refit (d, dmin) to the chosen codes: x ~ d * u - dmin * v, u = sc * q, v = m */
    for (int it = 0; it < 2; it++) {
        double suu = 0, suv = 0, svv = 0, sxu = 0, sxv = 0;
        for (int s = 0; s < nsub; s++) {
            double xs = 0, xu = 0, uu = 0, us = 0, v = m[s];
            for (int i = s * len; i < (s + 1) * len; i++) {
                double u = (double)sc[s] * q[i];
                xs += xn[i];
                xu += xn[i] * u;
                uu += u * u;
                us += u;
            }
            suu += uu;
            suv += us * v;
            svv += v * v * len;
            sxu += xu;
            sxv += xs * v;
        }
        double det = suu * svv - suv * suv, nd, ndm;
        if (svv == 0 && suu > 0) {
            nd = sxu / suu;
            ndm = dm;
        } else if (det > 1e-12 * suu * svv) {
            nd = (sxu * svv - suv * sxv) / det;
            ndm = (suv * sxu - suu * sxv) / det;
        } else {
            break;
        }
        if (!(nd > 0) || !(ndm >= 0))
            break;
        float d2, dm2;
        uint16_t dh2 = scale_code((float)nd, amax, false, &d2);
        uint16_t mh2 = scale_code((float)ndm, amax, false, &dm2);
        if (dh2 == *dh && mh2 == *mh)
            break;
        uint8_t sc2[16], m2[16], q2[256];
        float err2 = codes_min(xn, nsub, len, nmax, smax, a, b, d2, dm2, sc2, m2, q2);
        if (!(err2 < err))
            break;
        err = err2;
        *dh = dh2;
        *mh = mh2;
        d = d2;
        dm = dm2;
        memcpy(sc, sc2, (size_t)nsub);
        memcpy(m, m2, (size_t)nsub);
        memcpy(q, q2, (size_t)n);
    }
}

/* ===== the K-quants ===== */

/* Q4_K / Q5_K's 12 bytes of 6-bit scales and mins (ktypes_k.h; sub-block j >= 4 keeps its low 4
 * bits in byte j + 4 and its top 2 bits in the top of bytes j - 4 and j). */
static void pack_scales_k4(const uint8_t *sc, const uint8_t *m, uint8_t *s)
{
    for (int j = 0; j < 4; j++) {
        s[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
        s[j + 4] = (uint8_t)((m[j] & 63) | (m[j + 4] >> 4) << 6);
        s[j + 8] = (uint8_t)((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
    }
}

static void quantize_q2_k(const float *x, uint8_t *out, int64_t n)
{
    for (int64_t bi = 0; bi < n / 256; bi++, x += 256, out += 84) {
        uint8_t sc[16], m[16], q[256];
        uint16_t dh, mh;
        kquant_min(x, 16, 16, 3, 15, &dh, &mh, sc, m, q);
        for (int s = 0; s < 16; s++)
            out[s] = (uint8_t)(sc[s] | m[s] << 4);
        uint8_t *qs = out + 16;
        memset(qs, 0, 64);
        /* element 128h + 32j + l: bits 2j of qs[32h + l] */
        for (int e = 0; e < 256; e++)
            qs[32 * (e / 128) + e % 32] |= (uint8_t)(q[e] << (2 * ((e % 128) / 32)));
        put_f16(out + 80, dh);
        put_f16(out + 82, mh);
    }
}

static void quantize_q3_k(const float *x, uint8_t *out, int64_t n)
{
    for (int64_t bi = 0; bi < n / 256; bi++, x += 256, out += 110) {
        int8_t sc[16], q[256];
        uint16_t dh = kquant_sym(x, 16, 16, 4, 3, 31, sc, q);
        uint8_t *hmask = out, *qs = out + 32, *scales = out + 96;
        memset(out, 0, 108);
        for (int e = 0; e < 256; e++) {
            int half = e / 128, j = (e % 128) / 32, l = e % 32;
            int u = q[e] + 4; /* 0..7: low 2 bits in qs, the third in hmask */
            qs[32 * half + l] |= (uint8_t)((u & 3) << (2 * j));
            if (u & 4)
                hmask[l] |= (uint8_t)(1u << (4 * half + j));
        }
        for (int j = 0; j < 16; j++) {
            int u = sc[j] + 32;
            scales[j % 8] |= (uint8_t)((u & 15) << (4 * (j / 8)));
            scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
        }
        put_f16(out + 108, dh);
    }
}

static void quantize_q45_k(const float *x, uint8_t *out, int64_t n, bool five)
{
    const int nmax = five ? 31 : 15, bytes = five ? 176 : 144;
    for (int64_t bi = 0; bi < n / 256; bi++, x += 256, out += bytes) {
        uint8_t sc[8], m[8], q[256];
        uint16_t dh, mh;
        kquant_min(x, 8, 32, nmax, 63, &dh, &mh, sc, m, q);
        put_f16(out, dh);
        put_f16(out + 2, mh);
        pack_scales_k4(sc, m, out + 4);
        uint8_t *qh = out + 16, *qs = out + (five ? 48 : 16);
        if (five)
            memset(qh, 0, 32);
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 32; l++) {
                int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
                qs[32 * c + l] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                if (five)
                    qh[l] |= (uint8_t)((lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1));
            }
        }
    }
}

static void quantize_q6_k(const float *x, uint8_t *out, int64_t n)
{
    for (int64_t bi = 0; bi < n / 256; bi++, x += 256, out += 210) {
        int8_t sc[16], q[256];
        uint16_t dh = kquant_sym(x, 16, 16, 32, 31, 127, sc, q);
        uint8_t *ql = out, *qh = out + 128;
        for (int h = 0; h < 2; h++) {
            const int8_t *qq = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                int u0 = qq[l] + 32, u1 = qq[l + 32] + 32, u2 = qq[l + 64] + 32,
                    u3 = qq[l + 96] + 32;
                ql[64 * h + l] = (uint8_t)((u0 & 15) | (u2 & 15) << 4);
                ql[64 * h + l + 32] = (uint8_t)((u1 & 15) | (u3 & 15) << 4);
                qh[32 * h + l] =
                    (uint8_t)((u0 >> 4) | (u1 >> 4) << 2 | (u2 >> 4) << 4 | (u3 >> 4) << 6);
            }
        }
        for (int s = 0; s < 16; s++)
            out[192 + s] = (uint8_t)sc[s];
        put_f16(out + 208, dh);
    }
}

/* ===== 32-element blocks ===== */

/* Q5_0 / Q5_1 nibbles and high bits of the 5-bit codes u[32]. */
static void pack_q5(const int *u, uint8_t *qh, uint8_t *qs)
{
    uint32_t h = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((u[j] & 15) | (u[j + 16] & 15) << 4);
        h |= (uint32_t)(u[j] >> 4) << j | (uint32_t)(u[j + 16] >> 4) << (j + 16);
    }
    put_u32(qh, h);
}

static void quantize_q5_0(const float *x, uint8_t *out, int64_t n)
{
    for (int64_t bi = 0; bi < n / 32; bi++, x += 32, out += 22) {
        float xn[32], d;
        int u[32];
        float amax = normalise(x, xn, 32);
        float a = fit_sym(xn, 32, 16, 15);
        put_f16(out, scale_code(a, amax, false, &d));
        float id = d != 0 ? 1.0f / d : 0;
        for (int i = 0; i < 32; i++)
            u[i] = round_clamp(xn[i] * id, -16, 15) + 16;
        pack_q5(u, out + 2, out + 6);
    }
}

static void quantize_q5_1(const float *x, uint8_t *out, int64_t n)
{
    for (int64_t bi = 0; bi < n / 32; bi++, x += 32, out += 24) {
        float xn[32], a, b, d, m;
        int u[32];
        float amax = normalise(x, xn, 32);
        fit_min(xn, 32, 31, false, &a, &b);
        put_f16(out, scale_code(a, amax, false, &d));
        put_f16(out + 2, scale_code(b, amax, false, &m));
        float id = d > 0 ? 1.0f / d : 0;
        for (int i = 0; i < 32; i++)
            u[i] = round_clamp((xn[i] - m) * id, 0, 31);
        pack_q5(u, out + 4, out + 8);
    }
}

/* IQ4_NL's grid as floats, the midpoints between neighbours (mid[15] a sentinel), and for every
 * integer e in [-128, 114] the index of the grid value nearest e: since grid values lie at least
 * 11 apart, the nearest to any v is then that of floor(v) or the one above it. */
typedef struct {
    float grid[16], mid[16];
    uint8_t near[243];
} iq4nl_grid;

static void iq4nl_grid_init(iq4nl_grid *t)
{
    for (int i = 0; i < 16; i++)
        t->grid[i] = (float)KTK_IQ4NL[i];
    for (int i = 0; i < 15; i++)
        t->mid[i] = 0.5f * (t->grid[i] + t->grid[i + 1]);
    t->mid[15] = INFINITY;
    int j = 0;
    for (int e = -128; e <= 114; e++) {
        while (j < 15 && (float)e > t->mid[j])
            j++;
        t->near[e + 128] = (uint8_t)j;
    }
}

/* the index of the grid value nearest v (v in grid units; NaN gives 0) */
static inline int iq4nl_nearest(const iq4nl_grid *t, float v)
{
    v = v > -128.0f ? v : -128.0f;
    v = v < 114.0f ? v : 114.0f;
    int i = t->near[(int)(v + 128.0f)];
    return i + (v > t->mid[i]);
}

/* The d for x ~ d * grid[idx] over 32 elements: candidates that put the signed extreme element
 * near either end of the grid, each followed by the least-squares d of its indices, then refined
 * by re-assigning with the best d. */
static float fit_iq4nl(const float *x, const iq4nl_grid *t)
{
    float maxv = 0, amax = 0;
    for (int i = 0; i < 32; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            maxv = x[i];
        }
    }
    if (!(amax > TINY))
        return 0;
    float best_xg = 0, best_gg = 0;
    /* k < 7: maxv onto the low end of the grid scaled by 0.85 .. 1.15, k < 14 onto the high end;
     * then refinements from the best d so far */
    for (int k = 0; k < 16; k++) {
        float is;
        if (k < 14) {
            float end = k < 7 ? t->grid[0] : t->grid[15];
            is = end * (0.85f + 0.05f * (float)(k % 7)) / maxv;
        } else {
            if (best_xg == 0)
                break;
            is = best_gg / best_xg;
        }
        float sxg = 0, sgg = 0;
        for (int i = 0; i < 32; i++) {
            float g = t->grid[iq4nl_nearest(t, x[i] * is)];
            sxg += x[i] * g;
            sgg += g * g;
        }
        if (sgg > 0 && (best_gg == 0 || sxg * sxg * best_gg > best_xg * best_xg * sgg)) {
            best_xg = sxg;
            best_gg = sgg;
        } else if (k >= 14) {
            break;
        }
    }
    return best_gg > 0 ? best_xg / best_gg : 0;
}

static void quantize_iq4_nl(const float *x, uint8_t *out, int64_t n)
{
    iq4nl_grid t;
    iq4nl_grid_init(&t);
    for (int64_t bi = 0; bi < n / 32; bi++, x += 32, out += 18) {
        float xn[32], d;
        int idx[32];
        float amax = normalise(x, xn, 32);
        put_f16(out, scale_code(fit_iq4nl(xn, &t), amax, false, &d));
        float id = d != 0 ? 1.0f / d : 0; /* d = 0: every index that of the grid value nearest 0 */
        for (int i = 0; i < 32; i++)
            idx[i] = iq4nl_nearest(&t, xn[i] * id);
        for (int j = 0; j < 16; j++)
            out[2 + j] = (uint8_t)(idx[j] | idx[j + 16] << 4);
    }
}

void ktk_quantize_row(uint32_t type, const float *x, void *out, int64_t n)
{
    uint8_t *o = out;
    switch (type) {
    case KT_Q2_K: quantize_q2_k(x, o, n); break;
    case KT_Q3_K: quantize_q3_k(x, o, n); break;
    case KT_Q4_K: quantize_q45_k(x, o, n, false); break;
    case KT_Q5_K: quantize_q45_k(x, o, n, true); break;
    case KT_Q6_K: quantize_q6_k(x, o, n); break;
    case KT_Q5_0: quantize_q5_0(x, o, n); break;
    case KT_Q5_1: quantize_q5_1(x, o, n); break;
    case KT_IQ4_NL: quantize_iq4_nl(x, o, n); break;
    default: break;
    }
}
