/* SPDX-License-Identifier: MIT */
/* Owns gpunodectl, the command-line client of gpu-node-agent's D-Bus API on the system bus: argument
 * parsing, the commands (status, gpus, labels, reload, reconcile, wait-ready; the driver commands
 * live in ctl-driver.c, the MIG commands in ctl-mig.c), reading the Manager and Gpu objects. */
#include <getopt.h>
#include <inttypes.h>
#include <time.h>
#include <systemd/sd-bus.h>

#include "build-config.h"
#include "bus.h"
#include "config.h"
#include "ctl-agent.h"
#include "ctl-doctor.h"
#include "ctl-driver.h"
#include "ctl-mig.h"
#include "ctl-output.h"
#include "strv.h"

#define DEFAULT_TIMEOUT_USEC (90 * USEC_PER_SEC)
/* driver unload answers only after systemd stopped the units, each allowed fabric.timeout. */
#define DEFAULT_UNLOAD_TIMEOUT_USEC (10 * 60 * USEC_PER_SEC)
/* mig apply answers when the apply is done: hook units stopped and started, a GPU reset (2 min) per GPU. */
#define DEFAULT_MIG_APPLY_TIMEOUT_USEC (30 * 60 * USEC_PER_SEC)

static bool arg_json = false;
static bool arg_legend = true;
static uint64_t arg_timeout_usec = DEFAULT_TIMEOUT_USEC;
static bool arg_timeout_set = false;
static const char *arg_mig_config = NULL;
static bool arg_force = false;
static bool arg_no_block = false;
static const char *arg_agent_config = NULL;
static const char *arg_agent_config_dir = NULL;
static const char *arg_root = NULL;

static const char *agent_state_color(const char *state) {
        if (streq_ptr(state, "ready"))
                return ANSI_GREEN;
        if (streq_ptr(state, "starting"))
                return ANSI_YELLOW;
        return ANSI_RED;
}

static const char *stage_state_color(const char *state) {
        if (streq_ptr(state, "done"))
                return ANSI_GREEN;
        if (streq_ptr(state, "failed"))
                return ANSI_RED;
        if (streq_ptr(state, "running"))
                return ANSI_YELLOW;
        return NULL;
}

static bool stage_is_finished(const char *state) {
        return streq_ptr(state, "done") || streq_ptr(state, "skipped") || streq_ptr(state, "failed");
}

static void format_timestamp(uint64_t usec, char *buf, size_t n) {
        time_t t = (time_t) (usec / USEC_PER_SEC);
        struct tm tm;

        if (usec == 0 || !localtime_r(&t, &tm) || strftime(buf, n, "%a %Y-%m-%d %H:%M:%S %Z", &tm) == 0)
                snprintf(buf, n, "-");
}

static void json_stage(FILE *f, const StageInfo *s) {
        bool first = true;

        fputc('{', f);
        ctl_json_kv_string(f, &first, "name", s->name);
        ctl_json_kv_string(f, &first, "state", s->state);
        if (s->started_usec)
                ctl_json_kv_uint(f, &first, "started_usec", s->started_usec);
        else
                ctl_json_kv_null(f, &first, "started_usec");
        if (s->finished_usec)
                ctl_json_kv_uint(f, &first, "finished_usec", s->finished_usec);
        else
                ctl_json_kv_null(f, &first, "finished_usec");
        ctl_json_kv_string_or_null(f, &first, "message", s->message);
        fputc('}', f);
}

static void print_status_json(const AgentStatus *st) {
        bool first = true;

        putchar('{');
        ctl_json_kv_string(stdout, &first, "version", st->version);
        ctl_json_kv_string(stdout, &first, "state", st->state);
        ctl_json_kv_string(stdout, &first, "stage", st->stage);
        ctl_json_kv_bool(stdout, &first, "ready", st->ready);
        ctl_json_kv_uint(stdout, &first, "gpu_count", st->gpu_count);
        ctl_json_kv_string_or_null(stdout, &first, "kernel_release", st->kernel_release);
        ctl_json_kv_string_or_null(stdout, &first, "driver_version", st->driver_version);
        ctl_json_kv_string_or_null(stdout, &first, "cuda_version", st->cuda_version);
        ctl_json_kv_string_or_null(stdout, &first, "config_error", st->config_error);
        ctl_json_kv_string_or_null(stdout, &first, "mig_config", st->mig_config);
        ctl_json_kv_string_or_null(stdout, &first, "mig_config_state", st->mig_config_state);
        ctl_json_kv_string_or_null(stdout, &first, "health", st->health);
        ctl_json_kv_uint(stdout, &first, "unhealthy_gpus", st->unhealthy_gpus);
        ctl_json_key(stdout, &first, "config_sources");
        putchar('[');
        STRV_FOREACH(s, st->config_sources) {
                if (s != st->config_sources)
                        putchar(',');
                ctl_json_string(stdout, *s);
        }
        putchar(']');
        ctl_json_key(stdout, &first, "stages");
        putchar('[');
        for (size_t i = 0; i < st->n_stages; i++) {
                if (i > 0)
                        putchar(',');
                json_stage(stdout, &st->stages[i]);
        }
        fputs("]}\n", stdout);
}

/* Health values begin with their verdict: "ok", "degraded: …", "failed: …". */
static const char *health_color(const char *health) {
        if (startswith(health, "failed"))
                return ANSI_RED;
        if (startswith(health, "degraded"))
                return ANSI_YELLOW;
        return ANSI_GREEN;
}

static int print_stage_table(const AgentStatus *st) {
        _cleanup_(ctl_table_freep) CtlTable *t = NULL;
        int r;

        r = ctl_table_new(&t, 4, (const char *const[]) { "STAGE", "STATE", "SINCE", "MESSAGE" });
        if (r < 0)
                return r;
        for (size_t i = 0; i < st->n_stages; i++) {
                const StageInfo *s = &st->stages[i];
                char since[64];

                format_timestamp(stage_is_finished(s->state) && s->finished_usec ? s->finished_usec
                                                                                  : s->started_usec,
                                 since, sizeof since);
                r = ctl_table_add_row(t, (const char *const[]) { s->name, s->state, since, s->message });
                if (r < 0)
                        return r;
                ctl_table_set_color(t, 1, stage_state_color(s->state));
        }
        ctl_table_print(t, stdout, arg_legend);
        return 0;
}

static int verb_status(sd_bus *bus, char **args) {
        _cleanup_(ctl_status_done) AgentStatus st = {};
        int r;

        r = ctl_get_status(bus, &st);
        if (r != CTL_EXIT_OK)
                return r;

        if (arg_json) {
                print_status_json(&st);
                return CTL_EXIT_OK;
        }

        const char *color = agent_state_color(st.state);
        printf("%s●%s gpu-node-agent: %s%s%s\n", ctl_ansi(color), ctl_ansi(ANSI_NORMAL), ctl_ansi(color), strna(st.state),
               ctl_ansi(ANSI_NORMAL));
        printf("%12s: %s\n", "Version", strna(st.version));
        printf("%12s: %s\n", "Stage", strna(st.stage));
        printf("%12s: %s\n", "Ready", st.ready ? "yes" : "no");
        printf("%12s: %" PRIu32 "\n", "GPUs", st.gpu_count);
        printf("%12s: %s\n", "Kernel", isempty(st.kernel_release) ? "unknown" : st.kernel_release);
        if (isempty(st.driver_version))
                printf("%12s: %s\n", "Driver", "unavailable (see stage nvml)");
        else if (isempty(st.cuda_version))
                printf("%12s: %s\n", "Driver", st.driver_version);
        else
                printf("%12s: %s (CUDA %s)\n", "Driver", st.driver_version, st.cuda_version);
        if (strv_length(st.config_sources) == 0)
                printf("%12s: %s\n", "Config", "built-in defaults (no configuration files)");
        STRV_FOREACH(s, st.config_sources)
                printf("%12s%s %s\n", s == st.config_sources ? "Config" : "", s == st.config_sources ? ":" : " ",
                       *s);
        if (!isempty(st.config_error))
                printf("%12s: %s%s%s\n", "Config error", ctl_ansi(ANSI_RED), st.config_error, ctl_ansi(ANSI_NORMAL));
        if (!isempty(st.mig_config))
                printf("%12s: %s (%s)\n", "MIG config", st.mig_config, strna(st.mig_config_state));
        if (!isempty(st.health)) {
                const char *hc = health_color(st.health);
                printf("%12s: %s%s%s\n", "Health", ctl_ansi(hc), st.health, ctl_ansi(ANSI_NORMAL));
        }

        if (st.n_stages > 0) {
                putchar('\n');
                r = print_stage_table(&st);
                if (r < 0) {
                        fprintf(stderr, "gpunodectl: %s\n", strerror(-r));
                        return CTL_EXIT_NOT_OK;
                }
        }
        return CTL_EXIT_OK;
}

static int gpu_compare(const void *a, const void *b) {
        const CtlGpu *x = a, *y = b;
        return x->index < y->index ? -1 : x->index > y->index;
}

static void print_gpus_json(const CtlGpu *gpus, size_t n) {
        putchar('[');
        for (size_t i = 0; i < n; i++) {
                const CtlGpu *g = &gpus[i];
                bool first = true;
                char id[16];

                if (i > 0)
                        putchar(',');
                putchar('{');
                ctl_json_kv_uint(stdout, &first, "index", g->index);
                ctl_json_kv_string(stdout, &first, "pci_address", g->pci_address);
                ctl_json_kv_string_or_null(stdout, &first, "name", g->name);
                snprintf(id, sizeof id, "0x%04x", g->vendor_id);
                ctl_json_kv_string(stdout, &first, "vendor_id", id);
                snprintf(id, sizeof id, "0x%04x", g->device_id);
                ctl_json_kv_string(stdout, &first, "device_id", id);
                snprintf(id, sizeof id, "0x%04x", g->subsystem_vendor_id);
                ctl_json_kv_string(stdout, &first, "subsystem_vendor_id", id);
                snprintf(id, sizeof id, "0x%04x", g->subsystem_device_id);
                ctl_json_kv_string(stdout, &first, "subsystem_device_id", id);
                snprintf(id, sizeof id, "0x%06" PRIx32, g->class_code);
                ctl_json_kv_string(stdout, &first, "class", id);
                if (g->numa_node >= 0)
                        ctl_json_kv_int(stdout, &first, "numa_node", g->numa_node);
                else
                        ctl_json_kv_null(stdout, &first, "numa_node");
                if (g->iommu_group >= 0)
                        ctl_json_kv_int(stdout, &first, "iommu_group", g->iommu_group);
                else
                        ctl_json_kv_null(stdout, &first, "iommu_group");
                ctl_json_kv_string_or_null(stdout, &first, "driver", g->driver);
                ctl_json_kv_string_or_null(stdout, &first, "link_speed", g->link_speed);
                if (g->link_width > 0)
                        ctl_json_kv_uint(stdout, &first, "link_width", g->link_width);
                else
                        ctl_json_kv_null(stdout, &first, "link_width");
                ctl_json_kv_string_or_null(stdout, &first, "nvml_name", g->nvml_name);
                ctl_json_kv_string_or_null(stdout, &first, "uuid", g->uuid);
                if (g->memory_mib > 0)
                        ctl_json_kv_uint(stdout, &first, "memory_mib", g->memory_mib);
                else
                        ctl_json_kv_null(stdout, &first, "memory_mib");
                ctl_json_kv_string_or_null(stdout, &first, "compute_capability", g->compute_capability);
                ctl_json_kv_string_or_null(stdout, &first, "mig_mode", g->mig_mode);
                ctl_json_kv_string_or_null(stdout, &first, "mig_mode_pending", g->mig_mode_pending);
                ctl_json_kv_string_or_null(stdout, &first, "health", g->health);
                ctl_json_mig_devices(stdout, &first, g);
                putchar('}');
        }
        fputs("]\n", stdout);
}

/* "enabled", "disabled", "-" when the GPU cannot do MIG (or NVML did not say), and
 * "disabled→enabled" while a change waits for a GPU reset. */
static void format_mig(const CtlGpu *g, char *buf, size_t n) {
        const char *cur = streq_ptr(g->mig_mode, "unsupported") ? "" : g->mig_mode ?: "";

        if (!isempty(cur) && !isempty(g->mig_mode_pending) && !streq(cur, g->mig_mode_pending))
                snprintf(buf, n, "%s→%s", cur, g->mig_mode_pending);
        else
                snprintf(buf, n, "%s", cur);
}

/* One line per MIG device under its GPU, as a tree, the profile names padded to one width. */
static int add_mig_devices(CtlTable *t, const CtlGpu *g) {
        size_t width = 0;
        int r;

        for (size_t i = 0; i < g->n_mig_devices; i++) {
                size_t w = ctl_utf8_width(isempty(g->mig_devices[i].profile) ? "-" : g->mig_devices[i].profile);
                if (w > width)
                        width = w;
        }

        for (size_t i = 0; i < g->n_mig_devices; i++) {
                const CtlMigDevice *d = &g->mig_devices[i];
                const char *profile = isempty(d->profile) ? "-" : d->profile;
                _cleanup_free_ char *line = NULL;
                char uuid[64];

                ctl_shorten_id(d->uuid, uuid, sizeof uuid);
                line = strprintf("  %s %" PRIu32 ":%" PRIu32 " %s%*s %s",
                                 i + 1 < g->n_mig_devices ? "├─" : "└─", d->gi_id, d->ci_id, profile,
                                 (int) (width - ctl_utf8_width(profile)), "", isempty(uuid) ? "-" : uuid);
                if (!line)
                        return -ENOMEM;
                r = ctl_table_add_note(t, line);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int print_gpus_table(const CtlGpu *gpus, size_t n) {
        _cleanup_(ctl_table_freep) CtlTable *t = NULL;
        int r;

        r = ctl_table_new(&t, 11,
                          (const char *const[]) { "INDEX", "PCI", "NAME", "UUID", "MEMORY", "CC", "MIG", "NUMA",
                                                  "DRIVER", "LINK", "HEALTH" });
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                const CtlGpu *g = &gpus[i];
                char index[16], numa[16] = "", link[96] = "", uuid[64], memory[32], mig[64], health[16] = "";

                snprintf(index, sizeof index, "%" PRIu32, g->index);
                if (g->numa_node >= 0)
                        snprintf(numa, sizeof numa, "%" PRIi32, g->numa_node);
                if (!isempty(g->link_speed) && g->link_width > 0)
                        snprintf(link, sizeof link, "%s x%" PRIu32, g->link_speed, g->link_width);
                else if (!isempty(g->link_speed))
                        snprintf(link, sizeof link, "%s", g->link_speed);
                else if (g->link_width > 0)
                        snprintf(link, sizeof link, "x%" PRIu32, g->link_width);
                ctl_shorten_id(g->uuid, uuid, sizeof uuid);
                ctl_format_mib(g->memory_mib, memory, sizeof memory);
                format_mig(g, mig, sizeof mig);
                /* The column holds the verdict ("failed"); the reason follows as a note under the GPU. */
                if (!isempty(g->health))
                        snprintf(health, sizeof health, "%.*s", (int) strcspn(g->health, ":"), g->health);
                /* pci.ids names the chip; NVML's product name fills in when pci.ids does not know it. */
                r = ctl_table_add_row(t, (const char *const[]) { index, g->pci_address,
                                                                 isempty(g->name) ? g->nvml_name : g->name, uuid,
                                                                 memory, g->compute_capability, mig, numa,
                                                                 g->driver, link, health });
                if (r < 0)
                        return r;
                /* A pending change needs a GPU reset before it takes effect: worth noticing. */
                if (strstr(mig, "→"))
                        ctl_table_set_color(t, 6, ANSI_YELLOW);
                if (!isempty(g->health)) {
                        ctl_table_set_color(t, 10, health_color(g->health));
                        if (!streq(health, "ok")) {
                                _cleanup_free_ char *why = strprintf("  health: %s", g->health);
                                if (!why)
                                        return -ENOMEM;
                                r = ctl_table_add_note(t, why);
                                if (r < 0)
                                        return r;
                        }
                }
                r = add_mig_devices(t, g);
                if (r < 0)
                        return r;
        }
        ctl_table_print(t, stdout, arg_legend);
        if (arg_legend)
                printf("\n%zu GPU%s listed.\n", n, n == 1 ? "" : "s");
        return 0;
}

static int verb_gpus(sd_bus *bus, char **args) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        CtlGpu *gpus = NULL;
        size_t n = 0;
        int r, ret = CTL_EXIT_OK;

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

        if (arg_json)
                print_gpus_json(gpus, n);
        else if (print_gpus_table(gpus, n) < 0) {
                fprintf(stderr, "gpunodectl: Out of memory.\n");
                ret = CTL_EXIT_NOT_OK;
        }

finish:
        for (size_t i = 0; i < n; i++)
                ctl_gpu_done(&gpus[i]);
        free(gpus);
        return ret;
}

static int verb_labels(sd_bus *bus, char **args) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        const char *key, *value;
        bool first = true;
        int r;

        r = sd_bus_call_method(bus, AGENT_BUS_NAME, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE, "GetLabels", &error,
                               &reply, NULL);
        if (r < 0)
                return ctl_bus_error_exit("GetLabels", "Failed to read the labels", &error, r);

        r = sd_bus_message_enter_container(reply, 'a', "{ss}");
        if (r < 0)
                goto bad;
        if (arg_json)
                putchar('{');
        while ((r = sd_bus_message_read(reply, "{ss}", &key, &value)) > 0) {
                if (arg_json)
                        ctl_json_kv_string(stdout, &first, key, value);
                else
                        printf("%s=%s\n", key, value);
        }
        if (r < 0)
                goto bad;
        if (arg_json)
                fputs("}\n", stdout);
        return CTL_EXIT_OK;

bad:
        fprintf(stderr, "gpunodectl: Unexpected reply to GetLabels() from the agent: %s\n", strerror(-r));
        return CTL_EXIT_NOT_OK;
}

static int call_simple(sd_bus *bus, const char *method, const char *what) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        int r;

        r = sd_bus_call_method(bus, AGENT_BUS_NAME, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE, method, &error,
                               NULL, NULL);
        if (r < 0)
                return ctl_bus_error_exit(method, what, &error, r);
        return CTL_EXIT_OK;
}

static int verb_reload(sd_bus *bus, char **args) {
        return call_simple(bus, "Reload", "Reload failed");
}

static int verb_reconcile(sd_bus *bus, char **args) {
        return call_simple(bus, "Reconcile", "Reconcile failed");
}

static uint64_t now_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * USEC_PER_SEC + (uint64_t) ts.tv_nsec / 1000;
}

static int on_wake(sd_bus_message *m, void *userdata, sd_bus_error *error) {
        *(bool *) userdata = true;
        return 0;
}

static void format_timeout(char *buf, size_t n) {
        if (arg_timeout_usec % USEC_PER_SEC == 0)
                snprintf(buf, n, "%" PRIu64 "s", arg_timeout_usec / USEC_PER_SEC);
        else
                snprintf(buf, n, "%" PRIu64 "ms", arg_timeout_usec / USEC_PER_MSEC);
}

/* After the timeout: say why the agent is not ready, stage by stage. */
static int wait_ready_report(sd_bus *bus, bool seen) {
        _cleanup_(ctl_status_done) AgentStatus st = {};
        char timeout[32];
        int r;

        format_timeout(timeout, sizeof timeout);
        if (!seen) {
                if (arg_json)
                        printf("{\"ready\":false,\"running\":false}\n");
                fprintf(stderr, "gpunodectl: gpu-node-agent did not appear on the bus within %s (%s has no owner).\n",
                        timeout, AGENT_BUS_NAME);
                return CTL_EXIT_UNREACHABLE;
        }

        r = ctl_get_status(bus, &st);
        if (r != CTL_EXIT_OK)
                return r;
        if (st.ready) /* became ready at the very last moment */
                return CTL_EXIT_OK;

        if (arg_json) {
                bool first = true, first_stage = true;
                putchar('{');
                ctl_json_kv_bool(stdout, &first, "ready", false);
                ctl_json_kv_bool(stdout, &first, "running", true);
                ctl_json_kv_string(stdout, &first, "state", st.state);
                ctl_json_kv_string(stdout, &first, "stage", st.stage);
                ctl_json_key(stdout, &first, "stages_not_done");
                putchar('[');
                for (size_t i = 0; i < st.n_stages; i++)
                        if (!streq_ptr(st.stages[i].state, "done") && !streq_ptr(st.stages[i].state, "skipped")) {
                                if (!first_stage)
                                        putchar(',');
                                first_stage = false;
                                json_stage(stdout, &st.stages[i]);
                        }
                fputs("]}\n", stdout);
        }

        fprintf(stderr, "gpunodectl: gpu-node-agent is not ready after %s (state %s, stage %s). Stages not done:\n",
                timeout, strna(st.state), strna(st.stage));
        for (size_t i = 0; i < st.n_stages; i++) {
                const StageInfo *s = &st.stages[i];
                if (streq_ptr(s->state, "done") || streq_ptr(s->state, "skipped"))
                        continue;
                fprintf(stderr, "  %s: %s%s%s\n", s->name, s->state, isempty(s->message) ? "" : ": ",
                        s->message ?: "");
        }
        return CTL_EXIT_NOT_OK;
}

static int verb_wait_ready(sd_bus *bus, char **args) {
        uint64_t deadline = arg_timeout_usec == 0 ? UINT64_MAX : now_usec() + arg_timeout_usec;
        bool check = true, seen = false;
        int r;

        /* Subscribe before the first look, so that a change between the look and the wait wakes us. */
        r = sd_bus_add_match(bus, NULL,
                             "type='signal',sender='org.freedesktop.DBus',path='/org/freedesktop/DBus',"
                             "interface='org.freedesktop.DBus',member='NameOwnerChanged',arg0='" AGENT_BUS_NAME "'",
                             on_wake, &check);
        if (r >= 0)
                r = sd_bus_match_signal(bus, NULL, NULL, AGENT_OBJECT_PATH, "org.freedesktop.DBus.Properties",
                                        "PropertiesChanged", on_wake, &check);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Cannot watch the agent on the system bus: %s\n", strerror(-r));
                return CTL_EXIT_UNREACHABLE;
        }

        for (;;) {
                if (check) {
                        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
                        int ready = 0;

                        check = false;
                        r = sd_bus_get_property_trivial(bus, AGENT_BUS_NAME, AGENT_OBJECT_PATH,
                                                        AGENT_MANAGER_INTERFACE, "Ready", &error, 'b', &ready);
                        if (r >= 0) {
                                seen = true;
                                if (ready) {
                                        if (arg_json)
                                                printf("{\"ready\":true,\"running\":true}\n");
                                        return CTL_EXIT_OK;
                                }
                        } else if (!sd_bus_error_has_names(&error, SD_BUS_ERROR_SERVICE_UNKNOWN,
                                                           SD_BUS_ERROR_NAME_HAS_NO_OWNER, SD_BUS_ERROR_NO_REPLY,
                                                           SD_BUS_ERROR_DISCONNECTED))
                                /* Not running yet (or restarting) is what we wait through; anything else,
                                 * such as a policy denial, will not go away by waiting. */
                                return ctl_bus_error_exit("Get", "Failed to read the Ready property", &error, r);
                }

                r = sd_bus_process(bus, NULL);
                if (r < 0) {
                        fprintf(stderr, "gpunodectl: Lost the connection to the system bus: %s\n", strerror(-r));
                        return CTL_EXIT_UNREACHABLE;
                }
                if (r > 0)
                        continue;

                uint64_t now = now_usec();
                if (now >= deadline)
                        return wait_ready_report(bus, seen);
                r = sd_bus_wait(bus, deadline == UINT64_MAX ? UINT64_MAX : deadline - now);
                if (r < 0 && r != -EINTR) {
                        fprintf(stderr, "gpunodectl: Lost the connection to the system bus: %s\n", strerror(-r));
                        return CTL_EXIT_UNREACHABLE;
                }
        }
}

static int help(void) {
        printf("gpunodectl [OPTIONS...] COMMAND\n\n"
               "Query and control gpu-node-agent, the GPU node preparation daemon.\n\n"
               "Commands:\n"
               "  status                Show the agent's state, stages and configuration (default)\n"
               "  gpus                  List the GPUs: PCI and NVML facts, MIG mode and devices\n"
               "  labels                Show the node labels as key=value lines\n"
               "  reload                Reload the configuration (root)\n"
               "  reconcile             Run all stages again now (root)\n"
               "  wait-ready            Wait until every stage succeeded\n"
               "  driver [status]       Show the kernel modules, DKMS state and driver version\n"
               "  driver unload         Stop the driver's daemons and unload its modules, refused\n"
               "                        with the list of processes while the GPU is in use (root)\n"
               "  driver reload         Unload the driver (as driver unload) and load the installed\n"
               "                        one, e.g. after an upgrade left the old one loaded (root)\n"
               "  mig [show]            Show the MIG mode and devices of every GPU, the selected\n"
               "                        MIG config and its state\n"
               "  mig apply NAME        Apply a MIG config of mig.config-file (or --config) and wait\n"
               "                        for the result (root)\n"
               "  mig assert [NAME]     Check whether the GPUs match a MIG config (default: the\n"
               "                        selected one); exit status 1 when they do not\n"
               "  mig export            Print the current MIG layout as a mig-parted config\n"
               "  doctor                Check every layer of the node bottom up (PCI, IOMMU, modules,\n"
               "                        Secure Boot, device nodes, persistenced, fabric manager, NVML,\n"
               "                        MIG, CDI, container runtimes, NFD, health) and say how to fix\n"
               "                        what is broken; works without the agent\n\n"
               "Options:\n"
               "  -h --help             Show this help\n"
               "     --version          Show the version\n"
               "     --json             Print machine-readable JSON on stdout\n"
               "     --no-legend        Do not print table headers and footers\n"
               "     --no-pager         Accepted for compatibility; output is never paged\n"
               "     --timeout=SEC      wait-ready: give up after SEC (default 90s, 0 waits forever);\n"
               "                        driver unload: wait SEC for the answer (default 10min);\n"
               "                        mig apply: wait SEC for the result (default 30min);\n"
               "                        units ms, s, min, h, d are accepted (\"2min\")\n"
               "     --config=FILE      mig apply, mig assert: read the MIG config from FILE instead\n"
               "                        of mig.config-file (assert: root only)\n"
               "     --force            mig apply: even while GPUs to change run compute processes\n"
               "     --no-block         mig apply: return once the agent has accepted the apply\n"
               "     --agent-config=FILE  doctor: the agent's agent.yaml (default\n"
               "                        /etc/gpu-node-agent/agent.yaml)\n"
               "     --agent-config-dir=DIR  doctor: a conf.d directory instead of the default two\n"
               "     --root=DIR         doctor: the host root the configuration resolves under\n\n"
               "Exit status:\n"
               "  0  success (wait-ready: the agent is ready; mig apply: also when a GPU waits for\n"
               "     a reset, \"reboot required\"; mig assert: the GPUs match)\n"
               "  1  the operation failed or was refused, wait-ready timed out, or the GPUs do not\n"
               "     match the config (mig assert)\n"
               "  2  invalid command line\n"
               "  3  the agent is not running or the system bus is unreachable\n"
               "  4  permission denied\n"
               "  doctor: 0 every layer ok, 1 warnings, 2 a layer failed\n\n"
               "The system bus address is taken from $DBUS_SYSTEM_BUS_ADDRESS when set.\n"
               "See gpunodectl(1) for details.\n");
        return 0;
}

enum {
        ARG_VERSION = 0x100,
        ARG_JSON,
        ARG_NO_LEGEND,
        ARG_NO_PAGER,
        ARG_TIMEOUT,
        ARG_CONFIG,
        ARG_FORCE,
        ARG_NO_BLOCK,
        ARG_AGENT_CONFIG,
        ARG_AGENT_CONFIG_DIR,
        ARG_ROOT,
};

/* Returns 1 to go on, 0 to exit successfully (help, version), or CTL_EXIT_USAGE negated. */
static int parse_argv(int argc, char **argv) {
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                { "json", no_argument, NULL, ARG_JSON },
                { "no-legend", no_argument, NULL, ARG_NO_LEGEND },
                { "no-pager", no_argument, NULL, ARG_NO_PAGER },
                { "timeout", required_argument, NULL, ARG_TIMEOUT },
                { "config", required_argument, NULL, ARG_CONFIG },
                { "force", no_argument, NULL, ARG_FORCE },
                { "no-block", no_argument, NULL, ARG_NO_BLOCK },
                { "agent-config", required_argument, NULL, ARG_AGENT_CONFIG },
                { "agent-config-dir", required_argument, NULL, ARG_AGENT_CONFIG_DIR },
                { "root", required_argument, NULL, ARG_ROOT },
                {},
        };
        int c, r;

        opterr = 0;
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        return help();
                case ARG_VERSION:
                        printf("gpunodectl %s\n", GPU_NODE_AGENT_VERSION);
                        return 0;
                case ARG_JSON:
                        arg_json = true;
                        break;
                case ARG_NO_LEGEND:
                        arg_legend = false;
                        break;
                case ARG_NO_PAGER:
                        break;
                case ARG_TIMEOUT:
                        r = config_parse_duration(optarg, &arg_timeout_usec);
                        if (r < 0) {
                                fprintf(stderr,
                                        "gpunodectl: Invalid --timeout '%s': expected a number of seconds or a "
                                        "duration such as 90s or 5min (0 waits forever).\n",
                                        optarg);
                                return -CTL_EXIT_USAGE;
                        }
                        arg_timeout_set = true;
                        break;
                case ARG_CONFIG:
                        arg_mig_config = optarg;
                        break;
                case ARG_FORCE:
                        arg_force = true;
                        break;
                case ARG_NO_BLOCK:
                        arg_no_block = true;
                        break;
                case ARG_AGENT_CONFIG:
                        arg_agent_config = optarg;
                        break;
                case ARG_AGENT_CONFIG_DIR:
                        arg_agent_config_dir = optarg;
                        break;
                case ARG_ROOT:
                        arg_root = optarg;
                        break;
                case '?':
                        if (optopt >= ARG_VERSION)
                                fprintf(stderr, "gpunodectl: Option '%s' needs an argument. See gpunodectl --help.\n",
                                        argv[optind - 1]);
                        else if (optopt)
                                fprintf(stderr, "gpunodectl: Unknown option '-%c'. See gpunodectl --help.\n", optopt);
                        else
                                fprintf(stderr, "gpunodectl: Unknown option '%s'. See gpunodectl --help.\n",
                                        argv[optind - 1]);
                        return -CTL_EXIT_USAGE;
                default:
                        abort();
                }
        return 1;
}

typedef struct Verb {
        const char *name;
        int (*run)(sd_bus *bus, char **args);
} Verb;

static int verb_driver(sd_bus *bus, char **args) {
        CtlDriverOptions o = {
                .json = arg_json,
                .legend = arg_legend,
                .timeout_usec = arg_timeout_set ? arg_timeout_usec : DEFAULT_UNLOAD_TIMEOUT_USEC,
        };
        return ctl_driver(bus, args + 1, &o);
}

static CtlMigOptions mig_options(void) {
        return (CtlMigOptions) {
                .json = arg_json,
                .legend = arg_legend,
                .config_file = arg_mig_config,
                .force = arg_force,
                .no_block = arg_no_block,
                .timeout_usec = arg_timeout_set ? arg_timeout_usec : DEFAULT_MIG_APPLY_TIMEOUT_USEC,
        };
}

static int verb_mig(sd_bus *bus, char **args) {
        CtlMigOptions o = mig_options();
        return ctl_mig(bus, args + 1, &o);
}

static const Verb verbs[] = {
        { "status", verb_status },       { "gpus", verb_gpus },           { "labels", verb_labels },
        { "reload", verb_reload },       { "reconcile", verb_reconcile }, { "wait-ready", verb_wait_ready },
        { "driver", verb_driver },       { "mig", verb_mig },             { "doctor", NULL },
};

int main(int argc, char **argv) {
        _cleanup_(sd_bus_flush_close_unrefp) sd_bus *bus = NULL;
        const Verb *verb = NULL;
        const char *name;
        int r;

        r = parse_argv(argc, argv);
        if (r <= 0)
                return -r;

        name = optind < argc ? argv[optind] : "status";
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++)
                if (streq(verbs[i].name, name))
                        verb = &verbs[i];
        if (!verb) {
                fprintf(stderr, "gpunodectl: Unknown command '%s'. See gpunodectl --help.\n", name);
                return CTL_EXIT_USAGE;
        }
        if ((arg_agent_config || arg_agent_config_dir || arg_root) && verb->run) {
                fprintf(stderr, "gpunodectl: --agent-config, --agent-config-dir and --root only apply to doctor.\n");
                return CTL_EXIT_USAGE;
        }
        if (!verb->run) {
                /* doctor: works without the agent and without a bus; uses them when they are there. */
                if (optind + 1 < argc) {
                        fprintf(stderr, "gpunodectl: 'doctor' takes no arguments, got '%s'. See gpunodectl --help.\n",
                                argv[optind + 1]);
                        return CTL_EXIT_USAGE;
                }
                if (arg_timeout_set || arg_mig_config || arg_force || arg_no_block) {
                        fprintf(stderr, "gpunodectl: doctor takes none of --timeout, --config, --force, --no-block.\n");
                        return CTL_EXIT_USAGE;
                }
                if (sd_bus_open_system(&bus) < 0)
                        bus = NULL;
                CtlDoctorOptions o = { .json = arg_json, .legend = arg_legend, .root = arg_root,
                                       .config_file = arg_agent_config, .config_dir = arg_agent_config_dir,
                                       .bus = bus };
                return ctl_doctor(&o);
        }
        if (verb->run == verb_driver) {
                r = ctl_driver_check_args(optind + 1 < argc ? argv + optind + 1 : NULL);
                if (r != CTL_EXIT_OK)
                        return r;
        } else if (verb->run == verb_mig) {
                CtlMigOptions o = mig_options();
                r = ctl_mig_check_args(optind + 1 < argc ? argv + optind + 1 : NULL, &o);
                if (r != CTL_EXIT_OK)
                        return r;
        } else if (optind + 1 < argc) {
                fprintf(stderr, "gpunodectl: '%s' takes no arguments, got '%s'. See gpunodectl --help.\n", name,
                        argv[optind + 1]);
                return CTL_EXIT_USAGE;
        }
        bool unload = verb->run == verb_driver && optind + 1 < argc &&
                      (streq(argv[optind + 1], "unload") || streq(argv[optind + 1], "reload"));
        bool mig_apply = verb->run == verb_mig && optind + 1 < argc && streq(argv[optind + 1], "apply");
        if (arg_timeout_set && verb->run != verb_wait_ready && !unload && !mig_apply) {
                fprintf(stderr, "gpunodectl: --timeout only applies to wait-ready, driver unload and mig apply.\n");
                return CTL_EXIT_USAGE;
        }
        if ((arg_mig_config || arg_force || arg_no_block) && verb->run != verb_mig) {
                fprintf(stderr, "gpunodectl: --config, --force and --no-block only apply to the mig commands.\n");
                return CTL_EXIT_USAGE;
        }

        r = sd_bus_open_system(&bus);
        if (r < 0) {
                const char *address = getenv("DBUS_SYSTEM_BUS_ADDRESS");
                fprintf(stderr, "gpunodectl: Cannot connect to the system bus (%s): %s\n",
                        address ?: "unix:path=/run/dbus/system_bus_socket", strerror(-r));
                return CTL_EXIT_UNREACHABLE;
        }

        return verb->run(bus, argv + optind);
}
