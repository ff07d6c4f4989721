/* SPDX-License-Identifier: MIT */
/* Owns the reply parsers and the D-Bus error reporting declared in ctl-agent.h. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ctl-agent.h"
#include "ctl-output.h"
#include "bus.h"
#include "strv.h"

void ctl_status_done(AgentStatus *s) {
        free(s->version);
        free(s->stage);
        free(s->state);
        free(s->kernel_release);
        free(s->config_error);
        free(s->driver_version);
        free(s->cuda_version);
        free(s->dkms_state);
        free(s->mig_config);
        free(s->mig_config_state);
        free(s->health);
        strv_free(s->config_sources);
        for (size_t i = 0; i < s->n_modules; i++) {
                free(s->modules[i].name);
                free(s->modules[i].state);
                free(s->modules[i].detail);
        }
        free(s->modules);
        for (size_t i = 0; i < s->n_stages; i++) {
                free(s->stages[i].name);
                free(s->stages[i].state);
                free(s->stages[i].message);
        }
        free(s->stages);
        *s = (AgentStatus) {};
}

void ctl_gpu_done(CtlGpu *g) {
        free(g->pci_address);
        free(g->name);
        free(g->driver);
        free(g->link_speed);
        free(g->nvml_name);
        free(g->uuid);
        free(g->compute_capability);
        free(g->mig_mode);
        free(g->mig_mode_pending);
        free(g->health);
        for (size_t i = 0; i < g->n_mig_devices; i++) {
                free(g->mig_devices[i].uuid);
                free(g->mig_devices[i].profile);
        }
        free(g->mig_devices);
        *g = (CtlGpu) {};
}

static int read_variant_string(sd_bus_message *m, char **ret) {
        const char *s;
        int r = sd_bus_message_read(m, "v", "s", &s);
        if (r < 0)
                return r;
        free(*ret);
        *ret = strdup(s);
        return *ret ? 0 : -ENOMEM;
}

static int read_stages(sd_bus_message *m, void *userdata) {
        AgentStatus *st = userdata;
        const char *name, *state, *message;
        uint64_t started, finished;
        int r;

        r = sd_bus_message_enter_container(m, 'v', "a(sstts)");
        if (r < 0)
                return r;
        r = sd_bus_message_enter_container(m, 'a', "(sstts)");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_read(m, "(sstts)", &name, &state, &started, &finished, &message)) > 0) {
                StageInfo *n = realloc(st->stages, (st->n_stages + 1) * sizeof(*n));
                if (!n)
                        return -ENOMEM;
                st->stages = n;
                n[st->n_stages] = (StageInfo) { .name = strdup(name), .state = strdup(state),
                                                .message = strdup(message), .started_usec = started,
                                                .finished_usec = finished };
                st->n_stages++;
                if (!n[st->n_stages - 1].name || !n[st->n_stages - 1].state || !n[st->n_stages - 1].message)
                        return -ENOMEM;
        }
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;
        return sd_bus_message_exit_container(m);
}

static int read_modules(sd_bus_message *m, void *userdata) {
        AgentStatus *st = userdata;
        const char *name, *state, *detail;
        int r;

        st->has_modules = true;
        r = sd_bus_message_enter_container(m, 'v', "a(sss)");
        if (r < 0)
                return r;
        r = sd_bus_message_enter_container(m, 'a', "(sss)");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_read(m, "(sss)", &name, &state, &detail)) > 0) {
                CtlModule *n = realloc(st->modules, (st->n_modules + 1) * sizeof(*n));
                if (!n)
                        return -ENOMEM;
                st->modules = n;
                n[st->n_modules++] = (CtlModule) { .name = strdup(name), .state = strdup(state),
                                                   .detail = strdup(detail) };
                if (!n[st->n_modules - 1].name || !n[st->n_modules - 1].state || !n[st->n_modules - 1].detail)
                        return -ENOMEM;
        }
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;
        return sd_bus_message_exit_container(m);
}

static int read_config_sources(sd_bus_message *m, void *userdata) {
        AgentStatus *st = userdata;
        int r;

        r = sd_bus_message_enter_container(m, 'v', "as");
        if (r >= 0)
                r = sd_bus_message_read_strv(m, &st->config_sources);
        if (r >= 0)
                r = sd_bus_message_exit_container(m);
        return r;
}

/* One row per property that gpunodectl reads (as systemd's bus_map_all_properties()): a plain one is
 * read by its signature into the field at offset; one with a reader is handed the whole record. A
 * property not listed is skipped, so an agent newer than gpunodectl is still understood. */
typedef struct CtlProperty {
        const char *name;
        const char *signature;                    /* "s" (a strdup'd char *), "b" (int), "q", "u", "i", "t" */
        size_t offset;
        int (*read)(sd_bus_message *m, void *userdata);
} CtlProperty;

static int read_property(sd_bus_message *m, const CtlProperty *p, void *userdata) {
        void *field = (uint8_t *) userdata + p->offset;

        if (p->read)
                return p->read(m, userdata);
        if (streq(p->signature, "s"))
                return read_variant_string(m, field);
        return sd_bus_message_read(m, "v", p->signature, field);
}

static int ctl_map_all_properties(sd_bus_message *m, const CtlProperty *map, void *userdata) {
        int r;

        r = sd_bus_message_enter_container(m, 'a', "{sv}");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_enter_container(m, 'e', "sv")) > 0) {
                const CtlProperty *p;
                const char *name;

                r = sd_bus_message_read(m, "s", &name);
                if (r < 0)
                        return r;
                for (p = map; p->name && !streq(p->name, name); p++)
                        ;
                r = p->name ? read_property(m, p, userdata) : sd_bus_message_skip(m, "v");
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

#define STATUS_FIELD(name, sig, field) { name, sig, offsetof(AgentStatus, field), NULL }
static const CtlProperty status_properties[] = {
        STATUS_FIELD("Version", "s", version),
        STATUS_FIELD("Stage", "s", stage),
        STATUS_FIELD("State", "s", state),
        STATUS_FIELD("KernelRelease", "s", kernel_release),
        STATUS_FIELD("ConfigError", "s", config_error),
        STATUS_FIELD("DriverVersion", "s", driver_version),
        STATUS_FIELD("CudaVersion", "s", cuda_version),
        STATUS_FIELD("DkmsState", "s", dkms_state),
        STATUS_FIELD("MigConfig", "s", mig_config),
        STATUS_FIELD("MigConfigState", "s", mig_config_state),
        STATUS_FIELD("Health", "s", health),
        STATUS_FIELD("UnhealthyGpus", "u", unhealthy_gpus),
        { "Modules", NULL, 0, read_modules },
        STATUS_FIELD("Ready", "b", ready),
        STATUS_FIELD("GpuCount", "u", gpu_count),
        { "Stages", NULL, 0, read_stages },
        { "ConfigSources", NULL, 0, read_config_sources },
        {}
};

int ctl_parse_status(sd_bus_message *m, AgentStatus *st) {
        return ctl_map_all_properties(m, status_properties, st);
}

static int read_mig_devices(sd_bus_message *m, void *userdata) {
        CtlGpu *g = userdata;
        const char *uuid, *profile;
        uint32_t gi, ci;
        int r;

        r = sd_bus_message_enter_container(m, 'v', "a(ssuu)");
        if (r < 0)
                return r;
        r = sd_bus_message_enter_container(m, 'a', "(ssuu)");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_read(m, "(ssuu)", &uuid, &profile, &gi, &ci)) > 0) {
                CtlMigDevice *n = realloc(g->mig_devices, (g->n_mig_devices + 1) * sizeof(*n));
                if (!n)
                        return -ENOMEM;
                g->mig_devices = n;
                n[g->n_mig_devices++] = (CtlMigDevice) { .uuid = strdup(uuid), .profile = strdup(profile),
                                                         .gi_id = gi, .ci_id = ci };
                if (!n[g->n_mig_devices - 1].uuid || !n[g->n_mig_devices - 1].profile)
                        return -ENOMEM;
        }
        if (r < 0)
                return r;
        r = sd_bus_message_exit_container(m);
        if (r < 0)
                return r;
        return sd_bus_message_exit_container(m);
}

#define GPU_FIELD(name, sig, field) { name, sig, offsetof(CtlGpu, field), NULL }
static const CtlProperty gpu_properties[] = {
        GPU_FIELD("Index", "u", index),
        GPU_FIELD("PciAddress", "s", pci_address),
        GPU_FIELD("Name", "s", name),
        GPU_FIELD("Driver", "s", driver),
        GPU_FIELD("LinkSpeed", "s", link_speed),
        GPU_FIELD("VendorId", "q", vendor_id),
        GPU_FIELD("DeviceId", "q", device_id),
        GPU_FIELD("SubsystemVendorId", "q", subsystem_vendor_id),
        GPU_FIELD("SubsystemDeviceId", "q", subsystem_device_id),
        GPU_FIELD("Class", "u", class_code),
        GPU_FIELD("LinkWidth", "u", link_width),
        GPU_FIELD("NumaNode", "i", numa_node),
        GPU_FIELD("IommuGroup", "i", iommu_group),
        GPU_FIELD("NvmlName", "s", nvml_name),
        GPU_FIELD("Uuid", "s", uuid),
        GPU_FIELD("MemoryMiB", "t", memory_mib),
        GPU_FIELD("ComputeCapability", "s", compute_capability),
        GPU_FIELD("MigMode", "s", mig_mode),
        GPU_FIELD("MigModePending", "s", mig_mode_pending),
        GPU_FIELD("Health", "s", health),
        { "MigDevices", NULL, 0, read_mig_devices },
        {}
};

static int parse_gpu(sd_bus_message *m, CtlGpu *g) {
        *g = (CtlGpu) { .numa_node = -1, .iommu_group = -1 };
        return ctl_map_all_properties(m, gpu_properties, g);
}

int ctl_parse_gpus(sd_bus_message *m, CtlGpu **gpus, size_t *n) {
        int r;

        r = sd_bus_message_enter_container(m, 'a', "{oa{sa{sv}}}");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_enter_container(m, 'e', "oa{sa{sv}}")) > 0) {
                r = sd_bus_message_skip(m, "o");
                if (r < 0)
                        return r;
                r = sd_bus_message_enter_container(m, 'a', "{sa{sv}}");
                if (r < 0)
                        return r;
                while ((r = sd_bus_message_enter_container(m, 'e', "sa{sv}")) > 0) {
                        const char *interface;

                        r = sd_bus_message_read(m, "s", &interface);
                        if (r < 0)
                                return r;
                        if (streq(interface, AGENT_GPU_INTERFACE)) {
                                CtlGpu *g = realloc(*gpus, (*n + 1) * sizeof(CtlGpu));
                                if (!g)
                                        return -ENOMEM;
                                *gpus = g;
                                r = parse_gpu(m, &g[*n]);
                                (*n)++;
                        } else
                                r = sd_bus_message_skip(m, "a{sv}");
                        if (r < 0)
                                return r;
                        r = sd_bus_message_exit_container(m);
                        if (r < 0)
                                return r;
                }
                if (r < 0)
                        return r;
                r = sd_bus_message_exit_container(m);
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

int ctl_bus_error_exit(const char *method, const char *what, const sd_bus_error *e, int r) {
        const char *msg = sd_bus_error_is_set(e) && e->message ? e->message : strerror(-r);

        if (sd_bus_error_has_names(e, SD_BUS_ERROR_SERVICE_UNKNOWN, SD_BUS_ERROR_NAME_HAS_NO_OWNER)) {
                fprintf(stderr,
                        "gpunodectl: gpu-node-agent is not running: %s has no owner on the system bus. "
                        "Start it with 'systemctl start gpu-node-agent'.\n",
                        AGENT_BUS_NAME);
                return CTL_EXIT_UNREACHABLE;
        }
        if (sd_bus_error_has_name(e, AGENT_ERROR_ACCESS_DENIED)) {
                fprintf(stderr, "gpunodectl: %s\n", msg);
                return CTL_EXIT_DENIED;
        }
        if (sd_bus_error_has_name(e, SD_BUS_ERROR_ACCESS_DENIED) || r == -EACCES || r == -EPERM) {
                fprintf(stderr, "gpunodectl: %s requires root; the bus refused the call: %s\n",
                        method, msg);
                return CTL_EXIT_DENIED;
        }
        if (sd_bus_error_has_names(e, SD_BUS_ERROR_NO_REPLY, SD_BUS_ERROR_TIMEOUT, SD_BUS_ERROR_DISCONNECTED) ||
            r == -ETIMEDOUT || r == -ECONNRESET || r == -ENOTCONN) {
                fprintf(stderr, "gpunodectl: %s: gpu-node-agent did not answer: %s\n", what, msg);
                return CTL_EXIT_UNREACHABLE;
        }
        fprintf(stderr, "gpunodectl: %s: %s\n", what, msg);
        return CTL_EXIT_NOT_OK;
}

int ctl_get_status(sd_bus *bus, AgentStatus *st) {
        _cleanup_(sd_bus_error_free) sd_bus_error error = SD_BUS_ERROR_NULL;
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        int r;

        r = sd_bus_call_method(bus, AGENT_BUS_NAME, AGENT_OBJECT_PATH, "org.freedesktop.DBus.Properties", "GetAll",
                               &error, &reply, "s", AGENT_MANAGER_INTERFACE);
        if (r < 0)
                return ctl_bus_error_exit("GetAll", "Failed to read the agent status", &error, r);

        r = ctl_parse_status(reply, st);
        if (r < 0) {
                fprintf(stderr, "gpunodectl: Unexpected reply to GetAll(%s) from the agent: %s\n",
                        AGENT_MANAGER_INTERFACE, strerror(-r));
                return CTL_EXIT_NOT_OK;
        }
        return CTL_EXIT_OK;
}

void ctl_json_mig_devices(FILE *f, bool *first, const CtlGpu *g) {
        ctl_json_key(f, first, "mig_devices");
        fputc('[', f);
        for (size_t j = 0; j < g->n_mig_devices; j++) {
                const CtlMigDevice *d = &g->mig_devices[j];
                bool first_dev = true;

                fputs(j > 0 ? ",{" : "{", f);
                ctl_json_kv_string_or_null(f, &first_dev, "uuid", d->uuid);
                ctl_json_kv_string_or_null(f, &first_dev, "profile", d->profile);
                ctl_json_kv_uint(f, &first_dev, "gi_id", d->gi_id);
                ctl_json_kv_uint(f, &first_dev, "ci_id", d->ci_id);
                fputc('}', f);
        }
        fputc(']', f);
}
