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
 * katt_extend folds further keys into an existing partial instead of merging two partials. The
 * single-device forward uses it (dense prefix, then the tree keys in position order): then a token
 * sees exactly the same sequence of operations whether an earlier key sits in the prefix or in the
 * tree, so tree verification is bit-identical to sequential decoding — the property that keeps
 * greedy speculative output equal to greedy sequential output even at near-ties.
 */
#include <math.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "kernels/cpu/kernels.h"

#define ATT_MAX_HEAD_DIM 512

/* Load row p of a KV tensor as floats into buf; returns a pointer to the floats. */
static const float *att_row(const void *base, kv_type type, int64_t stride, int64_t p,
                            int head_dim, float *buf)
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
