/*
 * coordinator/engine.h — private to the engine's five files, from the floor up:
 *   coord_step.c     one target step through the workers (and the slot lookups);
 *   coord_drafts.c   Feedback, DraftReady, the draft wait and the merge;
 *   coord_slots.c    a request in its sequence slot: admission, prefill, emission, end;
 *   coord_freerun.c  free-running decode and the group's own step-time curve;
 *   coord_engine.c   the queue and the verification cycle (engine_step_all), the one loop that
 *                    calls the others.
 * A file calls only the ones below it; the step hands a free run's tokens up through the run's
 * taker (engine_run.take), set by the free run.
 */
#ifndef OROCHI_ENGINE_H
#define OROCHI_ENGINE_H

#include "coordinator/coord.h"
#include "coordinator/coord_output.h"
#include "model/grammar.h"

#define ENGINE_WORKER_WAIT_US 60000000u /* how long a request waits for the workers to be back */
#define ENGINE_EMA 0.25       /* weight of the newest sample in the draft wait's averages */
#define ENGINE_WAIT_WARMUP 4  /* samples of a speculator before its wait is measured, not capped */
#define ENGINE_WAIT_PROBE 32  /* steps unscored before a speculator is waited on again */
#define ENGINE_BENCH_PROBE 64 /* Feedbacks a benched speculator skips before it is tried again */
#define ENGINE_FREE_GUARDED                                                                        \
    16                        /* steps of a free run while width 1 keeps speculators off (the      \
                               * plan's next bucket may speculate) */
#define ENGINE_LOOKUP_ORDER 3 /* prompt lookup in a free run: the longest match tried (ngram's) */
#define ENGINE_COST_REPS 9    /* rounds of the group's own step-time measurement */

/* ===== the state ===== */

typedef struct {
    bool used;
    coord_request *req;
    const coord_params *prm;
    uint64_t req_id;
    int32_t *all; /* prompt + generated tokens */
    int n_all, n_prompt, generated, max_new, steps, accepted_total, verify_steps;
    bool greedy, stop;
    const char *finish;
    sampler smp;
    void *work; /* sampling scratch: 3 * V floats + V * 8 bytes */
    coord_text out;
    char kinds[COORD_DRAFT_KINDS_LEN];
    coord_tree tree;                 /* this step's tree */
    int off;                         /* where the tree sits in the step batch */
    int last_added;                  /* tokens the last step appended */
    int last_row;                    /* batch row of the last accepted node */
    uint64_t queued_us, admitted_us; /* arrived, taken into the slot (the timeline) */
    uint64_t first_us;               /* the first token was drawn (the prompt's time ends) */
    uint64_t emit_us;                /* its latest tokens were emitted (0: none yet) */
    int cached;                      /* prompt tokens whose K/V came from another request */
    /* its own speculation length while it shares cycles with other requests (ctl_reqlen: about
     * as deep as its drafts are accepted) */
    ctl_reqlen len;
    int spec_len;
    /* logit_bias and the penalties (engine_slot_shape): how often each generated token occurred
     * (V counts, NULL until the first shaped row), the ids counted so far, and how far into
     * all[] the counts reach */
    int32_t *pen_count, *pen_ids;
    int n_pen_ids, pen_upto;
    /* structured output (prm->grammar): the token masks, the position after the committed tokens
     * (fed up to g_upto of all[]), and scratch positions for the nodes of a tree being shaped */
    grammar_matcher *gm;
    grammar_state *gst;
    int g_upto;
    grammar_state *gnode[COORD_TREE_CAP];
} engine_slot;

struct coord_engine_state {
    engine_slot slots[RT_MAX_SEQ];
    int prefix[RT_MAX_SEQ]; /* committed length per sequence slot */
    int held[RT_MAX_SEQ];   /* the most rows each slot has committed: its arena pages written */
    uint64_t idle_since[RT_MAX_SEQ]; /* when each slot's last request ended (rt_now_us) */
    /* an idle slot's committed tokens (its last request's), whose K/V rows are still in its
     * region of the cache: a new prompt that begins with them starts from them */
    int32_t *kept[RT_MAX_SEQ];
    int n_kept[RT_MAX_SEQ];
    int rr;                /* round-robin start for budget leftovers */
    int pig_rr;            /* round-robin start of the requests aboard a prompt's steps */
    grammar_vocab *gvocab; /* the vocabulary's trie for grammar masks (the first grammar builds
                            * it; every constrained request's matcher shares it) */
};

/* A free-running greedy decode in flight (rt_step.run_max): the workers make the tokens, and
 * engine_step hands them to the run's taker as they come, each time it wakes and once at the end;
 * the taker returns true to end the run early (the workers stop after the step they are in). */
typedef struct engine_run {
    uint32_t max;       /* steps the workers may make */
    const int32_t *eog; /* they stop after a step that made one of these */
    int n_eog;
    int period_ms;         /* how often the coordinator looks for new tokens */
    int n;                 /* requests in the run, one row each */
    int slots[RT_MAX_SEQ]; /* their sequence slots, in row order */
    int speculators;       /* connected when it started: the run ends when that changes */
    int taken;             /* steps taken so far */
    /* the taker (coord_freerun.c): `ready` steps are made and committed by every worker */
    bool (*take)(coord *c, struct engine_run *r, int ready);
} engine_run;

/* ===== coord_step.c ===== */

/* Run one step over n tokens (parents, sequence slots; seq_prefix: committed length of every
 * slot), re-running it while workers are lost and come back; with `run`, a free run. Returns 0,
 * or -1 if the group cannot finish it (err says why). */
int engine_step(coord *c, int n, const int32_t *tokens, const int32_t *parent, const int32_t *seq,
                const int *seq_prefix, int logits_from, engine_run *run, char *err, size_t errlen);
/* tell the commit view about the step just run (positions per sequence slot) */
int engine_set_batch(coord *c, const llama_batch *b, const int *seq_prefix, char *err,
                     size_t errlen);
/* an exponential moving average (weight ENGINE_EMA); the first sample (have == 0) starts it */
double engine_ema(double avg, int have, double x);
/* the sequence slot serving request req_id (-1: none) */
int engine_slot_of(const coord *c, uint64_t req_id);
/* a request that samples with a seed: its trees must not depend on timing */
bool engine_slot_seeded(const coord *c, int slot);

/* ===== coord_drafts.c ===== */

/* Tell the speculators the committed context of the request in `slot` (a reset, or the tokens
 * appended and what of the verified tree was accepted); multi_only: only those fed every request.
 */
void engine_feedback(coord *c, int slot, uint64_t req_id, const int32_t *all, int n_all,
                     const int32_t *added, int n_added, int accepted, const coord_tree *verified,
                     bool multi_only);
/* a request ended: the speculators forget what they were fed of it */
void engine_feedback_done(coord *c, uint64_t req_id);
/* wait for the fed speculators' drafts for context n_all (each as long as it pays; fixed: up to
 * --draft-wait-ms for everyone); returns how many answered */
int engine_gather_drafts(coord *c, int slot, uint64_t req_id, const int32_t *all, int n_all,
                         bool fixed);
/* the slot's gathered drafts merged into one trie rooted at `root` */
void engine_merge_drafts(coord *c, int slot, int32_t root, coord_tree *merged);

/* ===== coord_slots.c ===== */

/* take a request into slot s: tokenize, check it fits, prefill; 0, or -1 (the request failed) */
int engine_slot_start(coord *c, int s, coord_request *req, uint64_t queued_us);
/* The rows slot b borrows from slot s (--prefix-share; 0: none, or b == s). */
int engine_lent_by(const coord *c, int b, int s);
/* Whether an active request borrows rows of slot s. */
bool engine_slot_lends(const coord *c, int s);
/* A free slot for the next request, one no active request borrows rows of when there is one
 * (a lender's rows must be copied into its borrowers before they are written again); -1: none. */
int engine_free_slot(const coord *c);
/* emit n new tokens (rows: their logits rows, for logprobs); sets sl->stop at its end */
int engine_slot_emit(coord *c, engine_slot *sl, const int32_t *ids, const float *const *rows,
                     int n);
void engine_slot_finish(coord *c, int s);
void engine_slot_fail(coord *c, int s, int status, const char *msg);
/* the request is over: a stop, its length, or a client gone */
bool engine_slot_over(const engine_slot *sl);
/* name a draft kind among those the request's drafts came from (once) */
void engine_slot_add_kind(engine_slot *sl, const char *kind);
/* tokens slot s may still take: its request's length and the context's end */
int engine_slot_room(const coord *c, int s);
/* active requests */
int engine_active(const coord *c);
/* whether this cycle verifies drafts (a width above 1, the guard) */
bool engine_speculating(const coord *c, int n_active);
/* The grammar's part of a step's tree (prm->grammar): the text it forces here is added as a chain
 * from the root (a draft as certain as drafts get, still verified), and nodes whose token it
 * refuses are cut with everything below them. 0, or -1 with err. */
int engine_slot_constrain_tree(coord *c, engine_slot *sl, coord_tree *t, char *err, size_t errlen);
/* whether the request's rows are shaped (logit_bias, penalties, a grammar): such a request is not
 * run free */
bool engine_slot_shaped(const engine_slot *sl);
/* Shape the rows a request chooses its tokens from, in place: n rows of a tree (node 0 the last
 * committed token; parent[i] the parent node, NULL: a chain) whose row i is read for the token
 * after node i, so its penalties count the generated tokens and the tree's nodes 1..i on i's path,
 * and its grammar mask is the one after the committed text and that path (tokens the grammar
 * refuses get -inf; a greedy row whose best token is allowed is left as it is, its argmax being
 * the masked one). Returns 0, or -1 when out of memory or the grammar broke (the request then
 * fails). */
int engine_slot_shape(const coord *c, engine_slot *sl, float *rows, const int32_t *tok,
                      const int32_t *parent, int n);
/* the request model speculators draft for: the oldest active one */
uint64_t engine_focus(const coord *c);
/* publish the target's hidden state of batch row `row` for the medusa speculators */
void engine_publish_hidden(coord *c, int slot, uint64_t req_id, int ctx_len, int row);

/* ===== coord_freerun.c ===== */

/* whether slot s may decode free-running among n_active requests */
bool engine_can_run_free(coord *c, int s, int n_active);
/* decode the n requests of slots[] free-running */
void engine_run_free(coord *c, const int *slots, int n);
/* whether the group should measure its own step-time curve now (for prompt lookup in the run) */
bool engine_lookup_needs_costs(coord *c);
/* measure it, on slot s's context */
void engine_measure_costs(coord *c, int s);

#endif
