/* SPDX-License-Identifier: MIT */
/* Owns the org.gpunodeagent.Agent1.Manager interface on /org/gpunodeagent/Agent1: the node-wide
 * properties (stage engine, readiness, labels, kernel and driver versions, kernel modules and DKMS,
 * config, MIG), Reload/Reconcile/GetLabels/Unload and the StageChanged signal. Their changes from NVML are
 * announced by manager_bus_nvml_changed() in bus-gpu.c; the MIG members are implemented in bus-mig.c.
 * Documented in docs/dbus/org.gpunodeagent.Agent1.Manager.md. */
#include <systemd/sd-bus.h>

#include "build-config.h"
#include "bus-mig.h"
#include "bus.h"
#include "driver-unload.h"
#include "log.h"
#include "strv.h"

static int property_get_version(sd_bus *bus, const char *path, const char *interface, const char *property,
                                sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        return sd_bus_message_append(reply, "s", GPU_NODE_AGENT_VERSION);
}

static int property_get_stage(sd_bus *bus, const char *path, const char *interface, const char *property,
                              sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        return sd_bus_message_append(reply, "s", manager_stage_name(userdata));
}

static int property_get_ready(sd_bus *bus, const char *path, const char *interface, const char *property,
                              sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        return sd_bus_message_append(reply, "b", (int) manager_is_ready(userdata));
}

static int property_get_state(sd_bus *bus, const char *path, const char *interface, const char *property,
                              sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        return sd_bus_message_append(reply, "s", agent_state_to_string(n->state) ?: "");
}

static int property_get_stages(sd_bus *bus, const char *path, const char *interface, const char *property,
                               sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        int r;

        r = sd_bus_message_open_container(reply, 'a', "(sstts)");
        if (r < 0)
                return r;
        for (StageId id = 0; id < _STAGE_MAX; id++) {
                const StageResult *s = &n->stages[id];
                r = sd_bus_message_append(reply, "(sstts)", stage_to_string(id),
                                          stage_state_to_string(s->state) ?: "", s->started_usec,
                                          s->finished_usec, s->message ?: "");
                if (r < 0)
                        return r;
        }
        return sd_bus_message_close_container(reply);
}

static int property_get_gpu_count(sd_bus *bus, const char *path, const char *interface, const char *property,
                                  sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        return sd_bus_message_append(reply, "u", n->inventory ? (uint32_t) n->inventory->n_gpus : 0);
}

static int append_labels(sd_bus_message *reply, const LabelSet *labels) {
        int r;

        r = sd_bus_message_open_container(reply, 'a', "{ss}");
        if (r < 0)
                return r;
        for (size_t i = 0; labels && i < labels->n; i++) {
                r = sd_bus_message_append(reply, "{ss}", labels->labels[i].key, labels->labels[i].value);
                if (r < 0)
                        return r;
        }
        return sd_bus_message_close_container(reply);
}

static int property_get_labels(sd_bus *bus, const char *path, const char *interface, const char *property,
                               sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        return append_labels(reply, n->labels);
}

static int property_get_kernel_release(sd_bus *bus, const char *path, const char *interface,
                                       const char *property, sd_bus_message *reply, void *userdata,
                                       sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        return sd_bus_message_append(reply, "s", n->kernel_release ?: "");
}

static int property_get_driver_version(sd_bus *bus, const char *path, const char *interface,
                                       const char *property, sd_bus_message *reply, void *userdata,
                                       sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        const char *v = n->nvml_snapshot ? n->nvml_snapshot->driver_version : NULL;
        return sd_bus_message_append(reply, "s", v ?: "");
}

/* "12.4" as nvidia-smi prints it; nvmlSystemGetCudaDriverVersion answers 1000 × major + 10 × minor. */
static int property_get_cuda_version(sd_bus *bus, const char *path, const char *interface,
                                     const char *property, sd_bus_message *reply, void *userdata,
                                     sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        int v = n->nvml_snapshot ? n->nvml_snapshot->cuda_version : 0;
        char buf[32] = "";

        if (v > 0)
                snprintf(buf, sizeof buf, "%d.%d", v / 1000, (v % 1000) / 10);
        return sd_bus_message_append(reply, "s", buf);
}

/* Node.module_rows holds "name\tstate\tdetail" (stage-driver.c); the detail may itself hold tabs. */
static int property_get_modules(sd_bus *bus, const char *path, const char *interface, const char *property,
                                sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        int r;

        r = sd_bus_message_open_container(reply, 'a', "(sss)");
        if (r < 0)
                return r;
        STRV_FOREACH(row, n->module_rows) {
                const char *p = *row;
                size_t n1 = strcspn(p, "\t"), n2 = p[n1] ? strcspn(p + n1 + 1, "\t") : 0;
                _cleanup_free_ char *name = strndup(p, n1),
                                    *state = strndup(p[n1] ? p + n1 + 1 : "", n2);
                const char *detail = p[n1] && p[n1 + 1 + n2] ? p + n1 + 1 + n2 + 1 : "";

                if (!name || !state)
                        return -ENOMEM;
                r = sd_bus_message_append(reply, "(sss)", name, state, detail);
                if (r < 0)
                        return r;
        }
        return sd_bus_message_close_container(reply);
}

static int property_get_dkms_state(sd_bus *bus, const char *path, const char *interface, const char *property,
                                   sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        return sd_bus_message_append(reply, "s", n->dkms_state ?: "");
}

static int property_get_config_error(sd_bus *bus, const char *path, const char *interface,
                                     const char *property, sd_bus_message *reply, void *userdata,
                                     sd_bus_error *error) {
        Manager *m = userdata;
        return sd_bus_message_append(reply, "s", manager_config_error(m) ?: "");
}

static int property_get_config_sources(sd_bus *bus, const char *path, const char *interface,
                                       const char *property, sd_bus_message *reply, void *userdata,
                                       sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        return sd_bus_message_append_strv(reply, n->config ? n->config->sources : NULL);
}

static int method_reload(sd_bus_message *msg, void *userdata, sd_bus_error *error) {
        _cleanup_free_ char *err = NULL;
        Manager *m = userdata;
        int r;

        r = bus_check_privileged(msg, error);
        if (r < 0)
                return r;

        log_info("Reload requested over D-Bus by %s.", strna(sd_bus_message_get_sender(msg)));
        /* manager_reload() is shared with SIGHUP: it ends a hold after Unload() and announces
         * ConfigError/ConfigSources itself. */
        r = manager_reload(m, &err);
        if (r < 0)
                return sd_bus_error_setf(error, AGENT_ERROR_INVALID_CONFIG,
                                         "The new configuration was rejected and the old one is kept: %s",
                                         err ?: strerror(-r));

        return sd_bus_reply_method_return(msg, NULL);
}

static int method_reconcile(sd_bus_message *msg, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        int r;

        r = bus_check_privileged(msg, error);
        if (r < 0)
                return r;

        char reason[128];
        snprintf(reason, sizeof reason, "Reconcile() over D-Bus from %s", strna(sd_bus_message_get_sender(msg)));
        /* After Unload() this is how the admin says "the new driver is in place, load it". */
        driver_unload_release(n);
        manager_request_pass_coalesced(m, reason);
        return sd_bus_reply_method_return(msg, NULL);
}

static int method_get_labels(sd_bus_message *msg, void *userdata, sd_bus_error *error) {
        _cleanup_(sd_bus_message_unrefp) sd_bus_message *reply = NULL;
        Manager *m = userdata;
        Node *n = manager_node(m);
        int r;

        r = sd_bus_message_new_method_return(msg, &reply);
        if (r < 0)
                return r;
        r = append_labels(reply, n->labels);
        if (r < 0)
                return r;
        return sd_bus_send(NULL, reply, NULL);
}

/* Answered later, from driver-unload.c, when the units are stopped and the modules removed. */
static int method_unload(sd_bus_message *msg, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        int r;

        r = bus_check_privileged(msg, error);
        if (r < 0)
                return r;
        return driver_unload_request(n, msg, error);
}

void manager_bus_emit_stage_changed(Manager *m, StageId id) {
        Node *n = manager_node(m);
        const StageResult *s;
        int r;

        if (!n->bus || id < 0 || id >= _STAGE_MAX)
                return;

        s = &n->stages[id];
        r = sd_bus_emit_signal(n->bus, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE, "StageChanged", "sss",
                               stage_to_string(id), stage_state_to_string(s->state) ?: "", s->message ?: "");
        if (r < 0)
                log_warning("Could not emit StageChanged for stage %s: %s", stage_to_string(id), strerror(-r));
}

static const sd_bus_vtable manager_vtable[] = {
        SD_BUS_VTABLE_START(0),

        SD_BUS_PROPERTY("Version", "s", property_get_version, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("Stage", "s", property_get_stage, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Ready", "b", property_get_ready, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("State", "s", property_get_state, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Stages", "a(sstts)", property_get_stages, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("GpuCount", "u", property_get_gpu_count, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Labels", "a{ss}", property_get_labels, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("KernelRelease", "s", property_get_kernel_release, 0,
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("DriverVersion", "s", property_get_driver_version, 0,
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("CudaVersion", "s", property_get_cuda_version, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Modules", "a(sss)", property_get_modules, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("DkmsState", "s", property_get_dkms_state, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("ConfigError", "s", property_get_config_error, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("ConfigSources", "as", property_get_config_sources, 0,
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("MigConfig", "s", bus_mig_property_get_config, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("MigConfigState", "s", bus_mig_property_get_config_state, 0,
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),

        SD_BUS_PROPERTY("Health", "s", bus_health_property_get_node, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("UnhealthyGpus", "u", bus_health_property_get_unhealthy, 0,
                        SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),

        SD_BUS_METHOD_WITH_ARGS("Reload", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, method_reload,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Reconcile", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, method_reconcile,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ResetGpuHealth", SD_BUS_ARGS("u", index), SD_BUS_NO_RESULT,
                                bus_health_method_reset_gpu, SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("GetLabels", SD_BUS_NO_ARGS, SD_BUS_RESULT("a{ss}", labels), method_get_labels,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("Unload", SD_BUS_NO_ARGS, SD_BUS_RESULT("as", units, "as", modules), method_unload,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        /* Answered when the apply has finished (seconds to minutes: GPU resets, hook units). */
        SD_BUS_METHOD_WITH_ARGS("ApplyMigConfig", SD_BUS_ARGS("s", name, "s", config_file, "b", force),
                                SD_BUS_RESULT("s", state, "s", message), bus_mig_method_apply,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("AssertMigConfig", SD_BUS_ARGS("s", name, "s", config_file),
                                SD_BUS_RESULT("b", matches, "s", report), bus_mig_method_assert,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_METHOD_WITH_ARGS("ExportMigConfig", SD_BUS_NO_ARGS, SD_BUS_RESULT("s", yaml), bus_mig_method_export,
                                SD_BUS_VTABLE_UNPRIVILEGED),

        SD_BUS_SIGNAL_WITH_ARGS("StageChanged", SD_BUS_ARGS("s", stage, "s", state, "s", message), 0),

        SD_BUS_VTABLE_END,
};

int bus_manager_register(Manager *m, sd_bus *bus) {
        return sd_bus_add_object_vtable(bus, NULL, AGENT_OBJECT_PATH, AGENT_MANAGER_INTERFACE, manager_vtable, m);
}
