/*
 * model/ngram.c — prompt lookup (interface: ngram.h).
 */
#include "model/ngram.h"

#include <stddef.h>
#include <string.h>

int ngram_lookup(const int32_t *ids, int len, int n, int *k_out)
{
    for (int k = n; k >= 1; k--) {
        if (len <= k)
            continue;
        for (int st = len - k - 1; st >= 0; st--)
            if (!memcmp(ids + st, ids + len - k, (size_t)k * sizeof *ids)) {
                if (k_out)
                    *k_out = k;
                return st + k;
            }
    }
    return -1;
}

int ngram_lookup_corpus(const int32_t *ids, int len, const int32_t *corpus, int n_corpus, int n,
                        int *k_out)
{
    for (int k = n < len ? n : len; k >= 1; k--) {
        const int32_t *tail = ids + len - k;
        for (int st = 0; st + k < n_corpus; st++) {
            /* tokens are never negative, so an equal run holds no separator */
            if (corpus[st + k] < 0 || memcmp(corpus + st, tail, (size_t)k * sizeof *ids))
                continue;
            if (k_out)
                *k_out = k;
            return st + k;
        }
    }
    return -1;
}

int ngram_common_prefix(const int32_t *a, int na, const int32_t *b, int nb)
{
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}
