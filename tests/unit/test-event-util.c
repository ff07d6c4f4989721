/* SPDX-License-Identifier: MIT */
/* Tests for agent/basic/event-util.c: the first call adds a named one-shot timer, a later call moves
 * and re-enables the same source (a fired one-shot is disabled: it must fire again), and a re-arm
 * before it fires replaces the earlier time rather than adding a second timer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "event-util.h"
#include "macro.h"

typedef struct Count {
        unsigned fired;
} Count;

static int on_time(sd_event_source *s, uint64_t usec, void *userdata) {
        Count *c = userdata;
        c->fired++;
        return 0;
}

/* Runs the loop until the timer has fired `want` times in all (at most 5 s). */
static void run_until(sd_event *e, Count *c, unsigned want) {
        for (int i = 0; c->fired < want && i < 50; i++)
                assert_return_code(sd_event_run(e, 100 * USEC_PER_MSEC), 0);
        assert_int_equal(c->fired, want);
}

static void test_relative_add_rearm(void **state) {
        sd_event *e = NULL;
        sd_event_source *s = NULL;
        Count c = {};
        const char *desc = NULL;
        int enabled = -1;

        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(event_reset_time_relative(e, &s, CLOCK_MONOTONIC, 1000, 0, on_time, &c, "test-timer"), 0);
        assert_non_null(s);
        assert_return_code(sd_event_source_get_description(s, &desc), 0);
        assert_string_equal(desc, "test-timer");
        run_until(e, &c, 1);
        /* Fired: the one-shot is off now. Re-arming must enable it again, on the same source. */
        assert_return_code(sd_event_source_get_enabled(s, &enabled), 0);
        assert_int_equal(enabled, SD_EVENT_OFF);
        sd_event_source *before = s;
        assert_return_code(event_reset_time_relative(e, &s, CLOCK_MONOTONIC, 1000, 0, on_time, &c, "other"), 0);
        assert_ptr_equal(s, before);
        assert_return_code(sd_event_source_get_description(s, &desc), 0);
        assert_string_equal(desc, "test-timer");
        assert_return_code(sd_event_source_get_enabled(s, &enabled), 0);
        assert_int_equal(enabled, SD_EVENT_ONESHOT);
        run_until(e, &c, 2);

        sd_event_source_disable_unref(s);
        sd_event_unref(e);
}

static void test_absolute_moves_time(void **state) {
        sd_event *e = NULL;
        sd_event_source *s = NULL;
        Count c = {};
        uint64_t now, when = 0;

        assert_return_code(sd_event_new(&e), 0);
        assert_return_code(sd_event_now(e, CLOCK_MONOTONIC, &now), 0);
        assert_return_code(event_reset_time(e, &s, CLOCK_MONOTONIC, now + 3600 * USEC_PER_SEC, 0, on_time, &c, "far"), 0);
        assert_return_code(event_reset_time(e, &s, CLOCK_MONOTONIC, now + 1000, 0, on_time, &c, "far"), 0);
        assert_return_code(sd_event_source_get_time(s, &when), 0);
        assert_int_equal(when, now + 1000);
        run_until(e, &c, 1);

        sd_event_source_disable_unref(s);
        sd_event_unref(e);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_relative_add_rearm),
                cmocka_unit_test(test_absolute_moves_time),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
