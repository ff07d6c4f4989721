/* SPDX-License-Identifier: MIT */
/* Owns the PCI inventory: scans a sysfs tree with libpci (sysfs method, our own error handlers) and
 * sorts the NVIDIA GPUs, NVSwitches and Mellanox NICs it finds into an Inventory in PCI address order.
 * Attributes libpci does not cover (link speed and width, SR-IOV physfn) are read straight from the
 * device directory. Names come from pci-names.c (hwdb or a partly read pci.ids), never from libpci,
 * whose name look-up parses the whole 1.4 MB pci.ids. */
#include <assert.h>
#include <limits.h>
#include <pci/pci.h>
#include <setjmp.h>
#include <stdarg.h>
#include <sys/stat.h>

#include "fileio.h"
#include "log.h"
#include "pci-names.h"
#include "probe.h"
#include "string-table.h"
#include "strv.h"

#define PCI_VENDOR_NVIDIA 0x10de
#define PCI_VENDOR_MELLANOX 0x15b3

/* The state of one probe_pci() call as libpci's callbacks see it. */
typedef struct ProbeContext {
        sigjmp_buf jump;      /* where a fatal libpci error returns to */
        bool armed;           /* a libpci call is running inside a jump target */
        char *error;          /* message of the last fatal libpci error */
        char **warnings;
        int oom;              /* -ENOMEM when a warning could not be recorded */
} ProbeContext;

/* libpci's callbacks get no user pointer and struct pci_access has no spare field, so the
 * probe in progress on this thread is found here. Set only for the duration of probe_pci(). */
static _Thread_local ProbeContext *probe_context;

static void probe_add_warning(ProbeContext *c, const char *fmt, ...) _printf_(2, 3);
static void probe_add_warning(ProbeContext *c, const char *fmt, ...) {
        va_list ap;
        char *s = NULL;

        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        if (!s || strv_consume(&c->warnings, s) < 0)
                c->oom = -ENOMEM;
}

/* libpci declares its error callback noreturn and its default calls exit(1). A daemon must not
 * die because one sysfs file is odd, so the message is kept and control goes back to the
 * wrapper that started the libpci call, which turns it into an error. */
_noreturn_ _printf_(1, 2) static void probe_libpci_error(char *msg, ...) {
        ProbeContext *c = probe_context;
        va_list ap;

        if (!c || !c->armed) {
                /* A libpci call outside our wrappers: a programming error here, not bad input. */
                va_start(ap, msg);
                (void) log_internalv(LOG_ERR, 0, msg, ap);
                va_end(ap);
                abort();
        }

        free(c->error);
        va_start(ap, msg);
        if (vasprintf(&c->error, msg, ap) < 0)
                c->error = NULL;
        va_end(ap);
        if (c->error)
                strstrip_trailing(c->error);   /* some libpci messages end in "\n" */
        c->armed = false;
        siglongjmp(c->jump, 1);
}

_printf_(1, 2) static void probe_libpci_warning(char *msg, ...) {
        ProbeContext *c = probe_context;
        _cleanup_free_ char *s = NULL;
        va_list ap;

        va_start(ap, msg);
        if (vasprintf(&s, msg, ap) < 0)
                s = NULL;
        va_end(ap);
        if (!s) {
                if (c)
                        c->oom = -ENOMEM;
                return;
        }
        if (c)
                probe_add_warning(c, "PCI: %s.", strstrip_trailing(s));
        else
                log_warning("libpci: %s", s);
}

_printf_(1, 2) static void probe_libpci_debug(char *msg, ...) {
        va_list ap;

        /* libpci writes debug output in fragments; each fragment becomes one debug line. */
        va_start(ap, msg);
        if (log_get_max_level() >= LOG_DEBUG)
                (void) log_internalv(LOG_DEBUG, 0, msg, ap);
        va_end(ap);
}

/* Each libpci call that may hit the error callback runs in one of these small wrappers: nothing
 * here is modified between sigsetjmp() and the jump, so no local needs to be volatile. */
static int libpci_scan(ProbeContext *c, struct pci_access *a) {
        if (sigsetjmp(c->jump, 0))
                return -EIO;
        c->armed = true;
        pci_init(a);
        pci_scan_bus(a);
        c->armed = false;
        return 0;
}

static int libpci_fill(ProbeContext *c, struct pci_dev *d, int flags) {
        if (sigsetjmp(c->jump, 0))
                return -EIO;
        c->armed = true;
        pci_fill_info(d, flags);
        c->armed = false;
        return 0;
}

/* The first vendor-specific capability (id 0x09) of the device, its bytes in buf (at most size), or 0
 * bytes when there is none. libpci reads the capability list from the config space file. */
static int libpci_vendor_cap(ProbeContext *c, struct pci_dev *d, uint8_t *buf, size_t size, size_t *ret_len) {
        struct pci_cap *cap;

        *ret_len = 0;
        if (sigsetjmp(c->jump, 0))
                return -EIO;
        c->armed = true;
        pci_fill_info(d, PCI_FILL_CAPS);
        cap = pci_find_cap(d, PCI_CAP_ID_VNDR, PCI_CAP_NORMAL);
        if (cap && cap->addr + 3 <= 256 && pci_read_block(d, cap->addr, buf, 3)) {
                size_t len = buf[2];
                if (len > size)
                        len = size;
                if (len > (size_t) (256 - cap->addr))
                        len = (size_t) (256 - cap->addr);
                if (len >= 3 && pci_read_block(d, cap->addr, buf, (int) len))
                        *ret_len = len;
        }
        c->armed = false;
        return 0;
}

static void format_address(const struct pci_dev *d, char *buf, size_t size) {
        snprintf(buf, size, "%04x:%02x:%02x.%u", (unsigned) d->domain, d->bus, d->dev, d->func);
}

static int compare_devices(const void *x, const void *y) {
        const struct pci_dev *a = *(struct pci_dev *const *) x, *b = *(struct pci_dev *const *) y;

        if (a->domain != b->domain)
                return a->domain < b->domain ? -1 : 1;
        if (a->bus != b->bus)
                return a->bus < b->bus ? -1 : 1;
        if (a->dev != b->dev)
                return a->dev < b->dev ? -1 : 1;
        if (a->func != b->func)
                return a->func < b->func ? -1 : 1;
        return 0;
}

static PciKind classify(const struct pci_dev *d) {
        unsigned cls = d->device_class;

        if (d->vendor_id == PCI_VENDOR_NVIDIA) {
                if (cls == 0x0300 || cls == 0x0302)
                        return PCI_KIND_GPU;
                if (cls == 0x0680)
                        return PCI_KIND_NVSWITCH;
        }
        /* Mellanox network controllers only; their PCIe switch ports (BlueField) are bridges. */
        if (d->vendor_id == PCI_VENDOR_MELLANOX && (cls >> 8) == 0x02)
                return PCI_KIND_NIC;
        return _PCI_KIND_INVALID;
}

/* Reads one attribute of the device: 0 with *ret set, 0 with *ret NULL when the kernel does not
 * provide it (absent file), or a warning and NULL when it exists but cannot be read. */
static int read_attribute(ProbeContext *c, const char *dev_dir, const char *address, const char *attr,
                          const char *what, char **ret) {
        _cleanup_free_ char *p = path_join(dev_dir, attr);
        int r;

        *ret = NULL;
        if (!p)
                return -ENOMEM;
        r = read_one_line_file(p, ret);
        if (r == -ENOMEM)
                return r;
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                probe_add_warning(c, "Cannot read %s: %s; %s of %s unknown.", p, strerror(-r), what, address);
        return 0;
}

/* libpci silently drops a driver or iommu_group link it cannot resolve; say so when the link is
 * there but leads nowhere, because that means a broken tree, not an unbound device. */
static void check_dangling_link(ProbeContext *c, const char *dev_dir, const char *address, const char *link,
                                const char *what) {
        _cleanup_free_ char *p = path_join(dev_dir, link);
        struct stat st;

        if (!p) {
                c->oom = -ENOMEM;
                return;
        }
        if (lstat(p, &st) < 0) {
                if (errno != ENOENT)
                        probe_add_warning(c, "Cannot read %s: %m; %s of %s unknown.", p, what, address);
                return;
        }
        probe_add_warning(c, "Cannot resolve %s: the link points nowhere; %s of %s unknown.", p, what, address);
}

static int parse_uint(const char *s, unsigned *ret) {
        char *end;
        unsigned long v;

        if (isempty(s) || *s == '-' || *s == '+')
                return -EINVAL;
        errno = 0;
        v = strtoul(s, &end, 10);
        if (errno != 0 || *end != 0 || v > UINT_MAX)
                return -EINVAL;
        *ret = (unsigned) v;
        return 0;
}

static void pci_device_done(PciDevice *d) {
        free(d->vgpu_host_driver_version);
        free(d->vgpu_host_driver_branch);
        free(d->name);
        free(d->driver);
        free(d->link_speed);
        *d = (PciDevice) {};
}

typedef struct ProbeState {
        ProbeContext *context;
        const char *devices_dir;
        PciNames *names;
} ProbeState;

static int probe_device(ProbeState *s, struct pci_dev *d, PciDevice *ret, bool *ret_found) {
        _cleanup_(pci_device_done) PciDevice dev = {};
        ProbeContext *c = s->context;
        char address[32];
        _cleanup_free_ char *dev_dir = NULL, *physfn = NULL, *speed = NULL, *width = NULL;
        struct stat st;
        PciKind kind;
        int r;

        *ret_found = false;
        format_address(d, address, sizeof(address));

        r = libpci_fill(c, d, PCI_FILL_IDENT | PCI_FILL_CLASS | PCI_FILL_CLASS_EXT);
        if (r < 0) {
                probe_add_warning(c, "Cannot identify PCI device %s: %s; device skipped.", address,
                                  strna(c->error));
                return 0;
        }

        kind = classify(d);
        if (kind < 0)
                return 0;

        dev_dir = path_join(s->devices_dir, address);
        physfn = dev_dir ? path_join(dev_dir, "physfn") : NULL;
        if (!physfn)
                return -ENOMEM;
        /* SR-IOV virtual functions share the physical device; the PF alone is counted. */
        if (lstat(physfn, &st) >= 0)
                return 0;
        if (errno != ENOENT)
                probe_add_warning(c, "Cannot read %s: %m; treating %s as a physical function.", physfn, address);

        r = libpci_fill(c, d, PCI_FILL_SUBSYS | PCI_FILL_NUMA_NODE | PCI_FILL_IOMMU_GROUP | PCI_FILL_DRIVER);
        if (r < 0) {
                probe_add_warning(c, "Cannot read the attributes of PCI device %s: %s; device skipped.", address,
                                  strna(c->error));
                return 0;
        }

        dev = (PciDevice) {
                .kind = kind,
                .vendor_id = d->vendor_id,
                .device_id = d->device_id,
                .subsystem_vendor_id = d->subsys_vendor_id,
                .subsystem_device_id = d->subsys_id,
                .class_code = ((uint32_t) d->device_class << 8) | d->prog_if,
                .numa_node = d->numa_node >= 0 ? d->numa_node : -1,
                .iommu_group = -1,
        };
        snprintf(dev.address, sizeof(dev.address), "%s", address);

        const char *group = pci_get_string_property(d, PCI_FILL_IOMMU_GROUP);
        unsigned g;
        if (group && parse_uint(group, &g) >= 0 && g <= INT_MAX)
                dev.iommu_group = (int) g;
        else if (group)
                probe_add_warning(c, "Unexpected IOMMU group \"%s\" for %s; IOMMU group unknown.", group, address);
        else
                check_dangling_link(c, dev_dir, address, "iommu_group", "IOMMU group");

        const char *driver = pci_get_string_property(d, PCI_FILL_DRIVER);
        if (driver) {
                dev.driver = strdup(driver);
                if (!dev.driver)
                        return -ENOMEM;
        } else
                check_dangling_link(c, dev_dir, address, "driver", "bound driver");

        r = read_attribute(c, dev_dir, address, "current_link_speed", "link speed", &speed);
        if (r < 0)
                return r;
        /* The kernel writes "Unknown" when the link is down or the speed is not one it knows. */
        if (speed && !isempty(speed) && !streq(speed, "Unknown"))
                dev.link_speed = TAKE_PTR(speed);

        r = read_attribute(c, dev_dir, address, "current_link_width", "link width", &width);
        if (r < 0)
                return r;
        if (width && parse_uint(width, &dev.link_width) < 0) {
                probe_add_warning(c, "Unexpected link width \"%s\" in %s/current_link_width; link width of %s unknown.",
                                  width, dev_dir, address);
                dev.link_width = 0;
        }

        if (kind == PCI_KIND_GPU) {
                uint8_t cap[256];
                size_t len;
                r = libpci_vendor_cap(c, d, cap, sizeof(cap), &len);
                if (r < 0)
                        probe_add_warning(c, "Cannot read the capabilities of %s: %s; not known whether it is a vGPU.",
                                          address, strna(c->error));
                else {
                        r = probe_parse_vgpu_capability(cap, len, &dev.vgpu, &dev.vgpu_host_driver_version,
                                                        &dev.vgpu_host_driver_branch);
                        if (r == -ENOMEM)
                                return r;
                        if (r < 0)
                                probe_add_warning(c, "%s is a vGPU, but its vendor-specific PCI capability has no "
                                                  "host driver record: vGPU host driver version unknown.", address);
                }
        }

        r = pci_names_lookup(s->names, dev.vendor_id, dev.device_id, &dev.name);
        if (r < 0)
                return r;

        *ret = dev;
        dev = (PciDevice) {};
        *ret_found = true;
        return 0;
}

static int inventory_append(Inventory *inv, PciDevice *dev) {
        PciDevice **list = NULL;
        size_t *n = NULL;

        switch (dev->kind) {
        case PCI_KIND_GPU:
                list = &inv->gpus, n = &inv->n_gpus;
                break;
        case PCI_KIND_NVSWITCH:
                list = &inv->nvswitches, n = &inv->n_nvswitches;
                break;
        case PCI_KIND_NIC:
                list = &inv->nics, n = &inv->n_nics;
                break;
        case _PCI_KIND_MAX:
        case _PCI_KIND_INVALID:
                break;
        }
        if (!list || !n)
                return -EINVAL;

        PciDevice *l = reallocarray(*list, *n + 1, sizeof(PciDevice));
        if (!l)
                return -ENOMEM;
        *list = l;
        dev->index = (unsigned) *n;
        l[(*n)++] = *dev;
        return 0;
}

/* Checks the tree before libpci sees it: libpci treats a missing directory or a stray entry as
 * fatal, and the jump out of its scan would leak the directory handle. */
static int check_devices_dir(const char *devices_dir, char **ret_error) {
        _cleanup_closedir_ DIR *dir = opendir(devices_dir);
        struct dirent *de;

        if (!dir) {
                int r = negative_errno();
                *ret_error = strprintf("cannot read %s: %s; point paths.sys (or --root) at a mounted sysfs",
                                       devices_dir, strerror(-r));
                return r;
        }
        errno = 0;
        while ((de = readdir(dir))) {
                unsigned dom, bus, dev, fn;
                char extra;

                if (de->d_name[0] == '.')
                        continue;
                if (sscanf(de->d_name, "%x:%x:%x.%u%c", &dom, &bus, &dev, &fn, &extra) != 4 || dom > 0x7fffffff) {
                        *ret_error = strprintf("cannot read %s: unexpected entry \"%s\" (not a PCI address); "
                                               "point paths.sys (or --root) at a real sysfs",
                                               devices_dir, de->d_name);
                        return -EINVAL;
                }
        }
        if (errno != 0) {
                int r = negative_errno();
                *ret_error = strprintf("cannot read %s: %s", devices_dir, strerror(-r));
                return r;
        }
        return 0;
}

static void pci_cleanupp(struct pci_access **a) {
        if (*a)
                pci_cleanup(*a);
}

static void probe_context_done(ProbeContext *c) {
        probe_context = NULL;
        free(c->error);
        strv_free(c->warnings);
}

int probe_pci(const char *sys_dir, const char *pci_ids, Inventory **ret, char **ret_error) {
        _cleanup_(probe_context_done) ProbeContext c = {};
        _cleanup_(pci_cleanupp) struct pci_access *a = NULL;
        _cleanup_(pci_names_freep) PciNames *names = NULL;
        _cleanup_(inventory_freep) Inventory *inv = NULL;
        _cleanup_free_ char *bus_pci = NULL, *devices_dir = NULL;
        _cleanup_free_ struct pci_dev **devs = NULL;
        size_t n_devs = 0;
        int r;

        assert(sys_dir);
        assert(ret);
        assert(ret_error);

        *ret_error = NULL;
        bus_pci = path_join(sys_dir, "bus/pci");
        devices_dir = bus_pci ? path_join(bus_pci, "devices") : NULL;
        inv = calloc(1, sizeof(Inventory));
        if (!devices_dir || !inv)
                return -ENOMEM;

        r = check_devices_dir(devices_dir, ret_error);
        if (r < 0)
                return r;

        probe_context = &c;

        static const uint16_t name_vendors[] = { PCI_VENDOR_NVIDIA, PCI_VENDOR_MELLANOX };
        r = pci_names_new(pci_ids, name_vendors, ELEMENTSOF(name_vendors), &names);
        if (r < 0)
                return r;

        a = pci_alloc();
        if (!a)
                return -ENOMEM;
        a->error = probe_libpci_error;
        a->warning = probe_libpci_warning;
        a->debug = probe_libpci_debug;
        a->debugging = log_get_max_level() >= LOG_DEBUG;
        a->method = PCI_ACCESS_SYS_BUS_PCI;
        /* libpci names nothing here: no DNS look-ups, no ~/.pciids-cache, no hwdb of its own. */
        a->id_lookup_mode = 0;
        (void) pci_set_param(a, "hwdb.disable", (char *) "1");
        if (pci_set_param(a, "sysfs.path", bus_pci) < 0)
                return -EINVAL;

        r = libpci_scan(&c, a);
        if (r < 0) {
                *ret_error = strprintf("cannot scan PCI devices in %s: %s", bus_pci, strna(c.error));
                return r;
        }

        for (struct pci_dev *d = a->devices; d; d = d->next)
                n_devs++;
        devs = calloc(n_devs ?: 1, sizeof(struct pci_dev *));
        if (!devs)
                return -ENOMEM;
        n_devs = 0;
        for (struct pci_dev *d = a->devices; d; d = d->next)
                devs[n_devs++] = d;
        /* libpci links each new device at the head of its list: restore address order. */
        qsort(devs, n_devs, sizeof(struct pci_dev *), compare_devices);

        ProbeState s = {
                .context = &c,
                .devices_dir = devices_dir,
                .names = names,
        };
        for (size_t i = 0; i < n_devs; i++) {
                PciDevice dev;
                bool found;

                r = probe_device(&s, devs[i], &dev, &found);
                if (r < 0)
                        return r;
                if (!found)
                        continue;
                r = inventory_append(inv, &dev);
                if (r < 0) {
                        pci_device_done(&dev);
                        return r;
                }
        }
        if (pci_names_warning(names))
                probe_add_warning(&c, "%s", pci_names_warning(names));
        if (c.oom < 0)
                return c.oom;

        inv->warnings = TAKE_PTR(c.warnings);
        *ret = TAKE_PTR(inv);
        return 0;
}

static void pci_device_list_free(PciDevice *l, size_t n) {
        for (size_t i = 0; i < n; i++)
                pci_device_done(&l[i]);
        free(l);
}

Inventory *inventory_free(Inventory *inv) {
        if (!inv)
                return NULL;
        pci_device_list_free(inv->gpus, inv->n_gpus);
        pci_device_list_free(inv->nvswitches, inv->n_nvswitches);
        pci_device_list_free(inv->nics, inv->n_nics);
        strv_free(inv->warnings);
        free(inv);
        return NULL;
}

static bool pci_device_equal(const PciDevice *a, const PciDevice *b) {
        return a->kind == b->kind && a->vgpu == b->vgpu &&
               streq_ptr(a->vgpu_host_driver_version, b->vgpu_host_driver_version) &&
               streq_ptr(a->vgpu_host_driver_branch, b->vgpu_host_driver_branch) && a->index == b->index && streq(a->address, b->address) &&
               a->vendor_id == b->vendor_id && a->device_id == b->device_id &&
               a->subsystem_vendor_id == b->subsystem_vendor_id &&
               a->subsystem_device_id == b->subsystem_device_id && a->class_code == b->class_code &&
               streq_ptr(a->name, b->name) && a->numa_node == b->numa_node && a->iommu_group == b->iommu_group &&
               streq_ptr(a->driver, b->driver) && streq_ptr(a->link_speed, b->link_speed) &&
               a->link_width == b->link_width;
}

static bool pci_device_list_equal(const PciDevice *a, size_t n_a, const PciDevice *b, size_t n_b) {
        if (n_a != n_b)
                return false;
        for (size_t i = 0; i < n_a; i++)
                if (!pci_device_equal(&a[i], &b[i]))
                        return false;
        return true;
}

bool inventory_equal(const Inventory *a, const Inventory *b) {
        if (a == b)
                return true;
        if (!a || !b)
                return false;
        return pci_device_list_equal(a->gpus, a->n_gpus, b->gpus, b->n_gpus) &&
               pci_device_list_equal(a->nvswitches, a->n_nvswitches, b->nvswitches, b->n_nvswitches) &&
               pci_device_list_equal(a->nics, a->n_nics, b->nics, b->n_nics);
}

/* NVIDIA's vGPU record in the vendor-specific capability, as GPU Feature Discovery reads it: byte 0
 * the capability id, 1 the next pointer, 2 the length, 3-4 the signature "VF"; from byte 5 records of
 * [id][length][data], each length counting its own two bytes; record 0 carries the host driver's
 * version (10 bytes) and branch (10 bytes), NUL-padded. */
#define VGPU_RECORDS_START 5
#define VGPU_FIELD_LEN 10

static char *vgpu_field(const uint8_t *p) {
        size_t a = 0, b = VGPU_FIELD_LEN;

        while (a < b && p[a] == 0)
                a++;
        while (b > a && p[b - 1] == 0)
                b--;
        return strndup((const char *) p + a, b - a);
}

int probe_parse_vgpu_capability(const uint8_t *cap, size_t len, bool *ret_vgpu, char **ret_version,
                                char **ret_branch) {
        size_t pos = VGPU_RECORDS_START;

        *ret_vgpu = false;
        *ret_version = *ret_branch = NULL;
        if (len < VGPU_RECORDS_START || cap[3] != 'V' || cap[4] != 'F')
                return 0;
        *ret_vgpu = true;

        /* Skip records until the host driver record (id 0); a zero length would never advance. */
        while (pos + 1 < len && cap[pos] != 0) {
                if (cap[pos + 1] == 0)
                        return -EBADMSG;
                pos += cap[pos + 1];
        }
        if (pos + 2 + 2 * VGPU_FIELD_LEN > len || cap[pos] != 0)
                return -EBADMSG;
        _cleanup_free_ char *version = vgpu_field(cap + pos + 2), *branch = vgpu_field(cap + pos + 2 + VGPU_FIELD_LEN);
        if (!version || !branch)
                return -ENOMEM;
        *ret_version = TAKE_PTR(version);
        *ret_branch = TAKE_PTR(branch);
        return 0;
}

static const char *const pci_kind_table[_PCI_KIND_MAX] = {
        [PCI_KIND_GPU] = "gpu",
        [PCI_KIND_NVSWITCH] = "nvswitch",
        [PCI_KIND_NIC] = "nic",
};

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(probe_pci_kind, PciKind, pci_kind_table, _PCI_KIND_MAX)
