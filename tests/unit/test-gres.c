/* SPDX-License-Identifier: MIT */
/* Tests for agent/gres.c: the Slurm gres.conf lines of full GPUs and MIG devices, the Cores= a GPU's
 * local CPUs give (hyperthread siblings dropped), what is left out and why, and writing only on change.
 * Expected lines are written by hand from gres.conf(5) and the MIG format slurmd reads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "fileio.h"
#include "gres.h"
#include "strv.h"

static char *tmp;

static void put(const char *rel, const char *content) {
        _cleanup_free_ char *p = path_join(tmp, rel), *dir = strdup(p);
        *strrchr(dir, '/') = '\0';
        assert_int_equal(mkdir_p(dir, 0755), 0);
        assert_int_equal(write_file_atomic(p, NULL, content, strlen(content), 0644), 0);
}

static int setup(void **state) {
        tmp = strdup("/tmp/gna-test-gres-XXXXXX");
        assert_non_null(mkdtemp(tmp));
        /* Two GPUs on two NUMA nodes of a 2×4-core, 2-threads-per-core machine: CPUs 0-3 and 8-11 on
         * node 0 (8-11 the siblings of 0-3), 4-7 and 12-15 on node 1. */
        put("sys/bus/pci/devices/0000:1b:00.0/local_cpulist", "0-3,8-11\n");
        put("sys/bus/pci/devices/0000:9d:00.0/local_cpulist", "4-7,12-15\n");
        for (unsigned c = 0; c < 16; c++) {
                _cleanup_free_ char *rel = strprintf("sys/devices/system/cpu/cpu%u/topology/thread_siblings_list", c),
                                    *v = strprintf("%u,%u\n", c % 8, c % 8 + 8);
                put(rel, v);
        }
        put("proc/driver/nvidia-caps/mig-minors",
            "config 1\nmonitor 2\ngpu1/gi1/access 138\ngpu1/gi1/ci0/access 139\ngpu1/gi2/access 147\n"
            "gpu1/gi2/ci0/access 148\ngpu1/gi2/ci1/access 149\n");
        return 0;
}

static int teardown(void **state) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", tmp);
        assert_int_equal(system(cmd), 0);
        free(tmp);
        return 0;
}

static GresInput input(const NvmlSnapshot *s, char **sys, char **proc) {
        *sys = path_join(tmp, "sys");
        *proc = path_join(tmp, "proc");
        return (GresInput) { .snapshot = s, .sys = *sys, .proc = *proc, .dev = "/dev" };
}

static void test_type_name(void **state) {
        _cleanup_free_ char *a = gres_type_name("NVIDIA H100 80GB HBM3"), *b = gres_type_name("NVIDIA A100-SXM4-40GB");
        assert_string_equal(a, "nvidia_h100_80gb_hbm3");
        assert_string_equal(b, "nvidia_a100-sxm4-40gb");
}

/* A hostile driver's name can neither end the line, start a comment, nor add a key. */
static void test_hostile_name(void **state) {
        _cleanup_free_ char *sys = NULL, *proc = NULL, *text = NULL;
        _cleanup_strv_free_ char **warnings = NULL, **lines = NULL;
        char name[] = "NVIDIA \"H100\"\n#Name=gpu File=/dev/sda,x\\ \xff'";
        GpuInfo g = { .pci_address = "0000:1b:00.0", .name = name, .minor = 0, .cc_major = 9,
                      .mig_current = GPU_MIG_UNSUPPORTED, .mig_pending = GPU_MIG_UNSUPPORTED };
        NvmlSnapshot s = { .gpus = &g, .n_gpus = 1 };
        GresInput in = input(&s, &sys, &proc);
        size_t n_gres = 0;
        (void) state;

        assert_int_equal(gres_format(&in, &text, &warnings), 1);
        for (const char *p = text, *e; *p; p = e + 1) {
                e = strchr(p, '\n');
                assert_non_null(e);
                assert_int_equal(strv_extendf(&lines, "%.*s", (int) (e - p), p), 0);
        }
        STRV_FOREACH(l, lines) {
                if (**l == '#')
                        continue;
                n_gres++;
                assert_null(strchr(*l, '#'));
                assert_string_equal(*l, "Name=gpu Type=nvidia__h100___name_gpu_file_/dev/sda_x____ File=/dev/nvidia0 Cores=0-3");
        }
        assert_int_equal(n_gres, 1);
}

static void test_cores(void **state) {
        _cleanup_free_ char *sys = path_join(tmp, "sys"), *a = NULL, *b = NULL, *c = NULL;

        assert_int_equal(gres_cores_from_cpulist(sys, "0-3,8-11", &a), 0);
        assert_string_equal(a, "0-3");
        assert_int_equal(gres_cores_from_cpulist(sys, "4-7,12-15\n", &b), 0);
        assert_string_equal(b, "4-7");
        /* Without topology files every CPU counts as a core. */
        assert_int_equal(gres_cores_from_cpulist("/nonexistent", "0-2,5", &c), 0);
        assert_string_equal(c, "0-2,5");
        assert_int_equal(gres_cores_from_cpulist(sys, "3-1", &c), -EINVAL);
        assert_int_equal(gres_cores_from_cpulist(sys, "a", &c), -EINVAL);
}

static void test_full_and_mig(void **state) {
        MigDeviceInfo mig[] = {
                { .gi_id = 1, .ci_id = 0, .profile = (char *) "3g.40gb", .uuid = (char *) "MIG-a" },
                { .gi_id = 2, .ci_id = 0, .profile = (char *) "1c.2g.20gb", .uuid = (char *) "MIG-b" },
                { .gi_id = 2, .ci_id = 1, .profile = (char *) "1c.2g.20gb", .uuid = (char *) "MIG-c" },
        };
        GpuInfo gpus[] = {
                { .pci_address = "0000:1b:00.0", .name = (char *) "NVIDIA H100 80GB HBM3", .minor = 0,
                  .mig_current = GPU_MIG_DISABLED },
                { .pci_address = "0000:9d:00.0", .name = (char *) "NVIDIA H100 80GB HBM3", .minor = 1,
                  .mig_current = GPU_MIG_ENABLED, .mig_devices = mig, .n_mig_devices = 3 },
        };
        NvmlSnapshot s = { .gpus = gpus, .n_gpus = 2 };
        _cleanup_free_ char *sys = NULL, *proc = NULL, *text = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        GresInput in = input(&s, &sys, &proc);

        assert_int_equal(gres_format(&in, &text, &warnings), 4);
        assert_null(warnings);
        assert_string_equal(text,
                "# Slurm GRES of this node, written by gpu-node-agent from NVML; do not edit.\n"
                "# Include it from gres.conf (\"Include <this file>\"); see gpu-node-agent.yaml(5), gres.slurm.\n"
                "Name=gpu Type=nvidia_h100_80gb_hbm3 File=/dev/nvidia0 Cores=0-3\n"
                "Name=gpu Type=nvidia_h100_80gb_hbm3_3g.40gb MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap138,/dev/nvidia-caps/nvidia-cap139 Cores=4-7\n"
                "Name=gpu Type=nvidia_h100_80gb_hbm3_1c.2g.20gb MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap147,/dev/nvidia-caps/nvidia-cap148 Cores=4-7\n"
                "Name=gpu Type=nvidia_h100_80gb_hbm3_1c.2g.20gb MultipleFiles=/dev/nvidia1,/dev/nvidia-caps/nvidia-cap147,/dev/nvidia-caps/nvidia-cap149 Cores=4-7\n");
}

static void test_links(void **state) {
        /* 1b and 9d joined by a bridge: 4 links each way; 9d also has 2 links to an NVSwitch (05:00.0),
         * which count for no GPU. aa is MIG-enabled: its MIG lines have no Links= even with NVLink state
         * known; bb says nothing about NVLink (PCIe, or an older driver): no Links= either. */
        char *bridge_9d[] = { "0000:9d:00.0", "0000:9d:00.0", "0000:9d:00.0", "0000:9d:00.0", NULL };
        char *bridge_1b[] = { "0000:05:00.0", "0000:1b:00.0", "0000:1b:00.0", "0000:05:00.0", "0000:1b:00.0",
                              "0000:1b:00.0", NULL };
        MigDeviceInfo mig[] = { { .gi_id = 1, .ci_id = 0, .profile = (char *) "3g.40gb", .uuid = (char *) "MIG-a" } };
        GpuInfo gpus[] = {
                { .pci_address = "0000:1b:00.0", .name = (char *) "NVIDIA A100-PCIE-40GB", .minor = 0,
                  .nvlink_known = true, .nvlink_remotes = bridge_9d },
                { .pci_address = "0000:9d:00.0", .name = (char *) "NVIDIA A100-PCIE-40GB", .minor = 1,
                  .nvlink_known = true, .nvlink_remotes = bridge_1b },
                { .pci_address = "0000:aa:00.0", .name = (char *) "NVIDIA A100-PCIE-40GB", .minor = 1,
                  .mig_current = GPU_MIG_ENABLED, .mig_devices = mig, .n_mig_devices = 1, .nvlink_known = true },
                { .pci_address = "0000:bb:00.0", .name = (char *) "NVIDIA L40S", .minor = 3 },
        };
        NvmlSnapshot s = { .gpus = gpus, .n_gpus = 4 };
        _cleanup_free_ char *sys = NULL, *proc = NULL, *text = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        GresInput in = input(&s, &sys, &proc);

        assert_int_equal(gres_format(&in, &text, &warnings), 4);
        assert_non_null(strstr(text, "\nName=gpu Type=nvidia_a100-pcie-40gb File=/dev/nvidia0 Cores=0-3 Links=-1,4,0,0\n"));
        assert_non_null(strstr(text, "\nName=gpu Type=nvidia_a100-pcie-40gb File=/dev/nvidia1 Cores=4-7 Links=4,-1,0,0\n"));
        assert_non_null(strstr(text, "\nName=gpu Type=nvidia_a100-pcie-40gb_3g.40gb MultipleFiles=/dev/nvidia1,"
                                     "/dev/nvidia-caps/nvidia-cap138,/dev/nvidia-caps/nvidia-cap139\n"));
        assert_non_null(strstr(text, "\nName=gpu Type=nvidia_l40s File=/dev/nvidia3\n"));

        /* All links to NVSwitches (a DGX): known, but no GPU is a direct peer. */
        char *switches[] = { "0000:05:00.0", "0000:06:00.0", NULL };
        GpuInfo dgx[] = {
                { .pci_address = "0000:1b:00.0", .name = (char *) "NVIDIA H100 80GB HBM3", .minor = 0,
                  .nvlink_known = true, .nvlink_remotes = switches },
                { .pci_address = "0000:9d:00.0", .name = (char *) "NVIDIA H100 80GB HBM3", .minor = 1,
                  .nvlink_known = true, .nvlink_remotes = switches },
        };
        NvmlSnapshot d = { .gpus = dgx, .n_gpus = 2 };
        _cleanup_free_ char *dtext = NULL;
        in.snapshot = &d;
        assert_int_equal(gres_format(&in, &dtext, NULL), 2);
        assert_non_null(strstr(dtext, " File=/dev/nvidia0 Cores=0-3 Links=-1,0\n"));
        assert_non_null(strstr(dtext, " File=/dev/nvidia1 Cores=4-7 Links=0,-1\n"));
}

static void test_left_out(void **state) {
        MigDeviceInfo mig[] = {
                { .gi_id = 9, .ci_id = 0, .profile = (char *) "1g.10gb", .uuid = (char *) "MIG-x" },
        };
        GpuInfo gpus[] = {
                { .pci_address = "0000:1b:00.0", .name = (char *) "NVIDIA H100 80GB HBM3", .minor = -1 },
                { .pci_address = "0000:9d:00.0", .name = (char *) "NVIDIA H100 80GB HBM3", .minor = 1,
                  .mig_current = GPU_MIG_ENABLED, .mig_devices = mig, .n_mig_devices = 1 },
                { .pci_address = "0000:aa:00.0", .name = (char *) "NVIDIA L40S", .minor = 2 },
        };
        NvmlSnapshot s = { .gpus = gpus, .n_gpus = 3 };
        _cleanup_free_ char *sys = NULL, *proc = NULL, *text = NULL;
        _cleanup_strv_free_ char **warnings = NULL;
        GresInput in = input(&s, &sys, &proc);

        /* Only the L40S is described, without Cores= (sysfs has no local_cpulist for it). */
        assert_int_equal(gres_format(&in, &text, &warnings), 1);
        assert_non_null(strstr(text, "\nName=gpu Type=nvidia_l40s File=/dev/nvidia2\n"));
        assert_int_equal(strv_length(warnings), 3);
        assert_string_equal(warnings[0], "GPU 0000:1b:00.0: NVML did not report its device minor: not in gres.conf");
        assert_string_equal(warnings[1], "MIG device MIG-x (GPU 0000:9d:00.0, GI 9, CI 0): its capability minors are "
                                         "not in mig-minors: not in gres.conf");
        assert_non_null(strstr(warnings[2], "GPU 0000:aa:00.0: no usable local_cpulist in sysfs"));
}

static void test_no_gpu_header_only(void **state) {
        _cleanup_free_ char *sys = NULL, *proc = NULL, *text = NULL;
        GresInput in = input(NULL, &sys, &proc);

        assert_int_equal(gres_format(&in, &text, NULL), 0);
        assert_null(strstr(text, "Name=gpu"));
        assert_true(startswith(text, "# Slurm GRES of this node"));
}

static void test_write_only_on_change(void **state) {
        _cleanup_free_ char *p = path_join(tmp, "etc/slurm/gres-gpu-node-agent.conf"), *back = NULL;
        struct stat a, b;
        bool changed;

        assert_int_equal(gres_write(p, "Name=gpu File=/dev/nvidia0\n", &changed), 0);
        assert_true(changed);
        assert_int_equal(stat(p, &a), 0);
        assert_int_equal(a.st_mode & 07777, 0644);
        assert_int_equal(gres_write(p, "Name=gpu File=/dev/nvidia0\n", &changed), 0);
        assert_false(changed);
        assert_int_equal(stat(p, &b), 0);
        assert_int_equal(a.st_ino, b.st_ino); /* not replaced */
        assert_int_equal(gres_write(p, "Name=gpu File=/dev/nvidia1\n", &changed), 0);
        assert_true(changed);
        assert_int_equal(read_full_file(p, 4096, &back, NULL), 0);
        assert_string_equal(back, "Name=gpu File=/dev/nvidia1\n");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_type_name),
                cmocka_unit_test(test_hostile_name),
                cmocka_unit_test(test_cores),
                cmocka_unit_test(test_full_and_mig),
                cmocka_unit_test(test_links),
                cmocka_unit_test(test_left_out),
                cmocka_unit_test(test_no_gpu_header_only),
                cmocka_unit_test(test_write_only_on_change),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
