/* SPDX-License-Identifier: MIT */
/* Owns the MIG members of org.gpunodeagent.Agent1.Manager (listed in bus-manager.c's vtable): the
 * MigConfig/MigConfigState properties and their change announcements, ApplyMigConfig() — answered when
 * the apply has finished, the one call in flight kept with the bus state — AssertMigConfig() and
 * ExportMigConfig(), and the follow-up after an apply (NVML re-read, a pass for device nodes, CDI and
 * labels). Documented in docs/dbus/org.gpunodeagent.Agent1.Manager.md. */
#include <inttypes.h>
#include <systemd/sd-bus.h>

#include "bus-mig.h"
#include "bus.h"
#include "metrics.h"
#include "driver-unload.h"
#include "label.h"
#include "log.h"
#include "mig-manager.h"
#include "stage-table.h"
#include "strv.h"

static void on_mig_changed(MigManager *mm, void *userdata) {
        Manager *m = userdata;

        manager_bus_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "MigConfig");
        manager_bus_mark_dirty(m, NULL, AGENT_MANAGER_INTERFACE, "MigConfigState");
}

int bus_mig_attach(Manager *m) {
        Node *n = manager_node(m);
        int r;

        if (!n->mig) {
                r = mig_manager_new(n, &n->mig);
                if (r < 0)
                        return r;
        }
        mig_manager_set_changed_callback(n->mig, on_mig_changed, m);
        return 0;
}

int bus_mig_property_get_config(sd_bus *bus, const char *path, const char *interface, const char *property,
                                sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        return sd_bus_message_append(reply, "s", mig_manager_config(n->mig) ?: "");
}

int bus_mig_property_get_config_state(sd_bus *bus, const char *path, const char *interface,
                                      const char *property, sd_bus_message *reply, void *userdata,
                                      sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        return sd_bus_message_append(reply, "s", mig_manager_state(n->mig) ?: "");
}

/* The stages own device nodes, CDI and labels: a pass makes them follow an apply — also when only
 * mig.config/mig.config.state moved, e.g. to "failed". Nothing at all changed: no pass. */
static void follow_up(Manager *m, bool changed, const char *reason) {
        Node *n = manager_node(m);
        if (changed || !n->labels ||
            !streq_ptr(label_set_get(n->labels, "nvidia.com/mig.config"), stage_labels_mig_config(n)) ||
            !streq_ptr(label_set_get(n->labels, "nvidia.com/mig.config.state"), mig_manager_state(n->mig)))
                manager_request_pass(m, reason);
}

static int mig_error(sd_bus_error *error, int r, const char *message, const char *what);

/* -EBUSY: another apply, or compute processes; -ENOENT/-EINVAL: the file, the name or the geometry. */
static int mig_error(sd_bus_error *error, int r, const char *message, const char *what) {
        const char *name;

        if (r == -ENOMEM)
                return r;
        if (r == -EBUSY)
                name = AGENT_ERROR_BUSY;
        else if (r == -ENOENT || r == -EINVAL)
                name = AGENT_ERROR_INVALID_CONFIG;
        else
                name = AGENT_ERROR_FAILED;
        if (message)
                return sd_bus_error_set(error, name, message);
        return sd_bus_error_setf(error, name, "%s: %s", what, strerror(-r));
}

/* "" = mig.config-file. The agent's working directory is /: a relative name would not be the caller's. */
static int check_config_file(const char *file, const char *method, sd_bus_error *error) {
        if (!isempty(file) && file[0] != '/')
                return sd_bus_error_setf(error, AGENT_ERROR_INVALID_CONFIG,
                                         "%s: the config file '%s' is not an absolute path; give the full path, "
                                         "or \"\" for mig.config-file.", method, file);
        return 0;
}

/* The answer to ApplyMigConfig(), once what follows the apply is done. */
typedef struct ApplyAnswer {
        int r;
        bool refused, failed, changed;
        char *config, *state, *message;
} ApplyAnswer;

static void apply_answer(Manager *m, ApplyAnswer *a) {
        Node *n = manager_node(m);
        sd_bus_message **slot = bus_mig_pending_request(m);
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *request = slot ? TAKE_PTR(*slot) : NULL;
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        int r = 0;

        if (!a->refused)
                metrics_count_mig_apply(n, a->state, a->changed);
        follow_up(m, a->changed, a->refused ? "ApplyMigConfig() refused" : "ApplyMigConfig() finished");
        if (request) {
                if (a->refused) {
                        r = mig_error(&error, a->r, a->message, "Cannot apply the MIG config");
                        r = r == -ENOMEM ? sd_bus_reply_method_errno(request, r, NULL)
                                         : sd_bus_reply_method_error(request, &error);
                } else if (a->failed)
                        r = sd_bus_reply_method_errorf(request, AGENT_ERROR_FAILED, "MIG config %s failed: %s",
                                                       a->config, strna(a->message));
                else
                        r = sd_bus_reply_method_return(request, "ss", a->state, strna(a->message));
        }
        /* The caller may have gone (gpunodectl --no-block): the apply is done all the same. */
        if (r < 0)
                log_debug("Could not answer ApplyMigConfig(): %s", strerror(-r));
        free(a->config);
        free(a->state);
        free(a->message);
        free(a);
}

/* After a change the NVML snapshot is re-read (on the MIG reader) before the answer, so that the GPUs'
 * MigDevices are current when the caller gets it. */
static void on_refreshed(Node *n, int r, const char *error, void *userdata) {
        if (r < 0)
                log_warning("Re-reading NVML after the MIG change failed: %s", strna(error));
        apply_answer(manager_from_node(n), userdata);
}

static void on_applied(MigManager *mm, const MigApplyOutcome *o, void *userdata) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        _cleanup_free_ char *error = NULL;
        ApplyAnswer *a = calloc(1, sizeof *a);

        if (!a) {
                log_oom();
                return;
        }
        *a = (ApplyAnswer) { .r = o->error, .refused = o->refused, .failed = streq_ptr(o->state, "failed"),
                             .changed = o->changed, .config = strdup(strna(o->config)),
                             .state = strdup(strna(o->state)), .message = o->message ? strdup(o->message) : NULL };
        if (a->refused)
                log_error("ApplyMigConfig(%s) refused: %s", strna(o->config), strna(o->message));
        if (o->changed && stage_nvml_refresh_async(n, o->changed_gpus, o->mig_devices, on_refreshed, a, &error) >= 0)
                return;
        if (error)
                log_warning("Re-reading NVML after the MIG change failed: %s", error);
        apply_answer(m, a);
}

int bus_mig_method_apply(sd_bus_message *msg, void *userdata, sd_bus_error *error) {
        _cleanup_free_ char *message = NULL;
        Manager *m = userdata;
        Node *n = manager_node(m);
        const char *name, *file;
        sd_bus_message **slot;
        int force, r;

        r = sd_bus_message_read(msg, "ssb", &name, &file, &force);
        if (r < 0)
                return r;
        r = bus_check_privileged(msg, error);
        if (r < 0)
                return r;
        if (isempty(name))
                return sd_bus_error_set(error, AGENT_ERROR_INVALID_CONFIG,
                                        "ApplyMigConfig: no MIG config name given; name one of the configs of the "
                                        "file (mig-configs).");
        r = check_config_file(file, "ApplyMigConfig", error);
        if (r < 0)
                return r;

        /* Until the mig stage ran once, a journal left by a crash may still be waiting to be rolled back: an
         * apply now would overwrite it. */
        if (n->stages[STAGE_MIG].started_usec == 0)
                return sd_bus_error_set(error, AGENT_ERROR_BUSY,
                                        "The agent has not run its mig stage yet (it first checks for an apply a "
                                        "crash interrupted); try again when 'gpunodectl wait-ready' returns.");
        r = bus_mig_attach(m);
        if (r < 0)
                return r;
        slot = bus_mig_pending_request(m);
        if (!slot)
                return -ENOMEM;
        if (*slot || mig_manager_busy(n->mig))
                return sd_bus_error_setf(error, AGENT_ERROR_BUSY,
                                         "A MIG apply (%s) is already running; try again when it has finished.",
                                         mig_manager_config(n->mig) ?: "the selected config");

        log_info("ApplyMigConfig(%s%s%s%s) requested over D-Bus by %s.", name, isempty(file) ? "" : ", ",
                 isempty(file) ? "" : file, force ? ", force" : "", strna(sd_bus_message_get_sender(msg)));
        r = mig_manager_apply(n->mig, name, isempty(file) ? NULL : file, force, on_applied, m, &message);
        if (r < 0) {
                log_error("ApplyMigConfig(%s) refused: %s", name, message ?: strerror(-r));
                follow_up(m, false, "ApplyMigConfig() refused");
                return mig_error(error, r, message, "Cannot apply the MIG config");
        }
        *slot = sd_bus_message_ref(msg);
        return 1;
}

/* Reading a file the caller names, with the agent's privileges, would let anyone read any file through
 * the parser's error messages: only mig.config-file is open to everyone. */
static int check_file_access(Manager *m, sd_bus_message *msg, const char *file, sd_bus_error *error) {
        Node *n = manager_node(m);
        _cleanup_(sd_bus_error_free) sd_bus_error denied = SD_BUS_ERROR_NULL;

        if (isempty(file) || streq_ptr(file, n->config->mig.config_file))
                return 0;
        if (bus_check_privileged(msg, &denied) >= 0)
                return 0;
        return sd_bus_error_setf(error, AGENT_ERROR_ACCESS_DENIED,
                                 "AssertMigConfig with a config file other than mig.config-file (%s) requires root: "
                                 "the agent would read %s with its own privileges. Run it as "
                                 "root, or leave the file out.", strna(n->config->mig.config_file), file);
}

/* AssertMigConfig/ExportMigConfig read the MIG layout through NVML and are open to everyone: an
 * unprivileged caller gets a burst of them per window, so that a local user cannot keep NVML (and, while
 * MIG reads still run in the daemon, the event loop) busy. Root is not limited. */
#define BUS_MIG_UNPRIVILEGED_BURST 5
#define BUS_MIG_UNPRIVILEGED_WINDOW_USEC (5 * USEC_PER_SEC)

static int check_read_rate(Manager *m, sd_bus_message *msg, const char *method, sd_bus_error *error) {
        Node *n = manager_node(m);
        _cleanup_(sd_bus_error_free) sd_bus_error denied = SD_BUS_ERROR_NULL;
        uint64_t now = 0, wait = 0;

        if (bus_check_privileged(msg, &denied) >= 0)
                return 0;
        (void) sd_event_now(n->event, CLOCK_MONOTONIC, &now);
        if (bus_mig_read_budget_take(m, now, BUS_MIG_UNPRIVILEGED_BURST, BUS_MIG_UNPRIVILEGED_WINDOW_USEC, &wait))
                return 0;
        return sd_bus_error_setf(error, AGENT_ERROR_BUSY,
                                 "%s: too many MIG reads by unprivileged callers (%u per %u s, each reads NVML); try "
                                 "again in %" PRIu64 " ms, or call as root.", method, BUS_MIG_UNPRIVILEGED_BURST,
                                 (unsigned) (BUS_MIG_UNPRIVILEGED_WINDOW_USEC / USEC_PER_SEC), wait / USEC_PER_MSEC);
}

/* An asynchronous reply to msg (a reference we hold): the error as mig_error() words it. */
static void reply_error(sd_bus_message *msg, int r, const char *report, const char *what) {
        _cleanup_(sd_bus_error_free) sd_bus_error e = SD_BUS_ERROR_NULL;

        r = mig_error(&e, r, report, what);
        if (sd_bus_error_is_set(&e))
                (void) sd_bus_reply_method_error(msg, &e);
        else
                (void) sd_bus_reply_method_errno(msg, r, NULL);
}

static void on_assert_done(MigManager *mm, int r, const char *report, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *msg = userdata;

        if (r < 0)
                reply_error(msg, r, report, "Cannot check the MIG config");
        else
                (void) sd_bus_reply_method_return(msg, "bs", r > 0, strna(report));
}

static void on_export_done(MigManager *mm, int r, const char *yaml, void *userdata) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *msg = userdata;

        if (r < 0)
                reply_error(msg, r == -EINVAL ? -EIO : r, yaml, "Reading the MIG layout through NVML failed");
        else
                (void) sd_bus_reply_method_return(msg, "s", yaml);
}

int bus_mig_method_assert(sd_bus_message *msg, void *userdata, sd_bus_error *error) {
        _cleanup_free_ char *report = NULL;
        Manager *m = userdata;
        Node *n = manager_node(m);
        const char *name, *file;
        int r;

        r = sd_bus_message_read(msg, "ss", &name, &file);
        if (r < 0)
                return r;
        r = check_config_file(file, "AssertMigConfig", error);
        if (r < 0)
                return r;
        r = check_file_access(m, msg, file, error);
        if (r < 0)
                return r;
        r = check_read_rate(m, msg, "AssertMigConfig", error);
        if (r < 0)
                return r;
        r = bus_mig_attach(m);
        if (r < 0)
                return r;

        if (isempty(name)) {
                const char *selected_file;

                /* The selection, with its own file unless the caller named one. */
                mig_manager_selected(n->mig, &name, &selected_file);
                if (isempty(name))
                        return sd_bus_error_set(error, AGENT_ERROR_INVALID_CONFIG,
                                                "AssertMigConfig: no MIG config name given and none is selected "
                                                "(mig.selected); name the config to check.");
                if (isempty(file))
                        file = selected_file;
        }

        /* The reply comes when the NVML worker has read the GPUs: nothing waits for NVML here. */
        r = mig_manager_assert_async(n->mig, name, isempty(file) ? NULL : file, on_assert_done,
                                     sd_bus_message_ref(msg), &report);
        if (r < 0) {
                sd_bus_message_unref(msg);
                return mig_error(error, r, report, "Cannot check the MIG config");
        }
        return 1;
}

int bus_mig_method_export(sd_bus_message *msg, void *userdata, sd_bus_error *error) {
        _cleanup_free_ char *yaml = NULL;
        Manager *m = userdata;
        Node *n = manager_node(m);
        int r;

        r = check_read_rate(m, msg, "ExportMigConfig", error);
        if (r < 0)
                return r;
        r = bus_mig_attach(m);
        if (r < 0)
                return r;
        r = mig_manager_export_async(n->mig, on_export_done, sd_bus_message_ref(msg), &yaml);
        if (r < 0) {
                sd_bus_message_unref(msg);
                if (r == -ENODEV)
                        return sd_bus_error_set(error, AGENT_ERROR_FAILED, yaml);
                return mig_error(error, r == -EINVAL ? -EIO : r, yaml, "Reading the MIG layout through NVML failed");
        }
        return 1;
}
