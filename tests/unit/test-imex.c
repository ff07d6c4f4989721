/* SPDX-License-Identifier: MIT */
/* Tests for agent/imex.c and the IMEX part of modules/devnode.c: the clique NVML reports, the channel
 * nodes planned from /proc/devices (and the error without an IMEX-capable driver), creating them, and the
 * nvidia.com/imex-channel CDI spec in the container toolkit's shape, accepted by our CDI checker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <cmocka.h>

#include "fileio.h"
#include "imex.h"
#include "strv.h"

DEFINE_CLEANUP_FUNC(DevnodePlan *, devnode_plan_free);

static char *make_proc(const char *devices) {
        char *d = strdup("/tmp/gna-test-imex-XXXXXX");
        assert_non_null(mkdtemp(d));
        _cleanup_free_ char *p = path_join(d, "devices");
        assert_int_equal(write_file_atomic(p, NULL, devices, strlen(devices), 0644), 0);
        return d;
}

static void rm_rf(const char *d) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", d);
        assert_int_equal(system(cmd), 0);
}

static const char devices_imex[] = "Character devices:\n  1 mem\n195 nvidia-frontend\n235 nvidia-uvm\n236 nvidia-caps\n"
                                   "234 nvidia-caps-imex-channels\n\nBlock devices:\n  8 sd\n";

static void test_clique(void **state) {
        GpuInfo gpus[] = {
                { .pci_address = "0000:01:00.0" },
                { .pci_address = "0000:02:00.0", .clique = (char *) "a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90.7" },
                { .pci_address = "0000:03:00.0", .clique = (char *) "a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90.7" },
        };
        NvmlSnapshot s = { .gpus = gpus, .n_gpus = 3 };
        size_t n;

        assert_string_equal(imex_clique(&s, &n), "a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90.7");
        assert_int_equal(n, 2);
        s.n_gpus = 1;
        assert_null(imex_clique(&s, &n));
        assert_int_equal(n, 0);
        assert_null(imex_clique(NULL, NULL));
}

static void test_plan_and_spec(void **state) {
        _cleanup_free_ char *proc = make_proc(devices_imex), *text = NULL, *error = NULL;
        _cleanup_(devnode_plan_freep) DevnodePlan *plan = NULL;

        assert_int_equal(devnode_plan_imex(proc, 12, &plan, &error), 0);
        assert_int_equal(plan->n_nodes, 12);
        const DevnodeSpec *c0 = devnode_plan_find(plan, "nvidia-caps-imex-channels/channel0"),
                          *c11 = devnode_plan_find(plan, "nvidia-caps-imex-channels/channel11");
        assert_non_null(c0);
        assert_non_null(c11);
        assert_int_equal(c0->major, 234);
        assert_int_equal(c0->minor, 0);
        assert_int_equal(c11->minor, 11);
        assert_int_equal(c0->mode, 0666);
        assert_int_equal(c0->kind, DEVNODE_IMEX_CHANNEL);

        assert_int_equal(imex_cdi_spec_text(plan, &text), 0);
        /* Channel order, names = channel numbers, as nvidia-ctk's IMEX mode writes them. */
        assert_non_null(strstr(text, "\ncdiVersion: \"0.5.0\"\n"));
        assert_non_null(strstr(text, "\nkind: nvidia.com/imex-channel\n"));
        assert_non_null(strstr(text, "  name: \"11\"\n"));
        assert_true(startswith(text, "# Written by gpu-node-agent: the NVLink IMEX channels of this node"));
        const char *d0 = strstr(text, "/dev/nvidia-caps-imex-channels/channel0\n"),
                   *d2 = strstr(text, "/dev/nvidia-caps-imex-channels/channel2\n"),
                   *d10 = strstr(text, "/dev/nvidia-caps-imex-channels/channel10\n");
        assert_non_null(d0);
        assert_non_null(d2);
        assert_non_null(d10);
        assert_true(d0 < d2 && d2 < d10);
        assert_int_equal(cdi_validate_text("imex.yaml", text, strlen(text), &error), 0);
        rm_rf(proc);
}

static void test_modify_device_files_off(void **state) {
        _cleanup_free_ char *proc = make_proc(devices_imex), *error = NULL, *params = NULL, *dev = NULL, *node = NULL;
        _cleanup_(devnode_plan_freep) DevnodePlan *plan = NULL;
        DevnodeResult res = {};
        const char *text = "ModifyDeviceFiles: 0\n";

        params = path_join(proc, "driver/nvidia");
        assert_int_equal(mkdir_p(params, 0755), 0);
        free(params);
        params = path_join(proc, "driver/nvidia/params");
        assert_int_equal(write_file_atomic(params, NULL, text, strlen(text), 0644), 0);
        assert_int_equal(devnode_plan_imex(proc, 1, &plan, &error), 0);
        assert_false(plan->modify);
        dev = path_join(proc, "dev");
        assert_int_equal(mkdir(dev, 0755), 0);
        assert_int_equal(devnode_apply(plan, dev, &res, &error), 0);
        assert_int_equal(res.created, 0);
        node = path_join(dev, "nvidia-caps-imex-channels");
        assert_int_equal(access(node, F_OK), -1);
        rm_rf(proc);
}

static void test_no_imex_driver(void **state) {
        _cleanup_free_ char *proc = make_proc("Character devices:\n195 nvidia-frontend\n236 nvidia-caps\n"), *error = NULL;
        _cleanup_(devnode_plan_freep) DevnodePlan *plan = NULL;

        assert_int_equal(devnode_plan_imex(proc, 1, &plan, &error), -ENOENT);
        assert_non_null(strstr(error, "registered no \"nvidia-caps-imex-channels\" device"));
        assert_non_null(strstr(error, "driver 550 or later"));
        rm_rf(proc);
}

static void test_apply(void **state) {
        _cleanup_free_ char *proc = make_proc(devices_imex), *error = NULL, *dev = NULL, *node = NULL, *link = NULL;
        _cleanup_(devnode_plan_freep) DevnodePlan *plan = NULL;
        DevnodeResult res = {};
        struct stat st;

        if (geteuid() != 0)
                skip(); /* mknod needs CAP_MKNOD */
        dev = path_join(proc, "dev");
        assert_int_equal(mkdir(dev, 0755), 0);
        _cleanup_free_ char *dir = path_join(dev, "nvidia-caps-imex-channels");
        assert_int_equal(mkdir(dir, 0755), 0); /* the caller's part, as devnode.h says */
        assert_int_equal(devnode_plan_imex(proc, 2, &plan, &error), 0);
        assert_int_equal(devnode_apply(plan, dev, &res, &error), 0);
        assert_int_equal(res.created, 2);
        node = path_join(dev, "nvidia-caps-imex-channels/channel1");
        assert_int_equal(stat(node, &st), 0);
        assert_true(S_ISCHR(st.st_mode));
        assert_int_equal(major(st.st_rdev), 234);
        assert_int_equal(minor(st.st_rdev), 1);
        assert_int_equal(st.st_mode & 07777, 0666);
        link = path_join(dev, "char/234:1");
        assert_int_equal(lstat(link, &st), 0);
        assert_true(S_ISLNK(st.st_mode));
        assert_int_equal(devnode_apply(plan, dev, &res, &error), 0);
        assert_int_equal(res.created, 0);
        assert_int_equal(res.unchanged, 2);
        rm_rf(proc);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_clique),
                cmocka_unit_test(test_plan_and_spec),
                cmocka_unit_test(test_no_imex_driver),
                cmocka_unit_test(test_modify_device_files_off),
                cmocka_unit_test(test_apply),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
