/* SPDX-License-Identifier: MIT */
/* Tests for agent/basic/escape.c and the logger's escaping (agent/basic/log.c): what a hostile driver's
 * string (quotes, newlines, '#', '=', backslashes, invalid UTF-8, control characters) becomes on the way
 * out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>
#include <cmocka.h>

#include "escape.h"
#include "log.h"

static void test_utf8_valid(void **state) {
        (void) state;
        assert_true(utf8_is_valid(""));
        assert_true(utf8_is_valid("NVIDIA H100 80GB HBM3"));
        assert_true(utf8_is_valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
        assert_false(utf8_is_valid("\xff"));
        assert_false(utf8_is_valid("a\xc3"));          /* cut short */
        assert_false(utf8_is_valid("\xc0\xaf"));       /* overlong '/' */
        assert_false(utf8_is_valid("\xed\xa0\x80"));   /* a surrogate */
        assert_false(utf8_is_valid("\xf4\x90\x80\x80")); /* above U+10FFFF */
}

static void test_utf8_make_valid(void **state) {
        (void) state;
        _cleanup_free_ char *a = utf8_make_valid("GPU \xff\xfe name\xc3"), *b = utf8_make_valid("caf\xc3\xa9"),
                           *c = utf8_make_valid("");
        assert_string_equal(a, "GPU \xef\xbf\xbd\xef\xbf\xbd name\xef\xbf\xbd");
        assert_true(utf8_is_valid(a));
        assert_string_equal(b, "caf\xc3\xa9");
        assert_string_equal(c, "");
}

static void test_escape_control(void **state) {
        char out[64], small[7];
        (void) state;
        escape_control("NVIDIA\n<3>forged\r\t\x1b[31m\x7f \"#=\\", out, sizeof out);
        assert_string_equal(out, "NVIDIA\\n<3>forged\\r\\t\\x1b[31m\\x7f \"#=\\");
        assert_false(string_has_control(out));
        /* Truncation never cuts an escape in half. */
        escape_control("abcde\nfgh", small, sizeof small);
        assert_string_equal(small, "abcde");
        assert_true(string_has_control("a\nb"));
        assert_false(string_has_control("a b"));
}

static void test_string_clean(void **state) {
        char s[] = "nvmlErrorString\n<3>\xff\xc3\xa9\x7f";
        (void) state;
        string_clean(s);
        assert_string_equal(s, "nvmlErrorString?<3>?\xc3\xa9?");
}

/* The logger writes one line per message, whatever the message holds. */
static void test_log_one_line(void **state) {
        char path[] = "/tmp/gna-test-escape-XXXXXX", line[4096];
        int fd = mkstemp(path), saved = dup(STDERR_FILENO);
        (void) state;

        assert_true(fd >= 0 && saved >= 0);
        assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
        log_setup(LOG_TARGET_PREFIX);
        log_warning("GPU %s: name \"%s\"", "0000:01:00.0", "H100\n<0>agent: all GPUs failed\x1b]0;x\x07");
        fflush(stderr);
        assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
        close(saved);

        _cleanup_fclose_ FILE *f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(line, sizeof line, f));
        assert_string_equal(line, "<4>GPU 0000:01:00.0: name \"H100\\n<0>agent: all GPUs failed\\x1b]0;x\\x07\"\n");
        assert_null(fgets(line, sizeof line, f));
        unlink(path);
        close(fd);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_utf8_valid),
                cmocka_unit_test(test_utf8_make_valid),
                cmocka_unit_test(test_escape_control),
                cmocka_unit_test(test_string_clean),
                cmocka_unit_test(test_log_one_line),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
