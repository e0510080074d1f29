/*
 * workers/draft_lookup.c — the drafters without a model: ngram (prompt lookup: the continuation of
 * the latest earlier match of the context's last n tokens in the context itself, model/ngram.h,
 * the same rule the workers' free run drafts with) and replay (the first match of the longest
 * suffix in a corpus of token-id sequences, --corpus: fed the target's own answers, a perfect
 * drafter).
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "model/ngram.h"
#include "workers/speculator_internal.h"

const drafter drafter_ngram = {"ngram", SPEC_NGRAM, false, NULL, spec_grow_ngram};
const drafter drafter_replay = {"replay", SPEC_NGRAM, false, NULL, spec_grow_ngram};

/* Prompt lookup: the continuation of the most recent earlier occurrence of the context's last
 * k tokens (k from --ngram down to 1), as a chain. replay: the continuation of the first
 * occurrence of the longest such suffix in the corpus, up to the end of its sequence. */
int spec_grow_ngram(spec *s)
{
    int n_ctx = s->n_committed, n = 0, k = 0;
    const int32_t *src = s->corpus ? s->corpus : s->tokens;
    int end = s->corpus ? s->n_corpus : n_ctx;
    int pos = s->corpus ? ngram_lookup_corpus(s->tokens, n_ctx, s->corpus, s->n_corpus, s->ngram, &k)
                        : ngram_lookup(s->tokens, n_ctx, s->ngram, &k);
    for (int j = pos; pos >= 0 && j < end && src[j] >= 0 && n < s->max_nodes && n < s->max_depth;
         j++, n++)
        s->nodes[n] = (spec_node){
            .token = src[j], .parent = n - 1, .conf = (float)k / (k + 1), .depth = n + 1};
    return n;
}

/* --corpus FILE: whitespace-separated token ids, one sequence a line. */
int spec_load_corpus(spec *s, char *err, size_t errlen)
{
    FILE *f = fopen(s->corpus_path, "r");
    if (!f) {
        snprintf(err, errlen, "--corpus %s: %s", s->corpus_path, strerror(errno));
        return -1;
    }
    size_t cap = 0;
    int line = 1, rc = -1;
    s->corpus = NULL;
    s->n_corpus = 0;
    for (int ch = fgetc(f); ch != EOF;) {
        void *grown = s->corpus;
        if (buf_grow(&grown, &cap, (size_t)s->n_corpus + 2, sizeof *s->corpus, 4096)) {
            snprintf(err, errlen, "--corpus %s: out of memory", s->corpus_path);
            goto done;
        }
        s->corpus = grown;
        if (ch == '\n') {
            if (s->n_corpus && s->corpus[s->n_corpus - 1] >= 0)
                s->corpus[s->n_corpus++] = -1;
            line++;
            ch = fgetc(f);
        } else if (isspace(ch)) {
            ch = fgetc(f);
        } else if (isdigit(ch)) {
            long v = 0;
            for (; isdigit(ch) && v <= INT32_MAX; ch = fgetc(f))
                v = v * 10 + (ch - '0');
            if (v > INT32_MAX) {
                snprintf(err, errlen, "--corpus %s, line %d: a token id past 2^31", s->corpus_path,
                         line);
                goto done;
            }
            s->corpus[s->n_corpus++] = (int32_t)v;
        } else {
            snprintf(err, errlen, "--corpus %s, line %d: '%c' is not part of a token id",
                     s->corpus_path, line, ch);
            goto done;
        }
    }
    if (!s->n_corpus)
        snprintf(err, errlen, "--corpus %s holds no token ids", s->corpus_path);
    else
        rc = 0;
done:
    fclose(f);
    if (rc) {
        free(s->corpus);
        s->corpus = NULL;
        s->n_corpus = 0;
    }
    return rc;
}
