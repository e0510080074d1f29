/*
 * tests/unit/test_control.c — the speculation controllers' decisions on fixtures
 * (policy/control.h): the voted tree, ACR reward and punishment, the adaptive length moving
 * up and down to the cheapest length, the fallback guard switching off and back on and paying its
 * probes from a budget, ARCA's tree from given accuracies, its acceptance on recorded paths and
 * refinement, and the width choice from given curves.
 */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "policy/control.h"

#define RT_TEST_W 64 /* widest curve the tests build */

/* a draft of n tokens with the given parents (-1: child of the root) and confidences */
static arena_draft draft(int n, const int32_t *tok, const int32_t *par, const float *conf)
{
    arena_draft d;
    memset(&d, 0, sizeof d);
    d.n = (uint32_t)n;
    for (int i = 0; i < n; i++) {
        d.tokens[i] = tok[i];
        d.parent[i] = par[i];
        d.conf[i] = conf ? conf[i] : 1.0f;
    }
    return d;
}

/* does the voted tree hold the path root -> a -> b ... (tokens), in that shape? */
static bool has_path(const ctl_tree *t, const int32_t *path, int n)
{
    int cur = 0;
    for (int k = 0; k < n; k++) {
        int next = -1;
        for (int i = 1; i < t->n; i++)
            if (t->parent[i] == cur && t->tokens[i] == path[k])
                next = i;
        if (next < 0)
            return false;
        cur = next;
    }
    return true;
}

static void vote_agreeing_speculators_give_one_chain(void **state)
{
    (void)state;
    static ctl_tree m, out;
    const int32_t tok[] = {10, 11, 12}, par[] = {-1, 0, 1};
    arena_draft a = draft(3, tok, par, NULL), b = draft(3, tok, par, NULL);
    ctl_tree_init(&m, 1);
    ctl_tree_add(&m, &a, 1.0f, 0);
    ctl_tree_add(&m, &b, 2.0f, 1);
    ctl_tree_vote(&m, VOTE_MAJORITY, 8, &out);
    assert_int_equal(out.n, 4);
    assert_true(has_path(&out, tok, 3));
    assert_float_equal(out.weight[1], 3.0f, 1e-6);
    assert_int_equal(out.owners[3], 3);
}

static void vote_splits_the_width_by_weight(void **state)
{
    (void)state;
    static ctl_tree m, out;
    const int32_t xa[] = {20, 21}, ya[] = {30, 31}, par[] = {-1, 0};
    arena_draft x = draft(2, xa, par, NULL), y = draft(2, ya, par, NULL);
    ctl_tree_init(&m, 1);
    ctl_tree_add(&m, &x, 2.0f, 0);
    ctl_tree_add(&m, &y, 1.0f, 1);
    /* path shares: 20 and 21 at 2/3, 30 and 31 at 1/3: a budget of 4 keeps x's chain and 30 */
    ctl_tree_vote(&m, VOTE_MAJORITY, 4, &out);
    assert_int_equal(out.n, 4);
    assert_true(has_path(&out, xa, 2));
    const int32_t y1[] = {30}, y2[] = {30, 31};
    assert_true(has_path(&out, y1, 1));
    assert_false(has_path(&out, y2, 2));
    for (int i = 1; i < out.n; i++)
        assert_true(out.parent[i] < i); /* parents first */
    /* a budget of 2 keeps the heavier speculator's first token only */
    ctl_tree_vote(&m, VOTE_MAJORITY, 2, &out);
    assert_int_equal(out.n, 2);
    assert_int_equal(out.tokens[1], 20);
}

static void vote_keeps_one_speculators_tree_by_confidence(void **state)
{
    (void)state;
    static ctl_tree m, out;
    /* root -> 40 (0.6) -> 42 (0.9); root -> 41 (0.3) */
    const int32_t tok[] = {40, 41, 42}, par[] = {-1, -1, 0};
    const float conf[] = {0.6f, 0.3f, 0.9f};
    arena_draft d = draft(3, tok, par, conf);
    ctl_tree_init(&m, 1);
    ctl_tree_add(&m, &d, 1.0f, 3);
    ctl_tree_vote(&m, VOTE_MAJORITY, 8, &out);
    assert_int_equal(out.n, 4); /* the whole tree fits: nothing is cut to a chain */
    ctl_tree_vote(&m, VOTE_MAJORITY, 3, &out);
    const int32_t deep[] = {40, 42};
    assert_int_equal(out.n, 3);
    assert_true(has_path(&out, deep, 2)); /* 0.54 beats 0.3 */
}

static void acr_rewards_and_punishes(void **state)
{
    (void)state;
    ctl_acr_params p = {.reward_threshold = 0.5,
                        .punish_threshold = 0.2,
                        .reward_factor = 1.1,
                        .punish_factor = 0.9};
    ctl_acr a = {.weight = 1.0};
    ctl_acr_update(&a, &p, 4, 4); /* rate 1 */
    assert_float_equal(a.acr, 1.0, 1e-12);
    assert_float_equal(a.weight, 1.1, 1e-12);
    ctl_acr_update(&a, &p, 4, 0); /* average 0.5: neither */
    assert_float_equal(a.acr, 0.5, 1e-12);
    assert_float_equal(a.weight, 1.1, 1e-12);
    ctl_acr_update(&a, &p, 4, 0);
    ctl_acr_update(&a, &p, 4, 0);
    ctl_acr_update(&a, &p, 4, 0); /* averages 1/3, 1/4, 1/5: not below 0.2 */
    assert_float_equal(a.weight, 1.1, 1e-12);
    ctl_acr_update(&a, &p, 4, 0); /* 1/6 < 0.2: punished */
    assert_float_equal(a.weight, 0.99, 1e-12);
    ctl_acr_update(&a, &p, 0, 0); /* no draft: no verdict */
    assert_int_equal(a.acr_n, 6);
    for (int i = 0; i < 100; i++)
        ctl_acr_update(&a, &p, 4, 0);
    assert_float_equal(a.weight, 0.05, 1e-12); /* floor */
}

/* cost per token with a minimum at length 5 */
static double cost_at(int len)
{
    return 1.0 + 0.1 * abs(len - 5);
}

static int run_length(int start, int decisions, int *at_best)
{
    ctl_length l;
    ctl_length_init(&l, start, 1, 9, 2, 6);
    *at_best = 0;
    for (int d = 0; d < decisions; d++) {
        for (int k = 0; k < 2; k++) /* a window of 2 cycles of 3 tokens */
            ctl_length_sample(&l, 3 * cost_at(l.len), 3);
        *at_best += l.len == 5;
    }
    return l.len;
}

static void length_grows_and_shrinks_to_the_cheapest(void **state)
{
    (void)state;
    int at_best;
    int end = run_length(1, 80, &at_best); /* grows */
    assert_true(end >= 4 && end <= 6);
    assert_true(at_best >= 40);
    end = run_length(9, 80, &at_best); /* shrinks */
    assert_true(end >= 4 && end <= 6);
    assert_true(at_best >= 40);
    /* a window is a ratio of sums: 1 token in 1 s and 3 in 1 s give 0.5 s per token */
    ctl_length l;
    ctl_length_init(&l, 3, 1, 7, 2, 6);
    ctl_length_sample(&l, 1.0, 1);
    assert_int_equal(l.len, 3);
    assert_int_equal(ctl_length_sample(&l, 1.0, 3), 4); /* measured 3, explores up */
    assert_float_equal(l.cost[3], 0.5, 1e-12);
}

/* A request's own length in a batch: rejected drafts bring it to the bottom after one window, a
 * partly accepted depth gives its rounded mean plus one, whole drafts climb by half the length
 * after half a window, up to hi; a cycle without a draft is not counted (the caller's part). */
static void reqlen_follows_the_accepted_depth(void **state)
{
    (void)state;
    ctl_reqlen l;
    ctl_reqlen_init(&l, 7, 1, 7, 4);
    for (int k = 0; k < 3; k++)
        assert_int_equal(ctl_reqlen_sample(&l, 0), 7);
    assert_int_equal(ctl_reqlen_sample(&l, 0), 1); /* nothing accepted: 0 + 1 */
    /* whole drafts at length 1: decided after 2 cycles, +1; at 2: +1; at 3: +1; at 4: +2 */
    const int path[] = {2, 3, 4, 6, 7};
    for (int d = 0; d < 5; d++) {
        assert_int_equal(ctl_reqlen_sample(&l, l.len), l.len);
        assert_int_equal(ctl_reqlen_sample(&l, l.len), path[d]);
    }
    assert_int_equal(ctl_reqlen_sample(&l, 7), 7); /* at the top: whole windows again */
    assert_int_equal(l.n, 1);
    /* partly accepted: 2, 3, 2, 3 of 7 -> mean 2.5 -> 3 (+ 1 = 4 after rounding 2.5 up) */
    ctl_reqlen_init(&l, 7, 1, 7, 4);
    const int acc[] = {2, 3, 2, 3};
    for (int k = 0; k < 4; k++)
        ctl_reqlen_sample(&l, acc[k]);
    assert_int_equal(l.len, 4);
    assert_int_equal(l.decisions, 1);
    /* 1, 1, 2, 1 -> mean 1.25 -> 2; clamped below by lo */
    const int acc2[] = {1, 1, 2, 1};
    for (int k = 0; k < 4; k++)
        ctl_reqlen_sample(&l, acc2[k]);
    assert_int_equal(l.len, 2);
    ctl_reqlen_init(&l, 5, 3, 6, 2);
    ctl_reqlen_sample(&l, 0);
    assert_int_equal(ctl_reqlen_sample(&l, 0), 3);
    assert_int_equal(ctl_reqlen_sample(&l, -1), 3); /* no verdict */
    assert_int_equal(l.n, 0);
}

/* Full cycles (every drafted token accepted) decide after half a window and climb by half the
 * length; one cycle short of full keeps the whole window and the one-step climb. */
static void length_climbs_fast_while_drafts_are_full(void **state)
{
    (void)state;
    ctl_length l;
    ctl_length_init(&l, 1, 1, 7, 8, 6);
    const int path[] = {2, 3, 4, 6, 7};
    for (int d = 0; d < 5; d++) {
        int from = l.len;
        for (int k = 0; k < 3; k++)
            assert_int_equal(ctl_length_sample(&l, 0.010, l.len + 1), from);
        assert_int_equal(ctl_length_sample(&l, 0.010, l.len + 1), path[d]);
    }
    /* at the top: nothing to climb to, whole windows again */
    for (int k = 0; k < 7; k++)
        assert_int_equal(ctl_length_sample(&l, 0.010, 8), 7);
    assert_int_equal(l.n, 7);
    /* one short cycle in the window: the usual rule after all 8 cycles, one step at a time */
    ctl_length_init(&l, 3, 1, 7, 8, 6);
    assert_int_equal(ctl_length_sample(&l, 0.010, 2), 3);
    for (int k = 0; k < 6; k++)
        assert_int_equal(ctl_length_sample(&l, 0.010, 4), 3);
    assert_int_equal(ctl_length_sample(&l, 0.010, 4), 4); /* explores up by one */
    assert_float_equal(l.cost[3], 0.080 / 30, 1e-12);
}

/* A good drafter (3 or more tokens a step) that loses one window narrowly stays on for one more;
 * two in a row switch it off without backing the probes off; a window that pays clears the
 * strike; a clear loss switches it off at once whatever its tokens a step. */
static void guard_keeps_a_good_drafter_on(void **state)
{
    (void)state;
    ctl_guard g;
    ctl_guard_init(&g, 0.010, 4, 8); /* plain: 10 ms a token */
    g.plain_sec = 100;
    for (int i = 0; i < CTL_GUARD_WARM; i++)
        assert_true(ctl_guard_sample(&g, true, 0.050, 1));
    /* 3 tokens a step at 10.1 ms a token: a narrow loss, one strike, still on */
    for (int i = 0; i < 4; i++)
        assert_true(ctl_guard_sample(&g, true, 0.0303, 3));
    assert_int_equal(g.strikes, 1);
    assert_float_equal(g.per_step, 3.0, 1e-12);
    /* a window that pays (8 ms a token) clears the strike */
    for (int i = 0; i < 4; i++)
        assert_true(ctl_guard_sample(&g, true, 0.024, 3));
    assert_int_equal(g.strikes, 0);
    /* two narrow losses in a row: off, the probe interval kept */
    for (int i = 0; i < 4; i++)
        assert_true(ctl_guard_sample(&g, true, 0.0303, 3));
    for (int i = 0; i < 3; i++)
        assert_true(ctl_guard_sample(&g, true, 0.0303, 3));
    assert_false(ctl_guard_sample(&g, true, 0.0303, 3));
    assert_int_equal(g.switches_off, 1);
    assert_int_equal(g.probe_now, 8);
    /* the same narrow loss at 2 tokens a step: off after one window, the interval doubled */
    ctl_guard_init(&g, 0.010, 4, 8);
    g.plain_sec = 100;
    for (int i = 0; i < CTL_GUARD_WARM; i++)
        ctl_guard_sample(&g, true, 0.050, 1);
    for (int i = 0; i < 3; i++)
        assert_true(ctl_guard_sample(&g, true, 0.0202, 2));
    assert_false(ctl_guard_sample(&g, true, 0.0202, 2));
    assert_int_equal(g.probe_now, 16);
    /* a clear loss (2 x plain) at 4 tokens a step: off after 2 cycles, backed off */
    ctl_guard_init(&g, 0.010, 4, 8);
    g.plain_sec = 100;
    for (int i = 0; i < CTL_GUARD_WARM; i++)
        ctl_guard_sample(&g, true, 0.050, 1);
    assert_true(ctl_guard_sample(&g, true, 0.080, 4));
    assert_false(ctl_guard_sample(&g, true, 0.080, 4));
    assert_int_equal(g.probe_now, 16);
}

static void guard_switches_off_and_back_on(void **state)
{
    (void)state;
    ctl_guard g;
    ctl_guard_init(&g, 0, 4, 8);
    assert_false(g.on); /* no plain figure yet: measure one */
    assert_int_equal(ctl_guard_plain_left(&g), 4);
    for (int i = 0; i < 3; i++)
        assert_false(ctl_guard_sample(&g, false, 0.010, 1));
    assert_int_equal(ctl_guard_plain_left(&g), 1);
    assert_true(ctl_guard_sample(&g, false, 0.010, 1)); /* base known: try speculation */
    assert_int_equal(ctl_guard_plain_left(&g), 0);
    assert_float_equal(g.base, 0.010, 1e-12);
    for (int i = 0; i < CTL_GUARD_WARM; i++) /* catching up: no verdict */
        assert_true(ctl_guard_sample(&g, true, 0.010, 1));
    /* speculation at 10.05 ms per token loses (narrowly): off after one window */
    for (int i = 0; i < 3; i++)
        assert_true(ctl_guard_sample(&g, true, 0.0201, 2));
    assert_false(ctl_guard_sample(&g, true, 0.0201, 2));
    assert_int_equal(g.switches_off, 1);
    assert_int_equal(g.probe_now, 16); /* the failed probe doubles the interval */
    /* a stray speculative sample while off is ignored */
    assert_false(ctl_guard_sample(&g, true, 0.001, 5));
    /* 16 plain cycles, then a probe (a free run goes on that long) */
    assert_int_equal(ctl_guard_plain_left(&g), 16);
    for (int i = 0; i < 15; i++)
        assert_false(ctl_guard_sample(&g, false, 0.010, 1));
    assert_int_equal(ctl_guard_plain_left(&g), 1);
    assert_true(ctl_guard_sample(&g, false, 0.010, 1));
    for (int i = 0; i < CTL_GUARD_WARM; i++) /* even a slow catch-up cycle is no verdict */
        assert_true(ctl_guard_sample(&g, true, 0.015, 1));
    /* now speculation pays (5 ms per token): it stays on, the interval resets */
    for (int i = 0; i < 40; i++)
        assert_true(ctl_guard_sample(&g, true, 0.010, 2));
    assert_int_equal(g.probe_now, 8);
    assert_int_equal(g.switches_off, 1);
    /* a hopeless probe (2 x the plain cost) ends after 2 cycles, not a whole window */
    ctl_guard_init(&g, 0.01, 8, 8);
    for (int i = 0; i < CTL_GUARD_WARM; i++)
        assert_true(ctl_guard_sample(&g, true, 1.0, 1));
    assert_true(ctl_guard_sample(&g, true, 0.020, 1));
    assert_false(ctl_guard_sample(&g, true, 0.020, 1));
    assert_float_equal(g.spec, 0.020, 1e-12);
    /* a new text re-tests a guard that paid once and then lost narrowly, at once (the window that
     * paid left 4 ms of credit, the loss is 0.4 ms) */
    ctl_guard_init(&g, 0, 4, 8);
    for (int i = 0; i < 4; i++)
        ctl_guard_sample(&g, false, 0.010, 1);
    for (int i = 0; i < CTL_GUARD_WARM + 4; i++)
        ctl_guard_sample(&g, true, 0.009, 1);
    assert_true(g.on);
    assert_int_equal(g.paid, 1);
    for (int i = 0; i < 4; i++)
        ctl_guard_sample(&g, true, 0.0101, 1);
    assert_false(g.on);
    ctl_guard_reprobe(&g);
    assert_true(g.on);
    assert_int_equal(g.warm, CTL_GUARD_WARM);
    ctl_guard_reprobe(&g); /* already on: nothing changes */
    assert_int_equal(g.switches_on, 2); /* after the first plain window, and now */
    /* the same narrow loss from speculators that never paid: no re-test per text, the backed-off
     * probe (16 plain cycles) instead */
    ctl_guard_init(&g, 0, 4, 8);
    g.plain_sec = 100; /* the budget is not what binds here */
    for (int i = 0; i < 4; i++)
        ctl_guard_sample(&g, false, 0.010, 1);
    for (int i = 0; i < CTL_GUARD_WARM + 4; i++)
        ctl_guard_sample(&g, true, 0.0101, 1);
    assert_false(g.on);
    ctl_guard_reprobe(&g);
    assert_false(g.on);
    assert_int_equal(ctl_guard_plain_left(&g), 16);
    /* a clear loser (3 x the plain cost) is not re-tested by a new text: it waits for its
     * backed-off probe (16 plain cycles), which a new text then no longer delays */
    ctl_guard_init(&g, 0.01, 4, 8);
    g.plain_sec = 100; /* as after long plain decoding: the probe budget is not what binds here */
    for (int i = 0; i < CTL_GUARD_WARM + 2; i++)
        ctl_guard_sample(&g, true, 0.030, 1);
    assert_false(g.on);
    assert_int_equal(g.probe_now, 16);
    ctl_guard_reprobe(&g);
    assert_false(g.on);
    for (int i = 0; i < 15; i++)
        assert_false(ctl_guard_sample(&g, false, 0.010, 1));
    assert_true(ctl_guard_sample(&g, false, 0.010, 1));
    assert_int_equal(g.switches_on, 1);
    /* a prior base starts it on */
    ctl_guard_init(&g, 0.01, 4, 8);
    assert_true(g.on);
}

/* Probes are paid from a budget of CTL_GUARD_BUDGET (1%) of the plain time: a probe that lost
 * 10 ms (4 tokens at 12.5 instead of 10 ms) waits for 1 s of plain decoding, not for its interval
 * of 16 cycles, and a new text does not re-test it before; gains pay the loss back. */
static void guard_probes_within_budget(void **state)
{
    (void)state;
    ctl_guard g;
    ctl_guard_init(&g, 0.01, 4, 8);
    for (int i = 0; i < CTL_GUARD_WARM; i++) /* catching up: not charged */
        assert_true(ctl_guard_sample(&g, true, 0.050, 1));
    for (int i = 0; i < 3; i++)
        assert_true(ctl_guard_sample(&g, true, 0.0125, 1));
    assert_false(ctl_guard_sample(&g, true, 0.0125, 1));
    assert_float_equal(g.loss, 0.010, 1e-9); /* 4 x 2.5 ms */
    assert_int_equal(g.probe_now, 16);
    /* 16 plain cycles (0.16 s): the interval is over but the budget (1.6 ms) is not there */
    for (int i = 0; i < 16; i++)
        assert_false(ctl_guard_sample(&g, false, 0.010, 1));
    ctl_guard_reprobe(&g); /* a narrow loser, but no budget: no re-test either */
    assert_false(g.on);
    assert_int_equal(ctl_guard_plain_left(&g), INT_MAX); /* no probe in sight */
    /* up to 0.96 s of plain time: 9.6 ms < 10 ms, still off; on once 1 s is reached */
    for (int i = 16; i < 96; i++)
        assert_false(ctl_guard_sample(&g, false, 0.010, 1));
    int more = 0;
    while (!ctl_guard_sample(&g, false, 0.010, 1) && more < 10)
        more++;
    assert_true(g.on);
    assert_true(g.plain_sec >= 1.0 - 1e-9 && g.plain_sec < 1.04);
    assert_int_equal(g.switches_on, 1);
    /* this probe pays (8 ms per token): what it saves pays the earlier loss back */
    for (int i = 0; i < CTL_GUARD_WARM; i++)
        assert_true(ctl_guard_sample(&g, true, 0.010, 1));
    for (int i = 0; i < 4; i++)
        assert_true(ctl_guard_sample(&g, true, 0.008, 1));
    assert_float_equal(g.loss, 0.002, 1e-9);
}

/* Savings are credit: a drafter that saved 40 ms (8 tokens at 5 instead of 10 ms) and then lost
 * two narrow windows (8 ms: no budget left without the credit: 1% of 40 ms of plain time is
 * 0.4 ms) is probed again at the next text, and its probe is not shut out. */
static void guard_savings_are_credit(void **state)
{
    (void)state;
    ctl_guard g;
    ctl_guard_init(&g, 0.01, 4, 8);
    g.plain_sec = 0.040; /* the plain window that measured the base */
    for (int i = 0; i < CTL_GUARD_WARM; i++)
        assert_true(ctl_guard_sample(&g, true, 0.050, 1));
    for (int i = 0; i < 8; i++) /* two windows at 5 ms a token: 40 ms saved */
        assert_true(ctl_guard_sample(&g, true, 0.005, 1));
    assert_float_equal(g.loss, -0.040, 1e-9);
    for (int i = 0; i < 8; i++) /* two narrow losses at 3 tokens a step, 11 ms a token */
        ctl_guard_sample(&g, true, 0.033, 3);
    assert_false(g.on);
    assert_float_equal(g.loss, -0.040 + 8 * 0.003, 1e-9);
    ctl_guard_reprobe(&g); /* the net cost is still a saving: a new text tests it at once */
    assert_true(g.on);
    assert_int_equal(g.switches_on, 1);
}

/* LLMCad's alpha rule on fixture trees: a chain accepted whole halves alpha; a chain of 4 with 1
 * accepted sets it to the wasted 3/4; over a tree the leaf path with the longest accepted prefix
 * is judged (the shortest on a tie); the floor is 1e-6. */
static void alpha_rule_on_fixture_trees(void **state)
{
    (void)state;
    const int32_t chain[4] = {10, 11, 12, 13}, chain_par[4] = {-1, 0, 1, 2};
    const int32_t all[5] = {10, 11, 12, 13, 99}, one[2] = {10, 50};
    assert_float_equal(ctl_alpha_update(0.2f, chain, chain_par, 4, all, 5), 0.1f, 1e-7);
    assert_float_equal(ctl_alpha_update(0.2f, chain, chain_par, 4, one, 2), 0.75f, 1e-7);
    /* root children 10 and 20; 10 -> 11 -> 12, 20 -> 21: the target took 20 21 22 */
    const int32_t tree[5] = {10, 20, 11, 21, 12}, tree_par[5] = {-1, -1, 0, 1, 2};
    const int32_t took[3] = {20, 21, 22};
    assert_float_equal(ctl_alpha_update(0.2f, tree, tree_par, 5, took, 3), 0.1f, 1e-7);
    /* it took 10 then 30: the path 10 11 12 has 1 of 3 right, the path 20 21 none */
    const int32_t took2[2] = {10, 30};
    assert_float_equal(ctl_alpha_update(0.2f, tree, tree_par, 5, took2, 2), 2.0f / 3, 1e-6);
    /* nothing right anywhere: the shortest path (20 21) is judged: all wasted */
    const int32_t took3[1] = {7};
    assert_float_equal(ctl_alpha_update(0.2f, tree, tree_par, 5, took3, 1), 1.0f, 1e-7);
    assert_float_equal(ctl_alpha_update(1.5e-6f, chain, chain_par, 4, all, 5), 1e-6f, 1e-12);
    assert_float_equal(ctl_alpha_update(0.3f, chain, chain_par, 0, all, 5), 0.3f, 0);
}

static void plan_tree_adds_the_most_likely_node(void **state)
{
    (void)state;
    const double acc[] = {0.8, 0.1, 0.7, 0.1, 0.6, 0.1}; /* 3 depths x 2 ranks */
    ctl_template t;
    double e = ctl_plan_tree(acc, 3, 2, 4, &t);
    assert_int_equal(t.n, 4); /* the chain of best candidates: 0.8, 0.56, 0.336 */
    for (int i = 1; i < 4; i++) {
        assert_int_equal(t.parent[i], i - 1);
        assert_int_equal(t.rank[i], 0);
    }
    assert_float_equal(e, 1 + 0.8 + 0.56 + 0.336, 1e-12);
    e = ctl_plan_tree(acc, 3, 2, 5, &t); /* next: rank 1 at depth 1 (0.1 > 0.08) */
    assert_int_equal(t.n, 5);
    assert_int_equal(t.parent[4], 0);
    assert_int_equal(t.rank[4], 1);
    assert_float_equal(e, 1 + 0.8 + 0.56 + 0.336 + 0.1, 1e-12);
    e = ctl_plan_tree(acc, 3, 2, 1, &t);
    assert_int_equal(t.n, 1);
    assert_float_equal(e, 1.0, 1e-12);
}

static void plan_eval_and_refine_on_recorded_paths(void **state)
{
    (void)state;
    /* template: root -> rank 0 -> rank 0 */
    ctl_template t = {.n = 3, .parent = {-1, 0, 1}, .rank = {0, 0, 0}, .depth = {0, 1, 2}};
    const int8_t paths[] = {0, 0, -1, /* 2 accepted + bonus = 3 */
                            1, 0, 0,  /* 0 + 1 */
                            0, 1, 0}; /* 1 + 1 */
    assert_float_equal(ctl_plan_eval(&t, paths, 3, 3), 2.0, 1e-12);
    /* calibration where the second candidate at depth 1 is right half of the time */
    int8_t cal[8 * 3];
    for (int i = 0; i < 8; i++) {
        cal[3 * i] = (int8_t)(i % 2); /* rank 0 or 1 at depth 1 */
        cal[3 * i + 1] = (int8_t)(i % 4 == 0 ? 0 : -1);
        cal[3 * i + 2] = -1;
    }
    double before = ctl_plan_eval(&t, cal, 8, 3);
    double after = ctl_plan_refine(&t, cal, 8, 3, 2, 4);
    assert_true(after > before);
    assert_float_equal(after, ctl_plan_eval(&t, cal, 8, 3), 1e-12);
    bool has_r1 = false;
    for (int i = 1; i < t.n; i++)
        has_r1 |= t.parent[i] == 0 && t.rank[i] == 1;
    assert_true(has_r1);
    assert_int_equal(t.n, 3); /* a move, not a growth */
}

static void tree_fit_keeps_the_template_shape(void **state)
{
    (void)state;
    static ctl_tree m, out;
    /* root -> 50 (0.7) -> 52 (0.9) -> 53 (0.9); root -> 51 (0.2) */
    const int32_t tok[] = {50, 51, 52, 53}, par[] = {-1, -1, 0, 2};
    const float conf[] = {0.7f, 0.2f, 0.9f, 0.9f};
    arena_draft d = draft(4, tok, par, conf);
    ctl_tree_init(&m, 1);
    ctl_tree_add(&m, &d, 1.0f, 0);
    /* template: best child, its best child, and the second child of the root */
    ctl_template t = {.n = 4, .parent = {-1, 0, 1, 0}, .rank = {0, 0, 0, 1}, .depth = {0, 1, 2, 1}};
    ctl_tree_fit(&m, &t, &out);
    assert_int_equal(out.n, 4); /* 50, 52 and 51 kept, 53 (depth 3) cut */
    const int32_t p1[] = {50, 52}, p2[] = {51}, p3[] = {50, 52, 53};
    assert_true(has_path(&out, p1, 2));
    assert_true(has_path(&out, p2, 1));
    assert_false(has_path(&out, p3, 3));
    /* a chain template keeps the chain of best candidates only */
    ctl_template chain = {.n = 3, .parent = {-1, 0, 1}, .rank = {0, 0, 0}, .depth = {0, 1, 2}};
    ctl_tree_fit(&m, &chain, &out);
    assert_int_equal(out.n, 3);
    assert_true(has_path(&out, p1, 2));
}

static void plan_best_width_from_curves(void **state)
{
    (void)state;
    const int w[] = {1, 2, 4, 8};
    const double sec[] = {0.010, 0.011, 0.014, 0.020};
    const double good[] = {1.0, 1.6, 2.4, 3.0}, poor[] = {1.0, 1.05, 1.1, 1.2};
    assert_int_equal(ctl_plan_best_width(w, sec, good, 4), 2); /* 171 tok/s at W = 4 */
    assert_int_equal(ctl_plan_best_width(w, sec, poor, 4), 0); /* W = 1: do not speculate */
}

/* The branch threshold: raised while side branches are rarely taken (a drafter that mirrors the
 * target), up to 1 (a chain); lowered back to the configured one when they are taken; a long run
 * of trees without branch points brings a raised threshold down so branching is tested again. */
static void branch_threshold_follows_side_branches(void **state)
{
    (void)state;
    ctl_branch b;
    ctl_branch_init(&b, 0.2f);
    for (int i = 0; i < 7; i++) /* 14 points, none side: the window is not full yet */
        ctl_branch_update(&b, 2, 0);
    assert_float_equal(b.value, 0.2f, 1e-6);
    ctl_branch_update(&b, 2, 0); /* 16 points, 0 side: < 10% -> doubles */
    assert_float_equal(b.value, 0.4f, 1e-6);
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 8; i++)
            ctl_branch_update(&b, 2, 0);
    assert_float_equal(b.value, 1.0f, 1e-6); /* 0.8 -> capped at 1: a chain */
    for (int i = 0; i < CTL_BRANCH_QUIET - 1; i++) /* chains: nothing to learn */
        ctl_branch_update(&b, 0, 0);
    assert_float_equal(b.value, 1.0f, 1e-6);
    ctl_branch_update(&b, 0, 0); /* the quiet run ends: test branching again */
    assert_float_equal(b.value, 0.5f, 1e-6);
    /* side branches taken at 4 of 16 points (25%: neither side of the band) */
    for (int i = 0; i < 4; i++)
        ctl_branch_update(&b, 4, 1);
    assert_float_equal(b.value, 0.5f, 1e-6);
    /* at 8 of 16 (50%): halves, never below the configured threshold */
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 4; i++)
            ctl_branch_update(&b, 4, 2);
    assert_float_equal(b.value, 0.2f, 1e-6);
}

/* Prompt lookup in the free run: acceptance per match order follows the verdicts (decayed), and
 * the draft lengths are those that maximise expected tokens per unit of step time on the given
 * curve — the longest chain on a flat curve, one token where each costs a tenth of a step, none
 * where a token more costs a step or the gain is within the margin, the tokens to the row whose
 * drafts are likelier right. */
static void lookup_estimates_and_lengths(void **state)
{
    (void)state;
    ctl_lookup l;
    ctl_lookup_init(&l);
    assert_float_equal(ctl_lookup_p(&l, 3), 0.25, 1e-6);
    ctl_lookup_record(&l, 3, 4, 4); /* 4 checked, 4 right */
    assert_float_equal(ctl_lookup_p(&l, 3), 4.95 / 7.8, 1e-5);
    ctl_lookup_record(&l, 3, 4, 1); /* 2 checked (the first wrong one ends it), 1 right */
    assert_float_equal(ctl_lookup_p(&l, 3), (4.95 * 0.95 + 1) / (7.8 * 0.95 + 2), 1e-5);
    assert_float_equal(ctl_lookup_p(&l, 1), 0.25, 1e-6); /* other orders untouched */
    ctl_lookup_record(&l, 0, 2, 0);                      /* order clamped to 1 */
    assert_float_equal(ctl_lookup_p(&l, 1), 0.95 / 4.8, 1e-5);
    ctl_lookup_record(&l, 2, 0, 0); /* nothing drafted: no verdict */
    assert_float_equal(ctl_lookup_p(&l, 2), 0.25, 1e-6);

    float flat[9], tenth[9], step[9], margin[3] = {0, 1.0f, 1.24f};
    for (int w = 0; w <= 8; w++) {
        flat[w] = 1.0f;
        tenth[w] = 1.0f + 0.1f * (float)(w - 1);
        step[w] = (float)w;
    }
    ctl_lookup fresh;
    ctl_lookup_init(&fresh); /* p = 0.25 for every order */
    int one_order[1] = {3}, avail4[1] = {4}, none[1] = {0}, d[2];
    assert_int_equal(ctl_lookup_lengths(&fresh, 1, one_order, avail4, flat, 8, d), 5);
    assert_int_equal(d[0], 4);
    assert_int_equal(ctl_lookup_lengths(&fresh, 1, one_order, avail4, tenth, 8, d), 2);
    assert_int_equal(d[0], 1); /* 1.25 / 1.1 beats 1.3125 / 1.2 and 1 / 1 */
    assert_int_equal(ctl_lookup_lengths(&fresh, 1, one_order, avail4, step, 8, d), 1);
    assert_int_equal(d[0], 0);
    assert_int_equal(ctl_lookup_lengths(&fresh, 1, one_order, avail4, margin, 2, d), 1);
    assert_int_equal(d[0], 0); /* 1.25 / 1.24: under the margin */
    assert_int_equal(ctl_lookup_lengths(&fresh, 1, one_order, none, flat, 8, d), 1);
    assert_int_equal(d[0], 0);

    /* two rows: an order-3 match that has been right 20 times running, an order-1 match at the
     * prior; the step's tokens go to the first */
    ctl_lookup sure;
    ctl_lookup_init(&sure);
    for (int i = 0; i < 20; i++)
        ctl_lookup_record(&sure, 3, 4, 4);
    assert_true(ctl_lookup_p(&sure, 3) > 0.97);
    const float two[9] = {0, 1.0f, 1.0f, 1.05f, 1.10f, 1.15f, 1.20f, 1.30f, 1.40f};
    int orders[2] = {3, 1}, avail[2] = {4, 4};
    assert_int_equal(ctl_lookup_lengths(&sure, 2, orders, avail, two, 8, d), 6);
    assert_int_equal(d[0], 4);
    assert_int_equal(d[1], 0);
}

/* The cost curve from measured step times: interpolated, made non-decreasing, capped; broken
 * curves refused. */
static void cost_curve_from_step_times(void **state)
{
    (void)state;
    const int w[] = {1, 2, 4, 8, 16};
    const double t[] = {2.0, 2.2, 2.1, 3.0, 5.0}; /* t(4) dips below t(2): noise */
    float c[RT_TEST_W + 1];
    assert_int_equal(ctl_cost_curve(w, t, 5, 64, c), 16);
    assert_float_equal(c[1], 1.0, 1e-6);
    assert_float_equal(c[2], 1.1, 1e-6);
    assert_float_equal(c[3], 1.1, 1e-6); /* 1.075 interpolated, raised to t(2)'s */
    assert_float_equal(c[4], 1.1, 1e-6);
    assert_float_equal(c[6], (2.1 + 0.9 * 2 / 4) / 2.0, 1e-6);
    assert_float_equal(c[16], 2.5, 1e-6);
    assert_int_equal(ctl_cost_curve(w, t, 5, 10, c), 10); /* capped inside a segment */
    assert_float_equal(c[10], (3.0 + 2.0 * 2 / 8) / 2.0, 1e-6);
    const int w2[] = {2, 4}, w3[] = {1, 4, 4};
    const double t3[] = {1.0, 2.0, 3.0}, t0[] = {1.0, 0.0};
    assert_int_equal(ctl_cost_curve(w2, t, 2, 64, c), 0);  /* not from width 1 */
    assert_int_equal(ctl_cost_curve(w3, t3, 3, 64, c), 0); /* widths not increasing */
    assert_int_equal(ctl_cost_curve(w, t0, 2, 64, c), 0);  /* a time of 0 */
}

/* A fixture machine for the split search: part p does group g's work at speed v[g][p]; a step
 * takes as long as its slowest part. */
typedef struct {
    int groups, parts, calls, fail_at;
    double v[4][4];
    double cap0; /* > 0: part 0 holds at most this share of the work in all (its memory), more
                    measures as INFINITY (the bench does not time a split whose part cannot hold
                    its weights) */
} split_fixture;

static int split_eval(const float *cands, int n, double *ms, void *arg)
{
    split_fixture *f = arg;
    if (++f->calls == f->fail_at)
        return -1;
    for (int i = 0; i < n; i++) {
        const float *c = cands + (size_t)i * f->groups * f->parts;
        double worst = 0;
        for (int p = 0; p < f->parts; p++) {
            double t = 0;
            for (int g = 0; g < f->groups; g++)
                t += c[g * f->parts + p] / f->v[g][p];
            worst = t > worst ? t : worst;
        }
        double held = 0;
        for (int g = 0; g < f->groups; g++)
            held += c[g * f->parts] / f->groups;
        ms[i] = f->cap0 > 0 && held > f->cap0 + 1e-6 ? INFINITY : worst;
    }
    return 0;
}

/* The split search finds the balance of parts of different speeds from an even start, sends each
 * kind of work to the part that does it best, starts from the parts' speeds when given them, and
 * stops on a failed measurement. */
static void split_search_balances_parts(void **state)
{
    (void)state;
    ctl_split_opts o = {.groups = 2, .parts = 2, .delta = 0.1, .min_delta = 0.02, .margin = 0.001,
                        .max_rounds = 40};
    float best[8];
    double ms;
    int rounds;
    /* part 0 three times as fast at everything: three quarters of the work in all (any mix of
     * the two groups that adds up to it is as good) */
    split_fixture f = {.groups = 2, .parts = 2, .v = {{3, 1}, {3, 1}}};
    assert_int_equal(ctl_split_search(&o, NULL, split_eval, &f, best, &ms, &rounds), 0);
    for (int g = 0; g < 2; g++)
        assert_true(fabsf(best[g * 2] + best[g * 2 + 1] - 1.0f) < 1e-5f);
    assert_true(fabsf(best[0] + best[2] - 1.5f) <= 0.05f);
    assert_true(ms <= 0.5 * 1.04); /* from 1.0 at the even start */
    assert_true(rounds > 2);
    /* group 0 runs better on part 1, group 1 on part 0: each goes where it runs best */
    split_fixture g2 = {.groups = 2, .parts = 2, .v = {{1, 4}, {4, 1}}};
    assert_int_equal(ctl_split_search(&o, NULL, split_eval, &g2, best, &ms, &rounds), 0);
    assert_true(best[0] <= 0.05f && best[2] >= 0.95f);
    /* three kinds: the first runs better on part 1, the others on part 0 — the first goes to
     * part 1 whole, the others 0.9 / 0.1 (0.45 per step, from 0.75 at the even start) */
    ctl_split_opts og = o;
    og.groups = 3;
    split_fixture f6 = {.groups = 3, .parts = 2, .v = {{1, 4}, {4, 1}, {4, 1}}};
    assert_int_equal(ctl_split_search(&og, NULL, split_eval, &f6, best, &ms, &rounds), 0);
    assert_true(best[0] <= 0.05f);
    assert_true(fabsf(best[2] - 0.9f) <= 0.05f && fabsf(best[4] - 0.9f) <= 0.05f);
    assert_true(ms <= 0.46);
    /* the parts' own times given: the start is already the balance, and no move beats it */
    double part_ms[2] = {1.0, 3.0};
    split_fixture f3 = {.groups = 2, .parts = 2, .v = {{3, 1}, {3, 1}}};
    assert_int_equal(ctl_split_search(&o, part_ms, split_eval, &f3, best, &ms, &rounds), 0);
    assert_true(fabsf(best[0] - 0.75f) < 1e-6f && fabsf(best[2] - 0.75f) < 1e-6f);
    /* three parts of speeds 1, 2, 3 */
    ctl_split_opts o3 = o;
    o3.groups = 1;
    o3.parts = 3;
    split_fixture f4 = {.groups = 1, .parts = 3, .v = {{1, 2, 3}}};
    assert_int_equal(ctl_split_search(&o3, NULL, split_eval, &f4, best, &ms, &rounds), 0);
    assert_true(fabsf(best[0] - 1.0f / 6) <= 0.03f && fabsf(best[2] - 0.5f) <= 0.03f);
    /* a measurement that fails ends the search with -1 */
    split_fixture f5 = {.groups = 2, .parts = 2, .v = {{3, 1}, {3, 1}}, .fail_at = 3};
    assert_int_equal(ctl_split_search(&o, NULL, split_eval, &f5, best, &ms, &rounds), -1);
    assert_int_equal(f5.calls, 3);
    o.groups = 0;
    assert_int_equal(ctl_split_search(&o, NULL, split_eval, &f, best, &ms, &rounds), -1);
}

/* A part whose memory holds at most half the weights (--gpu-memory-limit): it cannot run alone
 * (its time alone is INFINITY), so the search starts with nothing on it and gives it work up to
 * its cap — the balance of the speeds (0.8) is out of reach, the cap (0.5) is the best split;
 * every part unable to run alone: an even start, not a division by zero. */
static void split_search_respects_a_memory_cap(void **state)
{
    (void)state;
    ctl_split_opts o = {.groups = 1, .parts = 2, .delta = 0.1, .min_delta = 0.02, .margin = 0.001,
                        .max_rounds = 40};
    float best[2];
    double ms, rounds_ms;
    int rounds;
    split_fixture f = {.groups = 1, .parts = 2, .v = {{4, 1}}, .cap0 = 0.5};
    double part_ms[2] = {INFINITY, 1.0};
    assert_int_equal(ctl_split_search(&o, part_ms, split_eval, &f, best, &ms, &rounds), 0);
    assert_true(best[0] <= 0.5f + 1e-5f && best[0] >= 0.45f);
    assert_true(isfinite(ms) && ms <= 0.55);
    /* without the cap the same search goes past it, to the balance */
    split_fixture g = {.groups = 1, .parts = 2, .v = {{4, 1}}};
    assert_int_equal(ctl_split_search(&o, NULL, split_eval, &g, best, &rounds_ms, &rounds), 0);
    assert_true(fabsf(best[0] - 0.8f) <= 0.03f);
    double none[2] = {INFINITY, INFINITY};
    split_fixture h = {.groups = 1, .parts = 2, .v = {{1, 1}}};
    assert_int_equal(ctl_split_search(&o, none, split_eval, &h, best, &ms, &rounds), 0);
    assert_true(fabsf(best[0] - 0.5f) < 1e-5f);
}

/* ARCA's choice of devices: the fastest part alone unless a split beats it by the margin; a part
 * that cannot hold the model alone is never chosen alone, and the sentence says why. */
static void device_choice_on_fixtures(void **state)
{
    (void)state;
    const char *names[2] = {"gpu", "cpu"};
    char why[400];
    /* the model fits the GPU, which is 4x the CPU: the GPU alone, the split adds nothing */
    double a[2] = {10.0, 40.0};
    assert_int_equal(ctl_device_choice(a, names, 2, 9.95, 0.01, why, sizeof why), 0);
    assert_non_null(strstr(why, "gpu alone"));
    /* the split clearly faster: the split */
    assert_int_equal(ctl_device_choice(a, names, 2, 8.0, 0.01, why, sizeof why), -1);
    assert_non_null(strstr(why, "1.25x"));
    /* the GPU over its memory limit: never alone; the split beats the CPU alone */
    double b[2] = {INFINITY, 40.0};
    assert_int_equal(ctl_device_choice(b, names, 2, 25.0, 0.01, why, sizeof why), -1);
    assert_non_null(strstr(why, "gpu cannot hold the model alone"));
    assert_non_null(strstr(why, "1.60x the cpu alone"));
    /* ... and a split no better than the CPU alone: the CPU alone */
    assert_int_equal(ctl_device_choice(b, names, 2, 41.0, 0.01, why, sizeof why), 1);
    /* nothing can run alone: the split, saying so */
    double c[2] = {INFINITY, INFINITY};
    assert_int_equal(ctl_device_choice(c, names, 2, 41.0, 0.01, why, sizeof why), -1);
    assert_non_null(strstr(why, "no part can hold the model alone"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(vote_agreeing_speculators_give_one_chain),
        cmocka_unit_test(vote_splits_the_width_by_weight),
        cmocka_unit_test(vote_keeps_one_speculators_tree_by_confidence),
        cmocka_unit_test(acr_rewards_and_punishes),
        cmocka_unit_test(length_grows_and_shrinks_to_the_cheapest),
        cmocka_unit_test(length_climbs_fast_while_drafts_are_full),
        cmocka_unit_test(reqlen_follows_the_accepted_depth),
        cmocka_unit_test(guard_switches_off_and_back_on),
        cmocka_unit_test(guard_keeps_a_good_drafter_on),
        cmocka_unit_test(guard_probes_within_budget),
        cmocka_unit_test(guard_savings_are_credit),
        cmocka_unit_test(alpha_rule_on_fixture_trees),
        cmocka_unit_test(plan_tree_adds_the_most_likely_node),
        cmocka_unit_test(plan_eval_and_refine_on_recorded_paths),
        cmocka_unit_test(tree_fit_keeps_the_template_shape),
        cmocka_unit_test(plan_best_width_from_curves),
        cmocka_unit_test(branch_threshold_follows_side_branches),
        cmocka_unit_test(lookup_estimates_and_lengths),
        cmocka_unit_test(cost_curve_from_step_times),
        cmocka_unit_test(split_search_balances_parts),
        cmocka_unit_test(split_search_respects_a_memory_cap),
        cmocka_unit_test(device_choice_on_fixtures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
