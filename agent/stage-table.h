/* SPDX-License-Identifier: MIT */
/* Owns the stage handlers' interface: what a handler is, the table of them that the engine in
 * manager-stage.c runs in order (stage-table.c), and the stages' entry points the manager and the bus
 * call. Stages see the Node (node.h), never the Manager. */
#pragma once

#include "node.h"

/* A stage handler does the stage's work and returns STAGE_DONE or STAGE_SKIPPED, or a negative errno
 * for failure; *ret_message explains (optional for DONE). Work that takes long (a child process) is
 * started from the handler, which then returns STAGE_RUNNING and later calls node_stage_complete()
 * from the event source that sees the work end; the loop never blocks. */
typedef int (*StageRunFunc)(Node *n, char **ret_message);

typedef struct StageDescriptor {
        StageId id;
        StageRunFunc run;
        unsigned depends;        /* bit mask of StageIds that must be DONE/SKIPPED first */
} StageDescriptor;

const StageDescriptor *stage_descriptor(StageId id);

/* The stage handlers (stage-*.c). */
int stage_probe_run(Node *n, char **ret_message);
int stage_driver_run(Node *n, char **ret_message);
int stage_devices_run(Node *n, char **ret_message);
int stage_fabric_run(Node *n, char **ret_message);
int stage_nvml_run(Node *n, char **ret_message);
int stage_mig_run(Node *n, char **ret_message);
int stage_cdi_run(Node *n, char **ret_message);
int stage_labels_run(Node *n, char **ret_message);
void stage_labels_write_now(Node *n);
/* What the feature file says as nvidia.com/mig.config: the config the MIG manager keeps (NULL none) —
 * except with mig.selected-from: node-label, where that label is the administrator's input on the Node,
 * not ours to publish (NFD would write our copy back over it, also after it was removed): NULL, and
 * only nvidia.com/mig.config.state goes out, as the GPU Operator's MIG manager does. */
const char *stage_labels_mig_config(const Node *n);
int stage_consumers_run(Node *n, char **ret_message);

/* Cancels the consumers stage's unit operation (stage-consumers.c). */
void stage_consumers_done(Node *n);

/* The NVML workers (stage-nvml.c); the code below the manager reaches the first three through the
 * node's ops (node_nvml_stop() and so on, node.h). */
void stage_nvml_stop(Node *n, const char *why);
int stage_nvml_read_async(Node *n, char *const *addresses, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                          void *userdata, char **ret_error);
int stage_nvml_read_input_async(Node *n, const void *input, size_t len, GpuNvmlJobFunc fn, GpuNvmlJobDone done,
                                void *userdata, char **ret_error);

/* Re-reads, on the MIG reader after a MIG change, only the GPUs a MIG write changed (pci_addresses; NULL:
 * every GPU) — a MIG write changes nothing else — and publishes the snapshot with them replaced (D-Bus,
 * n->nvml_snapshot; on failure NVML counts as unavailable until the next nvml stage); then cb (from the
 * loop) with the result. With mig_devices (the apply's jobs read every changed GPU's MIG mode and
 * devices right after their steps) nothing is read: those are put into the snapshot and cb is called
 * before this returns. Errors to start as node_nvml_read_async(). */
typedef void (*StageNvmlRefreshDone)(Node *n, int r, const char *error, void *userdata);
int stage_nvml_refresh_async(Node *n, char *const *pci_addresses, const NvmlSnapshot *mig_devices,
                             StageNvmlRefreshDone cb, void *userdata, char **ret_error);
