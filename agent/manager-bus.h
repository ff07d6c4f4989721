/* SPDX-License-Identifier: MIT */
/* Owns what the bus layer (bus-*.c) may use of the Manager, which is opaque there: the hooks it hands
 * over, the Node it publishes, its own state that the Manager keeps for it, and the requests D-Bus
 * methods make (reload, a pass) with the state they read. The Unload() and MIG entry points are their
 * owners' (driver-unload.h, mig-manager.h, stage-table.h). manager.h (the manager's own files, main.c)
 * includes this. */
#pragma once

#include <stdbool.h>

#include "node.h"

typedef struct Manager Manager;
typedef struct BusDirty BusDirty;

/* The bus layer's side of the Manager (bus.h: manager_bus_ops, given by main.c in ManagerOptions.bus).
 * The manager reaches D-Bus only through it (manager_mark_dirty() and the others in manager.h; the code
 * below the manager through NodeOps), so that only bus-*.c, main.c and gpunodectl include bus.h. */
typedef struct ManagerBusOps {
        int (*connect)(Manager *m);
        void (*disconnect)(Manager *m);
        void (*mark_dirty)(Manager *m, const char *path, const char *interface, const char *property);
        void (*gpus_changed)(Manager *m, const Inventory *old);
        void (*nvml_changed)(Manager *m, const NvmlSnapshot *old);
        void (*stage_changed)(Manager *m, StageId id);
} ManagerBusOps;

/* The Node the Manager embeds, and back. */
Node *manager_node(Manager *m);
const Node *manager_node_const(const Manager *m);
Manager *manager_from_node(Node *n);

/* The slot for the bus layer's own state (BusDirty, bus-util.c), which the Manager holds for it; the bus
 * layer makes it on first use and frees it when it disconnects. */
BusDirty **manager_bus_dirty(Manager *m);

/* Why the last load or reload of the configuration failed (ConfigError), NULL when it did not. */
const char *manager_config_error(const Manager *m);

/* Asks for a full pass of the stages (coalesced; runs from the event loop). One asked for while a pass
 * runs is queued (one, however many ask). */
void manager_request_pass(Manager *m, const char *reason);
/* The same for requests anyone may repeat at will (Reconcile()): one asked for within
 * MANAGER_PASS_MIN_INTERVAL_USEC of the end of the last pass starts at that interval, together with
 * everything asked for meanwhile: 1000 Reconcile() calls in a row cost a handful of passes. */
void manager_request_pass_coalesced(Manager *m, const char *reason);

/* Reloads the configuration transactionally: on success swaps it in and requests a pass; on failure
 * keeps the old one, stores the error in config_error (visible on D-Bus) and returns it. */
int manager_reload(Manager *m, char **ret_error);

/* Name of the Stage property: "starting", the running stage's name, or "ready" between passes. */
const char *manager_stage_name(const Manager *m);
bool manager_is_ready(const Manager *m);
