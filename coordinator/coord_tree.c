/*
 * coordinator/coord_tree.c — from the speculators' drafts to the tree one verification checks,
 * and the controllers that learn from each verification.
 *
 * Merging (Minions' collective drafting): every speculator's draft tree is added to one token trie
 * rooted at the last committed token; a node that several speculators proposed (same token path)
 * carries the sum of their weights. The vote then picks what is verified within the width budget:
 *   majority  level by level, the child with the largest summed weight (one chain);
 *   union     the heaviest nodes whose parents are kept, until the budget is spent (a tree, in the
 *             spirit of SpecInfer's merged token trees);
 *   off       the draft of the single speculator with the largest weight.
 * Weights come from each speculator's average acceptance rate (ACR): above the reward threshold a
 * weight grows by the reward factor, below the punish threshold it shrinks by the punish factor.
 *
 * Adaptive speculation length (Minions): each verification contributes a sample of
 * t_target / verified_length (step time per token it yielded). Every `decision` samples, a
 * least-squares line is fitted through the last `window` samples; a rising cost per token shortens
 * the speculation length by s_punish, a falling one lengthens it by s_reward, within [1, width-1].
 * The length travels to the speculators as the draft's maximum depth; LLMCad's alpha works inside
 * it: a speculator stops growing its tree earlier when its tree-cumulative confidence falls below
 * alpha. So Minions sets how far a draft may reach, LLMCad decides how far it is worth reaching.
 */
#include <string.h>

#include "coordinator/coord.h"

void coord_tree_init(coord_tree *t, int32_t root)
{
    t->n = 1;
    t->tokens[0] = root;
    t->parent[0] = -1;
    t->weight[0] = 0;
    t->owners[0] = 0;
}

/* The child of node p carrying token tok, or -1. */
static int tree_child(const coord_tree *t, int p, int32_t tok)
{
    for (int i = p + 1; i < t->n; i++)
        if (t->parent[i] == p && t->tokens[i] == tok)
            return i;
    return -1;
}

void coord_tree_add(coord_tree *t, const arena_draft *d, float w, int owner)
{
    int map[ARENA_DRAFT_MAX];
    for (uint32_t i = 0; i < d->n && i < ARENA_DRAFT_MAX; i++) {
        int p = d->parent[i] < 0 ? 0 : ((uint32_t)d->parent[i] < i ? map[d->parent[i]] : -1);
        if (p < 0) { /* malformed parent: ignore the subtree */
            map[i] = -1;
            continue;
        }
        int c = tree_child(t, p, d->tokens[i]);
        if (c < 0) {
            if (t->n == COORD_TREE_CAP) {
                map[i] = -1;
                continue;
            }
            c = t->n++;
            t->tokens[c] = d->tokens[i];
            t->parent[c] = p;
            t->weight[c] = 0;
            t->owners[c] = 0;
        }
        t->weight[c] += w;
        t->owners[c] |= 1u << owner;
        map[i] = c;
    }
}

/* Copy nodes keep[0..n) (each parent kept before its children) into out, renumbered. */
static void tree_select(const coord_tree *in, const int *keep, int n, coord_tree *out)
{
    int map[COORD_TREE_CAP];
    for (int i = 0; i < in->n; i++)
        map[i] = -1;
    out->n = 0;
    for (int k = 0; k < n; k++) {
        int i = keep[k];
        int j = out->n++;
        map[i] = j;
        out->tokens[j] = in->tokens[i];
        out->parent[j] = in->parent[i] < 0 ? -1 : map[in->parent[i]];
        out->weight[j] = in->weight[i];
        out->owners[j] = in->owners[i];
    }
}

void coord_tree_vote(const coord_tree *in, coord_vote mode, int max_nodes, coord_tree *out)
{
    int keep[COORD_TREE_CAP], n = 0;
    keep[n++] = 0;
    if (max_nodes > COORD_TREE_CAP)
        max_nodes = COORD_TREE_CAP;
    if (mode == VOTE_MAJORITY) {
        for (int cur = 0; n < max_nodes;) {
            int best = -1;
            for (int i = cur + 1; i < in->n; i++)
                if (in->parent[i] == cur && (best < 0 || in->weight[i] > in->weight[best]))
                    best = i;
            if (best < 0)
                break;
            keep[n++] = best;
            cur = best;
        }
    } else { /* union, and off (whose input holds one speculator's draft) */
        bool taken[COORD_TREE_CAP] = {true};
        while (n < max_nodes) {
            int best = -1;
            for (int i = 1; i < in->n; i++)
                if (!taken[i] && taken[in->parent[i]] &&
                    (best < 0 || in->weight[i] > in->weight[best] ||
                     (mode == VOTE_OFF && in->weight[i] == in->weight[best] && i < best)))
                    best = i;
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
    }
    tree_select(in, keep, n, out);
}

/* Depth of the deepest node of a draft, and how many of the accepted tokens follow one of its
 * paths from the root. */
void coord_tree_match(const arena_draft *d, const int32_t *acc, int n_acc, int *depth, int *matched)
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

void coord_acr_update(coord *c, coord_peer *p, int depth, int matched)
{
    if (depth <= 0)
        return;
    double rate = (double)matched / depth;
    p->acr_sum += rate;
    p->acr_n++;
    p->acr = p->acr_sum / (double)p->acr_n;
    if (p->acr > c->acr_reward_threshold)
        p->weight *= c->reward_factor;
    else if (p->acr < c->acr_punish_threshold)
        p->weight *= c->punish_factor;
    if (p->weight < 0.05)
        p->weight = 0.05;
    if (p->weight > 20)
        p->weight = 20;
}

void coord_adapt_sample(coord *c, double seconds_per_token)
{
    if (!c->adaptive)
        return;
    c->adapt_hist[c->adapt_n % COORD_ADAPT_WINDOW] = seconds_per_token;
    c->adapt_n++;
    if (c->adapt_n % (uint64_t)c->decision_threshold)
        return;
    int w = c->adapt_n < COORD_ADAPT_WINDOW ? (int)c->adapt_n : COORD_ADAPT_WINDOW;
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < w; i++) { /* oldest first */
        double y = c->adapt_hist[(c->adapt_n - (uint64_t)w + (uint64_t)i) % COORD_ADAPT_WINDOW];
        sx += i;
        sy += y;
        sxx += (double)i * i;
        sxy += i * y;
    }
    double den = w * sxx - sx * sx;
    double slope = den > 0 ? (w * sxy - sx * sy) / den : 0;
    int s = c->spec_len;
    if (slope > 0)
        s -= c->s_punish;
    else if (slope < 0)
        s += c->s_reward;
    int hi = c->width - 1;
    c->spec_len = s < 1 ? 1 : s > hi ? hi : s;
}
