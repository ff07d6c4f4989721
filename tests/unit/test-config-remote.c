/* SPDX-License-Identifier: MIT */
/* Tests the remote configuration source's pure parts: the URL template an administrator writes, the
 * last-known-good copy (with its signature) and the highest serial taken in the state directory, and
 * the signature check with each kind of key (keys and signatures made once with the openssl CLI, see
 * below). Fetching is tested against a real TLS server in tests/integration/test-remote-config.py. */
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
#include "config-signature.h"
#include "fileio.h"
#include "macro.h"
#include "strv.h"

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

static void test_cache_signature_and_serial(void **state) {
        char dir[] = "/tmp/test-config-remote-XXXXXX";
        _cleanup_free_ char *sig = NULL, *serial = NULL;
        ConfigRemoteCache c = {
                .url = (char *) "https://h/x.yaml",
                .data = (char *) "serial: 3\n",
                .size = 10,
                .sig = (char *) "c2ln\n",
                .sig_size = 5,
        }, got = {};
        uint64_t n = 99;

        assert_non_null(mkdtemp(dir));
        assert_int_equal(config_remote_cache_save(dir, &c), 0);
        assert_int_equal(config_remote_cache_load(dir, &got), 0);
        assert_int_equal(got.sig_size, 5);
        assert_memory_equal(got.sig, "c2ln\n", 5);
        config_remote_cache_done(&got);
        /* An unsigned copy leaves no signature of the one before behind. */
        c.sig = NULL;
        c.sig_size = 0;
        assert_int_equal(config_remote_cache_save(dir, &c), 0);
        assert_int_equal(config_remote_cache_load(dir, &got), 0);
        assert_null(got.sig);
        config_remote_cache_done(&got);
        sig = path_join(dir, "remote-config.sig");
        assert_int_equal(access(sig, F_OK), -1);

        /* The highest serial, per URL: another URL starts from none. */
        assert_int_equal(config_remote_serial_load(dir, "https://h/x.yaml", &n), 0);
        assert_true(n == 0);
        assert_int_equal(config_remote_serial_save(dir, "https://h/x.yaml", 2026120101), 0);
        assert_int_equal(config_remote_serial_load(dir, "https://h/x.yaml", &n), 0);
        assert_true(n == 2026120101);
        assert_int_equal(config_remote_serial_load(dir, "https://h/y.yaml", &n), 0);
        assert_true(n == 0);
        serial = path_join(dir, "remote-config.serial");
        struct stat st;
        assert_int_equal(stat(serial, &st), 0);
        assert_int_equal(st.st_mode & 0777, 0600);
        assert_int_equal(write_file_atomic(serial, NULL, "url=https://h/x.yaml\nserial=x\n", 31, 0600), 0);
        assert_int_equal(config_remote_serial_load(dir, "https://h/x.yaml", &n), -EBADMSG);

        _cleanup_free_ char *doc = path_join(dir, "remote-config.yaml"), *meta = path_join(dir, "remote-config.meta");
        assert_int_equal(unlink(doc), 0);
        assert_int_equal(unlink(meta), 0);
        assert_int_equal(unlink(serial), 0);
        assert_int_equal(rmdir(dir), 0);
}

/* Made with: openssl genpkey -algorithm ed25519 -out ed.key; openssl pkey -in ed.key -pubout (the same
 * for ed2, a second key); openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 (ec); RSA with
 * rsa_keygen_bits:1024 (rsa1k). The document DOC signed with openssl pkeyutl -sign -rawin -inkey ed.key
 * (ED_SIG, then base64) and openssl dgst -sha256 -sign ec.key (EC_SIG_B64). */
static const char ED_PUB[] = "-----BEGIN PUBLIC KEY-----\n"
                             "MCowBQYDK2VwAyEASE33OySgZxiPnpbC8If/hC+T9FRk2k0MEq9YfCbEItg=\n"
                             "-----END PUBLIC KEY-----\n";
static const char ED2_PUB[] = "-----BEGIN PUBLIC KEY-----\n"
                              "MCowBQYDK2VwAyEA5F99E6+CC6VB9nlIyMJyIksCmKDGmUHMrDqZEeQnj50=\n"
                              "-----END PUBLIC KEY-----\n";
static const char EC_PUB[] = "-----BEGIN PUBLIC KEY-----\n"
                             "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEuYQMxdeOIYgh1y8xDSTtRRbbCmSJ\n"
                             "/NTVyOMRhWcQ+sbVAS4dkR6992ASehNSvnXQfplxUooFpAnZcJA8tjPOvA==\n"
                             "-----END PUBLIC KEY-----\n";
static const char RSA1K_PUB[] = "-----BEGIN PUBLIC KEY-----\n"
                                "MIGfMA0GCSqGSIb3DQEBAQUAA4GNADCBiQKBgQDI7NEk6jvB9SwyWTK5Leok9bJf\n"
                                "hB/6nbTwVowd8b//yWOmrwO6LIbm6KyYWuokhB9TioOu4bQl5aIYiHqrUQhZw7rX\n"
                                "ZwMNJf8h9g58SeJqijCeAyK36mwodWX7XOuks4Oquq+aROYT2ZS/McuXDfuyxgVS\n"
                                "mCBoZvcdC/vxrw8R0wIDAQAB\n"
                                "-----END PUBLIC KEY-----\n";
static const char DOC[] = "serial: 7\nlog:\n  level: debug\n";
static const char ED_SIG[] = "\x40\x33\x0a\x42\x5b\x77\x37\x64\x3a\xd8\x8c\xec\x41\xe3\xe2\xad\x18\x3c\x34\x53"
                             "\x24\x31\x4f\x3d\x19\x9a\x1b\x6c\x7b\x0d\x1c\xef\x74\x19\x4c\xdf\xaf\x45\x40\x79"
                             "\x89\xb0\x10\xef\xea\xcc\xd1\x7b\x73\x5a\x95\x7e\x43\x20\x6f\x27\x2e\x31\x0a\xe0"
                             "\x7e\x23\x2e\x0f";
static const char ED_SIG_B64[] = "QDMKQlt3N2Q62IzsQePirRg8NFMkMU89GZobbHsNHO90GUz\n"
                                 "fr0VAeYmwEO/qzNF7c1qVfkMgbycuMQrgfiMuDw==\n";
static const char EC_SIG_B64[] = "MEUCIGQI2cEDDDJzZePjDRV81ArjlRmKisTBHQMy82jCzrgvAiEA147+SHt7DXgZ9qigOt7a6+rbF9f4"
                                 "8yLcB12JLmGNCqo=";

static char *put_key(const char *dir, const char *name, const char *text) {
        char *p = path_join(dir, name);
        assert_non_null(p);
        assert_int_equal(write_file_atomic(p, NULL, text, strlen(text), 0644), 0);
        return p;
}

static void test_signature(void **state) {
        char dir[] = "/tmp/test-config-signature-XXXXXX";
        assert_non_null(mkdtemp(dir));
        _cleanup_free_ char *ed = put_key(dir, "ed.pub", ED_PUB), *ed2 = put_key(dir, "ed2.pub", ED2_PUB),
                            *ec = put_key(dir, "ec.pub", EC_PUB), *rsa = put_key(dir, "rsa.pub", RSA1K_PUB),
                            *junk = put_key(dir, "junk.pub", "not a key\n"), *missing = path_join(dir, "none.pub"),
                            *msg = NULL, *want = NULL;
        const size_t doc_size = strlen(DOC);

        assert_int_equal(config_signature_key_check(ed, &msg), 0);
        assert_int_equal(config_signature_key_check(ec, &msg), 0);
        assert_null(msg);

        /* Good: raw, base64 (with line breaks), ECDSA over SHA-256. */
        assert_int_equal(config_signature_verify(ed, DOC, doc_size, ED_SIG, 64, &msg), 0);
        assert_int_equal(config_signature_verify(ed, DOC, doc_size, ED_SIG_B64, strlen(ED_SIG_B64), &msg), 0);
        assert_int_equal(config_signature_verify(ec, DOC, doc_size, EC_SIG_B64, strlen(EC_SIG_B64), &msg), 0);
        assert_null(msg);

        /* Bad: one byte of the document changed, the wrong key, a cut signature, not a signature. */
        char changed[sizeof(DOC)];
        memcpy(changed, DOC, sizeof(DOC));
        changed[8] = '8';
        assert_int_equal(config_signature_verify(ed, changed, doc_size, ED_SIG, 64, &msg), -EBADMSG);
        assert_true(asprintf(&want, "the signature does not verify with the Ed25519 key in %s: the document or its "
                                    "signature was changed, or they were signed with another key", ed) >= 0);
        assert_string_equal(msg, want);
        msg = mfree(msg);
        assert_int_equal(config_signature_verify(ed2, DOC, doc_size, ED_SIG, 64, &msg), -EBADMSG);
        msg = mfree(msg);
        assert_int_equal(config_signature_verify(ed, DOC, doc_size, ED_SIG, 63, &msg), -EBADMSG);
        msg = mfree(msg);
        assert_int_equal(config_signature_verify(ed, DOC, doc_size, "", 0, &msg), -EBADMSG);
        msg = mfree(msg);
        assert_int_equal(config_signature_verify(ec, DOC, doc_size, ED_SIG_B64, strlen(ED_SIG_B64), &msg), -EBADMSG);
        assert_true(strstr(msg, "ECDSA key"));
        msg = mfree(msg);

        /* Keys the agent does not take, each with the reason and the fix. */
        want = mfree(want);
        assert_int_equal(config_signature_key_check(rsa, &msg), -EINVAL);
        assert_true(asprintf(&want, "%s: an RSA key shorter than 2048 bits is too weak; use an Ed25519 key (openssl "
                                    "genpkey -algorithm ed25519), or ECDSA, or RSA of 2048 bits or more", rsa) >= 0);
        assert_string_equal(msg, want);
        msg = mfree(msg);
        assert_int_equal(config_signature_key_check(junk, &msg), -EINVAL);
        assert_true(startswith(msg, junk) && strstr(msg, ": not a PEM public key"));
        msg = mfree(msg);
        assert_int_equal(config_signature_verify(missing, DOC, doc_size, ED_SIG, 64, &msg), -ENOENT);
        assert_true(strstr(msg, "cannot read the public key: No such file or directory"));

        const char *const files[] = { ed, ed2, ec, rsa, junk };
        for (size_t i = 0; i < ELEMENTSOF(files); i++)
                assert_int_equal(unlink(files[i]), 0);
        assert_int_equal(rmdir(dir), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_expand_url),
                cmocka_unit_test(test_cache_roundtrip),
                cmocka_unit_test(test_cache_signature_and_serial),
                cmocka_unit_test(test_signature),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
