/* SPDX-License-Identifier: MIT */
/* Tests for agent/pci-names.c: names from a configured pci.ids read only as far as the wanted vendors'
 * blocks, its errors, and names from a hwdb.bin compiled from a fixture (systemd-hwdb) in place of the
 * system's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "fileio.h"
#include "pci-names.h"
#include "strv.h"

static const uint16_t vendors[] = { 0x10de, 0x15b3 };

static char *tmpdir(void) {
        char *d = strdup("/tmp/test-pci-names-XXXXXX");
        assert_non_null(d);
        assert_non_null(mkdtemp(d));
        return d;
}

static void rm_rf(const char *d) {
        _cleanup_free_ char *cmd = strprintf("rm -rf '%s'", d);
        assert_int_equal(system(cmd), 0);
}

static char *put(const char *dir, const char *name, const char *text) {
        char *p = path_join(dir, name);
        assert_non_null(p);
        assert_int_equal(write_file_atomic_mkdir(p, text, strlen(text), 0644), 0);
        return p;
}

static char *lookup(PciNames *n, uint16_t vendor, uint16_t device) {
        char *name = NULL;
        assert_int_equal(pci_names_lookup(n, vendor, device, &name), 0);
        return name;
}

/* The fixture the tests use everywhere: names as libpci gave them. */
static void test_fixture_pci_ids(void **state) {
        const char *ids = getenv("GNA_FIXTURE_PCI_IDS");
        _cleanup_(pci_names_freep) PciNames *n = NULL;
        _cleanup_free_ char *a = NULL, *b = NULL, *c = NULL, *d = NULL;

        if (!ids)
                fail_msg("GNA_FIXTURE_PCI_IDS is not set; run through meson test");
        assert_int_equal(pci_names_new(ids, vendors, 2, &n), 0);
        assert_null(pci_names_source(n)); /* nothing read before the first look-up */
        assert_string_equal(a = lookup(n, 0x10de, 0x2335), "GH100 [H200 SXM 141GB]");
        assert_string_equal(b = lookup(n, 0x15b3, 0x1021), "MT2910 Family [ConnectX-7]");
        assert_null(c = lookup(n, 0x10de, 0xffff));
        assert_null(d = lookup(n, 0x8086, 0x1593)); /* not a vendor asked for */
        assert_string_equal(pci_names_source(n), ids);
        assert_null(pci_names_warning(n));
}

/* A configured pci.ids is read up to the end of the last wanted vendor only: garbage after that is
 * never seen (and costs nothing), garbage before it makes the file unusable, with the line. */
static void test_partial_read(void **state) {
        _cleanup_free_ char *dir = tmpdir(), *good = NULL, *bad = NULL, *x = NULL, *y = NULL, *z = NULL;
        _cleanup_(pci_names_freep) PciNames *n = NULL, *m = NULL;

        good = put(dir, "good.ids", "# comment\n\n1000  Broadcom\n\t0001  53c810\n"
                                    "10de  NVIDIA Corporation\n\t2330  GH100[H100 SXM5 80GB]\n\t\t10de 16c1  H100 SXM5 80GB\n"
                                    "15b3  Mellanox Technologies\n\t1021  MT2910 Family [ConnectX-7]\n"
                                    "8086  Intel\nthis line is not pci.ids\n");
        assert_int_equal(pci_names_new(good, vendors, 2, &n), 0);
        assert_string_equal(x = lookup(n, 0x10de, 0x2330), "GH100[H100 SXM5 80GB]");
        assert_null(pci_names_warning(n));

        bad = put(dir, "bad.ids", "10de  NVIDIA Corporation\n\t2330  GH100\nnot pci.ids\n15b3  Mellanox\n");
        assert_int_equal(pci_names_new(bad, vendors, 2, &m), 0);
        assert_null(y = lookup(m, 0x10de, 0x2330));
        assert_string_equal(pci_names_warning(m), z = strprintf("Cannot use pci.ids at %s: syntax error at line 3: "
                                                                "GPU names unknown; reinstall pciutils or set "
                                                                "paths.pci-ids.", bad));
        rm_rf(dir);
}

static void test_missing_and_odd_files(void **state) {
        _cleanup_free_ char *dir = tmpdir(), *msg = NULL, *x = NULL, *y = NULL;
        _cleanup_(pci_names_freep) PciNames *n = NULL, *m = NULL;

        assert_int_equal(pci_names_new("/nonexistent/pci.ids", vendors, 2, &n), 0);
        assert_null(x = lookup(n, 0x10de, 0x2330));
        assert_string_equal(pci_names_warning(n), "pci.ids not found at /nonexistent/pci.ids: GPU names unknown; "
                                                  "install pciutils or set paths.pci-ids");

        assert_int_equal(pci_names_new(dir, vendors, 2, &m), 0);
        assert_null(y = lookup(m, 0x10de, 0x2330));
        assert_string_equal(pci_names_warning(m), msg = strprintf("pci.ids at %s is not a regular file: GPU names "
                                                                  "unknown; install pciutils or set paths.pci-ids", dir));
        rm_rf(dir);
}

/* Unset paths.pci-ids: udev's hwdb first (here one compiled from a fixture, with a name pci.ids does
 * not have), and a device the hwdb does not know falls through to pci.ids. */
static void test_hwdb(void **state) {
        _cleanup_free_ char *dir = tmpdir(), *src = NULL, *cmd = NULL, *bin = NULL, *a = NULL, *b = NULL;
        _cleanup_(pci_names_freep) PciNames *n = NULL;

        if (access("/usr/bin/systemd-hwdb", X_OK) < 0) {
                rm_rf(dir);
                print_message("systemd-hwdb (Debian package udev) is not installed: hwdb look-ups not tested\n");
                skip();
        }
        src = put(dir, "etc/udev/hwdb.d/20-test.hwdb",
                  "pci:v000010DE*\n ID_VENDOR_FROM_DATABASE=NVIDIA Corporation\n\n"
                  "pci:v000010DEd0000FFF0*\n ID_MODEL_FROM_DATABASE=GX999 [Test Accelerator 1TB]\n\n"
                  "pci:v000010DEd0000FFF0sv000010DEsd00000001*\n ID_MODEL_FROM_DATABASE=Subsystem name, not used\n");
        cmd = strprintf("/usr/bin/systemd-hwdb --root='%s' update", dir);
        assert_int_equal(system(cmd), 0);
        bin = path_join(dir, "etc/udev/hwdb.bin");
        assert_int_equal(pci_names_new(NULL, vendors, 2, &n), 0);
        assert_int_equal(pci_names_open_hwdb(n, bin), 0);
        assert_string_equal(a = lookup(n, 0x10de, 0xfff0), "GX999 [Test Accelerator 1TB]");
        assert_string_equal(pci_names_source(n), "hwdb");
        /* Not in this hwdb and in no pci.ids either. */
        assert_null(b = lookup(n, 0x10de, 0xfff1));
        /* Not in this hwdb, but in the system's pci.ids (pciutils, a build dependency): found there. */
        if (access("/usr/share/misc/pci.ids", R_OK) >= 0) {
                _cleanup_free_ char *c = lookup(n, 0x10de, 0x20f1);
                assert_string_equal(c, "GA100 [A100 PCIe 40GB]");
        }
        rm_rf(dir);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_fixture_pci_ids),
                cmocka_unit_test(test_partial_read),
                cmocka_unit_test(test_missing_and_odd_files),
                cmocka_unit_test(test_hwdb),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
