/* SPDX-License-Identifier: MIT */
/* A stand-in for systemd's D-Bus Manager on a private bus, for the fabric tests: it owns
 * org.freedesktop.systemd1 and answers the calls modules/fabric.c makes (Subscribe, LoadUnit,
 * GetUnit, StartUnit, StopUnit; unit objects with Id/LoadState/ActiveState/SubState), emitting
 * JobRemoved and PropertiesChanged as systemd does. What each unit does is set per unit:
 *
 *   fake-systemd --unit NAME=BEHAVIOUR … (prints "READY" on stdout once it owns the name)
 *
 *   ok         start job done after 20 ms, unit active/running
 *   fail       start job result "failed", unit failed/failed
 *   dependency start job result "dependency", unit inactive/dead
 *   die:MS     like ok, then MS ms later the unit goes failed/failed (PropertiesChanged)
 *   restart:MS like ok, then MS ms later activating/auto-restart (a crash with Restart=)
 *   hang       start job never finishes, unit activating/start
 *   early      JobRemoved "done" is sent before the StartUnit reply (a race systemd can produce)
 *   missing    LoadState not-found; StartUnit fails with NoSuchUnit (as any unit not given)
 *
 * Control interface org.gpunodeagent.FakeSystemd1 at /org/gpunodeagent/FakeSystemd1:
 * SetBehaviour(s unit, s behaviour) resets the unit to inactive with the new behaviour, Calls() → as
 * returns the Manager calls so far ("StartUnit nvidia-fabricmanager.service replace"). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

#include "macro.h"
#include "strv.h"

#define UNIT_PREFIX "/org/freedesktop/systemd1/unit"
#define UNIT_IFACE "org.freedesktop.systemd1.Unit"
#define MANAGER_PATH "/org/freedesktop/systemd1"
#define MANAGER_IFACE "org.freedesktop.systemd1.Manager"
#define STEP_USEC (20 * USEC_PER_MSEC)

typedef struct Fake Fake;

typedef struct Unit {
        Fake *fake;
        char *name;
        char *path;
        char *behaviour;
        const char *load_state, *active_state, *sub_state;
        uint32_t job_id;
        bool stopping;
        sd_event_source *timer;
        struct Unit *next;
} Unit;

struct Fake {
        sd_bus *bus;
        sd_event *event;
        Unit *units;
        char **calls;
        uint32_t next_job;
};

static Unit *unit_find(Fake *f, const char *name) {
        for (Unit *u = f->units; u; u = u->next)
                if (streq(u->name, name))
                        return u;
        return NULL;
}

static void unit_reset(Unit *u) {
        bool missing = streq(u->behaviour, "missing");
        u->load_state = missing ? "not-found" : "loaded";
        u->active_state = "inactive";
        u->sub_state = "dead";
        u->job_id = 0;
        u->timer = sd_event_source_disable_unref(u->timer);
}

static Unit *unit_get(Fake *f, const char *name, const char *behaviour) {
        Unit *u = unit_find(f, name);
        if (u) {
                if (behaviour) {
                        free(u->behaviour);
                        u->behaviour = strdup(behaviour);
                        unit_reset(u);
                }
                return u;
        }
        u = calloc(1, sizeof(*u));
        if (!u)
                return NULL;
        u->fake = f;
        u->name = strdup(name);
        u->behaviour = strdup(behaviour ?: "missing");
        if (!u->name || !u->behaviour || sd_bus_path_encode(UNIT_PREFIX, name, &u->path) < 0)
                abort();
        unit_reset(u);
        u->next = f->units;
        f->units = u;
        return u;
}

static void set_state(Unit *u, const char *active, const char *sub) {
        u->active_state = active;
        u->sub_state = sub;
        (void) sd_bus_emit_properties_changed(u->fake->bus, u->path, UNIT_IFACE, "ActiveState", "SubState", NULL);
}

static void job_removed(Unit *u, const char *result) {
        _cleanup_free_ char *job = strprintf(MANAGER_PATH "/job/%u", u->job_id);
        (void) sd_bus_emit_signal(u->fake->bus, MANAGER_PATH, MANAGER_IFACE, "JobRemoved", "uoss", u->job_id, job, u->name,
                                  result);
        u->job_id = 0;
}

static int on_step(sd_event_source *s, uint64_t usec, void *userdata);

static void schedule(Unit *u, uint64_t delay) {
        u->timer = sd_event_source_disable_unref(u->timer);
        if (sd_event_add_time_relative(u->fake->event, &u->timer, CLOCK_MONOTONIC, delay, 0, on_step, u) < 0)
                abort();
}

/* Advances a unit one step: finishes its job, or (die:/restart:) makes it crash later. */
static int on_step(sd_event_source *s, uint64_t usec, void *userdata) {
        Unit *u = userdata;
        const char *b = u->behaviour;

        u->timer = sd_event_source_disable_unref(u->timer);
        if (u->stopping) {
                u->stopping = false;
                set_state(u, "inactive", "dead");
                job_removed(u, "done");
                return 0;
        }
        if (u->job_id == 0) { /* the delayed crash */
                if (startswith(b, "restart:"))
                        set_state(u, "activating", "auto-restart");
                else
                        set_state(u, "failed", "failed");
                return 0;
        }
        if (streq(b, "fail")) {
                set_state(u, "failed", "failed");
                job_removed(u, "failed");
        } else if (streq(b, "dependency")) {
                set_state(u, "inactive", "dead");
                job_removed(u, "dependency");
        } else {
                set_state(u, "active", "running");
                job_removed(u, "done");
                if (startswith(b, "die:") || startswith(b, "restart:"))
                        schedule(u, strtoull(strchr(b, ':') + 1, NULL, 10) * USEC_PER_MSEC);
        }
        return 0;
}

static int record(Fake *f, const char *fmt, ...) _printf_(2, 3);
static int record(Fake *f, const char *fmt, ...) {
        va_list ap;
        char *s;
        va_start(ap, fmt);
        if (vasprintf(&s, fmt, ap) < 0)
                abort();
        va_end(ap);
        return strv_consume(&f->calls, s);
}

static int method_subscribe(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        record(userdata, "%s", sd_bus_message_get_member(m));
        return sd_bus_reply_method_return(m, NULL);
}

static int method_load_unit(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        const char *name;
        int r = sd_bus_message_read(m, "s", &name);
        if (r < 0)
                return r;
        record(userdata, "%s %s", sd_bus_message_get_member(m), name);
        Unit *u = unit_get(userdata, name, NULL);
        if (streq(sd_bus_message_get_member(m), "GetUnit") && streq(u->load_state, "not-found"))
                return sd_bus_error_setf(error, "org.freedesktop.systemd1.NoSuchUnit", "Unit %s not loaded.", name);
        return sd_bus_reply_method_return(m, "o", u->path);
}

static int method_start_stop(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        const char *name, *mode;
        bool start = streq(sd_bus_message_get_member(m), "StartUnit");
        int r = sd_bus_message_read(m, "ss", &name, &mode);
        if (r < 0)
                return r;
        Fake *f = userdata;
        record(f, "%s %s %s", sd_bus_message_get_member(m), name, mode);
        Unit *u = unit_get(f, name, NULL);
        if (streq(u->load_state, "not-found"))
                return sd_bus_error_setf(error, "org.freedesktop.systemd1.NoSuchUnit", "Unit %s not found.", name);
        u->job_id = ++f->next_job;
        _cleanup_free_ char *job = strprintf(MANAGER_PATH "/job/%u", u->job_id);
        if (!start) {
                u->stopping = true;
                set_state(u, "deactivating", "stop");
                schedule(u, STEP_USEC);
        } else if (streq(u->behaviour, "early")) {
                set_state(u, "active", "running");
                job_removed(u, "done");
        } else {
                set_state(u, "activating", "start");
                if (!streq(u->behaviour, "hang"))
                        schedule(u, STEP_USEC);
        }
        return sd_bus_reply_method_return(m, "o", job);
}

static int find_unit(sd_bus *b, const char *path, const char *interface, void *userdata, void **found,
                     sd_bus_error *error) {
        Fake *f = userdata;
        for (Unit *u = f->units; u; u = u->next)
                if (streq(u->path, path)) {
                        *found = u;
                        return 1;
                }
        return 0;
}

static int property_get(sd_bus *b, const char *path, const char *interface, const char *property,
                        sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Unit *u = userdata;
        const char *v = streq(property, "Id") ? u->name : streq(property, "LoadState") ? u->load_state :
                        streq(property, "ActiveState") ? u->active_state : u->sub_state;
        return sd_bus_message_append(reply, "s", v);
}

static int method_set_behaviour(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        const char *name, *behaviour;
        int r = sd_bus_message_read(m, "ss", &name, &behaviour);
        if (r < 0)
                return r;
        unit_get(userdata, name, behaviour);
        return sd_bus_reply_method_return(m, NULL);
}

static int method_calls(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        int r = sd_bus_message_new_method_return(m, &reply);
        if (r >= 0)
                r = sd_bus_message_append_strv(reply, ((Fake *) userdata)->calls);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

static const sd_bus_vtable manager_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_METHOD("Subscribe", "", "", method_subscribe, 0),
        SD_BUS_METHOD("Unsubscribe", "", "", method_subscribe, 0),
        SD_BUS_METHOD_WITH_NAMES("GetUnit", "s", SD_BUS_PARAM(name), "o", SD_BUS_PARAM(unit), method_load_unit, 0),
        SD_BUS_METHOD_WITH_NAMES("LoadUnit", "s", SD_BUS_PARAM(name), "o", SD_BUS_PARAM(unit), method_load_unit, 0),
        SD_BUS_METHOD_WITH_NAMES("StartUnit", "ss", SD_BUS_PARAM(name) SD_BUS_PARAM(mode), "o", SD_BUS_PARAM(job),
                                 method_start_stop, 0),
        SD_BUS_METHOD_WITH_NAMES("StopUnit", "ss", SD_BUS_PARAM(name) SD_BUS_PARAM(mode), "o", SD_BUS_PARAM(job),
                                 method_start_stop, 0),
        SD_BUS_SIGNAL_WITH_NAMES("JobRemoved", "uoss", SD_BUS_PARAM(id) SD_BUS_PARAM(job) SD_BUS_PARAM(unit)
                                 SD_BUS_PARAM(result), 0),
        SD_BUS_VTABLE_END,
};

static const sd_bus_vtable unit_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Id", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("LoadState", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("ActiveState", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("SubState", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_VTABLE_END,
};

static const sd_bus_vtable control_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_METHOD_WITH_NAMES("SetBehaviour", "ss", SD_BUS_PARAM(unit) SD_BUS_PARAM(behaviour), "", ,
                                 method_set_behaviour, 0),
        SD_BUS_METHOD_WITH_NAMES("Calls", "", , "as", SD_BUS_PARAM(calls), method_calls, 0),
        SD_BUS_VTABLE_END,
};

int main(int argc, char *argv[]) {
        Fake fake = {}, *f = &fake;
        sigset_t ss;
        int r;

        for (int i = 1; i < argc; i++) {
                char *eq;
                if (!streq(argv[i], "--unit") || i + 1 >= argc || !(eq = strchr(argv[i + 1], '='))) {
                        fprintf(stderr, "usage: fake-systemd [--unit NAME=BEHAVIOUR]…\n");
                        return 2;
                }
                *eq = 0;
                unit_get(f, argv[++i], eq + 1);
        }

        sigemptyset(&ss);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        sigprocmask(SIG_BLOCK, &ss, NULL);

        if ((r = sd_event_default(&f->event)) < 0 || (r = sd_event_set_signal_exit(f->event, true)) < 0 ||
            (r = sd_bus_open_system(&f->bus)) < 0 || (r = sd_bus_attach_event(f->bus, f->event, 0)) < 0 ||
            (r = sd_bus_add_object_vtable(f->bus, NULL, MANAGER_PATH, MANAGER_IFACE, manager_vtable, f)) < 0 ||
            (r = sd_bus_add_fallback_vtable(f->bus, NULL, UNIT_PREFIX, UNIT_IFACE, unit_vtable, find_unit, f)) < 0 ||
            (r = sd_bus_add_object_vtable(f->bus, NULL, "/org/gpunodeagent/FakeSystemd1",
                                          "org.gpunodeagent.FakeSystemd1", control_vtable, f)) < 0 ||
            (r = sd_bus_request_name(f->bus, "org.freedesktop.systemd1", 0)) < 0) {
                fprintf(stderr, "fake-systemd: cannot start: %s\n", strerror(-r));
                return 1;
        }
        printf("READY\n");
        fflush(stdout);
        r = sd_event_loop(f->event);

        while (f->units) {
                Unit *u = f->units;
                f->units = u->next;
                sd_event_source_disable_unref(u->timer);
                free(u->name);
                free(u->path);
                free(u->behaviour);
                free(u);
        }
        strv_free(f->calls);
        sd_bus_flush_close_unref(f->bus);
        sd_event_unref(f->event);
        return r < 0 ? 1 : 0;
}
