/* SPDX-License-Identifier: MIT */
/* Tests agent/basic/yaml-reader.c, the one YAML reader: the tree it builds, and the limits every caller gets
 * (depth, size, node count with aliases expanded, keys per mapping), each failing fast with
 * FILE:LINE:COLUMN and a sentence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "strv.h"
#include "yaml-reader.h"

static int parse(const char *text, GnaYamlFlags flags, GnaYamlNode **ret, char **error) {
        return gna_yaml_parse("t.yaml", text, strlen(text), flags, ret, error);
}

static void expect_error(const char *text, GnaYamlFlags flags, int r, const char *message) {
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *n = NULL;
        _cleanup_free_ char *error = NULL;

        assert_int_equal(parse(text, flags, &n, &error), r);
        assert_null(n);
        assert_non_null(error);
        if (!streq(error, message))
                fail_msg("expected \"%s\", got \"%s\"", message, error);
}

static uint64_t now_msec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

static void test_tree(void **state) {
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *n = NULL;
        _cleanup_free_ char *error = NULL;

        assert_int_equal(parse("a: 1\nb: [x, 'y', ~]\nc:\n  d: null\n", 0, &n, &error), 0);
        assert_non_null(n);
        assert_int_equal(n->type, GNA_YAML_MAPPING);
        assert_int_equal(n->n_items, 3);
        assert_string_equal(gna_yaml_scalar(gna_yaml_get(n, "a")), "1");
        const GnaYamlNode *b = gna_yaml_get(n, "b");
        assert_int_equal(b->type, GNA_YAML_SEQUENCE);
        assert_int_equal(b->n_items, 3);
        assert_true(b->items[0]->plain);
        assert_false(b->items[1]->plain);
        assert_true(b->items[2]->null);
        assert_int_equal(b->line, 2);
        assert_int_equal(b->column, 4);
        assert_true(gna_yaml_get(gna_yaml_get(n, "c"), "d")->null);
        assert_null(gna_yaml_get(n, "zz"));
        assert_string_equal(gna_yaml_kind(b), "a list");

        /* An empty stream is no tree, not an error. */
        gna_yaml_node_unref(TAKE_PTR(n));
        assert_int_equal(parse("# only a comment\n", 0, &n, &error), 0);
        assert_null(n);
}

static void test_aliases(void **state) {
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *n = NULL;
        _cleanup_free_ char *error = NULL;

        expect_error("a: &x [1]\nb: *x\n", 0, -EINVAL, "t.yaml:2:4: aliases (*x) are not supported; write the value out");
        assert_int_equal(parse("a: &x [1, 2]\nb: *x\n", GNA_YAML_ALIASES, &n, &error), 0);
        assert_ptr_equal(gna_yaml_get(n, "a"), gna_yaml_get(n, "b"));
        expect_error("a: *nope\n", GNA_YAML_ALIASES, -EINVAL, "t.yaml:1:4: alias *nope refers to no anchor (&nope) before it");
        /* An alias inside its own anchor would be a cycle: there is no anchor yet. */
        expect_error("a: &x [*x]\n", GNA_YAML_ALIASES, -EINVAL, "t.yaml:1:8: alias *x refers to no anchor (&x) before it");
}

static void test_billion_laughs(void **state) {
        /* Ten levels of ten aliases each: 10^10 nodes expanded, a few hundred bytes of text. It must be
         * refused at once, by the node count, not after exhausting memory. */
        _cleanup_free_ char *text = strdup("l0: &l0 [lol]\n");
        for (int i = 1; i <= 10; i++) {
                _cleanup_free_ char *line = strprintf("l%d: &l%d [*l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d]\n",
                                                      i, i, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1, i - 1,
                                                      i - 1, i - 1);
                char *t = strprintf("%s%s", text, line);
                free(text);
                text = t;
        }
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *n = NULL;
        _cleanup_free_ char *error = NULL;
        uint64_t t0 = now_msec();
        assert_int_equal(parse(text, GNA_YAML_ALIASES, &n, &error), -EINVAL);
        assert_true(now_msec() - t0 < 1000);
        assert_non_null(strstr(error, "more than 200000 YAML nodes with aliases expanded; this is not a file this agent reads"));
        assert_true(startswith(error, "t.yaml:6:"));
}

static void test_depth(void **state) {
        /* 50,000 levels (the CDI spec that crashed the daemon) and the exact edge of the limit. */
        size_t n = 50000;
        _cleanup_free_ char *deep = malloc(2 * n + 1);
        assert_non_null(deep);
        memset(deep, '[', n);
        memset(deep + n, ']', n);
        deep[2 * n] = 0;
        expect_error(deep, 0, -EINVAL, "t.yaml:1:66: nested more than 64 levels deep");

        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *t = NULL;
        _cleanup_free_ char *error = NULL, *ok = malloc(2 * 65 + 1);
        memset(ok, '[', 65);
        memset(ok + 65, ']', 65);
        ok[130] = 0;
        assert_int_equal(parse(ok, 0, &t, &error), 0); /* 65 nodes: depths 0..64 */

        /* An alias cannot smuggle in depth beyond the limit either. */
        _cleanup_free_ char *a = strprintf("a: &a %.*s%.*s\nb: [[[*a]]]\n", 62, deep, 62, deep + n);
        expect_error(a, GNA_YAML_ALIASES, -EINVAL, "t.yaml:2:7: nested more than 64 levels deep (with alias *a expanded)");
}

static void test_keys_and_documents(void **state) {
        expect_error("a: 1\nb: 2\na: 3\n", 0, -EINVAL, "t.yaml:3:1: duplicate key 'a' (already set on line 1); remove one of them");
        expect_error("? [a]\n: 1\n", 0, -EINVAL, "t.yaml:1:3: a key must be a plain word, not a list or a mapping");
        expect_error("a: 1\n---\nb: 2\n", 0, -EINVAL,
                     "t.yaml:2:1: a second YAML document ('---') is not supported; use one document per file");
        expect_error("a: [1\n", 0, -EBADMSG,
                     "t.yaml:2:1: invalid YAML: did not find expected ',' or ']' (while parsing a flow sequence)");
        expect_error("a:\n\tb: 1\n", 0, -EBADMSG,
                     "t.yaml:2:1: invalid YAML: found character that cannot start any token (while scanning for the "
                     "next token); indent with spaces, YAML does not allow tabs");

        /* Too many keys in one mapping (each is checked against the others). */
        _cleanup_free_ char *many = strdup("");
        for (unsigned i = 0; i <= GNA_YAML_KEYS_MAX; i++) {
                char *t = strprintf("%sk%u: 1\n", many, i);
                free(many);
                many = t;
        }
        expect_error(many, 0, -EINVAL, "t.yaml:1025:1: more than 1024 keys in one mapping");

        _cleanup_free_ char *anchors = strdup("");
        for (unsigned i = 0; i <= GNA_YAML_ANCHORS_MAX; i++) {
                char *t = strprintf("%s- &a%u x\n", anchors, i);
                free(anchors);
                anchors = t;
        }
        expect_error(anchors, GNA_YAML_ALIASES, -EINVAL, "t.yaml:1025:3: more than 1024 anchors (&a1024)");
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *n = NULL;
        _cleanup_free_ char *error = NULL;
        assert_int_equal(parse(anchors, 0, &n, &error), 0); /* without aliases anchors are just names */
}

static void test_size(void **state) {
        size_t size = GNA_YAML_SIZE_MAX + 1;
        _cleanup_free_ char *big = malloc(size), *error = NULL;
        _cleanup_(gna_yaml_node_unrefp) GnaYamlNode *n = NULL;
        memset(big, '#', size);
        assert_int_equal(gna_yaml_parse("big.yaml", big, size, 0, &n, &error), -EFBIG);
        assert_string_equal(error, "big.yaml: 4194305 bytes, more than the 4096 KiB any YAML file this agent reads may have");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_tree),
                cmocka_unit_test(test_aliases),
                cmocka_unit_test(test_billion_laughs),
                cmocka_unit_test(test_depth),
                cmocka_unit_test(test_keys_and_documents),
                cmocka_unit_test(test_size),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
