/*
 * model/ngram — prompt lookup, the drafting rule of the `ngram` speculator (workers/speculator.c)
 * and of its acceptance measurement in `orochi profile` (cli/cmd_profile.c); corpus lookup, the
 * rule of the `replay` speculator; the common beginning of two token sequences (what K/V rows two
 * contexts can share).
 */
#ifndef OROCHI_NGRAM_H
#define OROCHI_NGRAM_H

#include <stdint.h>

/* The most recent earlier occurrence in ids[0..len) of its own last k tokens, for the largest k
 * from n down to 1 that has one. Returns the index where that occurrence's continuation starts
 * (ids[pos], pos < len, is the predicted next token), or -1; *k_out (may be NULL) gets k. */
int ngram_lookup(const int32_t *ids, int len, int n, int *k_out);
/* The first occurrence in corpus[0..n_corpus) of the last k tokens of ids[0..len), for the
 * largest k from n down to 1 that has one followed by a token (a negative corpus entry separates
 * sequences: no match spans or ends at one). Returns the corpus index of that continuation's
 * first token, or -1; *k_out (may be NULL) gets k. */
int ngram_lookup_corpus(const int32_t *ids, int len, const int32_t *corpus, int n_corpus, int n,
                        int *k_out);
/* The longest run of tokens both a[0..na) and b[0..nb) begin with. */
int ngram_common_prefix(const int32_t *a, int na, const int32_t *b, int nb);

#endif
