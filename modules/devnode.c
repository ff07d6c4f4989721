/* SPDX-License-Identifier: MIT */
/* Owns the NVIDIA device-node plan (read from a proc tree) and its application to a /dev tree,
 * including /dev/char links; see devnode.h. Numbers and permissions follow nvidia-modprobe
 * (NVIDIA/nvidia-modprobe, modprobe-utils/nvidia-modprobe-utils.c). */
#include <ctype.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "devnode.h"
#include "fileio.h"
#include "macro.h"
#include "string-table.h"
#include "strv.h"

#define PROC_FILE_MAX (4U * 1024U * 1024U)

static const char *const devnode_kind_table[_DEVNODE_KIND_MAX] = {
        [DEVNODE_CTL] = "ctl",
        [DEVNODE_GPU] = "gpu",
        [DEVNODE_MODESET] = "modeset",
        [DEVNODE_UVM] = "uvm",
        [DEVNODE_UVM_TOOLS] = "uvm-tools",
        [DEVNODE_CAP] = "cap",
        [DEVNODE_NVSWITCH] = "nvswitch",
        [DEVNODE_NVSWITCH_CTL] = "nvswitch-ctl",
        [DEVNODE_IMEX_CHANNEL] = "imex-channel",
};

DEFINE_STRING_TABLE_LOOKUP(devnode_kind, DevnodeKind, devnode_kind_table, _DEVNODE_KIND_MAX, _DEVNODE_KIND_INVALID)

static void set_error(char **ret_error, const char *fmt, ...) _printf_(2, 3);
static void set_error(char **ret_error, const char *fmt, ...) {
        va_list ap;
        char *s;

        if (!ret_error)
                return;
        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        free(*ret_error);
        *ret_error = s;
}

/* Proc files are "Key: value" lines (value after any spaces and tabs). Finds key's value as an
 * unsigned number: 0 found, -ENOENT absent, -EBADMSG present but not a number. */
static int find_key_uint(const char *text, const char *key, unsigned long *ret) {
        size_t kl = strlen(key);

        for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
                if (strncmp(l, key, kl) != 0 || l[kl] != ':')
                        continue;
                const char *v = l + kl + 1;
                while (*v == ' ' || *v == '\t')
                        v++;
                if (!isdigit((unsigned char) *v))
                        return -EBADMSG;
                char *end;
                errno = 0;
                unsigned long n = strtoul(v, &end, 10);
                if (errno != 0 || (*end && !isspace((unsigned char) *end)))
                        return -EBADMSG;
                *ret = n;
                return 0;
        }
        return -ENOENT;
}

static int read_proc_file(const char *dir, const char *rel, char **ret_path, char **ret_text) {
        _cleanup_free_ char *p = path_join(dir, rel);
        if (!p)
                return -ENOMEM;
        int r = read_full_file(p, PROC_FILE_MAX, ret_text, NULL);
        if (ret_path)
                *ret_path = TAKE_PTR(p);
        return r;
}

/* The major of a character device driver in /proc/devices; -ENOENT when not registered. */
static int proc_devices_major(const char *devices, const char *name, unsigned *ret) {
        bool chars = false;

        for (const char *l = devices; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
                if (startswith(l, "Character devices:")) {
                        chars = true;
                        continue;
                }
                if (startswith(l, "Block devices:"))
                        chars = false;
                if (!chars)
                        continue;
                char *end;
                errno = 0;
                unsigned long major = strtoul(l, &end, 10);
                if (errno != 0 || end == l || major > UINT_MAX)
                        continue;
                while (*end == ' ' || *end == '\t')
                        end++;
                size_t nl = strlen(name);
                if (strncmp(end, name, nl) == 0 && (end[nl] == '\n' || end[nl] == 0)) {
                        *ret = (unsigned) major;
                        return 0;
                }
        }
        return -ENOENT;
}

static bool proc_module_loaded(const char *proc_dir, const char *name) {
        _cleanup_free_ char *text = NULL;
        size_t nl = strlen(name);

        if (read_proc_file(proc_dir, "modules", NULL, &text) < 0)
                return false;
        for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL)
                if (strncmp(l, name, nl) == 0 && l[nl] == ' ')
                        return true;
        return false;
}

DevnodePlan *devnode_plan_free(DevnodePlan *p) {
        if (!p)
                return NULL;
        for (size_t i = 0; i < p->n_nodes; i++)
                free(p->nodes[i].name);
        free(p->nodes);
        strv_free(p->notes);
        return mfree(p);
}
DEFINE_CLEANUP_FUNC(DevnodePlan *, devnode_plan_free);

static int plan_add(DevnodePlan *p, DevnodeKind kind, char *name, unsigned major, unsigned minor, mode_t mode,
                    uid_t uid, gid_t gid) {
        _cleanup_free_ char *n = name; /* takes ownership */

        if (!n)
                return -ENOMEM;
        for (size_t i = 0; i < p->n_nodes; i++)
                if (streq(p->nodes[i].name, n))
                        return 0; /* two MIG devices in one GPU instance share its gi access node */
        DevnodeSpec *a = realloc(p->nodes, (p->n_nodes + 1) * sizeof(*a));
        if (!a)
                return -ENOMEM;
        p->nodes = a;
        p->nodes[p->n_nodes++] = (DevnodeSpec) {
                .kind = kind, .name = TAKE_PTR(n), .major = major, .minor = minor,
                .mode = mode, .uid = uid, .gid = gid,
        };
        return 0;
}

typedef struct Perms {
        mode_t mode;
        uid_t uid;
        gid_t gid;
        bool modify;
} Perms;

static int parse_perms(const char *path, const char *text, bool with_owner, Perms *perms, char **ret_error) {
        static const char *const keys[] = { "DeviceFileUID", "DeviceFileGID", "DeviceFileMode", "ModifyDeviceFiles",
                                            "DeviceFileModify" };
        for (size_t i = 0; i < ELEMENTSOF(keys); i++) {
                unsigned long v;
                int r = find_key_uint(text, keys[i], &v);
                if (r == -ENOENT)
                        continue;
                if (r < 0 || (i < 2 && v > UINT32_MAX - 1) || (i == 2 && v > 07777)) {
                        set_error(ret_error, "%s: \"%s\" is not a valid value; expected %s.", path, keys[i],
                                  i == 2 ? "a decimal file mode such as 438 (0666)" : "a decimal number");
                        return -EBADMSG;
                }
                if (i == 0 && with_owner)
                        perms->uid = (uid_t) v;
                else if (i == 1 && with_owner)
                        perms->gid = (gid_t) v;
                else if (i == 2)
                        perms->mode = (mode_t) v;
                else if (i >= 3 && with_owner)
                        perms->modify = v != 0;
        }
        return 0;
}

/* The permissions a proc file asks for, over the given defaults; an absent file keeps them. */
static int proc_perms(const char *proc_dir, const char *rel, bool with_owner, Perms *perms, char **ret_error) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        int r = read_proc_file(proc_dir, rel, &path, &text);
        if (r == -ENOENT)
                return 0;
        if (r < 0) {
                set_error(ret_error, "Cannot read %s: %s.", strna(path), strerror(-r));
                return r;
        }
        return parse_perms(path, text, with_owner, perms, ret_error);
}

static int plan_gpus(DevnodePlan *p, const char *proc_dir, const Perms *nv, char **ret_error) {
        _cleanup_free_ char *dir = path_join(proc_dir, "driver/nvidia/gpus");
        _cleanup_closedir_ DIR *d = NULL;
        struct dirent *de;

        if (!dir)
                return -ENOMEM;
        d = opendir(dir);
        if (!d) {
                int r = negative_errno();
                if (r == -ENOENT)
                        set_error(ret_error, "The nvidia kernel module is not loaded (%s does not exist); load it "
                                  "before creating device nodes.", dir);
                else
                        set_error(ret_error, "Cannot read %s: %s.", dir, strerror(-r));
                return r;
        }
        while ((errno = 0, de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                _cleanup_free_ char *full = strprintf("%s/%s/information", dir, de->d_name), *text = NULL;
                if (!full)
                        return -ENOMEM;
                int r = read_full_file(full, PROC_FILE_MAX, &text, NULL);
                if (r < 0) {
                        set_error(ret_error, "Cannot read %s: %s.", full, strerror(-r));
                        return r;
                }
                unsigned long minor;
                r = find_key_uint(text, "Device Minor", &minor);
                if (r < 0 || minor >= DEVNODE_MODESET_MINOR) {
                        set_error(ret_error, "%s has no valid \"Device Minor:\" line (a number below %u); cannot "
                                  "tell which /dev/nvidiaN belongs to GPU %s.", full, DEVNODE_MODESET_MINOR,
                                  de->d_name);
                        return -EBADMSG;
                }
                for (size_t i = 0; i < p->n_nodes; i++)
                        if (p->nodes[i].kind == DEVNODE_GPU && p->nodes[i].minor == minor) {
                                set_error(ret_error, "%s: Device Minor %lu is also used by another GPU; the "
                                          "driver's proc tree is inconsistent.", full, minor);
                                return -EBADMSG;
                        }
                r = plan_add(p, DEVNODE_GPU, strprintf("nvidia%lu", minor), DEVNODE_NVIDIA_MAJOR, (unsigned) minor,
                             nv->mode, nv->uid, nv->gid);
                if (r < 0)
                        return r;
        }
        if (errno != 0) {
                set_error(ret_error, "Cannot read %s: %s.", dir, strerror(errno));
                return -errno;
        }
        return 0;
}

/* One line of mig-minors: "config 1", "gpu0/gi2/ci0/access 23". */
static int mig_minor(const char *text, const char *name, unsigned *ret) {
        size_t nl = strlen(name);

        for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
                if (strncmp(l, name, nl) != 0 || (l[nl] != ' ' && l[nl] != '\t'))
                        continue;
                char *end;
                errno = 0;
                unsigned long m = strtoul(l + nl, &end, 10);
                if (errno != 0 || end == l + nl || m > UINT_MAX)
                        return -EBADMSG;
                *ret = (unsigned) m;
                return 0;
        }
        return -ENOENT;
}

static int plan_cap(DevnodePlan *p, const char *proc_dir, const char *minors_path, const char *minors,
                    unsigned major, const char *cap, const char *cap_file, mode_t default_mode, char **ret_error) {
        Perms perms = { .mode = default_mode, .uid = 0, .gid = 0, .modify = true };
        unsigned minor;
        int r;

        r = mig_minor(minors, cap, &minor);
        if (r == -ENOENT && !strchr(cap, '/')) {
                set_error(ret_error, "%s does not list \"%s\"; the driver's proc tree is incomplete.", minors_path,
                          cap);
                return -EBADMSG;
        }
        if (r == -ENOENT) {
                set_error(ret_error, "%s does not list \"%s\"; the MIG capability node for it cannot be created "
                          "(is the MIG device gone, or the driver older than the GPU?).", minors_path, cap);
                return -ENXIO;
        }
        if (r < 0) {
                set_error(ret_error, "%s: the line for \"%s\" has no valid minor number.", minors_path, cap);
                return r;
        }
        _cleanup_free_ char *rel = strprintf("driver/nvidia/capabilities/%s", cap_file);
        if (!rel)
                return -ENOMEM;
        r = proc_perms(proc_dir, rel, false, &perms, ret_error);
        if (r < 0)
                return r;
        return plan_add(p, DEVNODE_CAP, strprintf("nvidia-caps/nvidia-cap%u", minor), major, minor,
                        perms.mode, 0, 0);
}

static int plan_caps(DevnodePlan *p, const char *proc_dir, const char *devices, const DevnodeOptions *opts,
                     char **ret_error) {
        _cleanup_free_ char *path = NULL, *text = NULL;
        unsigned major;
        int r;

        if (proc_devices_major(devices, "nvidia-caps", &major) < 0) {
                if (opts->n_mig > 0) {
                        set_error(ret_error, "MIG devices were requested but \"nvidia-caps\" is not in %s/devices; "
                                  "this driver has no MIG capability devices.", proc_dir);
                        return -ENXIO;
                }
                return strv_extendf(&p->notes, "\"nvidia-caps\" is not in %s/devices: no /dev/nvidia-caps nodes.",
                                    proc_dir);
        }
        r = read_proc_file(proc_dir, "driver/nvidia-caps/mig-minors", &path, &text);
        if (r == -ENOENT && opts->n_mig == 0)
                return strv_extendf(&p->notes, "%s does not exist: no /dev/nvidia-caps nodes.", strna(path));
        if (r < 0) {
                set_error(ret_error, "Cannot read %s: %s; the MIG capability nodes cannot be created.", strna(path),
                          strerror(-r));
                return r;
        }

        /* The driver creates config 0400 (only root may reconfigure MIG) and monitor and the access
         * capabilities 0444; its capability files say so, these are the fallbacks. */
        r = plan_cap(p, proc_dir, path, text, major, "config", "mig/config", 0400, ret_error);
        if (r < 0)
                return r;
        r = plan_cap(p, proc_dir, path, text, major, "monitor", "mig/monitor", 0444, ret_error);
        if (r < 0)
                return r;

        for (size_t i = 0; i < opts->n_mig; i++) {
                const DevnodeMigDevice *m = &opts->mig[i];
                _cleanup_free_ char *gi = strprintf("gpu%u/gi%u/access", m->gpu_minor, m->gi),
                                    *gi_file = strprintf("gpu%u/mig/gi%u/access", m->gpu_minor, m->gi),
                                    *ci = strprintf("gpu%u/gi%u/ci%u/access", m->gpu_minor, m->gi, m->ci),
                                    *ci_file = strprintf("gpu%u/mig/gi%u/ci%u/access", m->gpu_minor, m->gi, m->ci);
                if (!gi || !gi_file || !ci || !ci_file)
                        return -ENOMEM;
                r = plan_cap(p, proc_dir, path, text, major, gi, gi_file, 0444, ret_error);
                if (r < 0)
                        return r;
                r = plan_cap(p, proc_dir, path, text, major, ci, ci_file, 0444, ret_error);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int plan_nvswitch(DevnodePlan *p, const char *proc_dir, const char *devices, char **ret_error) {
        Perms perms = { .mode = 0666, .uid = 0, .gid = 0, .modify = true };
        _cleanup_free_ char *dir = path_join(proc_dir, "driver/nvidia-nvswitch/devices");
        _cleanup_closedir_ DIR *d = NULL;
        unsigned major, n = 0;
        struct dirent *de;
        int r;

        if (!dir)
                return -ENOMEM;
        if (proc_devices_major(devices, "nvidia-nvswitch", &major) < 0)
                return 0; /* not an NVSwitch system (or the nvswitch driver is not in this build): nothing to say */
        r = proc_perms(proc_dir, "driver/nvidia-nvswitch/permissions", false, &perms, ret_error);
        if (r < 0)
                return r;
        /* The driver numbers switches 0..N-1 in probe order; its proc tree lists them by PCI
         * address only, so the count is what we can know, as for nvidia-modprobe -s. */
        d = opendir(dir);
        if (d)
                while ((de = readdir(d)))
                        if (de->d_name[0] != '.')
                                n++;
        if (n >= DEVNODE_NVSWITCH_CTL_MINOR) {
                set_error(ret_error, "%s lists %u NVSwitches, more than the driver can number.", dir, n);
                return -EBADMSG;
        }
        for (unsigned i = 0; i < n; i++) {
                r = plan_add(p, DEVNODE_NVSWITCH, strprintf("nvidia-nvswitch%u", i), major, i, perms.mode, 0, 0);
                if (r < 0)
                        return r;
        }
        return plan_add(p, DEVNODE_NVSWITCH_CTL, strdup("nvidia-nvswitchctl"), major, DEVNODE_NVSWITCH_CTL_MINOR,
                        perms.mode, 0, 0);
}

static int spec_cmp(const void *a, const void *b) {
        return strcmp(((const DevnodeSpec *) a)->name, ((const DevnodeSpec *) b)->name);
}

int devnode_plan(const char *proc_dir, const DevnodeOptions *opts, DevnodePlan **ret, char **ret_error) {
        static const DevnodeOptions no_options = {};
        _cleanup_(devnode_plan_freep) DevnodePlan *p = NULL;
        _cleanup_free_ char *devices = NULL, *devices_path = NULL;
        Perms nv = { .mode = 0666, .uid = 0, .gid = 0, .modify = true };
        unsigned major;
        int r;

        assert(proc_dir);
        assert(ret);
        if (!opts)
                opts = &no_options;

        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;

        r = proc_perms(proc_dir, "driver/nvidia/params", true, &nv, ret_error);
        if (r < 0)
                return r;
        p->modify = nv.modify;

        r = plan_add(p, DEVNODE_CTL, strdup("nvidiactl"), DEVNODE_NVIDIA_MAJOR, DEVNODE_CTL_MINOR, nv.mode, nv.uid,
                     nv.gid);
        if (r < 0)
                return r;
        r = plan_gpus(p, proc_dir, &nv, ret_error);
        if (r < 0)
                return r;
        if (opts->modeset || proc_module_loaded(proc_dir, "nvidia_modeset")) {
                r = plan_add(p, DEVNODE_MODESET, strdup("nvidia-modeset"), DEVNODE_NVIDIA_MAJOR, DEVNODE_MODESET_MINOR,
                             nv.mode, nv.uid, nv.gid);
                if (r < 0)
                        return r;
        }

        r = read_proc_file(proc_dir, "devices", &devices_path, &devices);
        if (r < 0) {
                set_error(ret_error, "Cannot read %s: %s; the device numbers of nvidia-uvm, nvidia-caps and "
                          "nvidia-nvswitch come from it.", strna(devices_path), strerror(-r));
                return r;
        }

        /* nvidia-modprobe gives the uvm nodes no proc file for permissions: always 0666 root:root. */
        if (proc_devices_major(devices, "nvidia-uvm", &major) >= 0) {
                r = plan_add(p, DEVNODE_UVM, strdup("nvidia-uvm"), major, 0, 0666, 0, 0);
                if (r >= 0)
                        r = plan_add(p, DEVNODE_UVM_TOOLS, strdup("nvidia-uvm-tools"), major, 1, 0666, 0, 0);
        } else
                r = strv_extendf(&p->notes, "nvidia-uvm is not loaded (no \"nvidia-uvm\" in %s): /dev/nvidia-uvm and "
                                 "/dev/nvidia-uvm-tools are not created.", devices_path);
        if (r < 0)
                return r;

        r = plan_caps(p, proc_dir, devices, opts, ret_error);
        if (r < 0)
                return r;
        r = plan_nvswitch(p, proc_dir, devices, ret_error);
        if (r < 0)
                return r;

        qsort(p->nodes, p->n_nodes, sizeof(*p->nodes), spec_cmp);
        *ret = TAKE_PTR(p);
        return 0;
}

const DevnodeSpec *devnode_plan_find(const DevnodePlan *p, const char *name) {
        for (size_t i = 0; p && i < p->n_nodes; i++)
                if (streq(p->nodes[i].name, name))
                        return &p->nodes[i];
        return NULL;
}

int devnode_plan_imex(const char *proc_dir, unsigned n_channels, DevnodePlan **ret, char **ret_error) {
        _cleanup_(devnode_plan_freep) DevnodePlan *p = NULL;
        _cleanup_free_ char *devices = NULL, *devices_path = NULL;
        unsigned major;
        int r;

        assert(proc_dir);
        assert(ret);

        r = read_proc_file(proc_dir, "devices", &devices_path, &devices);
        if (r < 0) {
                set_error(ret_error, "Cannot read %s: %s; the IMEX channels' device number comes from it.",
                          strna(devices_path), strerror(-r));
                return r;
        }
        r = proc_devices_major(devices, "nvidia-caps-imex-channels", &major);
        if (r < 0) {
                set_error(ret_error, "The driver registered no \"nvidia-caps-imex-channels\" device in %s: it has no "
                          "IMEX support (driver 550 or later is needed); IMEX channels cannot be created.",
                          devices_path);
                return r;
        }
        /* ModifyDeviceFiles: 0 hands all NVIDIA nodes to the admin, these too; the mode stays 0666. */
        Perms nv = { .mode = 0666, .modify = true };
        r = proc_perms(proc_dir, "driver/nvidia/params", true, &nv, ret_error);
        if (r < 0)
                return r;
        p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        p->modify = nv.modify;
        for (unsigned i = 0; i < n_channels; i++) {
                r = plan_add(p, DEVNODE_IMEX_CHANNEL, strprintf("nvidia-caps-imex-channels/channel%u", i), major, i,
                             0666, 0, 0);
                if (r < 0)
                        return r;
        }
        qsort(p->nodes, p->n_nodes, sizeof(*p->nodes), spec_cmp);
        *ret = TAKE_PTR(p);
        return 0;
}

/* ---- apply ---- */

static void set_node_error(char **ret_error, const char *what, const char *path, int r) {
        if (!ret_error || *ret_error)
                return; /* the first failure is the one reported */
        if (r == -EPERM)
                set_error(ret_error, "Cannot %s %s: %s. Creating device nodes needs CAP_MKNOD: run gpu-node-agent "
                          "as root, and do not drop CAP_MKNOD or set PrivateDevices= in its unit.", what, path,
                          strerror(-r));
        else if (r == -EROFS)
                set_error(ret_error, "Cannot %s %s: %s; /dev must be writable (is ProtectKernelTunables= or a "
                          "read-only bind mount hiding it?).", what, path, strerror(-r));
        else
                set_error(ret_error, "Cannot %s %s: %s.", what, path, strerror(-r));
}

/* Makes a fresh node (or symlink) under a temporary name beside base in dir_fd and renames it over
 * base, so there is never a moment without one. Everything is relative to dir_fd, which was opened
 * without following a symlink. */
static int make_and_rename(int dir_fd, const char *base, const DevnodeSpec *s, const char *link_target,
                           const char **ret_what) {
        for (unsigned attempt = 0;; attempt++) {
                _cleanup_free_ char *tmp = strprintf(".#%s.%d.%u", base, (int) getpid(), attempt);
                if (!tmp)
                        return -ENOMEM;
                int r = link_target ? symlinkat(link_target, dir_fd, tmp)
                                    : mknodat(dir_fd, tmp, S_IFCHR | s->mode, makedev(s->major, s->minor));
                if (r < 0 && errno == EEXIST && attempt < 100)
                        continue;
                if (r < 0) {
                        *ret_what = link_target ? "create the link" : "create the device node";
                        return negative_errno();
                }
                /* mknod's mode went through the umask, and chown would clear set-id bits: owner first, then mode. */
                if (!link_target && (fchownat(dir_fd, tmp, s->uid, s->gid, AT_SYMLINK_NOFOLLOW) < 0 ||
                                     fchmodat(dir_fd, tmp, s->mode, 0) < 0)) {
                        r = negative_errno();
                        (void) unlinkat(dir_fd, tmp, 0);
                        *ret_what = "set the owner and mode of";
                        return r;
                }
                if (renameat(dir_fd, tmp, dir_fd, base) < 0) {
                        r = negative_errno();
                        (void) unlinkat(dir_fd, tmp, 0);
                        *ret_what = "replace";
                        return r;
                }
                return 0;
        }
}

static bool node_is(const struct stat *st, const DevnodeSpec *s) {
        return S_ISCHR(st->st_mode) && st->st_rdev == makedev(s->major, s->minor);
}

/* Opens (creating it when asked) the subdirectory name of dev_fd for nodes or links, never through a
 * symlink: a planted /dev/char -> /somewhere must not get our links. */
static int open_dev_subdir(int dev_fd, const char *dev_dir, const char *name, bool create, char **ret_error) {
        _cleanup_free_ char *path = path_join(dev_dir, name);
        if (!path)
                return -ENOMEM;
        if (create && mkdirat(dev_fd, name, 0755) < 0 && errno != EEXIST) {
                int r = negative_errno();
                set_node_error(ret_error, "create the directory", path, r);
                return r;
        }
        int fd = open_dir_nofollow(dev_fd, name);
        if (fd == -ELOOP) {
                if (ret_error && !*ret_error)
                        set_error(ret_error, "Refusing to use %s: it is a symbolic link, not a directory; no "
                                  "device nodes or links are created through it. Remove it (udev creates a "
                                  "real directory).", path);
                return fd;
        }
        if (fd < 0 && !(fd == -ENOENT && !create))
                set_node_error(ret_error, "use the directory", path, fd);
        return fd;
}

static int apply_node(int dir_fd, const char *base, const DevnodeSpec *s, const char *path, bool modify,
                      DevnodeResult *res, char **ret_error) {
        const char *what = "create the device node";
        struct stat st;
        int r;

        if (fstatat(dir_fd, base, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                if (errno != ENOENT) {
                        r = negative_errno();
                        set_node_error(ret_error, "inspect", path, r);
                        return r;
                }
                if (!modify) {
                        res->skipped++;
                        return 0;
                }
                r = make_and_rename(dir_fd, base, s, NULL, &what);
                if (r < 0) {
                        set_node_error(ret_error, what, path, r);
                        return r;
                }
                res->created++;
                return 0;
        }

        if (node_is(&st, s)) {
                if ((st.st_mode & 07777) == s->mode && st.st_uid == s->uid && st.st_gid == s->gid) {
                        res->unchanged++;
                        return 0;
                }
                if (!modify) {
                        res->skipped++;
                        return 0;
                }
                if ((st.st_uid != s->uid || st.st_gid != s->gid) &&
                    fchownat(dir_fd, base, s->uid, s->gid, AT_SYMLINK_NOFOLLOW) < 0) {
                        r = negative_errno();
                        set_node_error(ret_error, "change the owner of", path, r);
                        return r;
                }
                if (fchmodat(dir_fd, base, s->mode, 0) < 0) {
                        r = negative_errno();
                        set_node_error(ret_error, "change the mode of", path, r);
                        return r;
                }
                res->fixed++;
                return 0;
        }

        if (!modify) {
                res->skipped++;
                return 0;
        }
        r = make_and_rename(dir_fd, base, s, NULL, &what);
        if (r < 0) {
                set_node_error(ret_error, what, path, r);
                return r;
        }
        res->replaced++;
        return 0;
}

static int apply_link(int char_fd, const DevnodeSpec *s, const char *dev_dir, DevnodeResult *res, char **ret_error) {
        _cleanup_free_ char *base = strprintf("%u:%u", s->major, s->minor),
                            *link = strprintf("%s/char/%u:%u", dev_dir, s->major, s->minor),
                            *target = strprintf("../%s", s->name), *cur = NULL;
        const char *what = "create the link";
        struct stat st;
        int r;

        if (!base || !link || !target)
                return -ENOMEM;
        if (fstatat(char_fd, base, &st, AT_SYMLINK_NOFOLLOW) >= 0 && S_ISLNK(st.st_mode)) {
                cur = calloc(1, (size_t) st.st_size + 2);
                if (!cur)
                        return -ENOMEM;
                ssize_t n = readlinkat(char_fd, base, cur, (size_t) st.st_size + 1);
                if (n >= 0 && streq(cur, target)) {
                        res->links_ok++;
                        return 0;
                }
        }
        r = make_and_rename(char_fd, base, s, target, &what);
        if (r < 0) {
                set_node_error(ret_error, what, link, r);
                return r;
        }
        res->links++;
        return 0;
}

/* The directory fd a node lives in (dev_fd itself or its one subdirectory, e.g. nvidia-caps) and its
 * last component. *sub_fd caches the subdirectory's fd across nodes, *sub_err its failure. */
static int node_dir(int dev_fd, const char *dev_dir, const DevnodeSpec *s, bool create, int *sub_fd, int *sub_err,
                    const char **ret_base, char **ret_error) {
        const char *slash = strrchr(s->name, '/');
        if (!slash) {
                *ret_base = s->name;
                return dev_fd;
        }
        *ret_base = slash + 1;
        if (*sub_err < 0)
                return *sub_err;
        if (*sub_fd < 0) {
                _cleanup_free_ char *sub = strndup(s->name, (size_t) (slash - s->name));
                if (!sub)
                        return -ENOMEM;
                int fd = open_dev_subdir(dev_fd, dev_dir, sub, create, ret_error);
                if (fd < 0)
                        return (*sub_err = fd);
                *sub_fd = fd;
        }
        return *sub_fd;
}

int devnode_apply(const DevnodePlan *plan, const char *dev_dir, DevnodeResult *ret_result, char **ret_error) {
        DevnodeResult res = {};
        int ret = 0, r;

        assert(plan);
        assert(dev_dir);

        /* /dev itself is configuration (paths.dev); below it nothing is followed. */
        _cleanup_close_ int dev_fd = open(dev_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dev_fd < 0) {
                r = negative_errno();
                set_node_error(ret_error, "open the directory", dev_dir, r);
                return r;
        }
        _cleanup_close_ int caps_fd = -1, char_fd = -1;
        int caps_err = 0;

        for (size_t i = 0; i < plan->n_nodes; i++) {
                const DevnodeSpec *s = &plan->nodes[i];
                const char *base;
                _cleanup_free_ char *path = path_join(dev_dir, s->name);
                if (!path)
                        return -ENOMEM;
                int dfd = node_dir(dev_fd, dev_dir, s, plan->modify, &caps_fd, &caps_err, &base, ret_error);
                if (dfd == -ENOMEM)
                        return dfd;
                if (dfd < 0) {
                        /* A missing nvidia-caps with ModifyDeviceFiles=0 only means the nodes are missing. */
                        if (dfd == -ENOENT && !plan->modify)
                                res.skipped++;
                        else if (ret == 0)
                                ret = dfd;
                        continue;
                }
                r = apply_node(dfd, base, s, path, plan->modify, &res, ret_error);
                if (r == -ENOMEM)
                        return r;
                if (r < 0 && ret == 0)
                        ret = r;
        }

        /* Links for every node that is there and right, ours or not (ModifyDeviceFiles=0 included, as
         * nvidia-modprobe does): runc and libnvidia-container resolve /dev/char/M:m. */
        for (size_t i = 0; i < plan->n_nodes; i++) {
                const DevnodeSpec *s = &plan->nodes[i];
                const char *base;
                struct stat st;
                int dfd = node_dir(dev_fd, dev_dir, s, false, &caps_fd, &caps_err, &base, NULL);
                if (dfd < 0 || fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0 || !node_is(&st, s))
                        continue;
                if (char_fd < 0) {
                        char_fd = open_dev_subdir(dev_fd, dev_dir, "char", true, ret_error);
                        if (char_fd < 0) {
                                if (char_fd == -ENOMEM)
                                        return char_fd;
                                if (ret == 0)
                                        ret = char_fd;
                                break;
                        }
                }
                r = apply_link(char_fd, s, dev_dir, &res, ret_error);
                if (r == -ENOMEM)
                        return r;
                if (r < 0 && ret == 0)
                        ret = r;
        }

        if (ret_result)
                *ret_result = res;
        return ret;
}

char *devnode_result_to_string(const DevnodePlan *plan, const DevnodeResult *r) {
        _cleanup_strv_free_ char **parts = NULL;
        _cleanup_free_ char *joined = NULL;
        unsigned total = r->created + r->replaced + r->fixed + r->unchanged + r->skipped;

        if (!plan->modify)
                return strprintf("ModifyDeviceFiles is 0 in /proc/driver/nvidia/params: no device nodes created or "
                                 "changed (%u of %zu planned nodes present and right); %u /dev/char links",
                                 r->unchanged, plan->n_nodes, r->links + r->links_ok);
        if (r->created > 0 && strv_extendf(&parts, "%u created", r->created) < 0)
                return NULL;
        if (r->replaced > 0 && strv_extendf(&parts, "%u replaced", r->replaced) < 0)
                return NULL;
        if (r->fixed > 0 && strv_extendf(&parts, "%u permissions fixed", r->fixed) < 0)
                return NULL;
        if (r->unchanged > 0 && strv_extendf(&parts, "%u unchanged", r->unchanged) < 0)
                return NULL;
        joined = strv_join(parts, ", ");
        if (!joined)
                return NULL;
        return strprintf("%u device nodes: %s; %u /dev/char links (%u new or corrected)", total,
                         isempty(joined) ? "none" : joined, r->links + r->links_ok, r->links);
}
