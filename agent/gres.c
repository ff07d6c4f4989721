/* SPDX-License-Identifier: MIT */
/* Owns the Slurm gres.conf lines of the node (see gres.h): formatting them from the NVML snapshot,
 * sysfs and the driver's mig-minors table, and writing the file only when its bytes change.
 *
 * Formats, checked against slurmd 22.05 (Debian 12's slurmd: `slurmd -G` parses what we write):
 *  - a full GPU: "Name=gpu Type=… File=/dev/nvidiaN Cores=…" (gres.conf(5));
 *  - a MIG device: "MultipleFiles=" with the parent /dev/nvidiaN, then the GPU instance's and the compute
 *    instance's /dev/nvidia-caps/nvidia-cap<minor> (the minors of gpu<N>/gi<I>/access and
 *    gpu<N>/gi<I>/ci<C>/access in /proc/driver/nvidia-caps/mig-minors), as Slurm's AutoDetect=nvml
 *    writes them ("Type=nvidia_a100_80gb_pcie_1g.10gb MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/
 *    nvidia-cap66,/dev/nvidia-caps/nvidia-cap67" in a site's AutoDetect output); slurmd takes the
 *    device index from the last file, the compute instance's cap, which is unique per MIG device.
 *  - Cores= are Slurm core indexes: the first thread of each core among the GPU's local CPUs (the
 *    kernel's local_cpulist of the PCI device), which on Linux's usual enumeration (first threads
 *    0..cores-1, their siblings after) are the core indexes Slurm counts.
 *  - Links= on a full GPU whose NVLink state NVML reports, as Slurm's gpu/nvml plugin builds it
 *    (_nvml_get_nvlink_info): one entry per GPU of the snapshot in NVML's (PCI) order, -1 for the GPU
 *    itself, else how many of its active NVLinks end at that GPU; a link that ends at an NVSwitch (or at
 *    anything not a GPU of the node) counts for no GPU, so a DGX's GPUs read -1,0,0,…. Without NVLink
 *    state (PCIe GPU, older driver) there is no Links=, which Slurm reads as "no links" too. MIG device
 *    lines carry none: MIG devices have no NVLink (Slurm gives them placeholder links, for sorting only). */
#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fileio.h"
#include "gres.h"
#include "strv.h"

#define GRES_FILE_MAX (1U << 20)
#define GRES_MAX_CPUS 16384U

char *gres_type_name(const char *nvml_name) {
        char *t = strdup(nvml_name);

        if (!t)
                return NULL;
        /* Slurm's own AutoDetect=nvml spelling (blanks to '_', lower case), and '_' also for every byte
         * that means something to slurm.conf's parser or is no printable ASCII: '#' starts a comment, '='
         * and ',' split values, quotes group, a backslash continues the line, a newline ends it. */
        for (char *p = t; *p; p++) {
                unsigned char c = (unsigned char) *p;
                *p = c <= ' ' || c >= 0x7f || strchr("#=,\"'\\", c) ? '_' : (char) tolower(c);
        }
        return t;
}

/* Parses "0-3,8,10-11" into a bitmap of GRES_MAX_CPUS. */
static int cpulist_parse(const char *s, bool *set) {
        const char *p = s;

        while (*p && !isspace((unsigned char) *p)) {
                char *end;
                unsigned long a, b;

                if (!isdigit((unsigned char) *p))
                        return -EINVAL;
                a = strtoul(p, &end, 10);
                b = a;
                if (*end == '-') {
                        if (!isdigit((unsigned char) end[1]))
                                return -EINVAL;
                        b = strtoul(end + 1, &end, 10);
                }
                if (a > b || b >= GRES_MAX_CPUS)
                        return -EINVAL;
                for (unsigned long i = a; i <= b; i++)
                        set[i] = true;
                p = end;
                if (*p == ',')
                        p++;
                else if (*p && !isspace((unsigned char) *p))
                        return -EINVAL;
        }
        return 0;
}

static char *cpulist_format(const bool *set) {
        _cleanup_strv_free_ char **parts = NULL;

        for (unsigned i = 0; i < GRES_MAX_CPUS; i++) {
                unsigned j = i;
                if (!set[i])
                        continue;
                while (j + 1 < GRES_MAX_CPUS && set[j + 1])
                        j++;
                int r = j == i ? strv_extendf(&parts, "%u", i) : strv_extendf(&parts, "%u-%u", i, j);
                if (r < 0)
                        return NULL;
                i = j;
        }
        return parts ? strv_join(parts, ",") : strdup("");
}

/* The first CPU of <sys>/devices/system/cpu/cpu<N>/topology/thread_siblings_list, or -1 when unknown. */
static long first_sibling(const char *sys, unsigned cpu) {
        _cleanup_free_ char *p = strprintf("%s/devices/system/cpu/cpu%u/topology/thread_siblings_list", sys, cpu),
                            *line = NULL;

        if (!p || read_one_line_file(p, &line) < 0 || !isdigit((unsigned char) line[0]))
                return -1;
        return strtol(line, NULL, 10);
}

int gres_cores_from_cpulist(const char *sys, const char *cpulist, char **ret) {
        _cleanup_free_ bool *set = calloc(GRES_MAX_CPUS, sizeof(bool));
        int r;

        if (!set)
                return -ENOMEM;
        r = cpulist_parse(cpulist, set);
        if (r < 0)
                return r;
        for (unsigned i = 0; i < GRES_MAX_CPUS; i++) {
                if (!set[i])
                        continue;
                long first = first_sibling(sys, i);
                if (first >= 0 && (unsigned long) first != i)
                        set[i] = false; /* a hyperthread sibling: its core is counted by its first thread */
        }
        char *t = cpulist_format(set);
        if (!t)
                return -ENOMEM;
        *ret = t;
        return 0;
}

typedef struct CapMinor {
        unsigned gpu, gi, ci, minor;  /* ci = UINT32_MAX for the GPU instance's own access */
} CapMinor;

#define GI_ACCESS UINT32_MAX

/* <proc>/driver/nvidia-caps/mig-minors: "gpu<G>/gi<I>/access <m>" and "gpu<G>/gi<I>/ci<C>/access <m>".
 * Read here rather than through agent/cdi's cache, which is private to the CDI builder. */
static int mig_minors_read(const char *proc, CapMinor **ret, size_t *ret_n) {
        _cleanup_free_ char *p = path_join(proc, "driver/nvidia-caps/mig-minors"), *text = NULL;
        _cleanup_free_ CapMinor *list = NULL;
        size_t n = 0, allocated = 0;
        char *save = NULL;
        int r;

        if (!p)
                return -ENOMEM;
        r = read_full_file(p, 16U << 20, &text, NULL);
        if (r < 0)
                return r;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                CapMinor c;
                if (sscanf(line, "gpu%u/gi%u/ci%u/access %u", &c.gpu, &c.gi, &c.ci, &c.minor) != 4) {
                        if (sscanf(line, "gpu%u/gi%u/access %u", &c.gpu, &c.gi, &c.minor) != 3)
                                continue;
                        c.ci = GI_ACCESS;
                }
                if (n == allocated) {
                        size_t a = allocated ? allocated * 2 : 256;
                        CapMinor *t = reallocarray(list, a, sizeof(CapMinor));
                        if (!t)
                                return -ENOMEM;
                        list = t;
                        allocated = a;
                }
                list[n++] = c;
        }
        *ret = TAKE_PTR(list);
        *ret_n = n;
        return 0;
}

static const CapMinor *mig_minor_find(const CapMinor *l, size_t n, unsigned gpu, unsigned gi, unsigned ci) {
        for (size_t i = 0; i < n; i++)
                if (l[i].gpu == gpu && l[i].gi == gi && l[i].ci == ci)
                        return &l[i];
        return NULL;
}

/* " Cores=…" for the GPU, or "" when sysfs does not say which CPUs are local to it. */
static char *gpu_cores(const GresInput *in, const GpuInfo *g, char ***warnings) {
        _cleanup_free_ char *p = strprintf("%s/bus/pci/devices/%s/local_cpulist", in->sys, g->pci_address),
                            *line = NULL, *cores = NULL;
        int r;

        if (!p)
                return NULL;
        r = read_one_line_file(p, &line);
        if (r >= 0)
                r = gres_cores_from_cpulist(in->sys, line, &cores);
        if (r == -ENOMEM)
                return NULL;
        if (r < 0 || isempty(cores)) {
                if (strv_extendf(warnings, "GPU %s: no usable local_cpulist in sysfs (%s): its gres.conf line has no Cores=",
                                 g->pci_address, r < 0 ? strerror(-r) : "empty") < 0)
                        return NULL;
                return strdup("");
        }
        return strprintf(" Cores=%s", cores);
}

/* " Links=-1,0,12…" for snapshot GPU i, or "" when NVML did not report its NVLink state. */
static char *gpu_links(const NvmlSnapshot *s, size_t i) {
        const GpuInfo *g = &s->gpus[i];
        _cleanup_strv_free_ char **counts = NULL;

        if (!g->nvlink_known)
                return strdup("");
        for (size_t j = 0; j < s->n_gpus; j++) {
                unsigned n = 0;

                if (j == i) {
                        if (strv_extend(&counts, "-1") < 0)
                                return NULL;
                        continue;
                }
                STRV_FOREACH(remote, g->nvlink_remotes)
                        if (streq(*remote, s->gpus[j].pci_address))
                                n++;
                if (strv_extendf(&counts, "%u", n) < 0)
                        return NULL;
        }
        _cleanup_free_ char *list = strv_join(counts, ",");
        return list ? strprintf(" Links=%s", list) : NULL;
}

int gres_format(const GresInput *in, char **ret_text, char ***ret_warnings) {
        _cleanup_strv_free_ char **lines = NULL, **warnings = NULL;
        _cleanup_free_ CapMinor *minors = NULL;
        size_t n_minors = 0, n_devices = 0;
        int minors_r = 1; /* not read yet */
        int r;

        if (strv_extend(&lines, "# Slurm GRES of this node, written by gpu-node-agent from NVML; do not edit.") < 0 ||
            strv_extend(&lines, "# Include it from gres.conf (\"Include <this file>\"); see gpu-node-agent.yaml(5), gres.slurm.") < 0)
                return -ENOMEM;

        for (size_t i = 0; in->snapshot && i < in->snapshot->n_gpus; i++) {
                const GpuInfo *g = &in->snapshot->gpus[i];
                _cleanup_free_ char *type = NULL, *cores = NULL;

                if (g->minor < 0 || !g->name) {
                        if (strv_extendf(&warnings, "GPU %s: NVML did not report its %s: not in gres.conf",
                                         g->pci_address, g->minor < 0 ? "device minor" : "name") < 0)
                                return -ENOMEM;
                        continue;
                }
                type = gres_type_name(g->name);
                if (!type)
                        return -ENOMEM;

                cores = gpu_cores(in, g, &warnings);
                if (!cores)
                        return -ENOMEM;
                if (g->mig_current != GPU_MIG_ENABLED) {
                        _cleanup_free_ char *links = gpu_links(in->snapshot, i);
                        if (!links)
                                return -ENOMEM;
                        if (strv_extendf(&lines, "Name=gpu Type=%s File=%s/nvidia%d%s%s", type, in->dev, g->minor,
                                         cores, links) < 0)
                                return -ENOMEM;
                        n_devices++;
                        continue;
                }

                if (g->n_mig_devices > 0 && minors_r > 0) {
                        minors_r = mig_minors_read(in->proc, &minors, &n_minors);
                        if (minors_r == -ENOMEM)
                                return minors_r;
                }
                for (size_t j = 0; j < g->n_mig_devices; j++) {
                        const MigDeviceInfo *d = &g->mig_devices[j];
                        const CapMinor *gi = NULL, *ci = NULL;

                        if (minors_r >= 0) {
                                gi = mig_minor_find(minors, n_minors, (unsigned) g->minor, d->gi_id, GI_ACCESS);
                                ci = mig_minor_find(minors, n_minors, (unsigned) g->minor, d->gi_id, d->ci_id);
                        }
                        if (!d->profile || !gi || !ci) {
                                r = strv_extendf(&warnings,
                                                 "MIG device %s (GPU %s, GI %u, CI %u): %s: not in gres.conf",
                                                 strna(d->uuid), g->pci_address, d->gi_id, d->ci_id,
                                                 !d->profile    ? "NVML gave no profile"
                                                 : minors_r < 0 ? "cannot read driver/nvidia-caps/mig-minors"
                                                                : "its capability minors are not in mig-minors");
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        /* A MIG device is as close to the CPUs as its parent GPU. */
                        if (strv_extendf(&lines,
                                         "Name=gpu Type=%s_%s MultipleFiles=%s/nvidia%d,%s/nvidia-caps/nvidia-cap%u,%s/nvidia-caps/nvidia-cap%u%s",
                                         type, d->profile, in->dev, g->minor, in->dev, gi->minor, in->dev, ci->minor,
                                         cores) < 0)
                                return -ENOMEM;
                        n_devices++;
                }
        }

        if (ret_warnings)
                *ret_warnings = TAKE_PTR(warnings);
        if (strv_extend(&lines, "") < 0)
                return -ENOMEM;
        char *text = strv_join(lines, "\n");
        if (!text)
                return -ENOMEM;
        *ret_text = text;
        return n_devices > INT_MAX ? INT_MAX : (int) n_devices;
}

int gres_write(const char *path, const char *text, bool *ret_changed) {
        _cleanup_free_ char *old = NULL;
        int r;

        if (read_full_file(path, GRES_FILE_MAX, &old, NULL) >= 0 && streq(old, text)) {
                *ret_changed = false;
                return 0;
        }
        r = write_file_atomic_mkdir(path, text, strlen(text), 0644);
        if (r < 0)
                return r;
        *ret_changed = true;
        return 0;
}
