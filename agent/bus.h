/* SPDX-License-Identifier: MIT */
/* The D-Bus side of the Manager: connection and name, the Manager and Gpu interfaces
 * (bus-manager.c, bus-gpu.c), and coalesced PropertiesChanged (bus-util.c). The bus layer sees the
 * Manager only through manager-bus.h (opaque; its Node, reload, a pass, the state getters). */
#pragma once

#include "manager-bus.h"

#define AGENT_ERROR_PREFIX "org.gpunodeagent.Agent1.Error."
#define AGENT_ERROR_INVALID_CONFIG AGENT_ERROR_PREFIX "InvalidConfig"
#define AGENT_ERROR_ACCESS_DENIED AGENT_ERROR_PREFIX "AccessDenied"

/* The hooks the Manager reaches D-Bus through (ManagerBusOps, manager.h): manager_bus_connect,
 * manager_bus_disconnect, manager_bus_mark_dirty, manager_bus_gpus_changed, manager_bus_nvml_changed and
 * manager_bus_emit_stage_changed. main.c hands it to the daemon's Manager. */
extern const ManagerBusOps manager_bus_ops;

/* Opens the system bus ($DBUS_SYSTEM_BUS_ADDRESS honoured), attaches it to the event loop, registers
 * the objects and requests AGENT_BUS_NAME; fails with a message naming the current owner when the
 * name is taken. */
int manager_bus_connect(Manager *m);
void manager_bus_disconnect(Manager *m);

/* Marks a property changed; one PropertiesChanged per object and interface is sent per event loop
 * iteration. No-op without a bus. path NULL = the manager object. */
void manager_bus_mark_dirty(Manager *m, const char *path, const char *interface, const char *property);

/* The GPU list changed (objects appear/disappear): emits InterfacesAdded/Removed as needed and
 * GpuCount. old may be NULL. */
void manager_bus_gpus_changed(Manager *m, const Inventory *old);

/* The NVML snapshot changed (old may be NULL, m->node.nvml_snapshot may be NULL): marks DriverVersion,
 * CudaVersion and the per-GPU NVML properties that differ. */
void manager_bus_nvml_changed(Manager *m, const NvmlSnapshot *old);

/* The health members (bus-health.c). */
int bus_health_property_get_node(sd_bus *bus, const char *path, const char *interface, const char *property,
                                 sd_bus_message *reply, void *userdata, sd_bus_error *error);
int bus_health_property_get_unhealthy(sd_bus *bus, const char *path, const char *interface, const char *property,
                                      sd_bus_message *reply, void *userdata, sd_bus_error *error);
int bus_health_property_get_gpu(sd_bus *bus, const char *path, const char *interface, const char *property,
                                sd_bus_message *reply, void *userdata, sd_bus_error *error);
int bus_health_property_get_gpu_events(sd_bus *bus, const char *path, const char *interface,
                                       const char *property, sd_bus_message *reply, void *userdata,
                                       sd_bus_error *error);
int bus_health_method_reset_gpu(sd_bus_message *msg, void *userdata, sd_bus_error *error);

/* Emits StageChanged(s stage, s state, s message). */
void manager_bus_emit_stage_changed(Manager *m, StageId id);

/* Releases coalescing state. */
void bus_dirty_free(BusDirty *d);

/* Whether the caller of m (a method call) is root, by the credentials the bus recorded for its connection
 * (sd_bus_query_sender_privilege(), never augmented from /proc); sets error when not. */
int bus_check_privileged(sd_bus_message *m, sd_bus_error *error);

/* Internal to agent/bus-*.c (not for other callers): each interface registers its own vtables, and
 * the GPU objects that are being announced as removed stay findable while InterfacesRemoved is built. */
int bus_manager_register(Manager *m, sd_bus *bus);
int bus_gpu_register(Manager *m, sd_bus *bus);
const Inventory *bus_dirty_vanishing(const Manager *m);
void bus_dirty_set_vanishing(Manager *m, const Inventory *old);
