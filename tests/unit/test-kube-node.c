/* SPDX-License-Identifier: MIT */
/* Tests the Kubernetes node watch's kubeconfig reading as an administrator meets it: the errors for a
 * kubeconfig that cannot work, and the base64 of its *-data fields. The watch itself is tested against a
 * loopback API server in tests/integration/test-kube-mig.py. */
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
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_base64),
                cmocka_unit_test(test_kubeconfig_errors),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
