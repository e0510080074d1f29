/*
 * tests/unit/chi2.h — chi-square tests of token distributions for the unit tests that check a
 * sampler or a verification keeps the target distribution (test_verify.c, test_distribution.c):
 * the survival function, goodness of fit, and two-sample homogeneity. Test code only.
 *
 * verify_chi2_sf(x, dof): P(X >= x) for X chi-square with dof degrees of freedom (the regularized
 * upper gamma Q(dof/2, x/2)).
 * verify_chi2_gof(obs, prob, cells, &stat, &dof): goodness of fit of counts obs[0..cells) to
 * probabilities prob[0..cells) (summing to 1). Cells whose expected count is below 5 are pooled
 * into one (merged into the smallest other cell when the pool is still below 5). A count in a
 * cell of probability 0 gives p = 0 (statistic infinite). Writes the statistic and degrees of
 * freedom; returns the p-value.
 * verify_chi2_homogeneity(a, b, cells, &stat, &dof): homogeneity of two samples' counts (two-sample
 * chi-square on the 2 x cells table), with the same pooling of cells whose expected count is
 * below 5 in either row.
 */
#ifndef OROCHI_TEST_CHI2_H
#define OROCHI_TEST_CHI2_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


/* Q(a, x), the regularized upper incomplete gamma function: a series for P when x < a + 1, a
 * continued fraction (modified Lentz) for Q otherwise. */
static inline double verify_gamma_q(double a, double x)
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

static inline double verify_chi2_sf(double x, double dof)
{
    if (!(dof > 0))
        return 1;
    return verify_gamma_q(dof / 2, x / 2);
}

/* Group cells for a chi-square: cells of size (expected count) >= 5 keep a group each, smaller ones
 * share a pool, which joins the smallest large cell when it is itself below 5. Cells of size 0 with
 * nothing observed (skip[j]) get -1. Returns the number of groups. */
static inline int verify_pool(const double *size, const int *skip, int cells, int *group)
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

static inline double verify_chi2_gof(const uint64_t *obs, const double *prob, int cells, double *stat, int *dof)
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

static inline double verify_chi2_homogeneity(const uint64_t *a, const uint64_t *b, int cells, double *stat,
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

#endif
