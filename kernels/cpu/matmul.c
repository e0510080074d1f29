/*
 * kernels/cpu/matmul.c — the batched matmul y = W x for a batch of 1..64 tokens.
 *
 * Speculative verification lives on one property: W tokens cost about what one token costs,
 * because the weights are what a memory-bound step pays for. So the loop order is row-outer:
 * each thread takes a contiguous range of output rows; for each row it streams the row's blocks
 * from memory exactly once, expands them into an L1-resident buffer (int8 values plus per-block
 * scales for quantized types, f32 for float types) and then dots that buffer with every token of
 * the batch, four tokens at a time.
 *
 * Quantized weights are multiplied against activations quantized to 8 bits per 32-element block
 * (scale d, and s = d * sum(q) for the Q4_1 offset term), done once per call before dispatch:
 *   Q8_0: w = d_w * q              -> d_w d_x <q, x>
 *   Q4_0: w = d_w * (n - 8)        -> d_w d_x <n - 8, x>
 *   Q4_1: w = d_w * n + m_w        -> d_w d_x <n, x> + m_w s_x
 * so all three share one int8 x int8 dot. Float weights (F32/F16/BF16) use f32 activations.
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

/* The quantized activations of the batch: q[t][k], d[t][b], s[t][b]. */
typedef struct {
    int8_t *q;
    float *d, *s;
} mm_xq;

typedef struct {
    const kmat *w;
    int64_t lo;
    const float *x; /* float activations (float weight types) */
    mm_xq xq;       /* quantized activations (quantized weight types) */
    int n_tok;
    float *y;
    int64_t ldy;
    uint8_t *scratch; /* per-thread row buffers */
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
    size_t xq = mm_align((size_t)n_tok * (size_t)cols) + 2 * mm_align((size_t)n_tok * nb * 4);
    size_t per_thread = mm_align((size_t)cols * 4) + 2 * mm_align(nb * 4);
    return xq + (size_t)n_threads * per_thread + 64;
}

/* ===== activation quantisation ===== */

static void mm_quantize_x(const float *x, int64_t cols, int n_tok, mm_xq *xq)
{
    int64_t nb = cols / 32;
    for (int t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + t * cols + b * 32;
            int8_t *q = xq->q + t * cols + b * 32;
            float amax = 0;
            for (int i = 0; i < 32; i++)
                amax = fmaxf(amax, fabsf(v[i]));
            float d = amax / 127.0f, id = amax ? 127.0f / amax : 0.0f;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                q[i] = (int8_t)lrintf(v[i] * id);
                sum += q[i];
            }
            xq->d[t * nb + b] = d;
            xq->s[t * nb + b] = d * (float)sum;
        }
}

/* ===== row expansion ===== */

static float mm_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return kt_f16_to_f32(h);
}

/* Expand a quantized row into int8 values plus per-block scale and offset. */
static void mm_expand_quant(uint32_t type, const uint8_t *row, int64_t nb, int8_t *q, float *d,
                            float *m)
{
    for (int64_t b = 0; b < nb; b++, q += 32) {
        if (type == KT_Q8_0) {
            const uint8_t *p = row + b * 34;
            d[b] = mm_f16(p);
            m[b] = 0;
            memcpy(q, p + 2, 32);
            continue;
        }
        const uint8_t *p = type == KT_Q4_0 ? row + b * 18 : row + b * 20;
        const uint8_t *qs = type == KT_Q4_0 ? p + 2 : p + 4;
        d[b] = mm_f16(p);
        m[b] = type == KT_Q4_1 ? mm_f16(p + 2) : 0.0f;
        int bias = type == KT_Q4_0 ? 8 : 0;
#ifdef MM_AVX2
        __m128i raw = _mm_loadu_si128((const __m128i *)qs);
        __m128i mask = _mm_set1_epi8(0x0f);
        __m128i lo = _mm_and_si128(raw, mask);
        __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
        __m256i v = _mm256_set_m128i(hi, lo);
        v = _mm256_sub_epi8(v, _mm256_set1_epi8((char)bias));
        _mm256_storeu_si256((__m256i *)q, v);
#else
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((qs[j] & 0x0f) - bias);
            q[j + 16] = (int8_t)((qs[j] >> 4) - bias);
        }
#endif
    }
}

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

#ifdef MM_AVX2
static inline float mm_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 mm_idot32(__m256i aw, __m256i w, const int8_t *x)
{
    __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    __m256i p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, w));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}
#endif

static void mm_dot_quant_tile(const int8_t *wq, const float *wd, int64_t nb, const mm_xq *xq,
                              int64_t cols, int t0, int nt, float *out)
{
#ifdef MM_AVX2
    __m256 acc[MM_TILE];
    for (int j = 0; j < MM_TILE; j++)
        acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i w = _mm256_loadu_si256((const __m256i *)(wq + b * 32));
        __m256i aw = _mm256_sign_epi8(w, w);
        for (int j = 0; j < nt; j++) {
            int t = t0 + j;
            __m256 scale = _mm256_set1_ps(wd[b] * xq->d[t * nb + b]);
            acc[j] = _mm256_fmadd_ps(mm_idot32(aw, w, xq->q + t * cols + b * 32), scale, acc[j]);
        }
    }
    for (int j = 0; j < nt; j++)
        out[j] = mm_hsum(acc[j]);
#else
    for (int j = 0; j < nt; j++) {
        int t = t0 + j;
        float sum = 0;
        for (int64_t b = 0; b < nb; b++) {
            const int8_t *x = xq->q + t * cols + b * 32;
            const int8_t *w = wq + b * 32;
#ifdef MM_NEON
            int16x8_t p0 = vmull_s8(vld1_s8(w), vld1_s8(x));
            int16x8_t p1 = vmull_s8(vld1_s8(w + 8), vld1_s8(x + 8));
            int16x8_t p2 = vmull_s8(vld1_s8(w + 16), vld1_s8(x + 16));
            int16x8_t p3 = vmull_s8(vld1_s8(w + 24), vld1_s8(x + 24));
            int32x4_t s4 = vpaddlq_s16(p0);
            s4 = vpadalq_s16(s4, p1);
            s4 = vpadalq_s16(s4, p2);
            s4 = vpadalq_s16(s4, p3);
            int isum = vaddvq_s32(s4);
#else
            int isum = 0;
            for (int i = 0; i < 32; i++)
                isum += w[i] * x[i];
#endif
            sum += (float)isum * (wd[b] * xq->d[t * nb + b]);
        }
        out[j] = sum;
    }
#endif
}

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

static void mm_rows(void *argp, int64_t begin, int64_t end, int thread)
{
    const mm_job *job = argp;
    const kmat *w = job->w;
    int64_t cols = w->cols, nb = cols / 32;
    uint8_t *buf = job->scratch + (size_t)thread * job->scratch_per_thread;
    bool quant = mm_is_quant(w->type);
    int8_t *wq = (int8_t *)buf;
    float *wf = (float *)buf;
    float *wd = (float *)(buf + mm_align((size_t)cols * 4));
    float *wm = (float *)((uint8_t *)wd + mm_align((size_t)nb * 4));
    float tile[MM_TILE];

    for (int64_t i = begin; i < end; i++) {
        int64_t r = job->lo + i;
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        if (quant)
            mm_expand_quant(w->type, row, nb, wq, wd, wm);
        else
            mm_expand_float(w->type, row, cols, wf);
        for (int t0 = 0; t0 < job->n_tok; t0 += MM_TILE) {
            int nt = job->n_tok - t0 < MM_TILE ? job->n_tok - t0 : MM_TILE;
            if (quant) {
                mm_dot_quant_tile(wq, wd, nb, &job->xq, cols, t0, nt, tile);
                if (w->type == KT_Q4_1)
                    for (int j = 0; j < nt; j++)
                        tile[j] += k_dot(wm, job->xq.s + (t0 + j) * nb, (int)nb);
            } else {
                mm_dot_float_tile(wf, job->x + t0 * cols, cols, nt, tile);
            }
            for (int j = 0; j < nt; j++)
                job->y[(t0 + j) * job->ldy + r] = tile[j];
        }
    }
}

void kmat_mul(kpool *pool, const kmat *w, int64_t lo, int64_t hi, const float *x, int n_tok,
              float *y, int64_t ldy, void *scratch)
{
    if (hi <= lo || n_tok <= 0)
        return;
    int threads = kpool_threads(pool);
    void *owned = NULL;
    if (!scratch) {
        owned = malloc(kmat_scratch_bytes(w->cols, n_tok, threads));
        if (!owned)
            abort(); /* a few KiB per call; callers on the hot path pass their own scratch */
        scratch = owned;
    }
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    size_t nb = (size_t)w->cols / 32;
    mm_job job = {
        .w = w, .lo = lo, .x = x, .n_tok = n_tok, .y = y, .ldy = ldy,
        .scratch_per_thread = mm_align((size_t)w->cols * 4) + 2 * mm_align(nb * 4),
    };
    if (mm_is_quant(w->type)) {
        job.xq.q = (int8_t *)base;
        base += mm_align((size_t)n_tok * (size_t)w->cols);
        job.xq.d = (float *)base;
        base += mm_align((size_t)n_tok * nb * 4);
        job.xq.s = (float *)base;
        base += mm_align((size_t)n_tok * nb * 4);
        mm_quantize_x(x, w->cols, n_tok, &job.xq);
    } else {
        base += mm_align((size_t)n_tok * (size_t)w->cols) + 2 * mm_align((size_t)n_tok * nb * 4);
    }
    job.scratch = base;
    kpool_run(pool, hi - lo, 16, mm_rows, &job);
    free(owned);
}

void kmat_row(const kmat *w, int64_t r, float *out)
{
    kt_dequantize_row(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, out, w->cols);
}
