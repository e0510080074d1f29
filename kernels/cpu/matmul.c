/*
 * kernels/cpu/matmul.c — the batched matmul y = W x for a batch of 1..64 tokens.
 *
 * Speculative verification lives on one property: W tokens cost about what one token costs,
 * because the weights are what a memory-bound step pays for. So the loop order is row-outer:
 * each thread takes a contiguous range of output rows; each row is streamed from memory once and
 * then stays in L1 while it is dotted with every token of the batch, four tokens per tile.
 * Quantized blocks are expanded to 16-bit integers in registers (per tile); float-type rows are
 * expanded to f32 once into a per-thread buffer.
 *
 * Quantized weights are multiplied against activations quantized to 16 bits per 32-element block
 * (scale d = max|x| / 32767, and the exact block sum s for the offset term), once per call before
 * the rows are split:
 *   Q8_0: w = d_w * q              -> d_w d_x <q, x>
 *   Q4_0: w = d_w * n - 8 d_w      -> d_w d_x <n, x> - 8 d_w s_x
 *   Q4_1: w = d_w * n + m_w        -> d_w d_x <n, x> + m_w s_x
 * with n the unsigned nibble. Why 16 bits and not 8: 8-bit activations cost the 30-layer default
 * model about 10% relative error in its logits against a float reference; 16 bits bring that to
 * the 1e-4 range for about one extra instruction per token and block (vpmaddwd takes the place of
 * vpmaddubsw). Float weights (F32/F16/BF16) use f32 activations.
 * A row's result depends only on the row and the inputs, never on [lo, hi) or the thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MM_AVX2 1
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#define MM_NEON 1
#endif

#include "kernels/cpu/kernels.h"

#define MM_TILE 4 /* tokens per inner tile */

/* The quantized activations of the batch: q[t][k] (int16), s[t][b] (block sums), and
 * dv[t][b][8] = the block scale broadcast to a vector (one aligned load instead of a scalar
 * multiply and a broadcast in the inner loop). */
typedef struct {
    int16_t *q;
    float *s, *dv;
} mm_xq;

#define MM_MAX_MATS 4 /* matrices sharing one input in one job (q/k/v, gate/up) */

typedef struct {
    int n_mats;
    const kmat *w[MM_MAX_MATS];
    int64_t lo[MM_MAX_MATS];
    int64_t start[MM_MAX_MATS + 1]; /* job row index where each matrix's rows begin */
    float *y[MM_MAX_MATS];
    int64_t ldy[MM_MAX_MATS];
    const float *x; /* float activations (float weight types) */
    mm_xq xq;       /* quantized activations (quantized weight types), shared by all matrices */
    int n_tok;
    uint8_t *scratch; /* per-thread f32 row buffers (float weight types) */
    size_t scratch_per_thread;
} mm_job;

static bool mm_is_quant(uint32_t type)
{
    return type == KT_Q8_0 || type == KT_Q4_0 || type == KT_Q4_1;
}

static size_t mm_align(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

size_t kmat_scratch_bytes(int64_t cols, int n_tok, int n_threads)
{
    size_t nb = (size_t)(cols + 31) / 32;
    size_t xq = mm_align((size_t)n_tok * (size_t)cols * 2) + mm_align((size_t)n_tok * nb * 4) +
                mm_align((size_t)n_tok * nb * 32);
    size_t per_thread = mm_align((size_t)cols * 4);
    return xq + (size_t)n_threads * per_thread + 64;
}

#ifdef MM_AVX2
static inline float mm_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif

/* ===== activation quantisation ===== */

static void mm_quantize_x(const float *x, int64_t cols, int n_tok, mm_xq *xq)
{
    int64_t nb = cols / 32;
    for (int t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + t * cols + b * 32;
            int16_t *q = xq->q + t * cols + b * 32;
#ifdef MM_AVX2
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
            __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
            __m256 sign = _mm256_set1_ps(-0.0f);
            __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                      _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
            float sum = mm_hsum(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)));
#else
            float amax = 0, sum = 0;
            for (int i = 0; i < 32; i++) {
                amax = fmaxf(amax, fabsf(v[i]));
                sum += v[i];
            }
#endif
            float d = amax / 32767.0f, id = amax ? 32767.0f / amax : 0.0f;
#ifdef MM_AVX2
            __m256 sc = _mm256_set1_ps(id);
            for (int i = 0; i < 32; i += 16) {
                __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), sc));
                __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8), sc));
                /* packs works per 128-bit lane: restore element order with a 64-bit permute */
                __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, c), 0xd8);
                _mm256_storeu_si256((__m256i *)(q + i), p);
            }
#else
            for (int i = 0; i < 32; i++)
                q[i] = (int16_t)lrintf(v[i] * id);
#endif
            xq->s[t * nb + b] = sum;
            for (int i = 0; i < 8; i++)
                xq->dv[(t * nb + b) * 8 + i] = d;
        }
}

/* ===== weight blocks ===== */

#ifndef MM_AVX2
static inline float mm_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return kt_f16_to_f32(h);
#endif
}

/* Where block b of a quantized row starts, its scale d and offset m. A Q4_0 block is treated
 * as Q4_1 with m = -8d (value = d * n - 8d), so both 4-bit types multiply unsigned nibbles. */
static inline const uint8_t *mm_block(uint32_t type, const uint8_t *row, int64_t b, float *d, float *m)
{
    const uint8_t *p = row + b * (type == KT_Q8_0 ? 34 : type == KT_Q4_0 ? 18 : 20);
    *d = mm_f16(p);
    *m = type == KT_Q4_1 ? mm_f16(p + 2) : type == KT_Q4_0 ? -8.0f * *d : 0.0f;
    return p + (type == KT_Q4_1 ? 4 : 2);
}

/* Expand one block's values to int16 (4-bit types as 0..15, see mm_block). */
static inline void mm_block_i16(uint32_t type, const uint8_t *qs, int16_t *q)
{
    if (type == KT_Q8_0) {
        for (int j = 0; j < 32; j++)
            q[j] = (int8_t)qs[j];
        return;
    }
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0x0f;
        q[j + 16] = qs[j] >> 4;
    }
}
#endif

static void mm_expand_float(uint32_t type, const uint8_t *row, int64_t cols, float *out)
{
    if (type == KT_F32) {
        memcpy(out, row, (size_t)cols * 4);
        return;
    }
    int64_t i = 0;
#ifdef MM_AVX2
    if (type == KT_F16)
        for (; i + 8 <= cols; i += 8)
            _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i))));
    else
        for (; i + 8 <= cols; i += 8) {
            __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * i)));
            _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
        }
#endif
    for (; i < cols; i++) {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        out[i] = type == KT_F16 ? kt_f16_to_f32(h) : kt_bf16_to_f32(h);
    }
}

/* ===== dot products over an expanded row, a tile of up to MM_TILE tokens ===== */


#define MM_INLINE static inline __attribute__((always_inline))

#ifdef MM_AVX2
/* Fold block b of the row into acc[0..NT). TYPE and NT are constants at every call site, so the
 * accumulators stay in registers. The block's 32 values become two vectors of 16 int16 (elements
 * 0..15 and 16..31); vpmaddwd against the int16 activations gives 8 int32 partial sums. */
MM_INLINE void mm_qblock(uint32_t TYPE, int NT, const uint8_t *row, int64_t b, int64_t nb,
                         const mm_xq *xq, int t0, __m256 *acc, float *mrow)
{
    const uint8_t *p = row + b * (TYPE == KT_Q8_0 ? 34 : TYPE == KT_Q4_0 ? 18 : 20);
    const uint8_t *qs = p + (TYPE == KT_Q4_1 ? 4 : 2);
    /* the block's f16 scale (and Q4_1 offset) in one conversion: lanes [d, m] */
    uint32_t raw_dm;
    if (TYPE == KT_Q4_1) {
        memcpy(&raw_dm, p, 4);
    } else {
        uint16_t h;
        memcpy(&h, p, 2);
        raw_dm = h;
    }
    __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)raw_dm));
    __m256 dw = _mm256_broadcastss_ps(dm);
    if (TYPE == KT_Q4_1)
        _mm_store_ss(mrow + b, _mm_movehdup_ps(dm));
    else if (TYPE == KT_Q4_0)
        _mm_store_ss(mrow + b, _mm_mul_ss(dm, _mm_set_ss(-8.0f)));
    __m256i wa, wb;
    if (TYPE == KT_Q8_0) {
        wa = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qs));
        wb = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qs + 16)));
    } else {
        const __m128i mask = _mm_set1_epi8(0x0f);
        __m128i raw = _mm_loadu_si128((const __m128i *)qs);
        wa = _mm256_cvtepu8_epi16(_mm_and_si128(raw, mask));
        wb = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), mask));
    }
    for (int j = 0; j < NT; j++) {
        int64_t xb = (int64_t)(t0 + j) * nb + b;
        const int16_t *x = xq->q + xb * 32;
        __m256i p = _mm256_add_epi32(_mm256_madd_epi16(wa, _mm256_loadu_si256((const __m256i *)x)),
                                     _mm256_madd_epi16(wb, _mm256_loadu_si256((const __m256i *)(x + 16))));
        acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw, _mm256_load_ps(xq->dv + xb * 8)), acc[j]);
    }
    /* mrow[b] (the block offset) feeds one dot per token after the block loop */
}

/* Dot one quantized row with tokens t0 .. t0+NT-1. The row's blocks are expanded in registers per
 * tile (they sit in L1 after the first tile); two accumulator sets take even and odd blocks so the
 * FMA latency chain does not bound a width-1 step. */
MM_INLINE void mm_qtile(uint32_t TYPE, int NT, const uint8_t *row, int64_t nb, const mm_xq *xq,
                        int t0, float *mrow, float *out)
{
    __m256 a0[MM_TILE], a1[MM_TILE];
    for (int j = 0; j < NT; j++)
        a0[j] = a1[j] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        mm_qblock(TYPE, NT, row, b, nb, xq, t0, a0, mrow);
        mm_qblock(TYPE, NT, row, b + 1, nb, xq, t0, a1, mrow);
    }
    if (b < nb)
        mm_qblock(TYPE, NT, row, b, nb, xq, t0, a0, mrow);
    for (int j = 0; j < NT; j++) {
        __m256 sum = _mm256_add_ps(a0[j], a1[j]);
        float tail = 0;
        if (TYPE != KT_Q8_0) { /* offset term: <m, s> over the blocks, folded into the same hsum */
            const float *sx = xq->s + (int64_t)(t0 + j) * nb;
            int64_t k = 0;
            for (; k + 8 <= nb; k += 8)
                sum = _mm256_fmadd_ps(_mm256_loadu_ps(mrow + k), _mm256_loadu_ps(sx + k), sum);
            for (; k < nb; k++)
                tail += mrow[k] * sx[k];
        }
        out[j] = mm_hsum(sum) + tail;
    }
}

#define MM_QTILE_FN(name, TYPE)                                                                  \
    static void name(const uint8_t *row, int64_t nb, const mm_xq *xq, int t0, int nt,        \
                     float *mrow, float *out)                                                    \
    {                                                                                            \
        switch (nt) {                                                                            \
        case 1: mm_qtile(TYPE, 1, row, nb, xq, t0, mrow, out); break;                            \
        case 2: mm_qtile(TYPE, 2, row, nb, xq, t0, mrow, out); break;                            \
        case 3: mm_qtile(TYPE, 3, row, nb, xq, t0, mrow, out); break;                            \
        default: mm_qtile(TYPE, 4, row, nb, xq, t0, mrow, out); break;                           \
        }                                                                                        \
    }
MM_QTILE_FN(mm_qtile_q8_0, KT_Q8_0)
MM_QTILE_FN(mm_qtile_q4_0, KT_Q4_0)
MM_QTILE_FN(mm_qtile_q4_1, KT_Q4_1)

static void mm_dot_quant_tile(uint32_t type, const uint8_t *row, int64_t nb, const mm_xq *xq,
                              int t0, int nt, float *mrow, float *out)
{
    if (type == KT_Q8_0)
        mm_qtile_q8_0(row, nb, xq, t0, nt, mrow, out);
    else if (type == KT_Q4_0)
        mm_qtile_q4_0(row, nb, xq, t0, nt, mrow, out);
    else
        mm_qtile_q4_1(row, nb, xq, t0, nt, mrow, out);
}
#else
/* Portable path: expand each block to int16, integer dot per token. */
static void mm_dot_quant_tile(uint32_t type, const uint8_t *row, int64_t nb, const mm_xq *xq,
                              int t0, int nt, float *mrow, float *out)
{
    float sum[MM_TILE] = {0}, moff[MM_TILE] = {0};
    int16_t w[32];
    for (int64_t b = 0; b < nb; b++) {
        float d, m;
        mm_block_i16(type, mm_block(type, row, b, &d, &m), w);
        for (int j = 0; j < nt; j++) {
            int64_t xb = (int64_t)(t0 + j) * nb + b;
            const int16_t *x = xq->q + xb * 32;
#ifdef MM_NEON
            int32x4_t s4 = vmull_s16(vld1_s16(w), vld1_s16(x));
            for (int i = 4; i < 32; i += 4)
                s4 = vmlal_s16(s4, vld1_s16(w + i), vld1_s16(x + i));
            int32_t isum = vaddvq_s32(s4);
#else
            int32_t isum = 0;
            for (int i = 0; i < 32; i++)
                isum += w[i] * x[i];
#endif
            sum[j] += (float)isum * (d * xq->dv[xb * 8]);
            moff[j] += m * xq->s[xb];
        }
    }
    for (int j = 0; j < nt; j++)
        out[j] = sum[j] + moff[j];
}
#endif

static void mm_dot_float_tile(const float *w, const float *x, int64_t cols, int nt, float *out)
{
#ifdef MM_AVX2
    __m256 acc[MM_TILE];
    for (int j = 0; j < MM_TILE; j++)
        acc[j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= cols; k += 8) {
        __m256 wv = _mm256_loadu_ps(w + k);
        for (int j = 0; j < nt; j++)
            acc[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + j * cols + k), acc[j]);
    }
    for (int j = 0; j < nt; j++) {
        float s = mm_hsum(acc[j]);
        for (int64_t kk = k; kk < cols; kk++)
            s += w[kk] * x[j * cols + kk];
        out[j] = s;
    }
#else
    for (int j = 0; j < nt; j++)
        out[j] = k_dot(w, x + j * cols, (int)cols);
#endif
}

/* ===== the job ===== */

/* Rows are taken MM_ROW_CHUNK at a time and, within a chunk, token tile by token tile: the chunk's
 * weight rows and one tile of activations both stay in L1, so a wide batch reads its activations
 * from L2 once per chunk rather than once per row. */
#define MM_ROW_CHUNK 8

/* Rows [begin, end) of matrix m of the job (matrix-local indices relative to its lo). */
static void mm_rows_one(const mm_job *job, int m, int64_t begin, int64_t end, int thread)
{
    const kmat *w = job->w[m];
    float *y = job->y[m];
    int64_t ldy = job->ldy[m], cols = w->cols, nb = cols / 32;
    float tile[MM_TILE];
    float *buf = (float *)(job->scratch + (size_t)thread * job->scratch_per_thread);
    float *mrow = buf; /* quantized types: the row's block offsets */

    if (!mm_is_quant(w->type)) {
        float *wf = buf;
        for (int64_t i = begin; i < end; i++) {
            int64_t r = job->lo[m] + i;
            mm_expand_float(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, cols, wf);
            for (int t0 = 0; t0 < job->n_tok; t0 += MM_TILE) {
                int nt = job->n_tok - t0 < MM_TILE ? job->n_tok - t0 : MM_TILE;
                mm_dot_float_tile(wf, job->x + t0 * cols, cols, nt, tile);
                for (int j = 0; j < nt; j++)
                    y[(t0 + j) * ldy + r] = tile[j];
            }
        }
        return;
    }
    for (int64_t c0 = begin; c0 < end; c0 += MM_ROW_CHUNK) {
        int64_t c1 = c0 + MM_ROW_CHUNK < end ? c0 + MM_ROW_CHUNK : end;
        for (int t0 = 0; t0 < job->n_tok; t0 += MM_TILE) {
            int nt = job->n_tok - t0 < MM_TILE ? job->n_tok - t0 : MM_TILE;
            for (int64_t i = c0; i < c1; i++) {
                int64_t r = job->lo[m] + i;
                const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
                mm_dot_quant_tile(w->type, row, nb, &job->xq, t0, nt, mrow, tile);
                for (int j = 0; j < nt; j++)
                    y[(t0 + j) * ldy + r] = tile[j];
            }
        }
    }
}

static void mm_rows(void *argp, int64_t begin, int64_t end, int thread)
{
    const mm_job *job = argp;
    for (int m = 0; m < job->n_mats; m++) {
        int64_t b = begin > job->start[m] ? begin : job->start[m];
        int64_t e = end < job->start[m + 1] ? end : job->start[m + 1];
        if (e > b)
            mm_rows_one(job, m, b - job->start[m], e - job->start[m], thread);
    }
}

void kmat_mul_n(kpool *pool, int n, const kmat *const *w, const int64_t *lo, const int64_t *hi,
                const float *x, int n_tok, float *const *y, const int64_t *ldy, void *scratch)
{
    if (n <= 0 || n_tok <= 0)
        return;
    /* one job needs one input format: the same row length and all quantized or all float */
    bool same = n <= MM_MAX_MATS;
    for (int m = 1; m < n && same; m++)
        same = w[m]->cols == w[0]->cols && mm_is_quant(w[m]->type) == mm_is_quant(w[0]->type);
    if (!same) {
        for (int m = 0; m < n; m++)
            kmat_mul_n(pool, 1, &w[m], &lo[m], &hi[m], x, n_tok, &y[m], &ldy[m], scratch);
        return;
    }
    int threads = kpool_threads(pool);
    void *owned = NULL;
    if (!scratch) {
        owned = malloc(kmat_scratch_bytes(w[0]->cols, n_tok, threads));
        if (!owned)
            abort(); /* a few KiB per call; callers on the hot path pass their own scratch */
        scratch = owned;
    }
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int64_t cols = w[0]->cols;
    size_t nb = (size_t)cols / 32;
    mm_job job = {.n_mats = n, .x = x, .n_tok = n_tok, .scratch_per_thread = mm_align((size_t)cols * 4)};
    for (int m = 0; m < n; m++) {
        job.w[m] = w[m];
        job.lo[m] = lo[m];
        job.y[m] = y[m];
        job.ldy[m] = ldy[m];
        job.start[m + 1] = job.start[m] + (hi[m] > lo[m] ? hi[m] - lo[m] : 0);
    }
    if (mm_is_quant(w[0]->type)) {
        job.xq.q = (int16_t *)base;
        base += mm_align((size_t)n_tok * (size_t)cols * 2);
        job.xq.s = (float *)base;
        base += mm_align((size_t)n_tok * nb * 4);
        job.xq.dv = (float *)base;
        base += mm_align((size_t)n_tok * nb * 32);
        mm_quantize_x(x, cols, n_tok, &job.xq);
    } else {
        base += mm_align((size_t)n_tok * (size_t)cols * 2) + mm_align((size_t)n_tok * nb * 4) +
                mm_align((size_t)n_tok * nb * 32);
    }
    job.scratch = base;
    if (job.start[n] > 0)
        kpool_run(pool, job.start[n], 16, mm_rows, &job);
    free(owned);
}

void kmat_mul(kpool *pool, const kmat *w, int64_t lo, int64_t hi, const float *x, int n_tok,
              float *y, int64_t ldy, void *scratch)
{
    if (hi > lo)
        kmat_mul_n(pool, 1, &w, &lo, &hi, x, n_tok, &y, &ldy, scratch);
}

void kmat_row(const kmat *w, int64_t r, float *out)
{
    kt_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, out, w->cols);
}
