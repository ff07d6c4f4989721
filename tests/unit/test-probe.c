/* SPDX-License-Identifier: MIT */
/* Tests for agent/probe.c: the PCI inventory read with libpci from the simulated nodes that
 * tests/fixtures/mknode.py generates, with the fixture pci.ids; broken trees are made on a copy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "fileio.h"
#include "probe.h"
#include "strv.h"

static const char *nodes_dir(void) {
        const char *d = getenv("GNA_FIXTURE_NODES");
        if (!d)
                fail_msg("GNA_FIXTURE_NODES is not set; run through meson test");
        return d;
}

static const char *pci_ids(void) {
        const char *p = getenv("GNA_FIXTURE_PCI_IDS");
        if (!p)
                fail_msg("GNA_FIXTURE_PCI_IDS is not set; run through meson test");
        return p;
}

static char *node_sys(const char *node) {
        char *s = strprintf("%s/%s/sys", nodes_dir(), node);
        assert_non_null(s);
        return s;
}

/* Probes a fixture node that must probe cleanly (no error, no warning). */
static Inventory *probe_clean(const char *node) {
        _cleanup_free_ char *sys = node_sys(node), *error = NULL;
        Inventory *inv = NULL;
        int r = probe_pci(sys, pci_ids(), &inv, &error);
        if (r < 0)
                fail_msg("probe of %s failed: %s", node, strna(error));
        assert_non_null(inv);
        if (inv->warnings) {
                _cleanup_free_ char *w = strv_join(inv->warnings, "\n");
                fail_msg("unexpected warnings for %s:\n%s", node, w);
        }
        return inv;
}

/* A writable copy of a fixture node, for tests that break it. */
static char *copy_node(const char *node) {
        _cleanup_free_ char *src = strprintf("%s/%s", nodes_dir(), node), *cmd = NULL;
        char *d = strdup("/tmp/gna-test-probe-XXXXXX");
        assert_non_null(d);
        assert_non_null(mkdtemp(d));
        cmd = strprintf("cp -a '%s/.' '%s/'", src, d);
        assert_int_equal(system(cmd), 0);
        return d;
}

static void rm_rf(const char *d) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", d);
        assert_int_equal(system(cmd), 0);
}

/* Replaces a device attribute with a directory: unreadable even for root, which these tests run as. */
static void make_unreadable(const char *root, const char *address, const char *attr) {
        _cleanup_free_ char *p = strprintf("%s/sys/bus/pci/devices/%s/%s", root, address, attr);
        assert_int_equal(unlink(p), 0);
        assert_int_equal(mkdir(p, 0755), 0);
}

/* Warnings are single log lines. */
static void assert_warnings_are_lines(const Inventory *inv) {
        STRV_FOREACH(w, inv->warnings) {
                assert_false(isempty(*w));
                assert_null(strchr(*w, '\n'));
        }
}

static bool has_warning(const Inventory *inv, const char *a, const char *b) {
        assert_warnings_are_lines(inv);
        STRV_FOREACH(w, inv->warnings)
                if (strstr(*w, a) && (!b || strstr(*w, b)))
                        return true;
        return false;
}

static void assert_device(const PciDevice *d, PciKind kind, unsigned index, const char *address, uint16_t vendor,
                          uint16_t device, uint16_t sub_vendor, uint16_t sub_device, uint32_t class_code,
                          const char *name, int numa, const char *driver, const char *speed, unsigned width) {
        assert_int_equal(d->kind, kind);
        assert_int_equal(d->index, index);
        assert_string_equal(d->address, address);
        assert_int_equal(d->vendor_id, vendor);
        assert_int_equal(d->device_id, device);
        assert_int_equal(d->subsystem_vendor_id, sub_vendor);
        assert_int_equal(d->subsystem_device_id, sub_device);
        assert_int_equal(d->class_code, class_code);
        if (name)
                assert_string_equal(d->name, name);
        else
                assert_null(d->name);
        assert_int_equal(d->numa_node, numa);
        if (driver)
                assert_string_equal(d->driver, driver);
        else
                assert_null(d->driver);
        if (speed)
                assert_string_equal(d->link_speed, speed);
        else
                assert_null(d->link_speed);
        assert_int_equal(d->link_width, width);
}

static void test_dgx_h100(void **state) {
        static const char *const gpus[] = { "0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
                                            "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0" };
        static const char *const switches[] = { "0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0" };
        static const char *const nics[] = { "0000:18:00.0", "0000:40:00.0", "0000:4f:00.0", "0000:5e:00.0",
                                            "0000:9a:00.0", "0000:c0:00.0", "0000:ce:00.0", "0000:dc:00.0" };
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("dgx-h100");

        /* The ASPEED BMC VGA (class 0300, not NVIDIA), the host bridges and the Intel NIC are ignored. */
        assert_int_equal(inv->n_gpus, 8);
        assert_int_equal(inv->n_nvswitches, 4);
        assert_int_equal(inv->n_nics, 8);

        for (unsigned i = 0; i < 8; i++) {
                assert_device(&inv->gpus[i], PCI_KIND_GPU, i, gpus[i], 0x10de, 0x2330, 0x10de, 0x16c1, 0x030200,
                              "GH100 [H100 SXM5 80GB]", i < 4 ? 0 : 1, "nvidia", "32.0 GT/s PCIe", 16);
                assert_true(inv->gpus[i].iommu_group > 0);
                for (unsigned j = 0; j < i; j++)
                        assert_int_not_equal(inv->gpus[i].iommu_group, inv->gpus[j].iommu_group);
        }
        for (unsigned i = 0; i < 4; i++)
                assert_device(&inv->nvswitches[i], PCI_KIND_NVSWITCH, i, switches[i], 0x10de, 0x22a3, 0x10de, 0x1796,
                              0x068000, "GH100 [H100 NVSwitch]", 0, "nvidia", "16.0 GT/s PCIe", 2);
        for (unsigned i = 0; i < 8; i++)
                assert_device(&inv->nics[i], PCI_KIND_NIC, i, nics[i], 0x15b3, 0x1021, 0x15b3, 0x0041, 0x020700,
                              "MT2910 Family [ConnectX-7]", i < 4 ? 0 : 1, "mlx5_core", "32.0 GT/s PCIe", 16);
}

static void test_a100_pcie(void **state) {
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("a100-pcie");

        assert_int_equal(inv->n_gpus, 2);
        assert_int_equal(inv->n_nvswitches, 0);
        assert_int_equal(inv->n_nics, 0);
        assert_device(&inv->gpus[0], PCI_KIND_GPU, 0, "0000:17:00.0", 0x10de, 0x20f1, 0x10de, 0x145f, 0x030200,
                      "GA100 [A100 PCIe 40GB]", 0, "nvidia", "16.0 GT/s PCIe", 16);
        assert_device(&inv->gpus[1], PCI_KIND_GPU, 1, "0000:ca:00.0", 0x10de, 0x20f1, 0x10de, 0x145f, 0x030200,
                      "GA100 [A100 PCIe 40GB]", 1, "nvidia", "16.0 GT/s PCIe", 16);
        assert_int_equal(inv->gpus[0].iommu_group, 40);
        assert_int_equal(inv->gpus[1].iommu_group, 120);
}

static void test_h200(void **state) {
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("h200");

        /* 0x2335 is only in the fixture pci.ids, not in Debian 12's: the name proves which file was read. */
        assert_int_equal(inv->n_gpus, 1);
        assert_device(&inv->gpus[0], PCI_KIND_GPU, 0, "0000:4c:00.0", 0x10de, 0x2335, 0x10de, 0x18be, 0x030200,
                      "GH100 [H200 SXM 141GB]", 0, "nvidia", "32.0 GT/s PCIe", 16);
        assert_int_equal(inv->gpus[0].iommu_group, 33);
}

static void test_l40s(void **state) {
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("l40s");

        /* Trained at x8 although it can do x16: the current width is what is reported. */
        assert_int_equal(inv->n_gpus, 1);
        assert_device(&inv->gpus[0], PCI_KIND_GPU, 0, "0000:e1:00.0", 0x10de, 0x26b9, 0x10de, 0x1851, 0x030200,
                      "AD102GL [L40S]", 1, "nvidia", "16.0 GT/s PCIe", 8);
        assert_int_equal(inv->gpus[0].iommu_group, 77);
}

static void test_vfio(void **state) {
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("vfio");

        assert_int_equal(inv->n_gpus, 2);
        assert_string_equal(inv->gpus[0].address, "0000:21:00.0");
        assert_string_equal(inv->gpus[0].driver, "vfio-pci");
        assert_int_equal(inv->gpus[0].iommu_group, 12);
        assert_string_equal(inv->gpus[1].address, "0000:81:00.0");
        assert_string_equal(inv->gpus[1].driver, "nvidia");
        assert_int_equal(inv->gpus[1].iommu_group, 50);
}

static void test_mixed_sorted(void **state) {
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("mixed");

        /* The description lists L40S, H100, A100; the index follows the PCI address. */
        assert_int_equal(inv->n_gpus, 3);
        assert_device(&inv->gpus[0], PCI_KIND_GPU, 0, "0000:0a:00.0", 0x10de, 0x2330, 0x10de, 0x16c1, 0x030200,
                      "GH100 [H100 SXM5 80GB]", 0, "nvidia", "32.0 GT/s PCIe", 16);
        assert_device(&inv->gpus[1], PCI_KIND_GPU, 1, "0000:3b:00.0", 0x10de, 0x26b9, 0x10de, 0x1851, 0x030200,
                      "AD102GL [L40S]", 0, "nvidia", "16.0 GT/s PCIe", 16);
        assert_device(&inv->gpus[2], PCI_KIND_GPU, 2, "0000:86:00.0", 0x10de, 0x20f1, 0x10de, 0x145f, 0x030200,
                      "GA100 [A100 PCIe 40GB]", 1, "nvidia", "16.0 GT/s PCIe", 16);
}

static void test_sriov_vfs_skipped(void **state) {
        _cleanup_free_ char *sys = node_sys("sriov"), *vf = NULL;
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("sriov");
        struct stat st;

        /* The fixture does have the VFs, as NVIDIA display-class functions bound to nvidia. */
        vf = strprintf("%s/bus/pci/devices/0000:41:00.4/physfn", sys);
        assert_int_equal(lstat(vf, &st), 0);

        assert_int_equal(inv->n_gpus, 1);
        assert_device(&inv->gpus[0], PCI_KIND_GPU, 0, "0000:41:00.0", 0x10de, 0x20f1, 0x10de, 0x145f, 0x030200,
                      "GA100 [A100 PCIe 40GB]", 0, "nvidia", "16.0 GT/s PCIe", 16);
}

static void test_no_gpu(void **state) {
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("no-gpu");

        assert_int_equal(inv->n_gpus, 0);
        assert_int_equal(inv->n_nvswitches, 0);
        assert_int_equal(inv->n_nics, 0);
        assert_null(inv->gpus);
}

static void test_unbound(void **state) {
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("unbound");

        assert_int_equal(inv->n_gpus, 1);
        assert_device(&inv->gpus[0], PCI_KIND_GPU, 0, "0000:1b:00.0", 0x10de, 0x2330, 0x10de, 0x16c1, 0x030200,
                      "GH100 [H100 SXM5 80GB]", 0, NULL, "32.0 GT/s PCIe", 16);
        assert_int_equal(inv->gpus[0].iommu_group, 9);
}

static void test_synthetic(void **state) {
        static const unsigned counts[] = { 1, 8, 16, 64 };

        for (size_t k = 0; k < ELEMENTSOF(counts); k++) {
                _cleanup_free_ char *name = strprintf("gen-%u", counts[k]);
                _cleanup_(inventory_freep) Inventory *inv = probe_clean(name);
                unsigned numa1 = 0;

                assert_int_equal(inv->n_gpus, counts[k]);
                for (size_t i = 0; i < inv->n_gpus; i++) {
                        assert_int_equal(inv->gpus[i].index, i);
                        assert_string_equal(inv->gpus[i].name, "GH100 [H100 SXM5 80GB]");
                        if (i > 0)
                                assert_true(strcmp(inv->gpus[i - 1].address, inv->gpus[i].address) < 0);
                        numa1 += inv->gpus[i].numa_node == 1;
                }
                assert_int_equal(numa1, counts[k] / 2);
        }
}

static void test_missing_pci_ids(void **state) {
        _cleanup_free_ char *sys = node_sys("dgx-h100"), *error = NULL;
        _cleanup_(inventory_freep) Inventory *inv = NULL;

        assert_int_equal(probe_pci(sys, "/nonexistent/pci.ids", &inv, &error), 0);
        assert_null(error);
        assert_int_equal(strv_length(inv->warnings), 1);
        assert_string_equal(inv->warnings[0], "pci.ids not found at /nonexistent/pci.ids: GPU names unknown; "
                                              "install pciutils or set paths.pci-ids");
        /* Everything else is still known. */
        assert_int_equal(inv->n_gpus, 8);
        assert_int_equal(inv->n_nvswitches, 4);
        assert_int_equal(inv->n_nics, 8);
        for (size_t i = 0; i < inv->n_gpus; i++) {
                assert_null(inv->gpus[i].name);
                assert_int_equal(inv->gpus[i].device_id, 0x2330);
                assert_string_equal(inv->gpus[i].driver, "nvidia");
        }
        assert_null(inv->nics[0].name);
}

static void test_malformed_pci_ids(void **state) {
        _cleanup_free_ char *sys = node_sys("h200"), *error = NULL, *dir = copy_node("h200"), *ids = NULL;
        _cleanup_(inventory_freep) Inventory *inv = NULL;

        ids = strprintf("%s/pci.ids", dir);
        static const char bad[] = "10de  NVIDIA Corporation\nthis is not pci.ids\n";
        assert_int_equal(write_file_atomic(ids, NULL, bad, strlen(bad), 0644), 0);

        assert_int_equal(probe_pci(sys, ids, &inv, &error), 0);
        assert_int_equal(inv->n_gpus, 1);
        assert_null(inv->gpus[0].name);
        assert_int_equal(strv_length(inv->warnings), 1);
        assert_warnings_are_lines(inv);
        assert_true(startswith(inv->warnings[0], "Cannot use pci.ids at "));
        assert_non_null(strstr(inv->warnings[0], "line 2"));
        assert_non_null(strstr(inv->warnings[0], ids));
        assert_non_null(strstr(inv->warnings[0], "GPU names unknown; reinstall pciutils or set paths.pci-ids."));
        rm_rf(dir);
}

static void test_nonexistent_sysfs(void **state) {
        _cleanup_free_ char *error = NULL;
        Inventory *inv = NULL;

        assert_int_equal(probe_pci("/nonexistent/sys", pci_ids(), &inv, &error), -ENOENT);
        assert_null(inv);
        assert_string_equal(error, "cannot read /nonexistent/sys/bus/pci/devices: No such file or directory; "
                                   "point paths.sys (or --root) at a mounted sysfs");
}

static void test_stray_entry(void **state) {
        _cleanup_free_ char *dir = copy_node("h200"), *p = NULL, *sys = NULL, *error = NULL;
        Inventory *inv = NULL;

        p = strprintf("%s/sys/bus/pci/devices/README", dir);
        assert_int_equal(write_file_atomic(p, NULL, "x", 1, 0644), 0);
        sys = strprintf("%s/sys", dir);

        assert_int_equal(probe_pci(sys, pci_ids(), &inv, &error), -EINVAL);
        assert_null(inv);
        assert_non_null(strstr(error, "unexpected entry \"README\" (not a PCI address)"));
        assert_true(startswith(error, "cannot read "));
        rm_rf(dir);
}

static void test_unreadable_attributes(void **state) {
        _cleanup_free_ char *dir = copy_node("dgx-h100"), *sys = NULL, *error = NULL, *link = NULL;
        _cleanup_(inventory_freep) Inventory *inv = NULL;

        make_unreadable(dir, "0000:1b:00.0", "numa_node");
        make_unreadable(dir, "0000:43:00.0", "current_link_speed");
        make_unreadable(dir, "0000:52:00.0", "current_link_width");
        make_unreadable(dir, "0000:61:00.0", "vendor");
        link = strprintf("%s/sys/bus/pci/devices/0000:9d:00.0/iommu_group", dir);
        assert_int_equal(unlink(link), 0);
        assert_int_equal(symlink("../../../kernel/iommu_groups/999", link), 0);
        sys = strprintf("%s/sys", dir);

        assert_int_equal(probe_pci(sys, pci_ids(), &inv, &error), 0);

        /* One GPU could not even be identified: skipped, with a warning; the probe goes on. */
        assert_int_equal(inv->n_gpus, 7);
        assert_true(has_warning(inv, "0000:61:00.0/vendor", "device skipped"));
        assert_string_equal(inv->gpus[3].address, "0000:9d:00.0");
        assert_int_equal(inv->gpus[3].index, 3);

        assert_true(has_warning(inv, "0000:1b:00.0/numa_node: Is a directory", NULL));
        assert_int_equal(inv->gpus[0].numa_node, -1);
        assert_string_equal(inv->gpus[0].link_speed, "32.0 GT/s PCIe");

        assert_true(has_warning(inv, "0000:43:00.0/current_link_speed: Is a directory; link speed of 0000:43:00.0 unknown.",
                                NULL));
        assert_null(inv->gpus[1].link_speed);
        assert_int_equal(inv->gpus[1].link_width, 16);

        assert_true(has_warning(inv, "link width of 0000:52:00.0 unknown.", "current_link_width"));
        assert_string_equal(inv->gpus[2].link_speed, "32.0 GT/s PCIe");
        assert_int_equal(inv->gpus[2].link_width, 0);

        assert_true(has_warning(inv, "0000:9d:00.0/iommu_group: the link points nowhere; IOMMU group of 0000:9d:00.0 unknown.",
                                NULL));
        assert_int_equal(inv->gpus[3].iommu_group, -1);

        assert_int_equal(strv_length(inv->warnings), 5);
        /* Devices nobody touched are complete. */
        assert_int_equal(inv->n_nvswitches, 4);
        assert_int_equal(inv->n_nics, 8);
        assert_string_equal(inv->gpus[6].name, "GH100 [H100 SXM5 80GB]");
        rm_rf(dir);
}

static void test_dangling_driver_link(void **state) {
        _cleanup_free_ char *dir = copy_node("unbound"), *sys = NULL, *error = NULL, *link = NULL;
        _cleanup_(inventory_freep) Inventory *inv = NULL;

        link = strprintf("%s/sys/bus/pci/devices/0000:1b:00.0/driver", dir);
        assert_int_equal(symlink("../../../bus/pci/drivers/nvidia", link), 0);
        sys = strprintf("%s/sys", dir);

        assert_int_equal(probe_pci(sys, pci_ids(), &inv, &error), 0);
        assert_int_equal(inv->n_gpus, 1);
        assert_null(inv->gpus[0].driver);
        assert_true(has_warning(inv, "0000:1b:00.0/driver: the link points nowhere; bound driver of 0000:1b:00.0 unknown.",
                                NULL));
        rm_rf(dir);
}

static void test_inventory_equal(void **state) {
        _cleanup_(inventory_freep) Inventory *a = probe_clean("dgx-h100"), *b = probe_clean("dgx-h100"),
                                             *c = probe_clean("a100-pcie"), *d = probe_clean("vfio");
        _cleanup_(inventory_freep) Inventory *e = NULL;
        _cleanup_free_ char *sys = node_sys("dgx-h100"), *error = NULL;

        assert_true(inventory_equal(a, b));
        assert_true(inventory_equal(a, a));
        assert_true(inventory_equal(NULL, NULL));
        assert_false(inventory_equal(a, NULL));
        assert_false(inventory_equal(NULL, a));
        assert_false(inventory_equal(a, c));

        /* Same devices, different warnings (pci.ids missing): names differ, so not equal. */
        assert_int_equal(probe_pci(sys, "/nonexistent/pci.ids", &e, &error), 0);
        assert_false(inventory_equal(a, e));

        /* One attribute changed. */
        b->gpus[5].numa_node = 0;
        assert_false(inventory_equal(a, b));
        b->gpus[5].numa_node = 1;
        assert_true(inventory_equal(a, b));
        free(b->nics[7].driver);
        b->nics[7].driver = NULL;
        assert_false(inventory_equal(a, b));

        /* Warnings alone do not make a difference. */
        assert_int_equal(strv_extend(&c->warnings, "something odd"), 0);
        _cleanup_(inventory_freep) Inventory *c2 = probe_clean("a100-pcie");
        assert_true(inventory_equal(c, c2));

        /* A rebind (vfio-pci -> nvidia) is a change. */
        free(d->gpus[0].driver);
        d->gpus[0].driver = strdup("nvidia");
        _cleanup_(inventory_freep) Inventory *d2 = probe_clean("vfio");
        assert_false(inventory_equal(d, d2));
}

static void test_kind_to_string(void **state) {
        assert_string_equal(probe_pci_kind_to_string(PCI_KIND_GPU), "gpu");
        assert_string_equal(probe_pci_kind_to_string(PCI_KIND_NVSWITCH), "nvswitch");
        assert_string_equal(probe_pci_kind_to_string(PCI_KIND_NIC), "nic");
        assert_null(probe_pci_kind_to_string(_PCI_KIND_MAX));
        assert_null(probe_pci_kind_to_string(_PCI_KIND_INVALID));
}

/* A vGPU guest's GPU carries NVIDIA's vendor-specific capability ("VF") with the host driver record;
 * the passed-through one next to it does not. */
static void test_vgpu_guest(void **state) {
        _cleanup_(inventory_freep) Inventory *inv = probe_clean("vgpu-guest"), *h100 = probe_clean("dgx-h100");

        assert_int_equal(inv->n_gpus, 2);
        assert_true(inv->gpus[0].vgpu);
        assert_string_equal(inv->gpus[0].vgpu_host_driver_version, "550.127.05");
        assert_string_equal(inv->gpus[0].vgpu_host_driver_branch, "r550_00");
        assert_false(inv->gpus[1].vgpu);
        assert_null(inv->gpus[1].vgpu_host_driver_version);
        for (size_t i = 0; i < h100->n_gpus; i++)
                assert_false(h100->gpus[i].vgpu);

        /* The same capability cut to its signature: a vGPU whose host driver is unknown, said once. */
        _cleanup_free_ char *dir = copy_node("vgpu-guest"), *sys = strprintf("%s/sys", dir), *error = NULL;
        _cleanup_free_ char *config = strprintf("%s/sys/bus/pci/devices/0000:02:00.0/config", dir);
        _cleanup_(inventory_freep) Inventory *cut = NULL;
        int fd = open(config, O_WRONLY | O_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(pwrite(fd, "\x05", 1, 0xb2), 1);
        close(fd);
        assert_int_equal(probe_pci(sys, pci_ids(), &cut, &error), 0);
        assert_true(cut->gpus[0].vgpu);
        assert_null(cut->gpus[0].vgpu_host_driver_version);
        assert_int_equal(strv_length(cut->warnings), 1);
        assert_string_equal(cut->warnings[0], "0000:02:00.0 is a vGPU, but its vendor-specific PCI capability has "
                                              "no host driver record: vGPU host driver version unknown.");
        rm_rf(dir);
}

/* The record walk of GFD's reader, with the inputs it would loop on or read past. */
static void test_vgpu_capability_parse(void **state) {
        bool vgpu;
        char *version, *branch;
        /* id, next, len, 'V', 'F', record 7 (4 bytes), record 0: version, branch */
        uint8_t cap[32] = { 0x09, 0x00, 31, 'V', 'F', 7, 4, 0xaa, 0xbb, 0, 22, '5', '3', '5', '.', '1', '6', '1',
                            '.', '0', '8', 'r', '5', '3', '5', '_', '0', '0', 0, 0, 0, 0 };

        assert_int_equal(probe_parse_vgpu_capability(cap, 31, &vgpu, &version, &branch), 0);
        assert_true(vgpu);
        assert_string_equal(version, "535.161.08");
        assert_string_equal(branch, "r535_00");
        free(version);
        free(branch);

        /* Another vendor's capability: not a vGPU. */
        cap[3] = 'X';
        assert_int_equal(probe_parse_vgpu_capability(cap, 31, &vgpu, &version, &branch), 0);
        assert_false(vgpu);
        cap[3] = 'V';

        /* The host record cut short by the capability's length. */
        assert_int_equal(probe_parse_vgpu_capability(cap, 30, &vgpu, &version, &branch), -EBADMSG);
        assert_true(vgpu);
        assert_null(version);

        /* A record of length 0 would never advance. */
        cap[6] = 0;
        assert_int_equal(probe_parse_vgpu_capability(cap, 31, &vgpu, &version, &branch), -EBADMSG);
        /* A record length that jumps past the end. */
        cap[6] = 200;
        assert_int_equal(probe_parse_vgpu_capability(cap, 31, &vgpu, &version, &branch), -EBADMSG);
        /* Shorter than the signature. */
        assert_int_equal(probe_parse_vgpu_capability(cap, 4, &vgpu, &version, &branch), 0);
        assert_false(vgpu);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_dgx_h100),
                cmocka_unit_test(test_a100_pcie),
                cmocka_unit_test(test_h200),
                cmocka_unit_test(test_l40s),
                cmocka_unit_test(test_vfio),
                cmocka_unit_test(test_mixed_sorted),
                cmocka_unit_test(test_sriov_vfs_skipped),
                cmocka_unit_test(test_no_gpu),
                cmocka_unit_test(test_unbound),
                cmocka_unit_test(test_synthetic),
                cmocka_unit_test(test_missing_pci_ids),
                cmocka_unit_test(test_malformed_pci_ids),
                cmocka_unit_test(test_nonexistent_sysfs),
                cmocka_unit_test(test_stray_entry),
                cmocka_unit_test(test_unreadable_attributes),
                cmocka_unit_test(test_dangling_driver_link),
                cmocka_unit_test(test_inventory_equal),
                cmocka_unit_test(test_kind_to_string),
                cmocka_unit_test(test_vgpu_guest),
                cmocka_unit_test(test_vgpu_capability_parse),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
