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
 * arithmetic. That chunk loop is kernels/cpu/att_chunk.h, included here with this build's flags
 * (AVX2, or NEON on 64-bit Arm) and compiled again with AVX-512 in att_avx512.c — the same bits
 * from all three (unit_kernels, cross_neon_attention); the AVX-512 one is chosen per call below.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/kernels.h"

#define ATT_CHUNKS att_chunks /* this build's chunk loop (att_chunk.h) */
#define ATT_CHUNKS_SCOPE static
#include "kernels/cpu/att_chunk.h"

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
    /* the AVX-512 build of the same loop where the matmuls run on AVX-512: the same bits */
    void (*chunks)(int, const float *const *, int64_t, int, const katt_keys *, int, int, int, float,
                   katt_stat *, float *const *, int64_t) = att_chunks;
#if defined(__x86_64__) || defined(_M_X64)
    if (head_dim == 64 && kisa_current() == KISA_AVX512)
        chunks = katt_chunks_avx512;
#endif
    int shared = s[0].n_prefix;
    for (int t = 0; t < n_tok; t++)
        shared = n[t] < shared ? n[t] : shared;
    shared -= shared % ATT_CHUNK;
    chunks(n_tok, q, q_stride, nq, &s[0], 0, shared, head_dim, scale, st, out, out_stride);
    for (int t = 0; t < n_tok; t++)
        chunks(1, &q[t], q_stride, nq, &s[t], shared, n[t], head_dim, scale, st + t * nq,
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
