/*
 * model/sampler.c — choosing the next token from logits: greedy (argmax, lowest index on ties),
 * or temperature + top-k + top-p sampling from a seeded xorshift generator, so a run is
 * reproducible from its seed.
 */
#define _GNU_SOURCE /* qsort_r */
#include <math.h>
#include <stdlib.h>

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

static double sampler_uniform(sampler *s)
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

typedef struct {
    const float *logits;
} sampler_order;

/* Sort candidate ids by logit, descending; ties by id so the order is deterministic. */
static int sampler_cmp(const void *a, const void *b, void *ctx)
{
    const float *lg = ((const sampler_order *)ctx)->logits;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (lg[x] != lg[y])
        return lg[x] > lg[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

int32_t sampler_sample(sampler *s, const float *logits, int n, void *work)
{
    if (s->temp <= 0)
        return sampler_argmax(logits, n);
    int32_t *idx = work;
    float *p = (float *)(idx + n);
    for (int i = 0; i < n; i++)
        idx[i] = i;
    sampler_order ord = {logits};
    qsort_r(idx, (size_t)n, sizeof *idx, sampler_cmp, &ord);
    int k = s->top_k > 0 && s->top_k < n ? s->top_k : n;
    float mx = logits[idx[0]];
    double sum = 0;
    for (int i = 0; i < k; i++) {
        p[i] = expf((logits[idx[i]] - mx) / s->temp);
        sum += p[i];
    }
    if (s->top_p > 0 && s->top_p < 1) {
        double cum = 0;
        for (int i = 0; i < k; i++) {
            cum += p[i] / sum;
            if (cum >= s->top_p) {
                k = i + 1;
                break;
            }
        }
        sum = 0;
        for (int i = 0; i < k; i++)
            sum += p[i];
    }
    double r = sampler_uniform(s) * sum;
    for (int i = 0; i < k; i++) {
        r -= p[i];
        if (r < 0)
            return idx[i];
    }
    return idx[k - 1];
}
