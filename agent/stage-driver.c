/* SPDX-License-Identifier: MIT */
/* Owns the driver stage: makes the NVIDIA kernel modules live for the running kernel (modules/ does
 * the work, this file decides what to do and says it): the fast path when they are live and nothing
 * changed since the last good load, pre-checks and loads in order, a DKMS build when the module for
 * this kernel is missing, stale or of another version (asynchronous: the stage returns STAGE_RUNNING
 * and finishes from the build's completion), the nvidia-peermem rule, the Modules and DkmsState
 * D-Bus rows, and the driver.state record. */
#include <fcntl.h>
#include <inttypes.h>
#include <libkmod.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "driver-state.h"
#include "driver-unload.h"
#include "driver.h"
#include "metrics.h"
#include "fileio.h"
#include "driver-modules.h"
#include "driver-release.h"
#include "gpu-holders.h"
#include "log.h"
#include "module-child.h"
#include "spawn-child.h"
#include "strv.h"

/* EFI global variable GUID: SecureBoot-<guid> holds 4 attribute bytes, then 1 = enabled. */
#define SECURE_BOOT_EFIVAR "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


static inline const char *strempty(const char *s) {
        return s ?: "";
}

/* The driver stage's own state (Node.driver_stage, made by its first run, freed by stage_driver_done()):
 * the work in flight, and what the last failed DKMS build said. */
struct DriverStage {
        DkmsRun *dkms_run;               /* a DKMS build in flight, NULL otherwise */
        ModuleLoadJob *module_load;      /* module inserts in flight in a child process */
        ModuleChild *peermem_insert;     /* nvidia-peermem's insert in flight in a child */
        DriverRelease *reload_release;   /* a when-idle reload waiting for our NVML processes */
        ModuleChild *reload_removal;     /* a when-idle reload's removal of the old modules in a child */
        char *dkms_failed_fingerprint;   /* dkms_fingerprint() when the last build failed, NULL otherwise */
        char *dkms_failed_message;       /* … and what it said, for retries that do not run it again */
        int dkms_failed_error;
};

typedef struct CoreModule {
        DriverModule id;
        const char *name;
} CoreModule;

/* Load order: uvm and modeset need symbols of nvidia. peermem is handled on its own (optional). */
static const CoreModule core_modules[] = {
        { DRIVER_MODULE_NVIDIA, "nvidia" },
        { DRIVER_MODULE_UVM, "nvidia-uvm" },
        { DRIVER_MODULE_MODESET, "nvidia-modeset" },
};

/* The BMC interface is nice to have (nvidia-smi reports through it); its absence is no error. */
static const char *const ipmi_modules[] = { "ipmi_msghandler", "ipmi_devintf" };

static bool core_wanted(const Config *c, const CoreModule *cm) {
        return cm->id != DRIVER_MODULE_MODESET || c->driver.modeset;
}

static const char *module_parameters(const Config *c, DriverModule id) {
        return isempty(c->driver.parameters[id]) ? NULL : c->driver.parameters[id];
}

static DriverModule module_id(const char *name) {
        for (size_t i = 0; i < ELEMENTSOF(core_modules); i++)
                if (streq(core_modules[i].name, name))
                        return core_modules[i].id;
        return DRIVER_MODULE_PEERMEM;
}

/* ---- shared helpers (driver.h) ---------------------------------------------------------------- */

void driver_dkms_options(const Config *c, DkmsOptions *ret) {
        *ret = (DkmsOptions) {
                .program = c->driver.dkms_program,
                .root = c->paths.root,
                .modules_dir = c->paths.modules,
                .module = isempty(c->driver.dkms_module) ? NULL : c->driver.dkms_module,
                .timeout_usec = c->driver.dkms_timeout_usec,
        };
}

int driver_verify_built(const Config *c, const char *kver, char **ret_error) {
        _cleanup_(module_context_freep) ModuleContext *ctx = NULL;
        _cleanup_free_ char *modules_dir = path_join(c->paths.modules, kver), *etc = path_join(c->paths.etc, "modprobe.d"),
                            *run = path_join(c->paths.root, "run/modprobe.d"), *lib = path_join(c->paths.root, "lib/modprobe.d"),
                            *usrlib = path_join(c->paths.root, "usr/lib/modprobe.d");
        const char *want = c->driver.version;
        const char *slash = isempty(c->driver.dkms_module) ? NULL : strchr(c->driver.dkms_module, '/');
        int r;

        if (!modules_dir || !etc || !run || !lib || !usrlib)
                return -ENOMEM;
        const char *const config_paths[] = { etc, run, lib, usrlib, NULL };
        const ModuleContextConfig cc = {
                .modules_dir = modules_dir,
                .config_paths = config_paths,
                .sys_dir = c->paths.sys,
                .kernel_release = kver,
        };
        r = module_context_new(&cc, &ctx);
        if (r < 0)
                return r;
        if (isempty(want) && slash)
                want = slash + 1; /* driver.dkms.module NAME/VERSION */

        for (size_t i = 0; i < ELEMENTSOF(core_modules); i++) {
                _cleanup_module_info_free_ ModuleInfo *info = NULL;
                _cleanup_free_ char *msg = NULL;

                if (!core_wanted(c, &core_modules[i]))
                        continue;
                r = module_lookup(ctx, core_modules[i].name, &info, &msg);
                if (r >= 0)
                        r = module_check_vermagic(ctx, info, &msg);
                if (r >= 0 && !isempty(want) && !streq_ptr(info->version, want)) {
                        msg = strprintf("%s (%s) is version %s, not %s.", core_modules[i].name, info->filename,
                                        strna(info->version), want);
                        r = -ESTALE;
                }
                if (r < 0) {
                        *ret_error = strprintf("dkms reported success, but the NVIDIA module for kernel %s is not "
                                               "there: %s",
                                               kver, strna(msg));
                        return r;
                }
                log_info("%s for kernel %s: %s, version %s.", core_modules[i].name, kver, info->filename,
                         strna(info->version));
        }
        return 0;
}

static ModuleLoadJob *module_load_job_free(ModuleLoadJob *j);

void stage_driver_done(Node *n) {
        DriverStage *ds = n->driver_stage;

        if (ds) {
                ds->module_load = module_load_job_free(ds->module_load);
                ds->peermem_insert = module_child_free(ds->peermem_insert);
                ds->reload_release = driver_release_free(ds->reload_release);
                ds->reload_removal = module_child_free(ds->reload_removal);
                ds->dkms_run = dkms_run_free(ds->dkms_run);
                free(ds->dkms_failed_fingerprint);
                free(ds->dkms_failed_message);
                n->driver_stage = mfree(ds);
        }
        n->module_ctx = module_context_free(n->module_ctx);
        n->module_rows = strv_free(n->module_rows);
        n->dkms_state = mfree(n->dkms_state);
}

/* ---- what the stage publishes ------------------------------------------------------------------ */

static void driver_set_dkms_state(Node *n, const char *state) {
        if (streq_ptr(n->dkms_state, state))
                return;
        free(n->dkms_state);
        n->dkms_state = state ? strdup(state) : NULL;
        node_mark_dirty(n, NULL, AGENT_MANAGER_INTERFACE, "DkmsState");
}

/* Takes rows over. */
static void driver_publish_rows(Node *n, char **rows) {
        if (strv_equal(n->module_rows, rows)) {
                strv_free(rows);
                return;
        }
        strv_free(n->module_rows);
        n->module_rows = rows;
        node_mark_dirty(n, NULL, AGENT_MANAGER_INTERFACE, "Modules");
}

static int rows_add(char ***rows, const char *name, const char *state, const char *detail) {
        return strv_extendf(rows, "%s\t%s\t%s", name, state, strempty(detail));
}

/* A module's row as the kernel and the module tree see it (version when loaded, why not otherwise). */
static int rows_add_status(char ***rows, ModuleContext *ctx, const char *name) {
        ModuleStatus s = {};
        int r = module_status(ctx, name, &s);
        if (r < 0) {
                _cleanup_free_ char *detail = strprintf("cannot read its state: %s", strerror(-r));
                return rows_add(rows, name, "unknown", detail);
        }
        r = rows_add(rows, s.name, module_state_to_string(s.state), s.detail);
        module_status_done(&s);
        return r;
}

static int rows_add_core(char ***rows, const Config *c, ModuleContext *ctx) {
        for (size_t i = 0; i < ELEMENTSOF(core_modules); i++) {
                if (!core_wanted(c, &core_modules[i]))
                        continue;
                int r = rows_add_status(rows, ctx, core_modules[i].name);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* ---- facts ------------------------------------------------------------------------------------ */

/* "Secure Boot on, kernel lockdown integrity", for the log before a load: a rejected module is then
 * explained by the line above it. *ret_enforcing: whether either of them makes the kernel insist on
 * signed modules (then the stage message says so too). */
static char *secure_boot_summary(const Config *c, bool *ret_enforcing) {
        _cleanup_free_ char *lp = path_join(c->paths.sys, "kernel/security/lockdown"),
                            *sp = path_join(c->paths.sys, SECURE_BOOT_EFIVAR), *lockdown = NULL,
                            *var = NULL, *mode = NULL;
        const char *sb = "no EFI Secure Boot variable";
        size_t n = 0;

        *ret_enforcing = false;
        if (!lp || !sp)
                return NULL;
        if (read_full_file(sp, 64, &var, &n) >= 0 && n > 0) {
                *ret_enforcing = var[n - 1] == 1;
                sb = *ret_enforcing ? "Secure Boot on" : "Secure Boot off";
        }
        if (read_one_line_file(lp, &lockdown) >= 0) {
                char *lb = strchr(lockdown, '['), *rb = lb ? strchr(lb, ']') : NULL;
                if (rb)
                        mode = strndup(lb + 1, rb - lb - 1);
                if (mode && !streq(mode, "none"))
                        *ret_enforcing = true;
        }
        return strprintf("%s, kernel lockdown %s", sb, mode ?: "not available");
}

/* The loaded driver's version: /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel
 * Module  550.127.05  Tue …", or "… Open Kernel Module for x86_64  550.127.05  Release Build …"), else
 * /sys/module/nvidia/version. "unknown" when neither says. */
static char *loaded_driver_version(const Config *c) {
        _cleanup_free_ char *pp = path_join(c->paths.proc, "driver/nvidia/version"),
                            *sp = path_join(c->paths.sys, "module/nvidia/version"), *line = NULL;
        char *p;

        if (!pp || !sp)
                return NULL;
        if (read_one_line_file(pp, &line) >= 0 && (p = strstr(line, "Kernel Module"))) {
                p += strlen("Kernel Module");
                p += strspn(p, " \t");
                if (startswith(p, "for ")) {
                        p += strlen("for ");
                        p += strcspn(p, " \t");
                        p += strspn(p, " \t");
                }
                size_t n = strcspn(p, " \t");
                if (n > 0)
                        return strndup(p, n);
        }
        line = mfree(line);
        if (read_one_line_file(sp, &line) >= 0 && !isempty(line))
                return TAKE_PTR(line);
        return strdup("unknown");
}

/* ---- kernel module flavour: open or proprietary ---------------------------------------------------- */

typedef enum GpuGeneration {
        GPU_GEN_PRE_TURING,   /* Maxwell, Pascal, Volta: the open modules do not support them */
        GPU_GEN_TURING_HOPPER,
        GPU_GEN_BLACKWELL,    /* and newer: only the open modules support them */
} GpuGeneration;

/* From the chip name pci.ids gives ("GB100 [B200]", "GV100GL [Tesla V100]"), else the device id:
 * NVIDIA numbers its chips upwards, Turing from 0x1e00, Blackwell from 0x2900. */
static GpuGeneration gpu_generation(const PciDevice *d) {
        const char *n = d->name;

        if (n && (startswith(n, "GB") || startswith(n, "GR")))
                return GPU_GEN_BLACKWELL;
        if (n && (startswith(n, "GV") || startswith(n, "GP") || startswith(n, "GM") || startswith(n, "GK")))
                return GPU_GEN_PRE_TURING;
        if (n && (startswith(n, "TU") || startswith(n, "GA") || startswith(n, "AD") || startswith(n, "GH")))
                return GPU_GEN_TURING_HOPPER;
        if (d->device_id >= 0x2900)
                return GPU_GEN_BLACKWELL;
        if (d->device_id < 0x1e00)
                return GPU_GEN_PRE_TURING;
        return GPU_GEN_TURING_HOPPER;
}

static int installed_flavour(ModuleContext *ctx, ModuleFlavour f, char **ret_version) {
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        ModuleFlavour saved = module_context_get_flavour(ctx);
        int r;

        module_context_set_flavour(ctx, f);
        r = module_lookup(ctx, "nvidia", &info, NULL);
        module_context_set_flavour(ctx, saved);
        if (r < 0)
                return 0;
        *ret_version = info->version ? strdup(info->version) : strdup("");
        return *ret_version ? 1 : -ENOMEM;
}

/* driver.kernel-module-type: sets the context's flavour and says why in *ret_reason (NULL: no
 * preference: nothing is installed yet, DKMS builds what is registered). *ret_needed: the GPUs cannot
 * work with the other flavour. A negative errno with *ret_reason when no flavour can drive them all. */
static int driver_choose_flavour(Node *n, ModuleContext *ctx, char **ret_reason, bool *ret_needed) {
        const PciDevice *newest = NULL, *oldest = NULL;
        _cleanup_free_ char *open_version = NULL, *prop_version = NULL;
        int type = n->config->driver.kernel_module_type, r, have_open, have_prop;

        *ret_reason = NULL;
        *ret_needed = type != 0;
        if (type == 1 || type == 2) {
                module_context_set_flavour(ctx, type == 1 ? MODULE_FLAVOUR_OPEN : MODULE_FLAVOUR_PROPRIETARY);
                *ret_reason = strprintf("%s kernel modules: driver.kernel-module-type: %s", type == 1 ? "open" : "proprietary",
                                        type == 1 ? "open" : "proprietary");
                return *ret_reason ? 0 : -ENOMEM;
        }

        for (size_t i = 0; n->inventory && i < n->inventory->n_gpus; i++) {
                const PciDevice *d = &n->inventory->gpus[i];
                GpuGeneration g = gpu_generation(d);
                if (g == GPU_GEN_BLACKWELL && !newest)
                        newest = d;
                if (g == GPU_GEN_PRE_TURING && !oldest)
                        oldest = d;
        }
        if (newest && oldest) {
                *ret_reason = strprintf("GPU %s (%s) is Blackwell or newer and needs the open kernel modules, GPU %s "
                                        "(%s) is older than Turing and needs the proprietary ones: one driver cannot "
                                        "serve both; move one of them to another host.",
                                        newest->address, strna(newest->name), oldest->address, strna(oldest->name));
                return -EOPNOTSUPP;
        }
        if (newest || oldest) {
                const PciDevice *d = newest ?: oldest;
                module_context_set_flavour(ctx, newest ? MODULE_FLAVOUR_OPEN : MODULE_FLAVOUR_PROPRIETARY);
                *ret_needed = true;
                *ret_reason = strprintf("%s kernel modules (driver.kernel-module-type: auto): GPU %s (%s) is %s, which "
                                        "only the %s modules support",
                                        newest ? "open" : "proprietary", d->address, strna(d->name),
                                        newest ? "Blackwell or newer" : "older than Turing",
                                        newest ? "open" : "proprietary");
                return *ret_reason ? 0 : -ENOMEM;
        }

        /* Turing to Hopper run either: what is installed decides, and NVIDIA recommends the open
         * modules from the 560 branch on. */
        have_open = installed_flavour(ctx, MODULE_FLAVOUR_OPEN, &open_version);
        have_prop = installed_flavour(ctx, MODULE_FLAVOUR_PROPRIETARY, &prop_version);
        if (have_open < 0 || have_prop < 0)
                return -ENOMEM;
        if (have_open && have_prop) {
                bool open = atoi(open_version) >= 560;
                module_context_set_flavour(ctx, open ? MODULE_FLAVOUR_OPEN : MODULE_FLAVOUR_PROPRIETARY);
                *ret_reason = open ? strprintf("open kernel modules (driver.kernel-module-type: auto): both flavours are "
                                               "installed and NVIDIA recommends the open ones from the 560 branch (%s)",
                                               open_version)
                                   : strprintf("proprietary kernel modules (driver.kernel-module-type: auto): both "
                                               "flavours are installed and the %s branch predates 560, from which "
                                               "NVIDIA recommends the open ones",
                                               prop_version);
        } else if (have_open || have_prop) {
                module_context_set_flavour(ctx, have_open ? MODULE_FLAVOUR_OPEN : MODULE_FLAVOUR_PROPRIETARY);
                *ret_reason = strprintf("%s kernel modules (driver.kernel-module-type: auto): the only ones installed%s",
                                        have_open ? "open" : "proprietary",
                                        have_prop && atoi(prop_version) >= 560
                                                ? "; NVIDIA recommends the open ones from the 560 branch: install "
                                                  "them (Debian: nvidia-open-kernel-dkms)"
                                                : "");
        } else
                return 0;
        r = *ret_reason ? 0 : -ENOMEM;
        return r;
}

/* The flavour of the live nvidia: /proc/driver/nvidia/version says "Open Kernel Module" for the open
 * one. -1 unknown, 0 proprietary, 1 open. */
static int loaded_flavour_open(const Config *c) {
        _cleanup_free_ char *p = path_join(c->paths.proc, "driver/nvidia/version"), *line = NULL;

        if (!p || read_one_line_file(p, &line) < 0 || !strstr(line, "Kernel Module"))
                return -1;
        return strstr(line, "Open Kernel Module") ? 1 : 0;
}

/* ---- version truth: loaded module, installed module, user-space library -------------------------- */

typedef struct DriverVersions {
        char *loaded;                  /* of the live nvidia; NULL when not loaded or not known */
        char *installed, *installed_file;
        char *library, *library_file;  /* libnvidia-ml.so.<version>, as nvml.library resolves */
} DriverVersions;

static void driver_versions_done(DriverVersions *v) {
        free(v->loaded);
        free(v->installed);
        free(v->installed_file);
        free(v->library);
        free(v->library_file);
        *v = (DriverVersions) {};
}

/* "libnvidia-ml.so.555.42.06" → "555.42.06"; NULL for "libnvidia-ml.so.1" or another name. */
static char *library_file_version(const char *path) {
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path, *v;

        if (!startswith(base, "libnvidia-ml.so."))
                return NULL;
        v = base + strlen("libnvidia-ml.so.");
        if (!(v[0] >= '0' && v[0] <= '9') || !strchr(v, '.') || strspn(v, "0123456789.") != strlen(v))
                return NULL;
        return strdup(v);
}

/* The user-space driver nvml.library names: an absolute path as dlopen() takes it, or a name looked up in
 * the root's library directories (Debian: /usr/lib/x86_64-linux-gnu, whose libnvidia-ml.so.1 links to
 * nvidia/current/libnvidia-ml.so.<version>); the version is in the real file's name. */
static void library_version(const Config *c, char **ret_version, char **ret_file) {
        static const char *const dirs[] = { "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64",
                                            "usr/lib", "lib/x86_64-linux-gnu", "lib64", "lib" };
        const char *lib = c->nvml.library;
        char *real = NULL;

        *ret_version = *ret_file = NULL;
        if (isempty(lib))
                return;
        if (strchr(lib, '/'))
                real = realpath(lib, NULL);
        for (size_t i = 0; !real && i < ELEMENTSOF(dirs); i++) {
                _cleanup_free_ char *dir = path_join(c->paths.root, dirs[i]), *p = dir ? path_join(dir, lib) : NULL;
                if (p)
                        real = realpath(p, NULL);
        }
        if (!real)
                return;
        *ret_version = library_file_version(real);
        if (*ret_version)
                *ret_file = real;
        else
                free(real);
}

static int driver_versions_read(Node *n, ModuleContext *ctx, DriverVersions *v) {
        _cleanup_module_info_free_ ModuleInfo *info = NULL;

        *v = (DriverVersions) {};
        if (module_is_usable(ctx, "nvidia")) {
                v->loaded = loaded_driver_version(n->config);
                if (!v->loaded)
                        return -ENOMEM;
                if (streq(v->loaded, "unknown"))
                        v->loaded = mfree(v->loaded);
        }
        if (module_lookup(ctx, "nvidia", &info, NULL) >= 0 && info->version) {
                v->installed = strdup(info->version);
                v->installed_file = strdup(info->filename);
                if (!v->installed || !v->installed_file)
                        return -ENOMEM;
        }
        library_version(n->config, &v->library, &v->library_file);
        return 0;
}

/* Rows for the Modules property next to the live modules: what is installed, and whether it is the
 * version the kernel runs. */
static int rows_add_versions(char ***rows, const DriverVersions *v) {
        const struct {
                const char *name, *version, *file;
        } items[] = {
                { "nvidia (installed)", v->installed, v->installed_file },
                { "libnvidia-ml (user space)", v->library, v->library_file },
        };

        for (size_t i = 0; i < ELEMENTSOF(items); i++) {
                _cleanup_free_ char *detail = NULL;
                const char *state;
                int r;

                if (!items[i].version)
                        continue;
                state = !v->loaded ? "installed" : streq(items[i].version, v->loaded) ? "same" : "differs";
                detail = strprintf("%s (%s)%s%s", items[i].version, items[i].file, v->loaded ? ", loaded: " : "",
                                   v->loaded ?: "");
                if (!detail)
                        return -ENOMEM;
                r = rows_add(rows, items[i].name, state, detail);
                if (r < 0)
                        return r;
        }
        return 0;
}

typedef enum VersionVerdict {
        VERSIONS_OK,
        VERSIONS_RELOAD,      /* the installed module (and the library, where known) is newer: load it */
        VERSIONS_LIBRARY,     /* the module is right, the user-space library is not */
        VERSIONS_INCOMPLETE,  /* installed module and library differ from each other too */
} VersionVerdict;

/* Compares loaded, installed and user space; the sentence says what NVML will do and the fix. */
static VersionVerdict versions_verdict(const Node *n, const DriverVersions *v, char **ret_message) {
        const char *loaded = v->loaded;

        *ret_message = NULL;
        if (!loaded)
                return VERSIONS_OK;
        if (v->installed && v->library && !streq(v->installed, v->library) && !streq(v->installed, loaded)) {
                *ret_message = strprintf("The driver upgrade is incomplete: nvidia %s is loaded, the installed module "
                                         "is %s (%s) and the user-space library is %s (%s); install the same version "
                                         "of both, then reboot or run `gpunodectl driver reload`.",
                                         loaded, v->installed, v->installed_file, v->library, v->library_file);
                return VERSIONS_INCOMPLETE;
        }
        if (v->installed && !streq(v->installed, loaded)) {
                *ret_message = strprintf("nvidia %s is loaded but %s is installed (%s)%s%s%s%s: NVML fails with "
                                         "\"Driver/library version mismatch\" until it is loaded; reboot or run "
                                         "`gpunodectl driver reload` to load %s%s.",
                                         loaded, v->installed, v->installed_file,
                                         v->library ? ", as is the user-space library (" : "", strempty(v->library_file),
                                         v->library ? ")" : "", "", v->installed,
                                         n->config->driver.reload_on_mismatch ? ""
                                                                               : " (driver.reload-on-mismatch: when-idle "
                                                                                 "does it once no process uses a GPU)");
                return VERSIONS_RELOAD;
        }
        if (v->library && !streq(v->library, loaded)) {
                *ret_message = strprintf("nvidia %s is loaded and installed, but the user-space library is %s (%s): "
                                         "NVML fails with \"Driver/library version mismatch\"; install the user-space "
                                         "driver of %s (Debian: libnvidia-ml1 of that version).",
                                         loaded, v->library, v->library_file, loaded);
                return VERSIONS_LIBRARY;
        }
        return VERSIONS_OK;
}

/* The GPU holders other than ourselves and our children (driver_own_child()); h->procs keeps the others. */
static int holders_foreign(Node *n, GpuHolders *h) {
        int r = gpu_holders_collect(n->config->paths.proc, n->config->paths.sys, n->config->paths.dev, getpid(), h);
        if (r < 0 && r != -ENOENT)
                return r;
        for (size_t i = 0; i < h->n_procs;) {
                if (driver_own_child(n->config->paths.proc, h->procs[i].pid)) {
                        free(h->procs[i].comm);
                        free(h->procs[i].node);
                        memmove(h->procs + i, h->procs + i + 1, (h->n_procs - i - 1) * sizeof(GpuHolder));
                        h->n_procs--;
                        continue;
                }
                i++;
        }
        return 0;
}

/* driver.reload-on-mismatch: when-idle: whether anything but us, our NVML processes and the driver's
 * own modules holds the GPU. 1 idle, 0 busy with *ret_who, negative errno. */
static int driver_idle(Node *n, char **ret_who) {
        _cleanup_(gpu_holders_done) GpuHolders h = {};
        static const char *const ours[] = { "nvidia_uvm", "nvidia_modeset", "nvidia_peermem", NULL };
        _cleanup_strv_free_ char **foreign = NULL;
        int r;

        r = holders_foreign(n, &h);
        if (r < 0)
                return r;
        STRV_FOREACH(mod, h.modules)
                if (!strv_contains((char **) ours, *mod) && strv_extend(&foreign, *mod) < 0)
                        return -ENOMEM;
        strv_free(h.modules);
        h.modules = TAKE_PTR(foreign);
        if (!gpu_holders_busy(&h))
                return 1;
        *ret_who = gpu_holders_to_string(&h);
        return *ret_who ? 0 : -ENOMEM;
}

static int driver_ensure(Node *n, const char *dkms_message, char **ret_message);

#define RELOAD_REMOVAL_TIMEOUT_USEC (5 * 60 * USEC_PER_SEC)

/* In the child: the old modules out, holders first, never forced. */
static int reload_removal_child(Node *n, void *userdata, char **ret_message, char ***ret_names) {
        static char *const modules[] = { DRIVER_UNLOAD_MODULES, NULL };
        ModuleContext *ctx;
        int r;

        r = driver_module_context(n, &ctx);
        if (r < 0)
                return r;
        return module_unload(ctx, modules, ret_message);
}

/* The old driver is out (or could not be taken out): the cold path loads the new one. */
static void on_reload_removed(Node *n, int r, const char *message, char **names, void *userdata) {
        _cleanup_free_ char *stage_message = NULL;

        n->driver_stage->reload_removal = NULL;
        if (r < 0) {
                stage_message = strprintf("Cannot reload the driver: %s", message ?: strerror(-r));
                node_stage_complete(n, STAGE_DRIVER, r, stage_message);
                return;
        }
        /* depmod-fresh view of the tree, then the cold path loads the new one. */
        n->module_ctx = module_context_free(n->module_ctx);
        r = driver_ensure(n, NULL, &stage_message);
        if (r != STAGE_RUNNING)
                node_stage_complete(n, STAGE_DRIVER, r, stage_message);
}

bool driver_reload_in_flight(const Node *n) {
        return n->driver_stage && (n->driver_stage->reload_release || n->driver_stage->reload_removal);
}

/* Our NVML processes let go of /dev/nvidia*: forget what NVML said of the old driver and remove it in a
 * child (delete_module() runs nvidia's exit in the kernel, which tears down every GPU). */
static void on_reload_released(Node *n, void *userdata) {
        _cleanup_free_ char *message = NULL;
        NvmlSnapshot *old;
        int r;

        n->driver_stage->reload_release = driver_release_free(n->driver_stage->reload_release);
        old = n->nvml_snapshot;
        if (old) {
                n->nvml_snapshot = NULL;
                node_nvml_changed(n, old);
                gpu_nvml_snapshot_free(old);
        }
        /* We take it out ourselves: not an administrator's modprobe -r (driver_admin_unload_check()). */
        n->driver_was_live = false;
        r = module_child_start(n, n->event, "removing the old NVIDIA modules for the reload",
                               RELOAD_REMOVAL_TIMEOUT_USEC, reload_removal_child, NULL, on_reload_removed, NULL, NULL,
                               &n->driver_stage->reload_removal);
        if (r < 0) {
                message = strprintf("Cannot reload the driver: cannot start removing the old modules: %s",
                                    strerror(-r));
                node_stage_complete(n, STAGE_DRIVER, r, message);
        }
}

/* Takes the old driver out for the reload, off the loop: our NVML handles first (the NVML worker's, the
 * MIG reader's and the health event worker's hold /dev/nvidia*; watched until they let go), then the
 * modules, holders first, in a child. The stage completes from there (STAGE_RUNNING until then). */
static int driver_reload_start(Node *n, char **ret_message) {
        int r;

        r = driver_release_start(n, "NVML was closed: the driver is reloaded (driver.reload-on-mismatch: when-idle)",
                                 on_reload_released, NULL, &n->driver_stage->reload_release);
        if (r < 0) {
                *ret_message = strprintf("Cannot reload the driver: %s", strerror(-r));
                return r;
        }
        return STAGE_RUNNING;
}

/* The options each module gets, "MODULE opt=val …" (modprobe.d's, then driver.parameters), and the
 * digest of them for driver.state. */
static int options_digest(const Config *c, ModuleContext *ctx, char **ret) {
        _cleanup_strv_free_ char **entries = NULL;
        struct kmod_ctx *kmod = module_context_get_kmod(ctx);

        for (size_t i = 0; i < ELEMENTSOF(core_modules); i++) {
                struct kmod_module *mod = NULL;
                const char *file_options = NULL;
                int r;

                if (!core_wanted(c, &core_modules[i]))
                        continue;
                if (kmod_module_new_from_name(kmod, core_modules[i].name, &mod) >= 0)
                        file_options = kmod_module_get_options(mod);
                r = strv_extendf(&entries, "%s %s %s", core_modules[i].name, strempty(file_options),
                                 strempty(module_parameters(c, core_modules[i].id)));
                kmod_module_unref(mod);
                if (r < 0)
                        return r;
        }
        return driver_options_digest(entries, ret);
}

static int driver_record(Node *n, const char *version, const char *digest) {
        _cleanup_(driver_state_freep) DriverState *s = NULL;
        int r = driver_state_new(n->kernel_release, version, digest, &s);
        if (r >= 0)
                r = driver_state_save(n->config->paths.state, s);
        if (r < 0)
                log_warning_errno(r, "Cannot record the driver load in %s/%s (%s); the next start checks "
                                  "the modules again.", n->config->paths.state, DRIVER_STATE_FILE, strerror(-r));
        return r;
}

/* ---- nvidia-peermem ----------------------------------------------------------------------------- */

/* Checks nvidia-peermem against the rule. Never fails the stage: GPUDirect RDMA is optional, so the
 * outcome goes into its row and, when the sysadmin should act, into *ret_note. Returns 1 (no row added)
 * when it is to be inserted: peermem_insert_start() does that in a child process. */
static int driver_peermem(Node *n, ModuleContext *ctx, char ***rows, char **ret_note) {
        const char *name = "nvidia-peermem";
        _cleanup_free_ char *reason = NULL;
        bool has_nic = n->inventory && n->inventory->n_nics > 0;
        int r;

        if (!n->config->driver.peermem)
                return rows_add(rows, name, "skipped", "driver.peermem is off");
        if (module_is_usable(ctx, name))
                return rows_add_status(rows, ctx, name);

        r = module_peermem_check(ctx, has_nic, &reason);
        if (r == 0 || r < 0) {
                _cleanup_module_info_free_ ModuleInfo *info = NULL;
                const char *state = "skipped";

                if (r < 0)
                        state = "failed";
                else if (has_nic && module_is_usable(ctx, "ib_core"))
                        /* ib_core is there: either no peermem for this kernel, or a stub. */
                        state = module_lookup(ctx, name, &info, NULL) >= 0 ? "failed" : "missing";
                if (has_nic)
                        *ret_note = strdup(strna(reason));
                return rows_add(rows, name, state, reason);
        }
        return 1;
}

/* The insert (its init runs in the kernel, as nvidia's does) in a child: the stage finishes from
 * on_peermem_inserted() with the rows so far and the message so far. */
#define PEERMEM_INSERT_TIMEOUT_USEC (60 * USEC_PER_SEC)

typedef struct PeermemInsert {
        char **rows;
        char *message;
} PeermemInsert;

static void peermem_insert_free(void *userdata) {
        PeermemInsert *p = userdata;

        strv_free(p->rows);
        free(p->message);
        free(p);
}

static int peermem_insert_child(Node *n, void *userdata, char **ret_message, char ***ret_names) {
        ModuleContext *ctx;
        int r;

        r = driver_module_context(n, &ctx);
        if (r < 0)
                return r;
        r = module_load(ctx, "nvidia-peermem", module_parameters(n->config, DRIVER_MODULE_PEERMEM), ret_message);
        if (r > 0 && strv_extend(ret_names, "nvidia-peermem") < 0)
                return -ENOMEM;
        return r < 0 ? r : 0;
}

static void on_peermem_inserted(Node *n, int r, const char *msg, char **names, void *userdata) {
        PeermemInsert *p = userdata;
        _cleanup_strv_free_ char **rows = TAKE_PTR(p->rows);
        _cleanup_free_ char *message = TAKE_PTR(p->message), *note = NULL, *full = NULL;
        ModuleContext *ctx;
        int k;

        free(p);
        n->driver_stage->peermem_insert = NULL;
        if (r < 0) {
                log_warning("%s", strna(msg));
                note = strprintf("nvidia-peermem (GPUDirect RDMA) is not loaded: %s", strna(msg));
                k = rows_add(&rows, "nvidia-peermem", "failed", msg);
        } else {
                if (strv_length(names) > 0) {
                        log_info("Loaded nvidia-peermem (GPUDirect RDMA).");
                        note = strdup("nvidia-peermem loaded");
                }
                k = driver_module_context(n, &ctx);
                if (k >= 0)
                        k = rows_add_status(&rows, ctx, "nvidia-peermem");
        }
        if (k < 0) {
                node_stage_complete(n, STAGE_DRIVER, k, NULL);
                return;
        }
        driver_publish_rows(n, TAKE_PTR(rows));
        full = note ? strprintf("%s; %s", strna(message), note) : TAKE_PTR(message);
        node_stage_complete(n, STAGE_DRIVER, STAGE_DONE, full);
}

/* The end of a pass that got the core modules live: peermem's rule, then the rows and the message
 * (rows and message taken). STAGE_DONE, or STAGE_RUNNING while peermem is inserted. */
static int driver_finish(Node *n, ModuleContext *ctx, char **rows_taken, char *message_taken, char **ret_message) {
        _cleanup_strv_free_ char **rows = rows_taken;
        _cleanup_free_ char *message = message_taken, *note = NULL;
        PeermemInsert *p;
        int r;

        if (!message)
                return -ENOMEM;
        r = driver_peermem(n, ctx, &rows, &note);
        if (r < 0)
                return r;
        if (r == 0) {
                driver_publish_rows(n, TAKE_PTR(rows));
                *ret_message = note ? strprintf("%s; %s", message, note) : TAKE_PTR(message);
                return *ret_message ? STAGE_DONE : -ENOMEM;
        }
        p = calloc(1, sizeof *p);
        if (!p)
                return -ENOMEM;
        *p = (PeermemInsert) { .rows = TAKE_PTR(rows), .message = TAKE_PTR(message) };
        r = module_child_start(n, n->event, "inserting nvidia-peermem", PEERMEM_INSERT_TIMEOUT_USEC,
                               peermem_insert_child, NULL, on_peermem_inserted, p, peermem_insert_free,
                               &n->driver_stage->peermem_insert);
        if (r < 0) {
                *ret_message = strprintf("%s; nvidia-peermem (GPUDirect RDMA) is not loaded: cannot start the "
                                         "insert: %s", p->message, strerror(-r));
                if (rows_add(&p->rows, "nvidia-peermem", "failed", strerror(-r)) >= 0)
                        driver_publish_rows(n, TAKE_PTR(p->rows));
                strv_free(p->rows);
                free(p->message);
                free(p);
                return *ret_message ? STAGE_DONE : -ENOMEM;
        }
        node_stage_progress(n, STAGE_DRIVER, "inserting nvidia-peermem");
        return STAGE_RUNNING;
}

/* ---- the stage ----------------------------------------------------------------------------------- */

static int driver_ensure(Node *n, const char *dkms_message, char **ret_message);
static void module_load_job_set_flavour(ModuleLoadJob *j, char *flavour);
static int module_load_start(Node *n, const char *dkms_message, bool enforcing, const char *sb,
                             const char *digest, char **ret_message);

static void on_dkms_line(DkmsRun *run, const char *line, void *userdata) {
        log_info("dkms: %s", line);
}

static void on_dkms_progress(DkmsRun *run, const char *status, void *userdata) {
        Node *n = userdata;

        node_stage_progress(n, STAGE_DRIVER, status);
        driver_set_dkms_state(n, status);
}

static void on_dkms_done(DkmsRun *run, int error, const char *message, void *userdata) {
        _cleanup_free_ char *state = NULL, *stage_message = NULL;
        Node *n = userdata;
        int r;

        n->driver_stage->dkms_run = dkms_run_free(run);
        metrics_dkms_finished(n, error >= 0);
        n->driver_stage->dkms_failed_fingerprint = mfree(n->driver_stage->dkms_failed_fingerprint);
        n->driver_stage->dkms_failed_message = mfree(n->driver_stage->dkms_failed_message);
        if (error < 0) {
                ModuleContext *ctx;
                _cleanup_strv_free_ char **rows = NULL;
                DkmsOptions o;

                /* Remember what the failure saw: a retry runs dkms again only when that changed. */
                driver_dkms_options(n->config, &o);
                if (error != -ECANCELED && error != -ETIME &&
                    dkms_fingerprint(n->kernel_release, &o, &n->driver_stage->dkms_failed_fingerprint) >= 0) {
                        n->driver_stage->dkms_failed_message = message ? strdup(message) : NULL;
                        n->driver_stage->dkms_failed_error = error;
                }

                state = strprintf("failed: %s", strna(message));
                driver_set_dkms_state(n, state ?: "failed");
                if (driver_module_context(n, &ctx) >= 0 && rows_add_core(&rows, n->config, ctx) >= 0)
                        driver_publish_rows(n, TAKE_PTR(rows));
                node_stage_complete(n, STAGE_DRIVER, error, message);
                return;
        }

        log_info("%s", strna(message));
        state = strprintf("built: %s", strna(message));
        driver_set_dkms_state(n, state ?: "built");
        /* depmod rewrote the module indexes libkmod may have mapped: start from scratch. */
        n->module_ctx = module_context_free(n->module_ctx);
        r = driver_ensure(n, message ?: "", &stage_message);
        if (r != STAGE_RUNNING)
                node_stage_complete(n, STAGE_DRIVER, r, stage_message);
}

static int driver_start_dkms(Node *n, const char *reason, char **ret_message) {
        static const DkmsRunCallbacks cb = {
                .line = on_dkms_line,
                .progress = on_dkms_progress,
                .done = on_dkms_done,
        };
        _cleanup_free_ char *error = NULL;
        DkmsOptions o;
        int r;

        driver_dkms_options(n->config, &o);
        if (n->driver_stage->dkms_failed_fingerprint) {
                _cleanup_free_ char *now = NULL;
                if (dkms_fingerprint(n->kernel_release, &o, &now) >= 0 && streq(now, n->driver_stage->dkms_failed_fingerprint)) {
                        /* The same build would fail the same way: say so instead of rebuilding. */
                        log_debug("Not running dkms again: nothing it depends on changed since it failed.");
                        *ret_message = strprintf("%s (dkms not run again: the kernel headers, the DKMS tree and "
                                                 "/usr/src are unchanged since this failure; it runs again once "
                                                 "one of them changes)",
                                                 strna(n->driver_stage->dkms_failed_message));
                        return n->driver_stage->dkms_failed_error < 0 ? n->driver_stage->dkms_failed_error : -EIO;
                }
        }
        log_info("%s Building it with DKMS (%s %s -k %s).", reason, o.program ?: "dkms",
                 o.module ? "install" : "autoinstall", n->kernel_release);
        r = dkms_run_start(n->event, n->kernel_release, &o, &cb, n, &n->driver_stage->dkms_run, &error);
        if (r >= 0)
                metrics_dkms_started(n);
        if (r < 0) {
                _cleanup_free_ char *state = strprintf("failed: %s", strna(error));
                driver_set_dkms_state(n, state ?: "failed");
                *ret_message = strprintf("%s; the build was needed because: %s", strna(error), reason);
                return r;
        }
        return STAGE_RUNNING;
}

#define DRIVER_RELOAD 1

/* The fast path's version check: 0 fine, DRIVER_RELOAD when driver.reload-on-mismatch: when-idle may
 * replace the loaded driver now, or a negative errno with the verdict. */
static int driver_live_versions(Node *n, char **ret_message) {
        _cleanup_(driver_versions_done) DriverVersions v = {};
        _cleanup_free_ char *verdict = NULL, *who = NULL;
        ModuleContext *ctx;
        VersionVerdict vv;
        int r;

        r = driver_module_context(n, &ctx);
        if (r >= 0)
                r = driver_versions_read(n, ctx, &v);
        if (r < 0)
                return r;
        vv = versions_verdict(n, &v, &verdict);
        if (vv == VERSIONS_OK)
                return 0;
        if (vv == VERSIONS_RELOAD && n->config->driver.reload_on_mismatch) {
                r = driver_idle(n, &who);
                if (r < 0)
                        return r;
                if (r > 0) {
                        log_notice("%s No process uses a GPU: reloading now (driver.reload-on-mismatch: when-idle).",
                                   verdict);
                        return DRIVER_RELOAD;
                }
                *ret_message = strprintf("%s driver.reload-on-mismatch: when-idle waits until no process uses a "
                                         "GPU: %s",
                                         verdict, strna(who));
                return -EBUSY;
        }
        *ret_message = TAKE_PTR(verdict);
        return -ESTALE;
}

/* Everything already live: nothing is loaded; the record says whether anything changed. */
static int driver_live(Node *n, const char *digest, char **ret_message) {
        _cleanup_(driver_state_freep) DriverState *recorded = NULL, *now = NULL;
        _cleanup_free_ char *version = loaded_driver_version(n->config), *reason = NULL;
        const char *want = n->config->driver.version;
        int r;

        if (!version)
                return -ENOMEM;
        if (!isempty(want) && !streq(version, want)) {
                *ret_message = strprintf("The loaded NVIDIA driver is %s, but driver.version is %s; a loaded driver "
                                         "is never replaced under running work: stop what uses the GPUs and run "
                                         "`gpunodectl driver unload` (or reboot), and the next pass loads %s.",
                                         version, want, want);
                return -ESTALE;
        }

        r = driver_live_versions(n, ret_message);
        if (r != 0)
                return r;

        r = driver_state_new(n->kernel_release, version, digest, &now);
        if (r < 0)
                return r;
        r = driver_state_load(n->config->paths.state, &recorded);
        if (r < 0 && r != -ENOENT && r != -EBADMSG)
                log_debug_errno(r, "Cannot read %s/%s: %m", n->config->paths.state, DRIVER_STATE_FILE);
        r = driver_state_compare(recorded, now, &reason);
        if (r < 0)
                return r;
        if (r > 0) {
                *ret_message = strprintf("nvidia %s already loaded for kernel %s, unchanged since the last check",
                                         version, n->kernel_release);
                return 0;
        }

        if (recorded && streq_ptr(recorded->kernel, now->kernel) &&
            streq_ptr(recorded->driver_version, now->driver_version))
                log_notice("The module options changed since nvidia was loaded; they apply at its next load "
                           "(after `gpunodectl driver unload` or a reboot).");
        else
                log_info("nvidia %s is already loaded (%s); recording it.", version, strna(reason));
        (void) driver_record(n, version, digest);
        *ret_message = strprintf("nvidia %s already loaded for kernel %s", version, n->kernel_release);
        return 0;
}

/* Why the module for name cannot be loaded as it is and needs a (re)build: 1 with *ret_reason, 0
 * when it is fine, or a negative errno with *ret_reason for what DKMS cannot fix. */
static int driver_precheck(Node *n, ModuleContext *ctx, const char *name, bool secure_boot, char **ret_reason) {
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        const char *want = n->config->driver.version;
        int r;

        r = module_lookup(ctx, name, &info, ret_reason);
        if (r == -ENOENT)
                return 1;
        if (r < 0)
                return r;
        r = module_check_vermagic(ctx, info, ret_reason);
        if (r == -ESTALE)
                return 1;
        if (r < 0)
                return r;
        if (!isempty(want) && !streq_ptr(info->version, want)) {
                *ret_reason = strprintf("%s (%s) is version %s, but driver.version is %s.", name, info->filename,
                                        strna(info->version), want);
                return 1;
        }
        {
                _cleanup_free_ char *options =
                        module_effective_options(ctx, info, module_parameters(n->config, module_id(name)));
                if (!options)
                        return -ENOMEM;
                r = module_check_firmware(ctx, info, options, ret_reason);
                if (r < 0)
                        return r;
        }
        if (secure_boot)
                log_info("%s: %s, version %s, signed by %s.", name, info->filename, strna(info->version),
                         info->signer ?: "nobody (unsigned)");
        return 0;
}

/* Removes what this attempt loaded, so a failure leaves the kernel as it found it. */
static void driver_rollback(ModuleContext *ctx, char **loaded) {
        _cleanup_free_ char *msg = NULL;
        int r;

        if (strv_length(loaded) == 0)
                return;
        r = module_unload(ctx, loaded, &msg);
        if (r < 0)
                log_warning("Cannot unload the modules loaded before the failure: %s", strna(msg));
}

static int driver_ensure(Node *n, const char *dkms_message, char **ret_message) {
        _cleanup_strv_free_ char **rows = NULL;
        _cleanup_free_ char *digest = NULL, *sb = NULL, *build_reason = NULL, *message = NULL, *flavour_reason = NULL;
        const Config *c = n->config;
        ModuleContext *ctx;
        bool all_live = true, enforcing = false, flavour_needed = false;
        int r;

        r = driver_module_context(n, &ctx);
        if (r < 0)
                return r;
        r = driver_choose_flavour(n, ctx, &flavour_reason, &flavour_needed);
        if (r < 0) {
                *ret_message = TAKE_PTR(flavour_reason);
                return r;
        }
        if (flavour_reason)
                log_info("Using the %s.", flavour_reason);
        r = options_digest(c, ctx, &digest);
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(core_modules); i++)
                if (core_wanted(c, &core_modules[i]) && !module_is_usable(ctx, core_modules[i].name))
                        all_live = false;

        if (all_live && flavour_needed) {
                int lo = loaded_flavour_open(c);
                bool want_open = module_context_get_flavour(ctx) == MODULE_FLAVOUR_OPEN;
                if (lo >= 0 && (lo == 1) != want_open) {
                        *ret_message = strprintf("The %s nvidia module is loaded, but this node needs the %s: GPUs "
                                                 "stay unusable with it. Install the %s kernel modules (Debian: %s), "
                                                 "then run `gpunodectl driver reload` or reboot.",
                                                 lo ? "open" : "proprietary", strna(flavour_reason),
                                                 want_open ? "open" : "proprietary",
                                                 want_open ? "nvidia-open-kernel-dkms" : "nvidia-kernel-dkms");
                        return -EMEDIUMTYPE;
                }
        }

        /* The fast path (Debian loads nvidia at boot): nothing is loaded or looked up; only the
         * peermem rule is checked, since ib_core coming back is what starts such a pass. */
        if (all_live) {
                _cleanup_(driver_versions_done) DriverVersions v = {};

                r = driver_live(n, digest, &message);
                if (r < 0) {
                        if (rows_add_core(&rows, c, ctx) >= 0 && driver_versions_read(n, ctx, &v) >= 0 &&
                            rows_add_versions(&rows, &v) >= 0)
                                driver_publish_rows(n, TAKE_PTR(rows));
                        *ret_message = TAKE_PTR(message);
                        return r;
                }
                if (r == DRIVER_RELOAD)
                        return driver_reload_start(n, ret_message);
                r = rows_add_core(&rows, c, ctx);
                if (r >= 0)
                        r = driver_versions_read(n, ctx, &v);
                if (r >= 0)
                        r = rows_add_versions(&rows, &v);
                if (r < 0)
                        return r;
                n->driver_was_live = true;
                return driver_finish(n, ctx, TAKE_PTR(rows), TAKE_PTR(message), ret_message);
        }

        sb = secure_boot_summary(c, &enforcing);
        log_info("Loading the NVIDIA driver for kernel %s (%s).", n->kernel_release, strna(sb));

        for (size_t i = 0; i < ELEMENTSOF(core_modules) && !build_reason; i++) {
                const char *name = core_modules[i].name;
                _cleanup_free_ char *reason = NULL;

                if (!core_wanted(c, &core_modules[i]) || module_is_usable(ctx, name))
                        continue;
                r = driver_precheck(n, ctx, name, enforcing, &reason);
                if (r < 0) {
                        if (rows_add_core(&rows, c, ctx) >= 0)
                                driver_publish_rows(n, TAKE_PTR(rows));
                        if (r == -ENOPKG && flavour_reason)
                                *ret_message = strprintf("%s (needed: %s)", strna(reason), flavour_reason);
                        else
                                *ret_message = TAKE_PTR(reason);
                        return r;
                }
                if (r > 0)
                        build_reason = TAKE_PTR(reason);
        }
        if (build_reason) {
                if (rows_add_core(&rows, c, ctx) >= 0)
                        driver_publish_rows(n, TAKE_PTR(rows));
                if (dkms_message) {
                        *ret_message = strprintf("DKMS finished (%s) but the module is still not usable: %s",
                                                 dkms_message, build_reason);
                        return -ENOENT;
                }
                if (!c->driver.dkms_enabled) {
                        *ret_message = strprintf("%s DKMS rebuilds are off (driver.dkms.enabled: false): install "
                                                 "the NVIDIA module for kernel %s yourself.",
                                                 build_reason, n->kernel_release);
                        return -ENOENT;
                }
                return driver_start_dkms(n, build_reason, ret_message);
        }

        r = module_load_start(n, dkms_message, enforcing, sb, digest, ret_message);
        if (r == STAGE_RUNNING && n->driver_stage->module_load && flavour_reason)
                module_load_job_set_flavour(n->driver_stage->module_load, TAKE_PTR(flavour_reason));
        return r;
}

/* ---- the inserts, in a child process ------------------------------------------------------------
 * finit_module() runs the module's init: for nvidia that probes every GPU, seconds each, and a wedged
 * GPU can keep it in the kernel for much longer. So the inserts run in a forked child (spawn_fork(): the
 * same libkmod context, its own process group, nothing of ours inherited but a socket) and the stage
 * waits for its exit on the loop; the result comes back as "<r>\0<message>\0<loaded>\0…". */

#define MODULE_LOAD_TIMEOUT_USEC (5 * 60 * USEC_PER_SEC)

struct ModuleLoadJob {
        Node *node;
        Spawn *child;
        int fd;
        char *dkms_message, *sb, *digest;
        char *flavour;           /* why this kernel module flavour, for the message */
        bool enforcing;
};

static void module_load_job_set_flavour(ModuleLoadJob *j, char *flavour) {
        free(j->flavour);
        j->flavour = flavour;
}

static ModuleLoadJob *module_load_job_free(ModuleLoadJob *j) {
        if (!j)
                return NULL;
        spawn_free(j->child);
        if (j->fd >= 0)
                close(j->fd);
        free(j->dkms_message);
        free(j->sb);
        free(j->digest);
        free(j->flavour);
        return mfree(j);
}

/* In the child: the ipmi modules (best effort), then the core modules in order; a failure unloads what
 * this run loaded. */
static int load_modules(Node *n, ModuleContext *ctx, char **ret_message, char ***ret_loaded) {
        _cleanup_strv_free_ char **loaded = NULL;
        const Config *c = n->config;
        int r;

        for (size_t i = 0; i < ELEMENTSOF(ipmi_modules); i++) {
                _cleanup_free_ char *msg = NULL;
                if (module_load(ctx, ipmi_modules[i], NULL, &msg) < 0)
                        log_debug("Not loading %s (best effort): %s", ipmi_modules[i], strna(msg));
        }

        for (size_t i = 0; i < ELEMENTSOF(core_modules); i++) {
                const char *name = core_modules[i].name;
                _cleanup_free_ char *msg = NULL;

                if (!core_wanted(c, &core_modules[i]))
                        continue;
                r = module_load(ctx, name, module_parameters(c, core_modules[i].id), &msg);
                if (r < 0) {
                        driver_rollback(ctx, loaded);
                        if (strv_length(loaded) > 0) {
                                _cleanup_free_ char *undone = strv_join(loaded, ", ");
                                *ret_message = strprintf("%s (Unloaded %s again.)", strna(msg), strna(undone));
                        } else
                                *ret_message = TAKE_PTR(msg);
                        return r;
                }
                if (r > 0 && strv_extend(&loaded, name) < 0)
                        return -ENOMEM;
        }
        *ret_loaded = TAKE_PTR(loaded);
        return 0;
}

static int module_load_child(int fd, void *userdata) {
        ModuleLoadJob *j = userdata;
        _cleanup_strv_free_ char **loaded = NULL;
        _cleanup_free_ char *message = NULL;
        ModuleContext *ctx;
        int r;

        r = driver_module_context(j->node, &ctx);
        if (r >= 0)
                r = load_modules(j->node, ctx, &message, &loaded);
        return module_child_send(fd, r, message, loaded) < 0 ? 2 : 0;
}

/* What the child wrote (it is in the socket's buffer once the child has exited). */
static int module_load_result(ModuleLoadJob *j, char **ret_message, char ***ret_loaded) {
        int r = module_child_receive(j->fd, ret_message, ret_loaded);
        return r < 0 ? r : 0;
}

/* The tail of driver_ensure(), once the inserts are done: the record, the rows, peermem, the message. */
static int module_load_finish(Node *n, ModuleLoadJob *j, int r, char *load_message, char **loaded,
                              char **ret_message) {
        _cleanup_strv_free_ char **rows = NULL;
        _cleanup_free_ char *version = NULL, *message = NULL;
        const Config *c = n->config;
        ModuleContext *ctx;
        int k;

        k = driver_module_context(n, &ctx);
        if (k < 0)
                return k;
        if (r < 0) {
                if (rows_add_core(&rows, c, ctx) >= 0)
                        driver_publish_rows(n, TAKE_PTR(rows));
                *ret_message = load_message ? strdup(load_message) : NULL;
                return r;
        }

        version = loaded_driver_version(c);
        if (!version)
                return -ENOMEM;
        n->driver_was_live = true;
        (void) driver_record(n, version, j->digest);
        r = rows_add_core(&rows, c, ctx);
        if (r >= 0) {
                _cleanup_(driver_versions_done) DriverVersions v = {};
                r = driver_versions_read(n, ctx, &v);
                if (r >= 0)
                        r = rows_add_versions(&rows, &v);
        }
        if (r < 0)
                return r;

        message = strv_join(loaded, ", ");
        if (!message)
                return -ENOMEM;
        return driver_finish(n, ctx, TAKE_PTR(rows),
                             strprintf("%s%s%sloaded %s (driver %s) for kernel %s%s%s%s%s",
                                       j->dkms_message ? "built with DKMS (" : "", strempty(j->dkms_message),
                                       j->dkms_message ? "), " : "", isempty(message) ? "nothing new" : message,
                                       version, n->kernel_release, j->flavour ? "; " : "", strempty(j->flavour),
                                       j->enforcing ? "; " : "", j->enforcing ? strna(j->sb) : ""), ret_message);
}

static void on_module_load_exit(Spawn *child, const SpawnResult *res, void *userdata) {
        Node *n = userdata;
        ModuleLoadJob *j = TAKE_PTR(n->driver_stage->module_load);
        _cleanup_strv_free_ char **loaded = NULL;
        _cleanup_free_ char *load_message = NULL, *message = NULL;
        int r;

        if (res->exit_status == 0)
                r = module_load_result(j, &load_message, &loaded);
        else {
                r = res->timed_out ? -ETIMEDOUT : -EIO;
                load_message = res->timed_out
                        ? strprintf("Loading the NVIDIA modules did not finish within %" PRIu64 " s%s (a GPU that "
                                    "does not come up?); the insert was abandoned.",
                                    MODULE_LOAD_TIMEOUT_USEC / USEC_PER_SEC,
                                    res->abandoned ? " and the insert is stuck in the kernel" : "")
                        : strprintf("The process loading the NVIDIA modules %s %d.",
                                    res->signal ? "died with signal" : "exited with status",
                                    res->signal ?: res->exit_status);
        }
        r = module_load_finish(n, j, r, load_message, loaded, &message);
        module_load_job_free(j);
        if (r != STAGE_RUNNING) /* else nvidia-peermem is inserted, and on_peermem_inserted() completes */
                node_stage_complete(n, STAGE_DRIVER, r, message);
}

static int module_load_start(Node *n, const char *dkms_message, bool enforcing, const char *sb,
                             const char *digest, char **ret_message) {
        SpawnOptions o = {
                .timeout_usec = MODULE_LOAD_TIMEOUT_USEC,
                .kill_grace_usec = USEC_PER_SEC,
                .on_exit = on_module_load_exit,
                .userdata = n,
        };
        ModuleLoadJob *j;
        int sv[2], r;

        j = calloc(1, sizeof *j);
        if (!j)
                return -ENOMEM;
        *j = (ModuleLoadJob) { .node = n, .fd = -1, .enforcing = enforcing };
        if ((dkms_message && !(j->dkms_message = strdup(dkms_message))) || (sb && !(j->sb = strdup(sb))) ||
            (digest && !(j->digest = strdup(digest)))) {
                module_load_job_free(j);
                return -ENOMEM;
        }
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
                r = negative_errno();
                module_load_job_free(j);
                return r;
        }
        r = spawn_fork(n->event, sv[1], module_load_child, j, &o, &j->child);
        close(sv[1]);
        j->fd = sv[0];
        if (r >= 0 && fcntl(j->fd, F_SETFL, O_NONBLOCK) < 0)
                r = negative_errno();
        if (r < 0) {
                module_load_job_free(j);
                *ret_message = strprintf("Cannot start loading the NVIDIA modules: %s", strerror(-r));
                return r;
        }
        n->driver_stage->module_load = j;
        node_stage_progress(n, STAGE_DRIVER, "loading the NVIDIA kernel modules");
        return STAGE_RUNNING;
}

static bool core_all_live(Node *n, ModuleContext *ctx) {
        for (size_t i = 0; i < ELEMENTSOF(core_modules); i++)
                if (core_wanted(n->config, &core_modules[i]) && !module_is_usable(ctx, core_modules[i].name))
                        return false;
        return true;
}

/* The rule for an administrator's own `modprobe -r nvidia` (or rmmod): the agent does not fight them.
 * When the core modules this daemon saw live are gone and Unload() did not remove them, the driver,
 * devices and fabric stages hold (as after Unload()) until Reconcile() (`gpunodectl reconcile`),
 * Reload(), a restart of the agent, or until the administrator loads the driver again. Module uevents,
 * retries and other automatic passes do not load it back. STAGE_SKIPPED with a message while held,
 * 0 otherwise. */
static int driver_admin_unload_check(Node *n, char **ret_message) {
        ModuleContext *ctx;
        int r;

        if (!n->driver_was_live && !n->driver_admin_unloaded)
                return 0;
        if (n->unload && !n->driver_admin_unloaded)
                return 0; /* Unload() removed them: its own hold applies */
        r = driver_module_context(n, &ctx);
        if (r < 0)
                return r;
        if (core_all_live(n, ctx)) {
                if (n->driver_admin_unloaded)
                        log_info("The NVIDIA driver was loaded again outside the agent; managing it again.");
                n->driver_admin_unloaded = false;
                return 0;
        }
        if (!n->driver_admin_unloaded) {
                log_notice("The NVIDIA kernel modules were unloaded outside the agent (modprobe -r/rmmod); not "
                           "loading them back until `gpunodectl reconcile`, a reload or a restart of the agent.");
                n->driver_admin_unloaded = true;
        }
        *ret_message = strdup("the NVIDIA driver was unloaded outside the agent (modprobe -r/rmmod) and is left "
                              "unloaded; `gpunodectl reconcile` (Reconcile()), a reload or a restart loads it again");
        return *ret_message ? STAGE_SKIPPED : -ENOMEM;
}

int stage_driver_run(Node *n, char **ret_message) {
        const Config *c = n->config;
        int r;

        if (!n->driver_stage) {
                n->driver_stage = calloc(1, sizeof(DriverStage));
                if (!n->driver_stage)
                        return -ENOMEM;
        }
        /* A build or the inserts in flight finish the stage from their completion handlers. */
        if (n->driver_stage->dkms_run || n->driver_stage->module_load || n->driver_stage->peermem_insert ||
            driver_reload_in_flight(n))
                return STAGE_RUNNING;
        if (!n->dkms_state)
                driver_set_dkms_state(n, "idle");

        if (!n->inventory || n->inventory->n_gpus == 0) {
                driver_publish_rows(n, NULL);
                *ret_message = strdup("no NVIDIA GPU");
                return STAGE_SKIPPED;
        }
        /* Every pass starts from a fresh context: modprobe.d edits, a reload that changed the paths
         * and a new kernel release all take effect, and libkmod's view of the tree is current. */
        n->module_ctx = module_context_free(n->module_ctx);

        r = driver_admin_unload_check(n, ret_message);
        if (r != 0)
                return r;
        if (driver_unload_held(n)) {
                *ret_message = strdup("the driver was unloaded with Unload(); Reconcile() or Reload() loads it again");
                return STAGE_SKIPPED;
        }

        if (!c->driver.enabled) {
                _cleanup_strv_free_ char **rows = NULL;
                ModuleContext *ctx;

                if (driver_module_context(n, &ctx) >= 0 && rows_add_core(&rows, c, ctx) >= 0)
                        driver_publish_rows(n, TAKE_PTR(rows));
                *ret_message = strdup("the kernel modules are not managed (driver.enabled: false)");
                return STAGE_SKIPPED;
        }
        return driver_ensure(n, NULL, ret_message);
}
