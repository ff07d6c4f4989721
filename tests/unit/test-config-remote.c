/* SPDX-License-Identifier: MIT */
/* Tests the remote configuration source's pure parts: the URL template an administrator writes and the
 * last-known-good copy in the state directory. Fetching is tested against a real TLS server in
 * tests/integration/test-remote-config.py. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config-remote.h"
#include "fileio.h"
#include "macro.h"

static void test_expand_url(void **state) {
        _cleanup_free_ char *url = NULL, *bad = NULL;

        assert_int_equal(config_remote_expand_url("https://cfg.example/{product}/{hostname}-{machine-id}.yaml",
                                                  "gpu-07", "0123abcd", "DGX H100 (a/b)", &url, &bad),
                         0);
        assert_string_equal(url, "https://cfg.example/DGX%20H100%20%28a%2Fb%29/gpu-07-0123abcd.yaml");
        url = mfree(url);

        /* A value that cannot be read is "unknown", so the server can serve a default. */
        assert_int_equal(config_remote_expand_url("https://h/{product}.yaml", "n", NULL, NULL, &url, NULL), 0);
        assert_string_equal(url, "https://h/unknown.yaml");
        url = mfree(url);

        assert_int_equal(config_remote_expand_url("https://h/{host}.yaml", "n", NULL, NULL, &url, &bad), -EINVAL);
        assert_null(url);
        assert_string_equal(bad, "{host}");
}

static void test_cache_roundtrip(void **state) {
        char dir[] = "/tmp/test-config-remote-XXXXXX";
        _cleanup_free_ char *state_dir = NULL, *doc = NULL, *meta = NULL;
        ConfigRemoteCache c = {
                .url = (char *) "https://h/x.yaml",
                .etag = (char *) "\"v1\"",
                .last_modified = (char *) "Tue, 01 Dec 2026 10:00:00 GMT",
                .data = (char *) "log:\n  level: debug\n",
                .size = 20,
        }, got = {};

        assert_non_null(mkdtemp(dir));
        state_dir = path_join(dir, "state"); /* created on the first save */
        assert_int_equal(config_remote_cache_load(state_dir, &got), -ENOENT);
        assert_int_equal(config_remote_cache_save(state_dir, &c), 0);
        assert_int_equal(config_remote_cache_load(state_dir, &got), 0);
        assert_string_equal(got.url, c.url);
        assert_string_equal(got.etag, c.etag);
        assert_string_equal(got.last_modified, c.last_modified);
        assert_int_equal(got.size, c.size);
        assert_memory_equal(got.data, c.data, c.size);
        config_remote_cache_done(&got);

        /* The document alone (metadata lost) is still a good copy, without validators. */
        meta = path_join(state_dir, "remote-config.meta");
        assert_int_equal(unlink(meta), 0);
        assert_int_equal(config_remote_cache_load(state_dir, &got), 0);
        assert_null(got.etag);
        assert_null(got.url);
        assert_memory_equal(got.data, c.data, c.size);
        config_remote_cache_done(&got);

        doc = path_join(state_dir, "remote-config.yaml");
        struct stat st;
        assert_int_equal(stat(doc, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        assert_int_equal(unlink(doc), 0);
        assert_int_equal(rmdir(state_dir), 0);
        assert_int_equal(rmdir(dir), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_expand_url),
                cmocka_unit_test(test_cache_roundtrip),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
