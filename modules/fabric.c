/* SPDX-License-Identifier: MIT */
/* Owns the asynchronous systemd unit operations of fabric.h. Each FabricOp is one small state
 * machine driven by method replies, the Manager's JobRemoved signal, the unit's PropertiesChanged
 * signal and one timer; op_finish() is its only exit and disconnects all of them before the
 * callback runs, so a callback may free the op. */
#include <ctype.h>
#include <stdarg.h>
#include <time.h>
#include <systemd/sd-event.h>

#include "event-util.h"
#include "fabric.h"
#include "macro.h"
#include "strv.h"

#define SD_DEST "org.freedesktop.systemd1"
#define SD_PATH "/org/freedesktop/systemd1"
#define SD_MANAGER "org.freedesktop.systemd1.Manager"
#define SD_UNIT "org.freedesktop.systemd1.Unit"

#define FABRIC_MANAGER_FAILED                                                                          \
        "nvidia-fabricmanager failed: GPUs on an NVSwitch system are unusable until it runs; see "     \
        "journalctl -u nvidia-fabricmanager"

typedef enum OpType {
        OP_QUERY,
        OP_START,
        OP_STOP,
        OP_WATCH,
} OpType;

struct FabricOp {
        OpType type;
        sd_bus *bus;
        char *unit;
        char *unit_path;
        char *job;
        char **early_jobs;        /* (job path, result) pairs seen for our unit before StartUnit replied */
        FabricStartOptions opts;
        bool fabric_manager;
        bool done;
        bool watching;            /* start: the job is done, the watch window runs */
        bool was_active;          /* watch: the state last reported */
        uint64_t job_done_usec;

        char *load_state, *active_state, *sub_state;

        sd_bus_slot *call_slot;
        sd_bus_slot *job_slot;
        sd_bus_slot *props_slot;
        sd_event_source *timer;

        FabricDoneFunc done_cb;
        FabricQueryFunc query_cb;
        void *userdata;
};

static uint64_t now_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + (uint64_t) ts.tv_nsec / 1000;
}

static void op_disconnect(FabricOp *op) {
        op->call_slot = sd_bus_slot_unref(op->call_slot);
        op->job_slot = sd_bus_slot_unref(op->job_slot);
        op->props_slot = sd_bus_slot_unref(op->props_slot);
        op->timer = sd_event_source_disable_unref(op->timer);
}

FabricOp *fabric_op_free(FabricOp *op) {
        if (!op)
                return NULL;
        op_disconnect(op);
        sd_bus_unref(op->bus);
        free(op->unit);
        free(op->unit_path);
        free(op->job);
        strv_free(op->early_jobs);
        free(op->load_state);
        free(op->active_state);
        free(op->sub_state);
        return mfree(op);
}
DEFINE_CLEANUP_FUNC(FabricOp *, fabric_op_free);

const char *fabric_op_unit(const FabricOp *op) {
        return op ? op->unit : NULL;
}

static const char *verb(const FabricOp *op) {
        return op->type == OP_STOP ? "stop" : op->type == OP_START ? "start" : "look up";
}

/* The op's only exit: everything is disconnected before the callback, which may free op. */
static void op_finish(FabricOp *op, int r, const char *message) {
        _cleanup_free_ char *fm = NULL;

        if (op->done)
                return;
        op->done = true;
        op_disconnect(op);

        if (op->fabric_manager && r < 0) {
                fm = strprintf(FABRIC_MANAGER_FAILED " (%s)", strna(message));
                if (fm)
                        message = fm;
        }
        if (op->query_cb) {
                FabricUnitInfo info = {
                        .unit = op->unit,
                        .installed = !streq_ptr(op->load_state, "not-found"),
                        .load_state = op->load_state,
                        .active_state = op->active_state,
                        .sub_state = op->sub_state,
                };
                op->query_cb(op, r, r < 0 ? NULL : &info, message, op->userdata);
        } else
                op->done_cb(op, r, message, op->userdata);
}

static void op_finishf(FabricOp *op, int r, const char *fmt, ...) _printf_(3, 4);
static void op_finishf(FabricOp *op, int r, const char *fmt, ...) {
        _cleanup_free_ char *s = NULL;
        va_list ap;

        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                s = NULL;
        va_end(ap);
        op_finish(op, r, s ?: "Out of memory.");
}

static int bus_error_errno(const sd_bus_error *e) {
        int r = sd_bus_error_get_errno(e);
        return r > 0 ? -r : -EIO;
}

static void finish_bus_error(FabricOp *op, const sd_bus_error *e) {
        op_finishf(op, bus_error_errno(e), "Cannot %s %s: %s.", verb(op), op->unit,
                   e && e->message ? e->message : "unknown D-Bus error");
}

static bool state_dead(const FabricOp *op) {
        return streq_ptr(op->active_state, "failed") || streq_ptr(op->active_state, "inactive") ||
               streq_ptr(op->active_state, "deactivating") || streq_ptr(op->sub_state, "auto-restart");
}

static int replace_str(char **p, const char *v) {
        char *c = strdup(v);
        if (!c)
                return -ENOMEM;
        free(*p);
        *p = c;
        return 0;
}

/* Reads an a{sv} of Unit properties (GetAll's reply, PropertiesChanged's changes), keeping
 * LoadState/ActiveState/SubState and skipping the rest. */
static int read_unit_props(FabricOp *op, sd_bus_message *m) {
        int r = sd_bus_message_enter_container(m, 'a', "{sv}");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_enter_container(m, 'e', "sv")) > 0) {
                const char *name, *value;
                r = sd_bus_message_read(m, "s", &name);
                if (r < 0)
                        return r;
                char **target = streq(name, "LoadState") ? &op->load_state :
                                streq(name, "ActiveState") ? &op->active_state :
                                streq(name, "SubState") ? &op->sub_state : NULL;
                if (target) {
                        r = sd_bus_message_read(m, "v", "s", &value);
                        if (r >= 0)
                                r = replace_str(target, value);
                } else
                        r = sd_bus_message_skip(m, "v");
                if (r < 0)
                        return r;
                r = sd_bus_message_exit_container(m);
                if (r < 0)
                        return r;
        }
        if (r < 0)
                return r;
        return sd_bus_message_exit_container(m);
}

static void check_started_unit(FabricOp *op);
static void watch_evaluate(FabricOp *op);

static int request_state(FabricOp *op, sd_bus_message_handler_t handler) {
        op->call_slot = sd_bus_slot_unref(op->call_slot);
        return sd_bus_call_method_async(op->bus, &op->call_slot, SD_DEST, op->unit_path, "org.freedesktop.DBus.Properties",
                                        "GetAll", handler, op, "s", SD_UNIT);
}

static int on_state_refreshed(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        FabricOp *op = userdata;

        op->call_slot = sd_bus_slot_unref(op->call_slot);
        if (sd_bus_message_is_method_error(m, NULL) || read_unit_props(op, m) < 0) {
                if (op->type != OP_WATCH)
                        finish_bus_error(op, sd_bus_message_get_error(m));
                return 0;
        }
        if (op->type == OP_START)
                check_started_unit(op);
        else if (op->type == OP_WATCH)
                watch_evaluate(op);
        return 0;
}

static int on_properties_changed(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        FabricOp *op = userdata;
        const char *iface;
        bool refetch = false;

        if (sd_bus_message_read(m, "s", &iface) < 0 || !streq(iface, SD_UNIT))
                return 0;
        if (read_unit_props(op, m) < 0)
                return 0;
        /* systemd may list a property as invalidated instead of sending its value. */
        if (sd_bus_message_enter_container(m, 'a', "s") > 0) {
                const char *name;
                while (sd_bus_message_read(m, "s", &name) > 0)
                        if (streq(name, "ActiveState") || streq(name, "SubState"))
                                refetch = true;
                (void) sd_bus_message_exit_container(m);
        }
        if (refetch) {
                if (request_state(op, on_state_refreshed) < 0 && op->type != OP_WATCH)
                        op_finish(op, -ENOMEM, "Out of memory.");
                return 0;
        }
        if (op->type == OP_START && op->watching)
                check_started_unit(op);
        else if (op->type == OP_WATCH)
                watch_evaluate(op);
        return 0;
}

/* In the watch window after a start: a unit that is no longer active has died. */
static void check_started_unit(FabricOp *op) {
        if (!op->watching || !state_dead(op))
                return;
        double after = (double) (now_usec() - op->job_done_usec) / (double) USEC_PER_SEC;
        op_finishf(op, -EIO, "%s stopped %.1f s after it started (ActiveState=%s, SubState=%s); see journalctl -u %s",
                   op->unit, after, strna(op->active_state), strna(op->sub_state), op->unit);
}

static void watch_evaluate(FabricOp *op) {
        bool active = streq_ptr(op->active_state, "active") || streq_ptr(op->active_state, "reloading");

        if (!active && state_dead(op) && op->was_active) {
                op->was_active = false;
                _cleanup_free_ char *msg = strprintf("%s stopped (ActiveState=%s, SubState=%s); see journalctl -u %s",
                                                     op->unit, strna(op->active_state), strna(op->sub_state), op->unit);
                op->done_cb(op, -EIO, msg ?: "Out of memory.", op->userdata);
        } else if (active && !op->was_active) {
                op->was_active = true;
                op->done_cb(op, 0, NULL, op->userdata);
        }
}

static int on_timer(sd_event_source *s, uint64_t usec, void *userdata) {
        FabricOp *op = userdata;

        if (op->watching) {
                op_finish(op, 0, NULL); /* survived the watch window */
                return 0;
        }
        op_finishf(op, -ETIMEDOUT, "Timed out after %g s waiting for systemd to %s %s; see systemctl status %s",
                   (double) op->opts.timeout_usec / (double) USEC_PER_SEC, verb(op), op->unit, op->unit);
        return 0;
}

static int arm_timer(FabricOp *op, uint64_t usec) {
        sd_event *e = sd_bus_get_event(op->bus);

        if (!e) {
                op->timer = sd_event_source_disable_unref(op->timer);
                return -ENXIO;
        }
        return event_reset_time_relative(e, &op->timer, CLOCK_MONOTONIC, usec, 0, on_timer, op,
                                         "fabric-timer");
}

static void job_finished(FabricOp *op, const char *result) {
        int r;

        if (!streq(result, "done")) {
                r = streq(result, "canceled") ? -ECANCELED : streq(result, "timeout") ? -ETIMEDOUT :
                    streq(result, "dependency") ? -ENOLINK : -EIO;
                op_finishf(op, r, "Failed to %s %s: the %s job ended with result '%s'%s; see journalctl -u %s",
                           verb(op), op->unit, verb(op), result,
                           streq(result, "dependency") ? " (a unit it needs failed)" : "", op->unit);
                return;
        }
        if (op->type != OP_START || op->opts.watch_usec == 0) {
                op_finish(op, 0, NULL);
                return;
        }
        op->watching = true;
        op->job_done_usec = now_usec();
        r = arm_timer(op, op->opts.watch_usec);
        if (r >= 0)
                r = request_state(op, on_state_refreshed);
        if (r < 0)
                op_finishf(op, r, "Cannot watch %s after starting it: %s", op->unit, strerror(-r));
}

static int on_job_removed(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        FabricOp *op = userdata;
        const char *job, *unit, *result;
        uint32_t id;

        if (sd_bus_message_read(m, "uoss", &id, &job, &unit, &result) < 0)
                return 0;
        if (op->job) {
                if (streq(job, op->job))
                        job_finished(op, result);
        } else if (streq(unit, op->unit)) {
                /* Our job may end before StartUnit's reply is dispatched; keep the result. */
                if (strv_extend(&op->early_jobs, job) < 0 || strv_extend(&op->early_jobs, result) < 0)
                        op_finish(op, -ENOMEM, "Out of memory.");
        }
        return 0;
}

static int on_job_queued(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        FabricOp *op = userdata;
        const char *job;

        op->call_slot = sd_bus_slot_unref(op->call_slot);
        if (sd_bus_message_is_method_error(m, NULL)) {
                const sd_bus_error *e = sd_bus_message_get_error(m);
                if (op->type == OP_STOP && sd_bus_error_has_name(e, "org.freedesktop.systemd1.NoSuchUnit"))
                        op_finishf(op, 0, "%s is not loaded; nothing to stop", op->unit);
                else
                        finish_bus_error(op, e);
                return 0;
        }
        if (sd_bus_message_read(m, "o", &job) < 0 || !(op->job = strdup(job))) {
                op_finish(op, -ENOMEM, "Out of memory.");
                return 0;
        }
        for (size_t i = 0; op->early_jobs && op->early_jobs[i] && op->early_jobs[i + 1]; i += 2)
                if (streq(op->early_jobs[i], op->job)) {
                        job_finished(op, op->early_jobs[i + 1]);
                        return 0;
                }
        return 0;
}

static int on_unit_state(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        FabricOp *op = userdata;
        int r;

        op->call_slot = sd_bus_slot_unref(op->call_slot);
        if (sd_bus_message_is_method_error(m, NULL)) {
                finish_bus_error(op, sd_bus_message_get_error(m));
                return 0;
        }
        r = read_unit_props(op, m);
        if (r < 0) {
                op_finishf(op, r, "Cannot %s %s: systemd's reply about the unit could not be read: %s", verb(op),
                           op->unit, strerror(-r));
                return 0;
        }

        switch (op->type) {
        case OP_QUERY:
                op_finish(op, 0, NULL);
                return 0;
        case OP_WATCH:
                op->was_active = streq_ptr(op->active_state, "active") || streq_ptr(op->active_state, "reloading");
                return 0;
        case OP_START:
                if (streq_ptr(op->load_state, "not-found")) {
                        if (op->opts.require_installed)
                                op_finishf(op, -ENOENT, "%s is not installed (LoadState=not-found)%s", op->unit,
                                           op->fabric_manager ? "; install the nvidia-fabricmanager package of the "
                                                                "driver's version" : "");
                        else
                                op_finishf(op, 0, "%s is not installed; not started", op->unit);
                        return 0;
                }
                if (streq_ptr(op->load_state, "masked")) {
                        op_finishf(op, -ERFKILL, "%s is masked; unmask it with systemctl unmask %s", op->unit, op->unit);
                        return 0;
                }
                break;
        case OP_STOP:
                if (streq_ptr(op->load_state, "not-found")) {
                        op_finishf(op, 0, "%s is not installed; nothing to stop", op->unit);
                        return 0;
                }
                break;
        }

        r = sd_bus_call_method_async(op->bus, &op->call_slot, SD_DEST, SD_PATH, SD_MANAGER,
                                     op->type == OP_START ? "StartUnit" : "StopUnit", on_job_queued, op, "ss", op->unit,
                                     "replace");
        if (r < 0)
                op_finishf(op, r, "Cannot %s %s: %s", verb(op), op->unit, strerror(-r));
        return 0;
}

static int on_unit_loaded(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        FabricOp *op = userdata;
        const char *path;
        int r;

        op->call_slot = sd_bus_slot_unref(op->call_slot);
        if (sd_bus_message_is_method_error(m, NULL)) {
                finish_bus_error(op, sd_bus_message_get_error(m));
                return 0;
        }
        r = sd_bus_message_read(m, "o", &path);
        if (r < 0 || !(op->unit_path = strdup(path))) {
                op_finish(op, r < 0 ? r : -ENOMEM, "Cannot read systemd's LoadUnit reply.");
                return 0;
        }
        if (op->type == OP_START || op->type == OP_WATCH) {
                r = sd_bus_match_signal_async(op->bus, &op->props_slot, SD_DEST, op->unit_path,
                                              "org.freedesktop.DBus.Properties", "PropertiesChanged",
                                              on_properties_changed, NULL, op);
                if (r < 0) {
                        op_finishf(op, r, "Cannot watch %s: %s", op->unit, strerror(-r));
                        return 0;
                }
        }
        r = request_state(op, on_unit_state);
        if (r < 0)
                op_finishf(op, r, "Cannot %s %s: %s", verb(op), op->unit, strerror(-r));
        return 0;
}

static int op_new(sd_bus *bus, OpType type, const char *unit, FabricOp **ret) {
        _cleanup_(fabric_op_freep) FabricOp *op = NULL;

        if (!bus || isempty(unit))
                return -EINVAL;
        if (!sd_bus_get_event(bus))
                return -ENXIO; /* async only: the bus must be attached to an event loop */
        op = calloc(1, sizeof(*op));
        if (!op)
                return -ENOMEM;
        op->type = type;
        op->bus = sd_bus_ref(bus);
        op->unit = strdup(unit);
        if (!op->unit)
                return -ENOMEM;
        *ret = TAKE_PTR(op);
        return 0;
}

static int op_begin(FabricOp *op, uint64_t timeout_usec) {
        int r;

        if (op->type != OP_QUERY) {
                /* systemd sends JobRemoved and unit PropertiesChanged only while a client is subscribed.
                 * "Already subscribed" from a second op on this connection is fine: no reply handler. */
                r = sd_bus_call_method_async(op->bus, NULL, SD_DEST, SD_PATH, SD_MANAGER, "Subscribe", NULL, NULL, "");
                if (r < 0)
                        return r;
        }
        if (op->type == OP_START || op->type == OP_STOP) {
                /* The bus orders this AddMatch before the StartUnit that follows. */
                r = sd_bus_match_signal_async(op->bus, &op->job_slot, SD_DEST, SD_PATH, SD_MANAGER, "JobRemoved",
                                              on_job_removed, NULL, op);
                if (r < 0)
                        return r;
                op->opts.timeout_usec = timeout_usec ?: FABRIC_JOB_TIMEOUT_USEC;
                r = arm_timer(op, op->opts.timeout_usec);
                if (r < 0)
                        return r;
        }
        return sd_bus_call_method_async(op->bus, &op->call_slot, SD_DEST, SD_PATH, SD_MANAGER, "LoadUnit",
                                        on_unit_loaded, op, "s", op->unit);
}

int fabric_unit_query(sd_bus *bus, const char *unit, FabricQueryFunc callback, void *userdata, FabricOp **ret) {
        _cleanup_(fabric_op_freep) FabricOp *op = NULL;
        int r;

        assert(callback);
        assert(ret);
        r = op_new(bus, OP_QUERY, unit, &op);
        if (r < 0)
                return r;
        op->query_cb = callback;
        op->userdata = userdata;
        r = op_begin(op, 0);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(op);
        return 0;
}

int fabric_unit_start(sd_bus *bus, const char *unit, const FabricStartOptions *opts, FabricDoneFunc callback,
                      void *userdata, FabricOp **ret) {
        _cleanup_(fabric_op_freep) FabricOp *op = NULL;
        int r;

        assert(callback);
        assert(ret);
        r = op_new(bus, OP_START, unit, &op);
        if (r < 0)
                return r;
        if (opts)
                op->opts = *opts;
        op->done_cb = callback;
        op->userdata = userdata;
        op->fabric_manager = streq(unit, FABRIC_MANAGER_UNIT);
        r = op_begin(op, op->opts.timeout_usec);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(op);
        return 0;
}

int fabric_manager_start(sd_bus *bus, uint64_t timeout_usec, uint64_t watch_usec, FabricDoneFunc callback,
                         void *userdata, FabricOp **ret) {
        FabricStartOptions opts = {
                .timeout_usec = timeout_usec,
                .watch_usec = watch_usec ?: FABRIC_MANAGER_WATCH_USEC,
                .require_installed = true,
        };
        return fabric_unit_start(bus, FABRIC_MANAGER_UNIT, &opts, callback, userdata, ret);
}

int fabric_unit_stop(sd_bus *bus, const char *unit, uint64_t timeout_usec, FabricDoneFunc callback, void *userdata,
                     FabricOp **ret) {
        _cleanup_(fabric_op_freep) FabricOp *op = NULL;
        int r;

        assert(callback);
        assert(ret);
        r = op_new(bus, OP_STOP, unit, &op);
        if (r < 0)
                return r;
        op->done_cb = callback;
        op->userdata = userdata;
        r = op_begin(op, timeout_usec);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(op);
        return 0;
}

int fabric_unit_watch(sd_bus *bus, const char *unit, FabricDoneFunc callback, void *userdata, FabricOp **ret) {
        _cleanup_(fabric_op_freep) FabricOp *op = NULL;
        int r;

        assert(callback);
        assert(ret);
        r = op_new(bus, OP_WATCH, unit, &op);
        if (r < 0)
                return r;
        op->done_cb = callback;
        op->userdata = userdata;
        r = op_begin(op, 0);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(op);
        return 0;
}

static char *strip_dup(const char *s) {
        while (isspace((unsigned char) *s))
                s++;
        size_t n = strlen(s);
        while (n > 0 && isspace((unsigned char) s[n - 1]))
                n--;
        return strndup(s, n);
}

int fabric_version_check(const char *fabricmanager_version, const char *driver_version, char **ret_message) {
        _cleanup_free_ char *fm = strip_dup(fabricmanager_version ?: ""), *drv = strip_dup(driver_version ?: "");

        if (!fm || !drv)
                return -ENOMEM;
        if (isempty(fm) || isempty(drv)) {
                if (ret_message)
                        *ret_message = strprintf("Cannot compare nvidia-fabricmanager and driver versions: the %s "
                                                 "version is unknown.", isempty(fm) ? "fabric manager" : "driver");
                return -EINVAL;
        }
        if (streq(fm, drv))
                return 0;
        if (ret_message)
                *ret_message = strprintf("nvidia-fabricmanager %s does not match the NVIDIA driver %s: fabric manager "
                                         "must be exactly the driver's version; install nvidia-fabricmanager %s.",
                                         fm, drv, drv);
        return -EPROTO;
}
