/*
 * policy/control.c — the speculation controllers (interface and rationale: control.h,
 * docs/speculation.md). Pure functions: no I/O, no clock.
 */
#include "policy/control.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ===== the draft trie and the vote ===== */

void ctl_tree_init(ctl_tree *t, int32_t root)
{
    t->n = 1;
    t->tokens[0] = root;
    t->parent[0] = -1;
    t->weight[0] = t->support[0] = 0;
    t->owners[0] = 0;
    memset(t->owner_w, 0, sizeof t->owner_w);
}

/* The child of node p carrying token tok, or -1. */
static int tree_child(const ctl_tree *t, int p, int32_t tok)
{
    for (int i = p + 1; i < t->n; i++)
        if (t->parent[i] == p && t->tokens[i] == tok)
            return i;
    return -1;
}

void ctl_tree_add(ctl_tree *t, const arena_draft *d, float w, int owner)
{
    int map[ARENA_DRAFT_MAX];
    if (owner < 0 || owner >= CTL_MAX_OWNERS)
        return;
    t->owner_w[owner] = w;
    for (uint32_t i = 0; i < d->n && i < ARENA_DRAFT_MAX; i++) {
        int p = d->parent[i] < 0 ? 0 : ((uint32_t)d->parent[i] < i ? map[d->parent[i]] : -1);
        if (p < 0) { /* malformed parent: ignore the subtree */
            map[i] = -1;
            continue;
        }
        int c = tree_child(t, p, d->tokens[i]);
        if (c < 0) {
            if (t->n == CTL_TREE_CAP) {
                map[i] = -1;
                continue;
            }
            c = t->n++;
            t->tokens[c] = d->tokens[i];
            t->parent[c] = p;
            t->weight[c] = t->support[c] = 0;
            t->owners[c] = 0;
        }
        float conf = d->conf[i] > 0 && d->conf[i] <= 1 ? d->conf[i] : 1.0f;
        if (!(t->owners[c] >> owner & 1u)) { /* a speculator counts once per node */
            t->weight[c] += w;
            t->support[c] += w * conf;
        }
        t->owners[c] |= 1u << owner;
        map[i] = c;
    }
}

/* Copy nodes keep[0..n) (each parent kept before its children) into out, renumbered. */
static void tree_select(const ctl_tree *in, const int *keep, int n, ctl_tree *out)
{
    int map[CTL_TREE_CAP];
    for (int i = 0; i < in->n; i++)
        map[i] = -1;
    out->n = 0;
    memcpy(out->owner_w, in->owner_w, sizeof out->owner_w);
    for (int k = 0; k < n; k++) {
        int i = keep[k];
        int j = out->n++;
        map[i] = j;
        out->tokens[j] = in->tokens[i];
        out->parent[j] = in->parent[i] < 0 ? -1 : map[in->parent[i]];
        out->weight[j] = in->weight[i];
        out->support[j] = in->support[i];
        out->owners[j] = in->owners[i];
    }
}

/* The summed weight of the speculators that drafted some child of p. */
static double tree_mass_below(const ctl_tree *t, int p)
{
    uint32_t who = 0;
    for (int i = p + 1; i < t->n; i++)
        if (t->parent[i] == p)
            who |= t->owners[i];
    double m = 0;
    for (int r = 0; r < CTL_MAX_OWNERS; r++)
        if (who >> r & 1u)
            m += t->owner_w[r];
    return m;
}

void ctl_tree_vote(const ctl_tree *in, ctl_vote mode, int max_nodes, ctl_tree *out)
{
    int keep[CTL_TREE_CAP], n = 0, depth[CTL_TREE_CAP];
    double score[CTL_TREE_CAP];
    bool taken[CTL_TREE_CAP] = {true};
    keep[n++] = 0;
    if (max_nodes > CTL_TREE_CAP)
        max_nodes = CTL_TREE_CAP;
    depth[0] = 0;
    score[0] = 1;
    if (mode == VOTE_MAJORITY) {
        double mass[CTL_TREE_CAP];
        for (int i = 0; i < in->n; i++)
            mass[i] = tree_mass_below(in, i);
        for (int i = 1; i < in->n; i++) {
            int p = in->parent[i];
            depth[i] = depth[p] + 1;
            score[i] = score[p] * (mass[p] > 0 ? in->support[i] / mass[p] : 0);
        }
    } else {
        for (int i = 1; i < in->n; i++) {
            depth[i] = depth[in->parent[i]] + 1;
            score[i] = in->weight[i];
        }
    }
    while (n < max_nodes) {
        int best = -1;
        for (int i = 1; i < in->n; i++) {
            if (taken[i] || !taken[in->parent[i]])
                continue;
            if (best < 0 || score[i] > score[best] ||
                (score[i] == score[best] && mode == VOTE_MAJORITY && depth[i] < depth[best]))
                best = i;
        }
        if (best < 0)
            break;
        taken[best] = true;
        keep[n++] = best;
    }
    /* parents first: sort the kept indices (a parent always has a smaller index) */
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && keep[b] < keep[b - 1]; b--) {
            int x = keep[b];
            keep[b] = keep[b - 1];
            keep[b - 1] = x;
        }
    tree_select(in, keep, n, out);
}

void ctl_tree_match(const arena_draft *d, const int32_t *acc, int n_acc, int *depth, int *matched)
{
    int dep[ARENA_DRAFT_MAX];
    *depth = 0;
    *matched = 0;
    for (uint32_t i = 0; i < d->n && i < ARENA_DRAFT_MAX; i++) {
        int p = d->parent[i];
        dep[i] = p < 0 || (uint32_t)p >= i ? 1 : dep[p] + 1;
        if (dep[i] > *depth)
            *depth = dep[i];
    }
    int cur = -1;
    for (int k = 0; k < n_acc; k++) {
        int next = -1;
        for (uint32_t i = 0; i < d->n && i < ARENA_DRAFT_MAX; i++)
            if (d->parent[i] == cur && d->tokens[i] == acc[k]) {
                next = (int)i;
                break;
            }
        if (next < 0)
            break;
        cur = next;
        (*matched)++;
    }
}

/* ===== ACR ===== */

void ctl_acr_update(ctl_acr *a, const ctl_acr_params *p, int depth, int matched)
{
    if (depth <= 0)
        return;
    a->acr_sum += (double)matched / depth;
    a->acr_n++;
    a->acr = a->acr_sum / (double)a->acr_n;
    if (a->acr > p->reward_threshold)
        a->weight *= p->reward_factor;
    else if (a->acr < p->punish_threshold)
        a->weight *= p->punish_factor;
    if (a->weight < 0.05)
        a->weight = 0.05;
    if (a->weight > 20)
        a->weight = 20;
}

/* ===== adaptive length ===== */

void ctl_length_init(ctl_length *l, int start, int lo, int hi, int window, int stale)
{
    memset(l, 0, sizeof *l);
    if (hi > CTL_LEN_MAX)
        hi = CTL_LEN_MAX;
    if (lo < 1)
        lo = 1;
    if (hi < lo)
        hi = lo;
    l->lo = lo;
    l->hi = hi;
    l->len = start < lo ? lo : start > hi ? hi : start;
    l->window = window < 1 ? 1 : window;
    l->stale = stale < 1 ? 1 : stale;
}

/* A saturated window's climb: half the length at once (at least 1), up to hi. */
static int length_climb(int len, int hi)
{
    int step = len / 2 < 1 ? 1 : len / 2;
    return len + step > hi ? hi : len + step;
}

static bool length_wants(const ctl_length *l, int x)
{
    return x >= l->lo && x <= l->hi && (l->cost[x] <= 0 || l->age[x] >= (uint32_t)l->stale);
}

int ctl_length_sample(ctl_length *l, double seconds, int tokens)
{
    if (tokens <= 0 || seconds < 0)
        return l->len;
    l->sec += seconds;
    l->tok += tokens;
    l->full += tokens >= l->len + 1;
    ++l->n;
    bool saturated = l->full == l->n && l->len < l->hi;
    if (l->n < l->window && !(saturated && 2 * l->n >= l->window))
        return l->len;
    for (int x = l->lo; x <= l->hi; x++)
        l->age[x]++;
    l->cost[l->len] = l->sec / (double)l->tok;
    l->age[l->len] = 0;
    l->sec = 0;
    l->tok = 0;
    l->n = 0;
    l->full = 0;
    l->decisions++;
    /* the cheapest of the fresh figures around: move there; at a local minimum, re-measure a
     * neighbour whose figure is missing or stale (up first) */
    int cur = l->len, best = cur;
    if (saturated) {
        l->len = length_climb(cur, l->hi);
        l->changes++;
        return l->len;
    }
    for (int x = cur - 1; x <= cur + 1; x += 2)
        if (x >= l->lo && x <= l->hi && l->cost[x] > 0 && l->age[x] < (uint32_t)l->stale &&
            l->cost[x] < l->cost[best])
            best = x;
    if (best != cur)
        l->len = best;
    else if (length_wants(l, cur + 1))
        l->len = cur + 1;
    else if (length_wants(l, cur - 1))
        l->len = cur - 1;
    l->changes += l->len != cur;
    return l->len;
}

void ctl_reqlen_init(ctl_reqlen *l, int start, int lo, int hi, int window)
{
    memset(l, 0, sizeof *l);
    l->lo = lo < 1 ? 1 : lo;
    l->hi = hi < l->lo ? l->lo : hi;
    l->len = start < l->lo ? l->lo : start > l->hi ? l->hi : start;
    l->window = window < 1 ? 1 : window;
}

int ctl_reqlen_sample(ctl_reqlen *l, int accepted)
{
    if (accepted < 0)
        return l->len;
    l->acc += accepted;
    l->full += accepted >= l->len;
    ++l->n;
    bool saturated = l->full == l->n && l->len < l->hi;
    if (l->n < l->window && !(saturated && 2 * l->n >= l->window))
        return l->len;
    if (saturated) {
        l->len = length_climb(l->len, l->hi);
    } else {
        int len = (int)floor((double)l->acc / l->n + 0.5) + 1;
        l->len = len < l->lo ? l->lo : len > l->hi ? l->hi : len;
    }
    l->n = l->full = l->acc = 0;
    l->decisions++;
    return l->len;
}

/* ===== the drafter's fallback threshold ===== */

float ctl_alpha_update(float alpha, const int32_t *token, const int32_t *parent, int n,
                       const int32_t *accepted, int n_acc)
{
    if (n <= 0 || n > CTL_ALPHA_MAX_NODES)
        return alpha;
    bool inner[CTL_ALPHA_MAX_NODES] = {false};
    for (int i = 0; i < n; i++)
        if (parent[i] >= 0 && parent[i] < n)
            inner[parent[i]] = true;
    int best_all = 0, best_ok = -1;
    for (int leaf = 0; leaf < n; leaf++) {
        if (inner[leaf])
            continue;
        int path[CTL_ALPHA_MAX_NODES], len = 0;
        for (int i = leaf; i >= 0 && len < n; i = parent[i])
            path[len++] = i;
        int ok = 0;
        while (ok < len && ok < n_acc && token[path[len - 1 - ok]] == accepted[ok])
            ok++;
        if (ok > best_ok || (ok == best_ok && len < best_all)) {
            best_ok = ok;
            best_all = len;
        }
    }
    if (best_all <= 0)
        return alpha;
    alpha = best_ok == best_all ? 0.5f * alpha : (float)(best_all - best_ok) / (float)best_all;
    return alpha < 1e-6f ? 1e-6f : alpha;
}

/* ===== fallback guard ===== */

void ctl_guard_init(ctl_guard *g, double base_prior, int window, int probe)
{
    memset(g, 0, sizeof *g);
    g->base = base_prior > 0 ? base_prior : 0;
    g->window = window < 1 ? 1 : window;
    g->probe = g->probe_now = probe < 1 ? 1 : probe;
    g->on = g->base > 0; /* without a plain figure, measure one first */
    g->warm = g->on ? CTL_GUARD_WARM : 0;
}

/* Whether the probe budget allows switching on now. */
static bool guard_budget_ok(const ctl_guard *g)
{
    return g->loss <= CTL_GUARD_BUDGET * g->plain_sec;
}

/* What a judged window while on cost beyond plain decoding, into the budget. A gain pays back,
 * and past zero it is credit: speculation that has saved time may lose some of it again to
 * narrow windows before the probes stop, and what the budget bounds is the net cost of all of
 * speculation against plain decoding, not the last losses of a drafter that paid before them. */
static void guard_charge(ctl_guard *g, double seconds, long tokens)
{
    if (g->base <= 0)
        return;
    g->loss += seconds - g->base * (double)tokens;
}

bool ctl_guard_sample(ctl_guard *g, bool speculated, double seconds, int tokens)
{
    if (tokens <= 0 || seconds < 0)
        return g->on;
    if (!g->on && speculated)   /* a stray speculative cycle while off: not a plain sample */
        return g->on;           /* (while on, a cycle that got no drafts counts as on) */
    if (g->on && g->warm > 0) { /* the speculators are catching up with the context: no verdict */
        g->warm--;
        return g->on;
    }
    if (!g->on)
        g->plain_sec += seconds;
    g->sec += seconds;
    g->tok += tokens;
    ++g->n;
    /* a probe that already costs half as much again as plain decoding need not finish its window */
    bool hopeless = g->on && g->base > 0 && g->n >= 2 &&
                    g->sec / (double)g->tok > CTL_GUARD_HOPELESS * g->base;
    if (g->n < g->window && !hopeless)
        return g->on;
    double cost = g->sec / (double)g->tok, per_step = (double)g->tok / (double)g->n;
    if (g->on)
        guard_charge(g, g->sec, g->tok);
    g->sec = 0;
    g->tok = 0;
    g->n = 0;
    if (g->on) {
        g->spec = cost;
        g->per_step = per_step;
        bool good = per_step >= CTL_GUARD_GOOD_TOKENS && !hopeless &&
                    cost <= CTL_GUARD_HOPELESS * g->base;
        if (g->base > 0 && cost >= g->base && good && !g->strikes) {
            g->strikes = 1; /* a good drafter's narrow loss: one more window */
        } else if (g->base > 0 && cost >= g->base) {
            g->on = false;
            g->off_n = 0;
            g->strikes = 0;
            g->switches_off++;
            if (good)
                g->probe_now = g->probe; /* two slow windows, but a good drafter: probe soon */
            else if (g->probe_now < 64 * g->probe)
                g->probe_now *= 2; /* it did not pay: probe less often */
        } else {
            g->strikes = 0;
            g->probe_now = g->probe;
            g->paid++;
        }
    } else {
        g->base = g->base > 0 ? 0.5 * (g->base + cost) : cost;
        g->off_n += g->window;
        if ((g->off_n >= g->probe_now || g->spec <= 0) && guard_budget_ok(g)) {
            g->on = true;
            g->warm = CTL_GUARD_WARM;
            g->switches_on++;
        }
    }
    return g->on;
}

int ctl_guard_plain_left(const ctl_guard *g)
{
    if (g->on)
        return 0;
    if (!guard_budget_ok(g))
        return INT_MAX;
    int left = g->window - g->n; /* the window under way; then whole windows to the probe */
    if (g->spec > 0)
        for (int off = g->off_n + g->window; off < g->probe_now; off += g->window)
            left += g->window;
    return left;
}

void ctl_guard_reprobe(ctl_guard *g)
{
    if (g->on || g->spec <= 0 || !guard_budget_ok(g))
        return;
    /* a clear loser is no better on a new text, nor is a set of speculators that has not paid in
     * any window yet: they wait for their backed-off probe */
    if (g->off_n < g->probe_now &&
        (!g->paid || (g->base > 0 && g->spec > CTL_GUARD_HOPELESS * g->base)))
        return;
    g->on = true;
    g->warm = CTL_GUARD_WARM;
    g->sec = 0;
    g->tok = 0;
    g->n = 0;
    g->off_n = 0;
    g->switches_on++;
}

/* ===== ARCA planning ===== */

static double plan_path_prob(const ctl_template *t, const double *acc, int ranks, int i)
{
    double p = 1;
    for (; i > 0; i = t->parent[i])
        p *= acc[(t->depth[i] - 1) * ranks + t->rank[i]];
    return p;
}

static bool plan_has(const ctl_template *t, int parent, int rank)
{
    for (int i = 1; i < t->n; i++)
        if (t->parent[i] == parent && t->rank[i] == rank)
            return true;
    return false;
}

double ctl_plan_tree(const double *acc, int depths, int ranks, int width, ctl_template *t)
{
    if (width > CTL_TREE_CAP)
        width = CTL_TREE_CAP;
    t->n = 1;
    t->parent[0] = -1;
    t->rank[0] = 0;
    t->depth[0] = 0;
    double expect = 1;
    while (t->n < width) {
        int bp = -1, br = -1;
        double bprob = 0;
        for (int p = 0; p < t->n; p++) {
            if (t->depth[p] >= depths)
                continue;
            double pp = plan_path_prob(t, acc, ranks, p);
            for (int r = 0; r < ranks; r++) {
                if (plan_has(t, p, r))
                    continue;
                double q = pp * acc[t->depth[p] * ranks + r];
                if (q > bprob) {
                    bprob = q;
                    bp = p;
                    br = r;
                }
                break; /* ranks are taken in order below a parent: only the next one is free */
            }
        }
        if (bp < 0)
            break;
        int i = t->n++;
        t->parent[i] = bp;
        t->rank[i] = br;
        t->depth[i] = t->depth[bp] + 1;
        expect += bprob;
    }
    return expect;
}

void ctl_tree_fit(const ctl_tree *in, const ctl_template *t, ctl_tree *out)
{
    int map[CTL_TREE_CAP], keep[CTL_TREE_CAP], n = 0;
    map[0] = 0;
    keep[n++] = 0;
    for (int i = 1; i < in->n; i++) {
        int p = in->parent[i];
        map[i] = -1;
        if (map[p] < 0)
            continue;
        int r = 0;
        for (int j = p + 1; j < in->n; j++)
            if (j != i && in->parent[j] == p &&
                (in->support[j] > in->support[i] || (in->support[j] == in->support[i] && j < i)))
                r++;
        for (int k = 1; k < t->n; k++)
            if (t->parent[k] == map[p] && t->rank[k] == r) {
                map[i] = k;
                keep[n++] = i;
                break;
            }
    }
    tree_select(in, keep, n, out);
}

double ctl_plan_eval(const ctl_template *t, const int8_t *paths, int n_paths, int depths)
{
    if (n_paths <= 0)
        return 1;
    long total = 0;
    for (int s = 0; s < n_paths; s++) {
        const int8_t *r = paths + (size_t)s * (size_t)depths;
        int cur = 0, d = 0;
        for (; d < depths && r[d] >= 0; d++) {
            int next = -1;
            for (int i = cur + 1; i < t->n; i++)
                if (t->parent[i] == cur && t->rank[i] == r[d]) {
                    next = i;
                    break;
                }
            if (next < 0)
                break;
            cur = next;
        }
        total += d + 1;
    }
    return (double)total / n_paths;
}

static bool plan_is_leaf(const ctl_template *t, int i)
{
    for (int j = i + 1; j < t->n; j++)
        if (t->parent[j] == i)
            return false;
    return true;
}

/* t without node i (a leaf): later nodes shift down, parents renumbered. */
static void plan_remove(const ctl_template *t, int i, ctl_template *out)
{
    out->n = 0;
    for (int j = 0; j < t->n; j++) {
        if (j == i)
            continue;
        int k = out->n++;
        int p = t->parent[j];
        out->parent[k] = p > i ? p - 1 : p;
        out->rank[k] = t->rank[j];
        out->depth[k] = t->depth[j];
    }
}

double ctl_plan_refine(ctl_template *t, const int8_t *paths, int n_paths, int depths, int ranks,
                       int rounds)
{
    double best = ctl_plan_eval(t, paths, n_paths, depths);
    ctl_template cand, trial; /* 6 KiB each, like keep below */
    for (int round = 0; round < rounds; round++) {
        bool moved = false;
        double round_best = best;
        ctl_template keep = *t;
        for (int leaf = 1; leaf < t->n; leaf++) {
            if (!plan_is_leaf(t, leaf))
                continue;
            plan_remove(t, leaf, &cand);
            for (int p = 0; p < cand.n; p++) {
                if (cand.depth[p] >= depths)
                    continue;
                for (int r = 0; r < ranks; r++) {
                    if (plan_has(&cand, p, r))
                        continue;
                    if (p == (t->parent[leaf] > leaf ? t->parent[leaf] - 1 : t->parent[leaf]) &&
                        r == t->rank[leaf])
                        continue; /* where it was */
                    trial = cand;
                    int k = trial.n++;
                    trial.parent[k] = p;
                    trial.rank[k] = r;
                    trial.depth[k] = cand.depth[p] + 1;
                    double m = ctl_plan_eval(&trial, paths, n_paths, depths);
                    if (m > round_best + 1e-12) {
                        round_best = m;
                        keep = trial;
                        moved = true;
                    }
                }
            }
        }
        if (!moved)
            break;
        *t = keep;
        best = round_best;
    }
    return best;
}

int ctl_plan_best_width(const int *widths, const double *seconds, const double *tokens, int n)
{
    int best = -1;
    double rate = 0;
    for (int i = 0; i < n; i++) {
        if (seconds[i] <= 0)
            continue;
        double r = tokens[i] / seconds[i];
        if (best < 0 || r > rate || (r == rate && widths[i] < widths[best])) {
            best = i;
            rate = r;
        }
    }
    return best;
}

/* ===== the branch threshold ===== */

void ctl_branch_init(ctl_branch *b, float min)
{
    *b = (ctl_branch){.min = min, .value = min};
}

void ctl_branch_update(ctl_branch *b, int points, int side)
{
    b->points += points;
    b->side += side;
    b->quiet = points ? 0 : b->quiet + 1;
    if (b->points >= CTL_BRANCH_WINDOW) {
        double frac = (double)b->side / b->points;
        if (frac < 0.1)
            b->value = b->value * 2 > 1.0f ? 1.0f : b->value * 2;
        else if (frac > 0.25)
            b->value = b->value / 2 < b->min ? b->min : b->value / 2;
        b->points = b->side = 0;
    } else if (b->quiet >= CTL_BRANCH_QUIET && b->value > b->min) {
        b->value = b->value / 2 < b->min ? b->min : b->value / 2;
        b->quiet = 0;
    }
}

/* ===== prompt lookup inside a free run ===== */

void ctl_lookup_init(ctl_lookup *l)
{
    for (int k = 0; k < CTL_LOOKUP_ORDERS; k++) {
        l->hits[k] = CTL_LOOKUP_PRIOR_HITS;
        l->tries[k] = CTL_LOOKUP_PRIOR_TRIES;
    }
}

static int lookup_order(int k)
{
    return k < 1 ? 1 : k >= CTL_LOOKUP_ORDERS ? CTL_LOOKUP_ORDERS - 1 : k;
}

double ctl_lookup_p(const ctl_lookup *l, int k)
{
    k = lookup_order(k);
    return l->tries[k] > 0 ? (double)l->hits[k] / l->tries[k] : 0.0;
}

void ctl_lookup_record(ctl_lookup *l, int k, int drafted, int accepted)
{
    if (drafted <= 0)
        return;
    k = lookup_order(k);
    accepted = accepted < 0 ? 0 : accepted > drafted ? drafted : accepted;
    int checked = accepted < drafted ? accepted + 1 : drafted;
    l->hits[k] = l->hits[k] * CTL_LOOKUP_DECAY + (float)accepted;
    l->tries[k] = l->tries[k] * CTL_LOOKUP_DECAY + (float)checked;
}

int ctl_lookup_lengths(const ctl_lookup *l, int n, const int *order, const int *avail,
                       const float *cost, int wmax, int *d)
{
    enum { ROWS = 64 };
    double p[ROWS], next[ROWS];
    int cur[ROWS], added[ROWS * 2], n_added = 0;
    for (int r = 0; r < n; r++)
        d[r] = 0;
    if (n < 1 || n > ROWS || n >= wmax || !cost || !(cost[n] > 0))
        return n;
    for (int r = 0; r < n; r++) {
        cur[r] = 0;
        p[r] = ctl_lookup_p(l, order[r]);
        next[r] = p[r];
    }
    double e = n, base = n / (double)cost[n], best = base;
    int best_w = n;
    for (int w = n + 1; w <= wmax && n_added < ROWS * 2; w++) {
        int r = -1;
        for (int i = 0; i < n; i++)
            if (cur[i] < avail[i] && (r < 0 || next[i] > next[r]))
                r = i;
        if (r < 0 || !(cost[w] > 0))
            break;
        e += next[r];
        next[r] *= p[r];
        cur[r]++;
        added[n_added++] = r;
        if (e / cost[w] > best) {
            best = e / cost[w];
            best_w = w;
        }
    }
    if (best < base * CTL_LOOKUP_MARGIN)
        return n;
    for (int i = 0; i < best_w - n; i++)
        d[added[i]]++;
    return best_w;
}

static int cost_monotone(float *cost, int wmax)
{
    for (int x = 2; x <= wmax; x++)
        if (cost[x] < cost[x - 1])
            cost[x] = cost[x - 1];
    return wmax;
}

int ctl_cost_curve(const int *w, const double *t, int n, int wcap, float *cost)
{
    if (n < 2 || w[0] != 1 || wcap < 2)
        return 0;
    int pw = 0;
    for (int j = 0; j < n; j++) {
        if (w[j] <= pw || !(t[j] > 0))
            return 0;
        for (int x = pw + 1; x <= w[j] && x <= wcap; x++)
            cost[x] = (float)((j ? t[j - 1] + (t[j] - t[j - 1]) * (x - pw) / (w[j] - pw) : t[0]) /
                              t[0]);
        if (w[j] >= wcap)
            return cost_monotone(cost, wcap);
        pw = w[j];
    }
    return cost_monotone(cost, pw);
}

/* ===== the split ratios ===== */

/* Move up to `amount` of group k's share from part a to part b (no more than a has); returns
 * what moved. */
static float split_move(float *c, int P, int k, int a, int b, float amount)
{
    float t = c[k * P + a] < amount ? c[k * P + a] : amount;
    if (t <= 0)
        return 0;
    c[k * P + a] -= t;
    c[k * P + b] += t;
    return t;
}

int ctl_split_search(const ctl_split_opts *o, const double *part_ms, ctl_split_eval eval,
                     void *arg, float *best, double *best_ms, int *rounds)
{
    int G = o->groups, P = o->parts;
    if (G < 1 || G > CTL_SPLIT_MAX_GROUPS || P < 1 || P > CTL_SPLIT_MAX_PARTS || !(o->delta > 0) ||
        !(o->min_delta > 0))
        return -1;
    size_t one = (size_t)G * (size_t)P;
    /* candidates of a round, for each ordered pair of parts: each group, and all groups at once,
     * moved from one to the other; and each group moved one way while the others move back
     * (kinds of work that run better on different parts) */
    int pairs = P * (P - 1);
    int most = (2 * G + 1) * pairs + 1;
    float *cand = malloc((size_t)most * one * sizeof *cand);
    double *ms = malloc((size_t)most * sizeof *ms);
    if (!cand || !ms) {
        free(cand);
        free(ms);
        return -1;
    }
    double speed[CTL_SPLIT_MAX_PARTS], total = 0;
    for (int p = 0; p < P; p++) {
        speed[p] = part_ms && part_ms[p] > 0 ? 1.0 / part_ms[p] : 1.0;
        total += speed[p];
    }
    for (int g = 0; g < G; g++) /* nothing can run alone: an even start */
        for (int p = 0; p < P; p++)
            best[g * P + p] = total > 0 ? (float)(speed[p] / total) : 1.0f / (float)P;
    int rc = -1, r = 0;
    if (eval(best, 1, best_ms, arg))
        goto out;
    double delta = o->delta;
    for (; r < o->max_rounds && delta >= o->min_delta; r++) {
        /* candidate 0 is the current split, timed again beside its neighbours */
        memcpy(cand, best, one * sizeof *cand);
        int n = 1;
        for (int g = 0; g <= G; g++) /* g == G: every group */
            for (int a = 0; a < P; a++)
                for (int b = 0; b < P; b++) {
                    if (a == b)
                        continue;
                    float *c = cand + (size_t)n * one;
                    memcpy(c, best, one * sizeof *c);
                    bool moved = false;
                    for (int k = g == G ? 0 : g; k < (g == G ? G : g + 1); k++)
                        moved |= split_move(c, P, k, a, b, (float)delta) > 0;
                    n += moved;
                }
        for (int g = 0; G > 1 && g < G; g++)
            for (int a = 0; a < P; a++)
                for (int b = 0; b < P; b++) {
                    float *c = cand + (size_t)n * one;
                    if (a == b || best[g * P + a] <= 0)
                        continue;
                    memcpy(c, best, one * sizeof *c);
                    float t = split_move(c, P, g, a, b, (float)delta);
                    for (int h = 0; h < G; h++) /* the others give back t in all */
                        if (h != g)
                            split_move(c, P, h, b, a, t / (float)(G - 1));
                    n++;
                }
        if (n == 1)
            break;
        if (eval(cand, n, ms, arg))
            goto out;
        int pick = 1;
        for (int i = 2; i < n; i++)
            pick = ms[i] < ms[pick] ? i : pick;
        *best_ms = ms[0];
        if (ms[pick] < ms[0] * (1.0 - o->margin)) {
            memcpy(best, cand + (size_t)pick * one, one * sizeof *best);
            *best_ms = ms[pick];
        } else {
            delta /= 2;
        }
    }
    rc = 0;
out:
    if (rounds)
        *rounds = r;
    free(cand);
    free(ms);
    return rc;
}

int ctl_device_choice(const double *part_ms, const char *const *names, int parts, double split_ms,
                      double margin, char *why, size_t len)
{
    int fast = -1;
    for (int p = 0; p < parts; p++)
        if (isfinite(part_ms[p]) && (fast < 0 || part_ms[p] < part_ms[fast]))
            fast = p;
    size_t at = 0;
    why[0] = 0;
    for (int p = 0; p < parts && at < len; p++) /* who cannot run alone */
        if (!isfinite(part_ms[p]))
            at += (size_t)snprintf(why + at, len - at, "%s cannot hold the model alone; ",
                                   names[p]);
    if (at >= len)
        at = len - 1;
    if (fast < 0) {
        snprintf(why + at, len - at, "no part can hold the model alone: the split (%.3f ms)",
                 split_ms);
        return -1;
    }
    if (split_ms < part_ms[fast] * (1.0 - margin)) {
        snprintf(why + at, len - at, "the split %.3f ms, %.2fx the %s alone (%.3f ms): the split",
                 split_ms, part_ms[fast] / split_ms, names[fast], part_ms[fast]);
        return -1;
    }
    snprintf(why + at, len - at, "%s alone %.3f ms; the split %.3f ms does not beat it by %.0f%%: "
                                 "%s alone",
             names[fast], part_ms[fast], split_ms, margin * 100, names[fast]);
    return fast;
}
