/* SPDX-License-Identifier: MIT */
/* Tests for agent/metrics.c's label values: a hostile driver's name (quotes, newlines, '#', '=',
 * backslashes, invalid UTF-8) stays one label value of one sample line. The series themselves are
 * tested against node_exporter in tests/integration/test-metrics.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <cmocka.h>

#include "metrics.h"

static char *value(const char *v) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        assert_non_null(f);
        metrics_put_label_value(f, v);
        assert_int_equal(fclose(f), 0);
        return buf;
}

static void test_label_value(void **state) {
        _cleanup_free_ char *plain = value("NVIDIA H100 80GB HBM3"), *none = value(NULL),
                           *hostile = value("NVIDIA \"H100\"\n#x=y} 1\n\\"),
                           *bytes = value("H100 \xff\xfe caf\xc3\xa9");
        (void) state;

        assert_string_equal(plain, "NVIDIA H100 80GB HBM3");
        assert_string_equal(none, "");
        assert_string_equal(hostile, "NVIDIA \\\"H100\\\"\\n#x=y} 1\\n\\\\");
        assert_null(strchr(hostile, '\n'));
        assert_string_equal(bytes, "H100 \xef\xbf\xbd\xef\xbf\xbd caf\xc3\xa9");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_label_value),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
