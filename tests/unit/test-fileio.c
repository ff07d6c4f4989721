/* SPDX-License-Identifier: MIT */
/* Tests for agent/basic/fileio.c and agent/basic/strv.c: atomic writes, reads, path helpers, string lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
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

        assert_int_equal(write_file_atomic(p, ".hidden", "x", 1, 0644), 0);
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

static void test_atomic_write_tmp_dir_symlink(void **state) {
        /* The temp directory planted as a symlink to another directory: nothing is created there, the
         * target is not written, and the link stays. */
        _cleanup_free_ char *d = make_tmpdir(), *p = path_join(d, "target"), *t = path_join(d, ".hidden"),
                            *victim = path_join(d, "victim");
        struct stat st;

        assert_int_equal(mkdir(victim, 0755), 0);
        assert_int_equal(symlink(victim, t), 0);
        assert_int_equal(write_file_atomic(p, ".hidden", "x", 1, 0644), -ELOOP);
        assert_int_equal(count_entries(victim), 0);
        assert_int_equal(access(p, F_OK), -1);
        assert_int_equal(lstat(t, &st), 0);
        assert_true(S_ISLNK(st.st_mode));

        /* A world-writable one is not ours either. */
        assert_int_equal(unlink(t), 0);
        assert_int_equal(mkdir(t, 0777), 0);
        assert_int_equal(chmod(t, 0777), 0);
        assert_int_equal(write_file_atomic(p, ".hidden", "x", 1, 0644), -EPERM);
        assert_int_equal(count_entries(t), 0);
        assert_int_equal(write_file_atomic(p, "a/b", "x", 1, 0644), -EINVAL);
        rm_rf(d);
}

static void test_read_only_regular_files(void **state) {
        /* A FIFO is refused at once instead of blocking the reader, and so is a device; a symlink only
         * when asked. */
        _cleanup_free_ char *d = make_tmpdir(), *fifo = path_join(d, "fifo"), *link = path_join(d, "link"),
                            *file = path_join(d, "file"), *c = NULL;

        assert_int_equal(mkfifo(fifo, 0600), 0);
        assert_int_equal(read_full_file(fifo, 16, &c, NULL), -EBADFD);
        assert_int_equal(read_full_file("/dev/null", 16, &c, NULL), -EBADFD);
        assert_int_equal(read_full_file(d, 16, &c, NULL), -EISDIR);
        assert_int_equal(write_file_atomic(file, NULL, "x", 1, 0644), 0);
        assert_int_equal(symlink(file, link), 0);
        assert_int_equal(read_full_file_at(AT_FDCWD, link, READ_FILE_NOFOLLOW, 16, &c, NULL), -ELOOP);
        assert_int_equal(read_full_file_at(AT_FDCWD, link, 0, 16, &c, NULL), 0);
        assert_string_equal(c, "x");
        rm_rf(d);
}

static void test_cleanup_temp_files(void **state) {
        /* Only regular files named prefix + 6 mkstemp characters go. */
        _cleanup_free_ char *d = make_tmpdir();
        _cleanup_close_ int fd = open(d, O_RDONLY | O_DIRECTORY);
        const char *keep[] = { "f.short", "f.toolong1", "g.AbC123", "f.Ab-123" };

        assert_true(fd >= 0);
        for (size_t i = 0; i < ELEMENTSOF(keep); i++)
                close(openat(fd, keep[i], O_CREAT | O_WRONLY, 0600));
        close(openat(fd, "f.AbC123", O_CREAT | O_WRONLY, 0600));
        assert_int_equal(mkdirat(fd, "f.Dir123", 0755), 0);
        assert_int_equal(symlinkat("/etc/passwd", fd, "f.Lnk123"), 0);
        assert_int_equal(cleanup_temp_files_at(fd, "f."), 1);
        assert_int_equal(count_entries(d), ELEMENTSOF(keep) + 2);
        assert_int_equal(access("/etc/passwd", F_OK), 0);
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
                cmocka_unit_test(test_atomic_write_tmp_dir_symlink),
                cmocka_unit_test(test_read_only_regular_files),
                cmocka_unit_test(test_cleanup_temp_files),
                cmocka_unit_test(test_mkdir_p),
                cmocka_unit_test(test_strv),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
