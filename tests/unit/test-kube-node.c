/* SPDX-License-Identifier: MIT */
/* Tests the Kubernetes node watch's credential reading as an administrator meets it: the errors for a
 * kubeconfig or in-cluster setup that cannot work, the node name check, and the base64 of *-data
 * fields; and the watch stream's events as the API defines them (BOOKMARKs interleaved, ERROR Status
 * objects, objects of another node, hostile label values), fed as the watch request would receive
 * them. The requests themselves are tested against a loopback API server in
 * tests/integration/test-kube-mig.py. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "fileio.h"
#include "kube-node.h"
#include "macro.h"

static void test_base64(void **state) {
        _cleanup_free_ char *out = NULL;
        size_t n;

        assert_int_equal(kube_base64_decode("LS0tLS1CRUdJTiBD\nRVJUSUZJQ0FURS0tLS0t", &out, &n), 0);
        assert_string_equal(out, "-----BEGIN CERTIFICATE-----");
        assert_int_equal(n, 27);
        out = mfree(out);
        assert_int_equal(kube_base64_decode("aGk=", &out, &n), 0);
        assert_string_equal(out, "hi");
        out = mfree(out);
        assert_int_equal(kube_base64_decode("not base64!", &out, &n), -EINVAL);
}

static void on_event(KubeNode *k, const KubeNodeEvent *ev, void *userdata) {
}

static void test_node_name(void **state) {
        assert_true(kube_node_name_is_valid("gpu-node-7"));
        assert_true(kube_node_name_is_valid("ip-10-0-0-1.ec2.internal"));
        assert_true(kube_node_name_is_valid("a"));
        assert_false(kube_node_name_is_valid(""));
        assert_false(kube_node_name_is_valid("GPU-node"));      /* the kubelet lower-cases host names */
        assert_false(kube_node_name_is_valid("gpu_node"));
        assert_false(kube_node_name_is_valid("-gpu"));
        assert_false(kube_node_name_is_valid("gpu."));
        assert_false(kube_node_name_is_valid("a..b"));
        assert_false(kube_node_name_is_valid("a-.b"));
        assert_false(kube_node_name_is_valid("a.-b"));
        assert_false(kube_node_name_is_valid("n1/../../api"));  /* would leave /api/v1/nodes/ */
        assert_false(kube_node_name_is_valid("n1?watch=true"));
        char long_name[300];
        memset(long_name, 'a', sizeof(long_name) - 1);
        long_name[sizeof(long_name) - 1] = 0;
        assert_false(kube_node_name_is_valid(long_name));
        long_name[253] = 0;
        assert_true(kube_node_name_is_valid(long_name));
}

static void test_printable(void **state) {
        _cleanup_free_ char *a = kube_printable("all-1g.5gb", 80), *b = kube_printable("a\x01\xff\\b\n", 80),
                            *c = kube_printable("abcdef", 3);
        assert_string_equal(a, "all-1g.5gb");
        assert_string_equal(b, "a\\x01\\xff\\x5cb\\x0a");
        assert_string_equal(c, "abc...");
}

static void check_node_options(const KubeNodeOptions *o, int want_r, const char *want_error) {
        _cleanup_free_ char *error = NULL;
        sd_event *e = NULL;
        KubeNode *k = NULL;

        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(kube_node_new(e, o, on_event, NULL, &k, &error), want_r);
        assert_null(k);
        assert_non_null(error);
        if (!strstr(error, want_error))
                fail_msg("error '%s' lacks '%s'", error, want_error);
        sd_event_unref(e);
}

static void check_kubeconfig(const char *content, int want_r, const char *want_error) {
        char path[] = "/tmp/test-kube-node-XXXXXX";
        _cleanup_free_ char *error = NULL, *want = NULL;
        sd_event *e = NULL;
        KubeNode *k = NULL;
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, content, strlen(content)), (ssize_t) strlen(content));
        close(fd);
        assert_int_equal(sd_event_new(&e), 0);
        KubeNodeOptions o = { .kubeconfig = path, .node_name = "n1", .label = "nvidia.com/mig.config" };
        assert_int_equal(kube_node_new(e, &o, on_event, NULL, &k, &error), want_r);
        assert_null(k);
        assert_true(asprintf(&want, "%s: %s", path, want_error) >= 0);
        assert_string_equal(error, want);
        unlink(path);
        sd_event_unref(e);
}

static void test_kubeconfig_errors(void **state) {
        check_kubeconfig("apiVersion: v1\nkind: Config\n", -EINVAL,
                         "no API server: current-context must name a context whose cluster has a server");
        check_kubeconfig("clusters:\n- name: c\n  cluster:\n    server: http://10.0.0.1:6443\n"
                         "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
                         -EINVAL, "the API server http://10.0.0.1:6443 is not an https:// URL");
        check_kubeconfig("clusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n"
                         "    certificate-authority-data: '%%%'\n"
                         "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n",
                         -EINVAL, "a certificate or key is not valid base64");

        _cleanup_free_ char *error = NULL;
        sd_event *e = NULL;
        KubeNode *k = NULL;
        assert_int_equal(sd_event_new(&e), 0);
        KubeNodeOptions o = { .kubeconfig = "/nonexistent/kubelet.conf", .node_name = "n1", .label = "l" };
        assert_int_equal(kube_node_new(e, &o, on_event, NULL, &k, &error), -ENOENT);
        assert_string_equal(error, "/nonexistent/kubelet.conf: cannot read the kubeconfig: No such file or directory");
        sd_event_unref(e);

        /* A token goes into a header line: no line breaks, no spaces. */
        check_kubeconfig("clusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n"
                         "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
                         "users:\n- name: u\n  user:\n    token: \"abc\\r\\nX-Injected: 1\"\n",
                         -EINVAL, "the user's token has spaces or control characters");
}

static const char *const kubeconfig_ok =
        "clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:9\n"
        "contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        "users:\n- name: u\n  user:\n    token: abc\n";

static void test_node_name_refused(void **state) {
        char path[] = "/tmp/test-kube-node-XXXXXX";
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, kubeconfig_ok, strlen(kubeconfig_ok)), (ssize_t) strlen(kubeconfig_ok));
        close(fd);
        KubeNodeOptions o = { .kubeconfig = path, .node_name = "Gpu_Node/../x", .label = "l" };
        check_node_options(&o, -EINVAL, "the node name 'Gpu_Node/../x' is not a Kubernetes node name");
        o.node_name = "n\001";
        check_node_options(&o, -EINVAL, "the node name 'n\\x01' is not");
        unlink(path);
}

static void write_file(const char *dir, const char *name, const char *content) {
        _cleanup_free_ char *p = path_join(dir, name);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fputs(content, f);
        fclose(f);
}

static void test_in_cluster_errors(void **state) {
        char dir[] = "/tmp/test-kube-sa-XXXXXX";
        KubeNodeOptions o = { .service_account_dir = dir, .node_name = "n1", .label = "l" };

        assert_non_null(mkdtemp(dir));
        unsetenv("KUBERNETES_SERVICE_HOST");
        unsetenv("KUBERNETES_SERVICE_PORT");
        check_node_options(&o, -ENXIO, "kubernetes.credentials is in-cluster, but KUBERNETES_SERVICE_HOST and "
                           "KUBERNETES_SERVICE_PORT are not set");
        setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1/evil", 1);
        setenv("KUBERNETES_SERVICE_PORT", "443", 1);
        check_node_options(&o, -EINVAL, "are not a host and a port");
        setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
        check_node_options(&o, -ENOENT, "/ca.crt: cannot read the cluster CA: No such file or directory");
        write_file(dir, "ca.crt", "-----BEGIN CERTIFICATE-----\n");
        check_node_options(&o, -ENOENT, "/token: cannot read the token: No such file or directory");
        write_file(dir, "token", "\n");
        check_node_options(&o, -EINVAL, "/token: the token file is empty");

        /* All there: the watch starts (no server answers here; nothing is run). */
        _cleanup_free_ char *error = NULL;
        sd_event *e = NULL;
        KubeNode *k = NULL;
        write_file(dir, "token", "eyJhbGciOi.payload.sig\n");
        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(kube_node_new(e, &o, on_event, NULL, &k, &error), 0);
        assert_null(error);
        kube_node_free(k);
        sd_event_unref(e);

        _cleanup_free_ char *ca = path_join(dir, "ca.crt"), *token = path_join(dir, "token");
        unlink(ca);
        unlink(token);
        rmdir(dir);
        unsetenv("KUBERNETES_SERVICE_HOST");
        unsetenv("KUBERNETES_SERVICE_PORT");
}

/* ---- the watch stream ---- */

typedef struct Seen {
        int labels, errors;
        char *value, *refused, *error;
} Seen;

static void seen_clear(Seen *s) {
        s->value = mfree(s->value);
        s->refused = mfree(s->refused);
        s->error = mfree(s->error);
        s->labels = s->errors = 0;
}

static void on_seen(KubeNode *k, const KubeNodeEvent *ev, void *userdata) {
        Seen *s = userdata;

        if (ev->label) {
                s->labels++;
                free(s->value);
                free(s->refused);
                s->value = ev->value ? strdup(ev->value) : NULL;
                s->refused = ev->refused ? strdup(ev->refused) : NULL;
        } else {
                s->errors++;
                free(s->error);
                s->error = strdup(ev->message);
        }
}

static int feed(KubeNode *k, const char *line) {
        return kube_node_watch_feed(k, line, strlen(line));
}

#define NODE_EVENT(type, rv, labels) \
        "{\"type\":\"" type "\",\"object\":{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"n1\"," \
        "\"resourceVersion\":\"" rv "\",\"labels\":{\"kubernetes.io/hostname\":\"n1\"" labels "}}}}\n"
#define BOOKMARK(rv) \
        "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":" \
        "{\"resourceVersion\":\"" rv "\",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}\n"
#define MIG(v) ",\"nvidia.com/mig.config\":\"" v "\""

static void test_watch_events(void **state) {
        char path[] = "/tmp/test-kube-node-XXXXXX";
        _cleanup_free_ char *error = NULL;
        sd_event *e = NULL;
        KubeNode *k = NULL;
        Seen s = {};
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, kubeconfig_ok, strlen(kubeconfig_ok)), (ssize_t) strlen(kubeconfig_ok));
        close(fd);
        assert_int_equal(sd_event_new(&e), 0);
        KubeNodeOptions o = { .kubeconfig = path, .node_name = "n1", .label = "nvidia.com/mig.config" };
        assert_int_equal(kube_node_new(e, &o, on_seen, &s, &k, &error), 0);
        seen_clear(&s);

        assert_int_equal(feed(k, NODE_EVENT("MODIFIED", "5", MIG("all-1g.5gb"))), 0);
        assert_int_equal(s.labels, 1);
        assert_string_equal(s.value, "all-1g.5gb");
        assert_string_equal(kube_node_resource_version(k), "5");

        /* A BOOKMARK has no labels: it moves the resume point and nothing else. */
        assert_int_equal(feed(k, BOOKMARK("7")), 0);
        assert_int_equal(s.labels, 1);
        assert_int_equal(s.errors, 0);
        assert_string_equal(kube_node_resource_version(k), "7");
        assert_int_equal(feed(k, NODE_EVENT("MODIFIED", "8", MIG("all-1g.5gb")) BOOKMARK("9") BOOKMARK("12")), 0);
        assert_int_equal(s.labels, 1);
        assert_string_equal(kube_node_resource_version(k), "12");

        /* An event cut anywhere between chunks; a bookmark right behind it. */
        const char *two = NODE_EVENT("MODIFIED", "13", MIG("all-2g.10gb")) BOOKMARK("14");
        for (size_t cut = 1; cut < strlen(two); cut += 7) {
                seen_clear(&s);
                assert_int_equal(feed(k, NODE_EVENT("MODIFIED", "13", MIG("all-1g.5gb"))), 0);
                seen_clear(&s);
                assert_int_equal(kube_node_watch_feed(k, two, cut), 0);
                assert_int_equal(kube_node_watch_feed(k, two + cut, strlen(two) - cut), 0);
                assert_int_equal(s.labels, 1);
                assert_string_equal(s.value, "all-2g.10gb");
                assert_string_equal(kube_node_resource_version(k), "14");
        }

        /* Another node's object: refused, nothing taken from it. */
        seen_clear(&s);
        assert_int_equal(feed(k, "{\"type\":\"MODIFIED\",\"object\":{\"kind\":\"Node\",\"metadata\":{\"name\":"
                                 "\"gpu-node-8\",\"resourceVersion\":\"20\",\"labels\":" "{\"nvidia.com/mig.config\":"
                                 "\"all-7g.80gb\"}}}}\n"), 0);
        assert_int_equal(s.labels, 0);
        assert_int_equal(s.errors, 1);
        assert_non_null(strstr(s.error, "a watch event for the Node 'gpu-node-8', not for this node n1"));
        assert_string_equal(kube_node_resource_version(k), "14");

        /* Garbage, an unknown type, an object without metadata: nothing. */
        seen_clear(&s);
        assert_int_equal(feed(k, "not json\n{\"type\":\"FUTURE\",\"object\":{}}\n{\"type\":1,\"object\":2}\n\n"), 0);
        assert_int_equal(s.labels + s.errors, 0);

        /* Hostile label values: refused, shown escaped; the same refused value once. */
        char big[600] = NODE_EVENT("MODIFIED", "21", MIG(""));
        size_t n = strlen(big) - 6; /* before "\"}}}}\n" */
        memset(big + n, 'a', 300);
        strcpy(big + n + 300, "\"}}}}\n");
        assert_true(strlen(big) < sizeof(big));
        seen_clear(&s);
        assert_int_equal(feed(k, big), 0);
        assert_int_equal(s.labels, 1);
        assert_null(s.value);
        assert_non_null(s.refused);
        assert_int_equal(strlen(s.refused), 83); /* 80 + "..." */
        assert_int_equal(feed(k, NODE_EVENT("MODIFIED", "22", MIG("\\u0001\\u00ff;rm -rf"))), 0);
        assert_int_equal(s.labels, 2);
        assert_string_equal(s.refused, "\\x01\\xc3\\xbf;rm -rf");
        assert_int_equal(feed(k, NODE_EVENT("MODIFIED", "23", MIG("\\u0001\\u00ff;rm -rf"))), 0);
        assert_int_equal(s.labels, 2);
        /* A NUL inside: not the prefix before it. */
        assert_int_equal(feed(k, NODE_EVENT("MODIFIED", "24", MIG("all-1g.5gb"))), 0);
        assert_int_equal(s.labels, 3);
        assert_string_equal(s.value, "all-1g.5gb");
        assert_int_equal(feed(k, NODE_EVENT("MODIFIED", "25", MIG("all-1g.5gb\\u0000x"))), 0);
        assert_int_equal(s.labels, 4);
        assert_null(s.value);
        assert_string_equal(s.refused, "all-1g.5gb");

        /* "" is no selection, as an absent label; DELETED takes the label away. */
        assert_int_equal(feed(k, NODE_EVENT("MODIFIED", "26", MIG(""))), 0);
        assert_int_equal(s.labels, 5);
        assert_null(s.value);
        assert_null(s.refused);
        assert_int_equal(feed(k, NODE_EVENT("MODIFIED", "27", MIG("all-1g.5gb"))), 0);
        assert_int_equal(feed(k, NODE_EVENT("DELETED", "28", MIG("all-1g.5gb"))), 0);
        assert_int_equal(s.labels, 7);
        assert_null(s.value);

        /* ERROR carries a Status: 410 ends the stream to list again, anything else ends it too. */
        seen_clear(&s);
        assert_int_equal(feed(k, "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\","
                                 "\"metadata\":{},\"status\":\"Failure\",\"message\":\"too old resource version: 5 "
                                 "(40)\",\"reason\":\"Expired\",\"code\":410}}\n"), -ESTALE);
        assert_int_equal(feed(k, "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\","
                                 "\"metadata\":{},\"status\":\"Failure\",\"message\":\"etcd: leader changed\","
                                 "\"reason\":\"InternalError\",\"code\":500}}\n"), -EPROTO);
        assert_int_equal(s.labels + s.errors, 0);

        /* A line without an end that grows past 1 MiB ends the stream. */
        char chunk[4096];
        memset(chunk, ' ', sizeof(chunk));
        int r = 0;
        for (size_t i = 0; i < 300 && r == 0; i++)
                r = kube_node_watch_feed(k, chunk, sizeof(chunk));
        assert_int_equal(r, -EFBIG);

        seen_clear(&s);
        kube_node_free(k);
        sd_event_unref(e);
        unlink(path);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_base64),
                cmocka_unit_test(test_node_name),
                cmocka_unit_test(test_printable),
                cmocka_unit_test(test_kubeconfig_errors),
                cmocka_unit_test(test_node_name_refused),
                cmocka_unit_test(test_in_cluster_errors),
                cmocka_unit_test(test_watch_events),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
