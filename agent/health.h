/* SPDX-License-Identifier: MIT */
/* Owns GPU health: the per-GPU and node health the agent publishes (D-Bus Health properties, the
 * nvidia.com/gpu.health labels, node state degraded, the health.on-unhealthy hook), fed by NVML events
 * that an event worker process waits for off the loop, and by a health check process run after each
 * pass and after a recoverable fault (GPU count vs probe.expect-gpus, remapped rows, fabric state). The
 * NVML calls are in nvml/gpu-nvml-events.c; the XID table in health-xid.c. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "macro.h"

struct Node;
typedef struct Health Health;

typedef enum GpuHealthState {
        GPU_HEALTH_OK,
        GPU_HEALTH_DEGRADED,
        GPU_HEALTH_FAILED,
        _GPU_HEALTH_MAX,
        _GPU_HEALTH_INVALID = -EINVAL,
} GpuHealthState;

typedef enum XidAction {
        XID_APPLICATION,  /* the application's fault: recorded, the GPU stays ok */
        XID_RECOVERABLE,  /* degraded until a health re-check passes */
        XID_RESET,        /* failed until the GPU is reset */
        XID_REBOOT,       /* failed until the node is rebooted (or the GPU reset) */
        _XID_ACTION_MAX,
        _XID_ACTION_INVALID = -EINVAL,
} XidAction;

/* Classifies xid with the built-in table, overridden by the configuration's lists of decimal codes
 * (fatal wins over ignore). *ret_text: the catalog's description. */
XidAction health_xid_classify(unsigned xid, char *const *ignore, char *const *fatal, const char **ret_text);
const char *xid_action_to_string(XidAction a);

/* The journal's bound for an XID storm, per GPU: the first XID of each code in a window of
 * XID_LOG_WINDOW_USEC is logged, the others of that code only counted, and when the window ends one
 * summary line per code says how many more came ("XID 13 on GPU 0 (…): 512 more in the last 10 s").
 * The health counters are kept apart and stay exact. */
#define XID_LOG_WINDOW_USEC (10 * UINT64_C(1000000))
#define XID_LOG_SLOTS 8

typedef struct XidLogSlot {
        unsigned xid;
        uint64_t more;                /* seen after the first in this window, not logged */
} XidLogSlot;

typedef struct XidLog {
        uint64_t start_usec;          /* when the open window began; 0 none open */
        XidLogSlot slots[XID_LOG_SLOTS];
        size_t n_slots;
} XidLog;

/* An XID at now (CLOCK_MONOTONIC, above 0): true to log it, false when it was counted for the summary.
 * A window that has ended must be flushed first (xid_log_deadline()). A ninth code in one window is
 * always logged. */
bool xid_log_note(XidLog *l, unsigned xid, uint64_t now);
/* When the open window ends; 0 when none is open. */
uint64_t xid_log_deadline(const XidLog *l);
/* Closes the window: the codes with more than their first into ret, in the order first seen; their
 * number is returned. */
size_t xid_log_flush(XidLog *l, XidLogSlot ret[XID_LOG_SLOTS]);
const char *gpu_health_to_string(GpuHealthState s);

int health_new(struct Node *n, Health **ret);
Health *health_free(Health *h);
DEFINE_CLEANUP_FUNC(Health *, health_free);

/* After a pass: follows the NVML snapshot's GPUs (starting, retargeting or stopping the event worker)
 * and runs a health check. */
void health_pass_done(Health *h);

/* The driver is about to be taken out (a when-idle reload, Unload()): the event worker, whose NVML
 * handle holds /dev/nvidia*, is stopped (SIGTERM; reaped from the loop), and a restart armed after a
 * crash is cancelled. The next pass with NVML answering starts it again (health_pass_done()). */
void health_release_driver(Health *h);

/* Runs a health check now (coalesced with one in flight). */
void health_check_now(Health *h);

/* An operator reset the GPU (or says so): forget its sticky fault (and its record in the state file, which
 * otherwise brings it back failed after an agent restart in the same boot) and re-check it. -ENOENT unknown. */
int health_reset_gpu(Health *h, const char *pci_address);

/* The agent itself reset the GPU (the MIG mode change's reset): the same remedy as an operator's, so its
 * sticky fault (and its record in <paths.state>/gpu-health) goes and it is re-checked. */
void health_gpu_reset_by_agent(Health *h, const char *pci_address);

/* The GPU's health as the Health property shows it: "ok", "degraded: <why>", "failed: <why>";
 * "ok" for a GPU health knows nothing bad about (or when health is off). */
GpuHealthState health_gpu_state(const Health *h, const char *pci_address, const char **ret_reason);
/* The last events of a GPU ("2026-01-01T00:00:00Z XID 79: GPU has fallen off the bus"), newest last. */
char *const *health_gpu_events(const Health *h, const char *pci_address);

/* Node health: the worst GPU's, or degraded for a node-wide finding (a GPU missing from the bus). */
GpuHealthState health_node_state(const Health *h, const char **ret_reason);
unsigned health_unhealthy_gpus(const Health *h);
/* Whether health is being watched (enabled, NVML answered): the labels carry it only then. */
bool health_active(const Health *h);
/* Whether the event worker is registered and waiting. */
bool health_armed(const Health *h);
/* Times the event worker was restarted since the agent started. */
uint64_t health_worker_restarts(const Health *h);

typedef struct HealthCounters {
        uint64_t xids, sbe, dbe;      /* events seen since the agent started */
        unsigned last_xid;            /* 0 none */
        bool remap_known;             /* the last check read remapped rows */
        unsigned remap_correctable, remap_uncorrectable, remap_failure;
} HealthCounters;

/* The counters of a GPU health watches; -ENOENT for another. */
int health_gpu_counters(const Health *h, const char *pci_address, HealthCounters *ret);
