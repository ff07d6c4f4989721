/* SPDX-License-Identifier: MIT */
/* Tests for agent/fileio.c and agent/strv.c: atomic writes, reads, path helpers, string lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "fileio.h"
#include "strv.h"

static char *make_tmpdir(void) {
        char *d = strdup("/tmp/gna-test-fileio-XXXXXX");
        assert_non_null(d);
        assert_non_null(mkdtemp(d));
        return d;
}

static void rm_rf(const char *d) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", d);
        assert_int_equal(system(cmd), 0);
}

static size_t count_entries(const char *dir) {
        _cleanup_closedir_ DIR *d = opendir(dir);
        struct dirent *de;
        size_t n = 0;
        assert_non_null(d);
        while ((de = readdir(d)))
                if (!streq(de->d_name, ".") && !streq(de->d_name, ".."))
                        n++;
        return n;
}

static void test_path_join(void **state) {
        _cleanup_free_ char *a = path_join("/", "sys"), *b = path_join("/x/", "/sys"), *c = path_join("/x", "a/b"),
                           *d = path_join("/x", "");
        assert_string_equal(a, "/sys");
        assert_string_equal(b, "/x/sys");
        assert_string_equal(c, "/x/a/b");
        assert_string_equal(d, "/x");
}

static void test_atomic_write_and_read(void **state) {
        _cleanup_free_ char *d = make_tmpdir(), *p = path_join(d, "file"), *content = NULL, *line = NULL;
        struct stat st;
        size_t size;

        assert_int_equal(write_file_atomic(p, NULL, "hello\nworld\n", 12, 0640), 0);
        assert_int_equal(read_full_file(p, 1024, &content, &size), 0);
        assert_int_equal(size, 12);
        assert_string_equal(content, "hello\nworld\n");
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0640);
        /* No temp file left beside the target. */
        assert_int_equal(count_entries(d), 1);

        assert_int_equal(read_one_line_file(p, &line), 0);
        assert_string_equal(line, "hello");

        /* Size limit. */
        free(content);
        content = NULL;
        assert_int_equal(read_full_file(p, 4, &content, NULL), -EFBIG);
        assert_null(content);
        rm_rf(d);
}

static void test_atomic_write_tmp_dir(void **state) {
        _cleanup_free_ char *d = make_tmpdir(), *p = path_join(d, "target"), *t = path_join(d, ".hidden"), *c = NULL;

        assert_int_equal(write_file_atomic(p, t, "x", 1, 0644), 0);
        assert_int_equal(read_full_file(p, 16, &c, NULL), 0);
        assert_string_equal(c, "x");
        /* The hidden temp directory exists and is empty afterwards. */
        assert_int_equal(count_entries(t), 0);
        rm_rf(d);
}

static void test_atomic_write_failure_keeps_target(void **state) {
        _cleanup_free_ char *d = make_tmpdir(), *p = path_join(d, "dir-target"), *c = NULL;

        /* Renaming a file over a directory fails: the directory stays, no temp file remains. */
        assert_int_equal(mkdir(p, 0755), 0);
        assert_int_equal(write_file_atomic(p, NULL, "x", 1, 0644), -EISDIR);
        assert_int_equal(count_entries(d), 1);
        assert_int_equal(read_full_file("/nonexistent/gna/file", 16, &c, NULL), -ENOENT);
        rm_rf(d);
}

static void test_mkdir_p(void **state) {
        _cleanup_free_ char *d = make_tmpdir(), *p = path_join(d, "a/b/c");
        struct stat st;

        assert_int_equal(mkdir_p(p, 0755), 0);
        assert_int_equal(mkdir_p(p, 0755), 0);
        assert_int_equal(stat(p, &st), 0);
        assert_true(S_ISDIR(st.st_mode));
        rm_rf(d);
}

static void test_strv(void **state) {
        _cleanup_strv_free_ char **l = NULL, **c = NULL;
        _cleanup_free_ char *j = NULL, *s = strprintf("%d-%s", 7, "x");

        assert_int_equal(strv_extend(&l, "b"), 0);
        assert_int_equal(strv_extend(&l, "a"), 0);
        assert_int_equal(strv_extendf(&l, "c%d", 3), 0);
        assert_int_equal(strv_length(l), 3);
        strv_sort(l);
        j = strv_join(l, ", ");
        assert_string_equal(j, "a, b, c3");
        assert_true(strv_contains(l, "c3"));
        assert_false(strv_contains(l, "c"));
        c = strv_copy(l);
        assert_true(strv_equal(l, c));
        assert_string_equal(s, "7-x");
        assert_int_equal(strv_length(NULL), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_path_join),
                cmocka_unit_test(test_atomic_write_and_read),
                cmocka_unit_test(test_atomic_write_tmp_dir),
                cmocka_unit_test(test_atomic_write_failure_keeps_target),
                cmocka_unit_test(test_mkdir_p),
                cmocka_unit_test(test_strv),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
