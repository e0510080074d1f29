/*
 * model/ngram — prompt lookup, the drafting rule of the `ngram` speculator (workers/speculator.c)
 * and of its acceptance measurement in `orochi profile` (cli/cmd_profile.c).
 */
#ifndef OROCHI_NGRAM_H
#define OROCHI_NGRAM_H

#include <stdint.h>

/* The most recent earlier occurrence in ids[0..len) of its own last k tokens, for the largest k
 * from n down to 1 that has one. Returns the index where that occurrence's continuation starts
 * (ids[pos], pos < len, is the predicted next token), or -1; *k_out (may be NULL) gets k. */
int ngram_lookup(const int32_t *ids, int len, int n, int *k_out);

#endif
