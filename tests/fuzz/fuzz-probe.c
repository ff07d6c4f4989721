/* SPDX-License-Identifier: MIT */
/* Fuzzes the PCI probe (libpci on a sysfs tree) on a tree generated from the input, written in the
 * fixture node format (the .node files in tests/fixtures/nodes) so the fixtures are the seeds:
 *   gpu|nvswitch|nic|dev BDF VVVV:DDDD [sub=VVVV:DDDD] [class=0xCCCCCC] [numa=N] [iommu=N] [driver=NAME]
 *                                     [link=SPEED,WIDTH] [ATTR=RAW]...
 * An address that is not a kernel PCI name, or one already used, is replaced or skipped (sysfs cannot
 * have them). Values are written to the sysfs attribute files as they stand (a numa of "-7x" or a class of
 * garbage included), any other NAME=RAW becomes an attribute file, and a config space is made from the
 * ids. Invariant: probe_pci() either fails with a message or returns an inventory whose devices are
 * all NVIDIA/Mellanox functions with unique addresses, each kind indexed 0..n-1. */
#include "fuzz-util.h"
#include "probe.h"

#ifndef FUZZ_PCI_IDS
#  error "meson passes the fixture pci.ids as FUZZ_PCI_IDS"
#endif

static bool safe_name(const char *s) {
        if (isempty(s) || strlen(s) > 64 || streq(s, ".") || streq(s, ".."))
                return false;
        for (; *s; s++)
                if (!(isalnum((unsigned char) *s) || strchr(":._-", *s)))
                        return false;
        return true;
}

/* What the kernel names a PCI function: DDDD:BB:dd.f with dd < 0x20 and f < 8. Anything else cannot
 * appear in sysfs (libpci would truncate it into another function's address), so it is not tried. */
static bool bdf_is_valid(const char *s) {
        unsigned dom, bus, dev, fn;
        char tail;
        return strlen(s) == 12 && s[4] == ':' && s[7] == ':' && s[10] == '.' &&
               sscanf(s, "%4x:%2x:%2x.%1u%c", &dom, &bus, &dev, &fn, &tail) == 4 && dev < 0x20 && fn < 8 &&
               strspn(s, "0123456789abcdef:.") == 12;
}

static void attr(const char *dir, const char *name, const char *value) {
        _cleanup_free_ char *p = path_join(dir, name), *v = strprintf("%s\n", value);
        if (p && v)
                fuzz_write(p, v, strlen(v));
}

static void device(const char *sys, unsigned n, char *line) {
        char *save = NULL, *kind = strtok_r(line, " \t", &save), *bdf = strtok_r(NULL, " \t", &save),
             *ids = strtok_r(NULL, " \t", &save);
        unsigned vendor = 0x10de, dev = 0x2330, sv = 0, sd = 0, cls = 0x030200;
        _cleanup_free_ char *name = NULL;

        if (!kind || !bdf)
                return;
        name = bdf_is_valid(bdf) ? strdup(bdf) : strprintf("0000:%02x:00.0", n & 0xff);
        if (!name)
                return;
        if (streq(kind, "nvswitch"))
                cls = 0x068000;
        else if (streq(kind, "nic"))
                vendor = 0x15b3, dev = 0x1021, cls = 0x020000;
        if (ids)
                (void) sscanf(ids, "%x:%x", &vendor, &dev);
        sv = vendor, sd = dev;

        _cleanup_free_ char *ddir = strprintf("%s/devices/pci0000:00/%s", sys, name),
                            *link = strprintf("%s/bus/pci/devices/%s", sys, name),
                            *target = strprintf("../../../devices/pci0000:00/%s", name);
        struct stat st;
        if (!ddir || !link || !target || lstat(link, &st) >= 0 || mkdir_p(ddir, 0755) < 0)
                return; /* one function per address, as in sysfs */
        (void) symlink(target, link);
        _cleanup_free_ char *v = strprintf("0x%04x", vendor & 0xffff), *d = strprintf("0x%04x", dev & 0xffff),
                            *c = strprintf("0x%06x", cls);
        if (!v || !d || !c)
                return;
        attr(ddir, "vendor", v);
        attr(ddir, "device", d);
        attr(ddir, "class", c);
        attr(ddir, "numa_node", "-1");

        for (char *tok; (tok = strtok_r(NULL, " \t", &save));) {
                char *eq = strchr(tok, '=');
                if (!eq)
                        continue;
                *eq = 0;
                const char *key = tok, *value = eq + 1;
                if (streq(key, "sub")) {
                        (void) sscanf(value, "%x:%x", &sv, &sd);
                        _cleanup_free_ char *a = strprintf("0x%04x", sv & 0xffff), *b = strprintf("0x%04x", sd & 0xffff);
                        if (a && b) {
                                attr(ddir, "subsystem_vendor", a);
                                attr(ddir, "subsystem_device", b);
                        }
                } else if (streq(key, "numa"))
                        attr(ddir, "numa_node", value);
                else if (streq(key, "class")) {
                        attr(ddir, "class", value);
                        cls = (unsigned) strtoul(value, NULL, 0);
                } else if (streq(key, "iommu") && safe_name(value)) {
                        _cleanup_free_ char *g = strprintf("%s/kernel/iommu_groups/%s", sys, value),
                                            *gl = strprintf("%s/iommu_group", ddir),
                                            *gt = strprintf("../../../kernel/iommu_groups/%s", value);
                        if (g && gl && gt && mkdir_p(g, 0755) >= 0)
                                (void) symlink(gt, gl);
                } else if (streq(key, "driver") && safe_name(value)) {
                        _cleanup_free_ char *dd = strprintf("%s/bus/pci/drivers/%s", sys, value),
                                            *dl = strprintf("%s/driver", ddir),
                                            *dt = strprintf("../../../bus/pci/drivers/%s", value);
                        if (dd && dl && dt && mkdir_p(dd, 0755) >= 0)
                                (void) symlink(dt, dl);
                } else if (streq(key, "link")) {
                        char *comma = strchr(value, ',');
                        if (comma)
                                *comma = 0;
                        _cleanup_free_ char *speed = strprintf("%s GT/s PCIe", value);
                        if (speed)
                                attr(ddir, "current_link_speed", speed);
                        if (comma)
                                attr(ddir, "current_link_width", comma + 1);
                } else if (safe_name(key) && !strchr(key, ':') && !streq(key, "driver") && !streq(key, "iommu_group") &&
                           !streq(key, "subsystem"))
                        attr(ddir, key, value);
        }

        uint8_t cfg[64] = {};
        cfg[0] = vendor & 0xff, cfg[1] = (vendor >> 8) & 0xff, cfg[2] = dev & 0xff, cfg[3] = (dev >> 8) & 0xff;
        cfg[9] = cls & 0xff, cfg[10] = (cls >> 8) & 0xff, cfg[11] = (cls >> 16) & 0xff;
        cfg[0x2c] = sv & 0xff, cfg[0x2d] = (sv >> 8) & 0xff, cfg[0x2e] = sd & 0xff, cfg[0x2f] = (sd >> 8) & 0xff;
        _cleanup_free_ char *cp = path_join(ddir, "config");
        if (cp)
                fuzz_write(cp, cfg, sizeof cfg);
}

static bool known_kind(const char *line) {
        return startswith(line, "gpu ") || startswith(line, "nvswitch ") || startswith(line, "nic ") ||
               startswith(line, "dev ");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        const char *root = fuzz_scratch();
        _cleanup_free_ char *text = NULL, *sys = NULL, *error = NULL;
        _cleanup_(inventory_freep) Inventory *inv = NULL;
        unsigned n = 0;

        if (size > 16 * 1024)
                return 0;
        text = strndup((const char *) data, size);
        sys = path_join(root, "sys");
        if (!text || !sys)
                return 0;
        fuzz_clean(root);
        _cleanup_free_ char *pci = path_join(sys, "bus/pci/devices"), *drv = path_join(sys, "bus/pci/drivers");
        if (!pci || !drv || mkdir_p(pci, 0755) < 0 || mkdir_p(drv, 0755) < 0)
                return 0;
        for (char *save = NULL, *line = strtok_r(text, "\n", &save); line && n < 64;
             line = strtok_r(NULL, "\n", &save))
                if (known_kind(line))
                        device(sys, n++, line);

        int r = probe_pci(sys, FUZZ_PCI_IDS, &inv, &error);
        if (r < 0) {
                if (inv || !error)
                        abort();
                return 0;
        }
        if (!inv)
                abort();
        const PciDevice *lists[] = { inv->gpus, inv->nvswitches, inv->nics };
        size_t counts[] = { inv->n_gpus, inv->n_nvswitches, inv->n_nics };
        for (size_t l = 0; l < 3; l++)
                for (size_t i = 0; i < counts[l]; i++) {
                        const PciDevice *d = &lists[l][i];
                        if (d->index != i || (d->vendor_id != 0x10de && d->vendor_id != 0x15b3))
                                abort();
                        for (size_t m = 0; m < 3; m++)
                                for (size_t k = 0; k < counts[m]; k++)
                                        if ((m != l || k != i) && streq(d->address, lists[m][k].address))
                                                abort();
                }
        return 0;
}
