/*
 * policy/control — the speculation controllers, as pure functions over small state structs
 * (no sockets, no clocks: every decision is a function of the samples it is given, so each has a
 * unit test on fixtures, tests/unit/test_control.c). The coordinator owns one of each and feeds
 * them after every verification; `orochi profile` uses the plan half to choose trees and widths.
 *
 *   ctl_tree    the merged draft trie and the vote that cuts it to the verified tree
 *   ctl_acr     a speculator's average acceptance rate and vote weight (Minions 3.2)
 *   ctl_length  the adaptive speculation length: hill-climbs on measured cost per token
 *   ctl_reqlen  a request's own length while it shares cycles: follows its accepted depth
 *   ctl_guard   the fallback guard: speculation off when it is slower than plain decoding
 *   ctl_branch  a tree drafter's branch threshold, raised while side branches are not taken
 *   ctl_plan_*  ARCA: the best tree per width from per-depth/rank accuracies, its acceptance on
 *               recorded calibration paths, its refinement, and the width choice from curves
 *   ctl_lookup  prompt lookup inside a free run: acceptance per match order, and each row's draft
 *               length from those and the plan's step-time curve
 * Rationale and the papers' sections: docs/speculation.md.
 */
#ifndef OROCHI_CONTROL_H
#define OROCHI_CONTROL_H

#include <stdbool.h>
#include <stdint.h>

#include "shm/arena.h"

#define CTL_TREE_CAP 512 /* nodes of a merged draft trie */
#define CTL_MAX_OWNERS 32
#define CTL_LEN_MAX 64

typedef enum { VOTE_MAJORITY, VOTE_UNION, VOTE_OFF } ctl_vote;

/* A token tree rooted at the last committed token (node 0); parents precede children. */
typedef struct {
    int n;
    int32_t tokens[CTL_TREE_CAP];
    int32_t parent[CTL_TREE_CAP];  /* parent[0] = -1; parent[i] < i */
    float weight[CTL_TREE_CAP];    /* summed vote weight of the speculators that proposed it */
    float support[CTL_TREE_CAP];   /* summed weight x the proposer's confidence in the token */
    uint32_t owners[CTL_TREE_CAP]; /* bit r: the speculator with owner index r proposed it */
    float owner_w[CTL_MAX_OWNERS]; /* each owner's vote weight */
} ctl_tree;

void ctl_tree_init(ctl_tree *t, int32_t root);
/* Merge one speculator's draft (weight w, owner index 0..31) into the trie. */
void ctl_tree_add(ctl_tree *t, const arena_draft *d, float w, int owner);
/* Cut `in` to at most max_nodes nodes (root included) into `out`:
 *   majority  the voted tree: nodes are taken best first by their path share, the product along
 *             the path of (support of the node / summed weight of the speculators that drafted
 *             below its parent) — where the speculators agree a branch is one chain, where they
 *             split it branches in proportion to their weights and confidences; ties go to the
 *             shallower node, then the earlier one;
 *   union     the heaviest nodes (summed weight) whose parents are kept;
 *   off       as union (the input then holds one speculator's draft). */
void ctl_tree_vote(const ctl_tree *in, ctl_vote mode, int max_nodes, ctl_tree *out);
/* Depth of the deepest node of a draft, and how many accepted tokens follow one of its paths. */
void ctl_tree_match(const arena_draft *d, const int32_t *accepted, int n_acc, int *depth,
                    int *matched);

/* ===== the branch threshold of a tree drafter ===== */
/* Branches pay only where the target takes them. After each verification of its tree the drafter
 * counts the branch points the accepted path went through (a node with several children, the
 * target's token among them) and at how many of them the target took a side branch rather than the
 * drafter's best candidate (which a chain would have held anyway). Every CTL_BRANCH_WINDOW branch
 * points: side branches taken at under a tenth of them means the width they took was wasted, so
 * the threshold doubles (at 1 no candidate but the best passes: the tree is a chain); over a
 * quarter, it halves back towards the configured minimum. Verifications without branch points
 * say nothing; after CTL_BRANCH_QUIET of them in a row a raised threshold halves, so branching is
 * tested again now and then. */
#define CTL_BRANCH_WINDOW 16
#define CTL_BRANCH_QUIET 32
typedef struct {
    float min;    /* the configured threshold (--branch-threshold) */
    float value;  /* the threshold in use */
    int points, side, quiet;
} ctl_branch;

void ctl_branch_init(ctl_branch *b, float min);
/* One verification: `points` branch points on the accepted path, `side` of them side branches. */
void ctl_branch_update(ctl_branch *b, int points, int side);

#define CTL_ALPHA_MAX_NODES 64 /* the largest tree ctl_alpha_update judges */
/* LLMCad's self-adaptive fallback threshold: a tree drafter stops growing when the best branch's
 * cumulative confidence falls below alpha. After a verification, over the tree's leaves the path
 * (root to leaf) with the longest accepted prefix is taken — the shortest such path on a tie —:
 * drafted all the way and all accepted, alpha halves (draft further next time); otherwise alpha
 * becomes the fraction of that path that was wasted, (drafted - accepted) / drafted. Never below
 * 1e-6. The tree: n nodes, token[i] and parent[i] (-1: a child of the root, parents before their
 * children); accepted: the tokens the target took, in order. Returns alpha unchanged for an empty
 * tree. */
float ctl_alpha_update(float alpha, const int32_t *token, const int32_t *parent, int n,
                       const int32_t *accepted, int n_acc);

/* ===== ACR and vote weight (Minions 3.2) ===== */
typedef struct {
    double reward_threshold, punish_threshold, reward_factor, punish_factor;
} ctl_acr_params;

typedef struct {
    double acr, acr_sum; /* average acceptance rate of its verified drafts */
    uint64_t acr_n;
    double weight; /* vote weight, in [0.05, 20] */
} ctl_acr;

/* One verification that included the speculator's draft (credit goes only to speculators whose
 * nodes were in the voted tree): `matched` of its `depth` drafted levels were accepted. */
void ctl_acr_update(ctl_acr *a, const ctl_acr_params *p, int depth, int matched);

/* ===== adaptive speculation length ===== */
/* Every verification cycle gives (seconds, tokens): its whole time, drafting and waiting for
 * drafts included, and the tokens it yielded. After `window` cycles at a length, that length's
 * cost per token (sum of seconds / sum of tokens over the window) is recorded and the length
 * hill-climbs: to the cheapest of {len - 1, len, len + 1} among figures younger than `stale`
 * decisions; when len itself is the cheapest, to a neighbour whose figure is missing or stale
 * (up first), so the length grows as readily as it shrinks and keeps checking both sides.
 * A window whose every cycle was full (all drafted tokens accepted: tokens >= len + 1) is decided
 * after half its cycles and climbs by half the length at once (at least 1): the drafts are cut by
 * the length, not by the drafter, and a cycle's cost per token, (len x draft level + step) /
 * (len + 1), falls with the length while a level costs less than the step. So a fresh group, or
 * one the guard restarted from length 1, reaches 7 in 5 half-windows instead of 6 whole ones. */
typedef struct {
    int len, lo, hi, window, stale;
    double cost[CTL_LEN_MAX + 1]; /* seconds per token measured at each length (0: never) */
    uint32_t age[CTL_LEN_MAX + 1];
    double sec;
    long tok;
    int n, full; /* cycles in the current window, and how many of them were full */
    uint64_t decisions;
    uint64_t changes; /* decisions that moved the length */
} ctl_length;

void ctl_length_init(ctl_length *l, int start, int lo, int hi, int window, int stale);
/* Returns the length to use from now on. */
int ctl_length_sample(ctl_length *l, double seconds, int tokens);

/* ===== a request's own speculation length while it shares cycles ===== */
/* With other requests in flight a drafted row takes room and time from all of them (a batch's
 * step costs about its rows), and timing one request's share of a shared cycle says little
 * about its own drafts. So a request in a batch drafts about as deep as its drafts are accepted:
 * after `window` cycles in which it had a draft, its length becomes the window's mean accepted
 * drafted tokens (rounded) plus one, within [lo, hi]; a window whose every draft was accepted
 * whole at the full length is decided after half its cycles and climbs by half the length (at
 * least 1), as ctl_length does. */
typedef struct {
    int len, lo, hi, window;
    int n, full, acc; /* cycles in the window, full ones, accepted drafted tokens summed */
    uint64_t decisions;
} ctl_reqlen;

void ctl_reqlen_init(ctl_reqlen *l, int start, int lo, int hi, int window);
/* One cycle of the request with a draft: `accepted` of its drafted tokens were accepted (at most
 * the length). Returns the length to use from now on. */
int ctl_reqlen_sample(ctl_reqlen *l, int accepted);

/* ===== the fallback guard ===== */
/* Speculation must never be slower than plain decoding. While on, every `window` cycles the
 * achieved cost per token is compared with the plain cost (`base`, measured by the guard itself
 * while off); when it is not lower the guard switches off — at once, after 2 cycles, when it
 * already costs more than 1.5 x base. While off, cycles are plain W = 1 steps and refresh `base`;
 * after `probe` of them the guard switches on again to test. A probe that fails doubles the
 * interval (up to 64x); one that pays resets it. With no base known yet the guard starts off for
 * one window to measure it. The first CTL_GUARD_WARM cycles after switching on are not judged:
 * the speculators, unfed while off, first catch up with the context (a model drafter reads it
 * all again).
 * Probes are paid from a budget: `loss` sums what the judged windows cost beyond plain decoding
 * (a window that pays gives back what it saved, and savings past zero are credit, so `loss` may
 * go negative; the warm cycles are left out: a model drafter's first draft after a pause is dear
 * however good its drafts are), and no probe starts while loss exceeds CTL_GUARD_BUDGET of the
 * plain time seen so far (`plain_sec`). So however often the intervals or new texts ask for a
 * probe, speculation costs at most about that fraction net of what it saved (plus the one probe
 * that overdraws it), and a drafter that has paid is never shut out by a few slow windows. A window of a good drafter (at least
 * CTL_GUARD_GOOD_TOKENS a step) that loses narrowly gets one more window before the switch, and
 * its switch does not back the probes off. */
#define CTL_GUARD_WARM 2
/* a speculative cost per token above this many times the plain cost is a clear loss */
#define CTL_GUARD_HOPELESS 1.5
/* probes may lose at most this fraction of the plain decoding time */
#define CTL_GUARD_BUDGET 0.01
/* A window whose speculation yielded at least this many tokens a step is a good drafter's: when
 * it loses narrowly (not a clear loss) the guard judges one more window before switching off, and
 * when it does switch off, the probe interval is not backed off (a good drafter's slow window is
 * the machine's, more often than the drafter's). */
#define CTL_GUARD_GOOD_TOKENS 3.0
typedef struct {
    bool on;
    double base, spec; /* seconds per token: plain, and speculative at the last judgement */
    int window, probe, probe_now;
    int warm; /* cycles after switching on that are not judged */
    double sec;
    long tok;
    int n, off_n;
    double plain_sec, loss; /* the probe budget: plain time seen, and the net cost of speculation
                             * beyond it (negative: credit saved) */
    double per_step;        /* tokens a cycle in the last judged window while on */
    int strikes;            /* good-drafter windows lost narrowly in a row (0 or 1) */
    uint64_t switches_off, switches_on;
    uint64_t paid; /* judged windows that paid (speculation cheaper than plain) */
} ctl_guard;

void ctl_guard_init(ctl_guard *g, double base_prior, int window, int probe);
/* One cycle: speculated = whether it verified drafts. Returns whether speculation is on now. */
bool ctl_guard_sample(ctl_guard *g, bool speculated, double seconds, int tokens);
/* While off: the plain cycles before it switches on by itself to probe (INT_MAX while the probe
 * budget is spent: plain time refills it, at a pace the guard cannot foresee). 0 while on. */
int ctl_guard_plain_left(const ctl_guard *g);
/* A new text (a request starts): what lost narrowly on the last one may pay on this one, so a
 * guard that is off tests speculation again now (one window, the back-off kept for probes within
 * a text) — unless the last judgement was a clear loss (more than CTL_GUARD_HOPELESS x the plain
 * cost, e.g. a drafter slower than what it saves) or no judged window has paid yet (speculators
 * that have never paid anywhere are not re-tested per text): those wait for their backed-off
 * probe; and unless the probe budget is spent. */
void ctl_guard_reprobe(ctl_guard *g);

/* ===== ARCA planning ===== */
/* A tree template: node 0 is the root; node i > 0 is the candidate of rank rank[i] (0 = the
 * drafter's best) below node parent[i]; parents precede children. */
typedef struct {
    int n;
    int parent[CTL_TREE_CAP], rank[CTL_TREE_CAP], depth[CTL_TREE_CAP];
} ctl_template;

/* acc[d * ranks + r]: the probability that the rank-r candidate at depth d + 1 is the target's
 * token, given its parent was. Builds the best template of `width` nodes (root included) by adding
 * the most likely node one at a time (its path probability: the product of its nodes' accuracies),
 * no deeper than `depths`. Returns the expected tokens per step (accepted + the bonus token). */
double ctl_plan_tree(const double *acc, int depths, int ranks, int width, ctl_template *t);
/* Keep only the nodes of `in` whose path of sibling ranks (children ordered by support, then by
 * index) is a path of the template: the plan's tree shape applied to merged drafts. */
void ctl_tree_fit(const ctl_tree *in, const ctl_template *t, ctl_tree *out);
/* Mean tokens per step the template gives on recorded calibration paths: paths[i * depths + d] is
 * the rank of the target's token among the drafter's candidates at depth d + 1 of sample i (-1:
 * not among them; the path ends there). */
double ctl_plan_eval(const ctl_template *t, const int8_t *paths, int n_paths, int depths);
/* Brute-force refinement on the calibration paths: move a leaf to any free (parent, rank) slot
 * whenever that raises the measured mean, until no move does (at most `rounds`). Returns the
 * final mean. */
double ctl_plan_refine(ctl_template *t, const int8_t *paths, int n_paths, int depths, int ranks,
                       int rounds);
/* The width that maximises tokens per second: tokens[i] per step / seconds[i] per step (drafting
 * included) at width widths[i]; W = 1 is a candidate like any other. Returns its index. */
int ctl_plan_best_width(const int *widths, const double *seconds, const double *tokens, int n);

/* ===== prompt lookup inside a free run ===== */
/* The workers of a free run draft by prompt lookup themselves (workers/worker.c, worker_run): a
 * row whose context's last k tokens (k from the order down to 1) occurred before gets the
 * continuation of that occurrence as a chain. How far that pays depends on how often such drafts
 * are right, which depends on k: `ctl_lookup` keeps, per match order, the drafted tokens that were
 * checked and those accepted, both decayed by CTL_LOOKUP_DECAY per verification of that order, so
 * the estimate follows the text. Every worker runs the same updates on the same verdicts and so
 * holds the same numbers (the decisions below must agree across the group). */
#define CTL_LOOKUP_ORDERS 8    /* match orders 1..7 */
#define CTL_LOOKUP_DECAY 0.95f /* weight left to the past at each verification */
#define CTL_LOOKUP_PRIOR_HITS 1.0f
#define CTL_LOOKUP_PRIOR_TRIES 4.0f /* a prior of 1 in 4 */
/* a draft is added only when the expected tokens per unit of step time rise by this factor:
 * the plan's curve is a measurement, and a change within its noise is no gain */
#define CTL_LOOKUP_MARGIN 1.02
typedef struct {
    float hits[CTL_LOOKUP_ORDERS], tries[CTL_LOOKUP_ORDERS];
} ctl_lookup;

void ctl_lookup_init(ctl_lookup *l);
/* The estimated probability that a draft token from an order-k match is accepted, given the
 * tokens before it were (k clamped to 1..CTL_LOOKUP_ORDERS - 1). */
double ctl_lookup_p(const ctl_lookup *l, int k);
/* A verification of a chain of `drafted` tokens from an order-k match, of which the first
 * `accepted` were the target's: accepted + 1 tokens were checked (all of them when accepted =
 * drafted) and `accepted` right. */
void ctl_lookup_record(ctl_lookup *l, int k, int drafted, int accepted);
/* Draft lengths for one step of n rows (one root token each): row r may draft up to avail[r]
 * tokens from a match of order order[r]. cost[w], w = 1..wmax, is the step time of w tokens
 * relative to one (the plan's curve). Drafts are added one token at a time, each to the row where
 * it is most likely accepted (the product of its chain's probabilities), and the lengths kept are
 * those of the prefix of that sequence that maximises expected tokens per unit of step time,
 * provided it beats no drafts by CTL_LOOKUP_MARGIN. Writes d[r]; returns the step's tokens. */
int ctl_lookup_lengths(const ctl_lookup *l, int n, const int *order, const int *avail,
                       const float *cost, int wmax, int *d);
/* The cost curve ctl_lookup_lengths takes, from step times t[i] measured at widths w[i]
 * (increasing, w[0] = 1, every t > 0): cost[x] = t(x) / t(1) for x = 1..the largest measured
 * width (at most wcap), interpolated linearly in between and made non-decreasing (more tokens
 * never make a step cheaper: a dip is the measurement's noise). Returns that largest width, or
 * 0 for a curve that breaks those rules (cost left undefined). */
int ctl_cost_curve(const int *w, const double *t, int n, int wcap, float *cost);

/* ===== the split ratios (ARCA's partition per device) ===== */

/* How a step's work is divided between parts that differ: `groups` kinds of work (the partition's
 * layer kinds), each shared among `parts` parts, shares[g * parts + p] >= 0 summing to 1 per
 * group. The search starts from every group split in proportion to each part's speed alone
 * (1 / part_ms[p]; equal without part_ms), then moves shares between parts in steps of `delta`:
 * each round proposes, for every group and for all groups at once, `delta` taken from one part and
 * given to another, and each group's delta moved one way while the other groups move as much
 * back (kinds of work that run better on different parts); it has the whole batch timed with the
 * current split first (eval: the candidates side by side, so the machine's noise falls on all
 * alike), and keeps the best if it beats the current split's new time by more than `margin`
 * (relative); a round without a gain halves delta, and the search ends below min_delta or after
 * max_rounds. A part that cannot run alone (part_ms INFINITY: its memory cannot hold every
 * weight) starts with nothing, and a candidate eval cannot run measures INFINITY: the search then
 * gives that part work up to what it can hold. */
typedef struct {
    int groups, parts; /* at most CTL_SPLIT_MAX_GROUPS, CTL_SPLIT_MAX_PARTS */
    double delta, min_delta, margin;
    int max_rounds;
} ctl_split_opts;
#define CTL_SPLIT_MAX_GROUPS 8
#define CTL_SPLIT_MAX_PARTS 16
/* Times n candidate splits (n x groups x parts shares, candidate-major) into ms[0..n); 0, or -1
 * to stop the search. */
typedef int (*ctl_split_eval)(const float *cands, int n, double *ms, void *arg);
/* The search; `best` (groups x parts) and *best_ms receive the winner, *rounds the rounds run.
 * Returns 0, or -1 when eval failed or the options are out of range. */
int ctl_split_search(const ctl_split_opts *o, const double *part_ms, ctl_split_eval eval,
                     void *arg, float *best, double *best_ms, int *rounds);

/* ARCA's choice of devices once a split has been found: part_ms[p] is part p's time with all the
 * work (INFINITY: it cannot hold the model alone, e.g. over its --gpu-memory-limit), split_ms the
 * best split's time over the same steps. The fastest part alone is chosen unless the split beats
 * it by more than `margin` (relative): a split's synchronisation points cost something, so it
 * must pay. Returns that part's index, or -1 for the split; why receives a sentence naming the
 * times ("gpu alone 10.0 ms; the split 9.9 ms does not beat it by 1%: gpu alone"). */
int ctl_device_choice(const double *part_ms, const char *const *names, int parts, double split_ms,
                      double margin, char *why, size_t len);

#endif
