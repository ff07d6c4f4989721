/* SPDX-License-Identifier: MIT */
/* Owns the MIG commands declared in ctl-mig.h: `mig show` reads the GPU objects (MIG mode, MIG devices)
 * and the Manager's MigConfig/MigConfigState and mig stage; `mig apply` calls ApplyMigConfig(), which
 * answers when the apply has finished (--no-block: only until the agent has accepted it); `mig assert`
 * and `mig export` call AssertMigConfig() and ExportMigConfig(). */
#include <inttypes.h>
#include <stdio.h>
#include <unistd.h>

#include "bus.h"
#include "ctl-agent.h"
#include "ctl-mig.h"
#include "ctl-output.h"
#include "fileio.h"
#include "strv.h"

static const char *mig_state_color(const char *state) {
        if (streq_ptr(state, "success"))
                return ANSI_GREEN;
        if (streq_ptr(state, "pending") || streq_ptr(state, "rebooting"))
                return ANSI_YELLOW;
        if (streq_ptr(state, "failed"))
                return ANSI_RED;
        return NULL;
}

static int gpu_compare(const void *a, const void *b) {
        const CtlGpu *x = a, *y = b;
        return x->index < y->index ? -1 : x->index > y->index;
}

static const StageInfo *mig_stage(const AgentStatus *st) {
        for (size_t i = 0; i < st->n_stages; i++)
                if (streq_ptr(st->stages[i].name, "mig"))
                        return &st->stages[i];
        return NULL;
}

/* "enabled", "disabled", "not supported", "-" (NVML did not say), or "disabled, enabled after a GPU
 * reset" while a change waits for one. */
static void format_mode(const CtlGpu *g, char *buf, size_t n) {
        const char *cur = g->mig_mode, *pending = g->mig_mode_pending;

        if (isempty(cur))
                snprintf(buf, n, "-");
        else if (streq(cur, "unsupported"))
                snprintf(buf, n, "not supported");
        else if (!isempty(pending) && !streq(cur, pending))
                snprintf(buf, n, "%s, %s after a GPU reset", cur, pending);
        else
                snprintf(buf, n, "%s", cur);
}

static void print_show_json(const AgentStatus *st, const CtlGpu *gpus, size_t n) {
        const StageInfo *stage = mig_stage(st);
        bool first = true;

        putchar('{');
        ctl_json_kv_string_or_null(stdout, &first, "config", st->mig_config);
        ctl_json_kv_string_or_null(stdout, &first, "state", st->mig_config_state);
        ctl_json_kv_string_or_null(stdout, &first, "stage_state", stage ? stage->state : NULL);
        ctl_json_kv_string_or_null(stdout, &first, "stage_message", stage ? stage->message : NULL);
        ctl_json_key(stdout, &first, "gpus");
        putchar('[');
        for (size_t i = 0; i < n; i++) {
                const CtlGpu *g = &gpus[i];
                bool first_gpu = true;

                fputs(i > 0 ? ",{" : "{", stdout);
                ctl_json_kv_uint(stdout, &first_gpu, "index", g->index);
                ctl_json_kv_string(stdout, &first_gpu, "pci_address", g->pci_address);
                ctl_json_kv_string_or_null(stdout, &first_gpu, "name", isempty(g->nvml_name) ? g->name : g->nvml_name);
                ctl_json_kv_string_or_null(stdout, &first_gpu, "mig_mode", g->mig_mode);
                ctl_json_kv_string_or_null(stdout, &first_gpu, "mig_mode_pending", g->mig_mode_pending);
                ctl_json_mig_devices(stdout, &first_gpu, g);
                putchar('}');
        }
        fputs("]}\n", stdout);
}

/* One row per GPU, its MIG devices under it with full UUIDs: what a person copies into
 * CUDA_VISIBLE_DEVICES or a CDI name. */
static int print_show(const AgentStatus *st, const CtlGpu *gpus, size_t n, bool legend) {
        _cleanup_(ctl_table_freep) CtlTable *t = NULL;
        const StageInfo *stage = mig_stage(st);
        size_t n_devices = 0;
        int r;

        if (isempty(st->mig_config))
                printf("%12s: %s\n", "MIG config", "none (MIG is not managed: mig.selected is empty)");
        else {
                const char *color = mig_state_color(st->mig_config_state);
                printf("%12s: %s (%s%s%s)\n", "MIG config", st->mig_config, ctl_ansi(color),
                       strna(st->mig_config_state), ctl_ansi(ANSI_NORMAL));
        }
        if (stage)
                printf("%12s: %s%s%s\n", "Stage mig", strna(stage->state), isempty(stage->message) ? "" : ": ",
                       stage->message ?: "");
        putchar('\n');

        r = ctl_table_new(&t, 4, (const char *const[]) { "GPU", "PCI", "NAME", "MIG" });
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                const CtlGpu *g = &gpus[i];
                char index[16], mode[96];

                snprintf(index, sizeof index, "%" PRIu32, g->index);
                format_mode(g, mode, sizeof mode);
                r = ctl_table_add_row(t, (const char *const[]) { index, g->pci_address,
                                                                 isempty(g->nvml_name) ? g->name : g->nvml_name,
                                                                 mode });
                if (r < 0)
                        return r;
                if (strstr(mode, "after a GPU reset"))
                        ctl_table_set_color(t, 3, ANSI_YELLOW);
                for (size_t j = 0; j < g->n_mig_devices; j++) {
                        const CtlMigDevice *d = &g->mig_devices[j];
                        _cleanup_free_ char *line = strprintf(
                                "  %s GI %-2" PRIu32 " CI %-2" PRIu32 " %-12s %s",
                                j + 1 < g->n_mig_devices ? "├─" : "└─", d->gi_id, d->ci_id,
                                isempty(d->profile) ? "-" : d->profile, isempty(d->uuid) ? "-" : d->uuid);
                        if (!line)
                                return -ENOMEM;
                        r = ctl_table_add_note(t, line);
                        if (r < 0)
                                return r;
                }
                n_devices += g->n_mig_devices;
        }
        ctl_table_print(t, stdout, legend);
        if (legend)
                printf("\n%zu GPU%s, %zu MIG device%s.\n", n, n == 1 ? "" : "s", n_devices, n_devices == 1 ? "" : "s");
        return 0;
}

static int mig_show(sd_bus *bus, const CtlMigOptions *o) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_(ctl_status_done) AgentStatus st = {};
        CtlGpu *gpus = NULL;
        size_t n = 0;
        int r, ret = CTL_EXIT_OK;

        r = ctl_get_status(bus, &st);
        if (r != CTL_EXIT_OK)
                return r;
        r = sd_bus_call_method(bus, AGENT_BUS_NAME, AGENT_OBJECT_PATH, "org.freedesktop.DBus.ObjectManager",
                               "GetManagedObjects", &error, &reply, NULL);
        if (r < 0)
                return ctl_bus_error_exit("GetManagedObjects", "Failed to list the GPUs", &error, r);
        r = ctl_parse_gpus(reply, &gpus, &n);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Unexpected reply to GetManagedObjects() from the agent: %s\n",
                        strerror(-r));
                ret = CTL_EXIT_NOT_OK;
                goto finish;
        }
        qsort(gpus, n, sizeof(CtlGpu), gpu_compare);

        if (o->json)
                print_show_json(&st, gpus, n);
        else if (print_show(&st, gpus, n, o->legend) < 0) {
                fprintf(stderr, "gpunodectl: Out of memory.\n");
                ret = CTL_EXIT_NOT_OK;
        }

finish:
        for (size_t i = 0; i < n; i++)
                ctl_gpu_done(&gpus[i]);
        free(gpus);
        return ret;
}

/* The agent runs in /: a relative --config is made absolute here, where the user meant it. */
static int absolute_config(const char *file, char **ret) {
        _cleanup_free_ char *cwd = NULL;

        if (!file || file[0] == '/') {
                *ret = file ? strdup(file) : strdup("");
                return *ret ? 0 : -ENOMEM;
        }
        cwd = getcwd(NULL, 0);
        if (!cwd)
                return -errno;
        *ret = path_join(cwd, file);
        return *ret ? 0 : -ENOMEM;
}

static int print_apply_result(const char *name, sd_bus_message *reply, const CtlMigOptions *o) {
        const char *state, *message;
        int r;

        r = sd_bus_message_read(reply, "ss", &state, &message);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Unexpected reply to ApplyMigConfig() from the agent: %s\n", strerror(-r));
                return CTL_EXIT_NOT_OK;
        }
        if (o->json) {
                bool first = true;
                putchar('{');
                ctl_json_kv_string(stdout, &first, "config", name);
                ctl_json_kv_string(stdout, &first, "state", state);
                ctl_json_kv_bool(stdout, &first, "reboot_required", streq(state, "rebooting"));
                ctl_json_kv_string_or_null(stdout, &first, "message", message);
                fputs("}\n", stdout);
        } else if (streq(state, "rebooting"))
                printf("MIG config %s: reboot required: a MIG mode change waits for a GPU reset or a reboot "
                       "(mig.reset: never); the agent finishes the apply after it.\n%s\n", name, message);
        else
                printf("MIG config %s: %s: %s\n", name, state, message);
        return CTL_EXIT_OK;
}

static int on_apply_reply(sd_bus_message *m, void *userdata, sd_bus_error *ret_error) {
        sd_bus_message **reply = userdata;

        *reply = sd_bus_message_ref(m);
        return 0;
}

/* Errors the agent finds are answered at once, before anything runs; so a Ping sent after the call and
 * answered without an error reply before it (one connection's messages stay in order) means the apply
 * has been accepted and is running. */
static int apply_no_block(sd_bus *bus, sd_bus_message *call, sd_bus_message **ret_reply) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_slot_unrefp) sd_bus_slot *slot = NULL;
        int r;

        *ret_reply = NULL;
        r = sd_bus_call_async(bus, &slot, call, on_apply_reply, ret_reply, 0);
        if (r < 0)
                return r;
        r = sd_bus_call_method(bus, AGENT_BUS_NAME, AGENT_OBJECT_PATH, "org.freedesktop.DBus.Peer", "Ping", &error,
                               NULL, NULL);
        if (r < 0)
                return r;
        while ((r = sd_bus_process(bus, NULL)) > 0)
                if (*ret_reply)
                        break;
        return r < 0 ? r : 0;
}

static int mig_apply(sd_bus *bus, const char *name, const CtlMigOptions *o) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *call = NULL, *reply = NULL;
        _cleanup_free_ char *file = NULL, *what = NULL;
        int r;

        r = absolute_config(o->config_file, &file);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Cannot make --config '%s' an absolute path: %s\n", o->config_file,
                        strerror(-r));
                return CTL_EXIT_NOT_OK;
        }
        what = strprintf("Applying MIG config %s failed", name);
        if (!what)
                return CTL_EXIT_NOT_OK;

        r = sd_bus_message_new_method_call(bus, &call, AGENT_BUS_NAME, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE,
                                           "ApplyMigConfig");
        if (r >= 0)
                r = sd_bus_message_append(call, "ssb", name, file, (int) o->force);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Cannot build the ApplyMigConfig() call: %s\n", strerror(-r));
                return CTL_EXIT_NOT_OK;
        }

        if (o->no_block) {
                r = apply_no_block(bus, call, &reply);
                if (r < 0)
                        return ctl_bus_error_exit("ApplyMigConfig", what, &error, r);
                if (!reply) {
                        if (o->json) {
                                bool first = true;
                                putchar('{');
                                ctl_json_kv_string(stdout, &first, "config", name);
                                ctl_json_kv_string(stdout, &first, "state", "pending");
                                fputs("}\n", stdout);
                        } else
                                printf("Applying MIG config %s in the background; follow it with 'gpunodectl mig "
                                       "show'.\n", name);
                        return CTL_EXIT_OK;
                }
                /* It finished (or was refused) at once. */
                if (sd_bus_message_is_method_error(reply, NULL))
                        return ctl_bus_error_exit("ApplyMigConfig", what, sd_bus_message_get_error(reply),
                                                  -sd_bus_message_get_errno(reply));
                return print_apply_result(name, reply, o);
        }

        /* GPU resets and unit stops can take minutes: the answer comes when the apply is done. */
        r = sd_bus_call(bus, call, o->timeout_usec, &error, &reply);
        /* Both are ETIMEDOUT: NoReply "… disconnected …" is the agent going away, Timeout our own limit. */
        if (sd_bus_error_has_name(&error, SD_BUS_ERROR_NO_REPLY) && error.message &&
            strstr(error.message, "disconnected")) {
                fprintf(stderr, "gpunodectl: gpu-node-agent stopped before the apply of MIG config %s finished (%s); "
                        "at its next start it rolls back what the interrupted apply left half done. Check with "
                        "'gpunodectl mig show'.\n", name, strna(error.message));
                return CTL_EXIT_UNREACHABLE;
        }
        if (r == -ETIMEDOUT) {
                fprintf(stderr, "gpunodectl: No answer from the agent about MIG config %s within the timeout; the "
                        "apply goes on in the agent: follow it with 'gpunodectl mig show'.\n", name);
                return CTL_EXIT_NOT_OK;
        }
        if (r < 0)
                return ctl_bus_error_exit("ApplyMigConfig", what, &error, r);
        return print_apply_result(name, reply, o);
}

static int mig_assert(sd_bus *bus, const char *name, const CtlMigOptions *o) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        _cleanup_free_ char *file = NULL;
        const char *report;
        int matches, r;

        r = absolute_config(o->config_file, &file);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Cannot make --config '%s' an absolute path: %s\n", o->config_file,
                        strerror(-r));
                return CTL_EXIT_NOT_OK;
        }
        r = sd_bus_call_method(bus, AGENT_BUS_NAME, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE, "AssertMigConfig",
                               &error, &reply, "ss", name ?: "", file);
        if (r < 0)
                return ctl_bus_error_exit("AssertMigConfig", "Cannot check the MIG config", &error, r);
        r = sd_bus_message_read(reply, "bs", &matches, &report);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Unexpected reply to AssertMigConfig() from the agent: %s\n",
                        strerror(-r));
                return CTL_EXIT_NOT_OK;
        }
        if (o->json) {
                bool first = true;
                putchar('{');
                ctl_json_kv_string_or_null(stdout, &first, "config", name);
                ctl_json_kv_bool(stdout, &first, "matches", matches);
                ctl_json_kv_string(stdout, &first, "report", report);
                fputs("}\n", stdout);
        } else
                printf("%s\n", report);
        return matches ? CTL_EXIT_OK : CTL_EXIT_NOT_OK;
}

static int mig_export(sd_bus *bus, const CtlMigOptions *o) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        const char *yaml;
        int r;

        r = sd_bus_call_method(bus, AGENT_BUS_NAME, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE, "ExportMigConfig",
                               &error, &reply, NULL);
        if (r < 0)
                return ctl_bus_error_exit("ExportMigConfig", "Cannot export the MIG layout", &error, r);
        r = sd_bus_message_read(reply, "s", &yaml);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Unexpected reply to ExportMigConfig() from the agent: %s\n",
                        strerror(-r));
                return CTL_EXIT_NOT_OK;
        }
        if (o->json) {
                bool first = true;
                putchar('{');
                ctl_json_kv_string(stdout, &first, "yaml", yaml);
                fputs("}\n", stdout);
        } else
                fputs(yaml, stdout);
        if (!o->json && *yaml && yaml[strlen(yaml) - 1] != '\n')
                putchar('\n');
        return CTL_EXIT_OK;
}

int ctl_mig_check_args(char **args, const CtlMigOptions *o) {
        const char *what = args && args[0] ? args[0] : "show";
        size_t n = args && args[0] ? strv_length(args + 1) : 0;
        size_t max = streq(what, "apply") || streq(what, "assert") ? 1 : 0;

        if (!streq(what, "show") && !streq(what, "apply") && !streq(what, "assert") && !streq(what, "export")) {
                fprintf(stderr, "gpunodectl: Unknown mig command '%s': expected 'show', 'apply', 'assert' or "
                        "'export'. See gpunodectl --help.\n", what);
                return CTL_EXIT_USAGE;
        }
        if (streq(what, "apply") && n == 0) {
                fprintf(stderr, "gpunodectl: 'mig apply' needs the name of a MIG config, e.g. 'gpunodectl mig "
                        "apply all-balanced'.\n");
                return CTL_EXIT_USAGE;
        }
        if (n > max) {
                fprintf(stderr, "gpunodectl: 'mig %s' takes %s, got '%s'. See gpunodectl --help.\n", what,
                        max ? "one config name" : "no arguments", args[1 + max]);
                return CTL_EXIT_USAGE;
        }
        if (o->config_file && !streq(what, "apply") && !streq(what, "assert")) {
                fprintf(stderr, "gpunodectl: --config only applies to mig apply and mig assert.\n");
                return CTL_EXIT_USAGE;
        }
        if (o->config_file && isempty(o->config_file)) {
                fprintf(stderr, "gpunodectl: --config needs a file name.\n");
                return CTL_EXIT_USAGE;
        }
        if ((o->force || o->no_block) && !streq(what, "apply")) {
                fprintf(stderr, "gpunodectl: --%s only applies to mig apply.\n", o->force ? "force" : "no-block");
                return CTL_EXIT_USAGE;
        }
        return CTL_EXIT_OK;
}

int ctl_mig(sd_bus *bus, char **args, const CtlMigOptions *o) {
        const char *what = args && args[0] ? args[0] : "show";

        if (streq(what, "apply"))
                return mig_apply(bus, args[1], o);
        if (streq(what, "assert"))
                return mig_assert(bus, args[1], o);
        if (streq(what, "export"))
                return mig_export(bus, o);
        return mig_show(bus, o);
}
