/* SPDX-License-Identifier: MIT */
/* Owns the stage model: stage ids and states with their string tables, per-stage results, and the
 * table of stage handlers the engine in manager-stage.c runs in order. */
#pragma once

#include <stdint.h>

#include "macro.h"

typedef struct Manager Manager;

typedef enum StageId {
        STAGE_PROBE,
        STAGE_DRIVER,
        STAGE_DEVICES,
        STAGE_FABRIC,
        STAGE_NVML,
        STAGE_MIG,
        STAGE_CDI,
        STAGE_LABELS,
        STAGE_CONSUMERS,
        _STAGE_MAX,
        _STAGE_INVALID = -EINVAL,
} StageId;

typedef enum StageState {
        STAGE_PENDING,
        STAGE_RUNNING,
        STAGE_DONE,
        STAGE_SKIPPED,
        STAGE_FAILED,
        _STAGE_STATE_MAX,
        _STAGE_STATE_INVALID = -EINVAL,
} StageState;

typedef struct StageResult {
        StageState state;
        int error;               /* positive errno when failed, else 0 */
        char *message;           /* why skipped/failed, or what was done; may be NULL */
        uint64_t started_usec;   /* CLOCK_REALTIME of the last start, 0 never */
        uint64_t finished_usec;  /* CLOCK_REALTIME of the last finish, 0 while running/never */
        unsigned failures;       /* consecutive failures, drives the retry backoff */
} StageResult;

/* A stage handler does the stage's work and returns STAGE_DONE or STAGE_SKIPPED, or a negative errno
 * for failure; *ret_message explains (optional for DONE). Work that takes long (a child process) is
 * started from the handler, which then returns STAGE_RUNNING and later calls manager_stage_complete()
 * from the event source that sees the work end; the loop never blocks. */
typedef int (*StageRunFunc)(Manager *m, char **ret_message);

typedef struct StageDescriptor {
        StageId id;
        StageRunFunc run;
        unsigned depends;        /* bit mask of StageIds that must be DONE/SKIPPED first */
} StageDescriptor;

const StageDescriptor *stage_descriptor(StageId id);

const char *stage_to_string(StageId id);
/* "<stage>-ready": the readiness file of a stage under <run>/gpu-node-agent/. NULL on OOM. */
char *stage_ready_file_name(StageId id);
StageId stage_from_string(const char *s);
const char *stage_state_to_string(StageState s);
StageState stage_state_from_string(const char *s);

/* The stage handlers (stage-*.c). */
int stage_probe_run(Manager *m, char **ret_message);
int stage_driver_run(Manager *m, char **ret_message);
int stage_devices_run(Manager *m, char **ret_message);
int stage_fabric_run(Manager *m, char **ret_message);
int stage_nvml_run(Manager *m, char **ret_message);
int stage_mig_run(Manager *m, char **ret_message);
int stage_cdi_run(Manager *m, char **ret_message);
int stage_labels_run(Manager *m, char **ret_message);
void stage_labels_write_now(Manager *m);
int stage_consumers_run(Manager *m, char **ret_message);
