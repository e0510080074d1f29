/*
 * kernels/cpu/vexp.h — private to kernels/cpu: e^x for eight float lanes (AVX2 + FMA) or four
 * (NEON, the same operations lane for lane, so the same bits), shared by attention and the
 * softmax helpers so both round the same way; and, for NEON, the sum of eight lanes held as two
 * vectors in the order the AVX2 code sums its register (k_dot, attention scores).
 */
#ifndef OROCHI_VEXP_H
#define OROCHI_VEXP_H

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif
#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#endif

#if defined(__AVX2__) && defined(__FMA__)
/* e^x for 8 lanes: x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial, 2^n through
 * the exponent bits. Relative error ~2e-7; inputs here are <= 0 (scores minus their max), and
 * anything below -87 flushes to 0. */
static inline __m256 k_exp8(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.0f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif

#if defined(__ARM_NEON) && defined(__aarch64__)
/* lo holds lanes 0..3 and hi lanes 4..7 of an 8-lane vector v: ((v0 + v4) + (v2 + v6)) +
 * ((v1 + v5) + (v3 + v7)), the AVX2 reduction (low half + high half, then movehl, then
 * movehdup). */
static inline float k_hsum8_neon(float32x4_t lo, float32x4_t hi)
{
    float32x4_t h = vaddq_f32(lo, hi);
    float32x2_t t = vadd_f32(vget_low_f32(h), vget_high_f32(h));
    return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

/* k_exp8's steps on four lanes: the same constants, fused multiply-adds in the same places,
 * round-to-nearest-even for n (vrndnq, as _MM_FROUND_TO_NEAREST_INT), n integral so its
 * conversion is exact either way. */
static inline float32x4_t k_exp4(float32x4_t x)
{
    const float32x4_t lo = vdupq_n_f32(-87.0f);
    uint32x4_t under = vcltq_f32(x, lo);
    x = vmaxq_f32(x, lo);
    float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    float32x4_t p = vdupq_n_f32(1.0f / 720);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    uint32x4_t v = vreinterpretq_u32_f32(vmulq_f32(p, vreinterpretq_f32_s32(e)));
    return vreinterpretq_f32_u32(vbicq_u32(v, under));
}
#endif

#endif
