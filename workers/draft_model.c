/*
 * workers/draft_model.c — the model drafters (model: a separate draft GGUF; layerskip: the target
 * with some layers): tree growth with LLMCad's confidence-paced branches, the private K/V or the
 * target's shared one, the chain worked ahead on while the target verifies, the alpha and branch
 * updates from each verification, and the placement (threads) chosen by measurement. The state:
 * workers/speculator_internal.h.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/ngram.h"
#include "workers/speculator_internal.h"

/* layerskip: keep --layers of the target (default its first half) */
static int spec_prepare_layerskip(spec *s, char *err, size_t errlen)
{
    int n_layers = s->model->cfg.n_layers, list[4096];
    int n;
    if (s->layers_s) {
        n = spec_parse_layers(s->layers_s, n_layers, list, err, errlen);
        if (n < 0)
            return -1;
    } else {
        n = n_layers / 2 ? n_layers / 2 : 1;
        for (int i = 0; i < n; i++)
            list[i] = i;
    }
    s->layers_prefix = true;
    for (int i = 0; i < n; i++)
        s->layers_prefix &= list[i] == i;
    return llama_model_keep_layers(s->model, list, n, err, errlen);
}

/* a tree when the context leaves room for it */
static int spec_grow_model_room(spec *s)
{
    return s->n_committed >= 1 && s->n_committed + s->max_depth + 1 < s->n_ctx ? spec_grow_model(s)
                                                                               : 0;
}

const drafter drafter_model = {"model", SPEC_MODEL, true, NULL, spec_grow_model_room};
const drafter drafter_layerskip = {"layerskip", SPEC_LAYERSKIP, true, spec_prepare_layerskip,
                                   spec_grow_model_room};

/* "0-14" or "0,2,4-6" -> layer list. */
int spec_parse_layers(const char *spec_s, int n_layers, int *out, char *err, size_t errlen)
{
    int n = 0;
    const char *p = spec_s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p)
            goto bad;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1)
                goto bad;
            p = end;
        }
        for (long i = a; i <= b; i++) {
            if (n >= n_layers || i < 0 || i >= n_layers)
                goto bad;
            out[n++] = (int)i;
        }
        if (*p == ',')
            p++;
        else if (*p)
            goto bad;
    }
    return n;
bad:
    snprintf(err, errlen, "--layers '%s': expected indices or ranges within 0..%d", spec_s,
             n_layers - 1);
    return -1;
}

/* kv_shared: make the draft context's tree exactly the chain of tokens[n_committed - 1, kv_len)
 * (fewer rows when kv_len was cut back: the rest is dropped); with nothing past the target's
 * committed prefix the tree is empty and the context's prefix is that prefix. */
int spec_shared_fit(spec *s)
{
    int base = s->n_committed - 1, want = s->kv_len - base;
    if (s->tree_branchy) { /* a grown draft: nothing of it is a chain of the context */
        s->tree_branchy = false;
        s->tree_rows = 0;
    }
    if (want < 0) {
        want = 0;
        s->kv_len = base;
    }
    if (want > s->tree_rows) { /* cannot happen: kv_len only grows by extending the tree */
        s->kv_len = base + s->tree_rows;
        want = s->tree_rows;
    }
    if (want == 0) {
        s->tree_rows = 0;
        llama_ctx_set_prefix_len(s->ctx, base);
        return 0;
    }
    if (want < s->tree_rows) {
        int32_t path[ARENA_DRAFT_MAX];
        for (int i = 0; i < want; i++)
            path[i] = i;
        char err[256];
        if (llama_tree_keep_path(s->ctx, path, want, 0, err, sizeof err)) {
            rt_log(s->role, "draft model: %s", err);
            s->tree_rows = 0;
            s->kv_len = base;
            llama_ctx_set_prefix_len(s->ctx, base);
            return -1;
        }
        s->tree_rows = want;
    }
    return 0;
}

/* kv_shared: cover tokens[0 .. upto): the target's prefix holds the committed ones, the tree the
 * rest (forwarded one chain batch, the logits of the last into `logits`). */
static int spec_shared_extend(spec *s, int upto)
{
    if (spec_shared_fit(s))
        return -1;
    int base = s->n_committed - 1;
    if (upto <= s->kv_len)
        return 0;
    int n = upto - s->kv_len, at = s->tree_rows;
    if (at + n > ARENA_DRAFT_MAX) {
        rt_log(s->role, "draft model: a chain of %d rows is past the draft width %d", at + n,
               ARENA_DRAFT_MAX);
        return -1;
    }
    int32_t par[ARENA_DRAFT_MAX];
    for (int i = 0; i < n; i++)
        par[i] = at + i - 1; /* a chain: the root's parent is the prefix (-1) */
    llama_batch b = {.n = n,
                     .tokens = s->tokens + s->kv_len,
                     .parent = par,
                     .logits_from = n - 1,
                     .append = at > 0};
    char err[256];
    if (at == 0)
        llama_ctx_set_prefix_len(s->ctx, base);
    if (llama_forward(s->ctx, &b, s->logits, err, sizeof err)) {
        rt_log(s->role, "draft model: %s", err);
        s->tree_rows = 0;
        s->kv_len = base;
        s->logits_at = -1;
        return -1;
    }
    s->tree_rows = at + n;
    s->kv_len = s->logits_at = upto;
    return 0;
}

/* Make the private KV cover tokens[0 .. upto) (committed tokens, then the main branch of the last
 * draft when the speculator works ahead). */
static int spec_catch_up(spec *s, int upto)
{
    if (s->kv_len >= upto)
        return 0;
    if (s->kv_shared)
        return spec_shared_extend(s, upto);
    char err[256];
    llama_ctx_set_prefix_len(s->ctx, s->kv_len);
    s->logits_at = -1;
    s->tree_ok = false; /* this forward overwrites the tree area */
    /* a long prompt in chunks, with a sign of life between them (the heartbeat thread) */
    while (s->kv_len < upto) {
        int n = upto - s->kv_len < SPEC_PREFILL_CHUNK ? upto - s->kv_len : SPEC_PREFILL_CHUNK;
        if (llama_prefill(s->ctx, s->tokens + s->kv_len, n, s->logits, err, sizeof err)) {
            rt_log(s->role, "draft model: %s", err);
            return -1;
        }
        s->kv_len += n;
        rt_stamp(&s->life.alive_us); /* a sign of life between chunks: the heartbeats go on */
    }
    s->kv_len = s->logits_at = upto;
    return 0;
}

/* Forget KV rows from `len` on (computed for tokens that are no longer there), and the next-token
 * logits if they came from those rows. */
void spec_kv_truncate(spec *s, int len)
{
    if (s->kv_len > len)
        s->kv_len = len;
    if (s->logits_at > s->kv_len)
        s->logits_at = -1;
}

/* Most probable first, ties to the lower id: the k best are then the first k of one order, so the
 * best candidate is the same whatever k is (the work-ahead asks for 2, the tree decoder for 4). */
/* The k most probable tokens of a logits row (softmax), best first: out[i] = {prob, id}. */
static int spec_top(const float *logits, int V, int k, float (*out)[2])
{
    /* the k largest logits in one pass (ties: the lower id), then one vectorised pass for the
     * softmax denominator: the drafter calls this once per leaf per round over the whole vocabulary
     */
    int32_t ids[4];
    int n = k_top(logits, V, k < 4 ? k : 4, ids);
    if (!n)
        return 0;
    float mx = logits[ids[0]], sum = k_sum_exp(logits, V, mx);
    for (int j = 0; j < n; j++) {
        out[j][0] = sum > 0 ? expf(logits[ids[j]] - mx) / sum : 0.0f;
        out[j][1] = (float)ids[j];
    }
    return n;
}

/* One round of LLMCad's tree growth over nodes[0 .. *n) (each forwarded; rows[i + 1] their
 * logits, rows[0] the root's while the tree is empty). The pacer gives branch x the share
 * M * C_x / sum(C) of the node budget M (C: the branch's cumulative confidence) and extends the
 * open leaves furthest below their share first (max-min fairness). A leaf's best candidate extends
 * its branch; other candidates whose probability passes the branch threshold open new branches.
 * Returns the nodes grown; 0 also when the tree-cumulative confidence (the best branch's C) has
 * dropped below alpha — LLMCad's fallback: time to verify. */
int spec_grow_round(const spec *s, spec_node *nodes, int *n_io, int max_nodes, int max_depth,
                    const float *const *rows)
{
    int V = s->model->cfg.vocab, n = *n_io;
    int leaves[ARENA_DRAFT_MAX + 1], n_leaves = 0;
    double total = 0;
    if (n == 0) {
        leaves[n_leaves++] = -1;
        total = 1;
    }
    for (int i = 0; i < n; i++)
        if (!nodes[i].children && nodes[i].depth < max_depth) {
            leaves[n_leaves++] = i;
            total += nodes[i].cum;
        }
    if (!n_leaves)
        return 0;
    double deficit[ARENA_DRAFT_MAX + 1];
    for (int l = 0; l < n_leaves; l++) {
        const spec_node *nd = leaves[l] < 0 ? NULL : &nodes[leaves[l]];
        double c = nd ? nd->cum : 1.0;
        deficit[l] = max_nodes * c / (total > 0 ? total : 1) - (nd ? nd->depth : 0);
    }
    for (int a = 1; a < n_leaves; a++) /* insertion sort, largest deficit first */
        for (int b = a; b > 0 && deficit[b] > deficit[b - 1]; b--) {
            double td = deficit[b];
            deficit[b] = deficit[b - 1];
            deficit[b - 1] = td;
            int tl = leaves[b];
            leaves[b] = leaves[b - 1];
            leaves[b - 1] = tl;
        }
    int grown = 0;
    for (int l = 0; l < n_leaves && n < max_nodes; l++) {
        int leaf = leaves[l];
        if (n > 0 && deficit[l] <= 0 && grown)
            break; /* this branch already has its share: let the others catch up next round */
        float top[4][2];
        int k = spec_top(rows[leaf + 1], V, s->tree ? 4 : 1, top);
        double base = leaf < 0 ? 1.0 : nodes[leaf].cum;
        int depth = leaf < 0 ? 1 : nodes[leaf].depth + 1;
        for (int c = 0; c < k && n < max_nodes; c++) {
            if (c > 0 && top[c][0] < s->branch.value)
                break;
            nodes[n] = (spec_node){.token = (int32_t)top[c][1],
                                   .parent = leaf,
                                   .conf = top[c][0],
                                   .cum = base * top[c][0],
                                   .depth = depth};
            if (leaf >= 0)
                nodes[leaf].children++;
            n++;
            grown++;
        }
    }
    *n_io = n;
    double tc = 0; /* tree-cumulative confidence: the best branch */
    for (int i = 0; i < n; i++)
        if (!nodes[i].children && nodes[i].cum > tc)
            tc = nodes[i].cum;
    return tc < s->alpha ? 0 : grown;
}

/* Grow a draft tree for the committed context with the draft model (LLMCad's tree generation).
 *
 * The trunk: when the Feedback confirmed everything the speculator had drafted ahead (see
 * spec_work_ahead), the rest of that chain already continues this very context, its K/V computed
 * or nearly. Its tokens are the drafter's best candidates, so as long as no other candidate at a
 * parent passes the branch threshold, growth from scratch would make exactly these nodes, one per
 * round (confidences multiplying, stopped by the same budget and alpha): they are taken as they
 * are, and the tree grows below the last of them — the draft is the one growth from scratch gives,
 * only sooner. If the trunk reaches the budget or alpha the draft is ready without a forward.
 *
 * Growth: the first round runs the root alone (the last committed token, or the trunk's last
 * token) as a fresh tree, each later round appends only the nodes the previous round grew (the tree
 * decoder: the tree mask keeps branches apart, the earlier nodes' K/V stay in the tree area), so
 * every node is forwarded once and a chain of depth d costs d token-forwards, not 1 + 2 + ... + d.
 * Appending gives bit-identical logits to re-running the whole tree (tests/unit/test_draft_kv.c),
 * so the tree is the one a full forward per round grows. After each round the leaves the
 * confidence-based pacer picks are extended (spec_grow_round). Growth stops when the
 * tree-cumulative confidence drops below alpha or the budget (nodes, depth) is spent. */
int spec_grow_model(spec *s)
{
    int V = s->model->cfg.vocab, n = 0;
    double cum = 1.0;
    for (;;) {
        if (n >= s->max_depth || n >= s->max_nodes || cum < s->alpha)
            return n; /* growth would stop here too */
        if (n >= s->n_chain || (s->tree && s->chain_alt[n] >= s->branch.value))
            break; /* growth would branch at this parent: the tree decoder takes over */
        cum *= s->chain_conf[n];
        s->nodes[n] = (spec_node){.token = s->tokens[s->n_committed + n],
                                  .parent = n - 1,
                                  .conf = s->chain_conf[n],
                                  .cum = cum,
                                  .depth = n + 1};
        if (n > 0)
            s->nodes[n - 1].children = 1;
        n++;
    }
    int m = n;                     /* trunk nodes; node m - 1 is the root of the growth below */
    int base = s->n_committed + m; /* tokens up to and including the root */
    /* kv_shared: the tree is the chain up to the growth root (exclusive), node i at tree index
     * i + 1; otherwise the tree starts at the growth root, node i at tree index i - m + 1 */
    bool sh = s->kv_shared;
    if (sh && s->kv_len > base - 1)
        s->kv_len = base - 1;
    if (spec_catch_up(s, base - 1) || (sh && spec_shared_fit(s)))
        return m;
    int32_t tok[ARENA_DRAFT_MAX + 1], par[ARENA_DRAFT_MAX + 1];
    char err[256];
    int n_run = m; /* nodes already forwarded */
    if (!sh)
        llama_ctx_set_prefix_len(s->ctx, base - 1);
    if (sh && m + 1 + s->max_nodes > ARENA_DRAFT_MAX)
        return m; /* no room for the growth past the trunk */
    /* each trunk node took one round of growth from scratch: the rounds go on from there */
    for (int round = m; round < s->max_depth && n < s->max_nodes; round++) {
        /* tree index 0 is the root, node i >= m is tree index i - m + 1 */
        llama_batch b = {
            .tokens = tok, .parent = par, .logits_from = 0, .append = round > m || (sh && m > 0)};
        if (round == m) {
            tok[0] = s->tokens[base - 1];
            par[0] = sh ? m - 1 : -1;
            b.n = 1;
        } else {
            for (int i = n_run; i < n; i++) {
                tok[i - n_run] = s->nodes[i].token;
                par[i - n_run] = s->nodes[i].parent - (sh ? -1 : m - 1);
            }
            b.n = n - n_run;
        }
        float *out = s->tree_logits + (size_t)(round == m ? 0 : n_run - m + 1) * V;
        if (llama_forward(s->ctx, &b, out, err, sizeof err)) {
            rt_log(s->role, "draft model: %s", err);
            if (sh)
                s->tree_branchy = true; /* whatever the tree holds now, it is no chain */
            break;
        }
        if (sh) {
            s->tree_rows = round == m ? m + 1 : s->tree_rows + b.n;
            s->tree_branchy = true;
            s->logits_at = -1; /* the chain's last logits were for a row now past the tree */
        }
        n_run = n;
        /* node i's logits: tree row i - m + 1 (the growth root's, row 0, for node m - 1 or, with
         * no trunk, for the root itself) */
        const float *rows[ARENA_DRAFT_MAX + 1];
        for (int i = m - 1; i < n; i++)
            rows[i + 1] = s->tree_logits + (size_t)(i - m + 1) * V;
        if (!spec_grow_round(s, s->nodes, &n, s->max_nodes, s->max_depth, rows))
            break;
    }
    s->tree_ok = m == 0 && n_run > 0;
    s->tree_run = n_run;
    s->tree_root_pos = base - 1;
    return n;
}

/* The main branch of the published tree: its most confident leaf's path, leaf first (node
 * indices into out); returns its length. */
static int spec_main_branch(const spec *s, int *out)
{
    int best = -1, n = 0;
    for (int i = 0; i < s->n_nodes; i++)
        if (!s->nodes[i].children && (best < 0 || s->nodes[i].cum > s->nodes[best].cum))
            best = i;
    for (int i = best; i >= 0; i = s->nodes[i].parent)
        out[n++] = i;
    return n;
}

/* The main branch of the published tree (the most confident leaf's path), as the chain the
 * speculator works ahead on while the target verifies. A chain drafted ahead that the branch
 * begins (the branch was its trunk) is kept whole; otherwise K/V rows past the part both share
 * were computed for other tokens and are dropped. */
void spec_set_chain(spec *s)
{
    int path[ARENA_DRAFT_MAX], n = spec_main_branch(s, path);
    if (s->n_committed + n >= SPEC_MAX_TOKENS)
        n = 0;
    int same = 0;
    while (same < n && same < s->n_chain &&
           s->tokens[s->n_committed + same] == s->nodes[path[n - 1 - same]].token)
        same++;
    s->n_pub = n;
    if (same == n && s->n_chain >= n)
        return;
    for (int i = 0; i < n; i++) {
        s->tokens[s->n_committed + i] = s->nodes[path[n - 1 - i]].token;
        s->chain_conf[i] = s->nodes[path[n - 1 - i]].conf;
        s->chain_alt[i] = 1.0f; /* not recorded in the tree: never a trunk node */
    }
    s->n_chain = n;
    spec_kv_truncate(s, s->n_committed + same);
}

/* The tree indices of the published main branch that the growth forwarded: the root (0), then
 * its nodes root first while forwarded, the leaf left out (the work-ahead forwards it for its
 * logits). Returns how many. */
static int spec_main_branch_rows(const spec *s, int32_t *path)
{
    int chain[ARENA_DRAFT_MAX], n = spec_main_branch(s, chain), len = 0;
    path[len++] = 0;
    for (int k = n - 1; k >= 0 && chain[k] < s->tree_run && len <= n - 1; k--)
        path[len++] = chain[k] + 1;
    return len;
}

/* Drafting ahead starts from the published tree's main branch: its rows that the growth already
 * forwarded move from the tree area into the prefix (root first), so the work-ahead only computes
 * the branch's last token and what lies beyond, instead of forwarding the branch again. */
void spec_keep_main_branch(spec *s)
{
    if (s->kv_shared) { /* the tree becomes the main branch's chain (drafting ahead or not: the
                         * next Feedback may confirm it and keep the rows past what it commits) */
        if (!s->tree_branchy || s->n_nodes <= 0)
            return;
        int32_t path[ARENA_DRAFT_MAX + 1];
        int len = spec_main_branch_rows(s, path);
        char err[256];
        s->tree_branchy = false;
        if (llama_tree_keep_path(s->ctx, path, len, 0, err, sizeof err)) {
            rt_log(s->role, "draft model: %s", err);
            s->tree_rows = 0;
            s->kv_len = s->n_committed - 1;
            llama_ctx_set_prefix_len(s->ctx, s->kv_len);
            return;
        }
        s->tree_rows = len;
        s->kv_len = s->n_committed - 1 + len;
        s->logits_at = -1;
        return;
    }
    if (!s->work_ahead || !s->tree_ok || s->kv_len != s->tree_root_pos || s->n_nodes <= 0)
        return;
    int32_t path[ARENA_DRAFT_MAX + 1];
    int len = spec_main_branch_rows(s, path);
    s->tree_ok = false;
    char err[256];
    if (llama_commit(s->ctx, path, len, err, sizeof err)) {
        rt_log(s->role, "draft model: %s", err);
        return;
    }
    s->kv_len += len;
    s->logits_at = -1;
}

/* May the chain grow by one more token drafted ahead? Up to the predicted correction/bonus token
 * and a whole next draft's depth past the published main branch — what the next draft needs if
 * the target accepts everything — and never past the target's context. */
static bool spec_may_extend(const spec *s)
{
    int end = s->n_committed + s->n_chain;
    if (s->kv_shared && s->n_chain + 2 + s->max_nodes > ARENA_DRAFT_MAX)
        return false; /* the chain's rows and the next growth share the draft width */
    return s->n_pub > 0 && s->n_chain < s->n_pub + 1 + s->max_depth &&
           s->n_chain < SPEC_CHAIN_MAX && end < s->target_ctx && end + 1 < SPEC_MAX_TOKENS &&
           end + 1 < s->n_ctx;
}

/* Work ahead while the target verifies (LLMCad's speculative generation): extend the private KV
 * along the main branch, and past its leaf draft further tokens greedily (the drafter's argmax),
 * so that when the Feedback shows the main branch and the correction/bonus token all as drafted,
 * the rest of the chain is the start of the next draft with its K/V in place (spec_grow_model's
 * trunk). At most one single-token forward per call: the caller polls its socket in between, so a
 * Feedback never waits longer than one draft-token forward. Returns whether there is more to do. */
bool spec_work_ahead(spec *s)
{
    if (!s->work_ahead || !s->ctx || !s->active || !s->published)
        return false;
    int end = s->n_committed + s->n_chain;
    /* the chain is covered but its last token's logits are gone: recompute that row */
    if (s->kv_len == end && s->logits_at != end && s->kv_len > s->n_committed && spec_may_extend(s))
        s->kv_len--;
    if (s->kv_len < end && (s->kv_len + 1 >= s->n_ctx || spec_catch_up(s, s->kv_len + 1)))
        return false;
    if (s->kv_len == end && s->logits_at == end && spec_may_extend(s)) {
        float top[2][2];
        int k = spec_top(s->logits, s->model->cfg.vocab, 2, top);
        s->tokens[end] = (int32_t)top[0][1];
        s->chain_alt[s->n_chain] = k > 1 ? top[1][0] : 0.0f;
        s->chain_conf[s->n_chain++] = top[0][0];
    }
    return s->kv_len < s->n_committed + s->n_chain;
}

/* LLMCad's threshold update from the verification of a tree we published (ctl_alpha_update). */
void spec_update_alpha(spec *s, const spec_node *nodes, int n_nodes, const int32_t *accepted,
                       int n_acc)
{
    if (!n_nodes || s->alpha_off)
        return;
    int32_t token[ARENA_DRAFT_MAX], parent[ARENA_DRAFT_MAX];
    for (int i = 0; i < n_nodes; i++)
        token[i] = nodes[i].token, parent[i] = nodes[i].parent;
    s->alpha = ctl_alpha_update(s->alpha, token, parent, n_nodes, accepted, n_acc);
}

/* Count the branch points of a tree we published on the accepted path, and the side branches the
 * target took there, for the branch threshold (ctl_branch_update). */
void spec_update_branch(spec *s, const spec_node *nodes, int n_nodes, const int32_t *accepted,
                        int n_acc)
{
    if (!s->tree || !n_nodes)
        return;
    int parent = -1, points = 0, side = 0;
    for (int k = 0; k < n_acc; k++) {
        int first = -1, hit = -1, kids = 0;
        for (int i = 0; i < n_nodes; i++)
            if (nodes[i].parent == parent) {
                kids++;
                if (first < 0)
                    first = i;
                if (hit < 0 && nodes[i].token == accepted[k])
                    hit = i;
            }
        if (hit < 0)
            break;
        if (kids > 1) {
            points++;
            side += hit != first;
        }
        parent = hit;
    }
    ctl_branch_update(&s->branch, points, side);
}

#define SPEC_SHARE_MIN 16 /* fewer missing rows than this are forwarded, not borrowed */

/* Private K/V batch slots hold a common beginning once, as the target's slots do (docs/memory.md,
 * "A common beginning held once"): before request q's slot gets rows for its tokens, every slot
 * borrowing rows of q's slot keeps borrowing only the positions its tokens share with q's (those
 * rows are written again with the same bytes), the rest copied into its own rows, and q's slot
 * borrows no further than the rows it keeps; then, when another live request's slot holds rows
 * of SPEC_SHARE_MIN or more of q's missing tokens, q's slot borrows them
 * (llama_kv_share_prefix) instead of forwarding them. */
static void spec_batch_share(spec *s, spec_req *q)
{
    int c = q->ctx_slot, best = 0, from = -1;
    for (int i = 0; i < RT_MAX_SEQ; i++) {
        spec_req *b = &s->reqs[i];
        int lender, lent;
        if (b == q || !b->request_id || b->ctx_slot <= 0 ||
            (lent = llama_kv_lent(s->ctx, b->ctx_slot, &lender)) == 0 || lender != c)
            continue;
        int k = ngram_common_prefix(b->tokens, b->kv_n, q->tokens, q->n - 1);
        if (lent > k)
            llama_kv_unshare(s->ctx, b->ctx_slot, k, true);
    }
    llama_kv_unshare(s->ctx, c, q->kv_n, false);
    if (q->n - 1 - q->kv_n < SPEC_SHARE_MIN)
        return;
    for (int i = 0; i < RT_MAX_SEQ; i++) {
        const spec_req *p = &s->reqs[i];
        if (p == q || !p->request_id || p->ctx_slot <= 0 || p->kv_n <= best)
            continue;
        int k = ngram_common_prefix(p->tokens, p->kv_n, q->tokens, q->n - 1);
        if (k > best)
            best = k, from = p->ctx_slot;
    }
    char err[256];
    if (from > 0 && best >= q->kv_n + SPEC_SHARE_MIN) {
        if (llama_kv_share_prefix(s->ctx, from, c, best, err, sizeof err)) {
            rt_log(s->role, "draft model: %s", err);
            return;
        }
        if (q->kv_n == 0)
            rt_log(s->role, "request %llu: %d committed rows borrowed from another request's",
                   (unsigned long long)q->request_id, best);
        q->kv_n = best;
    }
}

/* With a private K/V (every_request, no kv_shared): make each request's slot of the draft context
 * hold the rows of all its committed tokens but the last (the tree's root), borrowing what
 * another request's slot holds of them (spec_batch_share) and forwarding the missing ones of
 * every request together, up to the context's width a forward, each request's
 * run committed into its slot. Returns 0, or -1 (logged) when a forward fails: the slots then
 * hold what was committed before. */
int spec_batch_catch_up(spec *s, spec_req *const *reqs, int k)
{
    int W = s->ctx_params.max_width;
    int32_t tok[ARENA_DRAFT_MAX], par[ARENA_DRAFT_MAX], seq[ARENA_DRAFT_MAX];
    int take[SPEC_BATCH_MAX];
    char err[256];
    for (int r = 0; r < k; r++)
        spec_batch_share(s, reqs[r]);
    for (;;) {
        int nb = 0;
        for (int r = 0; r < k; r++) {
            spec_req *q = reqs[r];
            int want = q->n - 1 - q->kv_n;
            take[r] = want < W - nb ? want : W - nb;
            if (take[r] <= 0) {
                take[r] = 0;
                continue;
            }
            llama_ctx_set_seq_prefix_len(s->ctx, q->ctx_slot, q->kv_n);
            for (int i = 0; i < take[r]; i++, nb++) {
                tok[nb] = q->tokens[q->kv_n + i];
                par[nb] = i ? nb - 1 : -1;
                seq[nb] = q->ctx_slot;
            }
        }
        if (!nb)
            return 0;
        llama_batch b = {.n = nb, .tokens = tok, .parent = par, .seq = seq, .logits_from = nb - 1};
        if (llama_forward(s->ctx, &b, NULL, err, sizeof err)) {
            rt_log(s->role, "draft model (catching up a batch of %d): %s", k, err);
            return -1;
        }
        for (int r = 0, at = 0; r < k; at += take[r], r++) {
            int32_t path[ARENA_DRAFT_MAX];
            for (int i = 0; i < take[r]; i++)
                path[i] = at + i;
            if (take[r] && llama_commit(s->ctx, path, take[r], err, sizeof err)) {
                rt_log(s->role, "draft model (catching up a batch of %d): %s", k, err);
                return -1;
            }
            reqs[r]->kv_n += take[r];
        }
        rt_stamp(&s->life.alive_us); /* a sign of life between chunks: the heartbeats go on */
    }
}

/* Draft for k requests at once (every_request; k <= SPEC_BATCH_MAX): a tree per request, rooted at
 * its last committed token in its sequence slot of the draft context — slot r reading the
 * target's K/V of the request's slot (kv_shared), or the request's own slot of private K/V rows
 * (spec_batch_catch_up first) —, grown round by round as spec_grow_model grows one
 * (spec_grow_round); but each round's forward carries the new nodes of every request, so k
 * requests cost one forward of their joint width a round instead of k forwards. The tree area is
 * shared: each request gets at most ARENA_DRAFT_MAX / k - 1 nodes (and the Feedback's budget). No
 * trunk and no work-ahead: the tree area holds the batch. Each request's tree goes to
 * reqs[r]->nodes. */
void spec_grow_batch(spec *s, spec_req *const *reqs, int k)
{
    int V = s->model->cfg.vocab, budget = ARENA_DRAFT_MAX / k - 1;
    if (budget > s->max_nodes)
        budget = s->max_nodes;
    int32_t tok[ARENA_DRAFT_MAX], par[ARENA_DRAFT_MAX], seq[ARENA_DRAFT_MAX];
    /* request r's root at tree index at[r][0], its node i at at[r][i + 1]; ran[r]: its nodes
     * forwarded */
    int at[SPEC_BATCH_MAX][ARENA_DRAFT_MAX + 1], ran[SPEC_BATCH_MAX];
    bool open[SPEC_BATCH_MAX];
    char err[256];
    for (int r = 0; r < k; r++)
        reqs[r]->n_nodes = 0;
    if (!s->kv_shared && spec_batch_catch_up(s, reqs, k))
        return;
    for (int r = 0; r < k; r++) {
        spec_req *q = reqs[r];
        if (s->kv_shared) {
            q->ctx_slot = r;
            llama_ctx_map_prefix_source(s->ctx, r, q->slot);
        }
        llama_ctx_set_seq_prefix_len(s->ctx, q->ctx_slot, q->n - 1);
        tok[r] = q->tokens[q->n - 1];
        par[r] = -1;
        seq[r] = q->ctx_slot;
        at[r][0] = r;
        ran[r] = 0;
        open[r] = budget > 0;
    }
    llama_batch b = {.n = k, .tokens = tok, .parent = par, .seq = seq};
    if (llama_forward(s->ctx, &b, s->tree_logits, err, sizeof err)) {
        rt_log(s->role, "draft model (a batch of %d): %s", k, err);
        return;
    }
    int T = k; /* the tree's rows */
    for (int round = 0; round < s->max_depth; round++) {
        int nb = 0;
        for (int r = 0; r < k; r++) {
            spec_req *q = reqs[r];
            if (!open[r])
                continue;
            const float *rows[ARENA_DRAFT_MAX + 1];
            for (int i = -1; i < q->n_nodes; i++)
                rows[i + 1] = s->tree_logits + (size_t)at[r][i + 1] * V;
            open[r] = spec_grow_round(s, q->nodes, &q->n_nodes, budget, s->max_depth, rows) > 0 &&
                      q->n_nodes < budget;
            if (!open[r] || round + 1 >= s->max_depth)
                continue; /* its new nodes are leaves for good: no logits needed */
            for (int i = ran[r]; i < q->n_nodes; i++) {
                int pi = q->nodes[i].parent;
                tok[nb] = q->nodes[i].token;
                par[nb] = at[r][pi + 1];
                seq[nb] = q->ctx_slot;
                at[r][i + 1] = T + nb;
                nb++;
            }
            ran[r] = q->n_nodes;
        }
        if (!nb || round + 1 >= s->max_depth)
            break;
        llama_batch a = {.n = nb, .tokens = tok, .parent = par, .seq = seq, .append = true};
        if (llama_forward(s->ctx, &a, s->tree_logits + (size_t)T * V, err, sizeof err)) {
            rt_log(s->role, "draft model (a batch of %d): %s", k, err);
            for (int r = 0; r < k; r++) /* what was grown stands; nothing grows on it */
                open[r] = false;
            break;
        }
        T += nb;
    }
}

/* kv_shared, all n tokens of a Feedback as drafted ahead: the target has committed the root and
 * the first n - 1 of them, so the first n rows of the chain leave the tree (they are the target's
 * prefix now) and the rest stays, the last Feedback token its new root. Before n_committed moves. */
void spec_shared_advance(spec *s, int n)
{
    if (spec_shared_fit(s))
        return;
    int rows = s->tree_rows;
    if (rows > n) {
        int32_t path[ARENA_DRAFT_MAX];
        for (int i = 0; i < rows; i++)
            path[i] = i;
        char err[256];
        if (!llama_tree_keep_path(s->ctx, path, rows, n, err, sizeof err)) {
            s->tree_rows = rows - n;
            return;
        }
        rt_log(s->role, "draft model: %s", err);
    }
    /* nothing past the new root was forwarded: the tree starts afresh at the new prefix */
    s->tree_rows = 0;
    s->kv_len = s->n_committed + n - 1;
    llama_ctx_set_prefix_len(s->ctx, s->kv_len);
    if (s->logits_at < s->kv_len)
        s->logits_at = -1;
}

/* Apply a Feedback: keep the accepted part of the chain (and its KV), drop the rest. */
/* The accepted tokens that the last grown tree already forwarded keep their K/V: the tree's root
 * and the accepted path below it move from the tree area into the prefix (llama_commit) instead of
 * being forwarded again by the next catch-up — each drafted token is computed once. */
void spec_commit_accepted(spec *s, const int32_t *acc, int n)
{
    if (s->kv_shared) /* the target's prefix already holds them */
        return;
    if (!s->tree_ok || s->kv_len != s->tree_root_pos || s->n_nodes <= 0) {
        if (s->trace)
            rt_log(s->role, "no tree K/V to keep (tree %d, kv %d, root %d, nodes %d)", s->tree_ok,
                   s->kv_len, s->tree_root_pos, s->n_nodes);
        return;
    }
    s->tree_ok = false;
    int32_t path[ARENA_DRAFT_MAX + 1];
    int len = 0, parent = -1;
    path[len++] = 0;                  /* the root: the last committed token */
    for (int k = 0; k + 1 < n; k++) { /* not the last token: it is the next tree's root */
        int hit = -1;
        for (int i = 0; i < s->tree_run && i < s->n_nodes; i++)
            if (s->nodes[i].parent == parent && s->nodes[i].token == acc[k]) {
                hit = i;
                break;
            }
        if (hit < 0)
            break;
        path[len++] = hit + 1;
        parent = hit;
    }
    char err[256];
    if (llama_commit(s->ctx, path, len, err, sizeof err)) {
        rt_log(s->role, "draft model: %s", err);
        return;
    }
    s->kv_len += len;
    if (s->trace)
        rt_log(s->role, "kept the K/V of %d tree rows (root and %d accepted)", len, len - 1);
}

/* --target-kv: whether the draft model reads the target's committed K/V from the arena. `auto`
 * does when those rows are what the drafter would compute itself (or close to it): a model
 * drafter with the target's whole shape (layers, widths, heads, vocabulary), i.e. a re-quantized
 * copy; a layerskip drafter that keeps the target's first layers 0 .. n-1 (its layer l is the
 * target's layer l with the same input, so its K/V rows are the target's). `on` asks for it
 * (refused with the reason when the layers or attention shapes differ, or a layerskip list skips
 * a layer below its last); `off` keeps a private prefix. Shared, the speculator never prefills a
 * prompt or commits K/V — so after the guard has kept it idle it drafts at once instead of first
 * reading the whole context again; what it drafts ahead lives in its tree (the tokens past the
 * target's committed prefix have no rows there). Fills p for it. */
int spec_share_target_kv(spec *s, const Orochi__Welcome *w, llama_ctx_params *p,
                                char *err, size_t errlen)
{
    const char *mode = s->target_kv_s ? s->target_kv_s : "auto";
    bool on = !strcmp(mode, "on"); /* required; auto: when the rows are the drafter's own */
    if (!strcmp(mode, "off"))
        return 0;
    bool skip = s->kind == SPEC_LAYERSKIP;
    if (s->kind != SPEC_MODEL && !(skip && s->layers_prefix)) {
        if (on) {
            snprintf(err, errlen,
                     skip ? "--target-kv on: --layers must be the target's first layers (0-N): "
                            "a skipped layer changes the K/V of every layer after it"
                          : "--target-kv on is for --kind model or layerskip");
            return -1;
        }
        return 0;
    }
    llama_config tc;
    char why[256];
    if (llama_read_config(w->target_model, &tc, why, sizeof why)) {
        snprintf(err, errlen, "--target-kv: cannot read the target's shape: %s", why);
        return on ? -1 : 0;
    }
    llama_config dcl = s->model->cfg; /* layerskip: its layers are the target's first ones */
    if (skip && dcl.n_layers <= tc.n_layers)
        dcl.n_layers = tc.n_layers;
    const llama_config *dc = &dcl;
    bool kv_ok = llama_config_same_kv(&tc, dc);
    bool copy = kv_ok && tc.ffn == dc->ffn && tc.vocab == dc->vocab;
    if (on && !kv_ok) {
        snprintf(err, errlen,
                 "--target-kv on: the draft model's layers/attention (%d layers, %d heads, %d KV "
                 "heads of %d) differ from the target's (%d, %d, %d of %d)",
                 dc->n_layers, dc->n_heads, dc->n_kv_heads, dc->head_dim, tc.n_layers, tc.n_heads,
                 tc.n_kv_heads, tc.head_dim);
        return -1;
    }
    if (!on && !copy)
        return 0;
    int n_seq = w->n_seq ? (int)w->n_seq : 1;
    uint64_t have = 0;
    void *block = arena_region_find(s->arena, RT_REGION_LLAMA, &have);
    kv_type kv = w->kv_type == KV_F16 ? KV_F16 : KV_F32; /* the target's, as the arena holds it */
    size_t need = llama_shared_layout(&tc, (int)w->n_ctx, (int)w->max_width, n_seq, kv, NULL);
    if (!block || have < need) {
        snprintf(err, errlen, "--target-kv: the arena has no K/V block for the target's shape");
        return on ? -1 : 0;
    }
    llama_shared_bind(&s->target_sh, block, &tc, (int)w->n_ctx, (int)w->max_width, n_seq, kv);
    p->kv = kv; /* the source's rows: the tree rows are read in the same stream */
    p->prefix_src = &s->target_sh;
    p->prefix_src_n_ctx = (int)w->n_ctx;
    p->prefix_src_max_width = (int)w->max_width;
    p->prefix_src_n_seq = n_seq;
    s->kv_shared = true;
    return 0;
}

/* One measurement of a drafter step on `threads` threads: a chain of SPEC_PLACE_W tokens (a tree
 * level's forward) and one token after it, at a short context. Seconds, or -1. */
#define SPEC_PLACE_W 4
static double spec_place_time(spec *s, llama_ctx *ctx, float *logits)
{
    int32_t ids[8 + SPEC_PLACE_W + 1];
    for (int i = 0; i < (int)(sizeof ids / sizeof *ids); i++)
        ids[i] = (int32_t)((i * 7919 + 13) % s->model->cfg.vocab);
    char err[256];
    llama_ctx_reset(ctx);
    if (llama_prefill(ctx, ids, 8, logits, err, sizeof err))
        return -1;
    uint64_t t0 = rt_now_us();
    if (llama_prefill(ctx, ids + 8, SPEC_PLACE_W, logits, err, sizeof err) ||
        llama_prefill(ctx, ids + 8 + SPEC_PLACE_W, 1, logits, err, sizeof err))
        return -1;
    return (double)(rt_now_us() - t0) / 1e6;
}

/* Placement by measurement. A model drafter that takes turns with the workers (no drafting ahead:
 * the coordinator found no core of its own for it) drafts while the workers wait for its draft,
 * so every core is free then, and it measures where every core is free too: as soon as the
 * machine's cores were idle for a poll interval while no request is active (spec_place_if_idle:
 * not at the group's busy start, where the workers load), or else at its first draft request. It
 * times its step on 1 thread and on all the online cores, interleaved, 3 rounds after a warm-up
 * (about 100 ms in all on 2 cores at this size, contexts included, which the first request no
 * longer pays when the group had an idle moment), and keeps the faster (more threads only when
 * they save at least 5%), making its context again if the count changed. --threads given, or
 * drafting ahead, keeps the count as it is (spec_place_fixed). The choice and its figures go to the log
 * and, in the heartbeats, to the coordinator's log and status. */
static void spec_place_publish(spec *s)
{
    __atomic_store_n(&s->placement_ready, true, __ATOMIC_RELEASE);
    rt_log(s->role, "placement: %s", s->placement);
}

void spec_place_fixed(spec *s)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->place_pending = s->model && s->kind != SPEC_MEDUSA && !s->threads_set && !s->work_ahead &&
                       cores >= 2;
    if (s->place_pending)
        return;
    snprintf(s->placement, sizeof s->placement, "%d thread%s, %s%s", s->threads,
             s->threads == 1 ? "" : "s",
             !s->model ? "no model (prompt lookup)"
             : s->work_ahead ? "drafting ahead while the target verifies"
                             : "taking turns with the workers",
             s->threads_set ? " (--threads given)" : "");
    spec_place_publish(s);
}

void spec_place(spec *s, const char *when)
{
    s->place_pending = false;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int cand[2] = {1, (int)cores};
    double t[2][4];
    llama_ctx *ctx[2] = {NULL, NULL};
    float *logits = malloc((size_t)s->model->cfg.vocab * sizeof *logits);
    char err[256] = "out of memory";
    bool ok = logits != NULL;
    for (int c = 0; ok && c < 2; c++) {
        llama_ctx_params p = {.n_threads = cand[c], .max_width = ARENA_DRAFT_MAX, .n_ctx = 64,
                              .kv = KV_F16, .n_parts = 1};
        ctx[c] = llama_ctx_new(s->model, &p, err, sizeof err);
        ok = ctx[c] != NULL;
    }
    for (int r = 0; ok && r < 4; r++)
        for (int c = 0; ok && c < 2; c++)
            ok = (t[c][r] = spec_place_time(s, ctx[c], logits)) >= 0;
    llama_ctx_destroy(&ctx[0]);
    llama_ctx_destroy(&ctx[1]);
    free(logits);
    double med[2] = {0, 0};
    for (int c = 0; ok && c < 2; c++) {
        double *v = t[c] + 1; /* round 0 warms the pages */
        for (int i = 1; i < 3; i++)
            for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
                double x = v[j];
                v[j] = v[j - 1], v[j - 1] = x;
            }
        med[c] = v[1];
    }
    int want = ok && med[1] < 0.95 * med[0] ? cand[1] : s->threads;
    if (want != s->threads) {
        llama_ctx_params p = s->ctx_params;
        p.n_threads = want;
        llama_ctx *fresh = llama_ctx_new(s->model, &p, err, sizeof err);
        if (fresh) {
            llama_ctx_destroy(&s->ctx);
            s->ctx = fresh;
            s->ctx_params = p;
            s->threads = want;
            for (int i = 0; i < RT_MAX_SEQ; i++) /* a batch slot's private rows went with it */
                s->reqs[i].kv_n = 0;
        } else
            ok = false;
    }
    if (ok)
        snprintf(s->placement, sizeof s->placement,
                 "%d thread%s, taking turns with the workers: a draft step (%d tokens, then 1) "
                 "took %.2f ms on 1 thread and %.2f ms on %d (measured %s)",
                 s->threads, s->threads == 1 ? "" : "s", SPEC_PLACE_W, med[0] * 1e3,
                 med[1] * 1e3, cand[1], when);
    else
        snprintf(s->placement, sizeof s->placement,
                 "%d thread%s, taking turns with the workers (not measured: %s)", s->threads,
                 s->threads == 1 ? "" : "s", err);
    spec_place_publish(s);
}

/* The cores count as idle when at least 85% of their time since the last sample was idle (the
 * speculator's own poll included), over at least 80 ms; the first sample only starts the clock. */
void spec_place_if_idle(spec *s)
{
    if (!s->place_pending || s->active)
        return;
    uint64_t now = rt_now_us();
    if (s->idle_at_us && now - s->idle_at_us < 80000)
        return;
    FILE *f = fopen("/proc/stat", "r");
    unsigned long long v[8] = {0};
    int n = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2],
                       &v[3], &v[4], &v[5], &v[6], &v[7])
              : 0;
    if (f)
        fclose(f);
    if (n < 4) { /* no /proc/stat: measure at the first draft request */
        s->idle_at_us = now;
        return;
    }
    uint64_t idle = v[3] + (n > 4 ? v[4] : 0), total = 0;
    for (int i = 0; i < n; i++)
        total += v[i];
    bool was = s->idle_at_us != 0;
    uint64_t d_idle = idle - s->idle_jiffies, d_total = total - s->total_jiffies;
    s->idle_at_us = now;
    s->idle_jiffies = idle;
    s->total_jiffies = total;
    if (was && d_total >= 4 && d_idle * 100 >= d_total * 85)
        spec_place(s, "while the cores were idle");
}
