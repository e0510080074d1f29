/*
 * coordinator/verify.c — accepting drafted tokens: greedy and sampling verification of a draft
 * chain or tree against the target's logits for every node, plus the chi-square tests that check
 * verifiers against sequential decoding.
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

/* ===== chi-square ===== */

/* Q(a, x), the regularized upper incomplete gamma function: a series for P when x < a + 1, a
 * continued fraction (modified Lentz) for Q otherwise. */
static double verify_gamma_q(double a, double x)
{
    if (!(x > 0))
        return 1;
    if (isinf(x))
        return 0;
    double lead = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1) {
        double term = 1 / a, sum = term;
        for (int n = 1; n < 100000; n++) {
            term *= x / (a + n);
            sum += term;
            if (fabs(term) < fabs(sum) * 1e-16)
                break;
        }
        double q = 1 - sum * lead;
        return q < 0 ? 0 : q;
    }
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int i = 1; i < 100000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < tiny)
            d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny)
            c = tiny;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-16)
            break;
    }
    return lead * h;
}

double verify_chi2_sf(double x, double dof)
{
    if (!(dof > 0))
        return 1;
    return verify_gamma_q(dof / 2, x / 2);
}

/* Group cells for a chi-square: cells of size (expected count) >= 5 keep a group each, smaller ones
 * share a pool, which joins the smallest large cell when it is itself below 5. Cells of size 0 with
 * nothing observed (skip[j]) get -1. Returns the number of groups. */
static int verify_pool(const double *size, const int *skip, int cells, int *group)
{
    int g = 0, smallest = -1;
    double pooled = 0;
    int any_small = 0;
    for (int j = 0; j < cells; j++) {
        if (skip[j]) {
            group[j] = -1;
        } else if (size[j] >= 5) {
            group[j] = g++;
            if (smallest < 0 || size[j] < size[smallest])
                smallest = j;
        } else {
            group[j] = -2;
            pooled += size[j];
            any_small = 1;
        }
    }
    if (!any_small)
        return g;
    int pool = pooled < 5 && smallest >= 0 ? group[smallest] : g++;
    for (int j = 0; j < cells; j++)
        if (group[j] == -2)
            group[j] = pool;
    return g;
}

double verify_chi2_gof(const uint64_t *obs, const double *prob, int cells, double *stat, int *dof)
{
    *stat = 0;
    *dof = 0;
    double total = 0;
    for (int j = 0; j < cells; j++) {
        total += (double)obs[j];
        if (obs[j] > 0 && !(prob[j] > 0)) { /* an impossible observation: no pooling hides it */
            *stat = INFINITY;
            return 0;
        }
    }
    double *size = calloc((size_t)(cells + 1) * 3, sizeof *size);
    int *skip = calloc((size_t)(cells + 1) * 2, sizeof *skip);
    if (!size || !skip) {
        free(size);
        free(skip);
        return NAN;
    }
    double *go = size + cells + 1, *ge = go + cells + 1;
    int *group = skip + cells + 1;
    for (int j = 0; j < cells; j++) {
        size[j] = total * prob[j];
        skip[j] = size[j] <= 0 && obs[j] == 0;
    }
    int g = verify_pool(size, skip, cells, group);
    for (int j = 0; j < cells; j++)
        if (group[j] >= 0) {
            go[group[j]] += (double)obs[j];
            ge[group[j]] += size[j];
        }
    double x = 0;
    for (int i = 0; i < g; i++)
        if (ge[i] > 0)
            x += (go[i] - ge[i]) * (go[i] - ge[i]) / ge[i];
    free(size);
    free(skip);
    *stat = x;
    *dof = g > 1 ? g - 1 : 0;
    return verify_chi2_sf(x, *dof);
}

double verify_chi2_homogeneity(const uint64_t *a, const uint64_t *b, int cells, double *stat,
                               int *dof)
{
    *stat = 0;
    *dof = 0;
    double na = 0, nb = 0;
    for (int j = 0; j < cells; j++) {
        na += (double)a[j];
        nb += (double)b[j];
    }
    if (na <= 0 || nb <= 0)
        return 1;
    double *size = calloc((size_t)(cells + 1) * 3, sizeof *size);
    int *skip = calloc((size_t)(cells + 1) * 2, sizeof *skip);
    if (!size || !skip) {
        free(size);
        free(skip);
        return NAN;
    }
    double *ga = size + cells + 1, *gb = ga + cells + 1;
    int *group = skip + cells + 1;
    double fmin = (na < nb ? na : nb) / (na + nb);
    for (int j = 0; j < cells; j++) {
        size[j] = ((double)a[j] + (double)b[j]) * fmin; /* the smaller of the two expected counts */
        skip[j] = a[j] == 0 && b[j] == 0;
    }
    int g = verify_pool(size, skip, cells, group);
    for (int j = 0; j < cells; j++)
        if (group[j] >= 0) {
            ga[group[j]] += (double)a[j];
            gb[group[j]] += (double)b[j];
        }
    double x = 0;
    for (int i = 0; i < g; i++) {
        double t = ga[i] + gb[i], ea = t * na / (na + nb), eb = t * nb / (na + nb);
        x += (ga[i] - ea) * (ga[i] - ea) / ea + (gb[i] - eb) * (gb[i] - eb) / eb;
    }
    free(size);
    free(skip);
    *stat = x;
    *dof = g > 1 ? g - 1 : 0;
    return verify_chi2_sf(x, *dof);
}
