/* SPDX-License-Identifier: MIT */
/* Owns the health members of the Manager and Gpu interfaces (their vtables list them; health.c decides
 * the values): Health and UnhealthyGpus on the manager, Health and HealthEvents per GPU, and
 * ResetGpuHealth(). */
#include <stdio.h>

#include "bus.h"
#include "health.h"

/* "ok", "degraded: <why>", "failed: <why>". */
static int append_health(sd_bus_message *reply, GpuHealthState s, const char *why) {
        char buf[512];

        if (s == GPU_HEALTH_OK)
                return sd_bus_message_append(reply, "s", "ok");
        snprintf(buf, sizeof buf, "%s: %s", gpu_health_to_string(s), why ?: "unknown reason");
        return sd_bus_message_append(reply, "s", buf);
}

int bus_health_property_get_node(sd_bus *bus, const char *path, const char *interface, const char *property,
                                 sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        const char *why;
        GpuHealthState s = health_node_state(n->health, &why);
        return append_health(reply, s, why);
}

int bus_health_property_get_unhealthy(sd_bus *bus, const char *path, const char *interface, const char *property,
                                      sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        return sd_bus_message_append(reply, "u", health_unhealthy_gpus(n->health));
}

/* The Gpu object's userdata is its PciDevice; the Manager is the fallback slot's (bus-gpu.c). */
static const Manager *gpu_manager(sd_bus *bus) {
        sd_bus_slot *slot = sd_bus_get_current_slot(bus);
        return slot ? sd_bus_slot_get_userdata(slot) : NULL;
}

int bus_health_property_get_gpu(sd_bus *bus, const char *path, const char *interface, const char *property,
                                sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        const PciDevice *d = userdata;
        const Manager *m = gpu_manager(bus);
        const Node *n = m ? manager_node_const(m) : NULL;
        const char *why = NULL;
        GpuHealthState s = n ? health_gpu_state(n->health, d->address, &why) : GPU_HEALTH_OK;
        return append_health(reply, s, why);
}

int bus_health_property_get_gpu_events(sd_bus *bus, const char *path, const char *interface,
                                       const char *property, sd_bus_message *reply, void *userdata,
                                       sd_bus_error *error) {
        const PciDevice *d = userdata;
        const Manager *m = gpu_manager(bus);
        const Node *n = m ? manager_node_const(m) : NULL;
        return sd_bus_message_append_strv(reply, n ? (char **) health_gpu_events(n->health, d->address) : NULL);
}

int bus_health_method_reset_gpu(sd_bus_message *msg, void *userdata, sd_bus_error *error) {
        Manager *m = userdata;
        Node *n = manager_node(m);
        unsigned index;
        int r;

        r = bus_check_privileged(msg, error);
        if (r < 0)
                return r;
        r = sd_bus_message_read(msg, "u", &index);
        if (r < 0)
                return r;
        if (!n->inventory || index >= n->inventory->n_gpus)
                return sd_bus_error_setf(error, SD_BUS_ERROR_INVALID_ARGS, "There is no GPU %u (the node has %zu).",
                                         index, n->inventory ? n->inventory->n_gpus : 0);
        r = health_reset_gpu(n->health, n->inventory->gpus[index].address);
        if (r == -ENOENT)
                return sd_bus_error_setf(error, AGENT_ERROR_PREFIX "NotWatched",
                                         "GPU %u is not watched for health (NVML does not list it, or health.enabled "
                                         "is false).", index);
        if (r < 0)
                return r;
        return sd_bus_reply_method_return(msg, NULL);
}
