/*
 * kernels/cpu/mm_portable.c — the matmul micro-kernels in plain C.
 *
 * The reference for the SIMD paths (same packed layout, same roundings: see
 * mm_isa.h) and the path for CPUs with neither AVX2 nor AVX-512 (arm64 builds
 * get NEON in the float kernel). Slow but exact: quantized results are
 * bit-identical to mm_avx2.c and mm_avx512.c.
 */
#include <math.h>
#include <string.h>

#if defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/mm_isa.h"

static float pt_f16(const uint8_t *p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return kt_f16_to_f32(h);
}

static void pt_qgroup(uint32_t type, const uint8_t *pk, const mm_xq *xq,
                      int n_tok, float *out) {
  int64_t nb = xq->nb;
  size_t gb = mm_group_block_bytes(type);
  for (int t = 0; t < n_tok; t++)
    for (int j = 0; j < MM_GROUP; j++) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = pk + (size_t)b * gb;
        const int16_t *xqv = xq->q + ((size_t)t * nb + b) * 32;
        float dw = pt_f16(p + 2 * j), dx = xq->d[t * nb + b];
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
        acc = fmaf(mw, xq->s[t * nb + b], acc);
      }
      out[t * MM_GROUP + j] = acc;
    }
}

static float pt_weight(uint32_t type, const uint8_t *row, int64_t k) {
  if (type == KT_F32) {
    float f;
    memcpy(&f, row + 4 * k, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, row + 2 * k, 2);
  return type == KT_F16 ? kt_f16_to_f32(h) : kt_bf16_to_f32(h);
}

/* Eight partial sums per (row, token), element k going to sum k % 8, then added
 * pairwise: the order an 8-lane vector loop would use, written out in scalar C.
 */
static void pt_frows(uint32_t type, const uint8_t *w, size_t row_bytes, int nr,
                     int64_t cols, const float *x, int n_tok, float *out) {
  for (int r = 0; r < nr; r++) {
    const uint8_t *row = w + (size_t)r * row_bytes;
    for (int t = 0; t < n_tok; t++) {
      const float *xt = x + (size_t)t * cols;
      float part[8] = {0};
      for (int64_t k = 0; k < cols; k++)
        part[k % 8] = fmaf(pt_weight(type, row, k), xt[k], part[k % 8]);
      float s = ((part[0] + part[4]) + (part[2] + part[6])) +
                ((part[1] + part[5]) + (part[3] + part[7]));
      out[t * MM_FROWS + r] = s;
    }
  }
}

const mm_isa mm_isa_portable = {
    .name = "portable", .qgroup = pt_qgroup, .frows = pt_frows};
