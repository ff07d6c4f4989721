/* SPDX-License-Identifier: MIT */
/* Owns the reply parsers and the D-Bus error reporting declared in ctl-agent.h. */
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

static int read_stages(sd_bus_message *m, AgentStatus *st) {
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

static int read_modules(sd_bus_message *m, AgentStatus *st) {
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

int ctl_parse_status(sd_bus_message *m, AgentStatus *st) {
        int r;

        r = sd_bus_message_enter_container(m, 'a', "{sv}");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_enter_container(m, 'e', "sv")) > 0) {
                const char *name;

                r = sd_bus_message_read(m, "s", &name);
                if (r < 0)
                        return r;
                if (streq(name, "Version"))
                        r = read_variant_string(m, &st->version);
                else if (streq(name, "Stage"))
                        r = read_variant_string(m, &st->stage);
                else if (streq(name, "State"))
                        r = read_variant_string(m, &st->state);
                else if (streq(name, "KernelRelease"))
                        r = read_variant_string(m, &st->kernel_release);
                else if (streq(name, "ConfigError"))
                        r = read_variant_string(m, &st->config_error);
                else if (streq(name, "DriverVersion"))
                        r = read_variant_string(m, &st->driver_version);
                else if (streq(name, "CudaVersion"))
                        r = read_variant_string(m, &st->cuda_version);
                else if (streq(name, "DkmsState"))
                        r = read_variant_string(m, &st->dkms_state);
                else if (streq(name, "MigConfig"))
                        r = read_variant_string(m, &st->mig_config);
                else if (streq(name, "MigConfigState"))
                        r = read_variant_string(m, &st->mig_config_state);
                else if (streq(name, "Health"))
                        r = read_variant_string(m, &st->health);
                else if (streq(name, "UnhealthyGpus"))
                        r = sd_bus_message_read(m, "v", "u", &st->unhealthy_gpus);
                else if (streq(name, "Modules"))
                        r = read_modules(m, st);
                else if (streq(name, "Ready"))
                        r = sd_bus_message_read(m, "v", "b", &st->ready);
                else if (streq(name, "GpuCount"))
                        r = sd_bus_message_read(m, "v", "u", &st->gpu_count);
                else if (streq(name, "Stages"))
                        r = read_stages(m, st);
                else if (streq(name, "ConfigSources")) {
                        r = sd_bus_message_enter_container(m, 'v', "as");
                        if (r >= 0)
                                r = sd_bus_message_read_strv(m, &st->config_sources);
                        if (r >= 0)
                                r = sd_bus_message_exit_container(m);
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

static int read_mig_devices(sd_bus_message *m, CtlGpu *g) {
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

static int parse_gpu(sd_bus_message *m, CtlGpu *g) {
        int r;

        *g = (CtlGpu) { .numa_node = -1, .iommu_group = -1 };
        r = sd_bus_message_enter_container(m, 'a', "{sv}");
        if (r < 0)
                return r;
        while ((r = sd_bus_message_enter_container(m, 'e', "sv")) > 0) {
                const char *name;

                r = sd_bus_message_read(m, "s", &name);
                if (r < 0)
                        return r;
                if (streq(name, "Index"))
                        r = sd_bus_message_read(m, "v", "u", &g->index);
                else if (streq(name, "PciAddress"))
                        r = read_variant_string(m, &g->pci_address);
                else if (streq(name, "Name"))
                        r = read_variant_string(m, &g->name);
                else if (streq(name, "Driver"))
                        r = read_variant_string(m, &g->driver);
                else if (streq(name, "LinkSpeed"))
                        r = read_variant_string(m, &g->link_speed);
                else if (streq(name, "VendorId"))
                        r = sd_bus_message_read(m, "v", "q", &g->vendor_id);
                else if (streq(name, "DeviceId"))
                        r = sd_bus_message_read(m, "v", "q", &g->device_id);
                else if (streq(name, "SubsystemVendorId"))
                        r = sd_bus_message_read(m, "v", "q", &g->subsystem_vendor_id);
                else if (streq(name, "SubsystemDeviceId"))
                        r = sd_bus_message_read(m, "v", "q", &g->subsystem_device_id);
                else if (streq(name, "Class"))
                        r = sd_bus_message_read(m, "v", "u", &g->class_code);
                else if (streq(name, "LinkWidth"))
                        r = sd_bus_message_read(m, "v", "u", &g->link_width);
                else if (streq(name, "NumaNode"))
                        r = sd_bus_message_read(m, "v", "i", &g->numa_node);
                else if (streq(name, "IommuGroup"))
                        r = sd_bus_message_read(m, "v", "i", &g->iommu_group);
                else if (streq(name, "NvmlName"))
                        r = read_variant_string(m, &g->nvml_name);
                else if (streq(name, "Uuid"))
                        r = read_variant_string(m, &g->uuid);
                else if (streq(name, "MemoryMiB"))
                        r = sd_bus_message_read(m, "v", "t", &g->memory_mib);
                else if (streq(name, "ComputeCapability"))
                        r = read_variant_string(m, &g->compute_capability);
                else if (streq(name, "MigMode"))
                        r = read_variant_string(m, &g->mig_mode);
                else if (streq(name, "MigModePending"))
                        r = read_variant_string(m, &g->mig_mode_pending);
                else if (streq(name, "Health"))
                        r = read_variant_string(m, &g->health);
                else if (streq(name, "MigDevices"))
                        r = read_mig_devices(m, g);
                else
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
