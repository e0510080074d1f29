/*
 * model/sampler.c — choosing the next token from logits: greedy (argmax, lowest index on ties),
 * or temperature + top-k + top-p sampling from a seeded xorshift generator, so a run is
 * reproducible from its seed.
 *
 * The distribution. Candidates are ranked by logit, descending, ties by lower id (a total order).
 * The support is the first top_k of that ranking (all when top_k is 0), cut to the shortest prefix
 * whose probability reaches top_p; weights are exp((l - max) / temp). sampler_sample draws from it
 * by inverse CDF walked in rank order; sampler_probs returns the same distribution as a dense vector,
 * which is what speculative verification needs (p(x) for any drafted x, and residuals of it).
 *
 * Ranking without sorting the vocabulary. A rank order is only needed for the first k candidates
 * (top-k), for as far as the nucleus cut reaches (top-p), or for as far as a draw walks (no
 * truncation). The order is therefore built lazily: the next m candidates are selected from the
 * unranked rest with a bounded min-heap (O(n log m)) and heap-sorted, and m grows geometrically
 * when more are needed. Ties are broken by a 64-bit key (orderable float bits, then the inverted
 * id) so selection and sorting agree exactly with a full sort by (logit desc, id asc): with top_k
 * > 0 the draws are identical to a full sort's; without top_k the only difference is the order in
 * which the normaliser is summed (in double), which moves a draw only when it lands within ~1e-12
 * of a boundary.
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "model/llama.h"

void sampler_init(sampler *s, float temp, int top_k, float top_p, uint64_t seed)
{
    s->temp = temp;
    s->top_k = top_k;
    s->top_p = top_p;
    s->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
}

static uint64_t sampler_next(sampler *s)
{
    /* xorshift64* */
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return s->rng * 0x2545f4914f6cdd1dull;
}

double sampler_uniform(sampler *s)
{
    return (double)(sampler_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

int32_t sampler_argmax(const float *logits, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

/* ===== the rank order ===== */

/* Larger key = earlier rank: logit descending, then id ascending. -0 ranks as +0 (they compare
 * equal as floats); the float bits are mapped so that unsigned order is numeric order. */
static inline uint64_t sampler_key(const float *lg, int32_t id)
{
    float v = lg[id];
    if (v == 0)
        v = 0;
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b = (b & 0x80000000u) ? ~b : b | 0x80000000u;
    return (uint64_t)b << 32 | (uint32_t)~(uint32_t)id;
}

/* Restore the min-heap property of h[0..m) below slot i. */
static void sampler_sift(const float *lg, int32_t *h, int m, int i)
{
    int32_t x = h[i];
    uint64_t kx = sampler_key(lg, x);
    for (;;) {
        int c = 2 * i + 1;
        if (c >= m)
            break;
        uint64_t kc = sampler_key(lg, h[c]);
        if (c + 1 < m) {
            uint64_t k2 = sampler_key(lg, h[c + 1]);
            if (k2 < kc) {
                c++;
                kc = k2;
            }
        }
        if (kc >= kx)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

/* A permutation idx[0..n) whose first `ranked` entries are the best candidates in rank order (the
 * rest, in any order, all rank after them); p[r] = the weight of rank r for r < ranked. */
typedef struct {
    const float *lg;
    int32_t *idx;
    float *p;
    int n, ranked;
    float mx, temp;
} sampler_order;

/* Rank the next m candidates: select them from the unranked rest with a min-heap of size m, then
 * heap-sort them (popping minima to the end leaves them in descending order). */
static void sampler_rank_more(sampler_order *o, int m)
{
    int32_t *h = o->idx + o->ranked;
    int rest = o->n - o->ranked;
    if (m > rest || 2 * m > rest)
        m = rest; /* selection would not save much: rank everything left */
    if (m <= 0)
        return;
    for (int i = m / 2 - 1; i >= 0; i--)
        sampler_sift(o->lg, h, m, i);
    uint64_t kmin = sampler_key(o->lg, h[0]);
    for (int j = m; j < rest; j++) {
        if (sampler_key(o->lg, h[j]) > kmin) {
            int32_t t = h[j];
            h[j] = h[0];
            h[0] = t;
            sampler_sift(o->lg, h, m, 0);
            kmin = sampler_key(o->lg, h[0]);
        }
    }
    for (int e = m - 1; e > 0; e--) {
        int32_t t = h[0];
        h[0] = h[e];
        h[e] = t;
        sampler_sift(o->lg, h, e, 0);
    }
    for (int r = o->ranked; r < o->ranked + m; r++)
        o->p[r] = expf((o->lg[o->idx[r]] - o->mx) / o->temp);
    o->ranked += m;
}

/* Make rank r available (r < n). */
static inline void sampler_need(sampler_order *o, int r)
{
    while (r >= o->ranked)
        sampler_rank_more(o, o->ranked < 64 ? 64 : o->ranked);
}

/* The support: returns k, its size, with *sum the total weight of ranks [0, k). *ranked_all is true
 * when ranks [0, k) are in o (truncation happened); false means no truncation at all (k = n) and the
 * order has been built only as far as the caller will ask for it. Requires temp > 0. */
static int sampler_support(const sampler *s, sampler_order *o, double *sum, bool *ranked_all)
{
    int n = o->n;
    o->mx = o->lg[sampler_argmax(o->lg, n)];
    o->temp = s->temp;
    o->ranked = 0;
    for (int i = 0; i < n; i++)
        o->idx[i] = i;
    int k = n;
    double total = 0;
    bool truncated = false;
    if (s->top_k > 0 && s->top_k < n) {
        k = s->top_k;
        sampler_rank_more(o, k);
        for (int r = 0; r < k; r++)
            total += o->p[r];
        truncated = true;
    } else {
        for (int i = 0; i < n; i++)
            total += expf((o->lg[i] - o->mx) / o->temp);
    }
    if (s->top_p > 0 && s->top_p < 1) {
        double cum = 0;
        for (int r = 0; r < k; r++) {
            sampler_need(o, r);
            cum += o->p[r] / total;
            if (cum >= s->top_p) {
                k = r + 1;
                break;
            }
        }
        sampler_need(o, k - 1);
        total = 0;
        for (int r = 0; r < k; r++)
            total += o->p[r];
        truncated = true;
    }
    *sum = total;
    *ranked_all = truncated;
    return k;
}

int32_t sampler_sample(sampler *s, const float *logits, int n, void *work)
{
    if (s->temp <= 0)
        return sampler_argmax(logits, n);
    int32_t *idx = work;
    sampler_order o = {.lg = logits, .idx = idx, .p = (float *)(idx + n), .n = n};
    double sum;
    bool ranked_all;
    int k = sampler_support(s, &o, &sum, &ranked_all);
    double r = sampler_uniform(s) * sum;
    for (int i = 0; i < k; i++) {
        sampler_need(&o, i);
        r -= o.p[i];
        if (r < 0)
            return o.idx[i];
    }
    sampler_need(&o, k - 1);
    return o.idx[k - 1];
}

int sampler_probs(const sampler *s, const float *logits, int n, float *probs, void *work)
{
    if (s->temp <= 0) {
        memset(probs, 0, (size_t)n * sizeof *probs);
        probs[sampler_argmax(logits, n)] = 1;
        return 1;
    }
    int32_t *idx = work;
    sampler_order o = {.lg = logits, .idx = idx, .p = (float *)(idx + n), .n = n};
    double sum;
    bool ranked_all;
    int k = sampler_support(s, &o, &sum, &ranked_all);
    if (!ranked_all) {
        for (int i = 0; i < n; i++)
            probs[i] = (float)(expf((logits[i] - o.mx) / o.temp) / sum);
        return n;
    }
    memset(probs, 0, (size_t)n * sizeof *probs);
    for (int r = 0; r < k; r++)
        probs[idx[r]] = (float)(o.p[r] / sum);
    return k;
}

int32_t sampler_draw(sampler *s, const float *probs, int n)
{
    double total = 0;
    int32_t last = -1;
    for (int i = 0; i < n; i++)
        if (probs[i] > 0) {
            total += probs[i];
            last = i;
        }
    if (last < 0)
        return -1;
    double r = sampler_uniform(s) * total;
    for (int i = 0; i < last; i++) {
        if (probs[i] > 0) {
            r -= probs[i];
            if (r < 0)
                return i;
        }
    }
    return last;
}
