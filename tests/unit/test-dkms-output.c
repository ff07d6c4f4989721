/* SPDX-License-Identifier: MIT */
/* Tests modules/dkms-output.c against real dkms output: tests/fixtures/dkms/<case>.out were captured from
 * Debian 12's dkms 3.0.10 building tests/vm/dkms-src for real (capture.sh there regenerates them),
 * including a real compile error with its make.log, missing headers, read-only trees as a service
 * sandbox makes them, and a BUILD_EXCLUSIVE kernel. dkms 3.0's autoinstall exits 11 for all of these
 * and 0 for a failed install into a read-only /lib/modules, so the verdict must come from its words. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dkms-internal.h"
#include "dkms.h"
#include "fileio.h"
#include "macro.h"
#include "strv.h"

#define MODULE_DIR "nvidia-current/550.127.05"

typedef struct Fixture {
        char *tree;       /* a DKMS tree like /var/lib/dkms with the module registered */
} Fixture;

static char *fixture_path(const char *name) {
        const char *src = getenv("GNA_SOURCE_ROOT");
        if (!src)
                fail_msg("GNA_SOURCE_ROOT is not set; run this test through meson test");
        return strprintf("%s/tests/fixtures/dkms/%s", src, name);
}

static int setup(void **state) {
        Fixture *f = calloc(1, sizeof *f);
        _cleanup_free_ char *src = NULL;

        assert_non_null(f);
        f->tree = strdup("/tmp/gna-test-dkms-output-XXXXXX");
        assert_non_null(mkdtemp(f->tree));
        src = strprintf("%s/" MODULE_DIR "/source", f->tree);
        assert_int_equal(mkdir_p(src, 0755), 0);
        *state = f;
        return 0;
}

static int teardown(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", f->tree);
        assert_int_equal(system(cmd), 0);
        free(f->tree);
        free(f);
        return 0;
}

/* Feeds a captured run through the reader as dkms.c does; returns its outcome and sentence. */
static DkmsOutcome replay(Fixture *f, const char *name, const char *kver, char **ret_message) {
        _cleanup_free_ char *path = fixture_path(name), *text = NULL;
        DkmsOutput o = { .dkms_dir = strdup(f->tree) };
        DkmsVerdict v = { .kver = kver, .exit_status = -1 };
        char *save = NULL, *e;
        DkmsOutcome outcome;

        assert_non_null(o.dkms_dir);
        assert_int_equal(read_full_file(path, 1 << 20, &text, NULL), 0);
        assert_int_equal(dkms_output_discover(&o), 0);
        /* "# dkms 3.0.10: dkms autoinstall -k KVER; exit N" */
        e = strstr(text, "; exit ");
        assert_non_null(e);
        v.exit_status = atoi(e + strlen("; exit "));
        for (char *line = strtok_r(strchr(text, '\n') ?: text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
                dkms_output_observe(&o, line);
        outcome = dkms_output_outcome(&o, &v);
        *ret_message = dkms_output_message(&o, &v, &outcome);
        assert_non_null(*ret_message);
        dkms_output_done(&o);
        return outcome;
}

static void assert_contains(const char *haystack, const char *needle) {
        if (!haystack || !strstr(haystack, needle))
                fail_msg("expected \"%s\" in \"%s\"", needle, strna(haystack));
}

static void test_ok(void **state) {
        _cleanup_free_ char *msg = NULL, *none = NULL;

        assert_int_equal(replay(*state, "autoinstall-ok.out", "6.1.0-57-amd64", &msg), DKMS_OUTCOME_OK);
        assert_contains(msg, "Built and installed nvidia-current 550.127.05 for 6.1.0-57-amd64");
        /* Nothing registered: exit 0 and not a word (--prepare-kernel checks the result itself). */
        assert_int_equal(replay(*state, "nothing-registered.out", "6.1.0-57-amd64", &none), DKMS_OUTCOME_OK);
}

static void test_compile_error(void **state) {
        Fixture *f = *state;
        _cleanup_free_ char *msg = NULL, *log = fixture_path("compile-error.make.log"), *text = NULL,
                            *dest = strprintf("%s/" MODULE_DIR "/build/make.log", f->tree), *dir = NULL;

        /* The make.log dkms left, where dkms_dir says. */
        assert_int_equal(read_full_file(log, 1 << 20, &text, NULL), 0);
        dir = strprintf("%s/" MODULE_DIR "/build", f->tree);
        assert_int_equal(mkdir_p(dir, 0755), 0);
        assert_int_equal(write_file_atomic(dest, NULL, text, strlen(text), 0644), 0);

        assert_int_equal(replay(f, "compile-error.out", "6.1.0-57-amd64", &msg), DKMS_OUTCOME_BUILD_FAILED);
        assert_contains(msg, "DKMS failed to build nvidia-current 550.127.05 for 6.1.0-57-amd64");
        assert_contains(msg, dest);
        assert_contains(msg, "uvm.c:1:2: error: #error deliberately broken for the fixture");
        assert_null(strstr(msg, "headers"));
}

static void test_headers_missing(void **state) {
        _cleanup_free_ char *msg = NULL, *install = NULL;

        assert_int_equal(replay(*state, "headers-missing.out", "6.1.0-99-amd64", &msg), DKMS_OUTCOME_HEADERS_MISSING);
        assert_contains(msg, "apt-get install linux-headers-6.1.0-99-amd64");
        /* `dkms install` says the same with exit 1. */
        assert_int_equal(replay(*state, "install-headers-missing.out", "6.1.0-99-amd64", &install),
                         DKMS_OUTCOME_HEADERS_MISSING);
}

static void test_read_only(void **state) {
        _cleanup_free_ char *tree = NULL, *modules = NULL;

        /* /var/lib/dkms read-only (ProtectSystem=strict): dkms exits 11, and its make.log was never
         * written, so the headers are not blamed and the path is named. */
        assert_int_equal(replay(*state, "readonly-dkms-tree.out", "6.1.0-57-amd64", &tree), DKMS_OUTCOME_READ_ONLY);
        assert_contains(tree, "could not write /var/lib/dkms/nvidia-current/550.127.05/build (read-only file system)");
        assert_contains(tree, "ReadWritePaths=");
        assert_int_equal(dkms_outcome_to_errno(DKMS_OUTCOME_READ_ONLY), -EROFS);

        /* /lib/modules read-only: the build works, the copy fails, and dkms 3.0.10 exits 0. */
        assert_int_equal(replay(*state, "readonly-modules.out", "6.1.0-57-amd64", &modules), DKMS_OUTCOME_READ_ONLY);
        assert_contains(modules, "could not write /lib/modules/6.1.0-57-amd64/updates");
        assert_contains(modules, "although dkms exited 0");
}

static void test_excluded(void **state) {
        _cleanup_free_ char *msg = NULL;

        assert_int_equal(replay(*state, "excluded.out", "6.1.0-57-amd64", &msg), DKMS_OUTCOME_EXCLUDED);
        assert_contains(msg, "excluded by the dkms.conf of nvidia-current 550.127.05");
}

static void test_status(void **state) {
        _cleanup_free_ char *path = fixture_path("status-added.out"), *text = NULL;
        DkmsModule *l = NULL;
        size_t n = 0;

        assert_int_equal(read_full_file(path, 1 << 20, &text, NULL), 0);
        assert_int_equal(dkms_status_parse(strchr(text, '\n') + 1, &l, &n), 0);
        assert_int_equal(n, 1);
        assert_string_equal(l[0].name, "nvidia-current");
        assert_string_equal(l[0].version, "550.127.05");
        assert_int_equal(l[0].state, DKMS_MODULE_ADDED);
        dkms_module_list_free(l, n);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_ok, setup, teardown),
                cmocka_unit_test_setup_teardown(test_compile_error, setup, teardown),
                cmocka_unit_test_setup_teardown(test_headers_missing, setup, teardown),
                cmocka_unit_test_setup_teardown(test_read_only, setup, teardown),
                cmocka_unit_test_setup_teardown(test_excluded, setup, teardown),
                cmocka_unit_test_setup_teardown(test_status, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
