/*
 * kernels/cpu/matmul.c — the batched matmul y = W x for a batch of 1..64 tokens: the driver.
 *
 * Speculative verification lives on one property: W tokens cost about what one token costs,
 * because the weights are what a memory-bound step pays for. So the loop order is weight-outer:
 * each thread takes whole 16-row groups, streams each from memory once, and dots it with every
 * token of the batch in register tiles (micro-kernels in mm_portable.c / mm_avx2.c /
 * mm_avx512.c; layouts in mm_isa.h).
 *
 * This file holds what is common to all instruction sets:
 *   - the choice of instruction set, once per process: the best the CPU reports (cpuid), a lesser
 *     one named by OROCHI_ISA=portable|avx2|avx512, or kisa_select() (tests, benchmarks);
 *   - repacking matrices into 16-row groups (kmat_pack; a matrix that was not packed is packed
 *     group by group into per-thread scratch on the fly: correct, slower);
 *   - activation quantisation for quantized weights, once per call before the rows are split;
 *   - the job: the groups of one or several matrices over the same input (q/k/v, gate/up),
 *     dispatched to the pool once.
 * A row's result depends only on the row and the inputs — never on [lo, hi), the batch width, the
 * tile a token falls in, the thread count or the instruction set — so column parts concatenate
 * bit-identically and a tree's logits equal sequential decoding's.
 */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MM_AVX2 1
#endif

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/ktypes_k.h"
#include "kernels/cpu/mm_isa.h"

/* ===== instruction set ===== */

static const char *const KISA_NAMES[] = {"portable", "avx2", "avx512"};
static pthread_once_t mm_once = PTHREAD_ONCE_INIT;
static _Atomic(const mm_isa *) mm_cur; /* process-wide dispatch table: set once, or by a test */
static _Atomic int mm_cur_id;

static const mm_isa *mm_table(kisa i)
{
#if defined(__x86_64__)
    if (i == KISA_AVX512)
        return &mm_isa_avx512;
    if (i == KISA_AVX2)
        return &mm_isa_avx2;
#endif
    return &mm_isa_portable;
}

const char *kisa_name(kisa i)
{
    return (unsigned)i < 3 ? KISA_NAMES[i] : "unknown";
}

bool kisa_supported(kisa i)
{
    if (i == KISA_PORTABLE)
        return true;
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (i == KISA_AVX2)
        return avx2;
    if (i == KISA_AVX512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#endif
    return false;
}

kisa kisa_best(void)
{
    return kisa_supported(KISA_AVX512) ? KISA_AVX512
           : kisa_supported(KISA_AVX2) ? KISA_AVX2
                                       : KISA_PORTABLE;
}

static void mm_init(void)
{
    kisa pick = kisa_best();
    const char *env = getenv("OROCHI_ISA");
    if (env && *env)
        for (int i = 0; i < 3; i++)
            if (!strcasecmp(env, KISA_NAMES[i]) && kisa_supported((kisa)i) && (kisa)i < pick)
                pick = (kisa)i; /* only ever a lesser set than the CPU has */
    mm_cur_id = pick;
    mm_cur = mm_table(pick);
}

kisa kisa_current(void)
{
    pthread_once(&mm_once, mm_init);
    return (kisa)mm_cur_id;
}

int kisa_select(kisa i)
{
    pthread_once(&mm_once, mm_init);
    if (!kisa_supported(i))
        return -1;
    mm_cur_id = i;
    mm_cur = mm_table(i);
    return 0;
}

static const mm_isa *mm_isa_now(void)
{
    pthread_once(&mm_once, mm_init);
    return mm_cur;
}

/* ===== packing ===== */

static bool mm_is_quant(uint32_t type)
{
    return type == KT_Q8_0 || type == KT_Q4_0 || type == KT_Q4_1 || mm_kdesc_of(type);
}

static size_t mm_align(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

static int64_t mm_groups(const kmat *w)
{
    return (w->rows + MM_GROUP - 1) / MM_GROUP;
}

static bool mm_packable(const kmat *w)
{
    const mm_kdesc *k = mm_kdesc_of(w->type);
    if (k)
        return w->cols % (32 * k->kb) == 0;
    return mm_is_quant(w->type) ? w->cols % 32 == 0
                                : w->type == KT_F32 || w->type == KT_F16 || w->type == KT_BF16;
}

/* Bytes of one packed group of w. */
static size_t mm_group_bytes(const kmat *w)
{
    const mm_kdesc *k = mm_kdesc_of(w->type);
    if (k)
        return (size_t)(w->cols / (32 * k->kb)) * mm_ksuper_bytes(k);
    if (mm_is_quant(w->type))
        return (size_t)(w->cols / 32) * mm_group_block_bytes(w->type);
    return (size_t)w->cols * MM_GROUP * mm_float_bytes(w->type);
}

/* Row j of a K-family super-block u into the packed super-block dst (layout: mm_isa.h). */
static void mm_pack_ksuper(const mm_kdesc *k, const ktk_block *u, int j, uint8_t *dst)
{
    uint16_t D = kt_f32_to_f16(u->D), M = kt_f32_to_f16(u->M); /* exact: both came from f16 */
    memcpy(dst + 2 * j, &D, 2);
    memcpy(dst + 32 + 2 * j, &M, 2);
    size_t kbb = mm_kblock_bytes(k);
    for (int kb = 0; kb < k->kb; kb++) {
        uint8_t *p = dst + MM_KHDR + (size_t)kb * kbb;
        const uint8_t *c = u->code + 32 * kb;
        for (int h = 0; h < k->nsc; h++) {
            p[16 * h + j] = (uint8_t)(int8_t)u->sc[2 * kb + h];
            if (k->mins)
                p[16 * (k->nsc + h) + j] = (uint8_t)(int8_t)u->mn[2 * kb + h];
        }
        p += (size_t)k->nsc * 16 * (1 + k->mins);
        uint8_t *qh = p + 256;
        for (int q = 0; q < 4; q++)
            for (int i = 0; i < 4; i++) {
                int e0 = 4 * q + i, e1 = 16 + 4 * q + i;
                /* IQ4_NL keeps the grid index: the code is (grid value + 128) */
                int c0 = c[e0], c1 = c[e1];
                if (k->lut)
                    for (int g = 0; g < 16; g++) {
                        if (KTK_IQ4NL[g] + 128 == c[e0])
                            c0 = g;
                        if (KTK_IQ4NL[g] + 128 == c[e1])
                            c1 = g;
                    }
                p[q * 64 + j * 4 + i] = (uint8_t)((c0 & 15) | (c1 & 15) << 4);
                if (k->hb == 1)
                    qh[j * 4 + i] |= (uint8_t)(((c0 >> 4) & 1) << q | ((c1 >> 4) & 1) << (4 + q));
                if (k->hb == 2) {
                    qh[j * 4 + i] |= (uint8_t)(((c0 >> 4) & 3) << (2 * q));
                    qh[64 + j * 4 + i] |= (uint8_t)(((c1 >> 4) & 3) << (2 * q));
                }
            }
    }
}

/* Pack group g of w (rows 16g .. 16g+15) into dst (mm_group_bytes). */
static void mm_pack_group(const kmat *w, int64_t g, uint8_t *dst)
{
    memset(dst, 0, mm_group_bytes(w));
    const mm_kdesc *k = mm_kdesc_of(w->type);
    if (k) {
        const kt_traits *tr = kt_traits_of(w->type);
        int64_t ns = w->cols / tr->block;
        size_t sb = mm_ksuper_bytes(k);
        ktk_block u;
        for (int j = 0; j < MM_GROUP && g * MM_GROUP + j < w->rows; j++) {
            const uint8_t *row =
                (const uint8_t *)w->data + (size_t)(g * MM_GROUP + j) * w->row_bytes;
            for (int64_t b = 0; b < ns; b++) {
                ktk_unpack(w->type, row + (size_t)b * (size_t)tr->block_bytes, &u);
                mm_pack_ksuper(k, &u, j, dst + (size_t)b * sb);
            }
        }
        return;
    }
    if (!mm_is_quant(w->type)) {
        size_t es = mm_float_bytes(w->type);
        for (int j = 0; j < MM_GROUP && g * MM_GROUP + j < w->rows; j++) {
            const uint8_t *row =
                (const uint8_t *)w->data + (size_t)(g * MM_GROUP + j) * w->row_bytes;
            for (int64_t k = 0; k < w->cols; k++)
                memcpy(dst + ((size_t)k * MM_GROUP + (size_t)j) * es, row + (size_t)k * es, es);
        }
        return;
    }
    int64_t nb = w->cols / 32;
    size_t gb = mm_group_block_bytes(w->type);
    bool q8 = w->type == KT_Q8_0, q41 = w->type == KT_Q4_1;
    size_t src_block = q8 ? 34 : q41 ? 20 : 18;
    for (int j = 0; j < MM_GROUP; j++) {
        int64_t r = g * MM_GROUP + j;
        if (r >= w->rows)
            break;
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *s = row + (size_t)b * src_block;
            uint8_t *d = dst + (size_t)b * gb;
            memcpy(d + 2 * j, s, 2); /* d */
            if (q8) {
                for (int p = 0; p < 16; p++)
                    memcpy(d + 32 + p * 32 + j * 2, s + 2 + 2 * p, 2);
                continue;
            }
            if (q41)
                memcpy(d + 32 + 2 * j, s + 2, 2); /* m */
            const uint8_t *qs = s + (q41 ? 4 : 2);
            uint8_t *dq = d + (q41 ? 64 : 32);
            for (int k = 0; k < 4; k++)
                memcpy(dq + k * 64 + j * 4, qs + 4 * k, 4);
        }
    }
}

typedef struct {
    kmat *w;
    uint8_t *dst;
} mm_pack_job;

static void mm_pack_run(void *argp, int64_t begin, int64_t end, int thread)
{
    const mm_pack_job *j = argp;
    size_t per = mm_group_bytes(j->w);
    for (int64_t g = begin; g < end; g++)
        mm_pack_group(j->w, g, j->dst + (size_t)g * per);
}

size_t kmat_packed_bytes(const kmat *w)
{
    return mm_packable(w) ? (size_t)mm_groups(w) * mm_group_bytes(w) : 0;
}

int kmat_pack(kpool *pool, kmat *w)
{
    size_t bytes = kmat_packed_bytes(w);
    if (!bytes || w->packed)
        return 0;
    void *p = NULL;
    /* large matrices on 2 MiB boundaries and, where the kernel allows, transparent huge pages:
     * a decode step streams every byte once, and 4 KiB pages cost a TLB walk per page */
    size_t align = bytes >= ((size_t)2 << 20) ? ((size_t)2 << 20) : 64;
    if (posix_memalign(&p, align, bytes))
        return -1;
#ifdef MADV_HUGEPAGE
    if (align > 64)
        madvise(p, bytes, MADV_HUGEPAGE);
#endif
    kmat_pack_into(pool, w, p);
    w->packed_borrowed = false; /* this allocation is w's own */
    return 0;
}

void kmat_pack_into(kpool *pool, kmat *w, void *dst)
{
    if (!kmat_packed_bytes(w))
        return;
    mm_pack_job j = {w, dst};
    kpool_run(pool, mm_groups(w), 4, mm_pack_run, &j);
    w->packed = dst;
    w->packed_borrowed = true;
}

void kmat_set_packed(kmat *w, const void *packed)
{
    if (!w->packed_borrowed)
        free(w->packed);
    w->packed = (void *)packed; /* the kernels only read it */
    w->packed_borrowed = true;
}

void kmat_unpack(kmat *w)
{
    if (!w->packed_borrowed)
        free(w->packed);
    w->packed = NULL;
    w->packed_borrowed = false;
}

/* ===== activation quantisation ===== */

/* the activation precision of a quantized matrix: 8 or 16 bits */
static int mm_act_bits(const kmat *w)
{
    return w->act_bits == KMAT_ACT8 ? 8 : 16;
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

static void mm_quantize_x(const float *x, int64_t cols, int n_tok, mm_xq *xq)
{
    int64_t nb = cols / 32;
    for (int t = 0; t < n_tok; t++)
        for (int64_t b = 0; b < nb; b++) {
            const float *v = x + t * cols + b * 32;
            size_t o = mm_xb(xq, t, b) * 32;
            int16_t *q = xq->q + o;
#ifdef MM_AVX2
            __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
            __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
            __m256 sign = _mm256_set1_ps(-0.0f);
            __m256 mx = _mm256_max_ps(
                _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
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
            float qmax = xq->bits == 8 ? (float)MM_QMAX8 : (float)MM_QMAX;
            float d = amax / qmax, id = amax ? qmax / amax : 0.0f;
#ifdef MM_AVX2
            __m256 sc = _mm256_set1_ps(id);
            for (int i = 0; i < 32; i += 16) {
                __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), sc));
                __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8), sc));
                /* packs works per 128-bit lane: restore element order with a 64-bit
                 * permute */
                __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, c), 0xd8);
                _mm256_storeu_si256((__m256i *)(q + i), p);
            }
#else
            for (int i = 0; i < 32; i++)
                q[i] = (int16_t)lrintf(v[i] * id);
#endif
#ifdef MM_AVX2
            /* lo: the low byte sign-extended; hi = (q - lo) / 256, exact as a shift (|hi| < 128,
             * so the saturating pack keeps every value) */
            for (int i = 0; i < 32; i += 16) {
                __m256i qv = _mm256_loadu_si256((const __m256i *)(q + i));
                __m256i lo = _mm256_srai_epi16(_mm256_slli_epi16(qv, 8), 8);
                __m256i hi = _mm256_srai_epi16(_mm256_sub_epi16(qv, lo), 8);
                __m256i pk = _mm256_permute4x64_epi64(_mm256_packs_epi16(lo, hi), 0xd8);
                _mm_storeu_si128((__m128i *)(xq->lo + o + i), _mm256_castsi256_si128(pk));
                _mm_storeu_si128((__m128i *)(xq->hi + o + i), _mm256_extracti128_si256(pk, 1));
            }
#else
            for (int i = 0; i < 32; i++) {
                int8_t lo = (int8_t)(uint8_t)(q[i] & 0xff);
                xq->lo[o + i] = lo;
                xq->hi[o + i] = (int8_t)((q[i] - lo) / 256);
            }
#endif
            xq->s[mm_xb(xq, t, b)] = sum;
            xq->d[mm_xb(xq, t, b)] = d;
            if (xq->bits == 8) {
#ifdef MM_AVX2
                const __m256i one = _mm256_set1_epi16(1);
                __m256i s8 = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)q), one),
                    _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(q + 16)), one));
                __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8),
                                           _mm256_extracti128_si256(s8, 1));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
                s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
                xq->qsum[mm_xb(xq, t, b)] = _mm_cvtsi128_si32(s4);
#else
                int32_t qs = 0;
                for (int i = 0; i < 32; i++)
                    qs += q[i];
                xq->qsum[mm_xb(xq, t, b)] = qs;
#endif
            }
            if (xq->s16) {
                float h0 = 0, h1 = 0;
                for (int i = 0; i < 16; i++) {
                    h0 += v[i];
                    h1 += v[16 + i];
                }
                xq->s16[2 * mm_xb(xq, t, b)] = h0;
                xq->s16[2 * mm_xb(xq, t, b) + 1] = h1;
            }
        }
}

/* ===== the job ===== */

#define MM_MAX_MATS 4 /* matrices sharing one input in one job (q/k/v, gate/up) */

typedef struct {
    int n_mats;
    const kmat *w[MM_MAX_MATS];
    int64_t lo[MM_MAX_MATS], hi[MM_MAX_MATS];
    int64_t start[MM_MAX_MATS + 1]; /* job unit index where each matrix's units begin */
    float *y[MM_MAX_MATS];
    int64_t ldy[MM_MAX_MATS];
    const float *x; /* float activations (float weight types) */
    mm_xq xq;       /* quantized activations (quantized weight types), shared by all
                       matrices */
    int n_tok;
    bool quant;
    const mm_isa *isa;
    uint8_t *scratch; /* per thread: a tile of outputs, and a packed group for
                         unpacked matrices */
    size_t scratch_per_thread;
    /* kmat_mul_cols: w[0] is a view of input columns of a matrix whose packed groups start at
     * slice_packed, gstride bytes apart, the view's columns goff bytes into each */
    const uint8_t *slice_packed;
    size_t gstride, goff;
} mm_job;

static size_t mm_thread_bytes(int64_t cols, int n_tok)
{
    return mm_align((size_t)n_tok * MM_GROUP * 2 * 4) + mm_align((size_t)cols * MM_GROUP * 2 * 4);
}

static size_t mm_xq_bytes(int64_t cols, int n_tok)
{
    size_t nb = (size_t)cols / 32;
    return mm_align((size_t)n_tok * (size_t)cols * 2) + 2 * mm_align((size_t)n_tok * (size_t)cols) +
           5 * mm_align((size_t)n_tok * nb * 4);
}

size_t kmat_scratch_bytes(int64_t cols, int n_tok, int n_threads)
{
    return mm_xq_bytes(cols, n_tok) + (size_t)n_threads * mm_thread_bytes(cols, n_tok) + 64;
}

static int64_t mm_unit_groups(bool quant);

static int64_t mm_units(int64_t lo, int64_t hi, bool quant)
{
    int64_t groups = hi > lo ? (hi - 1) / MM_GROUP - lo / MM_GROUP + 1 : 0,
            per = mm_unit_groups(quant);
    return (groups + per - 1) / per;
}

/* The groups per unit of work: quantized matrices one group, float matrices two (see mm_isa.h). */
static int64_t mm_unit_groups(bool quant)
{
    return quant ? 1 : 2;
}

/* Unit u of the units covering rows [lo, hi) of matrix m: all tokens, rows in range stored. */
static void mm_unit(const mm_job *job, int m, int64_t u, int thread)
{
    const kmat *w = job->w[m];
    uint8_t *ts = job->scratch + (size_t)thread * job->scratch_per_thread;
    float *out = (float *)ts;
    int64_t lo = job->lo[m], hi = job->hi[m], per = mm_unit_groups(job->quant);
    int64_t g = lo / MM_GROUP + u * per, g_end = (hi - 1) / MM_GROUP + 1;
    int ng = (int)(g + per <= g_end ? per : g_end - g);
    int64_t base = g * MM_GROUP;
    size_t gbytes = mm_group_bytes(w);
    const uint8_t *pk;
    if (job->slice_packed) {
        pk = job->slice_packed + (size_t)g * job->gstride + job->goff;
        gbytes = job->gstride; /* the step from one group to the next */
    } else if (w->packed) {
        pk = (const uint8_t *)w->packed + (size_t)g * gbytes;
    } else {
        uint8_t *buf = ts + mm_align((size_t)job->n_tok * MM_GROUP * 2 * 4);
        for (int i = 0; i < ng; i++)
            mm_pack_group(w, g + i, buf + (size_t)i * gbytes);
        pk = buf;
    }
    const mm_kdesc *k = mm_kdesc_of(w->type);
    if (k)
        job->isa->kgroup(k, pk, &job->xq, job->n_tok, out);
    else if (job->quant)
        job->isa->qgroup(w->type, pk, &job->xq, job->n_tok, out);
    else
        job->isa->fgroup(w->type, pk, ng, gbytes, w->cols, job->x, job->n_tok, out);
    int64_t width = (int64_t)ng * MM_GROUP;
    int64_t r0 = base > lo ? base : lo, r1 = base + width < hi ? base + width : hi;
    for (int t = 0; t < job->n_tok; t++)
        memcpy(job->y[m] + t * job->ldy[m] + r0, out + (size_t)t * (size_t)width + (r0 - base),
               (size_t)(r1 - r0) * sizeof(float));
}

static void mm_run(void *argp, int64_t begin, int64_t end, int thread)
{
    const mm_job *job = argp;
    for (int m = 0; m < job->n_mats; m++) {
        int64_t b = begin > job->start[m] ? begin : job->start[m];
        int64_t e = end < job->start[m + 1] ? end : job->start[m + 1];
        for (int64_t u = b; u < e; u++)
            mm_unit(job, m, u - job->start[m], thread);
    }
}

static void mm_mul(kpool *pool, int n, const kmat *const *w, const int64_t *lo,
                   const int64_t *hi, const float *x, int n_tok, float *const *y,
                   const int64_t *ldy, void *scratch, const mm_job *slice);

void kmat_mul_n(kpool *pool, int n, const kmat *const *w, const int64_t *lo, const int64_t *hi,
                const float *x, int n_tok, float *const *y, const int64_t *ldy, void *scratch)
{
    mm_mul(pool, n, w, lo, hi, x, n_tok, y, ldy, scratch, NULL);
}

int kmat_mul_cols(kpool *pool, const kmat *w, int64_t lo, int64_t hi, int64_t c0, int64_t c1,
                  const float *x, int n_tok, float *y, int64_t ldy, void *scratch)
{
    const mm_kdesc *k = mm_kdesc_of(w->type);
    int64_t align = k ? 32 * k->kb : mm_is_quant(w->type) ? 32 : 1;
    if (c0 < 0 || c1 > w->cols || c1 <= c0 || c0 % align || c1 % align)
        return -1;
    if (hi <= lo || n_tok <= 0)
        return 0;
    const kt_traits *tr = kt_traits_of(w->type);
    kmat v = *w;
    v.cols = c1 - c0;
    v.data = (const uint8_t *)w->data + (size_t)(c0 / tr->block) * (size_t)tr->block_bytes;
    v.packed = NULL;
    v.packed_borrowed = false;
    mm_job slice = {0};
    if (w->packed) {
        slice.slice_packed = w->packed;
        slice.gstride = mm_group_bytes(w);
        kmat head = *w;
        head.cols = c0; /* the packed bytes of the columns before the view, within a group */
        slice.goff = c0 ? mm_group_bytes(&head) : 0;
    }
    const kmat *vp = &v;
    mm_mul(pool, 1, &vp, &lo, &hi, x, n_tok, &y, &ldy, scratch, &slice);
    return 0;
}

static void mm_mul(kpool *pool, int n, const kmat *const *w, const int64_t *lo,
                   const int64_t *hi, const float *x, int n_tok, float *const *y,
                   const int64_t *ldy, void *scratch, const mm_job *slice)
{
    if (n <= 0 || n_tok <= 0)
        return;
    /* one job needs one input format: the same row length and all quantized or
     * all float */
    bool same = n <= MM_MAX_MATS;
    for (int m = 1; m < n && same; m++)
        same = w[m]->cols == w[0]->cols && mm_is_quant(w[m]->type) == mm_is_quant(w[0]->type) &&
               mm_act_bits(w[m]) == mm_act_bits(w[0]);
    if (!same) {
        for (int m = 0; m < n; m++)
            mm_mul(pool, 1, &w[m], &lo[m], &hi[m], x, n_tok, &y[m], &ldy[m], scratch, slice);
        return;
    }
    int threads = kpool_threads(pool);
    int64_t cols = w[0]->cols;
    void *owned = NULL;
    if (!scratch) {
        owned = malloc(kmat_scratch_bytes(cols, n_tok, threads));
        if (!owned)
            abort(); /* a few KiB per call; callers on the hot path pass their own
                        scratch */
        scratch = owned;
    }
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    mm_job job = {.n_mats = n,
                  .x = x,
                  .n_tok = n_tok,
                  .quant = mm_is_quant(w[0]->type),
                  .isa = mm_isa_now(),
                  .scratch_per_thread = mm_thread_bytes(cols, n_tok)};
    if (slice) {
        job.slice_packed = slice->slice_packed;
        job.gstride = slice->gstride;
        job.goff = slice->goff;
    }
    for (int m = 0; m < n; m++) {
        job.w[m] = w[m];
        job.lo[m] = lo[m];
        job.hi[m] = hi[m];
        job.y[m] = y[m];
        job.ldy[m] = ldy[m];
        job.start[m + 1] = job.start[m] + mm_units(lo[m], hi[m], job.quant);
    }
    if (job.quant) {
        size_t nb = (size_t)cols / 32;
        job.xq.nb = (int64_t)nb;
        job.xq.bits = mm_act_bits(w[0]);
        job.xq.nt = n_tok;
        job.xq.q = (int16_t *)base;
        base += mm_align((size_t)n_tok * (size_t)cols * 2);
        job.xq.lo = (int8_t *)base;
        base += mm_align((size_t)n_tok * (size_t)cols);
        job.xq.hi = (int8_t *)base;
        base += mm_align((size_t)n_tok * (size_t)cols);
        job.xq.d = (float *)base;
        base += mm_align((size_t)n_tok * nb * 4);
        job.xq.s = (float *)base;
        base += mm_align((size_t)n_tok * nb * 4);
        job.xq.s16 = NULL;
        for (int m = 0; m < n; m++)
            if (mm_kdesc_of(w[m]->type))
                job.xq.s16 = (float *)base;
        base += 2 * mm_align((size_t)n_tok * nb * 4);
        job.xq.qsum = (int32_t *)base;
        base += mm_align((size_t)n_tok * nb * 4);
        mm_quantize_x(x, cols, n_tok, &job.xq);
    } else {
        base += mm_xq_bytes(cols, n_tok);
    }
    job.scratch = base;
    if (job.start[n] > 0)
        kpool_run(pool, job.start[n], 1, mm_run, &job);
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
