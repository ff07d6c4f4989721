/* SPDX-License-Identifier: MIT */
/* Tests for agent/health-xid.c: the XID classes follow NVIDIA's XID catalog (application errors are
 * ignored, row-remap/ECC/GSP errors need a reset, a GPU off the bus a reboot), unknown XIDs degrade,
 * and health.xid.ignore / health.xid.fatal move codes either way (fatal wins); the journal's bound on an
 * XID storm (one line per code and window, then a count). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "health.h"
#include "strv.h"

static void test_catalog(void **state) {
        const char *text;

        /* The list: usually the application's fault … */
        static const unsigned app[] = { 13, 31, 43, 45 };
        for (size_t i = 0; i < ELEMENTSOF(app); i++)
                assert_int_equal(health_xid_classify(app[i], NULL, NULL, NULL), XID_APPLICATION);
        /* … and never. */
        static const unsigned not_app[] = { 48, 63, 64, 74, 79, 92, 94, 95, 119, 120 };
        for (size_t i = 0; i < ELEMENTSOF(not_app); i++)
                assert_int_not_equal(health_xid_classify(not_app[i], NULL, NULL, NULL), XID_APPLICATION);
        assert_int_equal(health_xid_classify(79, NULL, NULL, &text), XID_REBOOT);
        assert_string_equal(text, "GPU has fallen off the bus");
        assert_int_equal(health_xid_classify(48, NULL, NULL, NULL), XID_RESET);
        assert_int_equal(health_xid_classify(95, NULL, NULL, NULL), XID_RESET);
        assert_int_equal(health_xid_classify(94, NULL, NULL, NULL), XID_RECOVERABLE);
        assert_int_equal(health_xid_classify(63, NULL, NULL, NULL), XID_RECOVERABLE);
        /* A context switch timeout: the driver recovers the channel, the application restarts. */
        assert_int_equal(health_xid_classify(109, NULL, NULL, &text), XID_RECOVERABLE);
        assert_string_equal(text, "context switch timeout (the application must restart)");
        /* Not in the table: degraded until a re-check, not ignored, not failed. */
        assert_int_equal(health_xid_classify(9999, NULL, NULL, &text), XID_RECOVERABLE);
        assert_string_equal(text, "not in the XID table");
}

static void test_overrides(void **state) {
        char *ignore[] = { (char *) "48", (char *) "79", NULL };
        char *fatal[] = { (char *) "13", (char *) "79", NULL };

        assert_int_equal(health_xid_classify(48, ignore, NULL, NULL), XID_APPLICATION);
        assert_int_equal(health_xid_classify(13, NULL, fatal, NULL), XID_RESET);
        /* Listed in both: fatal wins, and a reboot XID stays a reboot. */
        assert_int_equal(health_xid_classify(79, ignore, fatal, NULL), XID_REBOOT);
        assert_int_equal(health_xid_classify(31, ignore, fatal, NULL), XID_APPLICATION);
        assert_string_equal(xid_action_to_string(XID_RESET), "reset");
        assert_string_equal(gpu_health_to_string(GPU_HEALTH_DEGRADED), "degraded");
        assert_null(gpu_health_to_string(_GPU_HEALTH_MAX));
}

static void test_xid_log_storm(void **state) {
        XidLog l = {};
        XidLogSlot more[XID_LOG_SLOTS];
        uint64_t t0 = 5 * XID_LOG_WINDOW_USEC, logged = 0;

        assert_int_equal(xid_log_deadline(&l), 0);
        /* 512 of XID 13 and 3 of XID 31, interleaved: the first of each is logged, the rest counted. */
        for (unsigned i = 0; i < 512; i++) {
                logged += xid_log_note(&l, 13, t0 + i);
                if (i < 3)
                        logged += xid_log_note(&l, 31, t0 + i);
        }
        assert_int_equal(logged, 2);
        assert_int_equal(xid_log_deadline(&l), t0 + XID_LOG_WINDOW_USEC);
        assert_int_equal(xid_log_flush(&l, more), 2);
        assert_int_equal(more[0].xid, 13);
        assert_int_equal(more[0].more, 511);
        assert_int_equal(more[1].xid, 31);
        assert_int_equal(more[1].more, 2);
        /* A new window logs the first again; one XID alone leaves nothing to count. */
        assert_int_equal(xid_log_deadline(&l), 0);
        assert_true(xid_log_note(&l, 13, t0 + XID_LOG_WINDOW_USEC));
        assert_int_equal(xid_log_flush(&l, more), 0);
        /* More codes than slots in one window: the extra ones are each logged, never lost. */
        for (unsigned x = 1; x <= XID_LOG_SLOTS; x++)
                assert_true(xid_log_note(&l, x, t0));
        assert_true(xid_log_note(&l, 100, t0));
        assert_true(xid_log_note(&l, 100, t0));
        assert_false(xid_log_note(&l, 1, t0));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_catalog),
                cmocka_unit_test(test_overrides),
                cmocka_unit_test(test_xid_log_storm),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
