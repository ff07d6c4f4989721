/* SPDX-License-Identifier: MIT */
/* Tests for agent/health-xid.c: the XID classes follow NVIDIA's XID catalog (application errors are
 * ignored, row-remap/ECC/GSP errors need a reset, a GPU off the bus a reboot), unknown XIDs degrade,
 * and health.xid.ignore / health.xid.fatal move codes either way (fatal wins). */
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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_catalog),
                cmocka_unit_test(test_overrides),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
