/*
 * kernels/cpu/mm_avx2.c — matmul micro-kernels for AVX2 + FMA + F16C (compiled
 * with those flags only; matmul.c calls them when cpuid reports them).
 *
 * Quantized groups run as two halves of 8 rows (one ymm lane per row, see
 * mm_isa.h). 4-bit weights: the nibbles are the unsigned operand of vpmaddubsw
 * against the low and high signed bytes of the activations, four columns per
 * instruction and lane; eight such products summed in int16 cannot overflow (8
 * * 2 * 15 * 128 < 32768), then one vpmaddwd widens the block to int32. Q8_0:
 * the int8 weights are widened to int16 pairs and multiplied with vpmaddwd.
 * Every weight block is unpacked once per tile of up to 4 tokens. Float
 * weights: a 4-row x 2-token register tile, F16 converted in registers
 * (vcvtph2ps), BF16 by a 16-bit shift; each (row, token) sum is one ymm
 * accumulator reduced in a fixed order.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/mm_isa.h"

#define AI static inline __attribute__((always_inline))
#define QT 4 /* tokens per quantized tile */
#define FT 2 /* tokens per float tile */

AI __m256i a2_bcast(const int8_t *p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/* One 8-row half (h) of a 4-bit group, tokens t0 .. t0 + NT - 1. */
AI void a2_q4_tile(bool q41, int NT, const uint8_t *pk, int h, const mm_xq *xq,
                   int t0, float *out) {
  const int64_t nb = xq->nb;
  const size_t gb = q41 ? 320 : 288;
  const __m256i mask = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 acc[QT];
  for (int t = 0; t < NT; t++)
    acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *p = pk + (size_t)b * gb;
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
    __m256 mw = q41 ? _mm256_cvtph_ps(
                          _mm_loadu_si128((const __m128i *)(p + 32 + 16 * h)))
                    : _mm256_mul_ps(dw, _mm256_set1_ps(-8.0f));
    const uint8_t *qs = p + (q41 ? 64 : 32) + 32 * h;
    __m256i lo[QT], hi[QT];
    for (int t = 0; t < NT; t++)
      lo[t] = hi[t] = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
      __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 64 * k));
      __m256i wl = _mm256_and_si256(raw, mask);
      __m256i wh = _mm256_and_si256(_mm256_srli_epi16(raw, 4), mask);
      for (int t = 0; t < NT; t++) {
        size_t xo = ((size_t)(t0 + t) * (size_t)nb + (size_t)b) * 32;
        const int8_t *xl = xq->lo + xo, *xh = xq->hi + xo;
        lo[t] = _mm256_add_epi16(
            lo[t], _mm256_maddubs_epi16(wl, a2_bcast(xl + 4 * k)));
        lo[t] = _mm256_add_epi16(
            lo[t], _mm256_maddubs_epi16(wh, a2_bcast(xl + 16 + 4 * k)));
        hi[t] = _mm256_add_epi16(
            hi[t], _mm256_maddubs_epi16(wl, a2_bcast(xh + 4 * k)));
        hi[t] = _mm256_add_epi16(
            hi[t], _mm256_maddubs_epi16(wh, a2_bcast(xh + 16 + 4 * k)));
      }
    }
    for (int t = 0; t < NT; t++) {
      size_t xb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
      __m256i dot =
          _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(hi[t], ones), 8),
                           _mm256_madd_epi16(lo[t], ones));
      __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[xb]));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, acc[t]);
      acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xq->s[xb]), acc[t]);
    }
  }
  for (int t = 0; t < NT; t++)
    _mm256_storeu_ps(out + (size_t)(t0 + t) * MM_GROUP + 8 * h, acc[t]);
}

AI void a2_q8_tile(int NT, const uint8_t *pk, int h, const mm_xq *xq, int t0,
                   float *out) {
  const int64_t nb = xq->nb;
  __m256 acc[QT];
  for (int t = 0; t < NT; t++)
    acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t *p = pk + (size_t)b * 544;
    __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * h)));
    const uint8_t *qs = p + 32 + 16 * h;
    __m256i dot[QT];
    for (int t = 0; t < NT; t++)
      dot[t] = _mm256_setzero_si256();
    for (int pr = 0; pr < 16; pr++) {
      __m256i w = _mm256_cvtepi8_epi16(
          _mm_loadu_si128((const __m128i *)(qs + 32 * pr)));
      for (int t = 0; t < NT; t++) {
        const int16_t *x =
            xq->q + ((size_t)(t0 + t) * (size_t)nb + (size_t)b) * 32 + 2 * pr;
        int32_t v;
        memcpy(&v, x, 4);
        dot[t] = _mm256_add_epi32(dot[t],
                                  _mm256_madd_epi16(w, _mm256_set1_epi32(v)));
      }
    }
    for (int t = 0; t < NT; t++) {
      size_t xb = (size_t)(t0 + t) * (size_t)nb + (size_t)b;
      __m256 sc = _mm256_mul_ps(dw, _mm256_set1_ps(xq->d[xb]));
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[t]), sc, acc[t]);
    }
  }
  for (int t = 0; t < NT; t++)
    _mm256_storeu_ps(out + (size_t)(t0 + t) * MM_GROUP + 8 * h, acc[t]);
}

#define A2_Q_CASES(CALL)                                                       \
  switch (nt) {                                                                \
  case 1:                                                                      \
    CALL(1);                                                                   \
    break;                                                                     \
  case 2:                                                                      \
    CALL(2);                                                                   \
    break;                                                                     \
  case 3:                                                                      \
    CALL(3);                                                                   \
    break;                                                                     \
  default:                                                                     \
    CALL(4);                                                                   \
    break;                                                                     \
  }

static void a2_qgroup(uint32_t type, const uint8_t *pk, const mm_xq *xq,
                      int n_tok, float *out) {
  for (int h = 0; h < 2; h++)
    for (int t0 = 0; t0 < n_tok; t0 += QT) {
      int nt = n_tok - t0 < QT ? n_tok - t0 : QT;
      if (type == KT_Q8_0) {
#define C8(N) a2_q8_tile(N, pk, h, xq, t0, out)
        A2_Q_CASES(C8)
      } else if (type == KT_Q4_1) {
#define C41(N) a2_q4_tile(true, N, pk, h, xq, t0, out)
        A2_Q_CASES(C41)
      } else {
#define C40(N) a2_q4_tile(false, N, pk, h, xq, t0, out)
        A2_Q_CASES(C40)
      }
    }
}

/* ===== float weights ===== */

AI __m256 a2_load_w(uint32_t type, const uint8_t *row, int64_t k) {
  if (type == KT_F32)
    return _mm256_loadu_ps((const float *)(const void *)(row + 4 * k));
  __m128i h = _mm_loadu_si128((const __m128i *)(row + 2 * k));
  if (type == KT_F16)
    return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

AI float a2_hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static float a2_weight(uint32_t type, const uint8_t *row, int64_t k) {
  if (type == KT_F32) {
    float f;
    memcpy(&f, row + 4 * k, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, row + 2 * k, 2);
  return type == KT_F16 ? kt_f16_to_f32(h) : kt_bf16_to_f32(h);
}

AI void a2_ftile(uint32_t type, int NR, int NT, const uint8_t *w,
                 size_t row_bytes, int64_t cols, const float *x, int t0,
                 float *out) {
  __m256 acc[MM_FROWS][FT];
  for (int r = 0; r < NR; r++)
    for (int t = 0; t < NT; t++)
      acc[r][t] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= cols; k += 8) {
    __m256 xv[FT];
    for (int t = 0; t < NT; t++)
      xv[t] = _mm256_loadu_ps(x + (size_t)(t0 + t) * (size_t)cols + k);
    for (int r = 0; r < NR; r++) {
      __m256 wv = a2_load_w(type, w + (size_t)r * row_bytes, k);
      for (int t = 0; t < NT; t++)
        acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < NR; r++)
    for (int t = 0; t < NT; t++) {
      float s = a2_hsum(acc[r][t]);
      const float *xt = x + (size_t)(t0 + t) * (size_t)cols;
      for (int64_t kk = k; kk < cols; kk++)
        s = __builtin_fmaf(a2_weight(type, w + (size_t)r * row_bytes, kk),
                           xt[kk], s);
      out[(size_t)(t0 + t) * MM_FROWS + r] = s;
    }
}

AI void a2_frows_t(uint32_t type, const uint8_t *w, size_t row_bytes, int nr,
                   int64_t cols, const float *x, int n_tok, float *out) {
  for (int t0 = 0; t0 < n_tok; t0 += FT) {
    int nt = n_tok - t0 < FT ? n_tok - t0 : FT;
    if (nr == MM_FROWS && nt == FT)
      a2_ftile(type, MM_FROWS, FT, w, row_bytes, cols, x, t0, out);
    else if (nr == MM_FROWS)
      a2_ftile(type, MM_FROWS, 1, w, row_bytes, cols, x, t0, out);
    else
      for (int r = 0; r < nr; r++)
        for (int t = t0; t < t0 + nt; t++) {
          float one[MM_FROWS * 1];
          a2_ftile(type, 1, 1, w + (size_t)r * row_bytes, row_bytes, cols,
                   x + (size_t)t * cols, 0, one);
          out[(size_t)t * MM_FROWS + r] = one[0];
        }
  }
}

static void a2_frows(uint32_t type, const uint8_t *w, size_t row_bytes, int nr,
                     int64_t cols, const float *x, int n_tok, float *out) {
  if (type == KT_F16)
    a2_frows_t(KT_F16, w, row_bytes, nr, cols, x, n_tok, out);
  else if (type == KT_BF16)
    a2_frows_t(KT_BF16, w, row_bytes, nr, cols, x, n_tok, out);
  else
    a2_frows_t(KT_F32, w, row_bytes, nr, cols, x, n_tok, out);
}

const mm_isa mm_isa_avx2 = {
    .name = "avx2", .qgroup = a2_qgroup, .frows = a2_frows};
