/*
 * coordinator/verify — deciding which drafted tokens the target accepts, for a chain or a tree of
 * drafts verified in one target step, greedily or by sampling, so that the emitted tokens are
 * distributed exactly as sequential decoding with the same sampler would emit them.
 *
 * Greedy keeps the longest root-to-leaf path whose every token is the target's argmax; sampling is
 * multi-step speculative sampling with deterministic proposals (see docs/verification.md for the
 * argument that it preserves the target distribution). The chi-square tests that compare token
 * distributions are the unit tests' own (tests/unit/chi2.h).
 */
#ifndef OROCHI_VERIFY_H
#define OROCHI_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "model/llama.h"

#define VERIFY_MAX 64

/* A draft tree as verified in one target step. Node 0 is the root: the last committed token (not a
 * draft). Nodes 1..n-1 are drafted tokens; parent[i] < i; parent[0] = -1. The step batch lays the
 * nodes out in this order (the arrays can be a llama_batch's tokens and parent as they are), so
 * logits row i = target logits after node i (the target's distribution for node i's children).
 * Drafts are deterministic proposals (a drafter's argmax / top candidates), so siblings carry
 * distinct tokens; a repeated sibling token is tolerated and treated as already rejected. */
typedef struct {
    int n;
    const int32_t *tokens;
    const int32_t *parent;
} verify_tree;

typedef struct {
    int path[VERIFY_MAX]; /* accepted nodes, root first: path[0] == 0 */
    int n_path;           /* >= 1; accepted drafted tokens = n_path - 1 */
    int32_t next;         /* correction / bonus token drawn at the last path node */
} verify_result;

/* 0 if t is a valid tree for a vocabulary of V tokens (1 <= n <= VERIFY_MAX, parent[0] == -1,
 * 0 <= parent[i] < i, every token in [0, V)); else -1 with one line in err (err may be NULL). */
int verify_tree_check(const verify_tree *t, int V, char *err, size_t errlen);

/* Greedy: walk from the root; at each node take the child whose token equals argmax(logits row of
 * the node) (lowest id wins ties, like sampler_argmax; the lowest node among equal siblings); stop
 * when none; next = that argmax. This is the longest accepted root-to-leaf path, and the output
 * equals sequential greedy decoding. The tree must be valid (verify_tree_check). */
void verify_greedy(const verify_tree *t, const float *logits, int V, verify_result *r);

/* Sampling with the sampler's temperature / top-k / top-p: at a node, p = the target's distribution
 * (sampler_probs of the node's row); try the children in node order: accept child c with
 * probability p(c) / (remaining mass), otherwise remove c's mass (the residual max(0, p -
 * onehot(c)) renormalised) and try the next; on acceptance descend into c; when every child is
 * rejected (or there are none) draw `next` from the residual and stop. All randomness comes from
 * the sampler's generator. temp <= 0 is verify_greedy. `work` holds 3 * V floats. Returns 0, or -1
 * for an invalid tree (r untouched). */
int verify_sample(const verify_tree *t, const float *logits, int V, sampler *s, void *work,
                  verify_result *r);

/* The tokens a step emits: the accepted drafts then `next`, into out (room for r->n_path).
 * Returns their count, r->n_path. */
int verify_emit(const verify_tree *t, const verify_result *r, int32_t *out);

#endif
