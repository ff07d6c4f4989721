/* SPDX-License-Identifier: MIT */
/* Owns the driver stage: makes the NVIDIA kernel modules live for the running kernel (modules/ does
 * the work, this file decides what to do and says it): the fast path when they are live and nothing
 * changed since the last good load, pre-checks and loads in order, a DKMS build when the module for
 * this kernel is missing, stale or of another version (asynchronous: the stage returns STAGE_RUNNING
 * and finishes from the build's completion), the nvidia-peermem rule, the Modules and DkmsState
 * D-Bus rows, and the driver.state record. Also the Manager's libkmod context (driver.h). */
#include <libkmod.h>

#include "bus.h"
#include "driver-state.h"
#include "driver-unload.h"
#include "driver.h"
#include "fileio.h"
#include "log.h"
#include "strv.h"

/* EFI global variable GUID: SecureBoot-<guid> holds 4 attribute bytes, then 1 = enabled. */
#define SECURE_BOOT_EFIVAR "firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"

DEFINE_CLEANUP_FUNC(DriverState *, driver_state_free);

static inline const char *strempty(const char *s) {
        return s ?: "";
}

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

/* ---- shared helpers (driver.h) ---------------------------------------------------------------- */

static void kmod_log(void *userdata, int priority, const char *message) {
        log_debug("libkmod: %s", message);
}

int manager_module_context(Manager *m, ModuleContext **ret) {
        const ConfigPaths *p = &m->config->paths;
        int r;

        if (!m->module_ctx) {
                _cleanup_free_ char *modules_dir = path_join(p->modules, m->kernel_release),
                                    *etc = path_join(p->etc, "modprobe.d"),
                                    *run = path_join(p->root, "run/modprobe.d"),
                                    *lib = path_join(p->root, "lib/modprobe.d"),
                                    *usrlib = path_join(p->root, "usr/lib/modprobe.d"),
                                    *firmware = path_join(p->root, "lib/firmware");
                if (!modules_dir || !etc || !run || !lib || !usrlib || !firmware)
                        return -ENOMEM;
                const char *const config_paths[] = { etc, run, lib, usrlib, NULL };
                const ModuleContextConfig cc = {
                        .modules_dir = modules_dir,
                        .config_paths = config_paths,
                        .sys_dir = p->sys,
                        .firmware_dir = firmware,
                        .kernel_release = m->kernel_release,
                };
                r = module_context_new(&cc, &m->module_ctx);
                if (r < 0)
                        return r;
                /* Formatting libkmod's chatter costs; only ask for it when it is shown. */
                if (log_get_max_level() >= LOG_DEBUG)
                        module_context_set_log(m->module_ctx, kmod_log, m, LOG_DEBUG);
        }
        *ret = m->module_ctx;
        return 0;
}

void driver_dkms_options(const Config *c, DkmsOptions *ret) {
        *ret = (DkmsOptions) {
                .program = c->driver.dkms_program,
                .root = c->paths.root,
                .modules_dir = c->paths.modules,
                .module = isempty(c->driver.dkms_module) ? NULL : c->driver.dkms_module,
                .timeout_usec = c->driver.dkms_timeout_usec,
        };
}

void manager_driver_done(Manager *m) {
        m->dkms_run = dkms_run_free(m->dkms_run);
        m->module_ctx = module_context_free(m->module_ctx);
        m->module_rows = strv_free(m->module_rows);
        m->dkms_state = mfree(m->dkms_state);
}

/* ---- what the stage publishes ------------------------------------------------------------------ */

static void driver_set_dkms_state(Manager *m, const char *state) {
        if (streq_ptr(m->dkms_state, state))
                return;
        free(m->dkms_state);
        m->dkms_state = state ? strdup(state) : NULL;
        manager_bus_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "DkmsState");
}

/* Takes rows over. */
static void driver_publish_rows(Manager *m, char **rows) {
        if (strv_equal(m->module_rows, rows)) {
                strv_free(rows);
                return;
        }
        strv_free(m->module_rows);
        m->module_rows = rows;
        manager_bus_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "Modules");
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

static int driver_record(Manager *m, const char *version, const char *digest) {
        _cleanup_(driver_state_freep) DriverState *s = NULL;
        int r = driver_state_new(m->kernel_release, version, digest, &s);
        if (r >= 0)
                r = driver_state_save(m->config->paths.state, s);
        if (r < 0)
                log_warning_errno(r, "Cannot record the driver load in %s/%s (%s); the next start checks "
                                  "the modules again.", m->config->paths.state, DRIVER_STATE_FILE, strerror(-r));
        return r;
}

/* ---- nvidia-peermem ----------------------------------------------------------------------------- */

/* Loads nvidia-peermem when the rule says so. Never fails the stage: GPUDirect RDMA is optional, so
 * the outcome goes into its row and, when the sysadmin should act, into *ret_note. */
static int driver_peermem(Manager *m, ModuleContext *ctx, char ***rows, char **ret_note) {
        const char *name = "nvidia-peermem";
        _cleanup_free_ char *reason = NULL, *msg = NULL;
        bool has_nic = m->inventory && m->inventory->n_nics > 0;
        int r;

        if (!m->config->driver.peermem)
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

        r = module_load(ctx, name, module_parameters(m->config, DRIVER_MODULE_PEERMEM), &msg);
        if (r < 0) {
                log_warning("%s", strna(msg));
                *ret_note = strprintf("nvidia-peermem (GPUDirect RDMA) is not loaded: %s", strna(msg));
                return rows_add(rows, name, "failed", msg);
        }
        if (r > 0) {
                log_info("Loaded nvidia-peermem (GPUDirect RDMA).");
                *ret_note = strdup("nvidia-peermem loaded");
        }
        return rows_add_status(rows, ctx, name);
}

/* ---- the stage ----------------------------------------------------------------------------------- */

static int driver_ensure(Manager *m, const char *dkms_message, char **ret_message);

static void on_dkms_line(DkmsRun *run, const char *line, void *userdata) {
        log_info("dkms: %s", line);
}

static void on_dkms_progress(DkmsRun *run, const char *status, void *userdata) {
        Manager *m = userdata;

        manager_stage_progress(m, STAGE_DRIVER, status);
        driver_set_dkms_state(m, status);
}

static void on_dkms_done(DkmsRun *run, int error, const char *message, void *userdata) {
        _cleanup_free_ char *state = NULL, *stage_message = NULL;
        Manager *m = userdata;
        int r;

        m->dkms_run = dkms_run_free(run);
        if (error < 0) {
                ModuleContext *ctx;
                _cleanup_strv_free_ char **rows = NULL;

                state = strprintf("failed: %s", strna(message));
                driver_set_dkms_state(m, state ?: "failed");
                if (manager_module_context(m, &ctx) >= 0 && rows_add_core(&rows, m->config, ctx) >= 0)
                        driver_publish_rows(m, TAKE_PTR(rows));
                manager_stage_complete(m, STAGE_DRIVER, error, message);
                return;
        }

        log_info("%s", strna(message));
        state = strprintf("built: %s", strna(message));
        driver_set_dkms_state(m, state ?: "built");
        /* depmod rewrote the module indexes libkmod may have mapped: start from scratch. */
        m->module_ctx = module_context_free(m->module_ctx);
        r = driver_ensure(m, message ?: "", &stage_message);
        manager_stage_complete(m, STAGE_DRIVER, r, stage_message);
}

static int driver_start_dkms(Manager *m, const char *reason, char **ret_message) {
        static const DkmsRunCallbacks cb = {
                .line = on_dkms_line,
                .progress = on_dkms_progress,
                .done = on_dkms_done,
        };
        _cleanup_free_ char *error = NULL;
        DkmsOptions o;
        int r;

        driver_dkms_options(m->config, &o);
        log_info("%s Building it with DKMS (%s %s -k %s).", reason, o.program, o.module ? "install" : "autoinstall",
                 m->kernel_release);
        r = dkms_run_start(m->event, m->kernel_release, &o, &cb, m, &m->dkms_run, &error);
        if (r < 0) {
                _cleanup_free_ char *state = strprintf("failed: %s", strna(error));
                driver_set_dkms_state(m, state ?: "failed");
                *ret_message = strprintf("%s; the build was needed because: %s", strna(error), reason);
                return r;
        }
        return STAGE_RUNNING;
}

/* Everything already live: nothing is loaded; the record says whether anything changed. */
static int driver_live(Manager *m, const char *digest, char **ret_message) {
        _cleanup_(driver_state_freep) DriverState *recorded = NULL, *now = NULL;
        _cleanup_free_ char *version = loaded_driver_version(m->config), *reason = NULL;
        const char *want = m->config->driver.version;
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

        r = driver_state_new(m->kernel_release, version, digest, &now);
        if (r < 0)
                return r;
        r = driver_state_load(m->config->paths.state, &recorded);
        if (r < 0 && r != -ENOENT && r != -EBADMSG)
                log_debug_errno(r, "Cannot read %s/%s: %m", m->config->paths.state, DRIVER_STATE_FILE);
        r = driver_state_compare(recorded, now, &reason);
        if (r < 0)
                return r;
        if (r > 0) {
                *ret_message = strprintf("nvidia %s already loaded for kernel %s, unchanged since the last check",
                                         version, m->kernel_release);
                return 0;
        }

        if (recorded && streq_ptr(recorded->kernel, now->kernel) &&
            streq_ptr(recorded->driver_version, now->driver_version))
                log_notice("The module options changed since nvidia was loaded; they apply at its next load "
                           "(after `gpunodectl driver unload` or a reboot).");
        else
                log_info("nvidia %s is already loaded (%s); recording it.", version, strna(reason));
        (void) driver_record(m, version, digest);
        *ret_message = strprintf("nvidia %s already loaded for kernel %s", version, m->kernel_release);
        return 0;
}

/* Why the module for name cannot be loaded as it is and needs a (re)build: 1 with *ret_reason, 0
 * when it is fine, or a negative errno with *ret_reason for what DKMS cannot fix. */
static int driver_precheck(Manager *m, ModuleContext *ctx, const char *name, bool secure_boot, char **ret_reason) {
        _cleanup_module_info_free_ ModuleInfo *info = NULL;
        const char *want = m->config->driver.version;
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
        r = module_check_firmware(ctx, info, ret_reason);
        if (r < 0)
                return r;
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

static int driver_ensure(Manager *m, const char *dkms_message, char **ret_message) {
        _cleanup_strv_free_ char **rows = NULL, **loaded = NULL;
        _cleanup_free_ char *digest = NULL, *note = NULL, *sb = NULL, *version = NULL, *build_reason = NULL,
                            *message = NULL;
        const Config *c = m->config;
        ModuleContext *ctx;
        bool all_live = true, enforcing = false;
        int r;

        r = manager_module_context(m, &ctx);
        if (r < 0)
                return r;
        r = options_digest(c, ctx, &digest);
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(core_modules); i++)
                if (core_wanted(c, &core_modules[i]) && !module_is_usable(ctx, core_modules[i].name))
                        all_live = false;

        /* The fast path (Debian loads nvidia at boot): nothing is loaded or looked up; only the
         * peermem rule is checked, since ib_core coming back is what starts such a pass. */
        if (all_live) {
                r = driver_live(m, digest, &message);
                if (r < 0) {
                        *ret_message = TAKE_PTR(message);
                        return r;
                }
                r = rows_add_core(&rows, c, ctx);
                if (r >= 0)
                        r = driver_peermem(m, ctx, &rows, &note);
                if (r < 0)
                        return r;
                driver_publish_rows(m, TAKE_PTR(rows));
                *ret_message = note ? strprintf("%s; %s", message, note) : TAKE_PTR(message);
                return STAGE_DONE;
        }

        sb = secure_boot_summary(c, &enforcing);
        log_info("Loading the NVIDIA driver for kernel %s (%s).", m->kernel_release, strna(sb));

        for (size_t i = 0; i < ELEMENTSOF(core_modules) && !build_reason; i++) {
                const char *name = core_modules[i].name;
                _cleanup_free_ char *reason = NULL;

                if (!core_wanted(c, &core_modules[i]) || module_is_usable(ctx, name))
                        continue;
                r = driver_precheck(m, ctx, name, enforcing, &reason);
                if (r < 0) {
                        if (rows_add_core(&rows, c, ctx) >= 0)
                                driver_publish_rows(m, TAKE_PTR(rows));
                        *ret_message = TAKE_PTR(reason);
                        return r;
                }
                if (r > 0)
                        build_reason = TAKE_PTR(reason);
        }
        if (build_reason) {
                if (rows_add_core(&rows, c, ctx) >= 0)
                        driver_publish_rows(m, TAKE_PTR(rows));
                if (dkms_message) {
                        *ret_message = strprintf("DKMS finished (%s) but the module is still not usable: %s",
                                                 dkms_message, build_reason);
                        return -ENOENT;
                }
                if (!c->driver.dkms_enabled) {
                        *ret_message = strprintf("%s DKMS rebuilds are off (driver.dkms.enabled: false): install "
                                                 "the NVIDIA module for kernel %s yourself.",
                                                 build_reason, m->kernel_release);
                        return -ENOENT;
                }
                return driver_start_dkms(m, build_reason, ret_message);
        }

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
                        if (rows_add_core(&rows, c, ctx) >= 0)
                                driver_publish_rows(m, TAKE_PTR(rows));
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

        version = loaded_driver_version(c);
        if (!version)
                return -ENOMEM;
        (void) driver_record(m, version, digest);
        r = rows_add_core(&rows, c, ctx);
        if (r >= 0)
                r = driver_peermem(m, ctx, &rows, &note);
        if (r < 0)
                return r;
        driver_publish_rows(m, TAKE_PTR(rows));

        message = strv_join(loaded, ", ");
        if (!message)
                return -ENOMEM;
        *ret_message = strprintf("%s%s%sloaded %s (driver %s) for kernel %s%s%s%s%s",
                                 dkms_message ? "built with DKMS (" : "", strempty(dkms_message),
                                 dkms_message ? "), " : "", isempty(message) ? "nothing new" : message, version,
                                 m->kernel_release, enforcing ? "; " : "", enforcing ? strna(sb) : "",
                                 note ? "; " : "", strempty(note));
        return *ret_message ? STAGE_DONE : -ENOMEM;
}

int stage_driver_run(Manager *m, char **ret_message) {
        const Config *c = m->config;

        /* A build in flight finishes the stage from its completion handler. */
        if (m->dkms_run)
                return STAGE_RUNNING;
        if (!m->dkms_state)
                driver_set_dkms_state(m, "idle");

        if (!m->inventory || m->inventory->n_gpus == 0) {
                driver_publish_rows(m, NULL);
                *ret_message = strdup("no NVIDIA GPU");
                return STAGE_SKIPPED;
        }
        if (manager_driver_unload_held(m)) {
                *ret_message = strdup("the driver was unloaded with Unload(); Reconcile() or Reload() loads it again");
                return STAGE_SKIPPED;
        }

        /* Every pass starts from a fresh context: modprobe.d edits, a reload that changed the paths
         * and a new kernel release all take effect, and libkmod's view of the tree is current. */
        m->module_ctx = module_context_free(m->module_ctx);

        if (!c->driver.enabled) {
                _cleanup_strv_free_ char **rows = NULL;
                ModuleContext *ctx;

                if (manager_module_context(m, &ctx) >= 0 && rows_add_core(&rows, c, ctx) >= 0)
                        driver_publish_rows(m, TAKE_PTR(rows));
                *ret_message = strdup("the kernel modules are not managed (driver.enabled: false)");
                return STAGE_SKIPPED;
        }
        return driver_ensure(m, NULL, ret_message);
}
