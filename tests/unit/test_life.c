/*
 * tests/unit/test_life.c — a role's liveness (group/runtime.h, rt_life): heartbeats every
 * RT_HEARTBEAT_MS, none while the main thread has been silent for stall_ms (unless it may not
 * stall yet), and again once it shows a sign of life.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "group/runtime.h"

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void heartbeats_keep_their_cadence(void **state)
{
    (void)state;
    rt_life l = {.role = "test", .stall_ms = 1000};
    rt_stamp(&l.alive_us);
    assert_true(rt_life_due(&l, true));  /* none sent yet */
    assert_false(rt_life_due(&l, true)); /* one just went out */
    sleep_ms(RT_HEARTBEAT_MS + 20);
    rt_stamp(&l.alive_us);
    assert_true(rt_life_due(&l, true));
}

static void a_silent_main_thread_stops_them_until_it_lives(void **state)
{
    (void)state;
    rt_life l = {.role = "test", .stall_ms = 100};
    rt_stamp(&l.alive_us);
    sleep_ms(150); /* the main thread silent past stall_ms */
    assert_false(rt_life_due(&l, true));
    assert_true(l.stalled);
    assert_true(rt_life_due(&l, false)); /* joining: it may not stall yet */
    sleep_ms(RT_HEARTBEAT_MS + 20);
    assert_false(rt_life_due(&l, true)); /* still silent */
    rt_stamp(&l.alive_us);               /* a sign of life */
    assert_true(rt_life_due(&l, true));
    assert_false(l.stalled);
    assert_true(rt_age_us(&l.alive_us) < 100000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(heartbeats_keep_their_cadence),
        cmocka_unit_test(a_silent_main_thread_stops_them_until_it_lives),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
