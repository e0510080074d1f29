/*
 * kernels/cpu/attention.c — attention as mergeable partials.
 *
 * A tree-verification step attends every query to two key sets: the committed prefix (dense: all
 * queries see all of it) and the token tree (sparse: each query sees only its ancestors, a COO
 * list of positions). Each part returns a partial (max m, sum s, unnormalised output o) and two
 * partials merge exactly, in any order, by online softmax:
 *   m = max(m_a, m_b), s = s_a e^(m_a-m) + s_b e^(m_b-m), o = o_a e^(m_a-m) + o_b e^(m_b-m).
 * That is what lets the dense part run on one device and the sparse part on another.
 * Keys within a part are processed in one pass with the same online rule.
 *
 * katt_extend folds further keys into an existing partial instead of merging two partials.
 *
 * katt_causal is what the single-device forward runs: it walks the query's whole key stream —
 * prefix positions then its tree ancestors, which continue the positions — in chunks aligned to
 * absolute positions (scores, one max, vector exp, weighted V sum per chunk). A token then sees
 * exactly the same operations whether an earlier key sits in the prefix or in the tree, so tree
 * verification is bit-identical to sequential decoding: the property that keeps greedy
 * speculative output equal to greedy sequential output even at near-ties. katt_causal_tokens
 * walks the whole prefix chunks that several tokens of one sequence share once for all of them
 * (each row loaded once for every query), the rest token by token, with the same per-chunk
 * arithmetic.
 */
#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vexp.h"

#define ATT_MAX_HEAD_DIM 512

/* Load row p of a KV tensor as floats into buf; returns a pointer to the floats. */
static const float *att_row(const void *base, kv_type type, int64_t stride, int64_t p, int head_dim,
                            float *buf)
{
    if (type == KV_F32)
        return (const float *)base + p * stride;
    const uint16_t *h = (const uint16_t *)base + p * stride;
    int i = 0;
#if defined(__AVX2__) && defined(__F16C__)
    for (; i + 8 <= head_dim; i += 8)
        _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < head_dim; i++)
        buf[i] = kt_f16_to_f32(h[i]);
    return buf;
}

/* Fold key position p into the running partial. */
static void att_accumulate(const float *q, const katt_kv *kv, int64_t p, int head_dim, float scale,
                           katt_stat *st, float *out, float *buf)
{
    const float *k = att_row(kv->k, kv->type, kv->stride, p, head_dim, buf);
    float score = k_dot(q, k, head_dim) * scale;
    const float *v = att_row(kv->v, kv->type, kv->stride, p, head_dim, buf);
    if (score > st->max) {
        float c = expf(st->max - score); /* 0 when max was -inf */
        for (int i = 0; i < head_dim; i++)
            out[i] = out[i] * c + v[i];
        st->sum = st->sum * c + 1.0f;
        st->max = score;
    } else {
        float e = expf(score - st->max);
        for (int i = 0; i < head_dim; i++)
            out[i] += e * v[i];
        st->sum += e;
    }
}

static void att_init(katt_stat *st, float *out, int head_dim)
{
    st->max = -INFINITY;
    st->sum = 0;
    memset(out, 0, (size_t)head_dim * sizeof *out);
}

void katt_dense(const float *q, const katt_kv *kv, int n, int head_dim, float scale,
                katt_stat *stat, float *out)
{
    float buf[ATT_MAX_HEAD_DIM];
    att_init(stat, out, head_dim);
    for (int p = 0; p < n; p++)
        att_accumulate(q, kv, p, head_dim, scale, stat, out, buf);
}

void katt_sparse(const float *q, const katt_kv *kv, const int32_t *idx, int n, int head_dim,
                 float scale, katt_stat *stat, float *out)
{
    att_init(stat, out, head_dim);
    katt_extend(q, kv, idx, n, head_dim, scale, stat, out);
}

void katt_extend(const float *q, const katt_kv *kv, const int32_t *idx, int n, int head_dim,
                 float scale, katt_stat *stat, float *out)
{
    float buf[ATT_MAX_HEAD_DIM];
    for (int i = 0; i < n; i++)
        att_accumulate(q, kv, idx[i], head_dim, scale, stat, out, buf);
}

void katt_merge(katt_stat *a, float *out_a, const katt_stat *b, const float *out_b, int head_dim)
{
    if (b->sum == 0)
        return;
    if (a->sum == 0) {
        *a = *b;
        memcpy(out_a, out_b, (size_t)head_dim * sizeof *out_a);
        return;
    }
    float m = fmaxf(a->max, b->max);
    float ca = expf(a->max - m), cb = expf(b->max - m);
    for (int i = 0; i < head_dim; i++)
        out_a[i] = out_a[i] * ca + out_b[i] * cb;
    a->sum = a->sum * ca + b->sum * cb;
    a->max = m;
}

void katt_finish(const katt_stat *s, float *out, int head_dim)
{
    float inv = s->sum > 0 ? 1.0f / s->sum : 0.0f;
    for (int i = 0; i < head_dim; i++)
        out[i] *= inv;
}

/* ===== causal attention over a position-mapped key stream ===== */

#define ATT_CHUNK 16

/* Position j's row (key or value) in the stream. */
static const void *att_stream_row(const katt_keys *s, const void *prefix, const void *tree, int j)
{
    size_t esz = s->type == KV_F16 ? 2 : 4;
    if (j < s->n_prefix)
        return (const uint8_t *)prefix + (size_t)j * (size_t)s->stride * esz;
    return (const uint8_t *)tree + (size_t)s->tree_slot[j - s->n_prefix] * (size_t)s->stride * esz;
}

#if defined(__AVX2__) && defined(__FMA__)
/* k_dot(q, k) for eight keys at once, the same roundings as k_dot (two 8-lane accumulators over
 * 16-element steps, then lo + hi, then the pairwise sums): each key's partial vector is formed
 * alone and the eight horizontal sums run transposed, three adds for all eight instead of
 * three per key. head_dim % 16 == 0. */
static inline __attribute__((always_inline)) __m256 att_dot8(const float *q, const float *const *k,
                                                              int head_dim)
{
    __m256 v[8];
    for (int j = 0; j < 8; j++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (int i = 0; i < head_dim; i += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k[j] + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(k[j] + i + 8), a1);
        }
        v[j] = _mm256_add_ps(a0, a1);
    }
    __m256 a[4];
    for (int p = 0; p < 4; p++) /* [lo_j + hi_j | lo_j+1 + hi_j+1] */
        a[p] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x31));
    __m256 b0 =
        _mm256_add_ps(_mm256_shuffle_ps(a[0], a[1], 0x44), _mm256_shuffle_ps(a[0], a[1], 0xee));
    __m256 b1 =
        _mm256_add_ps(_mm256_shuffle_ps(a[2], a[3], 0x44), _mm256_shuffle_ps(a[2], a[3], 0xee));
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(b0, b1, 0x88), _mm256_shuffle_ps(b0, b1, 0xdd));
    /* r holds keys 0 2 4 6 | 1 3 5 7 */
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

/* Row pointers (as floats) of positions [c0, c1) for keys or values; f16 rows are converted into
 * buf (ATT_CHUNK rows). Positions past c1 up to the chunk end point at a zero row. */
static void att_chunk_rows(const katt_keys *s, const void *prefix, const void *tree, int c0, int c1,
                           int head_dim, float *buf, const float *zero, const float **rows)
{
    if (s->type == KV_F32 && c1 - c0 == ATT_CHUNK && c1 <= s->n_prefix) { /* the common case */
        for (int j = 0; j < ATT_CHUNK; j++)
            rows[j] = (const float *)prefix + (size_t)(c0 + j) * (size_t)s->stride;
        return;
    }
    for (int j = c0; j < c0 + ATT_CHUNK; j++) {
        if (j >= c1) {
            rows[j - c0] = zero;
            continue;
        }
        rows[j - c0] = att_row(att_stream_row(s, prefix, tree, j), s->type, 0, 0, head_dim,
                               buf + (size_t)(j - c0) * (size_t)head_dim);
    }
}

/* Scores of positions [c0, c1) into sc, scaled. */
static void att_scores(const float *q, const float *const *krows, int len, int head_dim,
                       float scale, float *sc)
{
    int j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    /* the common head sizes with the size a constant (straight-line code, no loop per key) */
#define ATT_SCORES_HD(HD)                                                                          \
    for (; j < len; j += 8)                                                                        \
        _mm256_storeu_ps(sc + j, _mm256_mul_ps(att_dot8(q, krows + j, HD), _mm256_set1_ps(scale)));
    if (head_dim == 64) {
        ATT_SCORES_HD(64)
    } else if (head_dim == 128) {
        ATT_SCORES_HD(128)
    } else if (head_dim % 16 == 0) {
        ATT_SCORES_HD(head_dim)
    }
#undef ATT_SCORES_HD
#endif
    for (; j < len; j++)
        sc[j] = k_dot(q, krows[j], head_dim) * scale;
}

#define ATT_MAX_GROUP 16 /* query heads per KV head one call takes at once */
#define ATT_MAX_Q 64     /* queries (tokens x heads) one call takes at once */

/* One chunk of keys (rows, len of them) for one query: scores, the running max (and the rescale
 * of the partial when it grows), the weights e = exp(score - max) and their sum. */
static inline void att_chunk_softmax(const float *q, const float *const *rows, int len, int head_dim,
                                     float scale, katt_stat *t, float *o, float *e)
{
    att_scores(q, rows, len, head_dim, scale, e);
    float mx = t->max;
    int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (len == ATT_CHUNK) { /* a max is exact in any order */
        __m256 m8 = _mm256_max_ps(_mm256_loadu_ps(e), _mm256_loadu_ps(e + 8));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float cm = _mm_cvtss_f32(m4);
        mx = cm > mx ? cm : mx;
        i = len;
    }
#endif
    for (; i < len; i++)
        mx = e[i] > mx ? e[i] : mx; /* scores are never NaN: a compare, not a libm call */
    if (mx > t->max) {
        float c = expf(t->max - mx); /* 0 on the first chunk (max was -inf) */
        t->sum *= c;
        for (int i = 0; i < head_dim; i++)
            o[i] *= c;
        t->max = mx;
    }
    i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= len; i += 8)
        _mm256_storeu_ps(e + i, k_exp8(_mm256_sub_ps(_mm256_loadu_ps(e + i), _mm256_set1_ps(mx))));
#endif
    for (; i < len; i++)
        e[i] = expf(e[i] - mx);
    for (int j = 0; j < len; j++)
        t->sum += e[j];
}

/* out[d] += e_j v_j[d] over the chunk's value rows, keys in order; the d-blocks outside so out
 * stays in registers */
static inline void att_chunk_values(const float *const *rows, int len, int head_dim, const float *e,
                                    float *o)
{
    int d = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (head_dim == 64) { /* the whole output in eight registers, one broadcast per key */
        __m256 acc[8];
        for (int b = 0; b < 8; b++)
            acc[b] = _mm256_loadu_ps(o + 8 * b);
        for (int j = 0; j < len; j++) {
            __m256 ev = _mm256_set1_ps(e[j]);
            for (int b = 0; b < 8; b++)
                acc[b] = _mm256_fmadd_ps(ev, _mm256_loadu_ps(rows[j] + 8 * b), acc[b]);
        }
        for (int b = 0; b < 8; b++)
            _mm256_storeu_ps(o + 8 * b, acc[b]);
        d = 64;
    }
    for (; d + 8 <= head_dim; d += 8) {
        __m256 acc = _mm256_loadu_ps(o + d);
        for (int j = 0; j < len; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(e[j]), _mm256_loadu_ps(rows[j] + d), acc);
        _mm256_storeu_ps(o + d, acc);
    }
#endif
    for (; d < head_dim; d++)
        for (int j = 0; j < len; j++)
            o[d] += e[j] * rows[j][d];
}

/* Ask for the key and value rows of the prefix chunk at position a (the part of it below c1 and
 * in the prefix) ahead of their use. The rows of one KV head lie consecutively, but a chunk of
 * them (4 KiB for 16 f32 rows of 64) is a page, where the hardware's stream prefetchers start
 * over: asked for a chunk ahead, and for a run's first chunk all at once, the loads of a batch
 * step's attention (each sequence its own prefix, fetched from memory) overlap the arithmetic.
 * Measured on a batch of 8 sequences at context 120: 25% less time, 20% when the rows are in
 * the last-level cache. */
static inline void att_prefetch(const katt_keys *s, const void *base, int a, int c1, int head_dim)
{
    int b = a + ATT_CHUNK < c1 ? a + ATT_CHUNK : c1;
    if (b > s->n_prefix)
        b = s->n_prefix;
    if (a >= b)
        return;
    size_t esz = s->type == KV_F16 ? 2 : 4, row = (size_t)s->stride * esz;
    size_t end = (size_t)(b - 1) * row + (size_t)head_dim * esz;
    for (size_t o = (size_t)a * row; o < end; o += 64) {
        __builtin_prefetch((const uint8_t *)base + o);
    }
}

/* Chunks [c0, c1) (c1 - c0 a multiple of ATT_CHUNK, or the stream's last, shorter one at the
 * end) of n_tok tokens whose chunks there are the same rows (s[0]'s), nq heads each. */
static void att_chunks(int n_tok, const float *const *q, int64_t q_stride, int nq,
                       const katt_keys *s, int c0, int c1, int head_dim, float scale, katt_stat *st,
                       float *const *out, int64_t out_stride)
{
    float buf[ATT_CHUNK * ATT_MAX_HEAD_DIM], sc[ATT_MAX_Q][ATT_CHUNK];
    static const float zero[ATT_MAX_HEAD_DIM];
    const float *rows[ATT_CHUNK];
    att_prefetch(s, s->k, c0, c1, head_dim);
    att_prefetch(s, s->v, c0, c1, head_dim);
    for (int a = c0; a < c1; a += ATT_CHUNK) {
        int b = a + ATT_CHUNK < c1 ? a + ATT_CHUNK : c1, len = b - a;
        att_prefetch(s, s->k, a + ATT_CHUNK, c1, head_dim);
        att_chunk_rows(s, s->k, s->tree_k, a, b, head_dim, buf, zero, rows);
        for (int t = 0; t < n_tok; t++)
            for (int h = 0; h < nq; h++)
                att_chunk_softmax(q[t] + h * q_stride, rows, len, head_dim, scale, &st[t * nq + h],
                                  out[t] + h * out_stride, sc[t * nq + h]);
        att_prefetch(s, s->v, a + ATT_CHUNK, c1, head_dim);
        att_chunk_rows(s, s->v, s->tree_v, a, b, head_dim, buf, zero, rows);
        for (int t = 0; t < n_tok; t++)
            for (int h = 0; h < nq; h++)
                att_chunk_values(rows, len, head_dim, sc[t * nq + h], out[t] + h * out_stride);
    }
}

void katt_causal_tokens(int n_tok, const float *const *q, int64_t q_stride, int nq,
                        const katt_keys *s, const int *n, int head_dim, float scale, katt_stat *st,
                        float *const *out, int64_t out_stride)
{
    if (nq > ATT_MAX_GROUP) { /* more heads than the stack arrays: a head range at a time */
        for (int h = 0; h < nq; h += ATT_MAX_GROUP) {
            int nh = nq - h < ATT_MAX_GROUP ? nq - h : ATT_MAX_GROUP;
            for (int t = 0; t < n_tok; t++) {
                const float *qt = q[t] + h * q_stride;
                float *ot = out[t] + h * out_stride;
                katt_causal_tokens(1, &qt, q_stride, nh, &s[t], &n[t], head_dim, scale,
                                   st + t * nq + h, &ot, out_stride);
            }
        }
        return;
    }
    if (n_tok * nq > ATT_MAX_Q) {
        /* fewer tokens at a time; st is laid out per token, nq each */
        int per = ATT_MAX_Q / nq;
        for (int t = 0; t < n_tok; t += per)
            katt_causal_tokens(n_tok - t < per ? n_tok - t : per, q + t, q_stride, nq, s + t, n + t,
                               head_dim, scale, st + t * nq, out + t, out_stride);
        return;
    }
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < nq; h++)
            att_init(&st[t * nq + h], out[t] + h * out_stride, head_dim);
    /* chunks are aligned to absolute positions, so the arithmetic for position j never depends
     * on where the prefix ends or on which other tokens share the call: the whole chunks of the
     * prefix every token sees are walked once for all of them (one load of each row), the rest
     * token by token */
    int shared = s[0].n_prefix;
    for (int t = 0; t < n_tok; t++)
        shared = n[t] < shared ? n[t] : shared;
    shared -= shared % ATT_CHUNK;
    att_chunks(n_tok, q, q_stride, nq, &s[0], 0, shared, head_dim, scale, st, out, out_stride);
    for (int t = 0; t < n_tok; t++)
        att_chunks(1, &q[t], q_stride, nq, &s[t], shared, n[t], head_dim, scale, st + t * nq,
                   &out[t], out_stride);
}

void katt_causal_group(const float *q, int64_t q_stride, int nq, const katt_keys *s, int n,
                       int head_dim, float scale, katt_stat *st, float *out, int64_t out_stride)
{
    katt_causal_tokens(1, &q, q_stride, nq, s, &n, head_dim, scale, st, &out, out_stride);
}

void katt_causal(const float *q, const katt_keys *s, int n, int head_dim, float scale,
                 katt_stat *st, float *out)
{
    katt_causal_group(q, 0, 1, s, n, head_dim, scale, st, out, 0);
}
