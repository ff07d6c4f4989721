/* SPDX-License-Identifier: MIT */
/* Owns the driver commands declared in ctl-driver.h: `driver status` reads the Manager's driver
 * properties (Modules, DkmsState, DriverVersion, KernelRelease) and the driver stage's entry;
 * `driver unload` calls Unload() and waits for its answer, which comes only once the units are
 * stopped and the modules removed. */
#include <stdio.h>

#include "bus.h"
#include "ctl-agent.h"
#include "ctl-driver.h"
#include "ctl-output.h"
#include "strv.h"

static const char *module_state_color(const char *state) {
        if (streq_ptr(state, "live") || streq_ptr(state, "builtin"))
                return ANSI_GREEN;
        if (streq_ptr(state, "missing") || streq_ptr(state, "stale") || streq_ptr(state, "failed"))
                return ANSI_RED;
        if (streq_ptr(state, "coming") || streq_ptr(state, "going"))
                return ANSI_YELLOW;
        return NULL;
}

static const StageInfo *driver_stage(const AgentStatus *st) {
        for (size_t i = 0; i < st->n_stages; i++)
                if (streq_ptr(st->stages[i].name, "driver"))
                        return &st->stages[i];
        return NULL;
}

static void print_status_json(const AgentStatus *st) {
        const StageInfo *stage = driver_stage(st);
        bool first = true;

        putchar('{');
        ctl_json_kv_string_or_null(stdout, &first, "driver_version", st->driver_version);
        ctl_json_kv_string_or_null(stdout, &first, "kernel_release", st->kernel_release);
        ctl_json_kv_string_or_null(stdout, &first, "dkms_state", st->dkms_state);
        ctl_json_kv_string_or_null(stdout, &first, "stage_state", stage ? stage->state : NULL);
        ctl_json_kv_string_or_null(stdout, &first, "stage_message", stage ? stage->message : NULL);
        ctl_json_key(stdout, &first, "modules");
        putchar('[');
        for (size_t i = 0; i < st->n_modules; i++) {
                bool first_module = true;

                fputs(i > 0 ? ",{" : "{", stdout);
                ctl_json_kv_string(stdout, &first_module, "name", st->modules[i].name);
                ctl_json_kv_string(stdout, &first_module, "state", st->modules[i].state);
                ctl_json_kv_string_or_null(stdout, &first_module, "detail", st->modules[i].detail);
                putchar('}');
        }
        fputs("]}\n", stdout);
}

static int print_status(const AgentStatus *st, bool legend) {
        _cleanup_(ctl_table_freep) CtlTable *t = NULL;
        const StageInfo *stage = driver_stage(st);
        int r;

        printf("%12s: %s\n", "Driver", isempty(st->driver_version) ? "unknown (NVML unavailable, see stage nvml)"
                                                                    : st->driver_version);
        printf("%12s: %s\n", "Kernel", isempty(st->kernel_release) ? "unknown" : st->kernel_release);
        printf("%12s: %s\n", "DKMS", isempty(st->dkms_state) ? "-" : st->dkms_state);
        if (stage)
                printf("%12s: %s%s%s\n", "Stage", strna(stage->state), isempty(stage->message) ? "" : ": ",
                       stage->message ?: "");

        if (!st->has_modules) {
                printf("\nThis agent does not report its kernel modules (it predates the Modules property).\n");
                return 0;
        }
        if (st->n_modules == 0) {
                printf("\nNo kernel modules reported yet (the driver stage has not run, or driver.enabled is "
                       "false).\n");
                return 0;
        }

        putchar('\n');
        r = ctl_table_new(&t, 3, (const char *const[]) { "NAME", "STATE", "DETAIL" });
        if (r < 0)
                return r;
        for (size_t i = 0; i < st->n_modules; i++) {
                const CtlModule *mod = &st->modules[i];
                r = ctl_table_add_row(t, (const char *const[]) { mod->name, mod->state, mod->detail });
                if (r < 0)
                        return r;
                ctl_table_set_color(t, 1, module_state_color(mod->state));
        }
        ctl_table_print(t, stdout, legend);
        return 0;
}

static int driver_status(sd_bus *bus, const CtlDriverOptions *o) {
        _cleanup_(ctl_status_done) AgentStatus st = {};
        int r;

        r = ctl_get_status(bus, &st);
        if (r != CTL_EXIT_OK)
                return r;
        if (o->json) {
                print_status_json(&st);
                return CTL_EXIT_OK;
        }
        if (print_status(&st, o->legend) < 0) {
                fprintf(stderr, "gpunodectl: Out of memory.\n");
                return CTL_EXIT_NOT_OK;
        }
        return CTL_EXIT_OK;
}

static void json_strv(const char *key, char **l, bool *first) {
        ctl_json_key(stdout, first, key);
        putchar('[');
        STRV_FOREACH(s, l) {
                if (s != l)
                        putchar(',');
                ctl_json_string(stdout, *s);
        }
        putchar(']');
}

static int driver_unload(sd_bus *bus, const CtlDriverOptions *o) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *call = NULL, *reply = NULL;
        _cleanup_strv_free_ char **units = NULL, **modules = NULL;
        int r;

        r = sd_bus_message_new_method_call(bus, &call, AGENT_BUS_NAME, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE,
                                           "Unload");
        if (r >= 0)
                /* Stopping the units can take as long as systemd lets them take. */
                r = sd_bus_call(bus, call, o->timeout_usec, &error, &reply);
        if (r < 0)
                return ctl_bus_error_exit("Unload", "Unload refused", &error, r);

        r = sd_bus_message_read_strv(reply, &units);
        if (r >= 0)
                r = sd_bus_message_read_strv(reply, &modules);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Unexpected reply to Unload() from the agent: %s\n", strerror(-r));
                return CTL_EXIT_NOT_OK;
        }

        if (o->json) {
                bool first = true;
                putchar('{');
                json_strv("units_stopped", units, &first);
                json_strv("modules_unloaded", modules, &first);
                fputs("}\n", stdout);
                return CTL_EXIT_OK;
        }
        if (units && units[0]) {
                _cleanup_free_ char *l = strv_join(units, ", ");
                printf("Stopped %s.\n", strna(l));
        }
        if (!modules || !modules[0])
                printf("The NVIDIA driver was not loaded; nothing to unload.\n");
        else {
                _cleanup_free_ char *l = strv_join(modules, ", ");
                printf("Unloaded %s.\n", strna(l));
        }
        printf("The driver stays unloaded until 'gpunodectl reconcile' (or a restart of gpu-node-agent).\n");
        return CTL_EXIT_OK;
}

/* `driver reload`: Unload() (refused with the holders while anything uses a GPU), then Reconcile(), whose
 * pass loads the installed driver. The answer to Reconcile() comes at once; the load follows. */
static int driver_reload(sd_bus *bus, const CtlDriverOptions *o) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *call = NULL, *reply = NULL;
        int r;

        r = sd_bus_message_new_method_call(bus, &call, AGENT_BUS_NAME, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE,
                                           "Unload");
        if (r >= 0)
                r = sd_bus_call(bus, call, o->timeout_usec, &error, &reply);
        if (r < 0)
                return ctl_bus_error_exit("Unload", "Unload refused", &error, r);
        call = sd_bus_message_unref(call);
        reply = sd_bus_message_unref(reply);
        r = sd_bus_call_method(bus, AGENT_BUS_NAME, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE, "Reconcile", &error,
                               &reply, NULL);
        if (r < 0)
                return ctl_bus_error_exit("Reconcile", "Reconcile refused", &error, r);
        if (o->json)
                fputs("{\"unloaded\":true,\"reconcile\":true}\n", stdout);
        else
                printf("Unloaded the NVIDIA driver; the agent now loads the installed one (see 'gpunodectl driver "
                       "status').\n");
        return CTL_EXIT_OK;
}

int ctl_driver_check_args(char **args) {
        const char *what = args && args[0] ? args[0] : "status";

        if (!streq(what, "status") && !streq(what, "unload") && !streq(what, "reload")) {
                fprintf(stderr, "gpunodectl: Unknown driver command '%s': expected 'status', 'unload' or 'reload'. "
                        "See gpunodectl --help.\n", what);
                return CTL_EXIT_USAGE;
        }
        if (args && args[0] && args[1]) {
                fprintf(stderr, "gpunodectl: 'driver %s' takes no arguments, got '%s'. See gpunodectl --help.\n",
                        what, args[1]);
                return CTL_EXIT_USAGE;
        }
        return CTL_EXIT_OK;
}

int ctl_driver(sd_bus *bus, char **args, const CtlDriverOptions *o) {
        if (args && args[0] && streq(args[0], "unload"))
                return driver_unload(bus, o);
        if (args && args[0] && streq(args[0], "reload"))
                return driver_reload(bus, o);
        return driver_status(bus, o);
}
