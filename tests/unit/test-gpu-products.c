/* SPDX-License-Identifier: MIT */
/* Tests for agent/gpu-products.c: the state file of NVML's last product name per GPU — round trip,
 * missing file, malformed lines, and a symlink planted in its place (never followed, for reading or
 * writing). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "fileio.h"
#include "gpu-products.h"
#include "strv.h"

static int setup(void **state) {
        char *d = strdup("/tmp/test-gpu-products-XXXXXX");
        assert_non_null(mkdtemp(d));
        *state = d;
        return 0;
}

static int teardown(void **state) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", (char *) *state);
        assert_int_equal(system(cmd), 0);
        free(*state);
        return 0;
}

static void test_round_trip(void **state) {
        _cleanup_free_ char *dir = path_join(*state, "var/lib/gpu-node-agent");
        LabelKnownProduct in[2] = {
                { "0000:18:00.0", 0x2330, (char *) "NVIDIA-H100-80GB-HBM3" },
                { "0000:2a:00.0", 0x2335, (char *) "NVIDIA-H200" },
        };
        LabelKnownProduct *out = NULL;
        size_t n = 99;

        /* Nothing yet: no entries, no error. */
        assert_int_equal(gpu_products_load(dir, &out, &n), 0);
        assert_int_equal(n, 0);
        assert_null(out);

        assert_int_equal(gpu_products_save(dir, in, 2), 0); /* creates the state directory */
        assert_int_equal(gpu_products_load(dir, &out, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(out[1].address, "0000:2a:00.0");
        assert_int_equal(out[1].device_id, 0x2335);
        assert_string_equal(out[1].product, "NVIDIA-H200");
        label_known_products_free(out, n);
}

static void test_malformed_lines_skipped(void **state) {
        _cleanup_free_ char *path = path_join(*state, GPU_PRODUCTS_FILE);
        static const char text[] = "# comment\n"
                                   "0000:18:00.0 2330 NVIDIA-H100-80GB-HBM3\n"
                                   "0000:2a:00.0 2330\n"                  /* no product */
                                   "not-an-address 2330 NVIDIA-X\n"
                                   "0000:3a:00.0 2330 NVIDIA H100\n"      /* not one label value */
                                   "0000:5d:00.0 zzzz NVIDIA-X\n"
                                   "0000:9a:00.0 2330 bad/value\n"
                                   "0000:ab:00.0 2335 NVIDIA-H200\n";
        LabelKnownProduct *out = NULL;
        size_t n = 0;

        assert_int_equal(write_file_atomic(path, NULL, text, strlen(text), 0644), 0);
        assert_int_equal(gpu_products_load(*state, &out, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(out[0].product, "NVIDIA-H100-80GB-HBM3");
        assert_string_equal(out[1].address, "0000:ab:00.0");
        label_known_products_free(out, n);
}

/* A link at the file's name: loading refuses it, saving replaces the link, never writes through it. */
static void test_symlink(void **state) {
        _cleanup_free_ char *path = path_join(*state, GPU_PRODUCTS_FILE), *target = path_join(*state, "elsewhere"),
                            *content = NULL;
        LabelKnownProduct one = { "0000:18:00.0", 0x2330, (char *) "NVIDIA-H100-80GB-HBM3" };
        LabelKnownProduct *out = NULL;
        size_t n = 0;
        struct stat st;

        assert_int_equal(write_file_atomic(target, NULL, "0000:18:00.0 2330 EVIL\n", 23, 0644), 0);
        assert_int_equal(symlink(target, path), 0);
        assert_int_equal(gpu_products_load(*state, &out, &n), -ELOOP);
        assert_int_equal(n, 0);

        assert_int_equal(gpu_products_save(*state, &one, 1), 0);
        assert_int_equal(lstat(path, &st), 0);
        assert_true(S_ISREG(st.st_mode));
        assert_int_equal(read_full_file(target, 1024, &content, NULL), 0);
        assert_string_equal(content, "0000:18:00.0 2330 EVIL\n");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
                cmocka_unit_test_setup_teardown(test_malformed_lines_skipped, setup, teardown),
                cmocka_unit_test_setup_teardown(test_symlink, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
