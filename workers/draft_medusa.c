/*
 * workers/draft_medusa.c — the Medusa drafter: heads (--heads, docs/medusa.md) applied to the
 * target's hidden state at the last accepted token, which the coordinator publishes in the arena
 * for every sequence slot (so the drafter answers every request it is fed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "workers/speculator_internal.h"

/* the heads and the hidden-state buffer */
static int spec_prepare_medusa(spec *s, char *err, size_t errlen)
{
    s->heads = medusa_load(s->heads_path, s->model, err, errlen);
    if (!s->heads)
        return -1;
    s->hbuf = malloc((size_t)s->model->cfg.dim * sizeof *s->hbuf);
    if (!s->hbuf) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

/* Medusa: the heads applied to the target's hidden state at the last accepted token, which the
 * coordinator publishes in the arena; the tree is the plan's shape when the Feedback carries one
 * (the calibrated tree, drafted exactly), else it follows the template (--template). */
int spec_grow_medusa(spec *s)
{
    uint32_t dim = (uint32_t)s->model->cfg.dim;
    const rt_hidden *h = rt_hidden_at(s->hidden, (int)dim, s->seq_slot);
    for (int tries = 0; tries < 3; tries++) {
        uint32_t before = __atomic_load_n(&h->seq, __ATOMIC_ACQUIRE);
        if (before & 1)
            continue;
        bool match = h->request_id == s->request_id && h->ctx_len == (uint64_t)s->n_committed &&
                     h->dim == dim;
        memcpy(s->hbuf, h->h, dim * sizeof(float));
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&h->seq, __ATOMIC_RELAXED) != before)
            continue;
        if (!match)
            return 0; /* not this context's state (yet): no draft this time */
        int depth = s->tmpl_len < s->max_depth ? s->tmpl_len : s->max_depth;
        int32_t tok[ARENA_DRAFT_MAX], par[ARENA_DRAFT_MAX];
        float conf[ARENA_DRAFT_MAX];
        int n = s->n_shape
                    ? medusa_draft_shape(s->heads, NULL, s->hbuf, s->shape_parent, s->shape_rank,
                                         s->n_shape, s->max_depth, s->max_nodes, tok, par, conf)
                    : medusa_draft_tree(s->heads, NULL, s->hbuf, s->tmpl, depth, s->max_nodes, tok,
                                        par, conf);
        for (int i = 0; i < n; i++) {
            int d = par[i] < 0 ? 1 : s->nodes[par[i]].depth + 1;
            double base = par[i] < 0 ? 1.0 : s->nodes[par[i]].cum;
            s->nodes[i] = (spec_node){.token = tok[i],
                                      .parent = par[i],
                                      .conf = conf[i],
                                      .cum = base * conf[i],
                                      .depth = d};
            if (par[i] >= 0)
                s->nodes[par[i]].children++;
        }
        return n < 0 ? 0 : n;
    }
    return 0;
}

const drafter drafter_medusa = {"medusa", SPEC_MEDUSA, true, spec_prepare_medusa, spec_grow_medusa};
