/* SPDX-License-Identifier: MIT */
/* Owns Unload(): taking the NVIDIA driver out of the kernel for a driver upgrade, as specs/driver.md
 * "Unload" says. First the units the fabric stage started are stopped (nvidia-persistenced keeps the
 * GPU open), one after the other on the event loop; then the NVML workers are killed (their handles
 * hold /dev/nvidia*), the holders are collected — processes with a /dev/nvidia* node open and modules
 * holding nvidia other than the driver's own — and either the call is refused with that list, or the
 * modules are removed holders first, never forced, in a child process (module-child.h: a module's exit
 * runs in the kernel and may take long); the stages stay away meanwhile ("held"). Afterwards the driver, devices and fabric stages keep their hands off ("held") until
 * Reconcile(), Reload() or a restart: a device event must not load the old driver again in the middle
 * of an upgrade. The method call is answered when all that is done. */
#include <unistd.h>

#include "driver-release.h"
#include "driver-unload.h"
#include "driver-modules.h"
#include "fabric.h"
#include "gpu-holders.h"
#include "log.h"
#include "mig-manager.h"
#include "module-child.h"
#include "module.h"
#include "strv.h"

typedef struct DriverUnload {
        Node *node;
        sd_bus_message *request; /* the Unload() call to answer; NULL when not running */
        FabricOp *op;            /* the unit stop in flight */
        char **to_stop;          /* units still to stop, in stop order */
        char **stopped;
        bool held;               /* the driver is (being) unloaded: the stages leave it alone */
        DriverRelease *release;  /* waiting for our NVML processes to let go of the GPU (driver-release.h) */
        ModuleChild *child;      /* the removals in flight (module-child.h) */
        char **loaded;           /* which of ours were loaded when they started */
} DriverUnload;

static const char *const unload_modules[] = { DRIVER_UNLOAD_MODULES, NULL };

static DriverUnload *driver_unload_free(DriverUnload *u) {
        if (!u)
                return NULL;
        fabric_op_free(u->op);
        driver_release_free(u->release);
        module_child_free(u->child);
        strv_free(u->loaded);
        sd_bus_message_unref(u->request);
        strv_free(u->to_stop);
        strv_free(u->stopped);
        return mfree(u);
}

bool driver_unload_held(const Node *n) {
        return (n->unload && n->unload->held) || n->driver_admin_unloaded;
}

void driver_unload_release(Node *n) {
        /* Reconcile()/Reload() also end the hold after an administrator's own `modprobe -r nvidia`
         * (stage-driver.c), and start the driver's bookkeeping afresh. */
        if (n->driver_admin_unloaded)
                log_info("Hold after the driver was unloaded outside the agent released: the driver stage may "
                         "load it again.");
        n->driver_admin_unloaded = false;
        n->driver_was_live = false;
        if (!n->unload || n->unload->request)
                return;
        log_info("Driver hold after Unload() released: the driver stage may load the driver again.");
        n->unload = driver_unload_free(n->unload);
}

void driver_unload_stop(Node *n) {
        n->unload = driver_unload_free(n->unload);
}

/* Answers the call with an error and lets the stages bring back what was stopped. */
static void unload_fail(DriverUnload *u, const char *name, const char *message) {
        Node *n = u->node;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;

        /* A refusal is the method working as intended; a failure is not. */
        if (streq(name, AGENT_ERROR_BUSY))
                log_warning("Unload() refused: %s", message);
        else
                log_error("Unload() failed: %s", message);
        (void) sd_bus_error_set(&error, name, message);
        if (sd_bus_reply_method_error(u->request, &error) < 0)
                log_debug("Could not send the Unload() error reply (the caller left?).");
        n->unload = driver_unload_free(u);
        node_request_pass(n, "Unload() did not complete");
}

/* The Modules rows describe states that just changed. */
static void unload_refresh_module_rows(Node *n, ModuleContext *ctx) {
        _cleanup_strv_free_ char **rows = NULL;

        STRV_FOREACH(row, n->module_rows) {
                _cleanup_free_ char *name = strndup(*row, strcspn(*row, "\t"));
                ModuleStatus st = {};

                if (!name || module_status(ctx, name, &st) < 0 ||
                    strv_extendf(&rows, "%s\t%s\t%s", st.name, module_state_to_string(st.state) ?: "",
                                 st.detail ?: "") < 0) {
                        module_status_done(&st);
                        return (void) log_oom();
                }
                module_status_done(&st);
        }
        strv_free(n->module_rows);
        n->module_rows = TAKE_PTR(rows);
        node_mark_dirty(n, NULL, AGENT_MANAGER_INTERFACE, "Modules");
}

static void unload_reply(DriverUnload *u, char **removed) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        int r;

        r = sd_bus_message_new_method_return(u->request, &reply);
        if (r >= 0)
                r = sd_bus_message_append_strv(reply, u->stopped);
        if (r >= 0)
                r = sd_bus_message_append_strv(reply, removed);
        if (r >= 0)
                r = sd_bus_send(NULL, reply, NULL);
        if (r < 0)
                log_debug("Could not send the Unload() reply: %s", strerror(-r));
}

/* Drops what NVML said: it is closed, and the driver it described is going away. */
static void unload_forget_nvml(Node *n) {
        NvmlSnapshot *old;

        /* First: an nvml stage waiting for the worker drops the snapshot itself. */
        node_nvml_stop(n, "NVML was closed for Unload(): the driver is being removed");
        old = n->nvml_snapshot;
        if (!old)
                return;
        n->nvml_snapshot = NULL;
        node_nvml_changed(n, old);
        gpu_nvml_snapshot_free(old);
}

/* Whether a module holding nvidia is one we remove anyway (as the kernel names it: '_'). */
static bool unload_is_ours(const char *module) {
        for (size_t i = 0; unload_modules[i]; i++) {
                const char *a = unload_modules[i], *b = module;
                for (; *a && *b; a++, b++)
                        if (*a != *b && !((*a == '-' || *a == '_') && (*b == '-' || *b == '_')))
                                break;
                if (!*a && !*b)
                        return true;
        }
        return false;
}

#define UNLOAD_TIMEOUT_USEC (5 * 60 * USEC_PER_SEC)

/* In the child: the removals, holders first, never forced. */
static int unload_child(Node *n, void *userdata, char **ret_message, char ***ret_names) {
        ModuleContext *ctx;
        int r;

        r = driver_module_context(n, &ctx);
        if (r < 0)
                return r;
        return module_unload(ctx, (char *const *) unload_modules, ret_message);
}

static void on_unloaded(Node *n, int r, const char *message, char **names, void *userdata) {
        DriverUnload *u = userdata;
        _cleanup_strv_free_ char **removed = NULL;
        ModuleContext *ctx = NULL;

        u->child = NULL;
        /* The removals happened in the child; module states are read from the kernel (sysfs) each time. */
        if (driver_module_context(n, &ctx) >= 0)
                unload_refresh_module_rows(n, ctx);
        if (r < 0)
                return unload_fail(u, r == -EBUSY || r == -EAGAIN ? AGENT_ERROR_BUSY : AGENT_ERROR_UNLOAD_FAILED,
                                   message ?: strerror(-r));
        STRV_FOREACH(name, u->loaded)
                if (ctx && module_get_state(ctx, *name) == MODULE_STATE_ABSENT && strv_extend(&removed, *name) < 0)
                        return unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, "Out of memory.");
        _cleanup_free_ char *units = strv_join(u->stopped, ", "), *mods = strv_join(removed, ", ");
        log_info("Unload() done: stopped %s; removed %s. The driver stays unloaded until Reconcile() or Reload().",
                 isempty(units) ? "no units" : units, isempty(mods) ? "no modules (none was loaded)" : mods);
        unload_forget_nvml(n);
        unload_reply(u, removed);
        u->request = sd_bus_message_unref(u->request);
        /* A pass that skips the held stages: the node is now degraded (not ready, and so labelled), the
         * ready file goes, and the labels fall back to the PCI set. */
        node_request_pass(n, "Unload() done");
}

static void unload_modules_now(DriverUnload *u) {
        Node *n = u->node;
        _cleanup_(gpu_holders_done) GpuHolders holders = {};
        _cleanup_strv_free_ char **others = NULL;
        _cleanup_free_ char *message = NULL;
        ModuleContext *ctx = NULL;
        int r;

        /* Our NVML processes have let go (on_released()); a stage that opened NVML again would hold the GPU
         * once more, which the hold (u->held) prevents until the removals are done. One of ours that
         * did not let go within 5 s is named below with the others. */
        r = gpu_holders_collect(n->config->paths.proc, n->config->paths.sys, n->config->paths.dev, getpid(),
                                &holders);
        if (r < 0) {
                message = strprintf("Cannot find out what holds the GPU (under %s and %s): %s", n->config->paths.proc,
                                    n->config->paths.sys, strerror(-r));
                return unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, message ?: "Out of memory.");
        }
        STRV_FOREACH(h, holders.modules)
                if (!unload_is_ours(*h) && strv_extend(&others, *h) < 0)
                        return unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, "Out of memory.");
        strv_free(holders.modules);
        holders.modules = TAKE_PTR(others);
        if (gpu_holders_busy(&holders)) {
                message = gpu_holders_to_string(&holders);
                return unload_fail(u, AGENT_ERROR_BUSY, message ?: "The GPU is in use.");
        }

        r = driver_module_context(n, &ctx);
        if (r < 0) {
                message = strprintf("Cannot open the kernel module database for %s: %s", strna(n->kernel_release),
                                    strerror(-r));
                return unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, message ?: "Out of memory.");
        }
        u->loaded = strv_free(u->loaded);
        for (size_t i = 0; unload_modules[i]; i++) {
                int s = module_get_state(ctx, unload_modules[i]);
                if ((s == MODULE_STATE_LIVE || s == MODULE_STATE_COMING || s == MODULE_STATE_GOING) &&
                    strv_extend(&u->loaded, unload_modules[i]) < 0)
                        return unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, "Out of memory.");
        }
        /* delete_module() runs the module's exit in the kernel (nvidia's tears down every GPU): in a child,
         * off the loop. The stages stay away meanwhile (held). */
        r = module_child_start(n, n->event, "removing the NVIDIA modules", UNLOAD_TIMEOUT_USEC, unload_child, NULL,
                               on_unloaded, u, NULL, &u->child);
        if (r < 0) {
                message = strprintf("Cannot start removing the NVIDIA modules: %s", strerror(-r));
                return unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, message ?: "Out of memory.");
        }
}

static void unload_next(DriverUnload *u);

static void on_unit_stopped(FabricOp *op, int r, const char *message, void *userdata) {
        DriverUnload *u = userdata;
        Node *n = u->node;
        _cleanup_free_ char *unit = u->to_stop[0], *text = NULL;

        /* message may live in op: use it before op goes. */
        if (r < 0)
                text = strprintf("Cannot stop %s: %s", unit, strna(message));
        u->op = fabric_op_free(op);
        memmove(u->to_stop, u->to_stop + 1, strv_length(u->to_stop) * sizeof(char *));
        if (r < 0)
                return unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, text ?: "Out of memory.");
        log_info("Stopped %s for Unload().", unit);
        /* Stopped now: the fabric stage starts it again (and records it) when the driver comes back. */
        char **l = n->started_units;
        for (size_t i = 0; l && l[i]; i++)
                if (streq(l[i], unit)) {
                        free(l[i]);
                        memmove(l + i, l + i + 1, strv_length(l + i + 1) * sizeof(char *) + sizeof(char *));
                        break;
                }
        if (strv_extend(&u->stopped, unit) < 0)
                return unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, "Out of memory.");
        unload_next(u);
}

static void on_released(Node *n, void *userdata) {
        DriverUnload *u = userdata;

        u->release = driver_release_free(u->release);
        unload_modules_now(u);
}

static void unload_next(DriverUnload *u) {
        Node *n = u->node;
        _cleanup_free_ char *text = NULL;
        int r;

        if (!u->to_stop || !u->to_stop[0]) {
                /* The NVML worker's, the MIG reader's and the health event worker's library handles keep
                 * /dev/nvidia* open: they are stopped and watched until they let go, from the loop. */
                r = driver_release_start(n, "NVML was closed for Unload(): the driver is being removed", on_released,
                                         u, &u->release);
                if (r < 0) {
                        text = strprintf("Cannot stop our NVML processes: %s", strerror(-r));
                        unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, text ?: "Out of memory.");
                }
                return;
        }

        r = fabric_unit_stop(n->bus, u->to_stop[0], n->config->fabric.timeout_usec, on_unit_stopped, u, &u->op);
        if (r < 0) {
                text = strprintf("Cannot stop %s: %s", u->to_stop[0], strerror(-r));
                unload_fail(u, AGENT_ERROR_UNLOAD_FAILED, text ?: "Out of memory.");
        }
}

int driver_unload_request(Node *n, sd_bus_message *request, sd_bus_error *error) {
        DriverUnload *u;
        size_t n_units;

        if (n->unload && n->unload->request)
                return sd_bus_error_set(error, AGENT_ERROR_BUSY, "Another Unload() is running; wait for it to finish.");
        /* These stages may be loading the driver (a DKMS build can take minutes) or starting its
         * daemons; pulling it out from under them would leave a half-done state behind. */
        if (n->mig && mig_manager_busy(n->mig))
                return sd_bus_error_set(error, AGENT_ERROR_BUSY,
                                        "A MIG configuration is being applied; retry Unload() when it finished "
                                        "(watch the MigConfigState property).");
        if (n->current_stage == STAGE_DRIVER || n->current_stage == STAGE_DEVICES || n->current_stage == STAGE_FABRIC)
                return sd_bus_error_setf(error, AGENT_ERROR_BUSY,
                                         "The agent is running the %s stage; retry Unload() when it finished "
                                         "(gpunodectl wait-ready, or watch the Stage property).",
                                         stage_to_string(n->current_stage));

        if (!n->unload) {
                n->unload = calloc(1, sizeof(DriverUnload));
                if (!n->unload)
                        return -ENOMEM;
        }
        u = n->unload;
        u->node = n;
        u->held = true;
        u->stopped = strv_free(u->stopped);
        /* Stopped in the reverse order of their start. */
        n_units = strv_length(n->started_units);
        u->to_stop = strv_free(u->to_stop);
        for (size_t i = n_units; i > 0; i--)
                if (strv_extend(&u->to_stop, n->started_units[i - 1]) < 0) {
                        n->unload = driver_unload_free(u);
                        return -ENOMEM;
                }
        u->request = sd_bus_message_ref(request);

        log_info("Unload() requested by %s: stopping %zu unit%s, then removing the driver's modules.",
                 strna(sd_bus_message_get_sender(request)), n_units, n_units == 1 ? "" : "s");
        /* The NVML worker holds /dev/nvidia* open like any other client: killed first, so that it is gone
         * (reaped from the loop) by the time the holders are looked at, after the units stopped. */
        node_nvml_stop(n, "NVML was closed for Unload(): the driver is being removed");
        unload_next(u);
        return 1;
}
