/*
 * workers/speculator_internal — the speculator's state, shared by the process (speculator.c: its
 * life, the Feedback it applies, the drafts it publishes) and its drafters behind one interface
 * (`drafter`: load what the kind needs, grow a tree for the committed context):
 *   draft_model.c   model and layerskip: a draft model's tree growth, its private or shared K/V,
 *                   the chain it works ahead on, LLMCad's alpha and branch pacer, the placement;
 *   draft_lookup.c  ngram and replay: the continuation of a match in the context or a corpus;
 *   draft_medusa.c  medusa: heads on the target's hidden state.
 * Nothing outside workers/ includes it.
 */
#ifndef OROCHI_SPECULATOR_INTERNAL_H
#define OROCHI_SPECULATOR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "group/runtime.h"
#include "model/llama.h"
#include "model/medusa.h"
#include "policy/control.h"
#include "shm/arena.h"

#define SPEC_STALL_MS_DEFAULT 30000 /* main thread silent this long: stop heartbeating */
#define SPEC_PREFILL_CHUNK 64       /* prompt tokens per prefill call (a sign of life between) */
#define SPEC_MAX_TOKENS 65536
/* the chain: the published main branch (<= ARENA_DRAFT_MAX), the predicted correction/bonus token
 * and a next draft's depth (<= ARENA_DRAFT_MAX) drafted ahead */
#define SPEC_CHAIN_MAX (2 * ARENA_DRAFT_MAX + 1)

typedef enum { SPEC_LAYERSKIP, SPEC_MODEL, SPEC_NGRAM, SPEC_MEDUSA } spec_kind;

/* A drafted token in the tree. parent -1: a child of the last committed token. */
typedef struct {
    int32_t token, parent;
    float conf; /* the drafter's probability of the token given its parent */
    double cum; /* cumulative confidence of the branch ending here (product of confs) */
    int depth;  /* 1 for children of the root */
    int children;
} spec_node;

typedef struct spec spec;

#define SPEC_BATCH_MAX 16 /* requests one batched draft grows trees for (each >= 3 nodes) */

/* every_request: a request the speculator is fed (several at once: drafted in one batch). */
typedef struct {
    uint64_t request_id; /* 0: a free entry */
    int slot;            /* the target's sequence slot of the request */
    /* its sequence slot in the draft context for batches (-1: none yet) and, with a private K/V,
     * how many of its committed tokens that slot holds the rows of */
    int ctx_slot, kv_n;
    int32_t *tokens;     /* its committed context */
    int n, cap;
    bool pending; /* its latest context has no draft yet */
    /* the tree last published for it (its alpha and branch updates) */
    spec_node nodes[ARENA_DRAFT_MAX];
    int n_nodes;
    uint64_t fb_us, fb_end_us; /* its latest Feedback: arrived, applied */
    uint64_t seen_us;          /* ... and when it was taken in (an entry long unfed is free) */
} spec_req;

/* One kind of drafter (workers/draft_*.c). */
typedef struct {
    const char *name; /* --kind, and the kind in Hello */
    spec_kind kind;
    bool model;       /* it loads a GGUF: --draft (model) or the target (layerskip, medusa) */
    /* after the model is loaded: what the kind makes of it (layers kept, heads read); NULL: nothing */
    int (*prepare)(spec *s, char *err, size_t errlen);
    /* a draft tree for the committed context into s->nodes; returns the node count (0: none) */
    int (*grow)(spec *s);
} drafter;

extern const drafter drafter_layerskip, drafter_model, drafter_ngram, drafter_replay,
    drafter_medusa;

struct spec {
    const drafter *d;
    const char *run_dir, *kind_s, *draft_path, *target_path, *layers_s, *id, *heads_path,
        *template_s, *corpus_path;
    spec_kind kind;
    int max_draft, ngram, threads, orphan_ms;
    bool ngram_set;   /* --ngram given */
    bool threads_set; /* --threads given: no measured choice */
    /* how it runs beside the workers and why, for the heartbeats once placement_ready is set
     * (written by the main thread before, never after) */
    char placement[200];
    bool placement_ready;
    bool place_pending;          /* the thread count is still to be measured (spec_place) */
    /* the cores' idle time as /proc/stat last said (jiffies) and when, for spec_place_if_idle */
    uint64_t idle_at_us, idle_jiffies, total_jiffies;
    llama_ctx_params ctx_params; /* what s->ctx was made with (spec_place makes it again) */
    float branch_threshold, alpha;
    /* the threshold the tree grows with (branch.value): --branch-threshold, raised while the
     * verifications show the target taking too few side branches (policy/control.h) */
    ctl_branch branch;
    bool alpha_off; /* --alpha off: no fallback (drafts run to the budget), no update */
    bool trace, work_ahead;
    /* replay (an ngram kind): sequences of token ids, -1 between two, looked up instead of the
     * context (--corpus) */
    int32_t *corpus;
    int n_corpus;
    const char *target_kv_s; /* --target-kv auto|on|off */
    int head_screen;         /* --head-screen K: the output layer screened in 4 bits, K rescored */
    int act_bits;            /* --act-bits 8|16|auto: the drafter's activation precision */
    /* the draft model reads the target's committed K/V in the arena (a re-quantized copy of the
     * target, or layerskip's first layers): no prefill and no K/V commits of its own; the
     * private KV then only holds the tree */
    bool kv_shared;
    bool layers_prefix; /* layerskip keeps the target's first layers (0 .. n-1), none skipped */
    llama_shared target_sh; /* the target's KV block in the arena (kv_shared) */
    /* kv_shared: the draft context's tree as a chain continuing the committed context — tree
     * index i holds tokens[n_committed - 1 + i] (the last committed token, then the chain) — for
     * i < tree_rows; its prefix is the target's n_committed - 1 committed tokens. kv_len is then
     * n_committed - 1 + tree_rows once spec_shared_fit has run. */
    int tree_rows;
    bool tree_branchy; /* the tree holds a grown draft, not a chain (until the main branch is kept) */
    char role[64];
    void *zctx, *sock;
    pthread_mutex_t sock_lock; /* sends come from the main and the heartbeat thread */
    /* shared with the heartbeat thread (atomics) */
    rt_life life;        /* heartbeats (from either thread), the main thread's last sign */
    uint64_t hb_drafts;  /* drafts published, for the heartbeat */
    bool hb_active;      /* drafting for a request */
    arena *arena;
    arena_draft_ring *ring;
    llama_model *model;
    llama_ctx *ctx;
    float *logits;
    /* the current request */
    uint64_t request_id;
    bool active;
    int32_t *tokens; /* committed, then the chain */
    int n_committed, n_chain, kv_len, n_ctx;
    int target_ctx; /* the target's context: tokens past it can never be committed */
    float chain_conf[SPEC_CHAIN_MAX]; /* the drafter's probability of each chain token */
    float chain_alt[SPEC_CHAIN_MAX];  /* ... and of the best other candidate at its parent (1:
                                       * unknown), which decides whether the tree branches there */
    int n_pub;      /* main-branch length of the published draft (the chain starts with it) */
    int logits_at;  /* `logits` are the next-token logits after tokens[0..logits_at) (-1: none) */
    bool published; /* a DraftReady went out for n_committed */
    uint64_t fb_us, fb_end_us; /* the latest Feedback: arrived, applied (0: none since the last
                                * draft); reported with the draft for the step timeline */
    uint64_t drafts, last_coord_us;
    /* the draft budget from the last Feedback */
    int max_nodes, max_depth;
    /* the plan's tree shape from the last Feedback (n_shape 0: none), drafted exactly by medusa */
    int32_t shape_parent[ARENA_DRAFT_MAX], shape_rank[ARENA_DRAFT_MAX];
    int n_shape;
    bool tree;
    /* the tree last published (for the fallback threshold update) */
    spec_node nodes[ARENA_DRAFT_MAX];
    int n_nodes;
    /* the tree the last growth left in the draft context (tree index 0: the root at position
     * tree_root_pos, node i: tree index i + 1, the first tree_run nodes forwarded); valid until any
     * other forward, and only for a growth without a trunk */
    bool tree_ok;
    int tree_run, tree_root_pos;
    float *tree_logits; /* (ARENA_DRAFT_MAX + 1) x vocab */
    /* every_request (a model drafter reading the target's K/V): fed every active request; one
     * request at a time it drafts as above (work-ahead and all), several in one batched growth
     * per Feedback round (spec_grow_batch): the requests it knows, by Feedback */
    bool every_request;
    spec_req reqs[RT_MAX_SEQ];
    bool ctx_slot_used[SPEC_BATCH_MAX + 1]; /* private K/V: the draft context's batch slots (1..) */
    /* medusa */
    medusa *heads;
    int tmpl[16], tmpl_len;
    rt_hidden *hidden; /* the arena's hidden states, one per sequence slot (rt_hidden_at) */
    int seq_slot;      /* the target's sequence slot of the current request */
    float *hbuf;
};

/* speculator.c */
int spec_send(spec *s, Orochi__Envelope__BodyCase which, void *body);

/* draft_model.c: model and layerskip */
int spec_parse_layers(const char *spec_s, int n_layers, int *out, char *err, size_t errlen);
int spec_grow_model(spec *s);
int spec_shared_fit(spec *s);
void spec_kv_truncate(spec *s, int len);
void spec_set_chain(spec *s);
void spec_keep_main_branch(spec *s);
bool spec_work_ahead(spec *s);
int spec_grow_round(const spec *s, spec_node *nodes, int *n_io, int max_nodes, int max_depth,
                    const float *const *rows);
void spec_grow_batch(spec *s, spec_req *const *reqs, int k);
int spec_batch_catch_up(spec *s, spec_req *const *reqs, int k);
void spec_update_alpha(spec *s, const spec_node *nodes, int n_nodes, const int32_t *accepted,
                       int n_acc);
void spec_update_branch(spec *s, const spec_node *nodes, int n_nodes, const int32_t *accepted,
                        int n_acc);
void spec_shared_advance(spec *s, int n);
void spec_commit_accepted(spec *s, const int32_t *acc, int n);
int spec_share_target_kv(spec *s, const Orochi__Welcome *w, llama_ctx_params *p, char *err,
                         size_t errlen);
void spec_place_fixed(spec *s);
void spec_place(spec *s, const char *when);
/* While no request is active: spec_place now if the cores were idle since the last call (at
 * least 80 ms before). */
void spec_place_if_idle(spec *s);

/* draft_lookup.c: ngram and replay */
int spec_grow_ngram(spec *s);
int spec_load_corpus(spec *s, char *err, size_t errlen);

/* draft_medusa.c */
int spec_grow_medusa(spec *s);

#endif
