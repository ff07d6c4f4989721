/* SPDX-License-Identifier: MIT */
/* Owns PCI device names: looked up only for the devices the probe keeps, in the cheapest source there
 * is. With paths.pci-ids unset that is udev's hwdb (sd-hwdb: one mmap'd, indexed file, a few page
 * reads per look-up), then the distribution's pci.ids; with paths.pci-ids set, that file alone. A
 * pci.ids is never parsed whole (libpci hashes all 1.4 MB of it): one sequential read collects the
 * device lines of the vendors asked for and stops after the last of them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <systemd/sd-hwdb.h>

#include "fileio.h"
#include "pci-names.h"
#include "strv.h"

/* Where distributions install pci.ids: Debian/Ubuntu (pciutils), then Fedora/RHEL (hwdata). */
static const char *const system_pci_ids[] = { "/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids" };

typedef struct PciIdsEntry {
        uint16_t vendor, device;
        char *name;
} PciIdsEntry;

struct PciNames {
        char *pci_ids;            /* configured file, NULL: the system's sources */
        const uint16_t *vendors;  /* the vendors a pci.ids read collects */
        size_t n_vendors;
        bool hwdb_tried;
        sd_hwdb *hwdb;
        bool ids_loaded;          /* pci.ids read (or found unusable) */
        char *ids_path;           /* the pci.ids file used, NULL none */
        PciIdsEntry *entries;
        size_t n_entries;
        char *warning;
};

int pci_names_new(const char *pci_ids, const uint16_t *vendors, size_t n_vendors, PciNames **ret) {
        PciNames *n = calloc(1, sizeof(PciNames));

        if (!n)
                return -ENOMEM;
        if (!isempty(pci_ids)) {
                n->pci_ids = strdup(pci_ids);
                if (!n->pci_ids) {
                        free(n);
                        return -ENOMEM;
                }
        }
        n->vendors = vendors;
        n->n_vendors = n_vendors;
        *ret = n;
        return 0;
}

PciNames *pci_names_free(PciNames *n) {
        if (!n)
                return NULL;
        for (size_t i = 0; i < n->n_entries; i++)
                free(n->entries[i].name);
        free(n->entries);
        sd_hwdb_unref(n->hwdb);
        free(n->pci_ids);
        free(n->ids_path);
        free(n->warning);
        free(n);
        return NULL;
}

const char *pci_names_warning(const PciNames *n) {
        return n ? n->warning : NULL;
}

const char *pci_names_source(const PciNames *n) {
        if (!n)
                return NULL;
        if (n->hwdb)
                return "hwdb";
        return n->ids_path;
}

static int set_warning(PciNames *n, const char *fmt, ...) _printf_(2, 3);
static int set_warning(PciNames *n, const char *fmt, ...) {
        va_list ap;
        char *s;

        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        if (!s)
                return -ENOMEM;
        free(n->warning);
        n->warning = s;
        return 0;
}

static bool wanted_vendor(const PciNames *n, unsigned v) {
        for (size_t i = 0; i < n->n_vendors; i++)
                if (n->vendors[i] == v)
                        return true;
        return false;
}

static int parse_hex4(const char *s, unsigned *ret) {
        unsigned v = 0;

        for (int i = 0; i < 4; i++) {
                char c = s[i];
                int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
                        c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
                if (d < 0)
                        return -EINVAL;
                v = v << 4 | (unsigned) d;
        }
        *ret = v;
        return 0;
}

/* "hhhh  name": the id, then at least one blank, then a non-empty name. */
static int parse_id_line(const char *s, unsigned *ret_id, const char **ret_name) {
        if (parse_hex4(s, ret_id) < 0 || (s[4] != ' ' && s[4] != '\t'))
                return -EINVAL;
        s += 4;
        s += strspn(s, " \t");
        if (!*s)
                return -EINVAL;
        *ret_name = s;
        return 0;
}

static int add_entry(PciNames *n, unsigned vendor, unsigned device, const char *name) {
        PciIdsEntry *l = reallocarray(n->entries, n->n_entries + 1, sizeof(PciIdsEntry));
        if (!l)
                return -ENOMEM;
        n->entries = l;
        l[n->n_entries] = (PciIdsEntry) { (uint16_t) vendor, (uint16_t) device, strdup(name) };
        if (!l[n->n_entries].name)
                return -ENOMEM;
        n->n_entries++;
        return 0;
}

/* Reads path up to the end of the last wanted vendor's block (vendor blocks are in id order; the
 * class list "C xx" follows them all). A syntax error in the part read makes the file unusable. */
static int pci_ids_read(PciNames *n, const char *path) {
        _cleanup_fclose_ FILE *f = NULL;
        _cleanup_free_ char *line = NULL;
        size_t size = 0, seen = 0;
        unsigned lineno = 0, vendor = 0x10000;
        bool in_wanted = false;
        ssize_t l;
        int r;

        f = fopen(path, "re");
        if (!f)
                return negative_errno();
        while (seen < n->n_vendors && (l = getline(&line, &size, f)) >= 0) {
                unsigned id;
                const char *name;

                lineno++;
                while (l > 0 && (line[l - 1] == '\n' || line[l - 1] == '\r'))
                        line[--l] = 0;
                if (l == 0 || line[0] == '#')
                        continue;
                if (line[0] == 'C' && line[1] == ' ')
                        break;
                if (line[0] != '\t') {
                        if (parse_id_line(line, &id, &name) < 0)
                                goto syntax;
                        if (in_wanted)
                                seen++;
                        vendor = id;
                        in_wanted = wanted_vendor(n, id);
                        continue;
                }
                if (vendor > 0xffff)
                        goto syntax;
                if (line[1] == '\t')
                        continue; /* a subsystem line: not used */
                if (parse_id_line(line + 1, &id, &name) < 0)
                        goto syntax;
                if (in_wanted) {
                        r = add_entry(n, vendor, id, name);
                        if (r < 0)
                                return r;
                }
        }
        if (ferror(f))
                return -EIO;
        return 0;

syntax:
        /* A file that is not what it claims to be names nothing, not even what came before the error. */
        for (size_t i = 0; i < n->n_entries; i++)
                free(n->entries[i].name);
        n->entries = mfree(n->entries);
        n->n_entries = 0;
        return set_warning(n, "Cannot use pci.ids at %s: syntax error at line %u: GPU names unknown; "
                           "reinstall pciutils or set paths.pci-ids.", path, lineno) < 0 ? -ENOMEM : -EBADMSG;
}

static int pci_ids_load(PciNames *n) {
        struct stat st;
        int r;

        if (n->ids_loaded)
                return 0;
        n->ids_loaded = true;

        if (n->pci_ids) {
                const char *p = n->pci_ids;
                if (stat(p, &st) < 0 && errno == ENOENT)
                        return set_warning(n, "pci.ids not found at %s: GPU names unknown; install pciutils or "
                                           "set paths.pci-ids", p);
                if (access(p, R_OK) < 0)
                        return set_warning(n, "Cannot read pci.ids at %s: %m: GPU names unknown; install pciutils "
                                           "or set paths.pci-ids", p);
                if (!S_ISREG(st.st_mode))
                        return set_warning(n, "pci.ids at %s is not a regular file: GPU names unknown; install "
                                           "pciutils or set paths.pci-ids", p);
                r = pci_ids_read(n, p);
                if (r == -EBADMSG)
                        return 0;
                if (r < 0 && r != -ENOMEM)
                        return set_warning(n, "Cannot read pci.ids at %s: %s: GPU names unknown; install pciutils "
                                           "or set paths.pci-ids", p, strerror(-r));
                if (r >= 0)
                        n->ids_path = strdup(p);
                return r;
        }

        for (size_t i = 0; i < ELEMENTSOF(system_pci_ids); i++) {
                const char *p = system_pci_ids[i];
                if (stat(p, &st) < 0 || !S_ISREG(st.st_mode))
                        continue;
                r = pci_ids_read(n, p);
                if (r == -ENOMEM)
                        return r;
                if (r >= 0) {
                        n->ids_path = strdup(p);
                        return n->ids_path ? 0 : -ENOMEM;
                }
                if (r != -EBADMSG)
                        return set_warning(n, "Cannot read pci.ids at %s: %s: GPU names unknown; install pciutils "
                                           "or set paths.pci-ids", p, strerror(-r));
                return 0;
        }
        return set_warning(n, "Neither udev's hwdb nor pci.ids (%s, %s) found: GPU names unknown; install "
                           "pciutils or set paths.pci-ids", system_pci_ids[0], system_pci_ids[1]);
}

static int hwdb_lookup(PciNames *n, uint16_t vendor, uint16_t device, char **ret) {
        char modalias[32];
        const char *v = NULL;

        if (!n->hwdb_tried) {
                n->hwdb_tried = true;
                /* The hwdb of the host the agent runs on: udev names its devices from the same file. */
                if (sd_hwdb_new(&n->hwdb) < 0)
                        n->hwdb = NULL;
        }
        if (!n->hwdb)
                return 0;
        snprintf(modalias, sizeof(modalias), "pci:v%08Xd%08X", vendor, device);
        if (sd_hwdb_get(n->hwdb, modalias, "ID_MODEL_FROM_DATABASE", &v) < 0 || isempty(v))
                return 0;
        *ret = strdup(v);
        return *ret ? 1 : -ENOMEM;
}

int pci_names_open_hwdb(PciNames *n, const char *hwdb_path) {
        sd_hwdb_unref(n->hwdb);
        n->hwdb = NULL;
        n->hwdb_tried = true;
        return sd_hwdb_new_from_path(hwdb_path, &n->hwdb);
}

int pci_names_lookup(PciNames *n, uint16_t vendor, uint16_t device, char **ret) {
        int r;

        *ret = NULL;
        if (!n->pci_ids) {
                r = hwdb_lookup(n, vendor, device, ret);
                if (r != 0)
                        return r < 0 ? r : 0;
        }
        r = pci_ids_load(n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n->n_entries; i++)
                if (n->entries[i].vendor == vendor && n->entries[i].device == device) {
                        *ret = strdup(n->entries[i].name);
                        return *ret ? 0 : -ENOMEM;
                }
        return 0;
}
