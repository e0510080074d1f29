/*
 * coordinator/verify.c — accepting drafted tokens: greedy and sampling verification of a draft
 * chain or tree against the target's logits for every node (the chi-square tests that check
 * verifiers against sequential decoding are test code: tests/unit/chi2.h).
 *
 * Why sampling verification is exact (the full argument is in docs/verification.md): at a node
 * with target distribution p and children c1..cm (deterministic proposals), c1 is accepted with
 * probability p(c1); after a rejection the target becomes the residual p with c1's mass removed,
 * renormalised, and c2 is tried against it, and so on. Child cj is therefore accepted with
 * probability exactly p(cj), and a token x that is no child is drawn with probability
 * (1 - sum p(cj)) * p(x) / (1 - sum p(cj)) = p(x). So the first token emitted at a node follows p;
 * when it is an accepted child the walk continues with that child's row, the target's conditional
 * given the path so far, and by induction every emitted token follows the target.
 *
 * The residual is kept as the dense probability vector with rejected entries zeroed, and its
 * remaining mass as a double, so acceptance is one uniform draw compared against p(c) / mass.
 */
#include "coordinator/verify.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int verify_tree_check(const verify_tree *t, int V, char *err, size_t errlen)
{
    char dummy[8];
    if (!err) {
        err = dummy;
        errlen = sizeof dummy;
    }
    if (!t || !t->tokens || !t->parent) {
        snprintf(err, errlen, "verify: tree without tokens or parents");
        return -1;
    }
    if (t->n < 1 || t->n > VERIFY_MAX) {
        snprintf(err, errlen, "verify: tree of %d nodes (need 1..%d)", t->n, VERIFY_MAX);
        return -1;
    }
    if (V < 1) {
        snprintf(err, errlen, "verify: vocabulary of %d tokens", V);
        return -1;
    }
    if (t->parent[0] != -1) {
        snprintf(err, errlen, "verify: root parent is %d, not -1", (int)t->parent[0]);
        return -1;
    }
    for (int i = 0; i < t->n; i++) {
        if (i > 0 && (t->parent[i] < 0 || t->parent[i] >= i)) {
            snprintf(err, errlen, "verify: node %d has parent %d (need 0..%d)", i,
                     (int)t->parent[i], i - 1);
            return -1;
        }
        if (t->tokens[i] < 0 || t->tokens[i] >= V) {
            snprintf(err, errlen, "verify: node %d has token %d outside the vocabulary of %d", i,
                     (int)t->tokens[i], V);
            return -1;
        }
    }
    return 0;
}

void verify_greedy(const verify_tree *t, const float *logits, int V, verify_result *r)
{
    int n = t->n < VERIFY_MAX ? t->n : VERIFY_MAX;
    int node = 0;
    r->path[0] = 0;
    r->n_path = 1;
    for (;;) {
        int32_t best = sampler_argmax(logits + (size_t)node * V, V);
        int child = -1;
        /* children have larger indices than their parent, so the path index strictly grows and
         * the path never outgrows n <= VERIFY_MAX */
        for (int i = node + 1; i < n; i++)
            if (t->parent[i] == node && t->tokens[i] == best) {
                child = i;
                break;
            }
        if (child < 0) {
            r->next = best;
            return;
        }
        r->path[r->n_path++] = child;
        node = child;
    }
}

int verify_sample(const verify_tree *t, const float *logits, int V, sampler *s, void *work,
                  verify_result *r)
{
    if (verify_tree_check(t, V, NULL, 0))
        return -1;
    if (s->temp <= 0) {
        verify_greedy(t, logits, V, r);
        return 0;
    }
    float *p = work;
    void *swork = p + V;
    int node = 0;
    r->path[0] = 0;
    r->n_path = 1;
    for (;;) {
        const float *row = logits + (size_t)node * V;
        sampler_probs(s, row, V, p, swork);
        double mass = 0;
        for (int i = 0; i < V; i++)
            mass += p[i];
        int child = -1;
        for (int i = node + 1; i < t->n; i++) {
            if (t->parent[i] != node)
                continue;
            int32_t c = t->tokens[i];
            double pc = p[c];
            if (!(pc > 0)) /* outside the support, or a sibling already rejected */
                continue;
            if (sampler_uniform(s) * mass < pc) {
                child = i;
                break;
            }
            mass -= pc;
            p[c] = 0;
        }
        if (child >= 0) {
            r->path[r->n_path++] = child;
            node = child;
            continue;
        }
        r->next = sampler_draw(s, p, V);
        if (r->next < 0) /* no mass left: impossible in exact arithmetic; stay well-defined */
            r->next = sampler_argmax(row, V);
        return 0;
    }
}

int verify_emit(const verify_tree *t, const verify_result *r, int32_t *out)
{
    for (int j = 1; j < r->n_path; j++)
        out[j - 1] = t->tokens[r->path[j]];
    out[r->n_path - 1] = r->next;
    return r->n_path;
}
