/* SPDX-License-Identifier: MIT */
/* Tests for agent/validations.c: driver-ready appears with the GPU Operator validator's content when the
 * driver is verified, is not rewritten while unchanged, goes when the driver breaks, and a driver-ready
 * the operator wrote itself (even one with the same bytes) is never removed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "fileio.h"
#include "strv.h"
#include "validations.h"

static char *make_tmpdir(void) {
        char *d = strdup("/tmp/gna-test-validations-XXXXXX");
        assert_non_null(mkdtemp(d));
        return d;
}

static void rm_rf(const char *d) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", d);
        assert_int_equal(system(cmd), 0);
}

static void test_text(void **state) {
        _cleanup_free_ char *t = validations_driver_ready_text("/");
        /* What the operator's toolkit, device-plugin and DCGM entrypoints source for a host driver. */
        assert_string_equal(t, "IS_HOST_DRIVER=true\nNVIDIA_DRIVER_ROOT=/\nDRIVER_ROOT_CTR_PATH=/host\n"
                               "NVIDIA_DEV_ROOT=/\nDEV_ROOT_CTR_PATH=/host\n");
}

static void test_lifecycle(void **state) {
        _cleanup_free_ char *tmp = make_tmpdir(), *dir = path_join(tmp, "run/nvidia/validations"),
                            *p = path_join(dir, "driver-ready"), *text = NULL,
                            *marker = path_join(tmp, "run/gpu-node-agent/validations-driver-ready");
        ValidationsState up = { .driver = true }, down = { .driver = false };
        struct stat a, b;
        bool changed;

        /* Not verified and nothing there: nothing happens, no directory is made. */
        assert_int_equal(validations_update(dir, marker, "/", &down, &changed), 0);
        assert_false(changed);
        assert_int_equal(access(dir, F_OK), -1);

        assert_int_equal(validations_update(dir, marker, "/", &up, &changed), 0);
        assert_true(changed);
        assert_int_equal(read_full_file(p, 4096, &text, NULL), 0);
        assert_true(startswith(text, "IS_HOST_DRIVER=true\n"));
        assert_int_equal(stat(p, &a), 0);
        assert_int_equal(a.st_mode & 07777, 0644);
        assert_int_equal(access(marker, F_OK), 0);

        assert_int_equal(validations_update(dir, marker, "/", &up, &changed), 0);
        assert_false(changed);
        assert_int_equal(stat(p, &b), 0);
        assert_int_equal(a.st_ino, b.st_ino);

        /* The driver breaks: the file goes, so the operator's pods wait again. */
        assert_int_equal(validations_update(dir, marker, "/", &down, &changed), 0);
        assert_true(changed);
        assert_int_equal(access(p, F_OK), -1);
        assert_int_equal(access(dir, F_OK), 0);
        assert_int_equal(access(marker, F_OK), -1);

        /* The other files the validator writes are never ours. */
        _cleanup_free_ char *tk = path_join(dir, "toolkit-ready"), *cuda = path_join(dir, "cuda-ready");
        assert_int_equal(validations_update(dir, marker, "/", &up, &changed), 0);
        assert_int_equal(access(tk, F_OK), -1);
        assert_int_equal(access(cuda, F_OK), -1);
        rm_rf(tmp);
}

static void test_foreign_file_kept(void **state) {
        _cleanup_free_ char *tmp = make_tmpdir(), *p = path_join(tmp, "driver-ready"), *text = NULL,
                            *marker = path_join(tmp, "marker"), *ours = validations_driver_ready_text("/");
        ValidationsState down = { .driver = false };
        const char *theirs = "IS_HOST_DRIVER=false\nNVIDIA_DRIVER_ROOT=/run/nvidia/driver\n";
        bool changed;

        /* The operator's validator writes the very bytes we write for a host driver: without our
         * marker the file is its, and stays. */
        assert_int_equal(write_file_atomic(p, NULL, ours, strlen(ours), 0644), 0);
        assert_int_equal(validations_update(tmp, marker, "/", &down, &changed), 0);
        assert_false(changed);
        assert_int_equal(access(p, F_OK), 0);

        /* Ours once, then replaced by the operator with other content: left alone, no longer ours. */
        assert_int_equal(write_file_atomic(marker, NULL, "x", 1, 0644), 0);
        assert_int_equal(write_file_atomic(p, NULL, theirs, strlen(theirs), 0644), 0);
        assert_int_equal(validations_update(tmp, marker, "/", &down, &changed), 0);
        assert_false(changed);
        assert_int_equal(read_full_file(p, 4096, &text, NULL), 0);
        assert_string_equal(text, theirs);
        assert_int_equal(access(marker, F_OK), -1);
        rm_rf(tmp);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_text),
                cmocka_unit_test(test_lifecycle),
                cmocka_unit_test(test_foreign_file_kept),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
