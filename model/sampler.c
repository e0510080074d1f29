/*
 * model/sampler.c — choosing the next token from logits: greedy (argmax, lowest index on ties),
 * or temperature + top-k + top-p sampling from a seeded xorshift generator, so a run is
 * reproducible from its seed.
 *
 * The distribution. Candidates are ranked by logit, descending, ties by lower id (a total order).
 * The support is the first top_k of that ranking (all when top_k is 0), cut to the shortest prefix
 * whose probability reaches top_p; weights are exp((l - max) / temp). sampler_sample draws by
 * inverse CDF walked in rank order; sampler_probs returns the same distribution as a dense vector,
 * which is what speculative verification needs (p(x) for any drafted x, and residuals of it).
 *
 * Ranking without sorting the vocabulary (49152 entries for the default model; a full sort costs
 * milliseconds per token). Comparisons use a 64-bit key (orderable float bits, then the inverted
 * id), so every ordering below agrees exactly with a full sort by (logit desc, id asc).
 * - top_k > 0: the k best are selected with a bounded min-heap (O(n log k)) and heap-sorted;
 *   draws are identical to a full sort's.
 * - no top_k: both the nucleus cut and the draw ask "at which rank does the cumulative mass reach
 *   t?". That is answered by a weighted quickselect: partition around a pivot, sum the mass above
 *   it, keep the side where t is reached (expected O(n)). The answer is the same rank a walk over
 *   the fully sorted order finds; only the order of the floating-point additions differs, which
 *   can move a draw only when it lands within ~1e-12 of a boundary.
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/kernels.h"
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
    return k_argmax(logits, n);
}

/* ===== rank order ===== */

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

static inline void sampler_swap(int32_t *a, int32_t *b)
{
    int32_t t = *a;
    *a = *b;
    *b = t;
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

/* Move the m best of h[0..n) to h[0..m), in rank order: a min-heap of the m best so far absorbs
 * the rest, then popping minima to the end leaves the heap sorted descending. */
static void sampler_top(const float *lg, int32_t *h, int n, int m)
{
    if (m > n)
        m = n;
    if (m <= 0)
        return;
    for (int i = m / 2 - 1; i >= 0; i--)
        sampler_sift(lg, h, m, i);
    uint64_t kmin = sampler_key(lg, h[0]);
    for (int j = m; j < n; j++) {
        if (sampler_key(lg, h[j]) > kmin) {
            sampler_swap(&h[j], &h[0]);
            sampler_sift(lg, h, m, 0);
            kmin = sampler_key(lg, h[0]);
        }
    }
    for (int e = m - 1; e > 0; e--) {
        sampler_swap(&h[0], &h[e]);
        sampler_sift(lg, h, e, 0);
    }
}

/* Weighted selection. idx[0..n) holds candidates in any order, w[id] their weights. Finds the
 * first rank r at which the mass of ranks [0, r] reaches t (> t when strict, >= t otherwise),
 * leaves the candidates of ranks [0, r] in idx[0..r] with idx[r] the one of rank r, and returns r;
 * -1 when the total never reaches t. */
static int sampler_wselect(const float *lg, const float *w, int32_t *idx, int n, double t, bool strict)
{
    int lo = 0, hi = n; /* idx[lo..hi) holds exactly ranks lo..hi-1; acc = mass of ranks [0, lo) */
    double acc = 0;
    bool shrunk = false;
    uint64_t rs = 0x853c49e6748fea9bull; /* pivot choice only: any sequence gives the same rank */
    for (int round = 0; hi - lo > 16 && round < 256; round++) {
        rs = rs * 6364136223846793005ull + 1442695040888963407ull;
        sampler_swap(&idx[lo + (int)((rs >> 33) % (uint64_t)(hi - lo))], &idx[hi - 1]);
        uint64_t kp = sampler_key(lg, idx[hi - 1]);
        int mid = lo;
        double above = 0;
        for (int j = lo; j < hi - 1; j++)
            if (sampler_key(lg, idx[j]) > kp) {
                above += w[idx[j]];
                sampler_swap(&idx[j], &idx[mid++]);
            }
        sampler_swap(&idx[mid], &idx[hi - 1]); /* the pivot, at its rank */
        double m = acc + above;
        if (strict ? m > t : m >= t) {
            hi = mid;
            shrunk = true;
            continue;
        }
        m += w[idx[mid]];
        if (strict ? m > t : m >= t)
            return mid;
        acc = m;
        lo = mid + 1;
    }
    sampler_top(lg, idx + lo, hi - lo, hi - lo);
    for (int r = lo; r < hi; r++) {
        acc += w[idx[r]];
        if (strict ? acc > t : acc >= t)
            return r;
    }
    /* A shrunk range was known to reach t: only summation order kept it from doing so here. */
    return shrunk ? hi - 1 : -1;
}

/* The last-ranked of idx[0..n). */
static int32_t sampler_last(const float *lg, const int32_t *idx, int n)
{
    int32_t last = idx[0];
    for (int i = 1; i < n; i++)
        if (sampler_key(lg, idx[i]) < sampler_key(lg, last))
            last = idx[i];
    return last;
}

/* ===== the support ===== */

/* The truncated distribution in one of two layouts. Ranked (top_k > 0): idx[0..k) in rank order,
 * w[r] the weight of rank r. By id (no top_k): w[id] for every id, the support idx[0..k) in any
 * order (all ids when k == n). sum is the support's total weight. */
typedef struct {
    int32_t *idx;
    float *w;
    int k;
    bool ranked;
    double sum;
} sampler_support;

static void sampler_build(const sampler *s, const float *lg, int n, void *work, sampler_support *sp)
{
    sp->idx = work;
    sp->w = (float *)(sp->idx + n);
    float mx = lg[sampler_argmax(lg, n)], temp = s->temp;
    for (int i = 0; i < n; i++)
        sp->idx[i] = i;
    double sum = 0;
    if (s->top_k > 0 && s->top_k < n) {
        int k = s->top_k;
        sampler_top(lg, sp->idx, n, k);
        for (int r = 0; r < k; r++) {
            sp->w[r] = expf((lg[sp->idx[r]] - mx) / temp);
            sum += sp->w[r];
        }
        if (s->top_p > 0 && s->top_p < 1) {
            double cum = 0;
            for (int r = 0; r < k; r++) {
                cum += sp->w[r] / sum;
                if (cum >= s->top_p) {
                    k = r + 1;
                    break;
                }
            }
            sum = 0;
            for (int r = 0; r < k; r++)
                sum += sp->w[r];
        }
        *sp = (sampler_support){sp->idx, sp->w, k, true, sum};
        return;
    }
    for (int i = 0; i < n; i++) {
        sp->w[i] = expf((lg[i] - mx) / temp);
        sum += sp->w[i];
    }
    int k = n;
    if (s->top_p > 0 && s->top_p < 1) {
        int r = sampler_wselect(lg, sp->w, sp->idx, n, s->top_p * sum, false);
        if (r >= 0) {
            k = r + 1;
            sum = 0;
            for (int j = 0; j < k; j++)
                sum += sp->w[sp->idx[j]];
        }
    }
    *sp = (sampler_support){sp->idx, sp->w, k, false, sum};
}

int32_t sampler_sample(sampler *s, const float *logits, int n, void *work)
{
    if (s->temp <= 0)
        return sampler_argmax(logits, n);
    sampler_support sp;
    sampler_build(s, logits, n, work, &sp);
    double t = sampler_uniform(s) * sp.sum;
    if (sp.ranked) {
        for (int r = 0; r < sp.k; r++) {
            t -= sp.w[r];
            if (t < 0)
                return sp.idx[r];
        }
        return sp.idx[sp.k - 1];
    }
    int r = sampler_wselect(logits, sp.w, sp.idx, sp.k, t, true);
    return r >= 0 ? sp.idx[r] : sampler_last(logits, sp.idx, sp.k);
}

int sampler_probs(const sampler *s, const float *logits, int n, float *probs, void *work)
{
    memset(probs, 0, (size_t)n * sizeof *probs);
    if (s->temp <= 0) {
        probs[sampler_argmax(logits, n)] = 1;
        return 1;
    }
    sampler_support sp;
    sampler_build(s, logits, n, work, &sp);
    for (int r = 0; r < sp.k; r++) {
        int32_t id = sp.idx[r];
        probs[id] = (float)((sp.ranked ? sp.w[r] : sp.w[id]) / sp.sum);
    }
    return sp.k;
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
