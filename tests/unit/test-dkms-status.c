/* SPDX-License-Identifier: MIT */
/* Tests modules/dkms-status.c, the parts of the DKMS layer that run no process: `dkms status` parsing
 * in both formats (DKMS 3 "name/version, kernel, arch: state" and DKMS 2 "name, version, kernel, arch:
 * state"), noise that is not a module, looking a module up, elapsed-time formatting and the string
 * tables. The runner and `dkms status` run for real are in test-dkms.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dkms.h"
#include "macro.h"

static void test_status_parse_dkms3(void **state) {
        DkmsModule *l = NULL;
        size_t n = 0;
        const DkmsModule *m;
        const char *text =
                "Error! Could not locate dkms.conf file.\n"
                "File: /var/lib/dkms/foo/1.0/source/dkms.conf does not exist.\n"
                "nvidia-current/535.261.03, 6.1.0-57-amd64, x86_64: installed\n"
                "nvidia-current/535.261.03, 6.1.0-58-amd64, x86_64: built\n"
                "nvidia-current/535.261.03, 6.1.0-56-amd64, x86_64: installed (WARNING! Diff between built and installed module!)\n"
                "nvidia-current-peermem/535.261.03: added\n"
                "foo/1.0: broken\n"
                "virtualbox/7.0.20, 6.1.0-57-amd64, x86_64: installed (Original modules exist)\r\n";

        assert_return_code(dkms_status_parse(text, &l, &n), 0);
        assert_int_equal(n, 6);

        assert_string_equal(l[0].name, "nvidia-current");
        assert_string_equal(l[0].version, "535.261.03");
        assert_string_equal(l[0].kernel, "6.1.0-57-amd64");
        assert_string_equal(l[0].arch, "x86_64");
        assert_int_equal(l[0].state, DKMS_MODULE_INSTALLED);
        assert_null(l[0].note);

        assert_int_equal(l[1].state, DKMS_MODULE_BUILT);
        assert_string_equal(l[2].note, "WARNING! Diff between built and installed module!");
        assert_int_equal(l[2].state, DKMS_MODULE_INSTALLED);

        assert_string_equal(l[3].name, "nvidia-current-peermem");
        assert_int_equal(l[3].state, DKMS_MODULE_ADDED);
        assert_null(l[3].kernel);
        assert_null(l[3].arch);
        assert_int_equal(l[4].state, DKMS_MODULE_BROKEN);
        assert_string_equal(l[5].note, "Original modules exist");

        m = dkms_module_find(l, n, "nvidia-current", "6.1.0-58-amd64");
        assert_ptr_equal(m, &l[1]);
        assert_null(dkms_module_find(l, n, "nvidia-current", "6.1.0-99-amd64"));
        assert_ptr_equal(dkms_module_find(l, n, "nvidia-current-peermem", NULL), &l[3]);
        assert_null(dkms_module_find(l, n, "nvidia-current-peermem", "6.1.0-57-amd64"));
        dkms_module_list_free(l, n);
}

static void test_status_parse_dkms2(void **state) {
        DkmsModule *l = NULL;
        size_t n = 0;
        const char *text =
                "nvidia, 470.223.02, 5.10.0-28-amd64, x86_64: installed\n"
                "nvidia, 470.223.02, 5.10.0-27-amd64, x86_64: installed-weak from 5.10.0-26-amd64\n"
                "nvidia-peermem, 470.223.02: added\n"
                "nvidia, 470.223.02, 5.10.0-29-amd64, x86_64: built (WARNING! Missing some built modules!)\n";

        assert_return_code(dkms_status_parse(text, &l, &n), 0);
        assert_int_equal(n, 4);
        assert_string_equal(l[0].name, "nvidia");
        assert_string_equal(l[0].version, "470.223.02");
        assert_string_equal(l[0].kernel, "5.10.0-28-amd64");
        assert_string_equal(l[0].arch, "x86_64");
        assert_int_equal(l[0].state, DKMS_MODULE_INSTALLED);
        assert_int_equal(l[1].state, DKMS_MODULE_INSTALLED);
        assert_string_equal(l[1].note, "from 5.10.0-26-amd64");
        assert_string_equal(l[2].name, "nvidia-peermem");
        assert_null(l[2].kernel);
        assert_int_equal(l[2].state, DKMS_MODULE_ADDED);
        assert_int_equal(l[3].state, DKMS_MODULE_BUILT);
        assert_string_equal(l[3].note, "WARNING! Missing some built modules!");
        dkms_module_list_free(l, n);
}

static void test_status_parse_noise(void **state) {
        DkmsModule *l = NULL;
        size_t n = 99;

        /* Prose that contains ": ", unknown states, too many fields, empty names: none is a module. */
        assert_return_code(dkms_status_parse("Error! Your kernel headers for kernel 6.1 cannot be found: x\n"
                                             "nvidia/1.0, 6.1, x86_64: exploded\n"
                                             "a, b, c: installed\n"
                                             "/1.0: added\n"
                                             "nvidia/: added\n"
                                             "a/b, c, d, e: installed\n"
                                             "\n",
                                             &l, &n),
                           0);
        assert_int_equal(n, 0);
        assert_null(l);
        assert_return_code(dkms_status_parse(NULL, &l, &n), 0);
        assert_int_equal(n, 0);
}

static void test_strings(void **state) {
        char buf[32];

        assert_string_equal(dkms_format_elapsed(buf, sizeof buf, 0), "0s");
        assert_string_equal(dkms_format_elapsed(buf, sizeof buf, 250 * USEC_PER_MSEC), "250ms");
        assert_string_equal(dkms_format_elapsed(buf, sizeof buf, 45 * USEC_PER_SEC), "45s");
        assert_string_equal(dkms_format_elapsed(buf, sizeof buf, 130 * USEC_PER_SEC), "2m10s");
        assert_string_equal(dkms_format_elapsed(buf, sizeof buf, 3723 * USEC_PER_SEC), "1h02m03s");

        for (int i = 0; i < _DKMS_OUTCOME_MAX; i++)
                assert_int_equal(dkms_outcome_from_string(dkms_outcome_to_string(i)), i);
        for (int i = 0; i < _DKMS_MODULE_STATE_MAX; i++)
                assert_int_equal(dkms_module_state_from_string(dkms_module_state_to_string(i)), i);
        assert_int_equal(dkms_outcome_from_string("nope"), _DKMS_OUTCOME_INVALID);
        assert_int_equal(dkms_outcome_to_errno(DKMS_OUTCOME_HEADERS_MISSING), -ENOPKG);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_status_parse_dkms3),
                cmocka_unit_test(test_status_parse_dkms2),
                cmocka_unit_test(test_status_parse_noise),
                cmocka_unit_test(test_strings),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}
